//! A timeline's answers against a reference model (a `BTreeMap` of every version), for the
//! tests of the changes that rewrite its layers: compaction, image creation, GC.

use std::collections::BTreeMap;

use bytes::Bytes;
use pageserver_api::value::Patch;
use pageserver_api::{reconstruct_page, Key, Value, DEFAULT_MAX_VALUE_SIZE};
use utils::{Lsn, TenantId, TimelineId};

use super::{PutRecord, Timeline, TimelineConf, TimelineError};
use crate::format::compression::Compression;
use crate::tenant::test_support::rel_key;
use crate::PAGE_SZ;

pub const TENANT: TenantId = TenantId::from_bytes([1; 16]);
pub const TIMELINE: TimelineId = TimelineId::from_bytes([2; 16]);
pub const KEYS: u32 = 40;

pub type Model = BTreeMap<(Key, Lsn), Value>;

pub fn conf() -> TimelineConf {
    TimelineConf {
        // Several L1s out of a few hundred KiB of L0s: the counts the tests expect are of
        // pages stored as they are (compressed, the model's pages shrink to a few L1s).
        compaction_target_size: 64 * 1024,
        layer_compression: Compression::Off,
        ..TimelineConf::default()
    }
}

pub fn expected(model: &Model, key: Key, lsn: Lsn) -> Option<Bytes> {
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
pub fn ingest(tl: &Timeline, model: &mut Model, flushes: u64) {
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
pub fn check_all(tl: &Timeline, model: &Model) {
    let mut lsns: Vec<Lsn> = model.keys().map(|(_, l)| *l).collect();
    lsns.sort();
    lsns.dedup();
    let cutoff = tl.gc_cutoff_lsn();
    for lsn in lsns.iter().step_by(7).chain(lsns.last()) {
        for k in 0..KEYS {
            let key = rel_key(k);
            if *lsn < cutoff {
                // Below the GC cutoff: refused, never answered from what is left.
                assert!(
                    matches!(
                        tl.get_page(key, *lsn),
                        Err(TimelineError::BelowGcCutoff { .. })
                    ),
                    "key {key} at {lsn}, below the cutoff {cutoff}"
                );
                continue;
            }
            assert_eq!(
                tl.get_page(key, *lsn).unwrap(),
                expected(model, key, *lsn),
                "key {key} at {lsn}"
            );
        }
    }
}

pub fn layer_files(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.parse::<crate::tenant::storage_layer::LayerName>().is_ok())
        .collect();
    names.sort();
    names
}

/// One version of every key, from `value`, in one batch and one L0 layer.
pub fn put_all(tl: &Timeline, model: &mut Model, value: impl Fn(u32) -> Value) {
    let mut lsn = tl.last_record_lsn().0;
    let batch: Vec<PutRecord> = (0..KEYS)
        .map(|k| {
            lsn += 1;
            model.insert((rel_key(k), Lsn(lsn)), value(k));
            PutRecord {
                key: rel_key(k),
                lsn: Lsn(lsn),
                value: value(k),
            }
        })
        .collect();
    tl.put_batch(&batch).unwrap();
    tl.checkpoint().unwrap();
}

/// A small delta of every key: a 16-byte patch.
pub fn small_delta(k: u32) -> Value {
    Value::Delta {
        will_init: false,
        patches: vec![Patch::new(k * 100, vec![k as u8; 16])],
    }
}
