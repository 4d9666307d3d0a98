//! `write_blob`: appending blobs to an EphemeralFile against the physical limit of appending the
//! same encoding to a `Vec<u8>` in memory, in the same run.
//!
//! * `write_blob/ephemeral/{size}`: a real EphemeralFile in a temp dir with a 64 MiB page cache;
//!   every full block is written with a positional write and pre-warmed into the cache.
//! * `write_blob/ephemeral_nowarm/{size}`: the same, created without pre-warm (as an import's
//!   files are): what the copy of each written block into the page cache costs.
//! * `write_blob/vec_baseline/{size}`: `append_blob_to_vec` into a `Vec<u8>` that is cleared
//!   (keeping its capacity) every 64 MiB so memory stays bounded.
//! * `write_blob/pwrite_baseline/{size}`: the same encoding into one 8 KiB buffer written with a
//!   positional write whenever it fills, to a file in the same temp dir, with no page cache and
//!   no zeroing: what the kernel charges for the bytes, so `ephemeral / pwrite_baseline` is the
//!   cost of our own work (pre-warm, bookkeeping).
//!
//! Variants of the `pwrite` baseline, for what the ephemeral file could change about how it
//! writes (the same encoding, the same 8 KiB blocks unless said otherwise):
//!
//! * `pwrite_fallocate/{size}`: the file's blocks allocated 1 MiB ahead of the writes
//!   (`fallocate` with `FALLOC_FL_KEEP_SIZE`): what preallocating ahead of the tail saves.
//! * `pwrite_overwrite/{size}`: the blocks written over a file already that long (written
//!   untimed first): a write that neither extends the file nor allocates, the floor any
//!   preallocation can reach.
//! * `pwrite_64kib/{size}`, `pwrite_1mib/{size}`: the blocks gathered into 64 KiB or 1 MiB and
//!   written with one positional write each: what writing the file in larger steps saves.
//!
//! Each sample uses a fresh file so the files stay bounded too; creating and removing it is not
//! timed. Throughput is blob payload bytes.

use std::fs::File;
use std::hint::black_box;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pageserver::format::blob_io::{append_blob_to_vec, BlobHeader};
use pageserver::page_cache::{PageCache, PageCacheConfig};
use pageserver::tenant::storage_layer::ephemeral_file::EphemeralFile;
use pageserver::PAGE_SZ;

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

        for (series, pre_warm) in [("ephemeral", true), ("ephemeral_nowarm", false)] {
            group.bench_with_input(BenchmarkId::new(series, size), &blob, |b, blob| {
                b.iter_custom(|iters| {
                    let file = if pre_warm {
                        EphemeralFile::create(dir.path(), cache.clone())
                    } else {
                        EphemeralFile::create_without_pre_warm(dir.path(), cache.clone())
                    }
                    .expect("create");
                    let start = Instant::now();
                    for _ in 0..iters {
                        black_box(file.write_blob(black_box(blob)).expect("write_blob"));
                    }
                    let elapsed = start.elapsed();
                    drop(file);
                    elapsed
                })
            });
        }

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

        for variant in [
            Variant::Baseline,
            Variant::Fallocate,
            Variant::Overwrite,
            Variant::Chunk64KiB,
            Variant::Chunk1MiB,
        ] {
            group.bench_with_input(BenchmarkId::new(variant.name(), size), &blob, |b, blob| {
                b.iter_custom(|iters| {
                    let path = dir.path().join("pwrite-variant");
                    let file = File::create(&path).expect("create");
                    let bytes = iters * (blob.len() as u64 + 4);
                    if variant == Variant::Overwrite {
                        // Untimed: the file as long as the timed writes will make it.
                        let zeros = vec![0u8; 1 << 20];
                        let mut at = 0;
                        while at < bytes + PAGE_SZ as u64 {
                            file.write_all_at(&zeros, at).expect("pre-write");
                            at += zeros.len() as u64;
                        }
                    }
                    let mut file = VariantAppender::new(file, variant);
                    let start = Instant::now();
                    for _ in 0..iters {
                        file.append_blob(black_box(blob));
                    }
                    let elapsed = start.elapsed();
                    drop(file);
                    std::fs::remove_file(&path).expect("remove");
                    elapsed
                })
            });
        }
    }
    group.finish();
}

/// How a [`VariantAppender`] writes its blocks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// The least a file of blobs written block by block can cost: one 8 KiB write per block.
    Baseline,
    Fallocate,
    Overwrite,
    Chunk64KiB,
    Chunk1MiB,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Baseline => "pwrite_baseline",
            Variant::Fallocate => "pwrite_fallocate",
            Variant::Overwrite => "pwrite_overwrite",
            Variant::Chunk64KiB => "pwrite_64kib",
            Variant::Chunk1MiB => "pwrite_1mib",
        }
    }

    /// Bytes written by one positional write.
    fn write_len(self) -> usize {
        match self {
            Variant::Baseline | Variant::Fallocate | Variant::Overwrite => PAGE_SZ,
            Variant::Chunk64KiB => 64 << 10,
            Variant::Chunk1MiB => STEP,
        }
    }
}

/// The blob encoding into a buffer, written at its offset when full, as a [`Variant`] says: no
/// page cache, no zeroing.
struct VariantAppender {
    file: File,
    variant: Variant,
    /// One write's worth: [`Variant::write_len`].
    buf: Vec<u8>,
    used: usize,
    written: u64,
    /// Allocated up to here (`Fallocate`).
    allocated: u64,
}

const STEP: usize = 1 << 20;

impl VariantAppender {
    fn new(file: File, variant: Variant) -> Self {
        VariantAppender {
            file,
            variant,
            buf: vec![0; variant.write_len()],
            used: 0,
            written: 0,
            allocated: 0,
        }
    }

    #[inline]
    fn append_blob(&mut self, blob: &[u8]) {
        let header = BlobHeader::new(blob.len()).expect("blob size");
        self.append(header.as_bytes());
        self.append(blob);
    }

    #[inline]
    fn append(&mut self, mut src: &[u8]) {
        while !src.is_empty() {
            let n = (self.buf.len() - self.used).min(src.len());
            self.buf[self.used..self.used + n].copy_from_slice(&src[..n]);
            self.used += n;
            src = &src[n..];
            if self.used == self.buf.len() {
                if self.variant == Variant::Fallocate && self.written >= self.allocated {
                    fallocate_keep_size(&self.file, self.allocated, STEP as u64);
                    self.allocated += STEP as u64;
                }
                self.file
                    .write_all_at(&self.buf, self.written)
                    .expect("pwrite");
                self.written += self.buf.len() as u64;
                self.used = 0;
            }
        }
    }
}

/// Allocates `len` bytes of `file` from `offset` without changing its size (Linux; elsewhere
/// nothing, and the variant measures plain writes).
#[cfg(not(target_os = "linux"))]
fn fallocate_keep_size(_file: &File, _offset: u64, _len: u64) {}

/// Allocates `len` bytes of `file` from `offset` without changing its size.
#[cfg(target_os = "linux")]
fn fallocate_keep_size(file: &File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain system call on a descriptor this function borrows for its duration.
    let rc = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    assert_eq!(rc, 0, "fallocate: {}", std::io::Error::last_os_error());
}

criterion_group!(benches, write_blob);
criterion_main!(benches);
