//! The timeline against a reference model: random puts, batches, gets at random LSNs,
//! checkpoints, background flushes, crash-restarts, compactions, image creations and GC passes,
//! every answer checked against a `BTreeMap` of every version (reads below the GC cutoff must
//! be refused, never answered).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use pageserver_api::value::Patch;
use proptest::prelude::*;

use super::*;

#[derive(Debug, Clone)]
enum Op {
    Image(u32, u8, usize),
    Delta(u32, bool, u32, Vec<u8>),
    /// Images of several keys at one LSN, in one batch.
    Batch(Vec<u32>, u8),
    Get(u32, u64),
    /// One `get_pages` batch of (key, LSNs back from the last).
    GetBatch(Vec<(u32, u64)>),
    Checkpoint,
    /// The background flush loop's work: freeze by age, then flush.
    Background,
    Restart,
    /// L0 → L1 compaction of every L0 (if two or more).
    Compact,
    /// Image creation, by the triggers or forced.
    Images(bool),
    Gc,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u32..6, any::<u8>(), prop_oneof![Just(PAGE_SZ), 0usize..20_000])
            .prop_map(|(k, fill, len)| Op::Image(k, fill, len)),
        5 => (0u32..6, prop::bool::weighted(0.1), 0u32..9000, prop::collection::vec(any::<u8>(), 0..64))
            .prop_map(|(k, w, off, data)| Op::Delta(k, w, off, data)),
        1 => (prop::collection::btree_set(0u32..6, 1..5), any::<u8>())
            .prop_map(|(keys, fill)| Op::Batch(keys.into_iter().collect(), fill)),
        6 => (0u32..7, 0u64..60).prop_map(|(k, back)| Op::Get(k, back)),
        2 => prop::collection::vec((0u32..7, 0u64..60), 1..12).prop_map(Op::GetBatch),
        1 => Just(Op::Checkpoint),
        1 => Just(Op::Background),
        1 => Just(Op::Restart),
        1 => Just(Op::Compact),
        1 => any::<bool>().prop_map(Op::Images),
        1 => Just(Op::Gc),
    ]
}

/// Small layers, L1s and images of a few pages, and a GC horizon of about ten puts: every
/// change to the layer set happens many times in a sequence.
fn model_conf() -> TimelineConf {
    TimelineConf {
        compaction_target_size: 24 * 1024,
        image_creation_threshold: 2,
        gc_horizon: 20,
        ..small_layers_conf()
    }
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(64);
    let mut tl =
        Timeline::create(dir.path(), TENANT, TIMELINE, cache.clone(), model_conf()).unwrap();
    let mut model: BTreeMap<(Key, Lsn), Value> = BTreeMap::new();
    let mut next_lsn = 100u64;
    for op in ops {
        match op {
            Op::Image(k, fill, len) => {
                let v = Value::Image(Bytes::from(vec![fill; len]));
                tl.put(rel_key(k), Lsn(next_lsn), &v).unwrap();
                model.insert((rel_key(k), Lsn(next_lsn)), v);
                next_lsn += 2;
            }
            Op::Delta(k, will_init, offset, data) => {
                let v = Value::Delta {
                    will_init,
                    patches: vec![Patch::new(offset, data)],
                };
                tl.put(rel_key(k), Lsn(next_lsn), &v).unwrap();
                model.insert((rel_key(k), Lsn(next_lsn)), v);
                next_lsn += 2;
            }
            Op::Batch(keys, fill) => {
                let v = image(fill);
                let batch: Vec<PutRecord> = keys.iter().map(|k| rec(*k, next_lsn, &v)).collect();
                tl.put_batch(&batch).unwrap();
                for r in batch {
                    model.insert((r.key, r.lsn), r.value);
                }
                next_lsn += 2;
            }
            Op::Get(k, back) => {
                let last = tl.last_record_lsn();
                // LSNs on and between versions, and before the first one.
                let at = Lsn(last.0.saturating_sub(back));
                let cutoff = tl.gc_cutoff_lsn();
                if at < cutoff {
                    let refused = tl.get_page(rel_key(k), at);
                    prop_assert!(
                        matches!(refused, Err(TimelineError::BelowGcCutoff { .. })),
                        "key {} at {} below the cutoff {}: {:?}",
                        k,
                        at,
                        cutoff,
                        refused
                    );
                    continue;
                }
                let got = tl.get_page(rel_key(k), at).unwrap();
                prop_assert_eq!(
                    got,
                    expected_page(&model, rel_key(k), at),
                    "key {} at {}",
                    k,
                    at
                );
            }
            Op::GetBatch(reads) => {
                let last = tl.last_record_lsn();
                let batch: Vec<(Key, Lsn)> = reads
                    .iter()
                    .map(|(k, back)| (rel_key(*k), Lsn(last.0.saturating_sub(*back))))
                    .collect();
                let cutoff = tl.gc_cutoff_lsn();
                let answer = tl.get_pages(&batch);
                // The batch is checked whole: one read below the cutoff refuses it all.
                if batch.iter().any(|(_, at)| *at < cutoff) {
                    prop_assert!(
                        matches!(answer, Err(TimelineError::BelowGcCutoff { .. })),
                        "{:?} with the cutoff at {}: {:?}",
                        batch,
                        cutoff,
                        answer
                    );
                    continue;
                }
                let pages = answer.unwrap();
                prop_assert_eq!(pages.len(), batch.len());
                for ((key, at), page) in batch.iter().zip(pages) {
                    prop_assert_eq!(page, expected_page(&model, *key, *at), "{} at {}", key, at);
                }
            }
            Op::Checkpoint => {
                tl.checkpoint().unwrap();
                prop_assert_eq!(tl.disk_consistent_lsn(), tl.last_record_lsn());
            }
            Op::Background => {
                let later = Instant::now() + Duration::from_secs(3600);
                if tl.freeze_if_due(later).unwrap() {
                    tl.flush_frozen().unwrap();
                }
                prop_assert_eq!(tl.layer_counts().frozen, 0);
                prop_assert_eq!(tl.layer_counts().open_values, 0);
            }
            Op::Compact => {
                let l0 = tl.layer_counts().l0;
                let outcome = tl.compact_l0(2).unwrap();
                let expected = if l0 < 2 || outcome.waiting_for_images {
                    0
                } else {
                    l0.min(32)
                };
                prop_assert_eq!(outcome.inputs, expected);
            }
            Op::Images(force) => {
                tl.create_images(force).unwrap();
            }
            Op::Gc => {
                let before = tl.gc_cutoff_lsn();
                let outcome = tl.gc(&[]).unwrap();
                prop_assert!(outcome.cutoff >= before);
                prop_assert!(outcome.cutoff <= tl.disk_consistent_lsn());
            }
            Op::Restart => {
                // A crash: nothing is flushed. The timeline comes back at disk_consistent_lsn,
                // with the GC cutoff it had.
                let durable = tl.disk_consistent_lsn();
                let cutoff = tl.gc_cutoff_lsn();
                drop(tl);
                tl = Timeline::load(dir.path(), TENANT, TIMELINE, cache.clone(), model_conf())
                    .unwrap();
                prop_assert_eq!(tl.disk_consistent_lsn(), durable);
                prop_assert_eq!(tl.gc_cutoff_lsn(), cutoff);
                prop_assert_eq!(tl.last_record_lsn(), durable);
                model.retain(|(_, lsn), _| *lsn <= durable);
                next_lsn = next_lsn.max(durable.0 + 1);
            }
        }
    }
    // Everything the model holds reads back at the last LSN.
    let last = tl.last_record_lsn();
    for k in 0..7 {
        prop_assert_eq!(
            tl.get_page(rel_key(k), last).unwrap(),
            expected_page(&model, rel_key(k), last)
        );
    }
    // The layer set holds its whole history, and losing any one delta layer whose versions a
    // read at or above the GC cutoff may need is seen (`manifest::history`).
    let manifest = tl.manifest_snapshot();
    if let Err(e) = manifest::history::check(&manifest) {
        return Err(TestCaseError::fail(format!("{e}: {manifest:?}")));
    }
    for entry in &manifest.layers {
        let lsns = entry
            .name
            .parse::<crate::tenant::storage_layer::LayerName>()
            .unwrap()
            .lsn_range();
        if entry.level == LayerLevel::Image || lsns.end.0 - 1 <= manifest.gc_cutoff_lsn.0 {
            continue;
        }
        let mut lost = manifest.clone();
        lost.retire_layer(&entry.name);
        lost.retired.clear();
        prop_assert!(
            manifest::history::check(&lost).is_err(),
            "without {}: {:?}",
            entry.name,
            manifest
        );
    }
    Ok(())
}

fn op_count() -> usize {
    std::env::var("TIMELINE_MODEL_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random puts, gets at random LSNs, checkpoints, crash-restarts, compactions, image
    /// creations and GC passes against a BTreeMap.
    /// `TIMELINE_MODEL_OPS` sets the length of each sequence (120 by default).
    #[test]
    fn matches_a_btreemap_model_across_checkpoints_and_restarts(
        ops in prop::collection::vec(op(), 1..op_count())
    ) {
        run(ops)?;
    }
}
