//! Metrics, in the Prometheus text format at `GET /metrics`.
//!
//! Two sources. Events counted where they happen (ephemeral writes, layer flushes, requests and
//! their latencies) live in the `prometheus` crate's default registry as the statics below; each
//! costs an atomic add or a histogram bucket increment. State that already exists elsewhere (the
//! page cache's and the scan cursor cache's counters, each timeline's LSNs and layers, the
//! process) is read at scrape time by the collectors of `http::metrics_page`, in a registry of
//! their own, rather than mirrored, so it can never drift from the truth; that page renders both
//! registries in one pass of the text encoder.
//!
//! A leaf: this module imports nothing of ours, so any module may count into it.

use std::sync::{LazyLock, OnceLock};
use std::time::Duration;

use prometheus::{
    register_histogram, register_histogram_vec, register_int_counter, register_int_counter_vec,
    register_int_gauge, Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge,
};

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
    buckets_up_to(base, top)
}

fn buckets_up_to(base: &[f64], top: f64) -> Vec<f64> {
    let mut buckets: Vec<f64> = base.iter().copied().filter(|b| *b < top).collect();
    // Buckets must rise strictly: a timeout of zero (or below the first bucket) adds only one
    // positive bound past what is kept.
    if top > 0.0 {
        buckets.extend([top, top * 2.0]);
    } else if buckets.is_empty() {
        buckets.push(base.first().copied().unwrap_or(1.0));
    }
    buckets
}

fn counter(name: &str, help: &str) -> IntCounter {
    register_int_counter!(name, help).expect("metric names are unique")
}

pub static WAL_INGEST_RECORDS: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pageserver_wal_ingest_records_total",
        "WAL records decoded into page versions by page ingest",
    )
});

pub static WAL_INGEST_IMAGES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pageserver_wal_ingest_images_total",
        "Page images page ingest stored from the WAL's full-page images",
    )
});

pub static WAL_INGEST_WAL_RECORD_VERSIONS: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pageserver_wal_ingest_wal_record_versions_total",
        "Page versions page ingest stored as WAL records for PostgreSQL's redo",
    )
});

pub static BACKGROUND_SNAPSHOTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "pageserver_background_snapshots_total",
        "Background snapshots, by result: made, or error (a failed attempt, tried again)",
        &["result"]
    )
    .expect("metric names are unique")
});

pub static BACKGROUND_SNAPSHOT_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    register_histogram!(
        "pageserver_background_snapshot_seconds",
        "Time to make one background snapshot: replay by PostgreSQL and import",
        vec![0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0]
    )
    .expect("metric names are unique")
});

pub static BACKGROUND_SNAPSHOT_BYTES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pageserver_background_snapshot_bytes_stored_total",
        "Bytes of versions background snapshots stored (what differed from the timeline)",
    )
});

pub static BACKGROUND_SNAPSHOT_LAG_BYTES: LazyLock<prometheus::IntGaugeVec> = LazyLock::new(|| {
    prometheus::register_int_gauge_vec!(
        "pageserver_background_snapshot_lag_bytes",
        "WAL flushed past a timeline's newest snapshot",
        &["tenant_id", "timeline_id"]
    )
    .expect("metric names are unique")
});

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
pub static COMPACTIONS: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pageserver_compactions_total",
        "L0 compactions completed (each merges two or more L0 layers into L1 layers)",
    )
});
pub static COMPACTION_BYTES_READ: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pageserver_compaction_read_bytes_total",
        "Bytes of L0 layer files merged by compactions",
    )
});
pub static COMPACTION_BYTES_WRITTEN: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pageserver_compaction_written_bytes_total",
        "Bytes of L1 layer files written by compactions",
    )
});
pub static IMAGE_LAYERS_CREATED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pageserver_image_layers_created_total",
        "Image layers written by image creation",
    )
});
pub static IMAGE_BYTES_READ: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pageserver_image_read_bytes_total",
        "Bytes of layer blocks image creation read for its pages (through the page cache)",
    )
});
pub static IMAGE_BYTES_WRITTEN: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pageserver_image_written_bytes_total",
        "Bytes of image layer files written by image creation",
    )
});
pub static GC_LAYERS_REMOVED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pageserver_gc_layers_removed_total",
        "Layer files garbage collection removed from the layer set",
    )
});
pub static GC_BYTES_REMOVED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pageserver_gc_removed_bytes_total",
        "Bytes of layer files garbage collection removed from the layer set",
    )
});
pub static INGEST_L0_WAIT_SECONDS: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        "pageserver_ingest_l0_wait_seconds",
        "Time batches waited for L0 compaction before being stored (reason: slowdown, stop)",
        &["reason"],
        LATENCY_BUCKETS.to_vec()
    )
    .expect("metric names are unique")
});
pub static BACKPRESSURE_FLUSHES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pageserver_ingest_backpressure_flushes_total",
        "Times an ingest waited for the oldest frozen layer's write (or wrote it) because more than max_frozen_layers waited",
    )
});
pub static INGEST_PACE_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    register_histogram!(
        "pageserver_ingest_pace_seconds",
        "Time HTTP ingest answers were held after their batch was stored, each for its bytes over the measured flush rate, while the frozen layers were at max_frozen_layers",
        LATENCY_BUCKETS.to_vec()
    )
    .expect("metric names are unique")
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
/// Waits for an LSN last up to `wait_lsn_timeout` (60 s by default): buckets from 100 µs, cut
/// and extended by [`with_wait_buckets`], so a timeout lands in a bucket of its own rather than
/// only in `+Inf`, whatever `wait_lsn_timeout` is.
const WAIT_BUCKETS: &[f64] = &[
    0.000_1, 0.001, 0.01, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];
pub static WAIT_LSN_SECONDS: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        "pageserver_wait_lsn_seconds",
        "Time reads waited for their LSN to be ingested, by how the wait ended (ok, timeout, cancelled by shutdown, abandoned by the client)",
        &["outcome"],
        with_wait_buckets(WAIT_BUCKETS)
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
/// The kinds of long-running work `tenant::admission` bounds.
pub const WORK_KINDS: &[&str] = &["import", "basebackup", "download"];
pub static WORK_RUNNING: LazyLock<prometheus::IntGaugeVec> = LazyLock::new(|| {
    prometheus::register_int_gauge_vec!(
        "pageserver_work_running",
        "Imports, basebackups and on-demand layer downloads running now, each on a thread of its own",
        &["kind"]
    )
    .expect("metric names are unique")
});
pub static WORK_REFUSED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "pageserver_work_refused_total",
        "Imports, basebackups and on-demand layer downloads refused (503) because as many ran already, by the bound that refused them: server or tenant",
        &["kind", "scope"]
    )
    .expect("metric names are unique")
});
pub static DATADIR_IMPORTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "pageserver_datadir_imports_total",
        "Data directory imports by outcome: ok, refused (nothing stored: the archive or its LSN), error",
        &["outcome"]
    )
    .expect("metric names are unique")
});
pub static DATADIR_IMPORT_BYTES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pageserver_datadir_import_bytes_total",
        "Bytes of data directory archives read by imports, as they arrive (refused ones too)",
    )
});
pub static BASEBACKUP_BYTES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pageserver_basebackup_bytes_total",
        "Bytes of basebackup archives handed to clients",
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
/// The page service's calls by method and gRPC status code name (`OK`, `NOT_FOUND`, ...); a
/// GetPages stream counts each batch as one `GetPages` call with its own outcome.
pub static GRPC_REQUESTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "pageserver_grpc_requests_total",
        "Page service (gRPC) calls by method and status code; each GetPages batch is one",
        &["method", "code"]
    )
    .expect("metric names are unique")
});
/// The page service's methods, whose latency series exist from the start.
pub const GRPC_METHODS: &[&str] = &["Ping", "GetPage", "GetPages", "GetRelSize", "RelExists"];
pub static GRPC_REQUEST_SECONDS: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        "pageserver_grpc_request_seconds",
        "Page service (gRPC) call latency by method, including any wait for the LSN; for \
         GetPages, one batch from its arrival to its answer",
        &["method"],
        with_wait_buckets(LATENCY_BUCKETS)
    )
    .expect("metric names are unique")
});
pub static GRPC_BATCH_PAGES: LazyLock<Histogram> = LazyLock::new(|| {
    register_histogram!(
        "pageserver_grpc_batch_pages",
        "Pages asked for by one GetPages batch",
        vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0]
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

pub static GETPAGE_LAYERS_VISITED: LazyLock<Histogram> = LazyLock::new(|| {
    register_histogram!(
        "pageserver_getpage_layers_visited",
        "Layers one GetPage request asked for the key's versions (its X-Read-Cost layers=)",
        vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 24.0, 32.0, 64.0]
    )
    .expect("metric names are unique")
});

pub static READS_IN_PLACE: LazyLock<IntCounter> = LazyLock::new(|| {
    register_int_counter!(
        "pageserver_reads_in_place_total",
        "GetPage requests, GetPages batches and relation size reads answered from the page cache \
         on the async worker, without a hand-off to the blocking pool"
    )
    .expect("metric names are unique")
});
pub static READ_WAITS: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pageserver_getpage_miss_waits_total",
        "Blocks GetPage requests missed and waited for another reader's read of",
    )
});

pub static REMOTE_UPLOADED_BYTES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pageserver_remote_uploaded_bytes_total",
        "Bytes of layer files uploaded to remote storage",
    )
});
pub static REMOTE_DOWNLOADED_BYTES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pageserver_remote_downloaded_bytes_total",
        "Bytes of layer files and indexes downloaded from remote storage",
    )
});
/// Remote operations of the upload queue and downloads, by kind and result.
pub static REMOTE_OPERATIONS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "pageserver_remote_operations_total",
        "Remote storage operations (each after its retries), by operation and result",
        &["op", "result"]
    )
    .expect("metric names are unique")
});
pub static LAYER_EVICTIONS: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pageserver_layer_evictions_total",
        "Local copies of layer files evicted to stay within max_local_layer_bytes",
    )
});
pub static LAYER_EVICTED_BYTES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pageserver_layer_evicted_bytes_total",
        "Bytes of the layer files evicted",
    )
});
/// Flushes that waited because too many bytes waited for upload.
pub static UPLOAD_QUEUE_WAIT_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    register_histogram!(
        "pageserver_upload_queue_wait_seconds",
        "Time a flush waited for the upload queue to drain below upload_queue_max_bytes",
        LATENCY_BUCKETS.to_vec()
    )
    .expect("metric names are unique")
});

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
        &COMPACTIONS,
        &COMPACTION_BYTES_READ,
        &COMPACTION_BYTES_WRITTEN,
        &IMAGE_LAYERS_CREATED,
        &IMAGE_BYTES_READ,
        &IMAGE_BYTES_WRITTEN,
        &GC_LAYERS_REMOVED,
        &GC_BYTES_REMOVED,
        &BACKPRESSURE_FLUSHES,
        &INGEST_RECORDS,
        &INGEST_BYTES,
        &READ_IOS,
        &READ_BYTES,
        &READ_LAYERS,
        &READ_WAITS,
        &READS_IN_PLACE,
        &WAIT_LSN_REFUSED,
        &FILE_EVICTIONS,
        &REMOTE_UPLOADED_BYTES,
        &REMOTE_DOWNLOADED_BYTES,
        &LAYER_EVICTIONS,
        &LAYER_EVICTED_BYTES,
        &DATADIR_IMPORT_BYTES,
        &BASEBACKUP_BYTES,
    ] {
        LazyLock::force(counter);
    }
    LazyLock::force(&OPEN_FILES);
    LazyLock::force(&MAX_FILE_DESCRIPTORS);
    LazyLock::force(&GETPAGE_LAYERS_VISITED);
    for kind in ["first", "reopen"] {
        FILE_OPENS.with_label_values(&[kind]);
    }
    LazyLock::force(&WAIT_LSN_IN_FLIGHT);
    for outcome in ["ok", "timeout", "cancelled", "abandoned"] {
        WAIT_LSN_SECONDS.with_label_values(&[outcome]);
    }
    LazyLock::force(&LAYER_FLUSH_SECONDS);
    LazyLock::force(&INGEST_PACE_SECONDS);
    for reason in ["slowdown", "stop"] {
        INGEST_L0_WAIT_SECONDS.with_label_values(&[reason]);
    }
    for outcome in ["ok", "not_found", "error"] {
        GETPAGE_SECONDS.with_label_values(&[outcome]);
    }
    for outcome in ["ok", "error"] {
        INGEST_SECONDS.with_label_values(&[outcome]);
    }
    for outcome in ["ok", "refused", "error"] {
        DATADIR_IMPORTS.with_label_values(&[outcome]);
    }
    for kind in WORK_KINDS {
        WORK_RUNNING.with_label_values(&[kind]);
        for scope in ["server", "tenant"] {
            WORK_REFUSED.with_label_values(&[kind, scope]);
        }
    }
    for kind in ["index", "value"] {
        for result in ["hit", "miss"] {
            READ_BLOCKS.with_label_values(&[kind, result]);
        }
    }
    LazyLock::force(&HTTP_REQUESTS);
    http_request_seconds();
    LazyLock::force(&GRPC_REQUESTS);
    LazyLock::force(&GRPC_BATCH_PAGES);
    for method in GRPC_METHODS {
        GRPC_REQUEST_SECONDS.with_label_values(&[method]);
    }
    LazyLock::force(&STARTUP_SECONDS);
    LazyLock::force(&UPLOAD_QUEUE_WAIT_SECONDS);
    for op in ["upload_layer", "upload_index", "delete", "list", "download"] {
        for result in ["ok", "error"] {
            REMOTE_OPERATIONS.with_label_values(&[op, result]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_rise_strictly_whatever_the_timeout() {
        for top in [0.0, 0.000_01, 0.000_1, 0.7, 60.0, 1e6] {
            let b = buckets_up_to(REQUEST_BUCKETS, top);
            assert!(!b.is_empty(), "{top}");
            assert!(b.windows(2).all(|w| w[0] < w[1]), "{top}: {b:?}");
            assert!(b[0] > 0.0, "{top}: {b:?}");
        }
    }

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
