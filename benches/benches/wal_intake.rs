//! `wal_intake`: what the WAL receiver does with every byte a primary streams (decode and check
//! it, write it into its segment file, fsync), per CPU-second of the thread that does it,
//! against the floor of storing the same bytes unchecked, measured in the same run.
//!
//! The stream: 64 MiB of WAL laid over pages and segments as PostgreSQL writes it
//! (`postgres_wal::synthetic`), in the proportions of pgbench's WAL: mostly small heap and
//! index records, a full-page image every twentieth record, a commit every fifth. It is fed in
//! 128 KiB pieces, the most one XLogData message carries.
//!
//! * `wal_intake/decode`: the decoder alone (page headers, record headers, CRC-32C of every
//!   record, keeping none), as the receiver runs it.
//! * `wal_intake/receive`: decode, then write into the timeline's WAL files (`WalStore`,
//!   zero-filled segment files created as the stream reaches them) with an fdatasync every
//!   4 MiB, as the receiver does under a primary that sends faster than it drains.
//! * `wal_intake/store_baseline`: the same pieces `pwrite`n into 16 MiB files (zero-filled
//!   first, as PostgreSQL's own are) and fdatasynced every 4 MiB, nothing checked: the floor of
//!   storing WAL.
//! * `wal_intake/crc_baseline`: one CRC-32C over the bytes: the floor of checking them.
//!
//! Times are the thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), not the wall clock: a
//! throughput here is bytes per CPU-second, and the time fsync waits for the disk is not in it.

use std::hint::black_box;
use std::os::unix::fs::FileExt;
use std::time::Duration;

use benches::thread_cpu_time;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pageserver::walreceiver::wal_store::WalStore;
use postgres_wal::record::RM_HEAP_ID;
use postgres_wal::synthetic::WalBuilder;
use postgres_wal::WalDecoder;
use utils::Lsn;

const SEGMENT: u32 = 16 << 20;
const STREAM: usize = 64 << 20;
const PIECE: usize = 128 << 10;
const FLUSH_EVERY: usize = 4 << 20;
const START: Lsn = Lsn(3 * SEGMENT as u64);
/// PostgreSQL's B-tree resource manager.
const RM_BTREE_ID: u8 = 11;

/// The stream described in the module documentation.
fn stream() -> Vec<u8> {
    let mut wal = WalBuilder::new(START, SEGMENT);
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut n = 0u64;
    while wal.bytes().len() < STREAM {
        n += 1;
        let r = next();
        if n.is_multiple_of(20) {
            wal.main_data_record(RM_HEAP_ID, 0, n as u32, &vec![(r & 0xff) as u8; 8192]);
        } else if n.is_multiple_of(5) {
            wal.commit(n as u32, (r >> 16) as i64 & 0xffff_ffff_ffff);
        } else if r & 1 == 0 {
            wal.main_data_record(RM_HEAP_ID, 0, n as u32, &vec![1u8; 60 + (r % 180) as usize]);
        } else {
            wal.main_data_record(RM_BTREE_ID, 0, n as u32, &vec![2u8; 20 + (r % 40) as usize]);
        }
    }
    let mut bytes = wal.bytes().to_vec();
    bytes.truncate(STREAM);
    bytes
}

/// Runs `f` `iters` times; the thread CPU time it took.
fn cpu_time(iters: u64, mut f: impl FnMut()) -> Duration {
    let start = thread_cpu_time();
    for _ in 0..iters {
        f();
    }
    thread_cpu_time() - start
}

fn decode(bytes: &[u8]) -> usize {
    let mut decoder = WalDecoder::new(START, SEGMENT).keeping_records_up_to(0);
    let mut records = 0;
    for piece in bytes.chunks(PIECE) {
        decoder.feed(piece);
        while let Some(record) = decoder.next_record().expect("the stream decodes") {
            black_box(&record);
            records += 1;
        }
    }
    records
}

fn bench(c: &mut Criterion) {
    let bytes = stream();
    let records = decode(&bytes);
    eprintln!(
        "wal_intake: {} MiB of WAL, {records} records",
        bytes.len() >> 20
    );
    let mut group = c.benchmark_group("wal_intake");
    group.throughput(Throughput::Bytes(bytes.len() as u64));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(20));

    group.bench_function("decode", |b| {
        b.iter_custom(|iters| {
            cpu_time(iters, || {
                black_box(decode(&bytes));
            })
        })
    });

    group.bench_function("receive", |b| {
        b.iter_custom(|iters| {
            let mut took = Duration::ZERO;
            for _ in 0..iters {
                let dir = tempfile::tempdir().expect("tempdir");
                took += cpu_time(1, || {
                    let (mut store, _) = WalStore::open(dir.path(), SEGMENT).expect("open");
                    store.start_at(START);
                    let mut decoder = WalDecoder::new(START, SEGMENT).keeping_records_up_to(0);
                    let mut lsn = START;
                    let mut unflushed = 0;
                    for piece in bytes.chunks(PIECE) {
                        decoder.feed(piece);
                        while decoder.next_record().expect("decodes").is_some() {}
                        store.write(1, lsn, piece).expect("write");
                        lsn = Lsn(lsn.0 + piece.len() as u64);
                        unflushed += piece.len();
                        if unflushed >= FLUSH_EVERY {
                            store.flush().expect("flush");
                            unflushed = 0;
                        }
                    }
                    store.flush().expect("flush");
                });
            }
            took
        })
    });

    group.bench_function("store_baseline", |b| {
        b.iter_custom(|iters| {
            let mut took = Duration::ZERO;
            for _ in 0..iters {
                let dir = tempfile::tempdir().expect("tempdir");
                took += cpu_time(1, || {
                    let mut file: Option<std::fs::File> = None;
                    let mut unflushed = 0;
                    for (i, piece) in bytes.chunks(PIECE).enumerate() {
                        let at = (i * PIECE) as u64;
                        let offset = at % u64::from(SEGMENT);
                        if offset == 0 {
                            if let Some(f) = file.take() {
                                f.sync_data().expect("fsync");
                            }
                            // Zero-filled first, as PostgreSQL, pg_receivewal and the
                            // receiver make their segment files.
                            let f = std::fs::File::create(dir.path().join(format!("{i}")))
                                .expect("create");
                            let zeros = vec![0u8; 1 << 20];
                            for at in (0..u64::from(SEGMENT)).step_by(zeros.len()) {
                                f.write_all_at(&zeros, at).expect("zero-fill");
                            }
                            file = Some(f);
                        }
                        let f = file.as_ref().expect("a file");
                        f.write_all_at(piece, offset).expect("write");
                        unflushed += piece.len();
                        if unflushed >= FLUSH_EVERY {
                            f.sync_data().expect("fsync");
                            unflushed = 0;
                        }
                    }
                    if let Some(f) = file {
                        f.sync_data().expect("fsync");
                    }
                });
            }
            took
        })
    });

    group.bench_function("crc_baseline", |b| {
        b.iter_custom(|iters| {
            cpu_time(iters, || {
                black_box(utils::crc32c::crc32c(&bytes));
            })
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
