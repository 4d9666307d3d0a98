use std::collections::BTreeMap;

use pageserver_api::value::Patch;
use pageserver_api::DEFAULT_MAX_VALUE_SIZE;
use proptest::prelude::*;

use super::*;
use crate::tenant::test_support::*;

const TENANT: TenantId = TenantId::from_bytes([1; 16]);
const TIMELINE: TimelineId = TimelineId::from_bytes([2; 16]);

fn conf() -> TimelineConf {
    TimelineConf {
        max_value_size: DEFAULT_MAX_VALUE_SIZE,
    }
}

/// The reference answer: the model's versions at or below `lsn`, newest first, down to a base.
fn expected_page(model: &BTreeMap<(Key, Lsn), Value>, k: Key, lsn: Lsn) -> Option<Bytes> {
    let mut records = Vec::new();
    for ((_, v_lsn), v) in model.range((k, Lsn(0))..=(k, lsn)).rev() {
        records.push((*v_lsn, v.clone()));
        if v.will_init() {
            break;
        }
    }
    reconstruct_page(&records, DEFAULT_MAX_VALUE_SIZE).unwrap()
}

#[derive(Debug, Clone)]
enum Op {
    Image(u32, u8, usize),
    Delta(u32, bool, u32, Vec<u8>),
    Get(u32, u64),
    Checkpoint,
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u32..6, any::<u8>(), prop_oneof![Just(PAGE_SZ), 0usize..20_000])
            .prop_map(|(k, fill, len)| Op::Image(k, fill, len)),
        5 => (0u32..6, prop::bool::weighted(0.1), 0u32..9000, prop::collection::vec(any::<u8>(), 0..64))
            .prop_map(|(k, w, off, data)| Op::Delta(k, w, off, data)),
        6 => (0u32..7, 0u64..60).prop_map(|(k, back)| Op::Get(k, back)),
        1 => Just(Op::Checkpoint),
        1 => Just(Op::Restart),
    ]
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(64);
    let mut tl = Timeline::create(dir.path(), TENANT, TIMELINE, cache.clone(), conf()).unwrap();
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
            Op::Get(k, back) => {
                let last = tl.last_record_lsn();
                // LSNs on and between versions, and before the first one.
                let at = Lsn(last.0.saturating_sub(back));
                let got = tl.get_page(rel_key(k), at).unwrap();
                prop_assert_eq!(
                    got,
                    expected_page(&model, rel_key(k), at),
                    "key {} at {}",
                    k,
                    at
                );
            }
            Op::Checkpoint => {
                tl.checkpoint().unwrap();
                prop_assert_eq!(tl.disk_consistent_lsn(), tl.last_record_lsn());
            }
            Op::Restart => {
                // A crash: nothing is flushed. The timeline comes back at disk_consistent_lsn.
                let durable = tl.disk_consistent_lsn();
                drop(tl);
                tl = Timeline::load(dir.path(), TENANT, TIMELINE, cache.clone(), conf()).unwrap();
                prop_assert_eq!(tl.disk_consistent_lsn(), durable);
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

    /// Random puts, gets at random LSNs, checkpoints and crash-restarts against a BTreeMap.
    /// `TIMELINE_MODEL_OPS` sets the length of each sequence (120 by default).
    #[test]
    fn matches_a_btreemap_model_across_checkpoints_and_restarts(
        ops in prop::collection::vec(op(), 1..op_count())
    ) {
        run(ops)?;
    }
}

#[test]
fn lsn_rules_are_enforced_and_refusals_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let tl = Timeline::create(dir.path(), TENANT, TIMELINE, small_cache(64), conf()).unwrap();
    let v = Value::Image(Bytes::from(vec![1u8; PAGE_SZ]));
    tl.put(rel_key(1), Lsn(10), &v).unwrap();
    assert!(matches!(
        tl.put(rel_key(2), Lsn(9), &v),
        Err(TimelineError::Put(PutError::LsnBackwards { .. }))
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
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(64);
    let tl = Timeline::create(dir.path(), TENANT, TIMELINE, cache.clone(), conf()).unwrap();
    let v = Value::Image(Bytes::from(vec![1u8; PAGE_SZ]));
    tl.put(rel_key(1), Lsn(10), &v).unwrap();
    tl.checkpoint().unwrap();
    tl.put(rel_key(1), Lsn(20), &v).unwrap();
    tl.checkpoint().unwrap();
    drop(tl);
    // Roll the metadata back to the first checkpoint.
    TimelineMetadata {
        disk_consistent_lsn: Lsn(10),
    }
    .store(dir.path())
    .unwrap();
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
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(64);
    let tl = Timeline::create(dir.path(), TENANT, TIMELINE, cache.clone(), conf()).unwrap();
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
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(64);
    let tl = Timeline::create(dir.path(), TENANT, TIMELINE, cache.clone(), conf()).unwrap();
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
