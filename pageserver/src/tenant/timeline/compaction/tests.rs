//! Compaction against a reference model: every answer the same before and after, on reload,
//! and after a compaction that fails midway.

use pageserver_api::value::Patch;

use super::*;
use crate::tenant::test_support::*;
use crate::tenant::timeline::test_model::*;

#[test]
fn compaction_keeps_every_answer_and_a_read_visits_one_l1() {
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(256);
    let tl = Timeline::create(dir.path(), TENANT, TIMELINE, cache.clone(), conf()).unwrap();
    let mut model = Model::new();
    ingest(&tl, &mut model, 12);
    assert_eq!(tl.layer_counts().l0, 12);
    check_all(&tl, &model);
    // Without the pages memorized by the reads above, which would spare the walk.
    cache.drop_unpinned();
    let (_, before) =
        crate::io::read_cost::measure(|| tl.get_page(rel_key(3), tl.last_record_lsn()));

    let outcome = tl.compact_l0(2).unwrap();
    assert_eq!(outcome.inputs, 12);
    let counts = tl.layer_counts();
    assert_eq!((counts.l0, counts.l1), (0, outcome.outputs));
    assert!(outcome.outputs >= 3, "{outcome:?}");
    // The L0 files are gone (no reader held them), the L1s are what the manifest lists.
    let listed: Vec<String> = tl
        .manifest_snapshot()
        .layers
        .iter()
        .map(|l| l.name.clone())
        .collect();
    assert_eq!(layer_files(dir.path()), listed);
    assert!(tl
        .manifest_snapshot()
        .layers
        .iter()
        .all(|l| l.level == LayerLevel::L1));
    check_all(&tl, &model);
    cache.drop_unpinned();
    let (_, after) =
        crate::io::read_cost::measure(|| tl.get_page(rel_key(3), tl.last_record_lsn()));
    assert!(before.layers >= 4, "{before}");
    assert_eq!(after.layers, 1, "{after}");

    // More flushes on top, compacted again: a second run of L1s above the first.
    ingest(&tl, &mut model, 5);
    assert_eq!(tl.compact_l0(2).unwrap().inputs, 5);
    check_all(&tl, &model);
    drop(tl);
    let tl = Timeline::load(dir.path(), TENANT, TIMELINE, small_cache(256), conf()).unwrap();
    assert_eq!(tl.layer_counts().l0, 0);
    check_all(&tl, &model);
    // Nothing to do, and one L0 is not compacted alone.
    assert_eq!(tl.compact_l0(2).unwrap(), CompactionOutcome::default());
    ingest(&tl, &mut model, 1);
    assert_eq!(tl.compact_l0(2).unwrap().inputs, 0);
    check_all(&tl, &model);
}

#[test]
fn a_reader_keeps_a_compacted_layer_readable_until_it_lets_go() {
    let dir = tempfile::tempdir().unwrap();
    let tl = Timeline::create(dir.path(), TENANT, TIMELINE, small_cache(256), conf()).unwrap();
    let mut model = Model::new();
    ingest(&tl, &mut model, 3);
    // A read in progress: it holds the layer map of before the compaction.
    let (_, layers) = tl.scan_layers(tl.last_record_lsn()).unwrap();
    let before = layer_files(dir.path());
    tl.compact_l0(2).unwrap();
    for layer in &layers {
        let key = rel_key(1);
        layer.layer.get(key, tl.last_record_lsn()).unwrap();
    }
    // The retired L0s are still there for it, and the manifest names them as retired.
    assert!(before.iter().all(|n| dir.path().join(n).exists()));
    assert_eq!(tl.manifest_snapshot().retired.len(), 3);
    drop(layers);
    assert!(before.iter().all(|n| !dir.path().join(n).exists()));
    // The next commit drops the names of files already gone.
    ingest(&tl, &mut model, 1);
    assert!(tl.manifest_snapshot().retired.is_empty());
    check_all(&tl, &model);
}

#[test]
fn a_compaction_that_fails_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let tl = Timeline::create(dir.path(), TENANT, TIMELINE, small_cache(256), conf()).unwrap();
    let mut model = Model::new();
    ingest(&tl, &mut model, 4);
    let before = layer_files(dir.path());
    // An input damaged on disk: the merge stops with its error, outputs written so far are
    // removed, and the L0s stay.
    let victim = dir.path().join(&before[1]);
    let mut bytes = std::fs::read(&victim).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xFF;
    std::fs::write(&victim, &bytes).unwrap();
    tl.compact_l0(2).unwrap_err();
    assert_eq!(layer_files(dir.path()), before);
    assert_eq!(tl.layer_counts().l0, 4);
    assert!(tl.manifest_snapshot().retired.is_empty());
}

#[test]
fn at_the_l0_stop_threshold_a_few_batches_wait_and_more_are_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let conf = TimelineConf {
        compaction_threshold: 2,
        l0_slowdown_threshold: 2,
        l0_stop_threshold: 3,
        ..conf()
    };
    // A wakeup no loop listens to: nothing compacts until the test does.
    let tl = Timeline::create(dir.path(), TENANT, TIMELINE, small_cache(256), conf)
        .unwrap()
        .with_compaction_wakeup(Arc::new(utils::Wakeup::new()));
    let mut model = Model::new();
    ingest(&tl, &mut model, 3);
    assert_eq!(tl.layer_counts().l0, 3);
    let base = tl.last_record_lsn().0;
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        for n in 0..=MAX_L0_STOP_WAITERS as u64 {
            let (tl, done_tx) = (&tl, done_tx.clone());
            s.spawn(move || {
                let record = PutRecord {
                    key: rel_key(1),
                    lsn: Lsn(base + 1 + n),
                    value: small_delta(1),
                };
                done_tx.send(tl.put_batch(&[record])).unwrap();
            });
        }
        // One more than may wait: it is refused without waiting for compaction.
        let first = done_rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .unwrap();
        assert!(
            matches!(first, Err(TimelineError::IngestStopped { .. })),
            "{first:?}"
        );
        // The others wait until compaction makes room, then go through (in whatever order
        // they get there, so a later LSN may have gone first).
        assert!(done_rx
            .recv_timeout(std::time::Duration::from_millis(300))
            .is_err());
        tl.compact_l0(2).unwrap();
        for _ in 0..MAX_L0_STOP_WAITERS {
            let result = done_rx
                .recv_timeout(std::time::Duration::from_secs(30))
                .unwrap();
            assert!(
                matches!(result, Ok(()) | Err(TimelineError::LsnNotAdvancing { .. })),
                "{result:?}"
            );
        }
    });
}

#[test]
fn compaction_ends_long_delta_chains_with_the_page_they_make() {
    let dir = tempfile::tempdir().unwrap();
    let tl = Timeline::create(dir.path(), TENANT, TIMELINE, small_cache(256), conf()).unwrap();
    let mut model = Model::new();
    // Every key: an image, then 40 small deltas over four L0 layers.
    put_all(&tl, &mut model, |k| {
        Value::Image(Bytes::from(vec![k as u8; PAGE_SZ]))
    });
    for _ in 0..4 {
        let mut lsn = tl.last_record_lsn().0;
        for round in 0..10u8 {
            let batch: Vec<PutRecord> = (0..KEYS)
                .map(|k| {
                    lsn += 1;
                    let value = Value::Delta {
                        will_init: false,
                        patches: vec![Patch::new(u32::from(round) * 8, vec![round; 8])],
                    };
                    model.insert((rel_key(k), Lsn(lsn)), value.clone());
                    PutRecord {
                        key: rel_key(k),
                        lsn: Lsn(lsn),
                        value,
                    }
                })
                .collect();
            tl.put_batch(&batch).unwrap();
        }
        tl.checkpoint().unwrap();
    }
    let outcome = tl.compact_l0(2).unwrap();
    // Deltas 16 and 32 of each key's 40.
    assert_eq!(outcome.materialized, 2 * u64::from(KEYS), "{outcome:?}");
    check_all(&tl, &model);
    // A read of the latest page takes at most the 15 deltas since the last materialized one.
    let last = tl.last_record_lsn();
    for layer in tl.layer_map().below_l0.iter() {
        let found = layer.get(rel_key(3), last).unwrap();
        assert!(
            found.records.len() <= MATERIALIZE_AFTER_DELTAS,
            "{}",
            found.records.len()
        );
    }
}

#[test]
fn compaction_waits_for_images_once_l1s_stack_to_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let conf = TimelineConf {
        image_creation_threshold: 1,
        ..conf()
    };
    assert_eq!(policy::l1_stack_limit(&conf), 2);
    let tl = Timeline::create(dir.path(), TENANT, TIMELINE, small_cache(256), conf).unwrap();
    let mut model = Model::new();
    for _ in 0..2 {
        ingest(&tl, &mut model, 2);
        assert_eq!(tl.compact_l0(2).unwrap().inputs, 2);
    }
    ingest(&tl, &mut model, 2);
    let waiting = tl.compact_l0(2).unwrap();
    assert!(
        waiting.waiting_for_images && waiting.inputs == 0,
        "{waiting:?}"
    );
    assert_eq!(tl.layer_counts().l0, 2);
    check_all(&tl, &model);
    // Images over the two runs: compaction goes on.
    assert!(tl.create_images(false).unwrap().layers_written > 0);
    let outcome = tl.compact_l0(2).unwrap();
    assert!(
        !outcome.waiting_for_images && outcome.inputs == 2,
        "{outcome:?}"
    );
    check_all(&tl, &model);
}

#[test]
fn image_creation_ends_the_wait_even_where_l1s_only_span_a_piece() {
    let dir = tempfile::tempdir().unwrap();
    let conf = TimelineConf {
        image_creation_threshold: 1,
        ..conf()
    };
    let tl = Timeline::create(dir.path(), TENANT, TIMELINE, small_cache(256), conf).unwrap();
    let mut model = Model::new();
    ingest(&tl, &mut model, 2);
    tl.compact_l0(2).unwrap();
    // Images of every key, in several pieces.
    assert!(tl.create_images(true).unwrap().layers_written >= 3);
    // Runs that update only the first and the last key: their L1s span every piece between,
    // holding none of its keys.
    for _ in 0..2 {
        for _ in 0..2 {
            let mut lsn = tl.last_record_lsn().0;
            let batch: Vec<PutRecord> = [0, KEYS - 1]
                .into_iter()
                .map(|k| {
                    lsn += 1;
                    model.insert((rel_key(k), Lsn(lsn)), small_delta(k));
                    PutRecord {
                        key: rel_key(k),
                        lsn: Lsn(lsn),
                        value: small_delta(k),
                    }
                })
                .collect();
            tl.put_batch(&batch).unwrap();
            tl.checkpoint().unwrap();
        }
        tl.compact_l0(2).unwrap();
    }
    ingest(&tl, &mut model, 2);
    assert!(tl.compact_l0(2).unwrap().waiting_for_images);
    tl.create_images(false).unwrap();
    let outcome = tl.compact_l0(2).unwrap();
    assert!(
        !outcome.waiting_for_images && outcome.inputs == 2,
        "{outcome:?}"
    );
    check_all(&tl, &model);
}
