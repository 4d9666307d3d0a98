//! A model test of the ordering rules: random commits, steps cut short by crashes, new
//! generations attaching while the old one goes on, against a store kept as a `BTreeMap`.
//! After every change to the store, the newest index lists only objects the store holds; once
//! the plan settles, the store holds exactly the newest index and the objects it lists.

use std::collections::BTreeMap;

use utils::{Generation, Lsn, TenantId, TimelineId};

use super::{Step, UploadPlan};
use crate::tenant::remote_timeline_client::index::IndexPart;
use crate::tenant::timeline::layer_set::manifest::{LayerFileEntry, LayerLevel, Manifest};

/// The object store: layer objects by (name, generation), indexes by generation.
#[derive(Default)]
struct Store {
    layers: BTreeMap<(String, Generation), u64>,
    indexes: BTreeMap<Generation, IndexPart>,
}

impl Store {
    /// What an attach at `generation` starts from: the newest index at or below it.
    fn newest_index(&self, generation: Generation) -> Option<IndexPart> {
        self.indexes
            .range(..=generation)
            .next_back()
            .map(|(_, i)| i.clone())
    }

    fn check(&self, seed: u64, step: usize) {
        let Some((_, newest)) = self.indexes.iter().next_back() else {
            return;
        };
        for (name, layer) in &newest.layers {
            let key = (name.clone(), layer.generation);
            assert_eq!(
                self.layers.get(&key),
                Some(&layer.size),
                "seed {seed} step {step}: the newest index (generation {}) lists {name}-{}, which the store lacks",
                newest.generation,
                layer.generation
            );
        }
    }
}

/// One attachment: its local manifest (durable), and its plan (memory, lost in a crash).
struct Attachment {
    generation: Generation,
    manifest: Manifest,
    plan: UploadPlan,
}

impl Attachment {
    fn start(generation: Generation, manifest: Manifest, store: &Store) -> Attachment {
        let mut plan = UploadPlan::new(generation, store.newest_index(generation));
        let target = IndexPart::from_manifest(&manifest, generation, |n| plan.layer_generation(n));
        plan.set_target(target);
        Attachment {
            generation,
            manifest,
            plan,
        }
    }

    fn commit(&mut self, rng: &mut fastrand::Rng, next_name: &mut u64) {
        for _ in 0..rng.usize(0..3) {
            let name = format!("layer-{next_name:06}");
            *next_name += 1;
            self.manifest.add_layer(LayerFileEntry {
                name,
                size: rng.u64(1..1000),
                crc32c: rng.u32(..),
                level: LayerLevel::L0,
                group_size: 1,
            });
        }
        for _ in 0..rng.usize(0..3) {
            if self.manifest.layers.is_empty() {
                break;
            }
            let victim = self.manifest.layers[rng.usize(..self.manifest.layers.len())]
                .name
                .clone();
            self.manifest.retire_layer(&victim);
        }
        self.manifest.retired.clear();
        self.manifest.disk_consistent_lsn = Lsn(self.manifest.disk_consistent_lsn.0 + 1);
        let plan = &self.plan;
        let target = IndexPart::from_manifest(&self.manifest, self.generation, |n| {
            plan.layer_generation(n)
        });
        self.plan.set_target(target);
    }

    /// Runs the next step, or only its first `cut` objects when a crash cuts it short, as the
    /// executor does: a listing that finds a newer generation's index fences the plan first.
    fn step(&mut self, store: &mut Store, cut: Option<usize>, seed: u64, at: usize) -> bool {
        let newer_exists = store.indexes.keys().any(|g| *g > self.generation);
        match self.plan.next() {
            Step::Idle => return false,
            Step::UploadLayers(layers) => {
                for (name, layer) in layers.into_iter().take(cut.unwrap_or(usize::MAX)) {
                    store
                        .layers
                        .insert((name.clone(), layer.generation), layer.size);
                    self.plan.layer_uploaded(&name, layer);
                    store.check(seed, at);
                }
            }
            Step::UploadIndex(index) => {
                if cut != Some(0) {
                    store.indexes.insert(self.generation, (*index).clone());
                    self.plan.index_uploaded(*index);
                    store.check(seed, at);
                }
            }
            Step::Delete(layers) => {
                if newer_exists {
                    self.plan.fence();
                    return false;
                }
                for (name, layer) in layers.into_iter().take(cut.unwrap_or(usize::MAX)) {
                    assert!(
                        layer.generation <= self.generation,
                        "seed {seed}: deleting a newer generation's object"
                    );
                    store.layers.remove(&(name.clone(), layer.generation));
                    self.plan.layer_deleted(&name);
                    store.check(seed, at);
                }
            }
            Step::Sweep => {
                if newer_exists {
                    self.plan.fence();
                    return false;
                }
                let doomed: Vec<(String, Generation)> = store
                    .layers
                    .keys()
                    .filter(|(n, g)| self.plan.is_unlisted_object(n, *g))
                    .cloned()
                    .collect();
                for key in doomed.into_iter().take(cut.unwrap_or(usize::MAX)) {
                    store.layers.remove(&key);
                    store.check(seed, at);
                }
                if cut.is_none() {
                    store.indexes.retain(|g, _| *g >= self.generation);
                    self.plan.swept();
                }
            }
        }
        true
    }
}

#[test]
fn the_newest_index_never_lists_a_missing_object() {
    let (tenant, timeline) = (TenantId::generate(), TimelineId::generate());
    for seed in 0..300u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut store = Store::default();
        let mut next_name = 0u64;
        let mut current =
            Attachment::start(Generation::FIRST, Manifest::empty(tenant, timeline), &store);
        let mut stale: Vec<Attachment> = Vec::new();
        for at in 0..400 {
            match rng.u32(0..100) {
                0..=29 => current.commit(&mut rng, &mut next_name),
                30..=74 => {
                    let cut = rng.bool().then(|| rng.usize(0..3));
                    current.step(&mut store, cut, seed, at);
                }
                75..=84 => {
                    // A crash: the plan is rebuilt from the store and the durable manifest.
                    let manifest = current.manifest.clone();
                    current = Attachment::start(current.generation, manifest, &store);
                }
                85..=89 => {
                    // Another pageserver attaches at the next generation from the newest
                    // index and claims it at once; the old one goes on, stale.
                    let generation = Generation::new(current.generation.get() + 1).unwrap();
                    let manifest = store
                        .newest_index(generation)
                        .map(|i| i.to_manifest())
                        .unwrap_or_else(|| Manifest::empty(tenant, timeline));
                    let mut attached = Attachment::start(generation, manifest, &store);
                    while let Step::UploadIndex(_) | Step::UploadLayers(_) = attached.plan.next() {
                        attached.step(&mut store, None, seed, at);
                    }
                    stale.push(std::mem::replace(&mut current, attached));
                }
                _ => {
                    if !stale.is_empty() {
                        let i = rng.usize(..stale.len());
                        if rng.bool() {
                            stale[i].commit(&mut rng, &mut next_name);
                        }
                        stale[i].step(&mut store, None, seed, at);
                    }
                }
            }
            store.check(seed, at);
        }
        // Settle: stale attachments are fenced at their next deletion; the current one, once
        // restarted (so it sweeps again), leaves exactly its index and the objects it lists.
        let manifest = current.manifest.clone();
        current = Attachment::start(current.generation, manifest, &store);
        let mut steps = 0;
        while current.step(&mut store, None, seed, 1000) {
            steps += 1;
            assert!(steps < 100, "seed {seed}: the plan does not settle");
        }
        assert!(current.plan.is_settled());
        let newest = store.indexes.values().next_back().cloned();
        let newest = newest.expect("an index after settling");
        assert_eq!(newest.generation, current.generation, "seed {seed}");
        assert_eq!(store.indexes.len(), 1, "seed {seed}: older indexes left");
        let listed: BTreeMap<(String, Generation), u64> = newest
            .layers
            .iter()
            .map(|(n, l)| ((n.clone(), l.generation), l.size))
            .collect();
        let stale_left: Vec<_> = store
            .layers
            .keys()
            .filter(|k| !listed.contains_key(k))
            .collect();
        assert!(
            stale_left.is_empty(),
            "seed {seed}: objects no index lists: {stale_left:?}"
        );
        assert_eq!(
            newest.disk_consistent_lsn,
            current.manifest.disk_consistent_lsn
        );
        assert_eq!(
            current.plan.remote_consistent_lsn(),
            current.manifest.disk_consistent_lsn
        );
    }
}

/// An L0 layer of 10 bytes.
fn entry(name: &str) -> LayerFileEntry {
    LayerFileEntry {
        name: name.to_owned(),
        size: 10,
        crc32c: 1,
        level: LayerLevel::L0,
        group_size: 1,
    }
}

#[test]
fn layers_go_before_their_index_and_deletions_after() {
    let (tenant, timeline) = (TenantId::generate(), TimelineId::generate());
    let g = Generation::FIRST;
    let mut manifest = Manifest::empty(tenant, timeline);
    manifest.add_layer(entry("a"));
    manifest.disk_consistent_lsn = Lsn(1);
    let mut plan = UploadPlan::new(g, None);
    plan.set_target(IndexPart::from_manifest(&manifest, g, |_| g));
    assert_eq!(plan.pending_bytes(), 10);
    let Step::UploadLayers(layers) = plan.next() else {
        panic!("{:?}", plan.next())
    };
    assert_eq!(layers.len(), 1);
    plan.layer_uploaded("a", layers[0].1.clone());
    let Step::UploadIndex(first) = plan.next() else {
        panic!()
    };
    // A second commit before that index is uploaded: the first target is still the newest
    // complete one, so it goes first (remote_consistent_lsn does not wait for "b").
    manifest.retire_layer("a");
    manifest.add_layer(entry("b"));
    manifest.disk_consistent_lsn = Lsn(2);
    plan.set_target(IndexPart::from_manifest(&manifest, g, |n| {
        plan.layer_generation(n)
    }));
    assert_eq!(plan.next(), Step::UploadIndex(first.clone()));
    assert_eq!(plan.remote_consistent_lsn(), Lsn::INVALID);
    plan.index_uploaded(*first);
    assert_eq!(plan.remote_consistent_lsn(), Lsn(1));
    assert!(matches!(plan.next(), Step::UploadLayers(ref l) if l[0].0 == "b"));
    plan.layer_uploaded("b", layers[0].1.clone());
    let Step::UploadIndex(index) = plan.next() else {
        panic!()
    };
    assert!(index.layers.contains_key("b") && !index.layers.contains_key("a"));
    plan.index_uploaded(*index);
    assert_eq!(plan.remote_consistent_lsn(), Lsn(2));
    // Only now may "a" go.
    assert!(matches!(plan.next(), Step::Delete(ref l) if l.len() == 1 && l[0].0 == "a"));
    plan.layer_deleted("a");
    assert_eq!(plan.next(), Step::Sweep);
    plan.swept();
    assert!(plan.is_settled());
}

#[test]
fn a_target_whose_retired_layer_never_reached_the_store_leaves_the_queue() {
    let (tenant, timeline) = (TenantId::generate(), TimelineId::generate());
    let g = Generation::FIRST;
    let mut manifest = Manifest::empty(tenant, timeline);
    let mut plan = UploadPlan::new(g, None);
    for (name, lsn) in [("l0-a", 1), ("l0-b", 2)] {
        manifest.add_layer(entry(name));
        manifest.disk_consistent_lsn = Lsn(lsn);
        plan.set_target(IndexPart::from_manifest(&manifest, g, |n| {
            plan.layer_generation(n)
        }));
    }
    // A compaction replaces both before either is uploaded: the older targets can never be
    // uploaded (their L0s' files go), so only the newest is worked on.
    manifest.retire_layer("l0-a");
    manifest.retire_layer("l0-b");
    manifest.add_layer(entry("l1"));
    plan.set_target(IndexPart::from_manifest(&manifest, g, |n| {
        plan.layer_generation(n)
    }));
    assert!(matches!(plan.next(), Step::UploadLayers(ref l) if l.len() == 1 && l[0].0 == "l1"));
    // Many commits while nothing lands: the queue stays bounded.
    for lsn in 3..100 {
        manifest.disk_consistent_lsn = Lsn(lsn);
        manifest.add_layer(entry(&format!("l0-{lsn}")));
        plan.set_target(IndexPart::from_manifest(&manifest, g, |n| {
            plan.layer_generation(n)
        }));
        assert!(plan.queued_targets() <= super::MAX_QUEUED_TARGETS);
    }
}

#[test]
fn a_layer_counts_as_in_the_store_for_eviction_only_once_an_index_lists_it() {
    let (tenant, timeline) = (TenantId::generate(), TimelineId::generate());
    let g = Generation::FIRST;
    let mut manifest = Manifest::empty(tenant, timeline);
    manifest.add_layer(entry("a"));
    manifest.disk_consistent_lsn = Lsn(1);
    let mut plan = UploadPlan::new(g, None);
    plan.set_target(IndexPart::from_manifest(&manifest, g, |_| g));
    let Step::UploadLayers(layers) = plan.next() else {
        panic!()
    };
    plan.layer_uploaded("a", layers[0].1.clone());
    // Uploaded, yet no durable index lists it: a restart would not know it.
    assert!(plan.durable_layer("a").is_none());
    let Step::UploadIndex(index) = plan.next() else {
        panic!()
    };
    plan.index_uploaded(*index);
    assert_eq!(plan.durable_layer("a").map(|l| l.size), Some(10));
}

#[test]
fn a_wal_change_reaches_the_store_without_waiting_for_layers_in_flight() {
    use crate::tenant::remote_timeline_client::wal_index::{ArchivedFile, WalIndex};
    let (tenant, timeline) = (TenantId::generate(), TimelineId::generate());
    let g = Generation::FIRST;
    let mut manifest = Manifest::empty(tenant, timeline);
    manifest.add_layer(entry("a"));
    manifest.disk_consistent_lsn = Lsn(1);
    let mut plan = UploadPlan::new(g, None);
    // Before any index: the section waits for the first manifest's target.
    let wal = |len: u64| WalIndex {
        segment_size: 16 << 20,
        partial: Some((
            "000000010000000000000001".to_owned(),
            ArchivedFile {
                len,
                crc32c: 0,
                generation: g,
                commits: None,
            },
        )),
        ..WalIndex::default()
    };
    plan.set_wal(wal(100));
    assert_eq!(plan.next(), Step::Idle);
    plan.set_target(IndexPart::from_manifest(&manifest, g, |_| g));
    let Step::UploadLayers(layers) = plan.next() else {
        panic!("{:?}", plan.next())
    };
    plan.layer_uploaded("a", layers[0].1.clone());
    let Step::UploadIndex(first) = plan.next() else {
        panic!()
    };
    assert_eq!(first.wal, wal(100));
    plan.index_uploaded(*first);
    // A layer in flight, then more WAL: the durable layers with the new WAL go first.
    manifest.add_layer(entry("b"));
    manifest.disk_consistent_lsn = Lsn(2);
    plan.set_target(IndexPart::from_manifest(&manifest, g, |n| {
        plan.layer_generation(n)
    }));
    assert!(matches!(plan.next(), Step::UploadLayers(_)));
    plan.set_wal(wal(200));
    let Step::UploadIndex(index) = plan.next() else {
        panic!("{:?}", plan.next())
    };
    assert_eq!(index.wal, wal(200));
    assert!(!index.layers.contains_key("b"));
    assert_eq!(index.disk_consistent_lsn, Lsn(1));
    plan.index_uploaded(*index);
    // The layer's index carries the newest WAL too.
    plan.layer_uploaded("b", layers[0].1.clone());
    let Step::UploadIndex(index) = plan.next() else {
        panic!()
    };
    assert!(index.layers.contains_key("b"));
    assert_eq!(index.wal, wal(200));
    assert!(plan.lists_wal_object("wal/000000010000000000000001.partial-00000001"));
    assert!(!plan.is_unlisted_wal_object("wal/000000010000000000000001.partial-00000001", g));
}

#[test]
fn a_wal_object_stays_while_an_index_that_lists_it_may_be_landing() {
    use crate::tenant::remote_timeline_client::wal_index::{ArchivedFile, WalIndex};
    let (tenant, timeline) = (TenantId::generate(), TimelineId::generate());
    let g = Generation::FIRST;
    let mut manifest = Manifest::empty(tenant, timeline);
    manifest.add_layer(entry("a"));
    manifest.disk_consistent_lsn = Lsn(1);
    let mut plan = UploadPlan::new(g, None);
    let file = ArchivedFile {
        len: 100,
        crc32c: 0,
        generation: g,
        commits: None,
    };
    let tail = |name: &str| WalIndex {
        segment_size: 16 << 20,
        partial: Some((name.to_owned(), file)),
        ..WalIndex::default()
    };
    let old_key = "wal/000000010000000000000001.partial-00000001";
    plan.set_wal(tail("000000010000000000000001"));
    plan.set_target(IndexPart::from_manifest(&manifest, g, |_| g));
    let Step::UploadLayers(layers) = plan.next() else {
        panic!("{:?}", plan.next())
    };
    plan.layer_uploaded("a", layers[0].1.clone());
    let Step::UploadIndex(in_flight) = plan.next() else {
        panic!()
    };
    plan.index_attempted(&in_flight);
    // The archive moves on while that index is in flight: its tail is no longer the section's.
    plan.set_wal(tail("000000010000000000000002"));
    assert!(
        plan.lists_wal_object(old_key),
        "deleted under an index in flight"
    );
    plan.index_uploaded(*in_flight);
    assert!(plan.lists_wal_object(old_key));
    // The change made meanwhile is queued again, and once it is durable the old tail may go.
    let Step::UploadIndex(next) = plan.next() else {
        panic!("{:?}", plan.next())
    };
    assert_eq!(next.wal, tail("000000010000000000000002"));
    plan.index_attempted(&next);
    plan.index_uploaded(*next);
    assert!(!plan.lists_wal_object(old_key));
}
