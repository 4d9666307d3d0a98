//! Block I/O: every file we write is read as a sequence of 8 KiB blocks, and a reader gets a
//! [`BlockLease`] on one immutable block at a time.
//!
//! A lease is a borrow, not a copy, wherever it can be: it pins a page in the page cache,
//! borrows a block held in memory, shares an immutable block with its writer, or read-locks a
//! block that its owner changes only under the lock's write side; and when the page cache had no
//! free slot, it owns a private copy. Readers do not care which, but a `Locked` lease keeps its
//! block's writer waiting, so whoever hands one out says how long it may be held.
//!
//! [`FileBlockReader`] reads an immutable file through the page cache: a hit costs no I/O, a miss
//! reads the block from the file straight into a cache frame.

use std::io;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLockReadGuard};

use crate::io::read_cost::{self, BlockKind};
use crate::io::virtual_file::FileIo;
use crate::page_cache::{
    Arrival, BlockRead, Fetched, FileId, PageCache, PageLease, ReadThroughError,
};
use crate::PAGE_SZ;

/// A read-only view of one block; see the module docs.
pub enum BlockLease<'a> {
    /// Pinned in the page cache.
    Cached(PageLease<'a>),
    /// A block in memory, borrowed: its owner cannot change it while this lives.
    Borrowed(&'a [u8; PAGE_SZ]),
    /// An immutable block in memory, shared with its owner.
    Shared(Arc<[u8; PAGE_SZ]>),
    /// A block that its owner changes in place under a write lock, read-locked while this lives.
    Locked(RwLockReadGuard<'a, Arc<[u8; PAGE_SZ]>>),
    /// Read around the page cache because it had no free slot.
    Owned(Box<[u8; PAGE_SZ]>),
}

impl Deref for BlockLease<'_> {
    type Target = [u8; PAGE_SZ];

    #[inline]
    fn deref(&self) -> &[u8; PAGE_SZ] {
        match self {
            BlockLease::Cached(lease) => lease,
            BlockLease::Borrowed(block) => block,
            BlockLease::Shared(block) => block,
            BlockLease::Locked(guard) => guard.as_ref(),
            BlockLease::Owned(page) => page,
        }
    }
}

impl std::fmt::Debug for BlockLease<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            BlockLease::Cached(_) => "Cached",
            BlockLease::Borrowed(_) => "Borrowed",
            BlockLease::Shared(_) => "Shared",
            BlockLease::Locked(_) => "Locked",
            BlockLease::Owned(_) => "Owned",
        };
        write!(f, "BlockLease::{kind}")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BlockReadError {
    #[error("failed to read block {blkno} of {}: {source}", path.display())]
    Io {
        path: PathBuf,
        blkno: u32,
        source: io::Error,
    },
    #[error("block {blkno} of {} is past its end ({blocks} blocks)", path.display())]
    OutOfBounds {
        path: PathBuf,
        blkno: u32,
        blocks: u64,
    },
    #[error("block {blkno} of {} is past the end of the file", path.display())]
    PastEnd { path: PathBuf, blkno: u32 },
}

/// Something that hands out leases on its blocks.
pub trait BlockReader {
    fn read_blk(&self, blkno: u32) -> Result<BlockLease<'_>, BlockReadError>;

    /// Whether a [`BlockLease::Cached`] from this reader was checked before it was cached, so
    /// its reader need not check it again (see [`FileBlockReader::index_blocks`]).
    fn cached_blocks_verified(&self) -> bool {
        false
    }
}

/// A check of a block's contents, made before a block read from a file is cached (see
/// [`FileBlockReader::index_blocks`]). A closure, so that it can carry what the block must
/// match, such as the checksum a layer stores for it elsewhere.
pub type BlockCheck<'a> = &'a dyn Fn(&[u8; PAGE_SZ]) -> bool;

/// A [`BlockCheck`] that is also told the block's number (which checksum it must match).
pub type NumberedBlockCheck<'a> = &'a dyn Fn(u32, &[u8; PAGE_SZ]) -> bool;

/// The byte offset of block `blkno`.
pub fn block_offset(blkno: u32) -> u64 {
    u64::from(blkno) * PAGE_SZ as u64
}

/// Reads block `blkno` of an immutable file through the page cache, adding the block (as
/// `kind`) and any file read to the current [`read_cost`]. A miss that another reader is
/// already reading waits for that read. With a `check`, a block read from the file is cached
/// only if it passes; one that fails is handed out uncached, for its reader to report.
#[allow(clippy::too_many_arguments)]
pub(crate) fn read_through_cache<'c>(
    cache: &'c PageCache,
    file: &dyn FileIo,
    file_id: FileId,
    path: &Path,
    blkno: u32,
    arrival: Arrival,
    kind: BlockKind,
    check: Option<BlockCheck<'_>>,
) -> Result<BlockLease<'c>, BlockReadError> {
    let io_error = |source: io::Error| block_read_error(path, blkno, source);
    let read = cache.read_file_page_traced(file_id, blkno, arrival, |frame| {
        read_cost::io(PAGE_SZ as u64);
        file.read_exact_at(frame, block_offset(blkno))
            .map_err(FillError::Io)?;
        match check {
            Some(check) if !check(frame) => Err(FillError::Unverified),
            _ => Ok(()),
        }
    });
    match read {
        Ok((lease, fetched)) => {
            read_cost::block(kind, fetched == Fetched::Hit);
            if fetched == Fetched::Waited {
                read_cost::waited();
            }
            Ok(BlockLease::Cached(lease))
        }
        Err(ReadThroughError::Fill(FillError::Io(e))) => {
            read_cost::block(kind, false);
            Err(io_error(e))
        }
        Err(ReadThroughError::Fill(FillError::Unverified) | ReadThroughError::NoFreeSlot(_)) => {
            read_cost::block(kind, false);
            read_cost::io(PAGE_SZ as u64);
            let mut page = Box::new([0u8; PAGE_SZ]);
            file.read_exact_at(&mut page[..], block_offset(blkno))
                .map_err(io_error)?;
            Ok(BlockLease::Owned(page))
        }
    }
}

/// Why a block read into a cache frame was not published.
enum FillError {
    Io(io::Error),
    /// The block failed its check.
    Unverified,
}

/// Reads block `blkno` of an immutable file from the page cache if it is there, and otherwise
/// from the file into a private buffer, inserting nothing: for bulk reads (a flush, a
/// full-layer scan) that must not push out what other readers use. Costs are counted as in
/// [`read_through_cache`].
pub(crate) fn read_bypassing_cache<'c>(
    cache: &'c PageCache,
    file: &dyn FileIo,
    file_id: FileId,
    path: &Path,
    blkno: u32,
    kind: BlockKind,
) -> Result<BlockLease<'c>, BlockReadError> {
    if let Some(lease) = cache.get_file_page(file_id, blkno) {
        read_cost::block(kind, true);
        return Ok(BlockLease::Cached(lease));
    }
    read_cost::block(kind, false);
    read_cost::io(PAGE_SZ as u64);
    let mut page = Box::new([0u8; PAGE_SZ]);
    file.read_exact_at(&mut page[..], block_offset(blkno))
        .map_err(|source| block_read_error(path, blkno, source))?;
    Ok(BlockLease::Owned(page))
}

fn block_read_error(path: &Path, blkno: u32, source: io::Error) -> BlockReadError {
    if source.kind() == io::ErrorKind::UnexpectedEof {
        BlockReadError::PastEnd {
            path: path.to_owned(),
            blkno,
        }
    } else {
        BlockReadError::Io {
            path: path.to_owned(),
            blkno,
            source,
        }
    }
}

/// Bytes `range` (not empty) of an immutable file, copied out of its blocks into a buffer of
/// exactly the range's length: each block is copied from the page cache if it is there
/// (just the part of it in the range), each run of adjacent missing blocks is read with one
/// call and its blocks inserted into the cache, and blocks another reader is reading right
/// now are waited for. Costs are counted per block (as `kind`) and per call.
///
/// A hot read costs one copy of the range and nothing else: the buffer is not zeroed first,
/// and it becomes the value's bytes without another copy. A read that misses copies what the
/// cache holds first and lets go of those pages before it does any I/O.
pub(crate) fn read_range_through_cache(
    cache: &PageCache,
    file: &dyn FileIo,
    file_id: FileId,
    path: &Path,
    range: std::ops::Range<u64>,
    kind: BlockKind,
) -> Result<Vec<u8>, BlockReadError> {
    if range.start >= range.end {
        return Ok(Vec::new());
    }
    let page = PAGE_SZ as u64;
    let past_end = |blkno: u32| BlockReadError::PastEnd {
        path: path.to_owned(),
        blkno,
    };
    let first = u32::try_from(range.start / page).map_err(|_| past_end(u32::MAX))?;
    let last = u32::try_from((range.end - 1) / page).map_err(|_| past_end(u32::MAX))?;
    // Where the part of block `blkno` that lies in the range is, in the block and in the
    // output.
    let part = |blkno: u32| {
        let head = block_offset(blkno);
        let from = range.start.max(head);
        let to = range.end.min(head + page);
        let in_block = (from - head) as usize..(to - head) as usize;
        let in_out = (from - range.start) as usize..(to - range.start) as usize;
        (in_block, in_out)
    };
    let reads: Vec<BlockRead<'_>> = (first..=last)
        .map(|blkno| cache.begin_file_read(file_id, blkno))
        .collect();
    let len = (range.end - range.start) as usize;
    if reads
        .iter()
        .all(|read| matches!(read, BlockRead::Cached(_)))
    {
        let mut out = Vec::with_capacity(len);
        for (blkno, read) in (first..).zip(&reads) {
            if let BlockRead::Cached(lease) = read {
                read_cost::block(kind, true);
                out.extend_from_slice(&lease[part(blkno).0]);
            }
        }
        return Ok(out);
    }
    let mut out = vec![0u8; len];
    // Our own claims first, landed before waiting for anyone else's (see page_cache_sync::inflight).
    let mut waits = Vec::new();
    let mut claimed = Vec::new();
    for (blkno, read) in (first..).zip(reads) {
        match read {
            BlockRead::Cached(lease) => {
                read_cost::block(kind, true);
                let (in_block, in_out) = part(blkno);
                out[in_out].copy_from_slice(&lease[in_block]);
            }
            BlockRead::Claimed(claim) => claimed.push((blkno, claim)),
            BlockRead::InFlight(flight) => waits.push((blkno, flight)),
        }
    }
    let mut claims = claimed.into_iter().peekable();
    while let Some((run_start, claim)) = claims.next() {
        let mut run = vec![claim];
        while let Some((_, next)) = claims.next_if(|(b, _)| *b == run_start + run.len() as u32) {
            run.push(next);
        }
        let mut bytes = vec![0u8; run.len() * PAGE_SZ];
        read_cost::io(bytes.len() as u64);
        // On an error the claims drop unlanded, and their waiters read for themselves.
        file.read_exact_at(&mut bytes, block_offset(run_start))
            .map_err(|source| block_read_error(path, run_start, source))?;
        for ((blkno, claim), block) in (run_start..).zip(run).zip(bytes.chunks_exact(PAGE_SZ)) {
            read_cost::block(kind, false);
            let block: &[u8; PAGE_SZ] = block.try_into().expect("chunks of PAGE_SZ");
            // Best effort: a full cache only means the next read misses too.
            let _ = claim.land(block, Arrival::ReadThrough);
            let (in_block, in_out) = part(blkno);
            out[in_out].copy_from_slice(&block[in_block]);
        }
    }
    for (blkno, flight) in waits {
        read_cost::block(kind, false);
        read_cost::waited();
        let (in_block, in_out) = part(blkno);
        match flight.wait() {
            Some(lease) => out[in_out].copy_from_slice(&lease[in_block]),
            None => {
                read_cost::io(page);
                let mut block = [0u8; PAGE_SZ];
                file.read_exact_at(&mut block, block_offset(blkno))
                    .map_err(|source| block_read_error(path, blkno, source))?;
                out[in_out].copy_from_slice(&block[in_block]);
            }
        }
    }
    Ok(out)
}

/// Brings blocks `blocks` of an immutable file into the page cache, for reads about to need
/// them: each run of adjacent blocks the cache lacks is read with one call and inserted; blocks
/// it holds, and blocks another reader is reading now, are left alone. Only what it reads is
/// counted (as missed blocks of `kind` and the calls), so a read that then finds them cached
/// shows both. With a `check`, a block is cached only if it passes (given its number); one
/// that fails is left for its reader to find and report.
pub(crate) fn warm_blocks_through_cache(
    cache: &PageCache,
    file: &dyn FileIo,
    file_id: FileId,
    path: &Path,
    blocks: std::ops::Range<u32>,
    kind: BlockKind,
    check: Option<NumberedBlockCheck<'_>>,
) -> Result<(), BlockReadError> {
    let mut run: Vec<(u32, crate::page_cache::ReadClaim<'_>)> = Vec::new();
    let read_run = |run: &mut Vec<(u32, crate::page_cache::ReadClaim<'_>)>| {
        let Some(&(first, _)) = run.first() else {
            return Ok(());
        };
        let mut bytes = vec![0u8; run.len() * PAGE_SZ];
        read_cost::io(bytes.len() as u64);
        file.read_exact_at(&mut bytes, block_offset(first))
            .map_err(|source| block_read_error(path, first, source))?;
        for ((blkno, claim), block) in run.drain(..).zip(bytes.chunks_exact(PAGE_SZ)) {
            read_cost::block(kind, false);
            let block: &[u8; PAGE_SZ] = block.try_into().expect("chunks of PAGE_SZ");
            if check.is_none_or(|check| check(blkno, block)) {
                let _ = claim.land(block, Arrival::ReadThrough);
            }
        }
        Ok(())
    };
    for blkno in blocks {
        match cache.begin_file_read(file_id, blkno) {
            BlockRead::Claimed(claim) => run.push((blkno, claim)),
            // Cached, or being read: the run of blocks to read ends here.
            BlockRead::Cached(_) | BlockRead::InFlight(_) => read_run(&mut run)?,
        }
    }
    read_run(&mut run)
}

/// Reads an immutable file's blocks through the page cache.
pub struct FileBlockReader<'a> {
    file: &'a dyn FileIo,
    file_id: FileId,
    path: &'a Path,
    cache: &'a PageCache,
    kind: BlockKind,
    bypass: bool,
    /// Blocks read from the file are cached only if they pass this.
    check: Option<BlockCheck<'a>>,
}

impl<'a> FileBlockReader<'a> {
    /// `file_id` must be the id under which this file's blocks are cached, and the file must
    /// not change while any block of it may be cached.
    pub fn new(
        file: &'a dyn FileIo,
        file_id: FileId,
        path: &'a Path,
        cache: &'a PageCache,
    ) -> Self {
        FileBlockReader {
            file,
            file_id,
            path,
            cache,
            kind: BlockKind::Value,
            bypass: false,
            check: None,
        }
    }

    /// Reads blocks the cache does not hold without inserting them
    /// ([`read_bypassing_cache`]).
    pub fn bypassing_cache(mut self) -> Self {
        self.bypass = true;
        self
    }

    /// Reads the file's index blocks: they are cached under the file's index id (with the
    /// index blocks' priority, see [`FileId::index_blocks`]) and counted as index blocks in
    /// read costs. Without this, blocks are value blocks.
    ///
    /// A block read from the file is cached only if it passes `check`, so every cached index
    /// block is a verified one and its readers need not verify it again on every hit
    /// ([`BlockReader::cached_blocks_verified`]). Index blocks must be read only through readers
    /// made by this, each block always with the same check, or that promise would not hold.
    pub fn index_blocks(mut self, check: BlockCheck<'a>) -> Self {
        self.kind = BlockKind::Index;
        self.file_id = self.file_id.index_blocks();
        self.verified_by(check)
    }

    /// Caches a block read from the file only if it passes `check`; one that fails is handed
    /// out uncached ([`BlockLease::Owned`]), for its reader to check and report. So a
    /// [`BlockLease::Cached`] block passed `check`, provided every reader of these blocks that
    /// may insert them checks them the same way.
    pub fn verified_by(mut self, check: BlockCheck<'a>) -> Self {
        self.check = Some(check);
        self
    }
}

impl BlockReader for FileBlockReader<'_> {
    fn read_blk(&self, blkno: u32) -> Result<BlockLease<'_>, BlockReadError> {
        if self.bypass {
            return read_bypassing_cache(
                self.cache,
                self.file,
                self.file_id,
                self.path,
                blkno,
                self.kind,
            );
        }
        read_through_cache(
            self.cache,
            self.file,
            self.file_id,
            self.path,
            blkno,
            Arrival::ReadThrough,
            self.kind,
            self.check,
        )
    }

    fn cached_blocks_verified(&self) -> bool {
        self.check.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::page_cache::PageCacheConfig;
    use std::io::Write;

    fn cache(pages: usize) -> PageCache {
        PageCache::new(PageCacheConfig {
            capacity_bytes: (pages * PAGE_SZ) as u64,
            ..Default::default()
        })
        .unwrap()
    }

    /// A file of `blocks` blocks in `dir`, byte `i` being `byte(i)`: its path, its bytes and
    /// the file opened for reading.
    fn test_file(
        dir: &Path,
        name: &str,
        blocks: usize,
        byte: impl Fn(usize) -> u8,
    ) -> (PathBuf, Vec<u8>, std::fs::File) {
        let path = dir.join(name);
        let bytes: Vec<u8> = (0..blocks * PAGE_SZ).map(byte).collect();
        std::fs::write(&path, &bytes).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        (path, bytes, file)
    }

    #[test]
    fn reads_blocks_through_the_cache_and_reports_eof() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("three-blocks");
        let mut f = std::fs::File::create(&path).unwrap();
        for b in 0..3u8 {
            f.write_all(&[b + 1; PAGE_SZ]).unwrap();
        }
        drop(f);
        let file = std::fs::File::open(&path).unwrap();
        let cache = cache(8);
        let reader = FileBlockReader::new(&file, FileId::next(), &path, &cache);
        for round in 0..2 {
            for b in 0..3u8 {
                let blk = reader.read_blk(u32::from(b)).unwrap();
                assert!(blk.iter().all(|&x| x == b + 1), "round {round} block {b}");
            }
        }
        let stats = cache.stats().file_pages;
        assert_eq!((stats.misses, stats.hits), (3, 3));

        let err = reader.read_blk(3).unwrap_err();
        assert!(matches!(err, BlockReadError::PastEnd { blkno: 3, .. }));
        assert!(err.to_string().contains("three-blocks"), "{err}");
    }

    #[test]
    fn a_range_reads_each_run_of_missing_blocks_once() {
        use crate::io::read_cost::measure;
        let dir = tempfile::tempdir().unwrap();
        let (path, bytes, file) = test_file(dir.path(), "six-blocks", 6, |i| (i / 7) as u8);
        let cache = cache(16);
        let id = FileId::next();
        // Block 2 cached: the range splits into two runs of missing blocks around it.
        drop(
            FileBlockReader::new(&file, id, &path, &cache)
                .read_blk(2)
                .unwrap(),
        );
        let range = 100..(5 * PAGE_SZ as u64 + 10);
        let (read, cost) = measure(|| {
            read_range_through_cache(&cache, &file, id, &path, range.clone(), BlockKind::Value)
        });
        assert_eq!(&*read.unwrap(), &bytes[100..5 * PAGE_SZ + 10]);
        assert_eq!(
            cost.to_string(),
            "layers=0 idx_hit=0 idx_miss=0 val_hit=1 val_miss=5 ios=2 bytes=40960 waits=0 downloads=0"
        );
        // Everything it read is cached now.
        let (again, cost) = measure(|| {
            read_range_through_cache(&cache, &file, id, &path, range.clone(), BlockKind::Value)
        });
        assert_eq!(&*again.unwrap(), &bytes[100..5 * PAGE_SZ + 10]);
        assert_eq!((cost.val_hit, cost.ios), (6, 0));
        // Past the end of the file: an error naming it, not a panic.
        let err = read_range_through_cache(
            &cache,
            &file,
            id,
            &path,
            0..7 * PAGE_SZ as u64,
            BlockKind::Value,
        )
        .unwrap_err();
        assert!(err.to_string().contains("six-blocks"), "{err}");
    }

    #[test]
    fn a_range_waits_for_a_block_another_reader_is_reading() {
        use crate::io::read_cost::measure;
        let dir = tempfile::tempdir().unwrap();
        let (path, bytes, file) = test_file(dir.path(), "three-blocks", 3, |i| (i / 11) as u8);
        let cache = cache(16);
        let id = FileId::next();
        // Another reader is reading block 1.
        let BlockRead::Claimed(claim) = cache.begin_file_read(id, 1) else {
            panic!("nothing is cached or in flight yet");
        };
        std::thread::scope(|s| {
            let range_reader = s.spawn(|| {
                measure(|| {
                    read_range_through_cache(
                        &cache,
                        &file,
                        id,
                        &path,
                        0..3 * PAGE_SZ as u64,
                        BlockKind::Value,
                    )
                })
            });
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while cache.stats().miss_waits == 0 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the range never waited"
                );
                std::thread::yield_now();
            }
            let block: &[u8; PAGE_SZ] = bytes[PAGE_SZ..2 * PAGE_SZ].try_into().unwrap();
            claim.land(block, Arrival::ReadThrough).unwrap();
            let (read, cost) = range_reader.join().unwrap();
            assert_eq!(&*read.unwrap(), &bytes[..]);
            // Blocks 0 and 2 are two runs (1 is not ours to read), and 1 is waited for.
            assert_eq!(
                cost.to_string(),
                "layers=0 idx_hit=0 idx_miss=0 val_hit=0 val_miss=3 ios=2 bytes=16384 waits=1 downloads=0"
            );
        });
        assert_eq!(cache.stats().file_pages.inserts, 3);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Any range, with any blocks cached before, reads exactly the file's bytes.
        #[test]
        fn any_range_reads_the_files_bytes(
            start in 0u64..(6 * PAGE_SZ as u64 - 1),
            len in 1u64..(3 * PAGE_SZ as u64),
            cached in proptest::collection::vec(proptest::bool::ANY, 6),
        ) {
            let end = (start + len).min(6 * PAGE_SZ as u64);
            let dir = tempfile::tempdir().unwrap();
            let (path, bytes, file) = test_file(dir.path(), "six-blocks", 6, |i| (i % 251) as u8);
            let cache = cache(16);
            let id = FileId::next();
            let reader = FileBlockReader::new(&file, id, &path, &cache);
            for (blkno, _) in cached.iter().enumerate().filter(|(_, c)| **c) {
                drop(reader.read_blk(blkno as u32).unwrap());
            }
            let read = read_range_through_cache(&cache, &file, id, &path, start..end, BlockKind::Value)
                .unwrap();
            proptest::prop_assert_eq!(&read[..], &bytes[start as usize..end as usize]);
        }
    }

    #[test]
    fn ranges_starting_and_ending_at_and_beside_block_boundaries_read_the_files_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let (path, bytes, file) = test_file(dir.path(), "four-blocks", 4, |i| (i % 253) as u8);
        let edges: Vec<u64> = (0..=4u64)
            .map(|k| k * PAGE_SZ as u64)
            .flat_map(|o| [o.checked_sub(1), Some(o), Some(o + 1)])
            .flatten()
            .filter(|&o| o <= 4 * PAGE_SZ as u64)
            .collect();
        for cached in 0u32..16 {
            for &start in &edges {
                for &end in edges.iter().filter(|&&end| end > start) {
                    let cache = cache(8);
                    let id = FileId::next();
                    let reader = FileBlockReader::new(&file, id, &path, &cache);
                    for blkno in (0..4).filter(|b| cached & (1 << b) != 0) {
                        drop(reader.read_blk(blkno).unwrap());
                    }
                    let read = read_range_through_cache(
                        &cache,
                        &file,
                        id,
                        &path,
                        start..end,
                        BlockKind::Value,
                    )
                    .unwrap();
                    assert_eq!(
                        &read[..],
                        &bytes[start as usize..end as usize],
                        "{start}..{end}"
                    );
                }
            }
        }
    }

    #[test]
    fn warming_reads_each_missing_run_once_and_caches_only_checked_blocks() {
        use crate::io::read_cost::measure;
        let dir = tempfile::tempdir().unwrap();
        let (path, _, file) = test_file(dir.path(), "six-blocks", 6, |i| (i / 13) as u8);
        let cache = cache(16);
        let id = FileId::next();
        drop(
            FileBlockReader::new(&file, id, &path, &cache)
                .read_blk(2)
                .unwrap(),
        );
        // Block 4 fails its check: read with its run, not cached.
        let check = |blkno: u32, _: &[u8; PAGE_SZ]| blkno != 4;
        let ((), cost) = measure(|| {
            warm_blocks_through_cache(
                &cache,
                &file,
                id,
                &path,
                0..6,
                BlockKind::Value,
                Some(&check),
            )
            .unwrap()
        });
        // Blocks 0-1 and 3-5: two reads; block 2 was cached and is not counted.
        assert_eq!((cost.ios, cost.val_miss, cost.val_hit), (2, 5, 0));
        for blkno in [0, 1, 2, 3, 5] {
            assert!(cache.peek_file_page(id, blkno).is_some(), "block {blkno}");
        }
        assert!(cache.peek_file_page(id, 4).is_none());
    }

    #[test]
    fn serves_uncached_copies_when_the_cache_is_all_pinned() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; 8 * PAGE_SZ]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let cache = cache(4);
        let reader = FileBlockReader::new(&file, FileId::next(), &path, &cache);
        let pinned: Vec<_> = (0..4).map(|b| reader.read_blk(b).unwrap()).collect();
        let extra = reader.read_blk(5).unwrap();
        assert!(matches!(extra, BlockLease::Owned(_)));
        assert!(extra.iter().all(|&x| x == 7));
        drop(pinned);
    }
}
