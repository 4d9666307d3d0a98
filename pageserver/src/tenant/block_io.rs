//! Block I/O: every file we write is read as a sequence of 8 KiB blocks, and a reader gets a
//! [`BlockLease`] on one immutable block at a time.
//!
//! A lease is a borrow, not a copy: it pins a page in the page cache, or borrows the mutable
//! tail of an ephemeral file (so the borrow checker forbids writes while it lives), or, when the
//! page cache had no free slot, owns a private copy. Readers do not care which.
//!
//! [`FileBlockReader`] reads an immutable file through the page cache: a hit costs no I/O, a miss
//! reads the block from the file straight into a cache frame.

use std::io;
use std::ops::Deref;
use std::path::{Path, PathBuf};

use crate::page_cache::{Arrival, FileId, PageCache, PageLease, ReadThroughError};
use crate::tenant::read_cost::{self, BlockKind};
use crate::virtual_file::FileIo;
use crate::PAGE_SZ;

/// A read-only view of one block; see the module docs.
pub enum BlockLease<'a> {
    /// Pinned in the page cache.
    Cached(PageLease<'a>),
    /// An ephemeral file's mutable tail; the file cannot be written while this lives.
    Tail(&'a [u8; PAGE_SZ]),
    /// Read around the page cache because it had no free slot.
    Owned(Box<[u8; PAGE_SZ]>),
}

impl Deref for BlockLease<'_> {
    type Target = [u8; PAGE_SZ];

    #[inline]
    fn deref(&self) -> &[u8; PAGE_SZ] {
        match self {
            BlockLease::Cached(lease) => lease,
            BlockLease::Tail(tail) => tail,
            BlockLease::Owned(page) => page,
        }
    }
}

impl std::fmt::Debug for BlockLease<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            BlockLease::Cached(_) => "Cached",
            BlockLease::Tail(_) => "Tail",
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
}

/// The byte offset of block `blkno`.
pub fn block_offset(blkno: u32) -> u64 {
    u64::from(blkno) * PAGE_SZ as u64
}

/// Reads block `blkno` of an immutable file through the page cache, adding the block (as
/// `kind`) and any file read to the current [`read_cost`].
pub(crate) fn read_through_cache<'c>(
    cache: &'c PageCache,
    file: &dyn FileIo,
    file_id: FileId,
    path: &Path,
    blkno: u32,
    arrival: Arrival,
    kind: BlockKind,
) -> Result<BlockLease<'c>, BlockReadError> {
    let io_error = |source: io::Error| block_read_error(path, blkno, source);
    let mut filled = false;
    let read = cache.read_file_page(file_id, blkno, arrival, |frame| {
        filled = true;
        read_cost::io(PAGE_SZ as u64);
        file.read_exact_at(frame, block_offset(blkno))
    });
    if !matches!(read, Err(ReadThroughError::NoFreeSlot(_))) {
        read_cost::block(kind, !filled);
    }
    match read {
        Ok(lease) => Ok(BlockLease::Cached(lease)),
        Err(ReadThroughError::Fill(e)) => Err(io_error(e)),
        Err(ReadThroughError::NoFreeSlot(_)) => {
            read_cost::block(kind, false);
            read_cost::io(PAGE_SZ as u64);
            let mut page = Box::new([0u8; PAGE_SZ]);
            file.read_exact_at(&mut page[..], block_offset(blkno))
                .map_err(io_error)?;
            Ok(BlockLease::Owned(page))
        }
    }
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

/// Bytes `range` (not empty) of an immutable file, assembled from its blocks: blocks in the page
/// cache are copied from it, and each run of adjacent missing blocks is read with one call and
/// its blocks inserted into the cache. Costs are counted per block (as `kind`) and per call.
pub(crate) fn read_range_through_cache(
    cache: &PageCache,
    file: &dyn FileIo,
    file_id: FileId,
    path: &Path,
    range: std::ops::Range<u64>,
    kind: BlockKind,
) -> Result<Vec<u8>, BlockReadError> {
    let page = PAGE_SZ as u64;
    let block_no = |offset: u64| {
        u32::try_from(offset / page).map_err(|_| BlockReadError::PastEnd {
            path: path.to_owned(),
            blkno: u32::MAX,
        })
    };
    let first = block_no(range.start)?;
    let last = block_no(range.end - 1)?;
    let mut out = Vec::with_capacity((range.end - range.start) as usize);
    // The part of block `blkno` (its bytes in `block`) that lies in `range`.
    let mut take = |blkno: u32, block: &[u8]| {
        let block_start = u64::from(blkno) * page;
        let from = range.start.saturating_sub(block_start) as usize;
        let to = (range.end - block_start).min(page) as usize;
        out.extend_from_slice(&block[from..to]);
    };
    let mut missing_from: Option<u32> = None;
    // One step past the last block closes a run that reaches it.
    let past_last = last.checked_add(1).ok_or_else(|| BlockReadError::PastEnd {
        path: path.to_owned(),
        blkno: last,
    })?;
    for blkno in first..=past_last {
        let cached = if blkno <= last {
            cache.get_file_page(file_id, blkno)
        } else {
            None
        };
        let run_ends = blkno > last || cached.is_some();
        if let (Some(run_start), true) = (missing_from, run_ends) {
            let blocks = (blkno - run_start) as usize;
            let mut buf = vec![0u8; blocks * PAGE_SZ];
            read_cost::io(buf.len() as u64);
            file.read_exact_at(&mut buf, block_offset(run_start))
                .map_err(|source| block_read_error(path, run_start, source))?;
            for (i, block) in buf.chunks_exact(PAGE_SZ).enumerate() {
                let blkno = run_start + i as u32;
                read_cost::block(kind, false);
                let block: &[u8; PAGE_SZ] = block.try_into().expect("chunks of PAGE_SZ");
                // Best effort: a full cache only means the next read misses too.
                let _ = cache.insert_file_page(file_id, blkno, block, Arrival::ReadThrough);
                take(blkno, block);
            }
            missing_from = None;
        }
        if blkno > last {
            break;
        }
        match cached {
            Some(lease) => {
                read_cost::block(kind, true);
                take(blkno, &lease[..]);
            }
            None => {
                missing_from.get_or_insert(blkno);
            }
        }
    }
    Ok(out)
}

/// Reads an immutable file's blocks through the page cache.
pub struct FileBlockReader<'a> {
    file: &'a dyn FileIo,
    file_id: FileId,
    path: &'a Path,
    cache: &'a PageCache,
    kind: BlockKind,
    bypass: bool,
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
        }
    }

    /// Reads blocks the cache does not hold without inserting them
    /// ([`read_bypassing_cache`]).
    pub fn bypassing_cache(mut self) -> Self {
        self.bypass = true;
        self
    }

    /// Counts the blocks read as `kind` in read costs (value blocks unless told otherwise).
    pub fn counted_as(mut self, kind: BlockKind) -> Self {
        self.kind = kind;
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
        )
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
        use crate::tenant::read_cost::measure;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("six-blocks");
        let bytes: Vec<u8> = (0..6 * PAGE_SZ).map(|i| (i / 7) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let file = std::fs::File::open(&path).unwrap();
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
        assert_eq!(read.unwrap(), &bytes[100..5 * PAGE_SZ + 10]);
        assert_eq!(
            cost.to_string(),
            "layers=0 idx_hit=0 idx_miss=0 val_hit=1 val_miss=5 ios=2 bytes=40960"
        );
        // Everything it read is cached now.
        let (again, cost) = measure(|| {
            read_range_through_cache(&cache, &file, id, &path, range.clone(), BlockKind::Value)
        });
        assert_eq!(again.unwrap(), &bytes[100..5 * PAGE_SZ + 10]);
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
