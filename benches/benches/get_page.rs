//! `get_page`: GetPage@LSN on a timeline with several delta layers, at three temperatures, each
//! against the cost floor of the same answer measured in the same run.
//!
//! The timeline: `KEYS` pages, each an 8 KiB image in the oldest layer and a small delta in
//! each of the `LAYERS - 1` newer ones, every layer flushed to a delta layer file. Reading a
//! page at the newest LSN therefore takes an image and `LAYERS - 1` deltas from `LAYERS` files,
//! and redo. Requests cycle through the keys in a fixed shuffled order.
//!
//! * `get_page/materialized_hit`: the reconstructed page is in the page cache's materialized
//!   pages, so the layers are not read.
//! * `get_page/page_cache_warm`: every index and value block of the layers is in the page
//!   cache, but materialized pages are off: B-tree probes in every layer, value reads, redo.
//! * `get_page/cold`: the page cache is emptied before every request (the kernel's cache still
//!   holds the files: this is our read path, not the disk's).
//!
//! Baselines, same run:
//! * `get_page/copy_baseline`: copying an 8 KiB page out of memory into a new `Bytes`, what
//!   returning any page costs; the floor for `materialized_hit`.
//! * `get_page/pread_baseline`: one `pread` of 8 KiB from a layer file in the kernel's cache
//!   into a new buffer; the floor for a read that misses our cache.

use std::hint::black_box;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;

use benches::uncompressed;
use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use pageserver::page_cache::{PageCache, PageCacheConfig};
use pageserver::tenant::timeline::{PutRecord, Timeline};
use pageserver::PAGE_SZ;
use pageserver_api::value::Patch;
use pageserver_api::{Key, Value};
use utils::{Lsn, TenantId, TimelineId};

const KEYS: u32 = 2000;
const LAYERS: u64 = 4;

fn key(n: u32) -> Key {
    Key::rel_block(1663, 5, 16384, 0, n)
}

/// A timeline in `dir` holding the layers described in the module documentation.
fn build_timeline(dir: &std::path::Path, cache: Arc<PageCache>) -> Timeline {
    let timeline = Timeline::create(
        dir,
        TenantId::from_bytes([1; 16]),
        TimelineId::from_bytes([2; 16]),
        cache,
        uncompressed(),
    )
    .expect("create timeline");
    for layer in 0..LAYERS {
        let lsn = Lsn(0x1000 * (layer + 1));
        let batch: Vec<PutRecord> = (0..KEYS)
            .map(|k| PutRecord {
                key: key(k),
                lsn,
                value: if layer == 0 {
                    Value::Image(Bytes::from(vec![k as u8; PAGE_SZ]))
                } else {
                    Value::Delta {
                        will_init: false,
                        patches: vec![Patch::new(64 * layer as u32, vec![layer as u8; 16])],
                    }
                },
            })
            .collect();
        timeline.put_batch(&batch).expect("put");
        timeline.checkpoint().expect("checkpoint");
    }
    assert_eq!(timeline.layer_counts().deltas, LAYERS as usize);
    timeline
}

fn cache(materialized: bool) -> Arc<PageCache> {
    Arc::new(
        PageCache::new(PageCacheConfig {
            // Room for every block of every layer (about 17 MiB) and every materialized page.
            capacity_bytes: 64 << 20,
            materialized_versions_per_key: if materialized { 4 } else { 0 },
            ..PageCacheConfig::default()
        })
        .expect("page cache"),
    )
}

/// Every key once, in an order that defeats prefetch-friendly sequential access.
fn request_order() -> Vec<Key> {
    let mut order: Vec<u32> = (0..KEYS).collect();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for i in (1..order.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        order.swap(i, (state % (i as u64 + 1)) as usize);
    }
    order.into_iter().map(key).collect()
}

fn expect_page(page: Option<Bytes>) -> Bytes {
    let page = page.expect("every key has a page");
    assert_eq!(page.len(), PAGE_SZ);
    page
}

fn get_page(c: &mut Criterion) {
    let last = Lsn(0x1000 * LAYERS);
    let order = request_order();
    let mut group = c.benchmark_group("get_page");
    group
        .throughput(Throughput::Elements(1))
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));

    let dir = tempfile::tempdir().expect("temp dir");
    let materialized = build_timeline(dir.path(), cache(true));
    for k in &order {
        expect_page(materialized.get_page(*k, last).expect("get_page"));
    }
    let mut next = order.iter().cycle();
    group.bench_function("materialized_hit", |b| {
        b.iter(|| expect_page(materialized.get_page(*next.next().unwrap(), last).unwrap()))
    });
    drop(materialized);

    let dir = tempfile::tempdir().expect("temp dir");
    let warm_cache = cache(false);
    let warm = build_timeline(dir.path(), warm_cache.clone());
    for k in &order {
        expect_page(warm.get_page(*k, last).expect("get_page"));
    }
    group.bench_function("page_cache_warm", |b| {
        b.iter(|| expect_page(warm.get_page(*next.next().unwrap(), last).unwrap()))
    });

    // The same timeline, emptied of cached pages before each request.
    group.bench_function("cold", |b| {
        b.iter_batched(
            || {
                warm_cache.drop_unpinned();
                *next.next().unwrap()
            },
            |k| expect_page(warm.get_page(k, last).unwrap()),
            BatchSize::PerIteration,
        )
    });

    let page = vec![7u8; PAGE_SZ];
    group.bench_function("copy_baseline", |b| {
        b.iter(|| Bytes::copy_from_slice(black_box(&page)))
    });

    let layer_file = std::fs::read_dir(dir.path())
        .expect("timeline dir")
        .map(|e| e.expect("dir entry").path())
        .find(|p| p.file_name().is_some_and(|n| n != "metadata"))
        .expect("a layer file");
    let file = std::fs::File::open(&layer_file).expect("open layer");
    let blocks = file.metadata().expect("stat").len() / PAGE_SZ as u64;
    let mut blkno = 0u64;
    group.bench_function("pread_baseline", |b| {
        b.iter(|| {
            blkno = (blkno + 7919) % blocks;
            let mut buf = vec![0u8; PAGE_SZ];
            file.read_exact_at(&mut buf, blkno * PAGE_SZ as u64)
                .expect("pread");
            Bytes::from(buf)
        })
    });
    group.finish();
}

criterion_group!(benches, get_page);
criterion_main!(benches);
