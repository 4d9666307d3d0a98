//! The page cache's and the scan cursor cache's counters, read from their stats at every
//! scrape (the same numbers as `GET /v1/page_cache`): [`PageCacheCollector`],
//! [`CursorCacheCollector`].

use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;

use super::family::Family;
use crate::http::SharedState;
use crate::page_cache::{KindStats, PageCache};

/// The page cache's kinds of page, as the `kind` label names them.
fn kinds(stats: &crate::page_cache::PageCacheStats) -> [(&'static str, &KindStats); 3] {
    [
        ("file", &stats.file_pages),
        ("index", &stats.index_pages),
        ("materialized", &stats.materialized_pages),
    ]
}

/// A family with a series per kind of page, and the field of [`KindStats`] it reports.
type PerKind = (Family, fn(&KindStats) -> u64);

/// The `pageserver_page_cache_*` families.
pub struct PageCacheCollector {
    cache: Arc<PageCache>,
    per_kind: [PerKind; 5],
    capacity_bytes: Family,
    pinned_pages: Family,
    inserts_refused: Family,
    inserts_duplicate: Family,
    miss_waits: Family,
}

impl PageCacheCollector {
    pub fn new(cache: Arc<PageCache>) -> PageCacheCollector {
        let kind = &["kind"];
        PageCacheCollector {
            cache,
            per_kind: [
                (
                    Family::counter(
                        "pageserver_page_cache_hits_total",
                        "Lookups that found their page",
                        kind,
                    ),
                    |k| k.hits,
                ),
                (
                    Family::counter(
                        "pageserver_page_cache_misses_total",
                        "Lookups that did not find their page",
                        kind,
                    ),
                    |k| k.misses,
                ),
                (
                    Family::counter(
                        "pageserver_page_cache_inserts_total",
                        "Pages inserted",
                        kind,
                    ),
                    |k| k.inserts,
                ),
                (
                    Family::counter(
                        "pageserver_page_cache_evictions_total",
                        "Pages evicted",
                        kind,
                    ),
                    |k| k.evictions,
                ),
                (
                    Family::gauge(
                        "pageserver_page_cache_resident_bytes",
                        "Bytes of pages resident",
                        kind,
                    ),
                    |k| k.bytes_resident,
                ),
            ],
            capacity_bytes: Family::gauge(
                "pageserver_page_cache_capacity_bytes",
                "Bytes of page memory",
                &[],
            ),
            pinned_pages: Family::gauge(
                "pageserver_page_cache_pinned_pages",
                "Pages pinned by a lease right now",
                &[],
            ),
            inserts_refused: Family::counter(
                "pageserver_page_cache_inserts_refused_total",
                "Inserts refused for lack of an evictable slot",
                &[],
            ),
            inserts_duplicate: Family::counter(
                "pageserver_page_cache_inserts_duplicate_total",
                "Inserts of a page already cached",
                &[],
            ),
            miss_waits: Family::counter(
                "pageserver_page_cache_miss_waits_total",
                "File block misses that waited for another reader's read of the block",
                &[],
            ),
        }
    }
}

impl Collector for PageCacheCollector {
    fn desc(&self) -> Vec<&Desc> {
        let per_kind = self.per_kind.iter().map(|(family, _)| family.desc());
        let totals = [
            &self.capacity_bytes,
            &self.pinned_pages,
            &self.inserts_refused,
            &self.inserts_duplicate,
            &self.miss_waits,
        ];
        per_kind.chain(totals.map(Family::desc)).collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let stats = self.cache.stats();
        let mut families = Vec::with_capacity(self.per_kind.len() + 5);
        for (family, field) in &self.per_kind {
            let mut samples = family.fill(3);
            for (kind, kind_stats) in kinds(&stats) {
                samples.add(&[kind], field(kind_stats) as f64);
            }
            families.push(samples.done());
        }
        families.extend([
            self.capacity_bytes.single(stats.capacity_bytes as f64),
            self.pinned_pages.single(stats.pinned_pages as f64),
            self.inserts_refused.single(stats.inserts_refused as f64),
            self.inserts_duplicate
                .single(stats.inserts_duplicate as f64),
            self.miss_waits.single(stats.miss_waits as f64),
        ]);
        families
    }
}

/// The `pageserver_scan_cursor_cache_*` families. Reading the stats first lets the cache
/// evict what has expired, so the gauges and the eviction counts are current.
pub struct CursorCacheCollector {
    /// The cursor cache lives in the state itself, not behind an `Arc` of its own.
    state: SharedState,
    lookups: Family,
    hits: Family,
    misses: Family,
    drops: Family,
    inserts: Family,
    evictions: Family,
    cursors: Family,
    bytes: Family,
    capacity_bytes: Family,
}

impl CursorCacheCollector {
    pub fn new(state: SharedState) -> CursorCacheCollector {
        CursorCacheCollector {
            state,
            lookups: Family::counter(
                "pageserver_scan_cursor_cache_lookups_total",
                "Scan pages that came with a token and looked for its cursor",
                &[],
            ),
            hits: Family::counter(
                "pageserver_scan_cursor_cache_hits_total",
                "Lookups that found their cursor (those not dropped resumed from it)",
                &[],
            ),
            misses: Family::counter(
                "pageserver_scan_cursor_cache_misses_total",
                "Lookups that found no cursor (evicted or expired) and re-seeked from the token",
                &[],
            ),
            drops: Family::counter(
                "pageserver_scan_cursor_cache_drops_total",
                "Cursors found but not usable (the layer set changed) and re-seeked",
                &[],
            ),
            inserts: Family::counter(
                "pageserver_scan_cursor_cache_inserts_total",
                "Cursors kept for a next page",
                &[],
            ),
            evictions: Family::counter(
                "pageserver_scan_cursor_cache_evictions_total",
                "Cursors evicted, by reason: idle past scan_cursor_idle_timeout, or over \
                 scan_cursor_cache_size",
                &["reason"],
            ),
            cursors: Family::gauge(
                "pageserver_scan_cursor_cache_cursors",
                "Cursors held now",
                &[],
            ),
            bytes: Family::gauge(
                "pageserver_scan_cursor_cache_bytes",
                "What the cursors held weigh together",
                &[],
            ),
            capacity_bytes: Family::gauge(
                "pageserver_scan_cursor_cache_capacity_bytes",
                "The most the cursors held may weigh (scan_cursor_cache_size)",
                &[],
            ),
        }
    }
}

impl Collector for CursorCacheCollector {
    fn desc(&self) -> Vec<&Desc> {
        [
            &self.lookups,
            &self.hits,
            &self.misses,
            &self.drops,
            &self.inserts,
            &self.evictions,
            &self.cursors,
            &self.bytes,
            &self.capacity_bytes,
        ]
        .map(Family::desc)
        .to_vec()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let stats = self.state.reads.scan_cursors().stats();
        let mut evictions = self.evictions.fill(2);
        evictions.add(&["expired"], stats.evictions_expired as f64);
        evictions.add(&["size"], stats.evictions_size as f64);
        vec![
            self.lookups.single(stats.lookups as f64),
            self.hits.single(stats.hits as f64),
            self.misses.single(stats.misses as f64),
            self.drops.single(stats.drops as f64),
            self.inserts.single(stats.inserts as f64),
            evictions.done(),
            self.cursors.single(stats.cursors as f64),
            self.bytes.single(stats.bytes as f64),
            self.capacity_bytes.single(stats.capacity_bytes as f64),
        ]
    }
}
