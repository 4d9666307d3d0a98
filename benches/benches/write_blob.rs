//! `write_blob`: appending blobs to an EphemeralFile against the physical limit of appending the
//! same encoding to a `Vec<u8>` in memory, in the same run.
//!
//! * `write_blob/ephemeral/{size}`: a real EphemeralFile in a temp dir with a 64 MiB page cache;
//!   every full block is written with a positional write and pre-warmed into the cache.
//! * `write_blob/vec_baseline/{size}`: `append_blob_to_vec` into a `Vec<u8>` that is cleared
//!   (keeping its capacity) every 64 MiB so memory stays bounded.
//!
//! Each sample uses a fresh file so the files stay bounded too; creating and removing it is not
//! timed. Throughput is blob payload bytes.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pageserver::page_cache::{PageCache, PageCacheConfig};
use pageserver::tenant::blob_io::append_blob_to_vec;
use pageserver::tenant::ephemeral_file::EphemeralFile;

const SIZES: [usize; 5] = [1, 100, 1000, 8192, 20000];
const VEC_RESET_BYTES: usize = 64 << 20;

fn write_blob(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = Arc::new(PageCache::new(PageCacheConfig::default()).expect("page cache"));
    let mut group = c.benchmark_group("write_blob");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));

    for size in SIZES {
        let blob: Vec<u8> = (0..size).map(|i| i as u8).collect();
        group.throughput(Throughput::Bytes(size as u64));

        group.bench_with_input(BenchmarkId::new("ephemeral", size), &blob, |b, blob| {
            b.iter_custom(|iters| {
                let mut file = EphemeralFile::create(dir.path(), cache.clone()).expect("create");
                let start = Instant::now();
                for _ in 0..iters {
                    black_box(file.write_blob(black_box(blob)).expect("write_blob"));
                }
                let elapsed = start.elapsed();
                drop(file);
                elapsed
            })
        });

        group.bench_with_input(BenchmarkId::new("vec_baseline", size), &blob, |b, blob| {
            let mut buf: Vec<u8> = Vec::with_capacity(VEC_RESET_BYTES + 32 * 1024);
            b.iter(|| {
                if buf.len() >= VEC_RESET_BYTES {
                    buf.clear();
                }
                append_blob_to_vec(&mut buf, black_box(blob)).expect("append");
                black_box(buf.len())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, write_blob);
criterion_main!(benches);
