//! The layer shared between one putting thread and reading threads.

use std::fs::OpenOptions;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{mpsc, Barrier};
use std::time::{Duration, Instant};

use super::*;
use crate::format::block_io::block_offset;
use crate::io::virtual_file::testing::hold_write_at;
use crate::page_cache::FileId;
use crate::tenant::storage_layer::ephemeral_file::EphemeralFile;

/// How long a test waits for something that should happen at once before it fails.
const DEADLINE: Duration = Duration::from_secs(10);

/// What `get(key, lsn)` must return according to `model`: the versions at or below `lsn`,
/// newest first, down to and including the first base, and whether one was reached.
fn expected_get(
    model: &BTreeMap<(Key, Lsn), Value>,
    key: Key,
    lsn: Lsn,
) -> (Vec<(Lsn, Value)>, bool) {
    let mut expected = Vec::new();
    for ((_, version_lsn), value) in model.range((key, Lsn(0))..=(key, lsn)).rev() {
        expected.push((*version_lsn, value.clone()));
        if value.will_init() {
            return (expected, true);
        }
    }
    (expected, false)
}

#[test]
fn is_send_and_sync() {
    fn shared_between_threads<T: Send + Sync>() {}
    shared_between_threads::<InMemoryLayer>();
}

#[test]
fn a_get_does_not_wait_for_a_put_writing_a_block() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ephemeral-held");
    let inner = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    let (held, hold) = hold_write_at(inner, block_offset(0));
    let file = EphemeralFile::from_parts(FileId::next(), path, Box::new(held), small_cache(16));
    let l = InMemoryLayer::with_file(file, Lsn(10), DEFAULT_MAX_VALUE_SIZE);
    l.put(rel_key(1), Lsn(10), &image(1, 100)).unwrap();
    l.put(rel_key(2), Lsn(11), &image(2, 100)).unwrap();
    l.put(rel_key(2), Lsn(12), &delta(false, 0, b"x")).unwrap();
    // Blocks 0 to 6 full, block 7 partly: the next full page fills the first run of blocks.
    l.put(rel_key(3), Lsn(12), &image(4, 7 * PAGE_SZ + 2000))
        .unwrap();
    let before = (l.len(), l.last_lsn(), l.distinct_keys());

    std::thread::scope(|s| {
        // Moved in here: a failing assertion drops it, which releases the put.
        let hold = hold;
        let l = &l;
        // A page image fills block 7: its put seals the block, which fills the run, and the
        // run's write is held.
        let putter = s.spawn(|| l.put(rel_key(2), Lsn(20), &image(3, PAGE_SZ)));
        hold.wait_until_reached();

        let (done_tx, done_rx) = mpsc::channel();
        s.spawn(move || {
            let other_key = l.get(rel_key(1), Lsn(20)).unwrap();
            let same_key_below = l.get(rel_key(2), Lsn(19)).unwrap();
            let same_key_at = l.get(rel_key(2), Lsn(20)).unwrap();
            let keys = l.versions_at_lsn(Key::MIN, Key::MAX, Lsn(20), 10).keys();
            let counts = (l.len(), l.last_lsn(), l.distinct_keys());
            let _ = done_tx.send((other_key, same_key_below, same_key_at, keys, counts));
        });
        let (other_key, same_key_below, same_key_at, keys, counts) = done_rx
            .recv_timeout(DEADLINE)
            .expect("the reads finished while the put's block write was held");
        assert!(!putter.is_finished(), "the put's block write is still held");

        assert_eq!(other_key.records, [(Lsn(10), image(1, 100))]);
        assert!(other_key.complete);
        let below = [(Lsn(12), delta(false, 0, b"x")), (Lsn(11), image(2, 100))];
        assert_eq!(same_key_below.records, below);
        assert!(same_key_below.complete);
        // The put is not in the index until its blob is written.
        assert_eq!(same_key_at.records, below);
        assert_eq!(keys, [rel_key(1), rel_key(2), rel_key(3)]);
        assert_eq!(counts, before);

        hold.release();
        putter.join().unwrap().unwrap();
    });
    let got = l.get(rel_key(2), Lsn(20)).unwrap();
    assert_eq!(got.records, [(Lsn(20), image(3, PAGE_SZ))]);
    assert_eq!((l.len(), l.last_lsn()), (5, Lsn(20)));
}

#[test]
fn concurrent_puts_are_serialized() {
    let dir = tempfile::tempdir().unwrap();
    let l = layer(dir.path());
    let threads = 4u32;
    let per_thread = 50u32;
    let start = Barrier::new(threads as usize);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (l, start) = (&l, &start);
            s.spawn(move || {
                start.wait();
                for i in 0..per_thread {
                    // One LSN for all: LSNs may repeat across keys, so no put is refused.
                    l.put(rel_key(t * 1000 + i), Lsn(10), &image(t as u8, i as usize))
                        .unwrap();
                }
            });
        }
    });
    assert_eq!(l.len(), (threads * per_thread) as usize);
    assert_eq!(l.distinct_keys(), (threads * per_thread) as usize);
    for t in 0..threads {
        for i in 0..per_thread {
            let got = l.get(rel_key(t * 1000 + i), Lsn(10)).unwrap();
            assert_eq!(got.records, [(Lsn(10), image(t as u8, i as usize))]);
        }
    }

    // The same version from two threads at once: one is stored, the other is a duplicate.
    let race = Barrier::new(2);
    let results: Vec<_> = std::thread::scope(|s| {
        let racers: Vec<_> = (0..2u8)
            .map(|fill| {
                let (l, race) = (&l, &race);
                s.spawn(move || {
                    race.wait();
                    l.put(rel_key(7), Lsn(11), &image(fill, 10))
                })
            })
            .collect();
        racers.into_iter().map(|r| r.join().unwrap()).collect()
    });
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1);
    assert!(results
        .iter()
        .any(|r| matches!(r, Err(PutError::Duplicate { .. }))));
    assert_eq!(l.get(rel_key(7), Lsn(11)).unwrap().records.len(), 1);
}

/// A random workload of `n` puts in strictly increasing LSN order, so that an LSN reported
/// done covers every put at or below it.
fn workload(rng: &mut fastrand::Rng, n: usize) -> Vec<(Key, Lsn, Value)> {
    let mut lsn = 10;
    (0..n)
        .map(|_| {
            let key = rel_key(rng.u32(..12));
            let value = match rng.u8(..20) {
                0..=5 => image(rng.u8(..), rng.usize(..300)),
                6..=7 => image(rng.u8(..), PAGE_SZ),
                8 => image(rng.u8(..), rng.usize(PAGE_SZ..20_000)),
                9..=10 => delta(true, rng.u32(..8000), &[rng.u8(..); 40]),
                _ => delta(false, rng.u32(..8000), &[rng.u8(..); 20]),
            };
            lsn += rng.u64(1..=3);
            (key, Lsn(lsn), value)
        })
        .collect()
}

#[test]
fn gets_match_a_model_while_a_writer_puts() {
    // Values of every size, so blocks are sealed and written all the time, and a cache small
    // enough that readers also read blocks back from disk.
    const MIN_PUTS: usize = 200;
    const BUDGET: Duration = Duration::from_millis(300);
    const READERS: u64 = 2;
    let mut rng = fastrand::Rng::with_seed(0x5eed);
    let workload = workload(&mut rng, 5000);
    let model: BTreeMap<(Key, Lsn), Value> = workload
        .iter()
        .map(|(key, lsn, value)| ((*key, *lsn), value.clone()))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(4);
    let l =
        InMemoryLayer::create(dir.path(), cache.clone(), Lsn(10), DEFAULT_MAX_VALUE_SIZE).unwrap();
    // The LSN of the last put that returned; 0 before the first.
    let done_lsn = AtomicU64::new(0);
    let writer_done = AtomicBool::new(false);
    let checks = AtomicUsize::new(0);
    let put = std::thread::scope(|s| {
        for seed in 0..READERS {
            let (l, model, done_lsn, writer_done, checks) =
                (&l, &model, &done_lsn, &writer_done, &checks);
            s.spawn(move || {
                let mut rng = fastrand::Rng::with_seed(seed);
                let mut mine = 0;
                // A few checks after the writer is done too, in case it ran through first.
                while !writer_done.load(Ordering::Acquire) || mine < 20 {
                    let done = done_lsn.load(Ordering::Acquire);
                    let lsn = Lsn(rng.u64(8..=done.max(8)));
                    if rng.u8(..16) == 0 {
                        let got = l.versions_at_lsn(Key::MIN, Key::MAX, lsn, 100).keys();
                        let mut expected: Vec<Key> = model
                            .keys()
                            .filter(|(_, v)| *v <= lsn)
                            .map(|(k, _)| *k)
                            .collect();
                        expected.dedup();
                        assert_eq!(got, expected, "keys at {lsn}");
                    } else {
                        let key = rel_key(rng.u32(..12));
                        let got = l.get(key, lsn).unwrap();
                        let (records, complete) = expected_get(model, key, lsn);
                        assert_eq!(got.records, records, "{key} at {lsn}");
                        assert_eq!(got.complete, complete, "{key} at {lsn}");
                    }
                    mine += 1;
                }
                checks.fetch_add(mine, Ordering::Relaxed);
            });
        }
        let started = Instant::now();
        let mut put = 0;
        for (key, lsn, value) in &workload {
            if put >= MIN_PUTS && started.elapsed() > BUDGET {
                break;
            }
            l.put(*key, *lsn, value).unwrap();
            done_lsn.store(lsn.0, Ordering::Release);
            put += 1;
            if put % 100 == 0 {
                cache.drop_unpinned();
            }
        }
        writer_done.store(true, Ordering::Release);
        put
    });
    assert!(checks.into_inner() >= 20 * READERS as usize);
    // Everything put reads back at the end.
    assert_eq!(l.len(), put);
    let last = workload[put - 1].1;
    for k in 0..12 {
        let got = l.get(rel_key(k), last).unwrap();
        let (records, complete) = expected_get(&model, rel_key(k), last);
        assert_eq!((got.records, got.complete), (records, complete));
    }
}
