use std::time::{Duration, Instant};

use pageserver_api::value::Patch;
use pageserver_api::DEFAULT_MAX_VALUE_SIZE;

use super::*;
use crate::format::compression::Compression;
use crate::tenant::test_support::*;
use crate::tenant::timeline::layer_set::manifest::METADATA_FILE;

pub(super) const TENANT: TenantId = TenantId::from_bytes([1; 16]);
pub(super) const TIMELINE: TimelineId = TimelineId::from_bytes([2; 16]);

fn conf() -> TimelineConf {
    TimelineConf::default()
}

/// Freezes after a few pages and flushes inline as soon as two layers wait (no flush loop
/// runs): the model test
/// crosses many layer boundaries without any explicit checkpoint.
pub(super) fn small_layers_conf() -> TimelineConf {
    TimelineConf {
        checkpoint_distance: 48 * 1024,
        max_frozen_layers: 1,
        ..TimelineConf::default()
    }
}

/// A new timeline with default settings in a temporary directory, over a cache of
/// `cache_pages` pages: the directory and cache come back too, for reloads and cache checks.
fn fresh_timeline(cache_pages: usize) -> (tempfile::TempDir, Arc<PageCache>, Timeline) {
    fresh_timeline_with(cache_pages, conf())
}

/// [`fresh_timeline`] whose layers store pages as they are: for the tests that count the
/// blocks and reads of 8 KiB values (compressed, the tests' patterned pages take a few bytes).
fn fresh_plain_timeline(cache_pages: usize) -> (tempfile::TempDir, Arc<PageCache>, Timeline) {
    let conf = TimelineConf {
        layer_compression: Compression::Off,
        ..conf()
    };
    fresh_timeline_with(cache_pages, conf)
}

fn fresh_timeline_with(
    cache_pages: usize,
    conf: TimelineConf,
) -> (tempfile::TempDir, Arc<PageCache>, Timeline) {
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(cache_pages);
    let tl = Timeline::create(dir.path(), TENANT, TIMELINE, cache.clone(), conf).unwrap();
    (dir, cache, tl)
}

/// A timeline for threads to share, freezing every `pages_per_layer` pages, with a backlog of
/// two frozen layers before puts flush them.
fn shared_timeline(
    dir: &std::path::Path,
    pages_per_layer: u64,
    cache_pages: usize,
) -> Arc<Timeline> {
    let conf = TimelineConf {
        checkpoint_distance: pages_per_layer * PAGE_SZ as u64,
        max_frozen_layers: 2,
        ..TimelineConf::default()
    };
    Arc::new(Timeline::create(dir, TENANT, TIMELINE, small_cache(cache_pages), conf).unwrap())
}

pub(super) fn image(fill: u8) -> Value {
    Value::Image(Bytes::from(vec![fill; PAGE_SZ]))
}

pub(super) fn rec(k: u32, lsn: u64, value: &Value) -> PutRecord {
    PutRecord {
        key: rel_key(k),
        lsn: Lsn(lsn),
        value: value.clone(),
    }
}

/// The reference answer: the model's versions at or below `lsn`, newest first, down to a base.
pub(super) use crate::tenant::timeline::test_model::expected as expected_page;

#[test]
fn lsn_rules_are_enforced_and_refusals_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let tl = Timeline::create(dir.path(), TENANT, TIMELINE, small_cache(64), conf()).unwrap();
    let v = Value::Image(Bytes::from(vec![1u8; PAGE_SZ]));
    tl.put(rel_key(1), Lsn(10), &v).unwrap();
    assert!(matches!(
        tl.put(rel_key(2), Lsn(9), &v),
        Err(TimelineError::LsnNotAdvancing { .. })
    ));
    assert!(matches!(
        tl.put(rel_key(2), Lsn(10), &v),
        Err(TimelineError::LsnNotAdvancing { .. })
    ));
    assert_eq!(tl.last_record_lsn(), Lsn(10));
    assert!(matches!(
        tl.get_page(rel_key(1), Lsn(11)),
        Err(TimelineError::LsnNotYetIngested { .. })
    ));
    tl.checkpoint().unwrap();
    assert_eq!(tl.disk_consistent_lsn(), Lsn(10));
    assert!(matches!(
        tl.put(rel_key(2), Lsn(10), &v),
        Err(TimelineError::LsnDurable { .. })
    ));
    assert_eq!(
        tl.get_page(rel_key(1), Lsn(10)).unwrap().unwrap().len(),
        PAGE_SZ
    );
    assert_eq!(tl.get_page(rel_key(2), Lsn(10)).unwrap(), None);
}

#[test]
fn a_layer_written_without_its_metadata_update_is_dropped_on_load() {
    // The crash window between a layer's rename and the metadata update: on load the layer is
    // beyond disk_consistent_lsn and is removed, so re-sent versions do not exist twice.
    let (dir, cache, tl) = fresh_timeline(64);
    let v = Value::Image(Bytes::from(vec![1u8; PAGE_SZ]));
    tl.put(rel_key(1), Lsn(10), &v).unwrap();
    tl.checkpoint().unwrap();
    let tl_manifest_before = tl.manifest_snapshot();
    assert_eq!(tl_manifest_before.layers.len(), 1);
    tl.put(rel_key(1), Lsn(20), &v).unwrap();
    tl.checkpoint().unwrap();
    drop(tl);
    // Roll the manifest back to the first checkpoint: the second layer is on disk, unlisted.
    let mut first = Manifest::empty(TENANT, TIMELINE);
    first.disk_consistent_lsn = Lsn(10);
    first.add_layer(tl_manifest_before.layers[0].clone());
    first.store(dir.path()).unwrap();
    std::fs::write(dir.path().join("delta-1-1.___temp"), b"half a layer").unwrap();
    std::fs::write(dir.path().join("ephemeral-99"), b"old values").unwrap();
    let tl = Timeline::load(dir.path(), TENANT, TIMELINE, cache, conf()).unwrap();
    assert_eq!(tl.layer_counts().deltas, 1);
    assert_eq!(tl.last_record_lsn(), Lsn(10));
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(
        names.len(),
        2,
        "only metadata and one layer remain: {names:?}"
    );
    // The client re-sends from 11.
    tl.put(rel_key(1), Lsn(20), &v).unwrap();
}

#[test]
fn a_corrupt_layer_fails_load_with_its_name() {
    let (dir, cache, tl) = fresh_timeline(64);
    tl.put(
        rel_key(1),
        Lsn(10),
        &Value::Image(Bytes::from(vec![1u8; PAGE_SZ])),
    )
    .unwrap();
    tl.checkpoint().unwrap();
    drop(tl);
    let layer = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap() != METADATA_FILE)
        .unwrap();
    let mut bytes = std::fs::read(&layer).unwrap();
    bytes[0] ^= 0xFF;
    std::fs::write(&layer, bytes).unwrap();
    let err = match Timeline::load(dir.path(), TENANT, TIMELINE, cache, conf()) {
        Err(e) => e,
        Ok(_) => panic!("a corrupt layer must fail the load"),
    };
    assert!(
        err.to_string()
            .contains(layer.file_name().unwrap().to_str().unwrap()),
        "{err}"
    );
}

#[test]
fn a_reloaded_timeline_never_builds_on_pages_of_discarded_history() {
    // Found by the model test: the page cache outlives the timeline. Before the crash, page 1
    // at LSN 101 is reconstructed (image + delta) and memorized; the crash discards both
    // versions; the client then sends different versions at the same LSNs.
    let (dir, cache, tl) = fresh_timeline(64);
    let delta = Value::Delta {
        will_init: false,
        patches: vec![Patch::new(0, vec![9u8])],
    };
    tl.put(
        rel_key(1),
        Lsn(100),
        &Value::Image(Bytes::from(vec![1u8; PAGE_SZ])),
    )
    .unwrap();
    tl.put(rel_key(1), Lsn(101), &delta).unwrap();
    let before = tl.get_page(rel_key(1), Lsn(101)).unwrap().unwrap();
    assert_eq!(before[..2], [9, 1]);
    drop(tl);

    let tl = Timeline::load(dir.path(), TENANT, TIMELINE, cache, conf()).unwrap();
    tl.put(
        rel_key(1),
        Lsn(100),
        &Value::Image(Bytes::from(vec![2u8; PAGE_SZ])),
    )
    .unwrap();
    tl.put(rel_key(1), Lsn(101), &delta).unwrap();
    let after = tl.get_page(rel_key(1), Lsn(101)).unwrap().unwrap();
    assert_eq!(
        after[..2],
        [9, 2],
        "served a page built on discarded versions"
    );
}

/// Everything observable about a timeline's contents and positions, to show that a refused
/// batch changed nothing.
fn snapshot(tl: &Timeline, keys: u32) -> (Lsn, Lsn, LayerCounts, Vec<Option<Bytes>>) {
    let last = tl.last_record_lsn();
    let pages = (0..keys)
        .map(|k| tl.get_page(rel_key(k), last).unwrap())
        .collect();
    (last, tl.disk_consistent_lsn(), tl.layer_counts(), pages)
}

#[test]
fn a_refused_batch_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let tl = Timeline::create(dir.path(), TENANT, TIMELINE, small_cache(64), conf()).unwrap();
    tl.put_batch(&[rec(0, 10, &image(1)), rec(1, 10, &image(2))])
        .unwrap();
    let before = snapshot(&tl, 3);
    let too_big = Value::Image(Bytes::from(vec![0u8; DEFAULT_MAX_VALUE_SIZE + 100]));
    // Each patch within the page, the whole over the stored-size limit.
    let too_much_stored = Value::Delta {
        will_init: false,
        patches: vec![Patch::new(0, vec![1u8; DEFAULT_MAX_VALUE_SIZE / 2 + 64]); 2],
    };
    let too_many_patches = Value::Delta {
        will_init: false,
        patches: vec![Patch::new(0, Vec::new()); usize::from(u16::MAX) + 1],
    };
    // Within the stored-size slack, but a page redo would refuse.
    let image_over_page = Value::Image(Bytes::from(vec![0u8; DEFAULT_MAX_VALUE_SIZE + 1]));
    let delta_past_page = Value::Delta {
        will_init: false,
        patches: vec![Patch::new(DEFAULT_MAX_VALUE_SIZE as u32, vec![1u8])],
    };
    let cases: Vec<(Vec<PutRecord>, &str)> = vec![
        (
            vec![rec(2, 20, &image(3)), rec(1, 21, &image_over_page)],
            "would make a page",
        ),
        (
            vec![rec(2, 20, &image(3)), rec(1, 21, &delta_past_page)],
            "would make a page",
        ),
        (
            vec![rec(2, 20, &image(3)), rec(2, 19, &image(3))],
            "goes backwards",
        ),
        (
            vec![rec(2, 20, &image(3)), rec(2, 20, &image(4))],
            "appears twice",
        ),
        (
            vec![rec(2, 20, &image(3)), rec(1, 21, &too_big)],
            "would make a page of 1048676 bytes",
        ),
        (
            vec![rec(2, 20, &image(3)), rec(1, 21, &too_much_stored)],
            "bytes stored, over the limit",
        ),
        (
            vec![rec(2, 20, &image(3)), rec(1, 21, &too_many_patches)],
            "cannot be encoded",
        ),
        (vec![rec(2, 10, &image(3))], "does not advance"),
        (
            vec![
                rec(2, 20, &image(3)),
                PutRecord {
                    key: Key::MAX,
                    lsn: Lsn(20),
                    value: image(3),
                },
            ],
            "is reserved",
        ),
        (
            vec![rec(2, 20, &image(3)), rec(2, u64::MAX, &image(3))],
            "is reserved",
        ),
        (
            vec![rec(2, 20, &image(3)), rec(2, 20 + (1 << 32), &image(3))],
            "more than one layer",
        ),
    ];
    for (batch, message) in cases {
        let err = tl.put_batch(&batch).unwrap_err();
        assert!(err.to_string().contains(message), "{err}");
        assert_eq!(snapshot(&tl, 3), before, "after: {err}");
    }
    // The first record of each refused batch is accepted on its own.
    tl.put_batch(&[rec(2, 20, &image(3))]).unwrap();
    assert_eq!(tl.get_page(rel_key(2), Lsn(20)).unwrap().unwrap()[0], 3);
}

#[test]
fn batches_are_paced_at_the_measured_flush_rate_only_while_the_frozen_layers_are_at_their_bound() {
    let dir = tempfile::tempdir().unwrap();
    // Layers of four pages, one frozen layer allowed; no flush loop: flushes are the test's.
    let conf = TimelineConf {
        checkpoint_distance: 4 * PAGE_SZ as u64,
        max_frozen_layers: 1,
        ..TimelineConf::default()
    };
    let tl = Timeline::create(dir.path(), TENANT, TIMELINE, small_cache(64), conf).unwrap();
    let lsn = std::cell::Cell::new(0u64);
    let next = || {
        lsn.set(lsn.get() + 10);
        [rec(lsn.get() as u32, lsn.get(), &image(lsn.get() as u8))]
    };
    let put = |tl: &Timeline| tl.put_batch_paced(&next()).unwrap();
    // Before any flush there is no rate to pace by: the batch that freezes a layer and those
    // after it are not held.
    for _ in 0..6 {
        assert_eq!(put(&tl), Duration::ZERO);
    }
    assert_eq!(tl.layer_counts().frozen, 1);
    // One flush of a full layer measures the rate; with no layer frozen, nothing is held.
    tl.flush_frozen().unwrap();
    assert_eq!(put(&tl), Duration::ZERO);
    assert_eq!(tl.layer_counts().frozen, 0);
    // The batch that freezes the next layer brings the frozen layers to the bound: it and
    // every batch after it is held, each for about its bytes at the rate, none past MAX_PACE.
    let first = put(&tl);
    assert_eq!(tl.layer_counts().frozen, 1);
    assert!(first > Duration::ZERO && first <= pacing::MAX_PACE);
    let second = put(&tl);
    assert!(second > Duration::ZERO && second <= pacing::MAX_PACE);
    assert_eq!(tl.pacer.held_total(), first + second);
    // Plain put_batch (the WAL receiver's, which answers no one) is stored unpaced.
    let before = tl.pacer.held_total();
    tl.put_batch(&next()).unwrap();
    assert_eq!(tl.pacer.held_total(), before);
    // Flushed again: below the bound, no hold.
    tl.flush_frozen().unwrap();
    assert_eq!(put(&tl), Duration::ZERO);
}

#[test]
fn puts_continue_while_a_flush_is_in_progress_and_wait_for_one_layer_past_the_backlog() {
    let dir = tempfile::tempdir().unwrap();
    let tl = shared_timeline(dir.path(), 3, 64);
    // A flush in progress holds flush_lock for as long as it writes; hold it here instead.
    let flushing = tl.flush_lock.lock().unwrap();
    let writer = std::thread::spawn({
        let tl = tl.clone();
        move || {
            // Each layer freezes at its third page; two frozen layers are within the backlog.
            for lsn in 1..=6u64 {
                tl.put(rel_key(lsn as u32), Lsn(lsn * 10), &image(lsn as u8))
                    .unwrap();
            }
        }
    });
    writer.join().unwrap();
    // Six pages in layers of three: two frozen layers, all readable, nothing flushed yet.
    assert_eq!(tl.layer_counts().frozen, 2);
    assert_eq!(tl.disk_consistent_lsn(), Lsn::INVALID);
    for lsn in 1..=6u64 {
        let page = tl.get_page(rel_key(lsn as u32), Lsn(60)).unwrap().unwrap();
        assert_eq!(page[0], lsn as u8);
    }
    // A third frozen layer is over the backlog: that put waits until the oldest is written.
    let blocked = std::thread::spawn({
        let tl = tl.clone();
        move || {
            for lsn in 7..=9u64 {
                tl.put(rel_key(lsn as u32), Lsn(lsn * 10), &image(lsn as u8))
                    .unwrap();
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while tl.last_record_lsn() < Lsn(90) {
        assert!(Instant::now() < deadline, "the third layer never filled");
        std::thread::yield_now();
    }
    assert!(
        !blocked.is_finished(),
        "a put over the backlog waits for a flush"
    );
    // The flush in progress writes the oldest layer and goes on holding the lock (as the
    // background flush does, for every frozen layer): the put sees the layer written and
    // answers, without waiting for the rest.
    assert!(tl.flush_oldest_frozen(&flushing).unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !blocked.is_finished() {
        assert!(
            Instant::now() < deadline,
            "the put waited for more than one layer"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    blocked.join().unwrap();
    assert_eq!(tl.layer_counts().frozen, 2);
    assert_eq!(tl.disk_consistent_lsn(), Lsn(30));
    drop(flushing);
    // With no flush running, the put over the backlog writes the oldest one itself: one.
    for lsn in 10..=12u64 {
        tl.put(rel_key(lsn as u32), Lsn(lsn * 10), &image(lsn as u8))
            .unwrap();
    }
    assert_eq!(tl.layer_counts().frozen, 2);
    assert_eq!(tl.disk_consistent_lsn(), Lsn(60));
    assert_eq!(tl.layer_counts().deltas, 2);
    for lsn in 1..=12u64 {
        let page = tl.get_page(rel_key(lsn as u32), Lsn(120)).unwrap().unwrap();
        assert_eq!(page[0], lsn as u8);
    }
}

#[test]
fn checkpoint_timeout_freezes_the_open_layer() {
    let dir = tempfile::tempdir().unwrap();
    let conf = TimelineConf {
        checkpoint_timeout: Duration::from_secs(60),
        ..TimelineConf::default()
    };
    let tl = Timeline::create(dir.path(), TENANT, TIMELINE, small_cache(64), conf).unwrap();
    assert!(!tl
        .freeze_if_due(Instant::now() + Duration::from_secs(3600))
        .unwrap());
    tl.put(rel_key(1), Lsn(10), &image(1)).unwrap();
    assert!(!tl.freeze_if_due(Instant::now()).unwrap(), "not due yet");
    assert_eq!(tl.layer_counts().open_values, 1);
    assert!(tl
        .freeze_if_due(Instant::now() + Duration::from_secs(61))
        .unwrap());
    assert_eq!(tl.layer_counts().frozen, 1);
    tl.flush_frozen().unwrap();
    assert_eq!(tl.disk_consistent_lsn(), Lsn(10));
    // The next batch starts a new open layer right after the frozen one.
    tl.put(rel_key(1), Lsn(11), &image(2)).unwrap();
    assert_eq!(tl.get_page(rel_key(1), Lsn(10)).unwrap().unwrap()[0], 1);
    assert_eq!(tl.get_page(rel_key(1), Lsn(11)).unwrap().unwrap()[0], 2);
    let kinds: Vec<LayerKind> = tl.layers().iter().map(|l| l.kind).collect();
    assert_eq!(kinds, [LayerKind::Open, LayerKind::Delta]);
}

/// A runtime for the async `wait_lsn`: one thread, as a test needs no more.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

/// Lets spawned waiters run until `tl` has `n` of them, or fails after a deadline.
async fn until_waiters(tl: &Timeline, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while tl.lsn_waiters() != n {
        assert!(
            Instant::now() < deadline,
            "{} waiters, not {n}",
            tl.lsn_waiters()
        );
        tokio::task::yield_now().await;
    }
}

#[test]
fn wait_lsn_wakes_on_ingest_and_times_out_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let tl =
        Arc::new(Timeline::create(dir.path(), TENANT, TIMELINE, small_cache(64), conf()).unwrap());
    runtime().block_on(async {
        let waiter = tokio::spawn({
            let tl = tl.clone();
            async move { tl.wait_lsn(Lsn(50), Duration::from_secs(30)).await }
        });
        until_waiters(&tl, 1).await;
        tl.put(rel_key(1), Lsn(40), &image(1)).unwrap();
        // Woken, but 40 is not 50: it can only still be waiting.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!waiter.is_finished());
        assert_eq!(tl.lsn_waiters(), 1);
        tl.put(rel_key(1), Lsn(55), &image(2)).unwrap();
        waiter.await.unwrap().unwrap();
        assert_eq!(tl.lsn_waiters(), 0);
        tl.wait_lsn(Lsn(55), Duration::ZERO).await.unwrap();
        let err = tl
            .wait_lsn(Lsn(60), Duration::from_millis(20))
            .await
            .unwrap_err();
        assert!(matches!(
            err,
            TimelineError::WaitLsnTimeout {
                lsn: Lsn(60),
                last_record: Lsn(55),
                ..
            }
        ));
        assert_eq!(tl.lsn_waiters(), 0);
        // A timeout too long to add to now is as good as forever, not a panic.
        let forever = tokio::spawn({
            let tl = tl.clone();
            async move { tl.wait_lsn(Lsn(70), Duration::MAX).await }
        });
        until_waiters(&tl, 1).await;
        tl.put(rel_key(1), Lsn(70), &image(3)).unwrap();
        forever.await.unwrap().unwrap();
    });
}

#[test]
fn waiters_past_the_bound_are_refused_and_dropped_waits_free_their_place() {
    let dir = tempfile::tempdir().unwrap();
    let conf = TimelineConf {
        max_lsn_waiters: 3,
        ..conf()
    };
    let tl =
        Arc::new(Timeline::create(dir.path(), TENANT, TIMELINE, small_cache(8), conf).unwrap());
    runtime().block_on(async {
        let spawn_wait = |lsn: u64| {
            let tl = tl.clone();
            tokio::spawn(async move { tl.wait_lsn(Lsn(lsn), Duration::from_secs(60)).await })
        };
        let waiting: Vec<_> = (0..3).map(|i| spawn_wait(100 + i)).collect();
        until_waiters(&tl, 3).await;
        let err = tl
            .wait_lsn(Lsn(100), Duration::from_secs(60))
            .await
            .unwrap_err();
        assert!(
            matches!(err, TimelineError::TooManyLsnWaiters { limit: 3 }),
            "{err}"
        );
        // A read whose LSN is already there never counts against the bound.
        tl.wait_lsn(Lsn::INVALID, Duration::ZERO).await.unwrap();
        // A client that goes away: its wait ends and its place is free.
        waiting[0].abort();
        until_waiters(&tl, 2).await;
        let late = spawn_wait(100);
        until_waiters(&tl, 3).await;
        // Shutdown ends every wait.
        tl.cancel_lsn_waits();
        for w in waiting.into_iter().skip(1).chain([late]) {
            assert!(matches!(w.await.unwrap(), Err(TimelineError::ShuttingDown)));
        }
        assert_eq!(tl.lsn_waiters(), 0);
        assert!(matches!(
            tl.wait_lsn(Lsn(100), Duration::from_secs(60)).await,
            Err(TimelineError::ShuttingDown)
        ));
    });
}

#[test]
fn concurrent_ingest_reads_and_checkpoints_agree_with_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let tl = shared_timeline(dir.path(), 8, 256);
    const KEYS: u32 = 16;
    const BATCHES: u64 = 300;
    // Version at LSN l of key k is an image filled with (l + k) as u8, so any reader can tell
    // what a page must be at any LSN without sharing the model.
    let fill = |k: u32, lsn: u64| (lsn + u64::from(k)) as u8;
    let writer = std::thread::spawn({
        let tl = tl.clone();
        move || {
            for b in 1..=BATCHES {
                let lsn = b * 10;
                let batch: Vec<PutRecord> = (0..KEYS)
                    .filter(|k| (u64::from(*k) + b) % 3 != 0)
                    .map(|k| rec(k, lsn, &image(fill(k, lsn))))
                    .collect();
                tl.put_batch(&batch).unwrap();
            }
        }
    });
    let checkpointer = std::thread::spawn({
        let tl = tl.clone();
        move || {
            while tl.last_record_lsn() < Lsn(BATCHES * 10) {
                tl.checkpoint().unwrap();
                assert!(tl.disk_consistent_lsn() <= tl.last_record_lsn());
            }
        }
    });
    // Read while both run: the page at LSN l is the newest version at or below l.
    let expected = |k: u32, at: u64| -> Option<u8> {
        (1..=at / 10)
            .rev()
            .find(|b| (u64::from(k) + b) % 3 != 0)
            .map(|b| fill(k, b * 10))
    };
    let mut reads = 0;
    while !writer.is_finished() || reads < 1000 {
        let last = tl.last_record_lsn().0;
        let k = reads % KEYS;
        let at = last.saturating_sub(u64::from(reads) % 50);
        let page = tl.get_page(rel_key(k), Lsn(at)).unwrap();
        assert_eq!(
            page.map(|p| p[PAGE_SZ - 1]),
            expected(k, at),
            "key {k} at {at}"
        );
        reads += 1;
    }
    writer.join().unwrap();
    checkpointer.join().unwrap();
    tl.checkpoint().unwrap();
    assert_eq!(tl.disk_consistent_lsn(), Lsn(BATCHES * 10));
    for k in 0..KEYS {
        let page = tl.get_page(rel_key(k), Lsn(BATCHES * 10)).unwrap();
        assert_eq!(page.map(|p| p[0]), expected(k, BATCHES * 10));
    }
}

#[test]
fn shutdown_flushes_and_refuses_later_puts() {
    let (dir, cache, tl) = fresh_timeline(64);
    tl.put(rel_key(1), Lsn(10), &image(1)).unwrap();
    tl.shutdown(true).unwrap();
    assert_eq!(tl.disk_consistent_lsn(), Lsn(10));
    assert!(matches!(
        tl.put(rel_key(1), Lsn(11), &image(2)),
        Err(TimelineError::ShuttingDown)
    ));
    drop(tl);
    let tl = Timeline::load(dir.path(), TENANT, TIMELINE, cache, conf()).unwrap();
    assert_eq!(tl.get_page(rel_key(1), Lsn(10)).unwrap().unwrap()[0], 1);
}

#[test]
fn read_cost_counts_layers_blocks_and_file_reads() {
    use crate::io::read_cost::{measure, ReadCost};
    let (_dir, cache, tl) = fresh_plain_timeline(64);
    tl.put_batch(&[rec(1, 10, &image(1)), rec(2, 10, &image(2))])
        .unwrap();
    tl.checkpoint().unwrap();
    let delta = Value::Delta {
        will_init: false,
        patches: vec![Patch::new(0, vec![9u8])],
    };
    tl.put(rel_key(1), Lsn(20), &delta).unwrap();
    cache.drop_unpinned();

    // The open layer's delta is in its ephemeral file's tail (memory); the delta layer's index
    // is one leaf (one read, then a hit for the entry above, which says where the value ends,
    // since its first block is not cached either), and the image (8 KiB, a length header, a
    // checksum) spans two blocks, read with one call.
    let (page, cold) = measure(|| tl.get_page(rel_key(1), Lsn(20)));
    assert_eq!(page.unwrap().unwrap()[..2], [9, 1]);
    let expected = ReadCost {
        layers: 2,
        idx_hit: 1,
        idx_miss: 1,
        val_hit: 1,
        val_miss: 2,
        ios: 2,
        bytes: 3 * PAGE_SZ as u64,
        waits: 0,
        downloads: 0,
    };
    assert_eq!(cold, expected);

    // With the index cached, a cold value costs one read of just the blocks it spans that are
    // not cached: key 2's value starts in the block where key 1's ended, read above (and its
    // length header there says where it ends, so the index is not asked). The open layer
    // starts above LSN 10: it is skipped without being asked.
    let (page, value_only) = measure(|| tl.get_page(rel_key(2), Lsn(10)));
    assert_eq!(page.unwrap().unwrap()[0], 2);
    assert_eq!(
        value_only.to_string(),
        "layers=1 idx_hit=1 idx_miss=0 val_hit=1 val_miss=1 ios=1 bytes=8192 waits=0 downloads=0"
    );
    // A key the layer does not hold costs no value block at all.
    let (page, absent) = measure(|| tl.get_page(rel_key(3), Lsn(10)));
    assert_eq!(page.unwrap(), None);
    assert_eq!((absent.val_hit, absent.val_miss, absent.ios), (0, 0, 0));

    // Memorized by that read: no layer has a newer version, so none is asked.
    let (_, materialized) = measure(|| tl.get_page(rel_key(1), Lsn(20)));
    assert_eq!(materialized, ReadCost::default());

    // Below the memorized page: the delta layer again (the open layer starts above LSN 10),
    // everything cached now.
    let (page, hot) = measure(|| tl.get_page(rel_key(1), Lsn(10)));
    assert_eq!(page.unwrap().unwrap()[..2], [1, 1]);
    assert_eq!(
        hot,
        ReadCost {
            layers: 1,
            idx_hit: 1,
            val_hit: 2,
            ..ReadCost::default()
        }
    );
    assert_eq!(
        hot.to_string(),
        "layers=1 idx_hit=1 idx_miss=0 val_hit=2 val_miss=0 ios=0 bytes=0 waits=0 downloads=0"
    );
}

/// A page made from one compressed value is memorized, so the next read neither decompresses
/// it nor reads its value again (the layer, which holds a newer version of another key, is
/// still asked for versions above the memorized one, from its index); a page of one value
/// stored as it is is not memorized (its cached block is the page).
#[test]
fn a_page_made_from_a_compressed_value_is_memorized() {
    use crate::io::read_cost::measure;
    for (compression, memorized) in [
        (Compression::Zstd { level: 1 }, true),
        (Compression::Off, false),
    ] {
        let conf = TimelineConf {
            layer_compression: compression,
            ..conf()
        };
        let (_dir, cache, tl) = fresh_timeline_with(64, conf);
        tl.put(rel_key(1), Lsn(10), &image(3)).unwrap();
        tl.put(rel_key(2), Lsn(20), &image(4)).unwrap();
        tl.checkpoint().unwrap();
        let inserts = cache.stats().materialized_pages.inserts;
        let page = tl.get_page(rel_key(1), Lsn(20)).unwrap().unwrap();
        assert_eq!(page[..], [3u8; PAGE_SZ][..]);
        let inserted = cache.stats().materialized_pages.inserts - inserts;
        assert_eq!(inserted, u64::from(memorized), "{compression}");
        let (again, cost) = measure(|| tl.get_page(rel_key(1), Lsn(20)));
        assert_eq!(again.unwrap().unwrap(), page);
        assert_eq!(cost.layers, 1, "{compression}: {cost}");
        let values_read = cost.val_hit + cost.val_miss;
        assert_eq!(values_read == 0, memorized, "{compression}: {cost}");
    }
}

#[test]
fn a_flush_inserts_nothing_into_the_page_cache_and_hot_pages_stay() {
    use crate::io::read_cost::measure;
    let (_dir, cache, tl) = fresh_timeline(32);
    // The hot set: four pages in a delta layer (an index leaf and two blocks per page).
    let hot: Vec<PutRecord> = (0..4).map(|k| rec(k, 10, &image(k as u8))).collect();
    tl.put_batch(&hot).unwrap();
    tl.checkpoint().unwrap();
    // An open layer twice the cache's size, to be flushed.
    for i in 0..64u32 {
        tl.put(rel_key(100 + i), Lsn(20 + u64::from(i)), &image(i as u8))
            .unwrap();
    }
    let read_hot = || {
        (0..4u32)
            .map(|k| {
                let (page, cost) = measure(|| tl.get_page(rel_key(k), Lsn(10)));
                assert_eq!(page.unwrap().unwrap()[0], k as u8);
                cost
            })
            .collect::<Vec<_>>()
    };
    // Until the hot pages have been read a few times, a newcomer's probation may recycle them.
    let mut rounds = 0;
    while read_hot().iter().any(|cost| cost.ios > 0) {
        rounds += 1;
        assert!(rounds < 10, "the hot set never settled in the cache");
    }
    let inserts = cache.stats().file_pages.inserts;
    tl.checkpoint().unwrap();
    assert_eq!(
        cache.stats().file_pages.inserts,
        inserts,
        "the flush read its ephemeral blocks without inserting them"
    );
    for cost in read_hot() {
        assert_eq!(
            (cost.idx_miss, cost.val_miss, cost.ios),
            (0, 0, 0),
            "{cost}"
        );
    }
}

#[test]
fn lsns_may_jump_by_more_than_a_layer_can_span() {
    let (dir, cache, tl) = fresh_timeline(64);
    // The first version of a new timeline far above 0/1, as real WAL positions are.
    let far = 1u64 << 33;
    tl.put(rel_key(1), Lsn(far), &image(1)).unwrap();
    tl.checkpoint().unwrap();
    // Another jump past a layer's span, from no open layer and from an open one.
    tl.put(rel_key(1), Lsn(2 * far), &image(2)).unwrap();
    tl.put(rel_key(1), Lsn(3 * far), &image(3)).unwrap();
    assert_eq!(tl.layer_counts().frozen, 1, "the open layer rolled over");
    tl.checkpoint().unwrap();
    drop(tl);
    let tl = Timeline::load(dir.path(), TENANT, TIMELINE, cache, conf()).unwrap();
    for (n, at) in [(1u8, far), (2, 2 * far), (3, 3 * far)] {
        assert_eq!(tl.get_page(rel_key(1), Lsn(at)).unwrap().unwrap()[0], n);
    }
    assert_eq!(tl.get_page(rel_key(1), Lsn(far - 1)).unwrap(), None);
    // The layers still meet with no gap (what a load checks): each starts where the one before
    // ended, the first at 0/1, though their first versions lie far above.
    let mut ranges: Vec<std::ops::Range<Lsn>> = tl
        .manifest_snapshot()
        .layers
        .iter()
        .map(|l| {
            l.name
                .parse::<crate::tenant::storage_layer::LayerName>()
                .unwrap()
                .lsn_range()
        })
        .collect();
    ranges.sort_by_key(|r| r.start);
    assert_eq!(ranges.len(), 3);
    assert_eq!(ranges[0].start, Lsn(1));
    assert!(
        ranges.windows(2).all(|w| w[0].end == w[1].start),
        "{ranges:?}"
    );
}

mod batch;
mod import;
mod model;
