//! The ephemeral file: an append-only file of blobs behind an in-memory layer.
//!
//! Values ingested into an in-memory layer are appended here as blobs; the layer's index keeps
//! their offsets. The file exists only until the layer is flushed to a delta layer file and is
//! never read after a restart, so it is written without `fsync`.
//!
//! One writer appends while any number of readers read, all through `&self`: a reader never
//! waits for a block write, and never holds a lock across file I/O.
//!
//! # Design
//!
//! ```text
//!   blocks 0 .. n-2: on disk, immutable    block n-1: sealed       block n: the mutable tail
//! +--------+--------+-----+--------+     +------------------+     +-------------------------+
//! |   0    |   1    | ... |  n-2   |     | full, immutable, |     | filled ... | zeroes ... |
//! +--------+--------+-----+--------+     | being written    |     +-------------------------+
//!      ^ read through the page cache     +------------------+          ^ read under the tail's
//!                                             ^ shared copy              read lock
//! ```
//!
//! * [`EphemeralFile::write_blob`] copies the blob into the **tail** (block `len / PAGE_SZ`)
//!   under the tail's write lock and then publishes the new [`EphemeralFile::len`]. Writers are
//!   serialized by a writer mutex that no reader takes.
//! * When a copy fills the tail, the writer **seals** it, all under the tail's write lock: it
//!   copies the tail into an `Arc<[u8; PAGE_SZ]>`, publishes that as "block N being written",
//!   zeroes the tail and only then moves `len` (and with it the tail) to block N + 1.
//! * The writer then writes the sealed copy to block N with one positional write, holding only
//!   the writer mutex (the `ephemeral-write` failpoint is right before it), **pre-warms** the
//!   page cache with it as an immutable page (a just-written value is likely to be read soon,
//!   for page reconstruction or the flush to a delta layer), and only then un-publishes it. So
//!   block N is always in memory, in the sealed copy, until it is in the page cache or on disk.
//!   The page cache never writes this file and never holds a page of it that can still change.
//!   A file created [without pre-warm](EphemeralFile::create_without_pre_warm) skips that step:
//!   for a layer no reader sees until it is flushed (an import's), whose blocks would only push
//!   readers' pages out of the cache before the flush reads them back bypassing it.
//! * The sealed block's write is done at the end of the `write_blob` that sealed it, after the
//!   rest of the blob is in the new tail; a blob spanning more blocks writes each sealed block
//!   before it seals the next one. At most one block is sealed at a time, and it is always the
//!   block right before the tail. Memory per file is the tail and at most one sealed copy (the
//!   copy is reused for the next seal when no lease holds it any more).
//!
//! # What a reader sees
//!
//! `len` is published (release) only after its bytes are in the tail, so a reader that got an
//! offset below `len` finds the blob's bytes. [`EphemeralFile::read_blk`] (and the
//! [`BypassingReader`]) reads `len` (acquire) and:
//!
//! * the tail block: takes the tail's read lock and, if the tail has not moved meanwhile, hands
//!   out a [`BlockLease::Locked`] holding it;
//! * the block before the tail: the sealed copy ([`BlockLease::Shared`]) while it is published
//!   (its lock is held only to clone the `Arc`);
//! * any other earlier block, or the one before the tail once un-published: the page cache, or
//!   the file on a miss. Reaching here means the block's write completed: the writer
//!   un-publishes a sealed block only after its write and pre-warm, and seals the next block
//!   only after that.
//! * past the tail: an out-of-bounds error, decided from `len` alone, without a lock.
//!
//! The writer holds the tail's write lock only for memcpy-sized work (a copy into the tail, and
//! at a seal a copy out of it, a zeroing and publishing the sealed copy) and never across I/O.
//!
//! # Why a lease on the tail holds the read lock
//!
//! A copy of the tail would cost every read of a recent value an 8 KiB allocation and copy; the
//! guard costs nothing, and it is safe because nothing does I/O or waits while holding it:
//! [`BlockCursor`](crate::format::blob_io::BlockCursor) reads a blob's blocks in increasing
//! order and the tail is the last block, so a lease on the tail is the last one a read takes,
//! held while the bytes are copied out. Asking for a block past the tail takes no lock (see
//! above), so a cursor holding the tail's lease that runs past the end gets an error, not a
//! deadlock. The one rule for readers: do not ask for the tail block again while holding a lease
//! on it (a writer waiting for the lock would be let in first, and wait for that lease). The
//! sealed copy and cached pages hold no lock at all. The invariant that replaces "no write while
//! a lease lives": a lease on the tail delays the next append into the tail by as long as it is
//! held, and delays nothing else; a lease on any other block delays nothing. No lease sees its
//! block change:
//!
//! ```
//! # use std::sync::Arc;
//! # use pageserver::format::block_io::BlockReader;
//! # use pageserver::page_cache::{PageCache, PageCacheConfig};
//! # use pageserver::tenant::storage_layer::ephemeral_file::EphemeralFile;
//! # use pageserver::PAGE_SZ;
//! # let dir = tempfile::tempdir().unwrap();
//! # let config = PageCacheConfig { capacity_bytes: 64 * PAGE_SZ as u64, ..Default::default() };
//! # let cache = Arc::new(PageCache::new(config).unwrap());
//! let file = EphemeralFile::create(dir.path(), cache).unwrap();
//! // A 4-byte header and the blob: block 0 is full and written, block 1 is the tail.
//! file.write_blob(&[7; PAGE_SZ]).unwrap();
//! let block_0 = file.read_blk(0).unwrap();
//! // Writes go on while a lease on an earlier block lives, and do not change it.
//! file.write_blob(&[8; 3 * PAGE_SZ]).unwrap();
//! assert_eq!(block_0[PAGE_SZ - 1], 7);
//! // A lease on the tail is read-locked: this thread lets it go before its next write.
//! let tail = file.read_blk(4).unwrap();
//! assert_eq!(tail[0], 8);
//! drop(tail);
//! file.write_blob(b"appended after the lease").unwrap();
//! ```
//!
//! # Failure
//!
//! A failed block write leaves the file's contents at that block unknown, so the file is
//! **broken** from then on: the write returns an error naming the file and the block, and every
//! later write is refused. The sealed copy of the failed block stays published, so every block
//! written before the failure stays readable, including the values in the failed block that
//! earlier writes acknowledged. A failed pre-warm (the page cache had no free slot) is only
//! logged: the block is on disk and is read from there.
//!
//! # Lifetime
//!
//! The file is created in the timeline's directory as `ephemeral-<file id>` and removed when the
//! `EphemeralFile` is dropped; its cached pages become unreachable (file ids are never reused)
//! and age out. Files left behind by a crash are removed at startup with [`remove_leftovers`].

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

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
    /// Bytes appended and readable. The tail is block `len / PAGE_SZ` and holds
    /// `len % PAGE_SZ` bytes. Stored only under the tail's write lock, so it cannot change
    /// while the tail's read lock is held.
    len: AtomicU64,
    /// The mutable tail.
    tail: Box<RwLock<[u8; PAGE_SZ]>>,
    /// The block before the tail while it is being written.
    sealed: RwLock<Option<SealedBlock>>,
    /// Serializes writers; readers never take it, so it may be held across I/O.
    writer: Mutex<WriterState>,
    /// Whether a written block is inserted into the page cache.
    pre_warm: bool,
}

#[derive(Clone)]
struct SealedBlock {
    blkno: u32,
    page: Arc<[u8; PAGE_SZ]>,
}

#[derive(Default)]
struct WriterState {
    broken: bool,
    /// The last sealed copy, once no lease held it any more: the next seal copies into it.
    spare: Option<Arc<[u8; PAGE_SZ]>>,
}

impl EphemeralFile {
    /// Creates a new, empty ephemeral file in `dir`.
    pub fn create(dir: &Path, cache: Arc<PageCache>) -> io::Result<EphemeralFile> {
        let file_id = FileId::next();
        let path = dir.join(format!("{EPHEMERAL_FILE_PREFIX}{file_id}"));
        let file = VirtualFile::create(&path)?;
        Ok(Self::from_parts(file_id, path, Box::new(file), cache))
    }

    /// [`EphemeralFile::create`], but written blocks are not inserted into the page cache:
    /// for a file read only once, bypassing the cache, after all of it is written.
    pub fn create_without_pre_warm(dir: &Path, cache: Arc<PageCache>) -> io::Result<EphemeralFile> {
        let mut file = Self::create(dir, cache)?;
        file.pre_warm = false;
        Ok(file)
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
            len: AtomicU64::new(0),
            tail: Box::new(RwLock::new([0u8; PAGE_SZ])),
            sealed: RwLock::new(None),
            writer: Mutex::new(WriterState::default()),
            pre_warm: true,
        }
    }

    /// Bytes appended so far, all of them readable: the tail and the sealed block included.
    pub fn len(&self) -> u64 {
        self.len.load(Ordering::Acquire)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn file_id(&self) -> FileId {
        self.file_id
    }

    /// Appends `blob` and returns the offset to read it back from. Concurrent calls are
    /// serialized.
    #[inline]
    pub fn write_blob(&self, blob: &[u8]) -> Result<u64, EphemeralWriteError> {
        let mut writer = self.lock_writer();
        if writer.broken {
            return Err(EphemeralWriteError::Broken {
                path: self.path.clone(),
            });
        }
        let header = BlobHeader::new(blob.len())?;
        // Only writers change `len`, and we are the writer.
        let offset = self.len.load(Ordering::Relaxed);
        let mut sealed = None;
        self.append(&mut writer, &mut sealed, header.as_bytes())?;
        self.append(&mut writer, &mut sealed, blob)?;
        if let Some(block) = sealed {
            self.write_sealed(&mut writer, block)?;
        }
        Ok(offset)
    }

    /// Copies `src` into the tail, sealing each tail it fills. A block sealed here is left in
    /// `sealed` for the caller to write, after the rest of the blob is in the new tail; one
    /// sealed earlier is written before the next seal.
    #[inline(always)]
    fn append(
        &self,
        writer: &mut WriterState,
        sealed: &mut Option<SealedBlock>,
        mut src: &[u8],
    ) -> Result<(), EphemeralWriteError> {
        while !src.is_empty() {
            let len = self.len.load(Ordering::Relaxed);
            // Less than PAGE_SZ.
            let used = (len % PAGE_SZ as u64) as usize;
            let n = (PAGE_SZ - used).min(src.len());
            let (chunk, rest) = src.split_at(n);
            if used + n < PAGE_SZ {
                let mut tail = self.write_tail();
                tail[used..used + n].copy_from_slice(chunk);
                self.len.store(len + n as u64, Ordering::Release);
            } else {
                if let Some(block) = sealed.take() {
                    self.write_sealed(writer, block)?;
                }
                *sealed = Some(self.seal_tail(writer, len, chunk)?);
            }
            src = rest;
        }
        Ok(())
    }

    /// Fills the tail with `chunk`, publishes a copy of it as the sealed block and moves the
    /// tail to the next block. Nothing changes if the file is out of block numbers.
    #[cold]
    fn seal_tail(
        &self,
        writer: &mut WriterState,
        len: u64,
        chunk: &[u8],
    ) -> Result<SealedBlock, EphemeralWriteError> {
        // The next tail needs a block number too.
        let Some(blkno) = u32::try_from(len / PAGE_SZ as u64)
            .ok()
            .filter(|blkno| *blkno != u32::MAX)
        else {
            writer.broken = true;
            return Err(EphemeralWriteError::Full {
                path: self.path.clone(),
            });
        };
        let mut page = writer
            .spare
            .take()
            .unwrap_or_else(|| Arc::new([0u8; PAGE_SZ]));
        let used = PAGE_SZ - chunk.len();
        let mut tail = self.write_tail();
        tail[used..].copy_from_slice(chunk);
        match Arc::get_mut(&mut page) {
            Some(copy) => copy.copy_from_slice(&tail[..]),
            // Not reached: a spare is kept only when nothing else held it.
            None => page = Arc::new(*tail),
        }
        let block = SealedBlock { blkno, page };
        // Published before the tail moves: a reader that sees the tail past this block finds
        // it here until it is written.
        *self.sealed.write().unwrap_or_else(PoisonError::into_inner) = Some(block.clone());
        tail.fill(0);
        self.len.store(len + chunk.len() as u64, Ordering::Release);
        Ok(block)
    }

    /// Writes a sealed block to disk, pre-warms the page cache with it and un-publishes it.
    /// Holds no lock a reader takes while writing. After a failed write the block stays
    /// published, so the values in it stay readable.
    #[cold]
    fn write_sealed(
        &self,
        writer: &mut WriterState,
        block: SealedBlock,
    ) -> Result<(), EphemeralWriteError> {
        let written = self.write_block(block.blkno, &block.page);
        crate::metrics::EPHEMERAL_WRITES.inc();
        if let Err(source) = written {
            writer.broken = true;
            return Err(EphemeralWriteError::Io {
                path: self.path.clone(),
                blkno: block.blkno,
                source,
            });
        }
        crate::metrics::EPHEMERAL_BYTES_WRITTEN.inc_by(PAGE_SZ as u64);
        let warmed = if self.pre_warm {
            self.cache
                .insert_file_page(self.file_id, block.blkno, &block.page, Arrival::PreWarm)
        } else {
            Ok(())
        };
        if let Err(e) = warmed {
            tracing::warn!(
                path = %self.path.display(),
                blkno = block.blkno,
                "pre-warm of ephemeral file block skipped: {e}"
            );
        }
        *self.sealed.write().unwrap_or_else(PoisonError::into_inner) = None;
        let mut page = block.page;
        // A reader may still hold a lease on the copy; then the next seal allocates.
        if Arc::get_mut(&mut page).is_some() {
            writer.spare = Some(page);
        }
        Ok(())
    }

    fn write_block(&self, blkno: u32, page: &[u8; PAGE_SZ]) -> io::Result<()> {
        fail::fail_point!("ephemeral-write", |_| Err(io::Error::other(
            "failpoint ephemeral-write"
        )));
        self.file.write_all_at(&page[..], block_offset(blkno))
    }

    fn lock_writer(&self) -> std::sync::MutexGuard<'_, WriterState> {
        // A writer that panicked may have left a block half written: refuse further writes,
        // as after a failed write.
        self.writer.lock().unwrap_or_else(|poisoned| {
            let mut writer = poisoned.into_inner();
            writer.broken = true;
            writer
        })
    }

    fn write_tail(&self) -> RwLockWriteGuard<'_, [u8; PAGE_SZ]> {
        // Nothing under the lock panics (slice copies with checked bounds), and the tail's
        // bytes up to `len` are all a reader relies on.
        self.tail.write().unwrap_or_else(PoisonError::into_inner)
    }

    fn read_tail(&self) -> RwLockReadGuard<'_, [u8; PAGE_SZ]> {
        self.tail.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The tail's block number, from `len`.
    fn tail_blkno(&self) -> u64 {
        self.len() / PAGE_SZ as u64
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
        let tail_blkno = self.tail_blkno();
        match u64::from(blkno).cmp(&tail_blkno) {
            std::cmp::Ordering::Greater => {
                return Err(BlockReadError::OutOfBounds {
                    path: self.path.clone(),
                    blkno,
                    blocks: tail_blkno + 1,
                })
            }
            std::cmp::Ordering::Equal => {
                let tail = self.read_tail();
                // `len` moves only under the write lock: if this is still the tail, it stays
                // the tail while the lease lives.
                if self.tail_blkno() == tail_blkno {
                    read_cost::block(BlockKind::Value, true);
                    return Ok(BlockLease::Locked(tail));
                }
                // Sealed since: read it as an earlier block, with the lock released.
            }
            std::cmp::Ordering::Less => {}
        }
        // Only the block right before the tail can still be being written: any earlier one was
        // written and un-published before the block after it was sealed.
        if u64::from(blkno) + 1 == self.tail_blkno() {
            let sealed = self.sealed.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(block) = sealed.as_ref().filter(|b| b.blkno == blkno) {
                read_cost::block(BlockKind::Value, true);
                return Ok(BlockLease::Shared(block.page.clone()));
            }
        }
        if bypass {
            read_bypassing_cache(
                &self.cache,
                self.file.as_ref(),
                self.file_id,
                &self.path,
                blkno,
                BlockKind::Value,
            )
        } else {
            read_through_cache(
                &self.cache,
                self.file.as_ref(),
                self.file_id,
                &self.path,
                blkno,
                Arrival::ReadThrough,
                BlockKind::Value,
                None,
            )
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
