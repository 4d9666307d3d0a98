//! Metrics, in the Prometheus text format at `GET /metrics`.
//!
//! Two sources. Events counted where they happen (ephemeral writes, layer flushes, requests and
//! their latencies) live in the `prometheus` crate's default registry as the statics below; each
//! costs an atomic add or a histogram bucket increment. State that already exists elsewhere (the
//! page cache's and the scan cursor cache's counters, each timeline's LSNs and layers) is read at
//! scrape time by
//! [`render`] rather than mirrored, so it can never drift from the truth.

use std::fmt::Write as _;
use std::sync::{LazyLock, OnceLock};
use std::time::Duration;

use prometheus::{
    register_histogram, register_histogram_vec, register_int_counter, register_int_counter_vec,
    register_int_gauge, Encoder, Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    TextEncoder,
};

use crate::page_cache::{KindStats, PageCache};
use crate::tenant::cursor_cache::{CursorCache, CursorCacheStats};
use crate::tenant::mgr::TenantManager;
use crate::tenant::timeline::LayerKind;

/// Latency buckets from 10 µs to 10 s.
const LATENCY_BUCKETS: &[f64] = &[
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Request latency buckets from 100 µs up to [`wait_lsn_timeout`]'s neighbourhood; see
/// [`with_wait_buckets`].
const REQUEST_BUCKETS: &[f64] = &[
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0,
];

/// `wait_lsn_timeout`, set by [`register_all`] before any histogram that needs it exists.
static WAIT_LSN_TIMEOUT: OnceLock<Duration> = OnceLock::new();

/// The default `wait_lsn_timeout`, for histograms made before (or without) [`register_all`].
const DEFAULT_WAIT_LSN_TIMEOUT: Duration = Duration::from_secs(60);

/// `base` cut below `wait_lsn_timeout`, then a bucket at it and one at twice it. A request that
/// waits for an LSN and times out takes a little over `wait_lsn_timeout`, so it lands in the
/// last finite bucket rather than in `+Inf`, and `le` = `wait_lsn_timeout` counts the requests
/// that finished before timing out, whatever `wait_lsn_timeout` is set to.
pub fn with_wait_buckets(base: &[f64]) -> Vec<f64> {
    let top = WAIT_LSN_TIMEOUT
        .get()
        .copied()
        .unwrap_or(DEFAULT_WAIT_LSN_TIMEOUT)
        .as_secs_f64();
    let mut buckets: Vec<f64> = base.iter().copied().filter(|b| *b < top).collect();
    buckets.extend([top, top * 2.0]);
    buckets
}

fn counter(name: &str, help: &str) -> IntCounter {
    register_int_counter!(name, help).expect("metric names are unique")
}

pub static EPHEMERAL_BYTES_WRITTEN: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pageserver_ephemeral_bytes_written_total",
        "Bytes written to ephemeral files (whole blocks)",
    )
});
pub static EPHEMERAL_WRITES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pageserver_ephemeral_writes_total",
        "Positional write calls to ephemeral files",
    )
});
pub static LAYER_FLUSHES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pageserver_layer_flushes_total",
        "Frozen in-memory layers written to delta layer files",
    )
});
pub static LAYER_FLUSH_BYTES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pageserver_layer_flush_bytes_total",
        "Bytes of delta layer files written by flushes",
    )
});
pub static BACKPRESSURE_FLUSHES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pageserver_ingest_backpressure_flushes_total",
        "Times an ingest flushed frozen layers itself because more than max_frozen_layers waited",
    )
});
pub static LAYER_FLUSH_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    register_histogram!(
        "pageserver_layer_flush_seconds",
        "Time to write one frozen layer to disk and update the metadata",
        LATENCY_BUCKETS.to_vec()
    )
    .expect("metric names are unique")
});
pub static GETPAGE_SECONDS: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        "pageserver_getpage_seconds",
        "GetPage@LSN request latency, including any wait for the LSN",
        &["outcome"],
        with_wait_buckets(LATENCY_BUCKETS)
    )
    .expect("metric names are unique")
});
/// Waits for an LSN last up to `wait_lsn_timeout` (60 s by default): buckets from 100 µs past
/// that, so a timeout lands in a bucket of its own rather than only in `+Inf`.
const WAIT_BUCKETS: &[f64] = &[
    0.000_1, 0.001, 0.01, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];
pub static WAIT_LSN_SECONDS: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        "pageserver_wait_lsn_seconds",
        "Time reads waited for their LSN to be ingested, by how the wait ended (ok, timeout, cancelled by shutdown, abandoned by the client)",
        &["outcome"],
        WAIT_BUCKETS.to_vec()
    )
    .expect("metric names are unique")
});
pub static WAIT_LSN_IN_FLIGHT: LazyLock<IntGauge> = LazyLock::new(|| {
    register_int_gauge!(
        "pageserver_wait_lsn_in_flight",
        "Reads waiting for their LSN to be ingested now, over all timelines"
    )
    .expect("metric names are unique")
});
pub static WAIT_LSN_REFUSED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pageserver_wait_lsn_refused_total",
        "Reads refused because max_lsn_waiters reads already waited on their timeline",
    )
});
pub static INGEST_SECONDS: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        "pageserver_ingest_seconds",
        "Ingest request latency (decode, validate, store)",
        &["outcome"],
        LATENCY_BUCKETS.to_vec()
    )
    .expect("metric names are unique")
});
pub static INGEST_RECORDS: LazyLock<IntCounter> =
    LazyLock::new(|| counter("pageserver_ingest_records_total", "Page versions ingested"));
pub static INGEST_BYTES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pageserver_ingest_bytes_total",
        "Bytes of ingest request bodies accepted",
    )
});
pub static OPEN_FILES: LazyLock<IntGauge> = LazyLock::new(|| {
    register_int_gauge!(
        "pageserver_open_files",
        "Descriptors of our files (layers, ephemeral files, the manifest) open now"
    )
    .expect("metric names are unique")
});
pub static MAX_FILE_DESCRIPTORS: LazyLock<IntGauge> = LazyLock::new(|| {
    register_int_gauge!(
        "pageserver_max_file_descriptors",
        "The most descriptors of our files open at once (max_file_descriptors)"
    )
    .expect("metric names are unique")
});
pub static FILE_OPENS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "pageserver_file_opens_total",
        "Files opened: first for a file's first descriptor, reopen after its descriptor was taken for another file",
        &["kind"]
    )
    .expect("metric names are unique")
});
pub static FILE_EVICTIONS: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pageserver_file_evictions_total",
        "Descriptors closed to make room under max_file_descriptors (the file reopens when used)",
    )
});
pub static HTTP_REQUESTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "pageserver_http_requests_total",
        "HTTP requests by method (standard ones, else `other`), route template (or \
         `unmatched`) and status",
        &["method", "route", "status"]
    )
    .expect("metric names are unique")
});
static HTTP_REQUEST_SECONDS: OnceLock<HistogramVec> = OnceLock::new();

/// HTTP request latency by method and route, from the request's head to its response's head
/// (a response body still streaming is not counted).
pub fn http_request_seconds() -> &'static HistogramVec {
    HTTP_REQUEST_SECONDS.get_or_init(|| {
        register_histogram_vec!(
            "pageserver_http_request_duration_seconds",
            "HTTP request latency until the response head, by method and route template",
            &["method", "route"],
            with_wait_buckets(REQUEST_BUCKETS)
        )
        .expect("metric names are unique")
    })
}
pub static STARTUP_SECONDS: LazyLock<prometheus::GaugeVec> = LazyLock::new(|| {
    prometheus::register_gauge_vec!(
        "pageserver_startup_duration_seconds",
        "Seconds each startup phase took",
        &["phase"]
    )
    .expect("metric names are unique")
});

pub static READ_BLOCKS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "pageserver_getpage_blocks_total",
        "Blocks GetPage requests needed, by part of the layer and whether the page cache had them",
        &["kind", "result"]
    )
    .expect("metric names are unique")
});
pub static READ_IOS: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pageserver_getpage_ios_total",
        "File read calls GetPage requests issued",
    )
});
pub static READ_BYTES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pageserver_getpage_read_bytes_total",
        "Bytes GetPage requests read from files",
    )
});
pub static READ_LAYERS: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pageserver_getpage_layers_visited_total",
        "Layers GetPage requests asked for a key's versions",
    )
});

pub static READ_WAITS: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pageserver_getpage_miss_waits_total",
        "Blocks GetPage requests missed and waited for another reader's read of",
    )
});

/// Adds one GetPage's cost to the totals.
pub fn record_read_cost(cost: &crate::tenant::read_cost::ReadCost) {
    let blocks = [
        ("index", "hit", cost.idx_hit),
        ("index", "miss", cost.idx_miss),
        ("value", "hit", cost.val_hit),
        ("value", "miss", cost.val_miss),
    ];
    for (kind, result, n) in blocks {
        READ_BLOCKS
            .with_label_values(&[kind, result])
            .inc_by(u64::from(n));
    }
    READ_IOS.inc_by(u64::from(cost.ios));
    READ_BYTES.inc_by(cost.bytes);
    READ_LAYERS.inc_by(u64::from(cost.layers));
    READ_WAITS.inc_by(u64::from(cost.waits));
}

/// Registers every metric and its label values now, so a fresh server's `/metrics` lists each
/// family (at zero) before its first event. `wait_lsn_timeout` sets the top latency buckets
/// ([`with_wait_buckets`]); only the first call's counts.
pub fn register_all(wait_lsn_timeout: Duration) {
    let _ = WAIT_LSN_TIMEOUT.set(wait_lsn_timeout);
    for counter in [
        &EPHEMERAL_BYTES_WRITTEN,
        &EPHEMERAL_WRITES,
        &LAYER_FLUSHES,
        &LAYER_FLUSH_BYTES,
        &BACKPRESSURE_FLUSHES,
        &INGEST_RECORDS,
        &INGEST_BYTES,
        &READ_IOS,
        &READ_BYTES,
        &READ_LAYERS,
        &READ_WAITS,
        &WAIT_LSN_REFUSED,
        &FILE_EVICTIONS,
    ] {
        LazyLock::force(counter);
    }
    LazyLock::force(&OPEN_FILES);
    LazyLock::force(&MAX_FILE_DESCRIPTORS);
    for kind in ["first", "reopen"] {
        FILE_OPENS.with_label_values(&[kind]);
    }
    LazyLock::force(&WAIT_LSN_IN_FLIGHT);
    for outcome in ["ok", "timeout", "cancelled", "abandoned"] {
        WAIT_LSN_SECONDS.with_label_values(&[outcome]);
    }
    LazyLock::force(&LAYER_FLUSH_SECONDS);
    for outcome in ["ok", "not_found", "error"] {
        GETPAGE_SECONDS.with_label_values(&[outcome]);
    }
    for outcome in ["ok", "error"] {
        INGEST_SECONDS.with_label_values(&[outcome]);
    }
    for kind in ["index", "value"] {
        for result in ["hit", "miss"] {
            READ_BLOCKS.with_label_values(&[kind, result]);
        }
    }
    LazyLock::force(&HTTP_REQUESTS);
    http_request_seconds();
    LazyLock::force(&STARTUP_SECONDS);
}

/// The whole `/metrics` page.
pub fn render(cache: &PageCache, cursors: &CursorCache, tenants: &TenantManager) -> String {
    let mut out = Vec::new();
    TextEncoder::new()
        .encode(&prometheus::gather(), &mut out)
        .expect("the text encoder writes to a Vec");
    let mut out = String::from_utf8(out).expect("the text format is UTF-8");
    render_page_cache(&mut out, cache);
    render_cursor_cache(&mut out, &cursors.stats());
    render_timelines(&mut out, tenants);
    out
}

/// A metric family read off a struct: name, type, help, and how to get the value.
type FamilyOf<T> = (&'static str, &'static str, &'static str, fn(&T) -> u64);

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn render_page_cache(out: &mut String, cache: &PageCache) {
    let stats = cache.stats();
    let kinds: [(&str, &KindStats); 3] = [
        ("file", &stats.file_pages),
        ("index", &stats.index_pages),
        ("materialized", &stats.materialized_pages),
    ];
    let per_kind: [FamilyOf<KindStats>; 5] = [
        (
            "pageserver_page_cache_hits_total",
            "counter",
            "Lookups that found their page",
            |k| k.hits,
        ),
        (
            "pageserver_page_cache_misses_total",
            "counter",
            "Lookups that did not find their page",
            |k| k.misses,
        ),
        (
            "pageserver_page_cache_inserts_total",
            "counter",
            "Pages inserted",
            |k| k.inserts,
        ),
        (
            "pageserver_page_cache_evictions_total",
            "counter",
            "Pages evicted",
            |k| k.evictions,
        ),
        (
            "pageserver_page_cache_resident_bytes",
            "gauge",
            "Bytes of pages resident",
            |k| k.bytes_resident,
        ),
    ];
    for (name, kind, help, get) in per_kind {
        family(out, name, kind, help);
        for (label, k) in kinds {
            let _ = writeln!(out, "{name}{{kind=\"{label}\"}} {}", get(k));
        }
    }
    let totals: [(&str, &str, &str, u64); 5] = [
        (
            "pageserver_page_cache_capacity_bytes",
            "gauge",
            "Bytes of page memory",
            stats.capacity_bytes,
        ),
        (
            "pageserver_page_cache_pinned_pages",
            "gauge",
            "Pages pinned by a lease right now",
            stats.pinned_pages,
        ),
        (
            "pageserver_page_cache_inserts_refused_total",
            "counter",
            "Inserts refused for lack of an evictable slot",
            stats.inserts_refused,
        ),
        (
            "pageserver_page_cache_inserts_duplicate_total",
            "counter",
            "Inserts of a page already cached",
            stats.inserts_duplicate,
        ),
        (
            "pageserver_page_cache_miss_waits_total",
            "counter",
            "File block misses that waited for another reader's read of the block",
            stats.miss_waits,
        ),
    ];
    for (name, kind, help, value) in totals {
        family(out, name, kind, help);
        let _ = writeln!(out, "{name} {value}");
    }
}

fn render_cursor_cache(out: &mut String, stats: &CursorCacheStats) {
    let families: [(&str, &str, &str, u64); 8] = [
        (
            "pageserver_scan_cursor_cache_lookups_total",
            "counter",
            "Scan pages that came with a token and looked for its cursor",
            stats.lookups,
        ),
        (
            "pageserver_scan_cursor_cache_hits_total",
            "counter",
            "Lookups that found their cursor (those not dropped resumed from it)",
            stats.hits,
        ),
        (
            "pageserver_scan_cursor_cache_misses_total",
            "counter",
            "Lookups that found no cursor (evicted or expired) and re-seeked from the token",
            stats.misses,
        ),
        (
            "pageserver_scan_cursor_cache_drops_total",
            "counter",
            "Cursors found but not usable (the layer set changed) and re-seeked",
            stats.drops,
        ),
        (
            "pageserver_scan_cursor_cache_inserts_total",
            "counter",
            "Cursors kept for a next page",
            stats.inserts,
        ),
        (
            "pageserver_scan_cursor_cache_cursors",
            "gauge",
            "Cursors held now",
            stats.cursors,
        ),
        (
            "pageserver_scan_cursor_cache_bytes",
            "gauge",
            "What the cursors held weigh together",
            stats.bytes,
        ),
        (
            "pageserver_scan_cursor_cache_capacity_bytes",
            "gauge",
            "The most the cursors held may weigh (scan_cursor_cache_size)",
            stats.capacity_bytes,
        ),
    ];
    for (name, kind, help, value) in families {
        family(out, name, kind, help);
        let _ = writeln!(out, "{name} {value}");
    }
    let name = "pageserver_scan_cursor_cache_evictions_total";
    family(
        out,
        name,
        "counter",
        "Cursors evicted, by reason: idle past scan_cursor_idle_timeout, or over scan_cursor_cache_size",
    );
    let _ = writeln!(
        out,
        "{name}{{reason=\"expired\"}} {}",
        stats.evictions_expired
    );
    let _ = writeln!(out, "{name}{{reason=\"size\"}} {}", stats.evictions_size);
}

fn render_timelines(out: &mut String, tenants: &TenantManager) {
    let timelines: Vec<_> = tenants
        .list_tenants()
        .iter()
        .flat_map(|t| t.list_timelines())
        .collect();
    let labels = |t: &crate::tenant::timeline::Timeline| {
        format!(
            "tenant_id=\"{}\",timeline_id=\"{}\"",
            t.tenant_id(),
            t.timeline_id()
        )
    };
    family(
        out,
        "pageserver_last_record_lsn",
        "gauge",
        "Newest LSN ingested",
    );
    for t in &timelines {
        let _ = writeln!(
            out,
            "pageserver_last_record_lsn{{{}}} {}",
            labels(t),
            t.last_record_lsn().0
        );
    }
    family(
        out,
        "pageserver_disk_consistent_lsn",
        "gauge",
        "Newest LSN whose versions are all in fsynced layer files",
    );
    for t in &timelines {
        let _ = writeln!(
            out,
            "pageserver_disk_consistent_lsn{{{}}} {}",
            labels(t),
            t.disk_consistent_lsn().0
        );
    }
    let mut counts = String::new();
    let mut sizes = String::new();
    for t in &timelines {
        let layers = t.layers();
        for (kind, name) in [
            (LayerKind::Open, "open"),
            (LayerKind::Frozen, "frozen"),
            (LayerKind::Delta, "delta"),
        ] {
            let (count, bytes) = layers
                .iter()
                .filter(|l| l.kind == kind)
                .fold((0u64, 0u64), |(c, b), l| (c + 1, b + l.size_bytes));
            let labels = format!("{},kind=\"{name}\"", labels(t));
            let _ = writeln!(counts, "pageserver_layers{{{labels}}} {count}");
            let _ = writeln!(sizes, "pageserver_layer_bytes{{{labels}}} {bytes}");
        }
    }
    family(
        out,
        "pageserver_layers",
        "gauge",
        "Layers per timeline by kind",
    );
    out.push_str(&counts);
    family(
        out,
        "pageserver_layer_bytes",
        "gauge",
        "Bytes of layers per timeline by kind",
    );
    out.push_str(&sizes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_buckets_reach_past_wait_lsn_timeout() {
        // Before register_all, the default timeout.
        let buckets = with_wait_buckets(REQUEST_BUCKETS);
        assert_eq!(buckets[0], 0.000_1);
        assert_eq!(&buckets[buckets.len() - 2..], &[60.0, 120.0]);
        assert!(buckets.windows(2).all(|w| w[0] < w[1]), "{buckets:?}");
        let getpage = with_wait_buckets(LATENCY_BUCKETS);
        assert_eq!(getpage[0], 0.000_01);
        assert_eq!(&getpage[getpage.len() - 3..], &[10.0, 60.0, 120.0]);
    }
}
