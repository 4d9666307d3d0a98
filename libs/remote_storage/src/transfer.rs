//! Streaming transfers between local files and objects, both checksummed as they stream.
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
//! - **Downloads**: the object's size and ETag first (a HEAD), then ranged GETs of a part each,
//!   streamed into the file; a part's retry rewinds the file and the checksum to the part's
//!   start, and asks for the same ETag (an object replaced meanwhile fails the download rather
//!   than mixing two objects).
//!
//! A local directory has no requests to bound: an upload is written in parts through
//! `object_store`'s local multipart writer, and a download copies the open file, each retried
//! whole.

use std::io::SeekFrom;
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
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use crate::retry::{classify, AttemptError};
use crate::{RemoteError, RemotePath, RemoteStorage, Transferred};

impl RemoteStorage {
    /// Writes the local file at `path` as the object `key`: in one request up to the part size
    /// ([`PART_SIZE`](crate::PART_SIZE), [`LOCAL_PART_SIZE`](crate::LOCAL_PART_SIZE)), in parts
    /// beyond, never the whole file in memory. Returns the length and CRC-32C of what it sent.
    pub async fn put_file(
        &self,
        key: &RemotePath,
        path: &Path,
    ) -> Result<Transferred, RemoteError> {
        let location = self.location(key)?;
        let local_err = |source| local_error("upload", key, path, source);
        let len = tokio::fs::metadata(path).await.map_err(local_err)?.len();
        if len <= self.part_size as u64 {
            let bytes = tokio::fs::read(path).await.map_err(local_err)?;
            if bytes.len() as u64 != len {
                return Err(changed_during_upload(key, path, bytes.len() as u64, len));
            }
            let sent = Transferred {
                len,
                crc32c: crc32c::crc32c(&bytes),
            };
            let bytes = Bytes::from(bytes);
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
            Some(multipart) => self.put_parts(multipart, key, &location, path, len).await,
            None => self.put_file_local(key, &location, path, len).await,
        }
    }

    /// A multipart upload to S3, each part retried on its own.
    async fn put_parts(
        &self,
        multipart: &Arc<dyn MultipartStore>,
        key: &RemotePath,
        location: &ObjectPath,
        path: &Path,
        len: u64,
    ) -> Result<Transferred, RemoteError> {
        let id = self
            .retrying("upload", key, || async {
                multipart
                    .create_multipart(location)
                    .await
                    .map_err(|e| classify(self.context("upload", key), e))
            })
            .await?;
        let id = &id;
        let file = tokio::fs::File::open(path)
            .await
            .map_err(|e| local_error("upload", key, path, e));
        let uploaded = async {
            let mut file = file?;
            let mut crc = 0u32;
            let mut sent = 0u64;
            // Parts are read in order as room frees up; FuturesOrdered gives them back in
            // order. Those in flight go on while the next is read: their connections' tasks
            // send them.
            let mut in_flight = FuturesOrdered::new();
            let mut parts = Vec::new();
            for index in 0..len.div_ceil(self.part_size as u64) as usize {
                let mut buf = vec![0u8; self.part_size];
                let n = read_full(&mut file, &mut buf)
                    .await
                    .map_err(|e| local_error("upload", key, path, e))?;
                buf.truncate(n);
                crc = crc32c::crc32c_append(crc, &buf);
                sent += n as u64;
                in_flight.push_back(self.put_part(multipart, key, location, id, index, buf.into()));
                if in_flight.len() >= self.parts_in_flight {
                    if let Some(part) = in_flight.next().await {
                        parts.push(part?);
                    }
                }
            }
            while let Some(part) = in_flight.next().await {
                parts.push(part?);
            }
            if sent != len {
                return Err(changed_during_upload(key, path, sent, len));
            }
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
            Ok(Transferred { len, crc32c: crc })
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
        key: &RemotePath,
        location: &ObjectPath,
        path: &Path,
        len: u64,
    ) -> Result<Transferred, RemoteError> {
        let local_err = |e| AttemptError::Final(local_error("upload", key, path, e));
        self.retrying("upload", key, || async {
            let mut file = tokio::fs::File::open(path).await.map_err(local_err)?;
            let upload = self
                .store
                .put_multipart(location)
                .await
                .map_err(|e| classify(self.context("upload", key), e))?;
            let mut writer = WriteMultipart::new_with_chunk_size(upload, self.part_size);
            let mut sent = 0u64;
            let mut crc = 0u32;
            let mut buf = vec![0u8; self.part_size];
            loop {
                let n = match read_full(&mut file, &mut buf).await {
                    Ok(n) => n,
                    Err(e) => {
                        let _ = writer.abort().await;
                        return Err(local_err(e));
                    }
                };
                if n == 0 {
                    break;
                }
                if let Err(e) = writer.wait_for_capacity(self.parts_in_flight).await {
                    return Err(classify(self.context("upload", key), e));
                }
                writer.write(&buf[..n]);
                crc = crc32c::crc32c_append(crc, &buf[..n]);
                sent += n as u64;
            }
            if sent != len {
                let _ = writer.abort().await;
                return Err(AttemptError::Final(changed_during_upload(
                    key, path, sent, len,
                )));
            }
            writer
                .finish()
                .await
                .map_err(|e| classify(self.context("upload", key), e))?;
            Ok(Transferred { len, crc32c: crc })
        })
        .await
    }

    /// Streams the object `key` into a new file at `dest` (replacing any), fsynced; returns its
    /// length and CRC-32C, computed as it streams. Making the file visible under its final
    /// name is the caller's step.
    pub async fn download_to_file(
        &self,
        key: &RemotePath,
        dest: &Path,
    ) -> Result<Transferred, RemoteError> {
        let location = self.location(key)?;
        if self.multipart.is_none() {
            return self.download_local(key, &location, dest).await;
        }
        let location = &location;
        let local_err = |e| local_error("download", key, dest, e);
        let meta = self
            .retrying("download", key, || async {
                self.store
                    .head(location)
                    .await
                    .map_err(|e| classify(self.context("download", key), e))
            })
            .await?;
        let file = tokio::fs::File::create(dest).await.map_err(local_err)?;
        let mut done = Transferred { len: 0, crc32c: 0 };
        while done.len < meta.size {
            let end = (done.len + self.part_size as u64).min(meta.size);
            let range = done.len..end;
            let e_tag = meta.e_tag.clone();
            let start = done;
            let file = &file;
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
                        self.write_part(key, dest, file, start, range, stream).await
                    }
                })
                .await?;
        }
        file.sync_all().await.map_err(local_err)?;
        Ok(done)
    }

    /// Writes one part's answer into `file` from `start` (truncating whatever an earlier
    /// attempt left past it); returns the transfer up to the part's end.
    async fn write_part(
        &self,
        key: &RemotePath,
        dest: &Path,
        file: &tokio::fs::File,
        start: Transferred,
        range: std::ops::Range<u64>,
        mut stream: futures::stream::BoxStream<'static, object_store::Result<Bytes>>,
    ) -> Result<Transferred, AttemptError> {
        let local_err = |e| AttemptError::Final(local_error("download", key, dest, e));
        let mut file = file.try_clone().await.map_err(local_err)?;
        file.set_len(start.len).await.map_err(local_err)?;
        file.seek(SeekFrom::Start(start.len))
            .await
            .map_err(local_err)?;
        let mut done = start;
        let mut pending =
            Vec::with_capacity(COPY_CHUNK.min(range.end as usize - range.start as usize));
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| classify(self.context("download", key), e))?;
            done.len += chunk.len() as u64;
            done.crc32c = crc32c::crc32c_append(done.crc32c, &chunk);
            pending.extend_from_slice(&chunk);
            if pending.len() >= COPY_CHUNK {
                file.write_all(&pending).await.map_err(local_err)?;
                pending.clear();
            }
        }
        file.write_all(&pending).await.map_err(local_err)?;
        file.flush().await.map_err(local_err)?;
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
        dest: &Path,
    ) -> Result<Transferred, RemoteError> {
        let local_err = |e| AttemptError::Final(local_error("download", key, dest, e));
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
            let dest = dest.to_owned();
            tokio::task::spawn_blocking(move || copy_file(source, &dest))
                .await
                .map_err(|e| AttemptError::Transient(format!("download task: {e}")))?
                .map_err(local_err)
        })
        .await
    }
}

fn local_error(
    op: &'static str,
    key: &RemotePath,
    path: &Path,
    source: std::io::Error,
) -> RemoteError {
    RemoteError::LocalIo {
        op,
        key: key.to_string(),
        path: path.to_owned(),
        source,
    }
}

fn changed_during_upload(key: &RemotePath, path: &Path, sent: u64, len: u64) -> RemoteError {
    local_error(
        "upload",
        key,
        path,
        std::io::Error::other(format!(
            "the file changed during the upload: {sent} bytes read, {len} expected"
        )),
    )
}

/// Downloads are written in chunks of this size.
const COPY_CHUNK: usize = 4 << 20;

/// Copies `source` from its start into a new file at `dest`, fsynced, with its CRC-32C.
fn copy_file(mut source: std::fs::File, dest: &Path) -> std::io::Result<Transferred> {
    use std::io::{Read, Write};
    let mut out = std::fs::File::create(dest)?;
    let mut buf = vec![0u8; COPY_CHUNK];
    let mut done = Transferred { len: 0, crc32c: 0 };
    loop {
        let n = source.read(&mut buf)?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n])?;
        done.len += n as u64;
        done.crc32c = crc32c::crc32c_append(done.crc32c, &buf[..n]);
    }
    out.sync_all()?;
    Ok(done)
}

/// Reads until `buf` is full or the file ends; returns the bytes read.
async fn read_full(file: &mut tokio::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        let n = file.read(&mut buf[filled..]).await?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    Ok(filled)
}
