//! Reading file pages through the cache on a miss, with concurrent misses of one block
//! sharing one read.
//!
//! A miss boards a flight in the in-flight table (`page_cache_sync::inflight`): the first
//! reader leads, reads the block straight into a claimed frame and publishes it; readers that
//! miss the same block meanwhile follow, wait for the flight to land, and look the block up
//! again. A leader's [`Landing`] ends its flight when dropped, whether the read succeeded,
//! failed or panicked, so a follower never waits for a read that will not land; a follower
//! that finds no page after the landing reads the block unshared. When the flight table is
//! full the reader reads unshared from the start.
//!
//! Two shapes: [`PageCache::read_file_page`] for a reader of one block, which hands the cache a
//! `fill` function; and [`PageCache::begin_file_read`] for a reader that fetches several blocks
//! with one I/O, which claims the blocks it will read ([`ReadClaim`]) and lands each itself.

use std::sync::atomic::Ordering;

use page_cache_sync::inflight::{Boarding, Ticket};
use page_cache_sync::slot::SlotKey;

use super::stats::KindCounters;
use super::{file_key, Arrival, FileId, InsertError, PageCache, PageLease};
use crate::PAGE_SZ;

/// Why [`PageCache::read_file_page`] returned no lease.
#[derive(Debug)]
pub enum ReadThroughError<E> {
    /// The fill function failed; nothing was cached.
    Fill(E),
    /// Every slot the clock hand met was pinned; the caller should read the page into a buffer of
    /// its own.
    NoFreeSlot(InsertError),
}

/// How [`PageCache::read_file_page_traced`] found a page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fetched {
    /// It was cached.
    Hit,
    /// This reader's `fill` read it.
    Filled,
    /// Another reader was reading it; this one waited for that read and did no I/O.
    Waited,
}

/// See [`PageCache::begin_file_read`].
pub enum BlockRead<'c> {
    Cached(PageLease<'c>),
    /// Nobody is reading the block: the caller reads it and lands it with
    /// [`ReadClaim::land`]. Other readers of the block wait until the claim is landed or
    /// dropped.
    Claimed(ReadClaim<'c>),
    /// Another reader is reading the block.
    InFlight(InFlightRead<'c>),
}

/// Ends a flight this thread leads when dropped: after its page was published, or when the
/// read failed or panicked.
struct Landing<'c> {
    cache: &'c PageCache,
    key: SlotKey,
    hash: u64,
    ticket: Ticket,
}

impl Drop for Landing<'_> {
    fn drop(&mut self) {
        self.cache.flights.land(self.key, self.hash, self.ticket);
    }
}

/// The right and duty to read one block into the cache; see [`BlockRead::Claimed`].
pub struct ReadClaim<'c> {
    cache: &'c PageCache,
    key: SlotKey,
    counters: &'c KindCounters,
    /// `None` when the in-flight table was full: nobody waits for this read.
    _landing: Option<Landing<'c>>,
}

impl ReadClaim<'_> {
    /// Caches `page` (the block's bytes, read by the caller) and wakes the readers waiting for
    /// it. A full cache only means they read the block themselves.
    pub fn land(self, page: &[u8; PAGE_SZ], arrival: Arrival) -> Result<(), InsertError> {
        self.cache
            .insert_copy(self.key, self.counters, arrival, page)
    }
}

/// Another reader's read of a block; see [`BlockRead::InFlight`].
pub struct InFlightRead<'c> {
    cache: &'c PageCache,
    key: SlotKey,
    hash: u64,
    ticket: Ticket,
}

impl<'c> InFlightRead<'c> {
    /// Waits for the read to land; `None` if the block did not make it into the cache (the
    /// caller reads it itself).
    pub fn wait(self) -> Option<PageLease<'c>> {
        self.cache.wait_for(self.key, self.hash, self.ticket)
    }
}

impl PageCache {
    /// Block `blkno` of `file`, from the cache or else read by `fill` straight into a cache
    /// frame. On [`ReadThroughError::NoFreeSlot`] `fill` was not called.
    ///
    /// The frame handed to `fill` still holds the bytes of the page it held before (another
    /// file's, or another tenant's): `fill` must overwrite all of it or fail. Whatever is in
    /// the frame when `fill` returns `Ok` is published as block `blkno`.
    ///
    /// Concurrent misses of one block share one `fill` (see `page_cache_sync::inflight`).
    pub fn read_file_page<E>(
        &self,
        file: FileId,
        blkno: u32,
        arrival: Arrival,
        fill: impl FnOnce(&mut [u8; PAGE_SZ]) -> Result<(), E>,
    ) -> Result<PageLease<'_>, ReadThroughError<E>> {
        self.read_file_page_traced(file, blkno, arrival, fill)
            .map(|(lease, _)| lease)
    }

    /// [`Self::read_file_page`], also telling how the page was found.
    pub fn read_file_page_traced<E>(
        &self,
        file: FileId,
        blkno: u32,
        arrival: Arrival,
        fill: impl FnOnce(&mut [u8; PAGE_SZ]) -> Result<(), E>,
    ) -> Result<(PageLease<'_>, Fetched), ReadThroughError<E>> {
        if let Some(lease) = self.get_file_page(file, blkno) {
            return Ok((lease, Fetched::Hit));
        }
        let key = file_key(file, blkno);
        let hash = self.hash(key);
        let _landing = match self.flights.board(key, hash) {
            Boarding::Follow(ticket) => {
                if let Some(lease) = self.wait_for(key, hash, ticket) {
                    return Ok((lease, Fetched::Waited));
                }
                // The leader's read failed or its page is already gone: read it unshared.
                None
            }
            Boarding::Lead(ticket) => {
                let landing = Landing {
                    cache: self,
                    key,
                    hash,
                    ticket,
                };
                // It may have landed between the miss and boarding.
                if let Some(lease) = self.lookup(key) {
                    return Ok((lease, Fetched::Hit));
                }
                Some(landing)
            }
            Boarding::Unshared => None,
        };
        let counters = self.file_kind_counters(file);
        let lease = self.insert_with(key, counters, arrival, true, fill)?;
        let lease = lease.expect("insert_with hands out a lease when asked");
        Ok((lease, Fetched::Filled))
    }

    /// Starts reading block `blkno` of `file` for a reader that fetches several blocks with one
    /// I/O: the cached page, or the claim to read it, or another reader's read to wait for.
    /// A claim must be landed (or dropped) before the caller waits for any flight.
    pub fn begin_file_read(&self, file: FileId, blkno: u32) -> BlockRead<'_> {
        if let Some(lease) = self.get_file_page(file, blkno) {
            return BlockRead::Cached(lease);
        }
        let key = file_key(file, blkno);
        let hash = self.hash(key);
        let ticket = match self.flights.board(key, hash) {
            Boarding::Follow(ticket) => {
                return BlockRead::InFlight(InFlightRead {
                    cache: self,
                    key,
                    hash,
                    ticket,
                })
            }
            Boarding::Lead(ticket) => Some(ticket),
            Boarding::Unshared => None,
        };
        let landing = ticket.map(|ticket| Landing {
            cache: self,
            key,
            hash,
            ticket,
        });
        match self.lookup(key) {
            Some(lease) => BlockRead::Cached(lease),
            None => BlockRead::Claimed(ReadClaim {
                cache: self,
                key,
                counters: self.file_kind_counters(file),
                _landing: landing,
            }),
        }
    }

    /// Waits for flight `ticket` of `key` to land and takes its page, if it is cached.
    fn wait_for(&self, key: SlotKey, hash: u64, ticket: Ticket) -> Option<PageLease<'_>> {
        // Counted before waiting, so the wait can be seen while it lasts.
        self.miss_waits.fetch_add(1, Ordering::Relaxed);
        self.flights.wait(key, hash, ticket);
        self.lookup(key)
    }
}
