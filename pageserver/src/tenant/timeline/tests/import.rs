//! Imports against a model: values of large inputs written straight into run files, the rest
//! through the private layer, and the L0 group they make, through commits, reloads, leftovers
//! of a crash, and compactions that must take groups whole.

use std::collections::BTreeMap;

use super::*;
use crate::tenant::timeline::layer_set::manifest::LayerFileEntry;

/// A page that names its key and the import (or batch) that wrote it.
fn page(k: u32, round: u8) -> Bytes {
    let mut p = vec![round; PAGE_SZ];
    p[..4].copy_from_slice(&k.to_be_bytes());
    Bytes::from(p)
}

/// Versions of each key: (LSN, page), oldest first.
type Model = BTreeMap<u32, Vec<(Lsn, Bytes)>>;

fn record(model: &mut Model, k: u32, lsn: Lsn, p: Bytes) {
    model.entry(k).or_default().push((lsn, p));
}

/// Every key of `keys` at every LSN of `lsns` reads what the model says.
fn check(tl: &Timeline, model: &Model, keys: std::ops::Range<u32>, lsns: &[Lsn]) {
    for &lsn in lsns {
        for k in keys.clone() {
            let want = model
                .get(&k)
                .and_then(|v| v.iter().rev().find(|(l, _)| *l <= lsn))
                .map(|(_, p)| p.clone());
            assert_eq!(
                tl.get_page(rel_key(k), lsn).unwrap(),
                want,
                "key {k} at {lsn}"
            );
        }
    }
}

/// An input of an import: `len` keys from `first`, large (put in order) or not.
#[derive(Clone, Copy, Debug)]
struct Member {
    first: u32,
    len: u32,
    large: bool,
}

/// Twenty inputs, ten of them large, arriving in descending key order: every large one after
/// the first starts below the run before it, so the import starts runs until it has
/// `MAX_IMPORT_RUNS` and sends the remaining large inputs through its private layer.
fn descending_members() -> Vec<Member> {
    (0..20u32)
        .rev()
        .map(|m| Member {
            first: m * 100,
            len: if m % 2 == 0 { 40 } else { 5 },
            large: m % 2 == 0,
        })
        .collect()
}

fn import(tl: &Timeline, members: &[Member], round: u8, lsn: Lsn, model: &mut Model) {
    let mut import = tl.begin_import().unwrap();
    for m in members {
        for k in m.first..m.first + m.len {
            let value = Value::Image(page(k, round));
            if m.large {
                import.put_in_order(rel_key(k), &value).unwrap();
            } else {
                import.put(rel_key(k), &value).unwrap();
            }
            record(model, k, lsn, page(k, round));
        }
    }
    import.commit(lsn).unwrap();
}

/// One batch of `keys` at `lsn`.
fn batch(tl: &Timeline, keys: impl Iterator<Item = u32>, round: u8, lsn: Lsn, model: &mut Model) {
    let records: Vec<PutRecord> = keys
        .map(|k| {
            record(model, k, lsn, page(k, round));
            PutRecord {
                key: rel_key(k),
                lsn,
                value: Value::Image(page(k, round)),
            }
        })
        .collect();
    tl.put_batch(&records).unwrap();
}

fn layer_files(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.contains("__"))
        .collect();
    names.sort();
    names
}

#[test]
fn an_import_group_reads_like_the_model_across_reloads_and_compaction() {
    let (dir, cache, tl) = fresh_timeline(256);
    let mut model = Model::new();
    // History below the imports: one flushed layer, and versions still in the open layer
    // when the first import commits (its commit flushes them first).
    batch(&tl, (0..2000).step_by(7), 1, Lsn(0x10), &mut model);
    tl.checkpoint().unwrap();
    batch(&tl, (3..2000).step_by(11), 2, Lsn(0x20), &mut model);

    import(&tl, &descending_members(), 3, Lsn(0x100), &mut model);
    let lsns = [Lsn(0x10), Lsn(0x20), Lsn(0xff), Lsn(0x100)];
    check(&tl, &model, 0..2000, &lsns);
    // Two flushes, then the group: MAX_IMPORT_RUNS runs and the private layer's file.
    assert_eq!(tl.layer_counts().l0, 2 + MAX_IMPORT_RUNS + 1);
    assert_eq!(tl.l0_depth(), 3);
    assert_eq!(tl.disk_consistent_lsn(), Lsn(0x100));
    // The group starts where the flush of the open layer ended (0x20 + 1), its versions at
    // 0x100: the layers' LSN ranges meet, and every file of the group knows its group's size.
    let manifest = tl.manifest_snapshot();
    let group: Vec<&LayerFileEntry> = manifest
        .layers
        .iter()
        .filter(|l| l.name.ends_with("__0000000000000021-0000000000000101"))
        .collect();
    assert_eq!(group.len(), MAX_IMPORT_RUNS + 1, "{:?}", manifest.layers);
    assert!(group
        .iter()
        .all(|l| l.group_size as usize == MAX_IMPORT_RUNS + 1));
    assert!(
        !std::fs::read_dir(dir.path()).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .ends_with("___temp")),
        "no temporary file is left"
    );

    drop(tl);
    let tl = Timeline::load(dir.path(), TENANT, TIMELINE, cache, conf()).unwrap();
    check(&tl, &model, 0..2000, &lsns);
    assert_eq!(tl.l0_depth(), 3);

    // A second import in key order: one run, and the small inputs.
    let mut ascending = descending_members();
    ascending.reverse();
    import(&tl, &ascending[..10], 4, Lsn(0x200), &mut model);
    let lsns = [Lsn(0x10), Lsn(0x20), Lsn(0x100), Lsn(0x200)];
    check(&tl, &model, 0..2000, &lsns);
    assert_eq!(tl.layer_counts().l0, 2 + MAX_IMPORT_RUNS + 1 + 2);

    let outcome = tl.compact_l0(2).unwrap();
    assert_eq!(outcome.inputs, 2 + MAX_IMPORT_RUNS + 1 + 2);
    assert_eq!(tl.layer_counts().l0, 0);
    check(&tl, &model, 0..2000, &lsns);
}

#[test]
fn compaction_takes_import_groups_whole_and_never_one_alone() {
    let (_dir, _cache, tl) = fresh_timeline(256);
    let mut model = Model::new();
    let members = descending_members();
    let group = MAX_IMPORT_RUNS + 1;
    import(&tl, &members, 1, Lsn(0x100), &mut model);
    assert_eq!((tl.layer_counts().l0, tl.l0_depth()), (group, 1));
    // A group alone is one LSN range: its outputs would take an input's range.
    assert_eq!(tl.compact_l0(2).unwrap().inputs, 0);

    for (n, lsn) in [0x200, 0x300, 0x400].into_iter().enumerate() {
        import(&tl, &members, 2 + n as u8, Lsn(lsn), &mut model);
    }
    assert_eq!((tl.layer_counts().l0, tl.l0_depth()), (4 * group, 4));
    // Three groups fit in MAX_COMPACTION_INPUTS; the fourth is left whole.
    assert!(4 * group > MAX_COMPACTION_INPUTS && 3 * group <= MAX_COMPACTION_INPUTS);
    assert_eq!(tl.compact_l0(2).unwrap().inputs, 3 * group);
    assert_eq!((tl.layer_counts().l0, tl.l0_depth()), (group, 1));
    let lsns = [Lsn(0x100), Lsn(0x2ff), Lsn(0x300), Lsn(0x400)];
    check(&tl, &model, 0..2000, &lsns);

    // Once a flush adds a second range, the last group goes too.
    tl.put(rel_key(5), Lsn(0x500), &Value::Image(page(5, 9)))
        .unwrap();
    record(&mut model, 5, Lsn(0x500), page(5, 9));
    tl.checkpoint().unwrap();
    assert_eq!(tl.compact_l0(2).unwrap().inputs, group + 1);
    check(&tl, &model, 0..2000, &[Lsn(0x400), Lsn(0x500)]);
}

#[test]
fn an_import_group_without_its_manifest_is_removed_on_load() {
    // A crash after the group's files got their names, before the manifest listed them: they
    // start above disk_consistent_lsn, and the next load removes every one.
    let (dir, cache, tl) = fresh_timeline(256);
    let mut model = Model::new();
    import(&tl, &descending_members()[..4], 1, Lsn(0x100), &mut model);
    let before = tl.manifest_snapshot();
    let files_before = layer_files(dir.path());
    import(&tl, &descending_members(), 2, Lsn(0x200), &mut model);
    assert_eq!(
        layer_files(dir.path()).len(),
        files_before.len() + MAX_IMPORT_RUNS + 1
    );
    drop(tl);
    before.store(dir.path()).unwrap();
    let tl = Timeline::load(dir.path(), TENANT, TIMELINE, cache, conf()).unwrap();
    assert_eq!(layer_files(dir.path()), files_before);
    assert_eq!(tl.last_record_lsn(), Lsn(0x100));
    let mut first = Model::new();
    let mut scratch = Model::new();
    for m in &descending_members()[..4] {
        for k in m.first..m.first + m.len {
            record(&mut first, k, Lsn(0x100), page(k, 1));
        }
    }
    check(&tl, &first, 0..2000, &[Lsn(0x100)]);
    // The history above is free again: the same LSN imports anew.
    import(
        &tl,
        &descending_members()[4..6],
        3,
        Lsn(0x200),
        &mut scratch,
    );
    assert_eq!(tl.last_record_lsn(), Lsn(0x200));
}

#[test]
fn an_abandoned_import_leaves_no_run_file() {
    let (dir, _cache, tl) = fresh_timeline(64);
    let mut import = tl.begin_import().unwrap();
    // Two runs: the lower keys start a second one.
    for k in (20..40).chain(0..10) {
        import
            .put_in_order(rel_key(k), &Value::Image(page(k, 1)))
            .unwrap();
    }
    import.put(rel_key(50), &Value::Image(page(50, 1))).unwrap();
    assert!(import.bytes_written() >= 31 * PAGE_SZ as u64);
    drop(import);
    let left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != METADATA_FILE)
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(tl.last_record_lsn(), Lsn(0));
    assert_eq!(tl.get_page(rel_key(1), Lsn(0)).unwrap(), None);
}

#[test]
fn a_key_put_twice_into_an_import_is_refused() {
    let (_dir, _cache, tl) = fresh_timeline(64);
    let mut model = Model::new();
    let mut import = tl.begin_import().unwrap();
    for k in 10..20 {
        import
            .put_in_order(rel_key(k), &Value::Image(page(k, 1)))
            .unwrap();
        record(&mut model, k, Lsn(0x100), page(k, 1));
    }
    import.put(rel_key(40), &Value::Image(page(40, 1))).unwrap();
    record(&mut model, 40, Lsn(0x100), page(40, 1));
    let duplicate = |e: TimelineError| matches!(e, TimelineError::Put(PutError::Duplicate { .. }));
    // In a run, from either door; in the private layer, from either door; a key inside a run's
    // range that starts a new run.
    let v = Value::Image(page(0, 2));
    assert!(duplicate(import.put(rel_key(15), &v).unwrap_err()));
    assert!(duplicate(import.put_in_order(rel_key(12), &v).unwrap_err()));
    assert!(duplicate(import.put_in_order(rel_key(40), &v).unwrap_err()));
    assert!(duplicate(import.put(rel_key(40), &v).unwrap_err()));
    // A new run below the first, then keys that run into the first one's.
    for k in 5..10 {
        import
            .put_in_order(rel_key(k), &Value::Image(page(k, 1)))
            .unwrap();
        record(&mut model, k, Lsn(0x100), page(k, 1));
    }
    assert!(duplicate(import.put_in_order(rel_key(10), &v).unwrap_err()));
    import.commit(Lsn(0x100)).unwrap();
    check(&tl, &model, 0..50, &[Lsn(0x100)]);
    batch(&tl, 0..50, 3, Lsn(0x200), &mut model);
    tl.checkpoint().unwrap();
    assert!(tl.compact_l0(2).unwrap().inputs > 0);
    check(&tl, &model, 0..50, &[Lsn(0x100), Lsn(0x200)]);
}

/// One import of a property test: which 50-key slots it writes, how much of each, whether
/// in order, in what order the members arrive.
fn import_strategy() -> impl proptest::strategy::Strategy<Value = Vec<Member>> {
    use proptest::prelude::*;
    prop::collection::btree_map(0u32..40, (1u32..50, any::<bool>()), 1..14)
        .prop_map(|slots| {
            slots
                .into_iter()
                .map(|(slot, (len, large))| Member {
                    first: slot * 50,
                    len,
                    large,
                })
                .collect::<Vec<_>>()
        })
        .prop_shuffle()
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]

    /// Imports of members in any order and any mix of the two doors, with batches between
    /// them, read like the model at every LSN: as committed, after a reload, and after the
    /// groups are compacted.
    #[test]
    fn imports_in_any_order_read_like_the_model(
        imports in proptest::collection::vec(import_strategy(), 1..5),
        batches in proptest::collection::vec(proptest::option::of(0u32..2000), 5),
        compact in proptest::bool::ANY,
    ) {
        let (dir, cache, tl) = fresh_timeline(128);
        let mut model = Model::new();
        let mut lsns = vec![];
        for (i, members) in imports.iter().enumerate() {
            let base = Lsn(0x1000 * (i as u64 + 1));
            if let Some(k) = batches[i] {
                batch(&tl, k..(k + 7).min(2000), 100 + i as u8, base, &mut model);
                lsns.push(base);
            }
            let lsn = Lsn(base.0 + 0x800);
            import(&tl, members, i as u8 + 1, lsn, &mut model);
            lsns.push(Lsn(lsn.0 - 1));
            lsns.push(lsn);
        }
        check(&tl, &model, 0..2000, &lsns);
        drop(tl);
        let tl = Timeline::load(dir.path(), TENANT, TIMELINE, cache, conf()).unwrap();
        check(&tl, &model, 0..2000, &lsns);
        if compact {
            tl.compact_l0(2).unwrap();
            check(&tl, &model, 0..2000, &lsns);
        }
    }
}
