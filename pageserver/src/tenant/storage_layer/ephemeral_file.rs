//! The ephemeral file: an append-only file of blobs behind an in-memory layer.
//!
//! Values ingested into an in-memory layer are appended here as blobs; the layer's index keeps
//! their offsets. The file exists only until the layer is flushed to a delta layer file and is
//! never read after a restart, so it is written without `fsync`.
//!
//! # Design
//!
//! ```text
//!   blocks 0 .. n-1: on disk, immutable        block n: the mutable tail (memory)
//! +--------+--------+-----+--------+         +-------------------------------+
//! |   0    |   1    | ... |  n-1   |         |  filled ... | zeroes ...      |
//! +--------+--------+-----+--------+         +-------------------------------+
//!      ^ read through the page cache               ^ read straight from memory
//! ```
//!
//! * Exactly one `PAGE_SZ` buffer, the **mutable tail**, per file: memory per file is fixed and
//!   there is no double buffering.
//! * [`EphemeralFile::write_blob`] encodes into the tail. When the tail is full it is written to
//!   its block with one explicit positional write, **pre-warmed** into the page cache as an
//!   immutable page (a just-written value is likely to be read soon, for page reconstruction or
//!   the flush to a delta layer), zeroed and reused for the next block. The page cache never
//!   writes this file and never holds a page of it that can still change.
//! * [`EphemeralFile::read_blk`] serves the tail block from the tail buffer and every earlier
//!   block through the page cache, reading the file on a miss. A lease on the tail borrows the
//!   file, so the borrow checker makes a write impossible while it lives:
//!
//! ```compile_fail
//! # use pageserver::tenant::storage_layer::ephemeral_file::EphemeralFile;
//! # use pageserver::format::block_io::BlockReader;
//! # fn f(file: &mut EphemeralFile) {
//! let tail = file.read_blk(0).unwrap();
//! file.write_blob(b"no writes while a lease is alive").unwrap();
//! drop(tail);
//! # }
//! ```
//!
//! # Failure
//!
//! A failed write leaves the file's contents at that block unknown, so the file is **broken**
//! from then on: the write returns an error naming the file and the block, and every later
//! write is refused. Blocks written before the failure stay readable. A failed pre-warm (the
//! page cache had no free slot) is only logged: the block is on disk and is read from there.
//!
//! # Lifetime
//!
//! The file is created in the timeline's directory as `ephemeral-<file id>` and removed when the
//! `EphemeralFile` is dropped; its cached pages become unreachable (file ids are never reused)
//! and age out. Files left behind by a crash are removed at startup with [`remove_leftovers`].

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::format::blob_io::{BlobHeader, BlobTooLarge};
use crate::format::block_io::{
    block_offset, read_bypassing_cache, read_through_cache, BlockLease, BlockReadError, BlockReader,
};
use crate::io::read_cost::{self, BlockKind};
use crate::io::virtual_file::{FileIo, VirtualFile};
use crate::page_cache::{Arrival, FileId, PageCache};
use crate::PAGE_SZ;

/// Every ephemeral file's name starts with this.
pub const EPHEMERAL_FILE_PREFIX: &str = "ephemeral-";

#[derive(Debug, thiserror::Error)]
pub enum EphemeralWriteError {
    #[error("failed to write block {blkno} of ephemeral file {}: {source}", path.display())]
    Io {
        path: PathBuf,
        blkno: u32,
        source: io::Error,
    },
    #[error("ephemeral file {} is broken by an earlier write failure and refuses writes", path.display())]
    Broken { path: PathBuf },
    #[error("ephemeral file {} is full: its length would pass the largest block number", path.display())]
    Full { path: PathBuf },
    #[error(transparent)]
    TooLarge(#[from] BlobTooLarge),
}

/// See the module documentation.
pub struct EphemeralFile {
    file_id: FileId,
    path: PathBuf,
    file: Box<dyn FileIo>,
    cache: Arc<PageCache>,
    /// Bytes appended so far. The tail is block `len / PAGE_SZ` and holds `len % PAGE_SZ` bytes.
    len: u64,
    tail: Box<[u8; PAGE_SZ]>,
    broken: bool,
}

impl EphemeralFile {
    /// Creates a new, empty ephemeral file in `dir`.
    pub fn create(dir: &Path, cache: Arc<PageCache>) -> io::Result<EphemeralFile> {
        let file_id = FileId::next();
        let path = dir.join(format!("{EPHEMERAL_FILE_PREFIX}{file_id}"));
        let file = VirtualFile::create(&path)?;
        Ok(Self::from_parts(file_id, path, Box::new(file), cache))
    }

    pub(crate) fn from_parts(
        file_id: FileId,
        path: PathBuf,
        file: Box<dyn FileIo>,
        cache: Arc<PageCache>,
    ) -> EphemeralFile {
        EphemeralFile {
            file_id,
            path,
            file,
            cache,
            len: 0,
            tail: Box::new([0u8; PAGE_SZ]),
            broken: false,
        }
    }

    /// Bytes appended so far, including the tail.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn file_id(&self) -> FileId {
        self.file_id
    }

    /// Appends `blob` and returns the offset to read it back from.
    #[inline]
    pub fn write_blob(&mut self, blob: &[u8]) -> Result<u64, EphemeralWriteError> {
        if self.broken {
            return Err(EphemeralWriteError::Broken {
                path: self.path.clone(),
            });
        }
        let header = BlobHeader::new(blob.len())?;
        let offset = self.len;
        self.append(header.as_bytes())?;
        self.append(blob)?;
        Ok(offset)
    }

    #[inline(always)]
    fn append(&mut self, mut src: &[u8]) -> Result<(), EphemeralWriteError> {
        while !src.is_empty() {
            // Less than PAGE_SZ.
            let used = (self.len % PAGE_SZ as u64) as usize;
            let n = (PAGE_SZ - used).min(src.len());
            self.tail[used..used + n].copy_from_slice(&src[..n]);
            src = &src[n..];
            if used + n == PAGE_SZ {
                self.flush_tail()?;
            }
            // Only now: after a failed flush, `len` still points into the unwritten tail.
            self.len += n as u64;
        }
        Ok(())
    }

    fn write_tail(&self, blkno: u32) -> std::io::Result<()> {
        fail::fail_point!("ephemeral-write", |_| Err(std::io::Error::other(
            "failpoint ephemeral-write"
        )));
        self.file.write_all_at(&self.tail[..], block_offset(blkno))
    }

    /// Writes the full tail to its block, pre-warms the cache with it, and starts a new tail.
    #[cold]
    fn flush_tail(&mut self) -> Result<(), EphemeralWriteError> {
        let Ok(blkno) = u32::try_from(self.len / PAGE_SZ as u64) else {
            self.broken = true;
            return Err(EphemeralWriteError::Full {
                path: self.path.clone(),
            });
        };
        if blkno == u32::MAX {
            // The next tail would have no block number.
            self.broken = true;
            return Err(EphemeralWriteError::Full {
                path: self.path.clone(),
            });
        }
        let written = self.write_tail(blkno);
        crate::metrics::EPHEMERAL_WRITES.inc();
        if let Err(source) = written {
            self.broken = true;
            return Err(EphemeralWriteError::Io {
                path: self.path.clone(),
                blkno,
                source,
            });
        }
        crate::metrics::EPHEMERAL_BYTES_WRITTEN.inc_by(PAGE_SZ as u64);
        if let Err(e) =
            self.cache
                .insert_file_page(self.file_id, blkno, &self.tail, Arrival::PreWarm)
        {
            tracing::warn!(
                path = %self.path.display(),
                blkno,
                "pre-warm of ephemeral file block skipped: {e}"
            );
        }
        self.tail.fill(0);
        Ok(())
    }
}

impl EphemeralFile {
    /// A reader of this file that inserts nothing into the page cache (blocks it holds are
    /// still used): for the flush, which reads every block once and must not push out what
    /// readers are using.
    pub fn bypassing_cache(&self) -> BypassingReader<'_> {
        BypassingReader(self)
    }

    fn read_blk_inner(&self, blkno: u32, bypass: bool) -> Result<BlockLease<'_>, BlockReadError> {
        let tail_blkno = self.len / PAGE_SZ as u64;
        match u64::from(blkno).cmp(&tail_blkno) {
            std::cmp::Ordering::Equal => {
                read_cost::block(BlockKind::Value, true);
                Ok(BlockLease::Tail(&self.tail))
            }
            std::cmp::Ordering::Less if bypass => read_bypassing_cache(
                &self.cache,
                self.file.as_ref(),
                self.file_id,
                &self.path,
                blkno,
                BlockKind::Value,
            ),
            std::cmp::Ordering::Less => read_through_cache(
                &self.cache,
                self.file.as_ref(),
                self.file_id,
                &self.path,
                blkno,
                Arrival::ReadThrough,
                BlockKind::Value,
                None,
            ),
            std::cmp::Ordering::Greater => Err(BlockReadError::OutOfBounds {
                path: self.path.clone(),
                blkno,
                blocks: tail_blkno + 1,
            }),
        }
    }
}

impl BlockReader for EphemeralFile {
    fn read_blk(&self, blkno: u32) -> Result<BlockLease<'_>, BlockReadError> {
        self.read_blk_inner(blkno, false)
    }
}

/// See [`EphemeralFile::bypassing_cache`].
pub struct BypassingReader<'a>(&'a EphemeralFile);

impl BlockReader for BypassingReader<'_> {
    fn read_blk(&self, blkno: u32) -> Result<BlockLease<'_>, BlockReadError> {
        self.0.read_blk_inner(blkno, true)
    }
}

impl Drop for EphemeralFile {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.path) {
            if e.kind() != io::ErrorKind::NotFound {
                tracing::error!(path = %self.path.display(), "failed to remove ephemeral file: {e}");
            }
        }
    }
}

/// Removes the ephemeral files a previous run left in `dir`; returns how many.
pub fn remove_leftovers(dir: &Path) -> io::Result<usize> {
    let mut removed = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let is_ephemeral = entry
            .file_name()
            .to_str()
            .is_some_and(|name| name.starts_with(EPHEMERAL_FILE_PREFIX));
        if is_ephemeral && entry.file_type()?.is_file() {
            std::fs::remove_file(entry.path())?;
            removed += 1;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests;
