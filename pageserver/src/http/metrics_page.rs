//! The `/metrics` page: the registry's counters and histograms
//! ([`crate::metrics::render_registered`]), then what is read at scrape time, never mirrored:
//!
//! - The page cache's and the scan cursor cache's counters, and each timeline's LSNs and
//!   layers.
//! - `pageserver_build_info{version, features}` 1: which build answers.
//! - `process_*`, under the names Prometheus client libraries use, read from `/proc/self`:
//!   open and maximum descriptors, resident and virtual memory, CPU seconds, threads, start
//!   time. Linux only, like the server; a file that cannot be read leaves its metrics out
//!   rather than failing the scrape.
//! - The HTTP limits in use: connections open and their cap, request body bytes reserved and
//!   their budget.
//!
//! It lives beside the HTTP code, not in `metrics.rs`, because it reads state that belongs to
//! other modules; `metrics.rs` keeps the counters and histograms.

use std::fmt::Write as _;
use std::time::UNIX_EPOCH;

use super::AppState;
use crate::page_cache::{KindStats, PageCache};
use crate::tenant::mgr::TenantManager;
use crate::tenant::timeline::scan::cursor_cache::CursorCacheStats;
use crate::tenant::timeline::LayerKind;

/// What `/proc/self/stat` counts CPU time in: USER_HZ, which Linux fixes at 100 per second for
/// every architecture's user-space ABI (`sysconf(_SC_CLK_TCK)` reports the same constant).
const CLOCK_TICKS_PER_SECOND: f64 = 100.0;

/// The whole `/metrics` page.
pub fn render(state: &AppState) -> String {
    let mut out = crate::metrics::render_registered();
    render_page_cache(&mut out, &state.cache);
    render_cursor_cache(&mut out, &state.scan_cursors.stats());
    render_timelines(&mut out, &state.tenants);
    render_build_info(&mut out);
    render_process(&mut out, &read_process(), state);
    render_http_limits(&mut out, state);
    out
}

/// A family of one unlabelled sample.
fn single(out: &mut String, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
    family(out, name, kind, help);
    let _ = writeln!(out, "{name} {value}");
}

fn render_build_info(out: &mut String) {
    let features = if crate::failpoints::ENABLED {
        "testing"
    } else {
        ""
    };
    let _ = writeln!(
        out,
        "# HELP pageserver_build_info The build that answers: its version and Cargo features\n\
         # TYPE pageserver_build_info gauge\n\
         pageserver_build_info{{version=\"{}\",features=\"{features}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
}

/// What `/proc/self` says of this process; `None` where it could not be read.
#[derive(Debug, Default, PartialEq)]
pub struct ProcessStats {
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
    pub resident_bytes: Option<u64>,
    pub virtual_bytes: Option<u64>,
    pub threads: Option<u64>,
    pub cpu_seconds: Option<f64>,
}

pub fn read_process() -> ProcessStats {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    ProcessStats {
        open_fds: std::fs::read_dir("/proc/self/fd")
            .ok()
            // The directory handle read_dir holds is one of the entries; it is not ours to count.
            .map(|entries| (entries.count() as u64).saturating_sub(1)),
        max_fds: crate::config::open_files_limit(),
        resident_bytes: status_kib(&status, "VmRSS:").map(|kib| kib * 1024),
        virtual_bytes: status_kib(&status, "VmSize:").map(|kib| kib * 1024),
        threads: status_kib(&status, "Threads:"),
        cpu_seconds: cpu_seconds(&stat),
    }
}

/// The number after `field` in `/proc/self/status` (kB for the memory fields).
fn status_kib(status: &str, field: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(field))?;
    line[field.len()..].split_whitespace().next()?.parse().ok()
}

/// User plus system CPU time from `/proc/self/stat`. Its second field, the command name in
/// parentheses, may hold spaces, so fields are counted after the last `)`: utime and stime are
/// the 14th and 15th fields, the 12th and 13th after it.
fn cpu_seconds(stat: &str) -> Option<f64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / CLOCK_TICKS_PER_SECOND)
}

fn render_process(out: &mut String, stats: &ProcessStats, state: &AppState) {
    let gauges: [(&str, &str, Option<u64>); 5] = [
        ("process_open_fds", "Open file descriptors", stats.open_fds),
        (
            "process_max_fds",
            "The open file descriptor limit (RLIMIT_NOFILE, soft)",
            stats.max_fds,
        ),
        (
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
            stats.resident_bytes,
        ),
        (
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes",
            stats.virtual_bytes,
        ),
        ("process_threads", "OS threads", stats.threads),
    ];
    for (name, help, value) in gauges {
        if let Some(value) = value {
            single(out, name, "gauge", help, value);
        }
    }
    if let Some(cpu) = stats.cpu_seconds {
        single(
            out,
            "process_cpu_seconds_total",
            "counter",
            "User and system CPU time spent in seconds",
            cpu,
        );
    }
    if let Ok(started) = state.started_at.duration_since(UNIX_EPOCH) {
        single(
            out,
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since the Unix epoch in seconds",
            started.as_secs_f64(),
        );
    }
}

fn render_http_limits(out: &mut String, state: &AppState) {
    single(
        out,
        "pageserver_http_connections",
        "gauge",
        "HTTP connections open now",
        state.connections.open(),
    );
    single(
        out,
        "pageserver_http_connections_max",
        "gauge",
        "The most HTTP connections open at once (max_connections); more wait to be accepted",
        state.connections.max(),
    );
    single(
        out,
        "pageserver_http_request_body_bytes",
        "gauge",
        "Request body bytes reserved by requests being read and handled now",
        state.body_budget.used_bytes(),
    );
    single(
        out,
        "pageserver_http_request_body_budget_bytes",
        "gauge",
        "The most request body bytes reserved at once (max_buffered_request_bytes)",
        state.body_budget.capacity_bytes(),
    );
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
    family(
        out,
        "pageserver_remote_consistent_lsn",
        "gauge",
        "Newest LSN whose versions are all in remote storage (the newest uploaded index)",
    );
    for t in &timelines {
        if let Some(lsn) = t.remote_consistent_lsn() {
            let _ = writeln!(
                out,
                "pageserver_remote_consistent_lsn{{{}}} {}",
                labels(t),
                lsn.0
            );
        }
    }
    family(
        out,
        "pageserver_upload_queue_bytes",
        "gauge",
        "Bytes of committed layer files waiting for upload",
    );
    for tenant in tenants.list_tenants() {
        for t in tenant.list_timelines() {
            if let Some(client) = tenant.remote_client(t.timeline_id()) {
                let _ = writeln!(
                    out,
                    "pageserver_upload_queue_bytes{{{}}} {}",
                    labels(&t),
                    client.queued_bytes()
                );
            }
        }
    }
    let mut counts = String::new();
    let mut sizes = String::new();
    for t in &timelines {
        let layers = t.layers();
        for (kind, name) in [
            (LayerKind::Open, "open"),
            (LayerKind::Frozen, "frozen"),
            (LayerKind::Delta, "delta"),
            (LayerKind::Image, "image"),
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
    let mut levels = String::new();
    for t in &timelines {
        let c = t.layer_counts();
        for (level, n) in [("L0", c.l0), ("L1", c.l1), ("image", c.images)] {
            let _ = writeln!(
                levels,
                "pageserver_layer_files{{{},level=\"{level}\"}} {n}",
                labels(t)
            );
        }
    }
    family(
        out,
        "pageserver_layer_files",
        "gauge",
        "Layer files per timeline by level: L0 (the count ingest backpressure watches), L1, image",
    );
    out.push_str(&levels);
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
    fn cpu_time_is_read_after_the_command_name() {
        // A command name with spaces and a parenthesis; utime 250 and stime 50 ticks.
        let stat = "1234 (page server) x) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 42 1000 500";
        assert_eq!(cpu_seconds(stat), Some(3.0));
        assert_eq!(cpu_seconds("garbage"), None);
    }

    #[test]
    fn this_process_is_readable() {
        let stats = read_process();
        assert!(stats.open_fds.unwrap() >= 3, "{stats:?}");
        assert!(stats.resident_bytes.unwrap() > 1 << 20, "{stats:?}");
        assert!(stats.virtual_bytes.unwrap() >= stats.resident_bytes.unwrap());
        assert!(stats.threads.unwrap() >= 1);
        assert!(stats.cpu_seconds.unwrap() >= 0.0);
        assert_eq!(
            status_kib("Name:\tx\nVmRSS:\t  2048 kB\n", "VmRSS:"),
            Some(2048)
        );
    }
}
