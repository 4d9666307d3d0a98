//! Compaction against a reference model: every answer the same before and after, on reload,
//! and after a compaction that fails midway.

use std::collections::BTreeMap;

use bytes::Bytes;
use pageserver_api::value::Patch;
use pageserver_api::{reconstruct_page, DEFAULT_MAX_VALUE_SIZE};

use super::*;
use crate::tenant::test_support::*;

const TENANT: TenantId = TenantId::from_bytes([1; 16]);
const TIMELINE: TimelineId = TimelineId::from_bytes([2; 16]);
const KEYS: u32 = 40;

type Model = BTreeMap<(Key, Lsn), Value>;

fn conf() -> TimelineConf {
    TimelineConf {
        // Several L1s out of a few hundred KiB of L0s.
        compaction_target_size: 64 * 1024,
        ..TimelineConf::default()
    }
}

fn expected(model: &Model, key: Key, lsn: Lsn) -> Option<Bytes> {
    let mut records = Vec::new();
    for ((_, v_lsn), v) in model.range((key, Lsn(0))..=(key, lsn)).rev() {
        records.push((*v_lsn, v.clone()));
        if v.will_init() {
            break;
        }
    }
    reconstruct_page(&records, DEFAULT_MAX_VALUE_SIZE).unwrap()
}

/// `flushes` L0 layers: the first gives every key an image, each later one updates a few
/// keys with small deltas (and now and then a new image).
fn ingest(tl: &Timeline, model: &mut Model, flushes: u64) {
    let mut lsn = tl.last_record_lsn().0.max(0x10);
    let mut rng = fastrand::Rng::with_seed(7);
    for round in 0..flushes {
        let mut batch = Vec::new();
        for k in 0..KEYS {
            if round > 0 && rng.u32(0..4) != 0 {
                continue;
            }
            lsn += 1;
            let value = if round == 0 || rng.u32(0..10) == 0 {
                Value::Image(Bytes::from(vec![rng.u8(..); PAGE_SZ]))
            } else {
                Value::Delta {
                    will_init: false,
                    patches: vec![Patch::new(rng.u32(0..8000), vec![rng.u8(..); 16])],
                }
            };
            model.insert((rel_key(k), Lsn(lsn)), value.clone());
            batch.push(PutRecord {
                key: rel_key(k),
                lsn: Lsn(lsn),
                value,
            });
        }
        tl.put_batch(&batch).unwrap();
        tl.checkpoint().unwrap();
    }
}

/// Every key at every LSN where something changed, and at the ends.
fn check_all(tl: &Timeline, model: &Model) {
    let mut lsns: Vec<Lsn> = model.keys().map(|(_, l)| *l).collect();
    lsns.sort();
    lsns.dedup();
    for lsn in lsns.iter().step_by(7).chain(lsns.last()) {
        for k in 0..KEYS {
            let key = rel_key(k);
            assert_eq!(
                tl.get_page(key, *lsn).unwrap(),
                expected(model, key, *lsn),
                "key {key} at {lsn}"
            );
        }
    }
}

fn layer_files(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.parse::<crate::tenant::storage_layer::LayerName>().is_ok())
        .collect();
    names.sort();
    names
}

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
    let (_, layers) = tl.scan_layers();
    let before = layer_files(dir.path());
    tl.compact_l0(2).unwrap();
    for layer in &layers {
        let key = rel_key(1);
        layer.get(key, tl.last_record_lsn()).unwrap();
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
