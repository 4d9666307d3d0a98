//! The scan cursor cache: the state of paged key-range scans kept between pages, so the next
//! page resumes from its cursor's buffered version streams instead of seeking every layer
//! again.
//! The idea is Scylla's querier cache, fitted to layers.
//!
//! # Positions
//!
//! Each page but the last ends at a [`ScanPosition`]: the id of the cursor kept for the next
//! page, and everything needed to continue without it (the scan's tenant, timeline, LSN and end,
//! and the last key returned). The client holds it between pages; its wire form, the
//! `next_page_token`, is the HTTP API's (`http::routes::scan::token`). A position that comes
//! back may have been forged: a cursor is used only if it agrees with every field of the
//! position, so the most a forged cursor id can do is make another client's next page a miss
//! that re-seeks to the same answer.
//!
//! # Lookup, drops, eviction
//!
//! A lookup *removes* the cursor (one request uses it at a time), and a page that leaves keys
//! stores its cursor again under a new id, returned in the new position: an old position never
//! finds a cursor that has moved on. Outcomes, counted as Scylla counts them:
//!
//! * **miss**: no cursor under the id (never kept, evicted, or expired): the page re-seeks from
//!   the position's last key. Same answer, more index reads.
//! * **hit**: the cursor was found. It is a **drop** too if it cannot be used: it disagrees with
//!   the position, or its layer set is gone (a freeze or flush happened), and the page re-seeks.
//!   Hits minus drops are the pages that really resumed.
//!
//! Cursors leave the cache when idle for `scan_cursor_idle_timeout` (evicted as *expired*) or
//! when the cached cursors together pass `scan_cursor_cache_size` bytes (as *size*, least
//! recently stored first: the newest cursors are the ones about to be used). A cursor's weight
//! is [`ScanCursor::approximate_bytes`] plus the cache's own per-entry overhead. moka's LRU
//! policy is used rather than its default TinyLFU, because every cursor is stored once and
//! looked up once: a frequency sketch would only ever refuse the newcomers.
//!
//! A cursor holds no lease, lock, file or layer (see `timeline::scan`), so an idle one costs
//! memory only, and dropping one at any time is always safe.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use moka::notification::RemovalCause;
use moka::policy::EvictionPolicy;
use pageserver_api::Key;
use utils::{Lsn, TenantId, TimelineId};

use crate::tenant::timeline::scan::ScanCursor;
use crate::tenant::timeline::{Timeline, TimelineError};

/// What moka itself keeps per entry (key, timestamps, links), charged on top of the cursor.
const ENTRY_OVERHEAD: usize = 128;

/// Where a paged scan stands after a page; see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanPosition {
    /// The cursor kept for the next page (the cache key), random.
    pub cursor_id: u64,
    pub tenant_id: TenantId,
    pub timeline_id: TimelineId,
    /// The scan's LSN.
    pub lsn: Lsn,
    /// The scan's exclusive end key.
    pub end: Key,
    /// The last key returned: the scan continues after it.
    pub last: Key,
}

/// The cursor cache's settings.
#[derive(Debug, Clone, Copy)]
pub struct CursorCacheConfig {
    /// The most bytes the cached cursors may weigh together.
    pub capacity_bytes: u64,
    /// A cursor not used for this long is evicted.
    pub idle_timeout: Duration,
}

/// The counters, as `/metrics` reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CursorCacheStats {
    pub lookups: u64,
    pub hits: u64,
    pub misses: u64,
    pub drops: u64,
    pub inserts: u64,
    pub evictions_expired: u64,
    pub evictions_size: u64,
    /// Cursors held now.
    pub cursors: u64,
    /// What they weigh together.
    pub bytes: u64,
    pub capacity_bytes: u64,
}

#[derive(Default)]
struct Counters {
    lookups: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    drops: AtomicU64,
    inserts: AtomicU64,
    evictions_expired: AtomicU64,
    evictions_size: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// A kept cursor. moka hands out clones of its values, so the cursor itself sits behind a
/// lock that the lookup empties: exactly one request takes it.
struct CachedCursor {
    tenant_id: TenantId,
    timeline_id: TimelineId,
    cursor: Mutex<Option<ScanCursor>>,
    weight: u32,
    /// Set by the eviction listener when moka finds the cursor expired. A lookup can still
    /// remove an expired cursor that moka has not evicted yet; moka then reports the removal
    /// as an expiry, and the lookup, seeing this, counts a miss rather than use it.
    expired: AtomicBool,
}

/// Where a page starts.
#[derive(Debug, Clone, Copy)]
pub enum ScanFrom {
    /// The first page of a scan, from this key.
    Start(Key),
    /// A later page: after the position's last key, with its cursor if it is still cached.
    After(ScanPosition),
}

/// One page's request, already checked against the path (tenant, timeline) and itself.
#[derive(Debug, Clone, Copy)]
pub struct ScanRequest {
    pub lsn: Lsn,
    pub end: Key,
    pub from: ScanFrom,
    pub limit: usize,
}

/// One page's answer.
#[derive(Debug)]
pub struct ScanResult {
    pub entries: Vec<(Key, Bytes)>,
    /// Where the next page starts; `None` on the last page.
    pub next: Option<ScanPosition>,
}

/// See the module documentation.
pub struct CursorCache {
    cursors: moka::sync::Cache<u64, Arc<CachedCursor>>,
    counters: Arc<Counters>,
    capacity_bytes: u64,
}

impl CursorCache {
    pub fn new(config: CursorCacheConfig) -> CursorCache {
        let counters = Arc::new(Counters::default());
        let evicted = counters.clone();
        let cursors = moka::sync::Cache::builder()
            .max_capacity(config.capacity_bytes)
            .weigher(|_id: &u64, cached: &Arc<CachedCursor>| cached.weight)
            .time_to_idle(config.idle_timeout)
            .eviction_policy(EvictionPolicy::lru())
            .eviction_listener(move |_id, cached: Arc<CachedCursor>, cause| match cause {
                RemovalCause::Expired => {
                    cached.expired.store(true, Ordering::Release);
                    bump(&evicted.evictions_expired);
                }
                RemovalCause::Size => bump(&evicted.evictions_size),
                // Our own lookups, and (with random 64-bit ids, practically never) an id
                // stored twice.
                RemovalCause::Explicit | RemovalCause::Replaced => {}
            })
            .build();
        CursorCache {
            cursors,
            counters,
            capacity_bytes: config.capacity_bytes,
        }
    }

    /// The next page of a scan of `timeline`. `request.lsn` must be ingested (the caller waits
    /// for it as a point read does).
    pub fn page(
        &self,
        timeline: &Timeline,
        request: ScanRequest,
    ) -> Result<ScanResult, TimelineError> {
        let (mut cursor, found) = match request.from {
            ScanFrom::Start(start) => (ScanCursor::new(start, request.end, request.lsn), false),
            ScanFrom::After(position) => match self.take(&position) {
                Some(cursor) => (cursor, true),
                None => (
                    ScanCursor::after(position.last, position.end, position.lsn),
                    false,
                ),
            },
        };
        let page = timeline.scan_page(&mut cursor, request.limit)?;
        if found && !page.resumed {
            bump(&self.counters.drops);
        }
        let next = match (page.more, cursor.last()) {
            (true, Some(last)) => {
                let position = ScanPosition {
                    cursor_id: self.keep(timeline, cursor),
                    tenant_id: timeline.tenant_id(),
                    timeline_id: timeline.timeline_id(),
                    lsn: request.lsn,
                    end: request.end,
                    last,
                };
                Some(position)
            }
            _ => None,
        };
        Ok(ScanResult {
            entries: page.entries,
            next,
        })
    }

    /// Takes the cursor `position` names out of the cache, if it is there and agrees with the
    /// position. One that disagrees (only a forged position can find one) is dropped.
    fn take(&self, position: &ScanPosition) -> Option<ScanCursor> {
        bump(&self.counters.lookups);
        let found = self
            .cursors
            .remove(&position.cursor_id)
            .filter(|cached| !cached.expired.load(Ordering::Acquire))
            .and_then(|cached| {
                // Removal hands the entry to one caller, so the cursor is still inside.
                let cursor = cached
                    .cursor
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take()?;
                Some((cached, cursor))
            });
        let Some((cached, cursor)) = found else {
            bump(&self.counters.misses);
            return None;
        };
        bump(&self.counters.hits);
        let agrees = cached.tenant_id == position.tenant_id
            && cached.timeline_id == position.timeline_id
            && cursor.lsn() == position.lsn
            && cursor.end() == position.end
            && cursor.last() == Some(position.last);
        if !agrees {
            bump(&self.counters.drops);
            return None;
        }
        Some(cursor)
    }

    /// Stores `cursor` under a new id, which it returns.
    fn keep(&self, timeline: &Timeline, mut cursor: ScanCursor) -> u64 {
        cursor.compact();
        let weight = u32::try_from(cursor.approximate_bytes() + ENTRY_OVERHEAD).unwrap_or(u32::MAX);
        let id = fastrand::u64(..);
        self.cursors.insert(
            id,
            Arc::new(CachedCursor {
                tenant_id: timeline.tenant_id(),
                timeline_id: timeline.timeline_id(),
                cursor: Mutex::new(Some(cursor)),
                weight,
                expired: AtomicBool::new(false),
            }),
        );
        bump(&self.counters.inserts);
        id
    }

    /// The counters, after moka has done its pending evictions (it does them lazily, so an
    /// expired cursor is counted once something looks).
    pub fn stats(&self) -> CursorCacheStats {
        self.cursors.run_pending_tasks();
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CursorCacheStats {
            lookups: get(&c.lookups),
            hits: get(&c.hits),
            misses: get(&c.misses),
            drops: get(&c.drops),
            inserts: get(&c.inserts),
            evictions_expired: get(&c.evictions_expired),
            evictions_size: get(&c.evictions_size),
            cursors: self.cursors.entry_count(),
            bytes: self.cursors.weighted_size(),
            capacity_bytes: self.capacity_bytes,
        }
    }
}

#[cfg(test)]
mod tests;
