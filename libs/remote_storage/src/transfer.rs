//! Streaming transfers between local files and objects, both checksummed as they stream.
//!
//! The local side is a [`LocalFile`] (`local_file.rs`): the caller's file, read and written
//! positionally in chunks of at most a part on the blocking pool. [`RemoteStorage::put_file`]
//! and [`RemoteStorage::download_to_file`] are the same transfers on a plain file at a path.
//!
//! To S3 every request moves at most one part ([`PART_SIZE`](crate::PART_SIZE)), so the request
//! deadline bounds each request, and each part is retried on its own under the operation
//! deadline (`retry.rs`): a transfer that keeps moving is never cut off however long it is,
//! and one whose store stalls fails within one operation deadline of its last part.
//!
//! - **Uploads**: a file up to a part goes in one request; a larger one as a multipart upload,
//!   [`PARTS_IN_FLIGHT`](crate) parts at once read from the file in order (so it is never
//!   whole in memory), each part retried under its own number, then completed (or aborted on
//!   failure; S3 drops an upload that is never completed after the bucket's lifecycle rule).
//!   A caller that knows what the file must be (its length and CRC-32C) says so: bytes read
//!   that differ are never made an object, since the check comes before the single request or
//!   before the multipart upload is completed. A read that fails ends the upload the same way.
//! - **Downloads**: the object's size and ETag first (a HEAD), then ranged GETs of a part each,
//!   streamed into the file; a part's retry rewrites the part from its start with the checksum
//!   rewound there, and asks for the same ETag (an object replaced meanwhile fails the download
//!   rather than mixing two objects). An answer longer than its range is refused before a byte
//!   of it is written past the range.
//!
//! A local directory has no requests to bound: an upload is written in parts through
//! `object_store`'s local multipart writer, and a download copies the open file, each retried
//! whole. An upload of a file the caller declares immutable is a hard link instead, where the
//! directory allows (`local_link.rs`).
//!
//! What a download wrote is checksummed as it streamed, not as it lies on disk: a caller that
//! must trust the file reads it back (the pageserver does, through the same seam).

use std::io;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::FuturesOrdered;
use futures::StreamExt;
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path as ObjectPath;
use object_store::MultipartId;
use object_store::{
    GetOptions, GetRange, GetResultPayload, ObjectStoreExt, PutPayload, WriteMultipart,
};

use crate::local_file::{blocking, LocalFile, StdFile};
use crate::retry::{classify, AttemptError};
use crate::{RemoteError, RemotePath, RemoteStorage, Transferred};

/// Downloads are written in chunks of this size.
const COPY_CHUNK: usize = 4 << 20;

impl RemoteStorage {
    /// Writes the local file at `path` as the object `key`; see [`RemoteStorage::upload`].
    pub async fn put_file(
        &self,
        key: &RemotePath,
        path: &Path,
    ) -> Result<Transferred, RemoteError> {
        let file = std_file("upload", key, path, StdFile::open).await?;
        self.upload(key, file, None).await
    }

    /// Writes `file` as the object `key`: in one request up to the part size
    /// ([`PART_SIZE`](crate::PART_SIZE), [`LOCAL_PART_SIZE`](crate::LOCAL_PART_SIZE)), in parts
    /// beyond, never the whole file in memory. Returns the length and CRC-32C of what it sent.
    /// With `expected`, bytes read that differ from it fail the upload before the object is
    /// written (or its parts completed): the store keeps whatever it had.
    pub async fn upload(
        &self,
        key: &RemotePath,
        file: Arc<dyn LocalFile>,
        expected: Option<Transferred>,
    ) -> Result<Transferred, RemoteError> {
        let location = self.location(key)?;
        let upload = Upload {
            key,
            file,
            expected,
        };
        let len = blocking(&upload.file, |f| f.size())
            .await
            .map_err(|e| upload.local_error(e))?;
        if let Some(dir) = &self.linking {
            let inode = blocking(&upload.file, |f| f.immutable_inode())
                .await
                .map_err(|e| upload.local_error(e))?;
            if let Some(inode) = inode {
                let linked = self
                    .upload_by_link(dir, &upload, &location, inode, len)
                    .await?;
                if let Some(sent) = linked {
                    return Ok(sent);
                }
            }
        }
        if len <= self.part_size as u64 {
            let (bytes, sent) = upload.read_whole(len).await?;
            return self
                .retrying("upload", key, || async {
                    self.store
                        .put(&location, PutPayload::from_bytes(bytes.clone()))
                        .await
                        .map_err(|e| classify(self.context("upload", key), e))?;
                    Ok(sent)
                })
                .await;
        }
        match &self.multipart {
            Some(multipart) => self.put_parts(multipart, &upload, &location, len).await,
            None => self.put_file_local(&upload, &location, len).await,
        }
    }

    /// A multipart upload to S3, each part retried on its own.
    async fn put_parts(
        &self,
        multipart: &Arc<dyn MultipartStore>,
        upload: &Upload<'_>,
        location: &ObjectPath,
        len: u64,
    ) -> Result<Transferred, RemoteError> {
        let key = upload.key;
        let id = self
            .retrying("upload", key, || async {
                multipart
                    .create_multipart(location)
                    .await
                    .map_err(|e| classify(self.context("upload", key), e))
            })
            .await?;
        let id = &id;
        let uploaded = async {
            let mut sent = Transferred { len: 0, crc32c: 0 };
            // Parts are read in order as room frees up; FuturesOrdered gives them back in
            // order. Those in flight go on while the next is read: their connections' tasks
            // send them.
            let mut in_flight = FuturesOrdered::new();
            let mut parts = Vec::new();
            for index in 0..len.div_ceil(self.part_size as u64) as usize {
                let part = upload.read_part(&mut sent, len, self.part_size).await?;
                in_flight.push_back(self.put_part(multipart, key, location, id, index, part));
                if in_flight.len() >= self.parts_in_flight {
                    if let Some(part) = in_flight.next().await {
                        parts.push(part?);
                    }
                }
            }
            while let Some(part) = in_flight.next().await {
                parts.push(part?);
            }
            upload.check(sent)?;
            self.retrying("upload", key, || {
                let parts = parts.clone();
                async {
                    multipart
                        .complete_multipart(location, id, parts)
                        .await
                        .map_err(|e| classify(self.context("upload", key), e))
                }
            })
            .await?;
            Ok(sent)
        }
        .await;
        if uploaded.is_err() {
            // Best effort, once: the store drops an upload never completed by itself too.
            let abort = multipart.abort_multipart(location, id);
            if let Ok(Err(e)) = tokio::time::timeout(self.retry.timeout, abort).await {
                tracing::info!(key = %key, "aborting a failed multipart upload failed too: {e}");
            }
        }
        uploaded
    }

    /// Part `index` of the multipart upload `id`, retried on its own.
    async fn put_part(
        &self,
        multipart: &Arc<dyn MultipartStore>,
        key: &RemotePath,
        location: &ObjectPath,
        id: &MultipartId,
        index: usize,
        bytes: Bytes,
    ) -> Result<PartId, RemoteError> {
        self.retrying("upload", key, || async {
            multipart
                .put_part(location, id, index, PutPayload::from_bytes(bytes.clone()))
                .await
                .map_err(|e| classify(self.context("upload", key), e))
        })
        .await
    }

    /// An upload into a local directory, in parts, retried whole.
    async fn put_file_local(
        &self,
        upload: &Upload<'_>,
        location: &ObjectPath,
        len: u64,
    ) -> Result<Transferred, RemoteError> {
        let key = upload.key;
        self.retrying("upload", key, || async {
            let parts = self
                .store
                .put_multipart(location)
                .await
                .map_err(|e| classify(self.context("upload", key), e))?;
            let mut writer = WriteMultipart::new_with_chunk_size(parts, self.part_size);
            let mut sent = Transferred { len: 0, crc32c: 0 };
            while sent.len < len {
                let part = match upload.read_part(&mut sent, len, self.part_size).await {
                    Ok(part) => part,
                    Err(e) => {
                        let _ = writer.abort().await;
                        return Err(AttemptError::Final(e));
                    }
                };
                if let Err(e) = writer.wait_for_capacity(self.parts_in_flight).await {
                    return Err(classify(self.context("upload", key), e));
                }
                writer.put(part);
            }
            if let Err(e) = upload.check(sent) {
                let _ = writer.abort().await;
                return Err(AttemptError::Final(e));
            }
            writer
                .finish()
                .await
                .map_err(|e| classify(self.context("upload", key), e))?;
            Ok(sent)
        })
        .await
    }

    /// Streams the object `key` into a new file at `dest` (replacing any); see
    /// [`RemoteStorage::download`].
    pub async fn download_to_file(
        &self,
        key: &RemotePath,
        dest: &Path,
    ) -> Result<Transferred, RemoteError> {
        let file = std_file("download", key, dest, StdFile::create).await?;
        self.download(key, file).await
    }

    /// Streams the object `key` into `file` (new and empty), fsynced; returns its length and
    /// CRC-32C, computed as it streams. Making the file visible under its final name is the
    /// caller's step.
    pub async fn download(
        &self,
        key: &RemotePath,
        file: Arc<dyn LocalFile>,
    ) -> Result<Transferred, RemoteError> {
        let location = self.location(key)?;
        let done = if self.multipart.is_none() {
            self.download_local(key, &location, &file).await?
        } else {
            self.download_parts(key, &location, &file).await?
        };
        blocking(&file, |f| f.sync_all())
            .await
            .map_err(|e| local_error("download", key, file.path(), e))?;
        Ok(done)
    }

    /// A download from S3 in ranged reads of a part each, each retried on its own.
    async fn download_parts(
        &self,
        key: &RemotePath,
        location: &ObjectPath,
        file: &Arc<dyn LocalFile>,
    ) -> Result<Transferred, RemoteError> {
        let meta = self
            .retrying("download", key, || async {
                self.store
                    .head(location)
                    .await
                    .map_err(|e| classify(self.context("download", key), e))
            })
            .await?;
        let mut done = Transferred { len: 0, crc32c: 0 };
        while done.len < meta.size {
            let end = (done.len + self.part_size as u64).min(meta.size);
            let range = done.len..end;
            let e_tag = meta.e_tag.clone();
            let start = done;
            done = self
                .retrying("download", key, || {
                    let (range, e_tag) = (range.clone(), e_tag.clone());
                    async move {
                        let options = GetOptions {
                            range: Some(GetRange::Bounded(range.clone())),
                            if_match: e_tag,
                            ..GetOptions::default()
                        };
                        let result = self
                            .store
                            .get_opts(location, options)
                            .await
                            .map_err(|e| classify(self.context("download", key), e))?;
                        let GetResultPayload::Stream(stream) = result.payload else {
                            return Err(AttemptError::Final(RemoteError::Rejected {
                                op: "download",
                                key: key.to_string(),
                                reason: "the store answered a ranged read with a file".to_owned(),
                            }));
                        };
                        self.write_part(key, file, start, range, stream).await
                    }
                })
                .await?;
        }
        Ok(done)
    }

    /// Writes one part's answer into `file` from `start`; returns the transfer up to the
    /// part's end.
    async fn write_part(
        &self,
        key: &RemotePath,
        file: &Arc<dyn LocalFile>,
        start: Transferred,
        range: std::ops::Range<u64>,
        mut stream: futures::stream::BoxStream<'static, object_store::Result<Bytes>>,
    ) -> Result<Transferred, AttemptError> {
        let local_err = |e| AttemptError::Final(local_error("download", key, file.path(), e));
        let mut done = start;
        // Where `pending` goes in the file.
        let mut at = start.len;
        let mut pending = Vec::with_capacity(COPY_CHUNK.min((range.end - range.start) as usize));
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| classify(self.context("download", key), e))?;
            if done.len + chunk.len() as u64 > range.end {
                return Err(AttemptError::Transient(format!(
                    "download: the answer for bytes {range:?} went on past its end"
                )));
            }
            done.len += chunk.len() as u64;
            done.crc32c = utils::crc32c::crc32c_append(done.crc32c, &chunk);
            pending.extend_from_slice(&chunk);
            if pending.len() >= COPY_CHUNK {
                pending = write_at(file, pending, at).await.map_err(local_err)?;
                at = done.len;
            }
        }
        write_at(file, pending, at).await.map_err(local_err)?;
        if done.len != range.end {
            return Err(AttemptError::Transient(format!(
                "download: the answer for bytes {range:?} ended after {} bytes",
                done.len - start.len
            )));
        }
        Ok(done)
    }

    /// A download from a local directory: one blocking copy of the open file in large chunks,
    /// not a stream of small ones each crossing to the blocking pool.
    async fn download_local(
        &self,
        key: &RemotePath,
        location: &ObjectPath,
        file: &Arc<dyn LocalFile>,
    ) -> Result<Transferred, RemoteError> {
        let local_err = |e| AttemptError::Final(local_error("download", key, file.path(), e));
        self.retrying("download", key, || async {
            let result = self
                .store
                .get(location)
                .await
                .map_err(|e| classify(self.context("download", key), e))?;
            let GetResultPayload::File(source, _) = result.payload else {
                return Err(AttemptError::Final(RemoteError::Rejected {
                    op: "download",
                    key: key.to_string(),
                    reason: "a local directory answered with a stream".to_owned(),
                }));
            };
            blocking(file, move |dest| copy_file(source, dest))
                .await
                .map_err(local_err)
        })
        .await
    }
}

/// One upload's local side.
pub(crate) struct Upload<'a> {
    pub(crate) key: &'a RemotePath,
    pub(crate) file: Arc<dyn LocalFile>,
    expected: Option<Transferred>,
}

impl Upload<'_> {
    /// The whole file, of `len` bytes, checked against what is expected.
    async fn read_whole(&self, len: u64) -> Result<(Bytes, Transferred), RemoteError> {
        let mut sent = Transferred { len: 0, crc32c: 0 };
        let bytes = self.read_part(&mut sent, len, len as usize).await?;
        self.check(sent)?;
        Ok((bytes, sent))
    }

    /// The next part of at most `part_size` bytes from `sent.len` of a file of `len` bytes;
    /// counts it into `sent`.
    pub(crate) async fn read_part(
        &self,
        sent: &mut Transferred,
        len: u64,
        part_size: usize,
    ) -> Result<Bytes, RemoteError> {
        let n = (len - sent.len).min(part_size as u64) as usize;
        let at = sent.len;
        let buf = blocking(&self.file, move |f| {
            let mut buf = vec![0u8; n];
            f.read_exact_at(&mut buf, at)?;
            Ok(buf)
        })
        .await
        .map_err(|e| self.read_failed(e, at + n as u64, len))?;
        sent.len += n as u64;
        sent.crc32c = utils::crc32c::crc32c_append(sent.crc32c, &buf);
        Ok(Bytes::from(buf))
    }

    /// Whether what was read is what the caller expects the file to be.
    pub(crate) fn check(&self, sent: Transferred) -> Result<(), RemoteError> {
        match self.expected {
            Some(expected) if expected != sent => Err(self.local_error(io::Error::other(format!(
                "read {} bytes with CRC-32C {:#010x}; the file should be {} bytes with {:#010x}",
                sent.len, sent.crc32c, expected.len, expected.crc32c
            )))),
            _ => Ok(()),
        }
    }

    /// A read of the file up to byte `end` of `len` failed with `e`.
    pub(crate) fn read_failed(&self, e: io::Error, end: u64, len: u64) -> RemoteError {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            self.local_error(io::Error::other(format!(
                "the file changed during the upload: it ends before byte {end}, {len} expected"
            )))
        } else {
            self.local_error(e)
        }
    }

    pub(crate) fn local_error(&self, source: io::Error) -> RemoteError {
        local_error("upload", self.key, self.file.path(), source)
    }
}

/// Opens (or creates) the plain file at `path` with `open`, on the blocking pool.
async fn std_file(
    op: &'static str,
    key: &RemotePath,
    path: &Path,
    open: fn(&Path) -> io::Result<StdFile>,
) -> Result<Arc<dyn LocalFile>, RemoteError> {
    let owned = path.to_owned();
    let file = tokio::task::spawn_blocking(move || open(&owned))
        .await
        .map_err(|e| io::Error::other(format!("a blocking file task failed: {e}")))
        .and_then(|opened| opened)
        .map_err(|e| local_error(op, key, path, e))?;
    Ok(Arc::new(file))
}

fn local_error(op: &'static str, key: &RemotePath, path: &Path, source: io::Error) -> RemoteError {
    RemoteError::LocalIo {
        op,
        key: key.to_string(),
        path: path.to_owned(),
        source,
    }
}

/// Writes `buf` at `at` on the blocking pool; hands the buffer back, empty, for reuse.
async fn write_at(file: &Arc<dyn LocalFile>, buf: Vec<u8>, at: u64) -> io::Result<Vec<u8>> {
    if buf.is_empty() {
        return Ok(buf);
    }
    blocking(file, move |f| {
        let mut buf = buf;
        f.write_all_at(&buf, at)?;
        buf.clear();
        Ok(buf)
    })
    .await
}

/// Copies `source` from its start into `dest` from its start, with its CRC-32C.
fn copy_file(mut source: std::fs::File, dest: &dyn LocalFile) -> io::Result<Transferred> {
    use std::io::Read;
    let mut buf = vec![0u8; COPY_CHUNK];
    let mut done = Transferred { len: 0, crc32c: 0 };
    loop {
        let n = source.read(&mut buf)?;
        if n == 0 {
            break;
        }
        dest.write_all_at(&buf[..n], done.len)?;
        done.len += n as u64;
        done.crc32c = utils::crc32c::crc32c_append(done.crc32c, &buf[..n]);
    }
    Ok(done)
}
