//! `ingest`: putting page images into an InMemoryLayer and flushing a frozen layer to a delta
//! layer file, against writing the same bytes to a plain file, in the same run.
//!
//! * `ingest/put/{100B,8KiB}`: `InMemoryLayer::put` of a `Value::Image` of that size, on a real
//!   ephemeral file in a temp dir with a 64 MiB `PageCache`. Keys are blocks of one relation,
//!   cycling over `PUT_KEYS` blocks (so each key collects many versions); LSNs ascend by one
//!   per put. Each sample fills a fresh layer; creating and dropping it is not timed.
//! * `ingest/raw_write/8KiB`: one positional write of the same 8 KiB per iteration, at
//!   ascending offsets of a fresh plain file in the same temp dir. **No fsync**, like the
//!   ephemeral file: what the kernel charges for taking the bytes, the limit for `put/8KiB`.
//! * `ingest/flush/8KiB`: `InMemoryLayer::write_to_disk` of a frozen layer holding
//!   `FLUSH_VALUES` 8 KiB images (`FLUSH_VALUES / 2` keys, two versions each): reading the
//!   values back through the ephemeral file and the page cache, writing values, index and
//!   summary, and the fsync of the file and of the directory that make it durable. The layer
//!   (128 MiB, twice the page cache, so the read-back is not all cache hits) is built before
//!   the timing starts; the delta file is removed after it stops.
//! * `ingest/raw_write_fsync/8KiB`: the same number of 8 KiB positional writes of the same
//!   bytes to a plain file, then one fsync of it, creating the file included (a flush creates
//!   its file too): the limit for `flush/8KiB`, which writes as many value bytes and must make
//!   them durable. No rename and no directory fsync.
//! * `ingest/read_back/8KiB`: the read half of `flush/8KiB` alone: `iter_sorted` over the same
//!   kind of frozen layer, every value read back through the page cache and decoded, nothing
//!   written. `flush - read_back` is roughly what writing the delta file and making it durable
//!   cost.
//!
//! Throughput is value payload bytes: the image's size per put or raw write, `FLUSH_VALUES`
//! times 8 KiB per flush, read-back or fsynced run. `put` and `raw_write` take one iteration
//! per value; `flush`, `read_back` and `raw_write_fsync` take one iteration per 128 MiB run,
//! sampled flat (every sample the same number of runs) to keep each to about ten seconds.

use std::fs::File;
use std::hint::black_box;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use pageserver::format::compression::Compression;
use pageserver::page_cache::{PageCache, PageCacheConfig};
use pageserver::tenant::storage_layer::inmemory_layer::InMemoryLayer;
use pageserver::PAGE_SZ;
use pageserver_api::{Key, Value, DEFAULT_MAX_VALUE_SIZE};
use utils::{Lsn, TenantId, TimelineId};

/// Distinct keys the put benches cycle over.
const PUT_KEYS: u32 = 8192;
/// Values in the layer a flush writes: 128 MiB of 8 KiB images.
const FLUSH_VALUES: u32 = 16384;
const START_LSN: Lsn = Lsn(1);

/// Block `blkno` of one relation.
fn key(blkno: u32) -> Key {
    Key::rel_block(1663, 5, 16384, 0, blkno)
}

fn image(size: usize) -> Value {
    let bytes: Vec<u8> = (0..size).map(|i| i as u8).collect();
    Value::Image(bytes.into())
}

fn new_layer(dir: &Path, cache: &Arc<PageCache>) -> InMemoryLayer {
    InMemoryLayer::create(dir, cache.clone(), START_LSN, DEFAULT_MAX_VALUE_SIZE).expect("layer")
}

/// A frozen layer of `FLUSH_VALUES` copies of `value`, two versions per key.
fn frozen_layer(dir: &Path, cache: &Arc<PageCache>, value: &Value) -> InMemoryLayer {
    let layer = new_layer(dir, cache);
    for i in 0..FLUSH_VALUES {
        let lsn = Lsn(START_LSN.0 + u64::from(i));
        layer
            .put(key(i % (FLUSH_VALUES / 2)), lsn, value)
            .expect("put");
    }
    layer.freeze(Lsn(layer.last_lsn().0 + 1)).expect("freeze");
    layer
}

fn ingest(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = Arc::new(PageCache::new(PageCacheConfig::default()).expect("page cache"));
    let page: Vec<u8> = (0..PAGE_SZ).map(|i| i as u8).collect();
    let mut group = c.benchmark_group("ingest");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);

    for (label, size) in [("100B", 100), ("8KiB", PAGE_SZ)] {
        let value = image(size);
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::new("put", label), &value, |b, value| {
            b.iter_custom(|iters| {
                let layer = new_layer(dir.path(), &cache);
                let start = Instant::now();
                for i in 0..iters {
                    let lsn = Lsn(START_LSN.0 + i);
                    // Truncation intended: cycle over the keys.
                    let blkno = (i % u64::from(PUT_KEYS)) as u32;
                    layer
                        .put(black_box(key(blkno)), lsn, black_box(value))
                        .expect("put");
                }
                let elapsed = start.elapsed();
                drop(layer);
                elapsed
            })
        });
    }

    group.throughput(Throughput::Bytes(PAGE_SZ as u64));
    group.bench_function(BenchmarkId::new("raw_write", "8KiB"), |b| {
        b.iter_custom(|iters| {
            let path = dir.path().join("raw-write");
            let file = File::create(&path).expect("create");
            let start = Instant::now();
            for i in 0..iters {
                file.write_all_at(black_box(&page), i * PAGE_SZ as u64)
                    .expect("pwrite");
            }
            let elapsed = start.elapsed();
            drop(file);
            std::fs::remove_file(&path).expect("remove");
            elapsed
        })
    });

    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .measurement_time(Duration::from_secs(8));
    group.throughput(Throughput::Bytes(u64::from(FLUSH_VALUES) * PAGE_SZ as u64));

    group.bench_function(BenchmarkId::new("raw_write_fsync", "8KiB"), |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let path = dir.path().join("raw-write-fsync");
                let start = Instant::now();
                let file = File::create(&path).expect("create");
                for i in 0..u64::from(FLUSH_VALUES) {
                    file.write_all_at(black_box(&page), i * PAGE_SZ as u64)
                        .expect("pwrite");
                }
                file.sync_all().expect("fsync");
                total += start.elapsed();
                drop(file);
                std::fs::remove_file(&path).expect("remove");
            }
            total
        })
    });

    let value = image(PAGE_SZ);
    let (tenant_id, timeline_id) = (TenantId::generate(), TimelineId::generate());
    group.bench_function(BenchmarkId::new("flush", "8KiB"), |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let layer = frozen_layer(dir.path(), &cache, &value);
                let start = Instant::now();
                let path = layer
                    .write_to_disk(dir.path(), tenant_id, timeline_id, Compression::Off)
                    .expect("write_to_disk")
                    .expect("a non-empty layer")
                    .path;
                total += start.elapsed();
                drop(layer);
                std::fs::remove_file(&path).expect("remove");
            }
            total
        })
    });

    group.bench_function(BenchmarkId::new("read_back", "8KiB"), |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let layer = frozen_layer(dir.path(), &cache, &value);
                let start = Instant::now();
                for entry in layer.iter_sorted() {
                    black_box(entry.expect("read back"));
                }
                total += start.elapsed();
            }
            total
        })
    });
    group.finish();
}

criterion_group!(benches, ingest);
criterion_main!(benches);
