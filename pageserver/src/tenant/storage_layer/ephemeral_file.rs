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
//!  blocks 0 .. s-1: on disk,   blocks s .. n-1: sealed, at most    block n: the mutable tail
//!  immutable                   WRITE_STEP_BLOCKS (8) of them
//! +-----+-----+-----+-----+   +-----+-----+-----+                 +-----------------------+
//! |  0  |  1  | ... | s-1 |   |  s  | ... | n-1 |                 | filled ... | zeroes   |
//! +-----+-----+-----+-----+   +-----+-----+-----+                 +-----------------------+
//!    ^ read through the          ^ full, immutable, shared            ^ read under the
//!      page cache                  copies, written together             tail's read lock
//! ```
//!
//! * [`EphemeralFile::write_blob`] copies the blob into the **tail** (block `len / PAGE_SZ`)
//!   under the tail's write lock and then publishes the new [`EphemeralFile::len`]. A blob that
//!   fits the tail takes that lock alone. A blob that does not (it seals a block) is written
//!   under a writer mutex that no reader takes, with the tail *claimed* (a flag set and
//!   cleared under the tail's lock) until its last piece is in: meanwhile a blob that fits
//!   takes the writer mutex too, so no blob lands between another's pieces. A failed write
//!   leaves the claim, so every later write goes to the writer mutex and is refused.
//! * When a copy fills the tail, the writer **seals** it, all under the tail's write lock: the
//!   tail (an `Arc<[u8; PAGE_SZ]>` no one else holds) is moved, not copied, to the end of the
//!   **sealed run** and published there, a zeroed block takes its place, and only then does
//!   `len` (and with it the tail) move to the next block. A blob that fits in the tail takes
//!   the tail's lock once for its header and its bytes.
//! * Once the run holds [`WRITE_STEP_BLOCKS`] blocks, the writer writes all of them with one
//!   vectored positional write, holding only the writer mutex (the `ephemeral-write` failpoint
//!   is right before it), **pre-warms** the page cache with each as an immutable page (a
//!   just-written value is likely to be read soon, for page reconstruction or the flush to a
//!   delta layer), and only then un-publishes the run. So a block is always in memory, in the
//!   run, until it is in the page cache or on disk. The page cache never writes this file and
//!   never holds a page of it that can still change. A file created
//!   [without pre-warm](EphemeralFile::create_without_pre_warm) skips the pre-warm: for a layer
//!   no reader sees until it is flushed (an import's), whose blocks would only push readers'
//!   pages out of the cache before the flush reads them back bypassing it.
//! * Why a run and not each block as it is sealed: the kernel charges a write mostly per call,
//!   so 64 KiB in one call costs about half of what eight calls of 8 KiB do (docs/benchmarks.md,
//!   `write_blob`). The run is written at the end of the `write_blob` that filled it, after the
//!   rest of the blob is in the new tail; a blob that would seal a block past a full run writes
//!   the run first. The run is always the blocks right before the tail. Memory per file is the
//!   tail and at most [`WRITE_STEP_BLOCKS`] sealed copies, reused for the next run when no lease
//!   holds them any more; the last, partial run of a frozen layer's file stays in memory until
//!   the file is dropped.
//!
//! # What a reader sees
//!
//! `len` is published (release) only after its bytes are in the tail, so a reader that got an
//! offset below `len` finds the blob's bytes. [`EphemeralFile::read_blk`] (and the
//! [`BypassingReader`]) reads `len` (acquire) and:
//!
//! * the tail block: takes the tail's read lock and, if the tail has not moved meanwhile, hands
//!   out a [`BlockLease::Locked`] holding it;
//! * a block of the sealed run: its copy ([`BlockLease::Shared`]) while the run is published
//!   (the run's lock is held only to clone the `Arc`);
//! * any other earlier block: the page cache, or the file on a miss. Reaching here means the
//!   block's write completed: the writer un-publishes a run only after its write and pre-warm,
//!   and starts the next run only after that.
//! * past the tail: an out-of-bounds error, decided from `len` alone, without a lock.
//!
//! The writer holds the tail's write lock only for memcpy-sized work (a copy into the tail, and
//! at a seal swapping the block and publishing it) and never across I/O.
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
//! sealed copies and cached pages hold no lock at all. The invariant that replaces "no write while
//! a lease lives": a lease on the tail delays the next append into the tail (and a sealing
//! write's taking or giving up of the claim) by as long as it is held, and delays nothing else;
//! a lease on any other block delays nothing. No lease sees its block change:
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
//! // A 4-byte header and the blob: block 0 is full and sealed, block 1 is the tail.
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
//! A failed write leaves the file's contents at those blocks unknown, so the file is
//! **broken** from then on: the write returns an error naming the file and the blocks, and
//! every later write is refused. The sealed run stays published, so every block written before
//! the failure stays readable, including the values in the failed run that earlier writes
//! acknowledged. A failed pre-warm (the page cache had no free slot) is only
//! logged: the block is on disk and is read from there.
//!
//! # Lifetime
//!
//! The file is created in the timeline's directory as `ephemeral-<file id>` and removed when the
//! `EphemeralFile` is dropped; its cached pages become unreachable (file ids are never reused)
//! and age out. Files left behind by a crash are removed at startup with [`remove_leftovers`].

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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

/// Sealed blocks are written this many at a time, with one system call: on the machine of
/// docs/benchmarks.md one 64 KiB `pwrite` costs about what four of 8 KiB do, so per block it
/// costs about half as much.
pub const WRITE_STEP_BLOCKS: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum EphemeralWriteError {
    #[error(
        "failed to write blocks {blkno} to {} of ephemeral file {}: {source}",
        blkno + blocks - 1,
        path.display()
    )]
    Io {
        path: PathBuf,
        /// The first block of the write.
        blkno: u32,
        blocks: u32,
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
    /// The mutable tail. Never shared while it is the tail: sealing moves it into the run.
    tail: RwLock<Arc<[u8; PAGE_SZ]>>,
    /// The blocks right before the tail that are sealed but not yet written, for readers.
    sealed: RwLock<SealedRun>,
    /// Serializes the writers of blobs that seal a block (and of every blob while one of
    /// those is in progress); readers never take it, so it may be held across I/O.
    writer: Mutex<WriterState>,
    /// Set, under the tail's write lock, by a writer holding `writer` for a blob that does not
    /// fit the tail, until it is appended; left set once the file is broken. While it is set,
    /// a blob that fits the tail takes `writer` too instead of appending at once.
    claimed: AtomicBool,
    /// Whether a written block is inserted into the page cache.
    pre_warm: bool,
}

/// Sealed blocks `first .. first + pages.len()`, at most [`WRITE_STEP_BLOCKS`] of them.
struct SealedRun {
    first: u32,
    pages: Vec<Arc<[u8; PAGE_SZ]>>,
}

impl SealedRun {
    fn new() -> Self {
        SealedRun {
            first: 0,
            pages: Vec::with_capacity(WRITE_STEP_BLOCKS),
        }
    }

    fn get(&self, blkno: u32) -> Option<&Arc<[u8; PAGE_SZ]>> {
        self.pages.get(blkno.checked_sub(self.first)? as usize)
    }
}

struct WriterState {
    broken: bool,
    /// The writer's own copy of the published run: what the next write writes.
    run: SealedRun,
    /// Sealed copies written and no longer held by any lease: the next seals copy into them.
    spares: Vec<Arc<[u8; PAGE_SZ]>>,
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
            tail: RwLock::new(Arc::new([0u8; PAGE_SZ])),
            sealed: RwLock::new(SealedRun::new()),
            claimed: AtomicBool::new(false),
            writer: Mutex::new(WriterState {
                broken: false,
                run: SealedRun::new(),
                spares: Vec::with_capacity(WRITE_STEP_BLOCKS),
            }),
            pre_warm: true,
        }
    }

    /// Bytes appended so far, all of them readable: the tail and the sealed blocks included.
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
        self.write_blob_parts(&[blob])
    }

    /// Appends one blob made of `parts` one after the other, as [`EphemeralFile::write_blob`]
    /// of their concatenation, without making it: a caller that has a value in pieces (a kind
    /// byte and a page) saves a copy of the whole value.
    #[inline]
    pub fn write_blob_parts(&self, parts: &[&[u8]]) -> Result<u64, EphemeralWriteError> {
        let blob_len = parts.iter().map(|part| part.len()).sum();
        let header = BlobHeader::new(blob_len)?;
        let header = header.as_bytes();
        // Most blobs fit in the tail: the tail's lock alone, once for the header and the blob.
        match self.append_in_tail(header, parts, header.len() + blob_len) {
            Some(offset) => Ok(offset),
            None => self.write_blob_claimed(header, parts),
        }
    }

    /// Copies a blob of `total` bytes (`header` and `parts`) into the tail under its write lock
    /// and publishes it, if it fits there and no writer holds the claim; else `None`.
    #[inline(always)]
    fn append_in_tail(&self, header: &[u8], parts: &[&[u8]], total: usize) -> Option<u64> {
        let mut tail = self.write_tail();
        if self.claimed.load(Ordering::Relaxed) {
            return None;
        }
        // `len` changes only under the tail's write lock, which we hold.
        let offset = self.len.load(Ordering::Relaxed);
        let used = (offset % PAGE_SZ as u64) as usize;
        if used + total >= PAGE_SZ {
            return None;
        }
        let bytes = Arc::make_mut(&mut tail);
        let mut at = used;
        for piece in std::iter::once(header).chain(parts.iter().copied()) {
            bytes[at..at + piece.len()].copy_from_slice(piece);
            at += piece.len();
        }
        self.len.store(offset + total as u64, Ordering::Release);
        Some(offset)
    }

    /// A blob that seals a block, or that came while another writer held the claim: under the
    /// writer mutex. One that fits the tail now goes in at once (the claim is never held
    /// outside this mutex but on a broken file, refused here first); one that does not claims
    /// the tail, so that no blob that fits goes in between its pieces. A failure leaves the
    /// claim (and the file broken): every later write comes here and is refused.
    #[cold]
    fn write_blob_claimed(
        &self,
        header: &[u8],
        parts: &[&[u8]],
    ) -> Result<u64, EphemeralWriteError> {
        let mut writer = self.lock_writer();
        if writer.broken {
            return Err(EphemeralWriteError::Broken {
                path: self.path.clone(),
            });
        }
        let total = header.len() + parts.iter().map(|part| part.len()).sum::<usize>();
        if let Some(offset) = self.append_in_tail(header, parts, total) {
            return Ok(offset);
        }
        self.set_claimed(true);
        // Only writers change `len`, and no other writer appends while we hold the claim.
        let offset = self.len.load(Ordering::Relaxed);
        self.append(&mut writer, header)?;
        for part in parts {
            self.append(&mut writer, part)?;
        }
        if writer.run.pages.len() == WRITE_STEP_BLOCKS {
            self.write_sealed(&mut writer)?;
        }
        self.set_claimed(false);
        Ok(offset)
    }

    /// Sets or clears the claim on the tail, under the tail's write lock (so a writer in the
    /// fast path either finished before or sees it).
    fn set_claimed(&self, claimed: bool) {
        let _tail = self.write_tail();
        self.claimed.store(claimed, Ordering::Relaxed);
    }

    /// Copies `src` into the tail, sealing each tail it fills. A full run of sealed blocks is
    /// written before the next seal; the caller writes the run it leaves full.
    #[inline(always)]
    fn append(&self, writer: &mut WriterState, mut src: &[u8]) -> Result<(), EphemeralWriteError> {
        while !src.is_empty() {
            let len = self.len.load(Ordering::Relaxed);
            // Less than PAGE_SZ.
            let used = (len % PAGE_SZ as u64) as usize;
            let n = (PAGE_SZ - used).min(src.len());
            let (chunk, rest) = src.split_at(n);
            if used + n < PAGE_SZ {
                let mut tail = self.write_tail();
                Arc::make_mut(&mut tail)[used..used + n].copy_from_slice(chunk);
                self.len.store(len + n as u64, Ordering::Release);
            } else {
                if writer.run.pages.len() == WRITE_STEP_BLOCKS {
                    self.write_sealed(writer)?;
                }
                self.seal_tail(writer, len, chunk)?;
            }
            src = rest;
        }
        Ok(())
    }

    /// Fills the tail with `chunk`, publishes a copy of it as the last sealed block and moves
    /// the tail to the next block. Nothing changes if the file is out of block numbers.
    #[cold]
    fn seal_tail(
        &self,
        writer: &mut WriterState,
        len: u64,
        chunk: &[u8],
    ) -> Result<(), EphemeralWriteError> {
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
        // The next tail, zeroed before it is visible (a spare holds a written block's bytes).
        let mut fresh = writer
            .spares
            .pop()
            .unwrap_or_else(|| Arc::new([0u8; PAGE_SZ]));
        // A spare is kept only when nothing else held it: this never copies.
        Arc::make_mut(&mut fresh).fill(0);
        let used = PAGE_SZ - chunk.len();
        let mut tail = self.write_tail();
        Arc::make_mut(&mut tail)[used..].copy_from_slice(chunk);
        // The full tail becomes the sealed block itself, without a copy.
        let page = std::mem::replace(&mut *tail, fresh);
        if writer.run.pages.is_empty() {
            writer.run.first = blkno;
        }
        writer.run.pages.push(page.clone());
        // Published before the tail moves: a reader that sees the tail past this block finds
        // it in the run until it is written.
        {
            let mut sealed = self.sealed.write().unwrap_or_else(PoisonError::into_inner);
            sealed.first = writer.run.first;
            sealed.pages.push(page);
        }
        self.len.store(len + chunk.len() as u64, Ordering::Release);
        Ok(())
    }

    /// Writes the sealed run to disk with one vectored write, pre-warms the page cache with
    /// its blocks and un-publishes them. Holds no lock a reader takes while writing. After a
    /// failed write the run stays published, so the values in it stay readable.
    #[cold]
    fn write_sealed(&self, writer: &mut WriterState) -> Result<(), EphemeralWriteError> {
        let first = writer.run.first;
        let blocks = writer.run.pages.len();
        let written = self.write_blocks(first, &writer.run.pages);
        crate::metrics::EPHEMERAL_WRITES.inc();
        if let Err(source) = written {
            writer.broken = true;
            return Err(EphemeralWriteError::Io {
                path: self.path.clone(),
                blkno: first,
                blocks: blocks as u32,
                source,
            });
        }
        crate::metrics::EPHEMERAL_BYTES_WRITTEN.inc_by((blocks * PAGE_SZ) as u64);
        if self.pre_warm {
            for (blkno, page) in (first..).zip(&writer.run.pages) {
                let warmed =
                    self.cache
                        .insert_file_page(self.file_id, blkno, page, Arrival::PreWarm);
                if let Err(e) = warmed {
                    tracing::warn!(
                        path = %self.path.display(),
                        blkno,
                        "pre-warm of ephemeral file block skipped: {e}"
                    );
                }
            }
        }
        self.sealed
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .pages
            .clear();
        // A reader may still hold a lease on a copy; then a later seal allocates.
        for mut page in writer.run.pages.drain(..) {
            if Arc::get_mut(&mut page).is_some() {
                writer.spares.push(page);
            }
        }
        Ok(())
    }

    fn write_blocks(&self, first: u32, pages: &[Arc<[u8; PAGE_SZ]>]) -> io::Result<()> {
        fail::fail_point!("ephemeral-write", |_| Err(io::Error::other(
            "failpoint ephemeral-write"
        )));
        let mut bufs: [&[u8]; WRITE_STEP_BLOCKS] = [&[]; WRITE_STEP_BLOCKS];
        for (buf, page) in bufs.iter_mut().zip(pages) {
            *buf = &page[..];
        }
        self.file
            .write_all_vectored_at(&bufs[..pages.len()], block_offset(first))
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

    fn write_tail(&self) -> RwLockWriteGuard<'_, Arc<[u8; PAGE_SZ]>> {
        // Nothing under the lock panics (slice copies with checked bounds), and the tail's
        // bytes up to `len` are all a reader relies on.
        self.tail.write().unwrap_or_else(PoisonError::into_inner)
    }

    fn read_tail(&self) -> RwLockReadGuard<'_, Arc<[u8; PAGE_SZ]>> {
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
        // Only the last WRITE_STEP_BLOCKS blocks before the tail can still be unwritten: the run
        // is never longer, and every block before it was written and un-published before the
        // run's first block was sealed.
        if u64::from(blkno) + WRITE_STEP_BLOCKS as u64 >= self.tail_blkno() {
            let sealed = self.sealed.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(page) = sealed.get(blkno) {
                read_cost::block(BlockKind::Value, true);
                return Ok(BlockLease::Shared(page.clone()));
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
