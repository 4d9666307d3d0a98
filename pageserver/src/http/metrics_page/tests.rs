//! The page rendered from a real state (a tenant manager on a temporary directory with the
//! local directory store as remote storage): every family once, under its name, type and
//! labels; values that agree with the timelines; series that go with their timeline.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use pageserver_api::Value;
use remote_storage::{RemoteStorage, RemoteStorageConfig};
use utils::Lsn;

use super::MetricsPage;
use crate::config::PageServerConf;
use crate::http::{AppState, SharedState};
use crate::tenant::mgr::TenantManager;
use crate::tenant::remote_timeline_client::RemoteContext;
use crate::tenant::test_support::{rel_key, small_cache};
use crate::tenant::timeline::{PutRecord, Timeline, TimelineConf};
use crate::PAGE_SZ;

fn state(dir: &Path) -> SharedState {
    let storage = RemoteStorage::new(&RemoteStorageConfig::local_dir(dir.join("remote"))).unwrap();
    let remote = Arc::new(RemoteContext::new(storage, 1 << 30, 0).unwrap());
    let cache = small_cache(64);
    let (tenants, _) = TenantManager::load_with_remote(
        &dir.join("work"),
        cache.clone(),
        TimelineConf::default(),
        Some(remote),
    )
    .unwrap();
    let conf = PageServerConf::default();
    Arc::new(AppState::new(conf, Arc::new(tenants), cache, None))
}

/// Two images at `lsn`, flushed into an L0 delta layer.
fn ingest_and_flush(timeline: &Timeline, lsn: u64) {
    let batch: Vec<PutRecord> = (0..2)
        .map(|k| PutRecord {
            key: rel_key(k),
            lsn: Lsn(lsn),
            value: Value::Image(Bytes::from(vec![k as u8; PAGE_SZ])),
        })
        .collect();
    timeline.put_batch(&batch).unwrap();
    timeline.checkpoint().unwrap();
}

/// A rendered page, read back: each family's type and help, and its samples.
struct Page {
    text: String,
    /// By family name: (type, help).
    families: BTreeMap<String, (String, String)>,
}

impl Page {
    fn parse(text: String) -> Page {
        let mut families = BTreeMap::new();
        let mut helps = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').unwrap();
                assert!(
                    helps.insert(name.to_owned(), help.to_owned()).is_none(),
                    "{line}"
                );
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                let help = helps.get(name).cloned().unwrap_or_default();
                let fresh = families.insert(name.to_owned(), (kind.to_owned(), help));
                assert!(fresh.is_none(), "a second family named {name}");
            }
        }
        Page { text, families }
    }

    /// The samples named `name` whose labels include `labels`: their labels and value.
    fn samples(&self, name: &str, labels: &[(&str, &str)]) -> Vec<(BTreeMap<String, String>, f64)> {
        self.text
            .lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(|line| {
                let (series, value) = line.rsplit_once(' ').unwrap();
                let (sample_name, labels) = match series.split_once('{') {
                    Some((n, rest)) => (n, rest.strip_suffix('}').unwrap()),
                    None => (series, ""),
                };
                (sample_name == name).then(|| {
                    let labels: BTreeMap<String, String> = labels
                        .split(',')
                        .filter(|pair| !pair.is_empty())
                        .map(|pair| {
                            let (k, v) = pair.split_once('=').unwrap();
                            (k.to_owned(), v.trim_matches('"').to_owned())
                        })
                        .collect();
                    (labels, value.parse().unwrap())
                })
            })
            .filter(|(found, _)| {
                labels
                    .iter()
                    .all(|(k, v)| found.get(*k).map(String::as_str) == Some(*v))
            })
            .collect()
    }

    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let found = self.samples(name, labels);
        assert_eq!(found.len(), 1, "{name}{labels:?}: {found:?}");
        found[0].1
    }
}

/// Every family read at scrape time, with its type and label names, as docs/http-api.md lists
/// them (the process ones under the names Prometheus client libraries use).
const READ_AT_SCRAPE: &[(&str, &str, &[&str])] = &[
    ("pageserver_page_cache_hits_total", "counter", &["kind"]),
    ("pageserver_page_cache_misses_total", "counter", &["kind"]),
    ("pageserver_page_cache_inserts_total", "counter", &["kind"]),
    (
        "pageserver_page_cache_evictions_total",
        "counter",
        &["kind"],
    ),
    ("pageserver_page_cache_resident_bytes", "gauge", &["kind"]),
    ("pageserver_page_cache_capacity_bytes", "gauge", &[]),
    ("pageserver_page_cache_pinned_pages", "gauge", &[]),
    (
        "pageserver_page_cache_inserts_refused_total",
        "counter",
        &[],
    ),
    (
        "pageserver_page_cache_inserts_duplicate_total",
        "counter",
        &[],
    ),
    ("pageserver_page_cache_miss_waits_total", "counter", &[]),
    ("pageserver_scan_cursor_cache_lookups_total", "counter", &[]),
    ("pageserver_scan_cursor_cache_hits_total", "counter", &[]),
    ("pageserver_scan_cursor_cache_misses_total", "counter", &[]),
    ("pageserver_scan_cursor_cache_drops_total", "counter", &[]),
    ("pageserver_scan_cursor_cache_inserts_total", "counter", &[]),
    (
        "pageserver_scan_cursor_cache_evictions_total",
        "counter",
        &["reason"],
    ),
    ("pageserver_scan_cursor_cache_cursors", "gauge", &[]),
    ("pageserver_scan_cursor_cache_bytes", "gauge", &[]),
    ("pageserver_scan_cursor_cache_capacity_bytes", "gauge", &[]),
    (
        "pageserver_last_record_lsn",
        "gauge",
        &["tenant_id", "timeline_id"],
    ),
    (
        "pageserver_disk_consistent_lsn",
        "gauge",
        &["tenant_id", "timeline_id"],
    ),
    (
        "pageserver_remote_consistent_lsn",
        "gauge",
        &["tenant_id", "timeline_id"],
    ),
    (
        "pageserver_upload_queue_bytes",
        "gauge",
        &["tenant_id", "timeline_id"],
    ),
    (
        "pageserver_layers",
        "gauge",
        &["tenant_id", "timeline_id", "kind"],
    ),
    (
        "pageserver_layer_files",
        "gauge",
        &["tenant_id", "timeline_id", "level"],
    ),
    (
        "pageserver_layer_bytes",
        "gauge",
        &["tenant_id", "timeline_id", "kind"],
    ),
    ("pageserver_build_info", "gauge", &["version", "features"]),
    ("pageserver_http_connections", "gauge", &[]),
    ("pageserver_http_connections_max", "gauge", &[]),
    ("pageserver_http_request_body_bytes", "gauge", &[]),
    ("pageserver_http_request_body_budget_bytes", "gauge", &[]),
    ("process_open_fds", "gauge", &[]),
    ("process_max_fds", "gauge", &[]),
    ("process_resident_memory_bytes", "gauge", &[]),
    ("process_virtual_memory_bytes", "gauge", &[]),
    ("process_threads", "gauge", &[]),
    ("process_cpu_seconds_total", "counter", &[]),
    ("process_start_time_seconds", "gauge", &[]),
];

#[test]
fn every_family_once_under_its_name_type_and_labels() {
    crate::metrics::register_all(Duration::from_secs(60));
    let dir = tempfile::tempdir().unwrap();
    let state = state(dir.path());
    let timeline = state
        .tenants
        .create_tenant(None)
        .unwrap()
        .create_timeline(None)
        .unwrap();
    ingest_and_flush(&timeline, 0x20);
    let page = MetricsPage::new(&state);
    let parsed = Page::parse(page.render());

    for (name, kind, labels) in READ_AT_SCRAPE {
        let (found_kind, help) = parsed
            .families
            .get(*name)
            .unwrap_or_else(|| panic!("no family {name}"));
        assert_eq!(found_kind, kind, "{name}");
        assert!(!help.is_empty(), "{name}");
        let samples = parsed.samples(name, &[]);
        assert!(!samples.is_empty(), "{name}");
        for (found, _) in samples {
            let names: BTreeSet<&str> = found.keys().map(String::as_str).collect();
            assert_eq!(names, labels.iter().copied().collect(), "{name}");
        }
    }
    // The registry's statics are on the same page, and no name is in both registries.
    assert_eq!(
        parsed.families["pageserver_ingest_records_total"].0,
        "counter"
    );
    assert_eq!(parsed.families["pageserver_getpage_seconds"].0, "histogram");
    let registered: BTreeSet<String> = prometheus::gather()
        .iter()
        .map(|f| f.name().to_owned())
        .collect();
    for family in page.read_at_scrape.gather() {
        assert!(
            !registered.contains(family.name()),
            "{} in both",
            family.name()
        );
    }
    // Families are in name order, each once (Page::parse checks), every sample under one.
    let order: Vec<&String> = parsed.families.keys().collect();
    let on_page: Vec<&str> = parsed
        .text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split_once(' ').unwrap().0)
        .collect();
    assert_eq!(order, on_page);
    for line in parsed.text.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap();
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| {
                name.strip_suffix(suffix)
                    .filter(|f| parsed.families.contains_key(*f))
            })
            .unwrap_or(name);
        assert!(parsed.families.contains_key(family), "{line}");
    }
}

#[test]
fn timeline_values_agree_with_the_timeline() {
    let dir = tempfile::tempdir().unwrap();
    let state = state(dir.path());
    let tenant = state.tenants.create_tenant(None).unwrap();
    let timeline = tenant.create_timeline(None).unwrap();
    ingest_and_flush(&timeline, 0x20);
    // Above the flushed layer, an open one.
    timeline
        .put_batch(&[PutRecord {
            key: rel_key(9),
            lsn: Lsn(0x30),
            value: Value::Image(Bytes::from(vec![9; PAGE_SZ])),
        }])
        .unwrap();
    let page = MetricsPage::new(&state);
    let (tenant_id, timeline_id) = (tenant.id().to_string(), timeline.timeline_id().to_string());
    let ids = [
        ("tenant_id", tenant_id.as_str()),
        ("timeline_id", timeline_id.as_str()),
    ];
    let with = |extra: (&'static str, &'static str)| [ids[0], ids[1], extra];

    let parsed = Page::parse(page.render());
    assert_eq!(parsed.value("pageserver_last_record_lsn", &ids), 48.0);
    assert_eq!(parsed.value("pageserver_disk_consistent_lsn", &ids), 32.0);
    let layers = timeline.layers();
    for (kind, count) in [
        ("open", 1.0),
        ("frozen", 0.0),
        ("delta", 1.0),
        ("image", 0.0),
    ] {
        assert_eq!(
            parsed.value("pageserver_layers", &with(("kind", kind))),
            count,
            "{kind}"
        );
    }
    let delta_bytes = layers
        .iter()
        .find(|l| l.file_name.is_some())
        .unwrap()
        .size_bytes;
    assert!(delta_bytes > 0);
    assert_eq!(
        parsed.value("pageserver_layer_bytes", &with(("kind", "delta"))),
        delta_bytes as f64
    );
    assert!(parsed.value("pageserver_layer_bytes", &with(("kind", "open"))) > 0.0);
    assert_eq!(
        parsed.value("pageserver_layer_files", &with(("level", "L0"))),
        1.0
    );
    assert_eq!(
        parsed.value("pageserver_layer_files", &with(("level", "L1"))),
        0.0
    );
    // The flush's upload: the remote LSN reaches the disk's, and the queue drains.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let parsed = Page::parse(page.render());
        let remote = parsed.value("pageserver_remote_consistent_lsn", &ids);
        let queued = parsed.value("pageserver_upload_queue_bytes", &ids);
        if remote == 32.0 && queued == 0.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "remote LSN {remote}, {queued} bytes queued"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn series_go_with_their_timeline() {
    let dir = tempfile::tempdir().unwrap();
    let state = state(dir.path());
    let kept = state.tenants.create_tenant(None).unwrap();
    let kept_timeline = kept.create_timeline(None).unwrap();
    let deleted_timeline = kept.create_timeline(None).unwrap();
    let detached = state.tenants.create_tenant(None).unwrap();
    let detached_timeline = detached.create_timeline(None).unwrap();
    for timeline in [&kept_timeline, &deleted_timeline, &detached_timeline] {
        ingest_and_flush(timeline, 0x20);
    }
    let page = MetricsPage::new(&state);
    let per_timeline: Vec<&str> = READ_AT_SCRAPE
        .iter()
        .filter(|(_, _, labels)| labels.contains(&"timeline_id"))
        .map(|(name, _, _)| *name)
        .collect();
    // Every per-timeline family's series, by the timelines they name.
    let series_of = |page: &Page| -> BTreeMap<&str, BTreeSet<String>> {
        per_timeline
            .iter()
            .map(|name| {
                let timelines = page
                    .samples(name, &[])
                    .into_iter()
                    .map(|(labels, _)| labels["timeline_id"].clone())
                    .collect();
                (*name, timelines)
            })
            .collect()
    };
    let all: BTreeSet<String> = [&kept_timeline, &deleted_timeline, &detached_timeline]
        .iter()
        .map(|t| t.timeline_id().to_string())
        .collect();
    let before = Page::parse(page.render());
    for (name, timelines) in series_of(&before) {
        assert_eq!(timelines, all, "{name}");
    }

    kept.delete_timeline(deleted_timeline.timeline_id())
        .unwrap();
    state.tenants.detach_tenant(detached.id()).unwrap();
    let after = Page::parse(page.render());
    let only_kept: BTreeSet<String> = [kept_timeline.timeline_id().to_string()].into();
    for (name, timelines) in series_of(&after) {
        assert_eq!(timelines, only_kept, "{name}");
    }
    assert!(!after.text.contains(&detached.id().to_string()));

    // With no timeline left, the per-timeline families are left out, not listed empty.
    state.tenants.delete_tenant(kept.id()).unwrap();
    let empty = Page::parse(page.render());
    for name in per_timeline {
        assert!(!empty.families.contains_key(name), "{name}");
    }
    assert!(empty
        .families
        .contains_key("pageserver_page_cache_hits_total"));
}
