//! Streaming transfers between local files and objects: uploads in parts, downloads into a
//! file, both checksummed as they stream.

use std::path::Path;

use futures::StreamExt;
use object_store::{GetResultPayload, ObjectStoreExt, PutPayload, WriteMultipart};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::retry::{classify, AttemptError};
use crate::{RemoteError, RemotePath, RemoteStorage, Transferred};

impl RemoteStorage {
    /// Writes the local file at `path` as the object `key`: in one request up to the part size
    /// ([`PART_SIZE`], [`LOCAL_PART_SIZE`]), in parts beyond, never the whole file in memory.
    /// Returns the length and CRC-32C of what it sent.
    pub async fn put_file(
        &self,
        key: &RemotePath,
        path: &Path,
    ) -> Result<Transferred, RemoteError> {
        let location = self.location(key)?;
        let local_err = |source| RemoteError::LocalIo {
            op: "upload",
            key: key.to_string(),
            path: path.to_owned(),
            source,
        };
        let len = tokio::fs::metadata(path).await.map_err(local_err)?.len();
        self.retrying("upload", key, || async {
            let mut file = tokio::fs::File::open(path)
                .await
                .map_err(|e| AttemptError::Final(local_err(e)))?;
            if len <= self.part_size as u64 {
                let mut bytes = Vec::with_capacity(len as usize);
                file.read_to_end(&mut bytes)
                    .await
                    .map_err(|e| AttemptError::Final(local_err(e)))?;
                let crc32c = crc32c::crc32c(&bytes);
                let len = bytes.len() as u64;
                self.store
                    .put(&location, PutPayload::from(bytes))
                    .await
                    .map_err(|e| classify("upload", key, e))?;
                return Ok(Transferred { len, crc32c });
            }
            let upload = self
                .store
                .put_multipart(&location)
                .await
                .map_err(|e| classify("upload", key, e))?;
            let mut writer = WriteMultipart::new_with_chunk_size(upload, self.part_size);
            let mut sent = 0u64;
            let mut crc = 0u32;
            let mut buf = vec![0u8; self.part_size];
            loop {
                let n = match read_full(&mut file, &mut buf).await {
                    Ok(n) => n,
                    Err(e) => {
                        let _ = writer.abort().await;
                        return Err(AttemptError::Final(local_err(e)));
                    }
                };
                if n == 0 {
                    break;
                }
                if let Err(e) = writer.wait_for_capacity(self.parts_in_flight).await {
                    return Err(classify("upload", key, e));
                }
                writer.write(&buf[..n]);
                crc = crc32c::crc32c_append(crc, &buf[..n]);
                sent += n as u64;
            }
            if sent != len {
                let _ = writer.abort().await;
                return Err(AttemptError::Final(local_err(std::io::Error::other(
                    format!(
                        "the file changed during the upload: {sent} bytes read, {len} expected"
                    ),
                ))));
            }
            writer
                .finish()
                .await
                .map_err(|e| classify("upload", key, e))?;
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
        let local_err = |source| RemoteError::LocalIo {
            op: "download",
            key: key.to_string(),
            path: dest.to_owned(),
            source,
        };
        self.retrying("download", key, || async {
            let result = self
                .store
                .get(&location)
                .await
                .map_err(|e| classify("download", key, e))?;
            match result.payload {
                // The directory backend hands over the open file: one blocking copy in large
                // chunks, not a stream of small ones each crossing to the blocking pool.
                GetResultPayload::File(source, _) => {
                    let dest = dest.to_owned();
                    tokio::task::spawn_blocking(move || copy_file(source, &dest))
                        .await
                        .map_err(|e| AttemptError::Transient(format!("download task: {e}")))?
                        .map_err(|e| AttemptError::Final(local_err(e)))
                }
                GetResultPayload::Stream(mut stream) => {
                    let mut file = tokio::fs::File::create(dest)
                        .await
                        .map_err(|e| AttemptError::Final(local_err(e)))?;
                    let mut done = Transferred { len: 0, crc32c: 0 };
                    // Chunks gathered into writes of COPY_CHUNK, each one blocking call.
                    let mut pending = Vec::with_capacity(COPY_CHUNK);
                    while let Some(chunk) = stream.next().await {
                        let chunk = chunk.map_err(|e| classify("download", key, e))?;
                        done.len += chunk.len() as u64;
                        done.crc32c = crc32c::crc32c_append(done.crc32c, &chunk);
                        pending.extend_from_slice(&chunk);
                        if pending.len() >= COPY_CHUNK {
                            file.write_all(&pending)
                                .await
                                .map_err(|e| AttemptError::Final(local_err(e)))?;
                            pending.clear();
                        }
                    }
                    file.write_all(&pending)
                        .await
                        .map_err(|e| AttemptError::Final(local_err(e)))?;
                    file.sync_all()
                        .await
                        .map_err(|e| AttemptError::Final(local_err(e)))?;
                    Ok(done)
                }
            }
        })
        .await
    }
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
