//! `virtual_file`: what reading through the table of open files costs, against a plain `pread`
//! of the same bytes in the same run.
//!
//! * `virtual_file/pread_baseline`: `read_exact_at` of one 8 KiB block on a `std::fs::File`
//!   kept open (the file is in the kernel's page cache: this is the syscall and the copy).
//! * `virtual_file/hit`: the same read through a `VirtualFile` that keeps its descriptor: the
//!   slot's read lock and tag check on top of the `pread`.
//! * `virtual_file/reopen`: two files taking turns in a table of one slot, so every read closes
//!   the other file's descriptor and opens its own first: what a read costs when
//!   `max_file_descriptors` is far too small for the layers being read.
//!
//! `hit / pread_baseline` is the price of bounding descriptors on every read that misses the
//! page cache; `reopen / pread_baseline` says how much a thrashing table slows such reads.

use std::fs::File;
use std::hint::black_box;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pageserver::io::virtual_file::open_files::OpenFiles;
use pageserver::io::virtual_file::{FileIo, VirtualFile};
use pageserver::PAGE_SZ;

const BLOCKS: u64 = 64;

fn virtual_file(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let paths: Vec<_> = (0..2)
        .map(|i| {
            let path = dir.path().join(format!("layer-{i}"));
            std::fs::write(&path, vec![i as u8; BLOCKS as usize * PAGE_SZ]).expect("write");
            path
        })
        .collect();
    let mut group = c.benchmark_group("virtual_file");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Bytes(PAGE_SZ as u64));
    let mut buf = vec![0u8; PAGE_SZ];

    let plain = File::open(&paths[0]).expect("open");
    let mut n = 0u64;
    group.bench_function("pread_baseline", |b| {
        b.iter(|| {
            n = (n + 1) % BLOCKS;
            FileExt::read_exact_at(&plain, &mut buf, n * PAGE_SZ as u64).expect("pread");
            black_box(&buf);
        })
    });

    let roomy = Arc::new(OpenFiles::new(16));
    let kept = VirtualFile::open_in(&roomy, &paths[0]).expect("open");
    group.bench_function("hit", |b| {
        b.iter(|| {
            n = (n + 1) % BLOCKS;
            FileIo::read_exact_at(&kept, &mut buf, n * PAGE_SZ as u64).expect("read");
            black_box(&buf);
        })
    });

    let one_slot = Arc::new(OpenFiles::new(1));
    let turns: Vec<VirtualFile> = paths
        .iter()
        .map(|p| VirtualFile::open_in(&one_slot, p).expect("open"))
        .collect();
    group.bench_function("reopen", |b| {
        b.iter(|| {
            n = (n + 1) % BLOCKS;
            let file = &turns[(n % 2) as usize];
            FileIo::read_exact_at(file, &mut buf, n * PAGE_SZ as u64).expect("read");
            black_box(&buf);
        })
    });
    group.finish();
}

criterion_group!(benches, virtual_file);
criterion_main!(benches);
