//! The shared, read-only page cache.
//!
//! One cache serves every tenant. It holds two kinds of page, both **immutable**:
//!
//! * **Immutable file pages**, keyed by `(FileId, block number)`: blocks of ephemeral files
//!   (pre-warmed as their mutable tail is written out) and of layer files (read through on a
//!   miss). Files are append-only or immutable, so a cached block can never go stale. A layer's
//!   index blocks are cached under a sibling id ([`FileId::index_blocks`]) and counted as their
//!   own kind: every point read walks them, so they get priority (below).
//! * **Materialized pages**, keyed by `(tenant, timeline, key, lsn)` and looked up as "the newest
//!   cached version at or below L" (see [`materialized`]). A hit is a base image: records newer
//!   than it must still be applied.
//!
//! Because nothing in the cache is ever dirty there is no write-back, no flushing on eviction and
//! no coherency protocol: evicting a page is forgetting it. The cache never writes a file.
//!
//! # Design
//!
//! The design follows RocksDB's HyperClockCache, cut down to fixed 8 KiB pages:
//!
//! * **Page memory is allocated once**: an arena of `capacity / PAGE_SZ` frames, 4 KiB aligned,
//!   one per slot. Inserting never allocates; a lease derefs straight into the arena.
//! * **Lookups take no lock.** The index (`page_cache_sync::index`) is an open-addressed table
//!   of atomic words; a lookup probes it and takes a reference with one `fetch_add` on the
//!   slot's metadata word (`page_cache_sync::slot`), then verifies the full 16-byte key.
//!   Dropping a [`PageLease`] is one more `fetch_add`. Hit and miss counters are striped per
//!   thread (`stats.rs`). The slot protocol, the index and the flight table are a crate of
//!   their own so that loom can model-check them (its `tests/loom.rs`).
//! * **Eviction is a counting CLOCK with probation.** Each slot carries a countdown of 0 to 7. A
//!   hit raises it; the clock hand lowers it and evicts the slot when it is already 0 and
//!   unreferenced. Pages read for the first time and scanned pages start on probation
//!   (`policy.rs`): while probation holds its share, evictions take its unhit pages first, so
//!   one-hit pages recycle among themselves and do not age the hot set. Where a page starts
//!   depends on how it arrived ([`Arrival`]); a pre-warmed ephemeral block survives a full turn
//!   of the hand, much longer than it takes to be read back.
//! * **Index priority, up to a share.** An index block read through starts warm and off
//!   probation while index blocks hold less than [`PageCacheConfig::index_share`] of the
//!   cache; beyond that share they arrive like value blocks. A hot index thus survives floods
//!   of one-hit value reads, but cannot crowd values out of the cache by priority alone.
//! * **Bounded eviction effort.** A referenced (pinned) slot is never evicted. When the clock hand
//!   keeps meeting pinned slots without making progress, the insert gives up with
//!   [`InsertError::AllPinned`] instead of spinning; the caller serves the page uncached.
//! * **Shared misses.** Readers that miss the same file block at the same time wait for one
//!   read of it instead of each issuing their own (`page_cache_sync::inflight`); the waits are
//!   counted. The read-through path is `read_through.rs`.
//!
//! # Invariants
//!
//! * A slot's key and bytes change only while one thread owns it exclusively (Construction), and
//!   it can only be claimed when no lease references it. So a lease sees the bytes of its own
//!   key for as long as it lives.
//! * Every Visible slot is linked in the index exactly once, under the hash of its key; a slot
//!   is linked and unlinked only by its owner.
//! * Keys are verified in full on every hit: hash collisions and stale index entries cost probe
//!   steps, never a wrong page.
//!
//! # Lock order
//!
//! The only locks are the materialized directory's shard locks and the in-flight table's shard
//! locks (held for a probe of a short list, never while reading or waiting). No slot is acquired
//! or claimed while one is held; an evicting thread that owns a slot may take a directory lock
//! to forget a version.

pub mod materialized;
mod policy;
mod read_through;
mod stats;
#[cfg(test)]
mod tests;

use std::cell::UnsafeCell;
use std::fmt;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use utils::Lsn;

use crate::PAGE_SZ;
pub use materialized::MaterializedPageKey;
use materialized::{Directory, MATERIALIZED_BIT};
use page_cache_sync::index::{self, Index};
use page_cache_sync::inflight::Flights;
use page_cache_sync::slot::{Slot, SlotKey, Sweep, MAX_COUNTDOWN};
use policy::{Ghosts, Probation};
pub use read_through::{BlockRead, Fetched, InFlightRead, ReadClaim, ReadThroughError};
use stats::KindCounters;
pub use stats::{KindStats, PageCacheStats};

/// Identifies one file for the page cache. Ids are never reused within a process, so the pages
/// of a deleted file can never be mistaken for another file's: they just age out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId(u64);

/// Marks the id under which a file's index blocks are cached (see [`FileId::index_blocks`]).
const INDEX_BIT: u64 = 1 << 62;

impl FileId {
    /// A new, process-unique id.
    pub fn next() -> FileId {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        // Ids count up from 1 and never reach the tag bits.
        FileId(NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// The id under which this file's index blocks (B-tree nodes) are cached. They are counted
    /// apart from other file blocks and get the index pages' priority (see
    /// [`PageCacheConfig::index_share`]). A block is read either as an index block or as another
    /// block, never both.
    pub fn index_blocks(self) -> FileId {
        FileId(self.0 | INDEX_BIT)
    }

    fn is_index(self) -> bool {
        self.0 & INDEX_BIT != 0
    }

    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FileId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_index() {
            write!(f, "{}/index", self.0 & !INDEX_BIT)
        } else {
            write!(f, "{}", self.0)
        }
    }
}

/// How a page came to be inserted. It decides where the page starts in the eviction order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// A reader missed and read the page from disk. The first time, the page starts on
    /// probation (see `policy.rs`); asked for again soon after it was evicted from probation,
    /// it starts warm.
    ReadThrough,
    /// Written into the cache as its file was written (an ephemeral file's tail going to disk),
    /// before anyone asked for it. It takes the slot right behind the clock hand, so it survives
    /// a full turn of the hand and is still there when it is read back.
    PreWarm,
    /// Read as part of a bulk scan: starts on probation, cold, so a scan recycles its own slots.
    Scan,
}

/// Where a new page starts: its CLOCK countdown, and whether it is on probation.
#[derive(Clone, Copy)]
struct Placement {
    countdown: u64,
    probation: bool,
}

/// Page cache settings.
#[derive(Clone, Debug)]
pub struct PageCacheConfig {
    /// Bytes of page memory; rounded down to whole pages.
    pub capacity_bytes: u64,
    /// How many pinned slots an insert may meet per slot of progress before it gives up.
    pub eviction_effort_cap: u32,
    /// Cached versions remembered per materialized page key (at most 8); 0 turns materialized
    /// caching off.
    pub materialized_versions_per_key: usize,
    /// The share of the cache (0.0 to 1.0) that index blocks may hold at their priority: while
    /// fewer are cached, a newly read index block skips probation and starts warm, so one
    /// pass of one-hit value blocks cannot push the index out. Beyond the share, index blocks
    /// arrive like value blocks and compete with them on equal terms.
    pub index_share: f64,
    /// Test mode: keep only this many bits of every hash, forcing collisions.
    pub degenerate_hash_bits: Option<u32>,
}

impl Default for PageCacheConfig {
    fn default() -> Self {
        PageCacheConfig {
            capacity_bytes: 64 * 1024 * 1024,
            eviction_effort_cap: 30,
            materialized_versions_per_key: 4,
            index_share: DEFAULT_INDEX_SHARE,
            degenerate_hash_bits: None,
        }
    }
}

/// The default [`PageCacheConfig::index_share`]. A delta layer's index is well under 1 % of its
/// size, so a quarter of the cache holds the index of a hundred times more layer data than the
/// cache itself, with room left for values.
pub const DEFAULT_INDEX_SHARE: f64 = 0.25;

/// Where an index block starts while index blocks are within their share: warm, off probation.
/// Three sweeps of the clock hand without a hit, where a value block read once gets none.
const INDEX_COUNTDOWN: u64 = 3;

/// The cache needs at least this many pages to be useful.
pub const MIN_PAGES: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum PageCacheConfigError {
    #[error("page cache size {bytes} bytes is too small: it must hold at least {MIN_PAGES} pages of {PAGE_SZ} bytes")]
    TooSmall { bytes: u64 },
    #[error("page cache size {bytes} bytes is too large: at most {max_pages} pages of {PAGE_SZ} bytes are supported")]
    TooLarge { bytes: u64, max_pages: usize },
    #[error("page cache index share {share} is not a fraction between 0.0 and 1.0")]
    IndexShare { share: f64 },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InsertError {
    #[error("page cache has no evictable slot: {pinned_seen} pinned slots met before giving up")]
    AllPinned { pinned_seen: u32 },
    #[error("page cache found no free slot within its bound on clock steps (slots are busy)")]
    NoSlot,
}

/// A slot this thread claimed; returned to Empty on drop unless it was published, so a failing
/// or panicking fill never loses the slot.
struct OwnedSlot<'a> {
    slot: &'a Slot,
    published: bool,
}

impl Drop for OwnedSlot<'_> {
    fn drop(&mut self) {
        if !self.published {
            self.slot.vacate();
        }
    }
}

/// What [`PageCache::drop_unpinned`] evicted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DroppedPages {
    pub file_pages: u64,
    pub index_pages: u64,
    pub materialized_pages: u64,
}

#[repr(C, align(4096))]
struct Frame(UnsafeCell<[u8; PAGE_SZ]>);

/// See the module documentation.
pub struct PageCache {
    slots: Box<[Slot]>,
    frames: Box<[Frame]>,
    index: Index,
    /// Slots below this have been handed out once; the rest are claimed without sweeping.
    never_used: AtomicUsize,
    clock_hand: AtomicU64,
    eviction_effort_cap: u32,
    /// `u64::MAX` normally; fewer bits in the collision test mode.
    hash_mask: u64,
    directory: Directory,
    probation: Probation,
    ghosts: Ghosts,
    file_counters: KindCounters,
    index_counters: KindCounters,
    /// Index blocks may take the index priority while fewer than this many are resident.
    index_priority_pages: u64,
    materialized_counters: KindCounters,
    inserts_refused: AtomicU64,
    inserts_duplicate: AtomicU64,
    /// File blocks being read into the cache right now (`page_cache_sync::inflight`).
    flights: Flights,
    miss_waits: AtomicU64,
}

// SAFETY: a frame is written only by the thread that owns its slot in Construction and read only
// through leases, which exist only while the slot is Visible and referenced (see
// `page_cache_sync::slot`).
unsafe impl Sync for PageCache {}

/// A pinned, read-only view of one cached page. The page cannot be evicted or changed while the
/// lease lives. Dropping it is one atomic add.
///
/// Two words on purpose: a reference and a `u32` come back from a lookup in registers, and a
/// hit is measurably slower when the lease has to go through memory.
pub struct PageLease<'c> {
    cache: &'c PageCache,
    /// The slot number, with [`LEASE_NOT_A_HIT`] set on the lease handed to the reader whose
    /// miss inserted the page.
    slot_and_flag: u32,
}

/// Slot numbers fit in 24 bits (`index::MAX_SLOTS`), leaving the top bit for this flag.
const LEASE_NOT_A_HIT: u32 = 1 << 31;

impl PageLease<'_> {
    #[inline]
    fn slot(&self) -> usize {
        (self.slot_and_flag & !LEASE_NOT_A_HIT) as usize
    }
}

impl Deref for PageLease<'_> {
    type Target = [u8; PAGE_SZ];

    #[inline]
    fn deref(&self) -> &[u8; PAGE_SZ] {
        // SAFETY: the lease holds a reference on the slot, so nobody writes the frame.
        unsafe { &*self.cache.frames[self.slot()].0.get() }
    }
}

impl Drop for PageLease<'_> {
    #[inline]
    fn drop(&mut self) {
        let slot = &self.cache.slots[self.slot()];
        if self.slot_and_flag & LEASE_NOT_A_HIT == 0 {
            slot.release();
        } else {
            slot.release_unhit();
        }
    }
}

impl fmt::Debug for PageLease<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PageLease")
            .field("slot", &self.slot())
            .finish()
    }
}

fn file_key(file: FileId, blkno: u32) -> SlotKey {
    SlotKey {
        hi: file.0,
        lo: u64::from(blkno),
    }
}

fn materialized_key(directory_id: u64, lsn: Lsn) -> SlotKey {
    SlotKey {
        hi: MATERIALIZED_BIT | directory_id,
        lo: lsn.0,
    }
}

/// A strong 64-bit mixer (the splitmix64 finalizer): every input bit affects every output bit,
/// which the index needs because it takes its start, step and tag from different bit ranges.
#[inline]
fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl PageCache {
    pub fn new(config: PageCacheConfig) -> Result<PageCache, PageCacheConfigError> {
        let bytes = config.capacity_bytes;
        let pages = usize::try_from(bytes / PAGE_SZ as u64).unwrap_or(usize::MAX);
        if pages < MIN_PAGES {
            return Err(PageCacheConfigError::TooSmall { bytes });
        }
        if pages > index::MAX_SLOTS {
            return Err(PageCacheConfigError::TooLarge {
                bytes,
                max_pages: index::MAX_SLOTS,
            });
        }
        let share = config.index_share;
        if !(0.0..=1.0).contains(&share) {
            return Err(PageCacheConfigError::IndexShare { share });
        }
        // SAFETY: a frame is a byte array in an UnsafeCell, for which all zeroes is valid.
        let frames = unsafe { Box::<[Frame]>::new_zeroed_slice(pages).assume_init() };
        let hash_mask = match config.degenerate_hash_bits {
            Some(bits) if bits < 64 => (1u64 << bits) - 1,
            _ => u64::MAX,
        };
        Ok(PageCache {
            slots: (0..pages).map(|_| Slot::new()).collect(),
            frames,
            index: Index::with_slots(pages),
            never_used: AtomicUsize::new(0),
            clock_hand: AtomicU64::new(0),
            eviction_effort_cap: config.eviction_effort_cap.max(1),
            hash_mask,
            directory: Directory::new(config.materialized_versions_per_key),
            probation: Probation::new(pages),
            ghosts: Ghosts::new(pages),
            file_counters: KindCounters::new(),
            index_counters: KindCounters::new(),
            index_priority_pages: (pages as f64 * share) as u64,
            materialized_counters: KindCounters::new(),
            inserts_refused: AtomicU64::new(0),
            inserts_duplicate: AtomicU64::new(0),
            flights: Flights::new(),
            miss_waits: AtomicU64::new(0),
        })
    }

    pub fn capacity_pages(&self) -> usize {
        self.slots.len()
    }

    /// Bytes of bookkeeping the cache keeps besides page memory and the materialized version
    /// directory: slots, index, probation FIFO and ghost table.
    pub fn metadata_bytes(&self) -> usize {
        std::mem::size_of_val(&*self.slots)
            + (self.index.entry_count() + self.probation.len()) * std::mem::size_of::<u64>()
            + self.ghosts.len() * std::mem::size_of::<u32>()
    }

    fn placement(&self, key: SlotKey, arrival: Arrival, hash: u64) -> Placement {
        let index_block = key.hi & (MATERIALIZED_BIT | INDEX_BIT) == INDEX_BIT;
        if index_block
            && arrival == Arrival::ReadThrough
            && self.index_counters.resident_pages.load(Ordering::Relaxed)
                < self.index_priority_pages
        {
            return Placement {
                countdown: INDEX_COUNTDOWN,
                probation: false,
            };
        }
        match arrival {
            Arrival::ReadThrough if self.ghosts.contains(hash) => Placement {
                countdown: 1,
                probation: false,
            },
            Arrival::ReadThrough | Arrival::Scan => Placement {
                countdown: 0,
                probation: true,
            },
            Arrival::PreWarm => Placement {
                countdown: 0,
                probation: false,
            },
        }
    }

    #[inline]
    fn hash(&self, key: SlotKey) -> u64 {
        let h = mix(key.hi ^ mix(key.lo));
        if self.hash_mask == u64::MAX {
            h
        } else {
            mix(h & self.hash_mask)
        }
    }

    #[inline]
    fn lookup(&self, key: SlotKey) -> Option<PageLease<'_>> {
        let slot = self.index.find(self.hash(key), |slot| {
            self.slots[slot as usize].try_acquire(key)
        })?;
        Some(PageLease {
            cache: self,
            slot_and_flag: slot,
        })
    }

    /// Block `blkno` of `file`, if cached, without counting a hit or a miss: for a reader that
    /// looks before it reads (the read that follows is counted).
    #[inline]
    pub fn peek_file_page(&self, file: FileId, blkno: u32) -> Option<PageLease<'_>> {
        self.lookup(file_key(file, blkno))
    }

    /// Counts `blocks` hits on blocks of `file` that a reader found with
    /// [`Self::peek_file_page`] and then read.
    #[inline]
    pub(crate) fn count_file_hits(&self, file: FileId, blocks: usize) {
        self.file_kind_counters(file).hits.add(blocks as u64);
    }

    /// Block `blkno` of `file`, if cached.
    #[inline]
    pub fn get_file_page(&self, file: FileId, blkno: u32) -> Option<PageLease<'_>> {
        let lease = self.lookup(file_key(file, blkno));
        let counters = self.file_kind_counters(file);
        match lease {
            Some(_) => counters.hits.inc(),
            None => counters.misses.inc(),
        }
        lease
    }

    /// Caches a copy of block `blkno` of `file` (pre-warm). A block that is already cached is
    /// left as it is: file pages are immutable, so both copies are the same.
    pub fn insert_file_page(
        &self,
        file: FileId,
        blkno: u32,
        page: &[u8; PAGE_SZ],
        arrival: Arrival,
    ) -> Result<(), InsertError> {
        let counters = self.file_kind_counters(file);
        self.insert_copy(file_key(file, blkno), counters, arrival, page)
    }

    fn file_kind_counters(&self, file: FileId) -> &KindCounters {
        if file.is_index() {
            &self.index_counters
        } else {
            &self.file_counters
        }
    }

    /// The newest cached version of `key` at or below `lsn`, with its LSN. Records between that
    /// LSN and `lsn` still have to be applied to it.
    pub fn lookup_materialized(
        &self,
        key: &MaterializedPageKey,
        lsn: Lsn,
    ) -> Option<(Lsn, PageLease<'_>)> {
        if !self.directory.enabled() {
            return None;
        }
        let found = self.directory.candidates(key, lsn).and_then(|candidates| {
            candidates.newest_first().iter().find_map(|&version| {
                self.lookup(materialized_key(candidates.id, version))
                    .map(|lease| (version, lease))
            })
        });
        match found {
            Some(_) => self.materialized_counters.hits.inc(),
            None => self.materialized_counters.misses.inc(),
        }
        found
    }

    /// Caches version `lsn` of `key`, a page reconstructed at exactly that LSN. A version older
    /// than the `materialized_versions_per_key` newest already cached is not kept.
    pub fn memorize_materialized(
        &self,
        key: &MaterializedPageKey,
        lsn: Lsn,
        page: &[u8; PAGE_SZ],
    ) -> Result<(), InsertError> {
        if !self.directory.enabled() {
            return Ok(());
        }
        let Some(id) = self.directory.remember(key, lsn) else {
            return Ok(());
        };
        let inserted = self.insert_copy(
            materialized_key(id, lsn),
            &self.materialized_counters,
            Arrival::ReadThrough,
            page,
        );
        if inserted.is_err() {
            self.directory.forget(id, lsn);
        }
        inserted
    }

    /// A blind insert of a copy of `page`.
    fn insert_copy(
        &self,
        key: SlotKey,
        counters: &KindCounters,
        arrival: Arrival,
        page: &[u8; PAGE_SZ],
    ) -> Result<(), InsertError> {
        let copy = |frame: &mut [u8; PAGE_SZ]| {
            frame.copy_from_slice(page);
            Ok::<(), std::convert::Infallible>(())
        };
        match self.insert_with(key, counters, arrival, false, copy) {
            Ok(_) => Ok(()),
            Err(ReadThroughError::NoFreeSlot(e)) => Err(e),
            Err(ReadThroughError::Fill(never)) => match never {},
        }
    }

    /// Claims a slot, fills it, links and publishes it. Hands out a lease if `with_lease`.
    /// A blind insert (`with_lease == false`) first checks that the page is not cached yet; a
    /// read-through has just missed, so it skips the second probe and accepts the rare
    /// duplicate of a concurrent miss (both copies hold the same immutable bytes).
    fn insert_with<E>(
        &self,
        key: SlotKey,
        counters: &KindCounters,
        arrival: Arrival,
        with_lease: bool,
        fill: impl FnOnce(&mut [u8; PAGE_SZ]) -> Result<(), E>,
    ) -> Result<Option<PageLease<'_>>, ReadThroughError<E>> {
        if !with_lease {
            if let Some(mut existing) = self.lookup(key) {
                // Seeing the page again through an insert is not a read: no hit.
                existing.slot_and_flag |= LEASE_NOT_A_HIT;
                self.inserts_duplicate.fetch_add(1, Ordering::Relaxed);
                return Ok(None);
            }
        }
        // A pre-warmed block must outlive a full turn of the clock hand, so it takes the
        // hand's victim (the slot right behind the hand), never a probation victim that may
        // sit just ahead of it.
        let slot = self.claim_slot(arrival != Arrival::PreWarm).map_err(|e| {
            self.inserts_refused.fetch_add(1, Ordering::Relaxed);
            ReadThroughError::NoFreeSlot(e)
        })?;
        let mut owned = OwnedSlot {
            slot: &self.slots[slot as usize],
            published: false,
        };
        // SAFETY: we own the slot (Construction), so nobody else reads or writes its frame.
        let frame = unsafe { &mut *self.frames[slot as usize].0.get() };
        // If `fill` fails or panics, `owned` returns the slot to Empty.
        fill(frame).map_err(ReadThroughError::Fill)?;
        // SAFETY: we own the slot.
        unsafe { owned.slot.set_key(key) };
        let hash = self.hash(key);
        if self.index.link(hash, slot).is_err() {
            // Cannot happen: the index has more entries than there are slots.
            self.inserts_refused.fetch_add(1, Ordering::Relaxed);
            return Err(ReadThroughError::NoFreeSlot(InsertError::NoSlot));
        }
        // Placed by the residents before it: an index block's priority depends on their count.
        let placement = self.placement(key, arrival, hash);
        // Counted before publishing: once Visible, the page may be evicted (and uncounted) at once.
        counters.inserts.fetch_add(1, Ordering::Relaxed);
        counters.resident_pages.fetch_add(1, Ordering::Relaxed);
        let generation = owned.slot.publish(placement.countdown, with_lease);
        owned.published = true;
        if placement.probation {
            self.probation.push(slot, generation);
        }
        // Not `then_some`: building a lease we do not hand out would release a reference.
        Ok(with_lease.then(|| PageLease {
            cache: self,
            slot_and_flag: slot | LEASE_NOT_A_HIT,
        }))
    }

    /// Finds a slot to fill: a never-used one while any are left, else (if `from_probation`) a
    /// page on probation that was not hit, else the CLOCK victim.
    fn claim_slot(&self, from_probation: bool) -> Result<u32, InsertError> {
        let capacity = self.slots.len();
        if self.never_used.load(Ordering::Relaxed) < capacity {
            let fresh = self.never_used.fetch_add(1, Ordering::Relaxed);
            if fresh < capacity && self.slots[fresh].claim_fresh() {
                // `capacity` is at most index::MAX_SLOTS, which fits in u32.
                return Ok(fresh as u32);
            }
        }
        if from_probation && self.probation.is_full() {
            if let Some(slot) = self.claim_from_probation() {
                return Ok(slot);
            }
        }
        // Each unpinned slot reaches countdown 0 within MAX_COUNTDOWN turns of the hand, so this
        // many steps find a victim unless nearly everything is pinned or contended.
        let max_steps = (capacity as u64) * (MAX_COUNTDOWN + 2);
        let mut pinned_seen: u32 = 0;
        let mut progress: u32 = 0;
        for _ in 0..max_steps {
            // One slot per step keeps the sweep fair between threads; on a few cores the
            // shared hand costs less than the skew of claiming batches.
            let hand = self.clock_hand.fetch_add(1, Ordering::Relaxed);
            let idx = (hand % capacity as u64) as usize;
            match self.slots[idx].sweep(true) {
                Sweep::Claimed { previous } => {
                    if let Some(previous) = previous {
                        self.forget_evicted(idx as u32, previous);
                    }
                    return Ok(idx as u32);
                }
                Sweep::Pinned => {
                    pinned_seen += 1;
                    let allowed = self
                        .eviction_effort_cap
                        .saturating_mul(progress.saturating_add(1));
                    if pinned_seen >= allowed {
                        return Err(InsertError::AllPinned { pinned_seen });
                    }
                }
                Sweep::Cooled => progress = progress.saturating_add(1),
                Sweep::Warm | Sweep::Busy => {}
            }
        }
        Err(InsertError::NoSlot)
    }

    /// Evicts the oldest page on probation that was not hit since it arrived. Pages that were
    /// hit leave probation and stay. Looks at a bounded number of entries.
    fn claim_from_probation(&self) -> Option<u32> {
        const MAX_ENTRIES: usize = 16;
        for _ in 0..MAX_ENTRIES {
            let (slot, generation) = self.probation.pop()?;
            let owned = &self.slots[slot as usize];
            if owned.generation() & 0x7FFF_FFFF != generation {
                continue; // reused since it was put on probation
            }
            if let Sweep::Claimed { previous } = owned.sweep(false) {
                if let Some(previous) = previous {
                    self.forget_evicted(slot, previous);
                    self.ghosts.remember(self.hash(previous));
                }
                return Some(slot);
            }
        }
        None
    }

    /// Bookkeeping for a page whose slot we just claimed from it.
    fn forget_evicted(&self, slot: u32, previous: SlotKey) {
        let hash = self.hash(previous);
        let linked = self.index.unlink(hash, slot);
        debug_assert!(linked, "a visible slot is always linked");
        let counters = if previous.hi & MATERIALIZED_BIT != 0 {
            self.directory
                .forget(previous.hi & !MATERIALIZED_BIT, Lsn(previous.lo));
            &self.materialized_counters
        } else if previous.hi & INDEX_BIT != 0 {
            &self.index_counters
        } else {
            &self.file_counters
        };
        counters.evictions.fetch_add(1, Ordering::Relaxed);
        counters.resident_pages.fetch_sub(1, Ordering::Relaxed);
    }

    /// Evicts every page that no lease pins; pinned pages stay.
    pub fn drop_unpinned(&self) -> DroppedPages {
        let mut dropped = DroppedPages::default();
        for (idx, slot) in self.slots.iter().enumerate() {
            if let Some(previous) = slot.claim_if_unreferenced() {
                self.forget_evicted(idx as u32, previous);
                slot.vacate();
                if previous.hi & MATERIALIZED_BIT != 0 {
                    dropped.materialized_pages += 1;
                } else if previous.hi & INDEX_BIT != 0 {
                    dropped.index_pages += 1;
                } else {
                    dropped.file_pages += 1;
                }
            }
        }
        dropped
    }

    pub fn stats(&self) -> PageCacheStats {
        let page = PAGE_SZ as u64;
        PageCacheStats {
            capacity_bytes: self.slots.len() as u64 * page,
            file_pages: self.file_counters.snapshot(page),
            index_pages: self.index_counters.snapshot(page),
            materialized_pages: self.materialized_counters.snapshot(page),
            inserts_refused: self.inserts_refused.load(Ordering::Relaxed),
            inserts_duplicate: self.inserts_duplicate.load(Ordering::Relaxed),
            miss_waits: self.miss_waits.load(Ordering::Relaxed),
            pinned_pages: self.slots.iter().filter(|s| s.is_pinned()).count() as u64,
        }
    }
}
