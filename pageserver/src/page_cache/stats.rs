//! Page cache counters.
//!
//! Hits and misses are counted on every lookup, from every thread; one shared atomic would make
//! all readers fight over one cache line and cost more than the lookup itself. They go to
//! striped counters instead: each thread adds to its own padded stripe and a read sums them.
//! Inserts and evictions already write to shared state, so plain atomics do there.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

const STRIPES: usize = 16;

#[repr(align(128))]
struct Stripe(AtomicU64);

/// A counter spread over cache lines so that concurrent increments do not contend.
pub(super) struct StripedCounter([Stripe; STRIPES]);

fn my_stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
    }
    STRIPE.with(|s| *s)
}

impl StripedCounter {
    fn new() -> Self {
        StripedCounter(std::array::from_fn(|_| Stripe(AtomicU64::new(0))))
    }

    #[inline]
    pub(super) fn inc(&self) {
        self.add(1);
    }

    #[inline]
    pub(super) fn add(&self, n: u64) {
        self.0[my_stripe()].0.fetch_add(n, Ordering::Relaxed);
    }

    pub(super) fn get(&self) -> u64 {
        self.0.iter().map(|s| s.0.load(Ordering::Relaxed)).sum()
    }
}

/// Live counters of one page kind.
pub(super) struct KindCounters {
    pub hits: StripedCounter,
    pub misses: StripedCounter,
    pub inserts: AtomicU64,
    pub evictions: AtomicU64,
    pub resident_pages: AtomicU64,
}

impl KindCounters {
    pub(super) fn new() -> Self {
        KindCounters {
            hits: StripedCounter::new(),
            misses: StripedCounter::new(),
            inserts: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            resident_pages: AtomicU64::new(0),
        }
    }

    pub(super) fn snapshot(&self, page_size: u64) -> KindStats {
        let hits = self.hits.get();
        let misses = self.misses.get();
        KindStats {
            accesses: hits + misses,
            hits,
            misses,
            inserts: self.inserts.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            bytes_resident: self.resident_pages.load(Ordering::Relaxed) * page_size,
        }
    }
}

/// Counters of one page kind, as of one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KindStats {
    /// Lookups (`hits + misses`).
    pub accesses: u64,
    pub hits: u64,
    pub misses: u64,
    /// Pages placed into the cache.
    pub inserts: u64,
    /// Pages removed to make room or on request.
    pub evictions: u64,
    pub bytes_resident: u64,
}

/// A snapshot of all page cache counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageCacheStats {
    pub capacity_bytes: u64,
    /// Immutable file pages: ephemeral file blocks and layer file value blocks.
    pub file_pages: KindStats,
    /// Layer index blocks (B-tree nodes), cached with priority up to their share.
    pub index_pages: KindStats,
    /// Materialized page versions.
    pub materialized_pages: KindStats,
    /// Inserts refused because every slot the clock hand looked at was pinned (the eviction
    /// effort cap was reached). The page was served without being cached.
    pub inserts_refused: u64,
    /// Blind inserts (pre-warm, memorize) of a page that was already cached.
    pub inserts_duplicate: u64,
    /// File block misses that waited for another reader's read of the same block instead of
    /// reading it again.
    pub miss_waits: u64,
    /// Slots referenced by a lease right now.
    pub pinned_pages: u64,
}
