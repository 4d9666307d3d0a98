//! `metrics_page`: what one scrape of `/metrics` costs the server, by how many timelines it
//! holds, against the registry's counters and histograms alone in the same run.
//!
//! A real `TenantManager` with remote storage (the local directory backend), ten timelines a
//! tenant, each with an L0 delta layer (a checkpoint) and an open layer above it, so every
//! per-timeline family has its series: the LSNs, the upload queue, the layers by kind and level.
//!
//! * `metrics_page/<n>_timelines/registered_baseline`: the default registry gathered and
//!   encoded as text: the statics of `metrics.rs`, which every scrape renders whatever the
//!   state; the same work for every `n`.
//! * `metrics_page/<n>_timelines/page`: the whole page, as `GET /metrics` renders it.
//!
//! `page - registered_baseline` is what reading the state at scrape time costs; divided by
//! `n`, what a timeline adds to a scrape.
//!
//! Both measure the rendering thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), not the time on
//! the wall: a scrape runs on the one thread that asks, and on a machine shared with builds the
//! wall clock mostly measures waits for a core.
//!
//! `cargo bench -p benches --bench metrics_page` (about two minutes, half of it creating the
//! timelines).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use benches::{thread_cpu_time, uncompressed};
use criterion::Bencher;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use pageserver::config::PageServerConf;
use pageserver::http::metrics_page::MetricsPage;
use pageserver::http::AppState;
use pageserver::page_cache::{PageCache, PageCacheConfig};
use pageserver::tenant::mgr::TenantManager;
use pageserver::tenant::remote_timeline_client::RemoteContext;
use pageserver::tenant::timeline::{PutRecord, TimelineConf};
use pageserver::PAGE_SZ;
use pageserver_api::{Key, Value};
use prometheus::{Encoder, TextEncoder};
use remote_storage::{RemoteStorage, RemoteStorageConfig};
use utils::Lsn;

const TIMELINES_PER_TENANT: usize = 10;

fn key(n: u32) -> Key {
    Key::rel_block(1663, 5, 16384, 0, n)
}

/// A server state holding `timelines` timelines, under `dir`.
fn state_with(dir: &std::path::Path, timelines: usize) -> Arc<AppState> {
    let conf = PageServerConf::default();
    let cache = Arc::new(
        PageCache::new(PageCacheConfig {
            capacity_bytes: 16 << 20,
            ..PageCacheConfig::default()
        })
        .expect("page cache"),
    );
    let storage = RemoteStorage::new(&RemoteStorageConfig::local_dir(dir.join("remote")))
        .expect("remote storage");
    let remote = Arc::new(RemoteContext::new(storage, 1 << 30, 0).expect("remote context"));
    let timeline_conf = TimelineConf {
        // Only the checkpoints below flush.
        checkpoint_distance: 1 << 40,
        ..uncompressed()
    };
    let (tenants, _) = TenantManager::load_with_remote(
        &dir.join("work"),
        cache.clone(),
        timeline_conf,
        Some(remote),
    )
    .expect("tenant manager");
    let page = Bytes::from(vec![0x5a; PAGE_SZ]);
    let put = |lsn: u64, n: u32| PutRecord {
        key: key(n),
        lsn: Lsn(lsn),
        value: Value::Image(page.clone()),
    };
    let mut tenant = None;
    for i in 0..timelines {
        if i % TIMELINES_PER_TENANT == 0 {
            tenant = Some(tenants.create_tenant(None).expect("tenant"));
        }
        let timeline = tenant
            .as_ref()
            .expect("made above")
            .create_timeline(None)
            .expect("timeline");
        timeline
            .put_batch(&[put(0x10, 1), put(0x20, 2)])
            .expect("ingest");
        timeline.checkpoint().expect("checkpoint");
        timeline.put_batch(&[put(0x30, 3)]).expect("ingest");
    }
    Arc::new(AppState::new(conf, Arc::new(tenants), cache, None))
}

/// Runs `render` as criterion asks, reporting the CPU time it took on this thread.
fn cpu_time_of(b: &mut Bencher, mut render: impl FnMut() -> String) {
    b.iter_custom(|iters| {
        let started = thread_cpu_time();
        for _ in 0..iters {
            black_box(render());
        }
        thread_cpu_time() - started
    })
}

fn registered_only() -> String {
    let mut out = Vec::new();
    TextEncoder::new()
        .encode(&prometheus::gather(), &mut out)
        .expect("the text encoder writes to a Vec");
    String::from_utf8(out).expect("the text format is UTF-8")
}

fn metrics_page_bench(c: &mut Criterion) {
    pageserver::metrics::register_all(Duration::from_secs(60));
    for timelines in [100, 1000] {
        let dir = tempfile::tempdir().expect("temp dir");
        let state = state_with(dir.path(), timelines);
        let metrics_page = MetricsPage::new(&state);
        let page = metrics_page.render();
        let series = page
            .lines()
            .filter(|l| l.starts_with("pageserver_last_record_lsn{"))
            .count();
        assert_eq!(series, timelines, "one LSN series a timeline");
        eprintln!(
            "{timelines} timelines: a page of {} bytes, {} lines",
            page.len(),
            page.lines().count()
        );

        let mut group = c.benchmark_group(format!("metrics_page/{timelines}_timelines"));
        group
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(5));
        group.bench_function("registered_baseline", |b| cpu_time_of(b, registered_only));
        group.bench_function("page", |b| cpu_time_of(b, || metrics_page.render()));
        group.finish();
        state.tenants.shutdown().expect("shutdown");
    }
}

criterion_group!(benches, metrics_page_bench);
criterion_main!(benches);
