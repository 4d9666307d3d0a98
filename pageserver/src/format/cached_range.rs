//! A byte range of an immutable file read where it lies in the page cache: checked and copied
//! straight from the cached blocks, with no buffer in between.
//!
//! [`read_range_through_cache`](super::block_io::read_range_through_cache) copies a range into
//! a buffer of its own, which the caller then checksums and decodes. For a value whose decoded
//! form is itself a copy (an 8 KiB image becomes a page of its own), that first buffer is a copy
//! nobody needs, and on a hot read it is most of the work: the range is read from memory the
//! CPU caches have lost, written out, and read again by the checksum. When every block of a
//! range is cached, a [`CachedRange`] holds their leases instead, so the checksum reads the
//! blocks in place and the copy that follows finds them in the CPU's caches. When any block is
//! missing the caller falls back to the read that fetches it: next to the I/O, the extra copy
//! does not matter.
//!
//! A range spans at most [`MAX_CACHED_RANGE_BLOCKS`] blocks (longer ones take the fallback) and
//! holds its leases, pinning those pages, only until it is dropped: a reader copies out what it
//! needs and lets go before it decodes.

use std::ops::Range;

use crate::io::read_cost::{self, BlockKind};
use crate::page_cache::{FileId, PageCache, PageLease};
use crate::PAGE_SZ;

/// The most blocks a [`CachedRange`] spans: an 8 KiB page with its headers needs two or three.
pub(crate) const MAX_CACHED_RANGE_BLOCKS: usize = 3;

/// Bytes `start..start + len` of a file, every block of them pinned in the page cache.
pub(crate) struct CachedRange<'c> {
    leases: [Option<PageLease<'c>>; MAX_CACHED_RANGE_BLOCKS],
    /// Where the range begins in its first block.
    skip: usize,
    len: usize,
}

impl<'c> CachedRange<'c> {
    /// Bytes `range` of `file` if it is not empty, spans at most [`MAX_CACHED_RANGE_BLOCKS`]
    /// blocks and every one of them is cached; counted then as hits of `kind`. `None` counts
    /// nothing: the caller's fallback read counts what it finds.
    pub(crate) fn lookup(
        cache: &'c PageCache,
        file: FileId,
        range: Range<u64>,
        kind: BlockKind,
    ) -> Option<CachedRange<'c>> {
        if range.start >= range.end {
            return None;
        }
        let page = PAGE_SZ as u64;
        let first = u32::try_from(range.start / page).ok()?;
        let last = u32::try_from((range.end - 1) / page).ok()?;
        let blocks = (last - first) as usize + 1;
        if blocks > MAX_CACHED_RANGE_BLOCKS {
            return None;
        }
        let mut leases = [const { None }; MAX_CACHED_RANGE_BLOCKS];
        for (slot, blkno) in leases.iter_mut().zip(first..=last) {
            // A block missing after others were found: those count one more reference in the
            // CLOCK (the fallback read takes them again), never a second hit in the counters.
            *slot = Some(cache.peek_file_page(file, blkno)?);
        }
        cache.count_file_hits(file, blocks);
        for _ in 0..blocks {
            read_cost::block(kind, true);
        }
        Some(CachedRange {
            leases,
            skip: (range.start % page) as usize,
            len: (range.end - range.start) as usize,
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Calls `visit` with the parts of bytes `sub` of the range (offsets from its start), in
    /// order: one part per block they touch. `sub` must lie within the range.
    fn for_each_part(&self, sub: Range<usize>, mut visit: impl FnMut(&[u8])) {
        debug_assert!(sub.start <= sub.end && sub.end <= self.len);
        // Offsets in the first block's frame onwards, as if the blocks were one buffer.
        let (mut from, to) = (self.skip + sub.start, self.skip + sub.end);
        while from < to {
            let block = from / PAGE_SZ;
            let lease = self.leases[block]
                .as_ref()
                .expect("a range holds a lease on every block it spans");
            let in_block = from % PAGE_SZ;
            let take = (PAGE_SZ - in_block).min(to - from);
            visit(&lease[in_block..in_block + take]);
            from += take;
        }
    }

    /// Copies bytes `at..at + out.len()` of the range into `out`.
    pub(crate) fn copy_to(&self, at: usize, out: &mut [u8]) {
        let mut filled = 0;
        self.for_each_part(at..at + out.len(), |part| {
            out[filled..filled + part.len()].copy_from_slice(part);
            filled += part.len();
        });
    }

    /// Bytes `at..at + N` of the range: a header or a checksum. A fixed-size read where they
    /// lie in one block (a call of `memcpy` per field costs more than the field).
    #[inline]
    pub(crate) fn array<const N: usize>(&self, at: usize) -> [u8; N] {
        debug_assert!(at + N <= self.len);
        let from = self.skip + at;
        let in_block = from % PAGE_SZ;
        if in_block + N <= PAGE_SZ {
            if let Some(lease) = &self.leases[from / PAGE_SZ] {
                let mut out = [0u8; N];
                out.copy_from_slice(&lease[in_block..in_block + N]);
                return out;
            }
        }
        let mut out = [0u8; N];
        self.copy_to(at, &mut out);
        out
    }

    /// Bytes `sub` of the range in a buffer of exactly their length.
    pub(crate) fn to_vec(&self, sub: Range<usize>) -> Vec<u8> {
        let mut out = Vec::with_capacity(sub.len());
        self.for_each_part(sub, |part| out.extend_from_slice(part));
        out
    }

    /// The CRC-32C of bytes `sub` of the range, read in place.
    pub(crate) fn crc32c(&self, sub: Range<usize>) -> u32 {
        let mut crc = 0;
        self.for_each_part(sub, |part| crc = utils::crc32c::crc32c_append(crc, part));
        crc
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::page_cache::{Arrival, PageCacheConfig};

    fn cache_with_blocks(file: FileId, blocks: u32) -> PageCache {
        let cache = PageCache::new(PageCacheConfig {
            capacity_bytes: 64 * PAGE_SZ as u64,
            ..Default::default()
        })
        .unwrap();
        for blkno in 0..blocks {
            let mut page = [0u8; PAGE_SZ];
            for (i, b) in page.iter_mut().enumerate() {
                *b = byte_at(blkno as usize * PAGE_SZ + i);
            }
            cache
                .insert_file_page(file, blkno, &page, Arrival::ReadThrough)
                .unwrap();
        }
        cache
    }

    /// The byte at file offset `at` of the test file.
    fn byte_at(at: usize) -> u8 {
        (at.wrapping_mul(31) ^ (at >> 8)) as u8
    }

    #[test]
    fn reads_across_block_edges_as_one_buffer() {
        let file = FileId::next();
        let cache = cache_with_blocks(file, 3);
        let p = PAGE_SZ as u64;
        for range in [
            0..1,
            5..p,
            p - 3..p + 9,
            p - 1..2 * p + 1,
            1..3 * p,
            2 * p + 100..2 * p + 101,
        ] {
            let expected: Vec<u8> = (range.start..range.end)
                .map(|at| byte_at(at as usize))
                .collect();
            let r = CachedRange::lookup(&cache, file, range.clone(), BlockKind::Value)
                .unwrap_or_else(|| panic!("{range:?} is cached"));
            assert_eq!(r.len(), expected.len());
            assert_eq!(r.to_vec(0..r.len()), expected);
            for sub in [0..0, 0..1, 1..r.len(), r.len() / 2..r.len()] {
                assert_eq!(r.to_vec(sub.clone()), expected[sub.clone()]);
                assert_eq!(
                    r.crc32c(sub.clone()),
                    utils::crc32c::crc32c(&expected[sub.clone()])
                );
                let mut out = vec![0u8; sub.len()];
                r.copy_to(sub.start, &mut out);
                assert_eq!(out, expected[sub]);
            }
            for at in [0, r.len() / 2, r.len().saturating_sub(4)] {
                if at + 4 <= r.len() {
                    assert_eq!(r.array::<4>(at)[..], expected[at..at + 4]);
                }
                assert_eq!(
                    r.array::<1>(at.min(r.len() - 1))[0],
                    expected[at.min(r.len() - 1)]
                );
            }
        }
    }

    #[test]
    fn a_missing_block_or_a_long_range_is_not_cached() {
        let file = FileId::next();
        let cache = cache_with_blocks(file, 4);
        let p = PAGE_SZ as u64;
        let before = cache.stats().file_pages.hits;
        // Block 4 is not cached.
        assert!(CachedRange::lookup(&cache, file, 3 * p..4 * p + 1, BlockKind::Value).is_none());
        // Four blocks are more than a range spans.
        assert!(CachedRange::lookup(&cache, file, 0..4 * p, BlockKind::Value).is_none());
        assert!(CachedRange::lookup(&cache, file, 7..7, BlockKind::Value).is_none());
        // Another file's blocks are not this one's.
        assert!(CachedRange::lookup(&cache, FileId::next(), 0..1, BlockKind::Value).is_none());
        assert_eq!(cache.stats().file_pages.hits, before, "nothing counted");
        let r = CachedRange::lookup(&cache, file, p - 1..p + 1, BlockKind::Value).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(cache.stats().file_pages.hits, before + 2, "a hit per block");
    }
}
