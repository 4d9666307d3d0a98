//! The upload queue's ordering rules, as a plan with no I/O: what the store holds (as far as
//! this pageserver knows), what the newest committed manifest asks for, and the next step
//! towards it. The executor (`mod.rs`) runs the steps and reports each object as it lands.
//!
//! Every committed manifest's index is a *target*, queued in commit order until uploaded. Rules,
//! in the order [`UploadPlan::next`] applies them:
//!
//! 1. **The newest complete index.** The newest target whose layers the store all holds is
//!    uploaded as this generation's index, and every target up to it leaves the queue: a burst
//!    of commits costs one index upload, and `remote_consistent_lsn` advances as soon as any
//!    committed manifest is wholly in the store, never waiting for the newest one under
//!    sustained ingest.
//! 2. **Layers before the index that lists them**: otherwise the oldest queued target's
//!    missing layers are uploaded (as objects of this generation).
//! 3. **Deletions last.** A layer object is deleted only when neither the durable index nor
//!    any queued target lists it.
//! 4. **A sweep, once.** After this generation's first index is durable, the store is listed
//!    once: layer objects of this or older generations that no index lists (uploads a crash
//!    cut off before their index) and older generations' indexes are deleted.
//!
//! A queued target that lists a layer neither in the store nor in the newest target (an L0 a
//! compaction retired before it was uploaded, whose file may be gone) can never be uploaded,
//! and leaves the queue; so every layer rule 2 uploads is one the newest target lists. At most
//! [`MAX_QUEUED_TARGETS`] wait: beyond, the ones between the oldest and the newest give way.
//!
//! A newer generation's index found by a listing means another pageserver has attached the
//! tenant since: the plan is then **fenced** and does nothing more, so a stale attachment never
//! deletes what the newer one's index lists, and never writes an object of another generation.

use std::collections::{BTreeMap, VecDeque};

use utils::Generation;
#[cfg(test)]
use utils::Lsn;

use super::index::{IndexLayer, IndexPart};
use super::wal_index::WalIndex;

/// The most targets queued at once (see the module documentation).
pub(crate) const MAX_QUEUED_TARGETS: usize = 16;

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct UploadPlan {
    generation: Generation,
    /// The indexes of committed manifests not uploaded yet, oldest first; the newest is where
    /// the store should get to.
    targets: VecDeque<IndexPart>,
    /// The newest index durable in the store (this generation's, or the one it started from).
    uploaded: Option<IndexPart>,
    /// The layer objects the store holds, by layer name: those the durable index lists, and
    /// those uploaded since.
    present: BTreeMap<String, IndexLayer>,
    swept: bool,
    fenced: bool,
    /// The WAL section every target gets: what the WAL archive has put in the store
    /// (`wal_archive.rs`), which changes apart from manifests.
    wal: WalIndex,
    /// The WAL objects listed by indexes whose upload began since the last one that is known
    /// durable: one in flight, or one whose answer was an error, may be the store's index
    /// now, so none of them is deleted.
    attempted_wal: std::collections::BTreeSet<String>,
}

/// What to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Upload these layers (each as an object of this generation).
    UploadLayers(Vec<(String, IndexLayer)>),
    UploadIndex(Box<IndexPart>),
    /// Delete these layer objects.
    Delete(Vec<(String, IndexLayer)>),
    /// List the store and delete what no index lists (rule 4).
    Sweep,
    Idle,
}

impl UploadPlan {
    /// A plan starting from `durable`, the newest index in the store at or below `generation`
    /// (`None`: the store has nothing of the timeline).
    pub(crate) fn new(generation: Generation, durable: Option<IndexPart>) -> UploadPlan {
        UploadPlan {
            generation,
            targets: VecDeque::new(),
            present: durable
                .as_ref()
                .map(|i| i.layers.clone())
                .unwrap_or_default(),
            wal: durable.as_ref().map(|i| i.wal.clone()).unwrap_or_default(),
            attempted_wal: Default::default(),
            uploaded: durable,
            swept: false,
            fenced: false,
        }
    }

    /// The generation whose object holds layer `name` if the store has it, else ours: what
    /// an index built now says of it.
    pub(crate) fn layer_generation(&self, name: &str) -> Generation {
        self.present
            .get(name)
            .map_or(self.generation, |l| l.generation)
    }

    /// The generation of the store's object of layer `name`, if the store has it.
    pub(crate) fn present_generation(&self, name: &str) -> Option<Generation> {
        self.present.get(name).map(|l| l.generation)
    }

    /// A new manifest was committed: its index, with the WAL section as it stands, is the
    /// newest target.
    pub(crate) fn set_target(&mut self, mut target: IndexPart) {
        target.wal = self.wal.clone();
        if self.targets.back() == Some(&target)
            || (self.targets.is_empty() && self.uploaded.as_ref() == Some(&target))
        {
            return;
        }
        self.targets.push_back(target);
        self.prune();
    }

    /// The WAL archive changed the WAL section: every queued target takes it, and so does a
    /// copy of the durable index queued first, which is complete. So a WAL change reaches the
    /// store with the next index upload, never waiting for layers still being uploaded. Before
    /// any index exists, the section waits for the first manifest's.
    pub(crate) fn set_wal(&mut self, wal: WalIndex) {
        for target in &mut self.targets {
            target.wal = wal.clone();
        }
        if let Some(uploaded) = self.uploaded.as_ref().filter(|u| u.wal != wal) {
            let mut target = uploaded.clone();
            target.wal = wal.clone();
            target.generation = self.generation;
            if self.targets.front() != Some(&target) {
                self.targets.push_front(target);
            }
        }
        self.wal = wal;
        self.prune();
    }

    /// The WAL section every new target gets.
    pub(crate) fn wal(&self) -> &WalIndex {
        &self.wal
    }

    /// The durable index's WAL section.
    pub(crate) fn durable_wal(&self) -> Option<&WalIndex> {
        self.uploaded.as_ref().map(|i| &i.wal)
    }

    /// Whether an index the store holds, or will, lists WAL object `key` (under the timeline's
    /// prefix).
    pub(crate) fn lists_wal_object(&self, key: &str) -> bool {
        self.attempted_wal.contains(key)
            || self
                .uploaded
                .iter()
                .chain(self.targets.iter())
                .map(|i| &i.wal)
                .chain(std::iter::once(&self.wal))
                .any(|w| w.object_names().iter().any(|k| k == key))
    }

    /// Whether the sweep may delete WAL object `key` (under the timeline's prefix) of
    /// `generation`: an older generation's that neither the durable index nor a queued target
    /// lists. This generation's are the WAL archive's to delete (it uploads them before any
    /// index lists them).
    pub(crate) fn is_unlisted_wal_object(&self, key: &str, generation: Generation) -> bool {
        generation < self.generation
            && !self.attempted_wal.contains(key)
            && !self
                .uploaded
                .iter()
                .chain(self.targets.iter())
                .any(|i| i.wal.object_names().iter().any(|k| k == key))
    }

    /// Drops the targets that can never be uploaded, and the middle ones past the bound.
    fn prune(&mut self) {
        let Some(newest) = self.targets.back().cloned() else {
            return;
        };
        let present = &self.present;
        self.targets.retain(|t| {
            t.layers
                .keys()
                .all(|name| present.contains_key(name) || newest.layers.contains_key(name))
        });
        while self.targets.len() > MAX_QUEUED_TARGETS {
            self.targets.remove(1);
        }
    }

    fn is_complete(&self, target: &IndexPart) -> bool {
        target.layers.iter().all(|(name, l)| {
            self.present
                .get(name)
                .is_some_and(|p| p.generation == l.generation)
        })
    }

    /// Everything at or below it is in the store: the durable index's `disk_consistent_lsn`.
    #[cfg(test)]
    pub(crate) fn remote_consistent_lsn(&self) -> Lsn {
        self.uploaded
            .as_ref()
            .map_or(Lsn::INVALID, |i| i.disk_consistent_lsn)
    }

    /// The newest target's layers not yet in the store: the upload queue.
    fn pending(&self) -> impl Iterator<Item = &IndexLayer> {
        (self.targets.back().into_iter())
            .flat_map(|newest| newest.layers.iter())
            .filter(|(name, _)| !self.present.contains_key(*name))
            .map(|(_, layer)| layer)
    }

    /// How many layers wait in the upload queue.
    pub(crate) fn pending_layers(&self) -> usize {
        self.pending().count()
    }

    /// Bytes of the layers waiting in the upload queue: the queue's length.
    pub(crate) fn pending_bytes(&self) -> u64 {
        self.pending().map(|layer| layer.size).sum()
    }

    pub(crate) fn is_fenced(&self) -> bool {
        self.fenced
    }

    /// A listing found a newer generation's index: stop for good.
    pub(crate) fn fence(&mut self) {
        self.fenced = true;
    }

    /// Nothing left to do: the durable index is the newest target, and nothing waits deletion.
    /// Never for a fenced plan: what it has not uploaded will never be.
    pub(crate) fn is_settled(&self) -> bool {
        !self.fenced && self.next() == Step::Idle
    }

    pub(crate) fn next(&self) -> Step {
        if self.fenced {
            return Step::Idle;
        }
        if let Some(complete) = self.targets.iter().rev().find(|t| self.is_complete(t)) {
            return Step::UploadIndex(Box::new(complete.clone()));
        }
        if let Some(oldest) = self.targets.front() {
            let missing: Vec<(String, IndexLayer)> = oldest
                .layers
                .iter()
                .filter(|(name, _)| !self.present.contains_key(*name))
                .map(|(name, l)| {
                    let mut l = l.clone();
                    l.generation = self.generation;
                    (name.clone(), l)
                })
                .collect();
            if !missing.is_empty() {
                return Step::UploadLayers(missing);
            }
        }
        let garbage: Vec<(String, IndexLayer)> = self
            .present
            .iter()
            .filter(|(name, _)| !self.is_listed(name))
            .map(|(name, l)| (name.clone(), l.clone()))
            .collect();
        if !garbage.is_empty() {
            return Step::Delete(garbage);
        }
        let ours_durable = self
            .uploaded
            .as_ref()
            .is_some_and(|i| i.generation == self.generation);
        if ours_durable && !self.swept {
            return Step::Sweep;
        }
        Step::Idle
    }

    #[cfg(test)]
    pub(crate) fn queued_targets(&self) -> usize {
        self.targets.len()
    }

    /// Layer `name` as the durable index lists it.
    pub(crate) fn durable_layer(&self, name: &str) -> Option<&IndexLayer> {
        self.uploaded.as_ref().and_then(|i| i.layers.get(name))
    }

    /// The generation of the durable index, if there is one.
    pub(crate) fn durable_generation(&self) -> Option<Generation> {
        self.uploaded.as_ref().map(|i| i.generation)
    }

    /// Whether the newest target lists layer `name`.
    pub(crate) fn newest_lists(&self, name: &str) -> bool {
        self.targets
            .back()
            .is_some_and(|t| t.layers.contains_key(name))
    }

    /// Whether the durable index or a queued target lists layer `name`.
    fn is_listed(&self, name: &str) -> bool {
        self.uploaded
            .iter()
            .chain(self.targets.iter())
            .any(|i| i.layers.contains_key(name))
    }

    /// Layer `name` is in the store now, as `layer` says.
    pub(crate) fn layer_uploaded(&mut self, name: &str, layer: IndexLayer) {
        self.present.insert(name.to_owned(), layer);
    }

    /// `index` is durable in the store: it and the targets before it leave the queue.
    pub(crate) fn index_uploaded(&mut self, index: IndexPart) {
        // Matched without the WAL section: the archive may have changed it in the queued
        // targets while this one was uploaded.
        let same = |t: &IndexPart| {
            IndexPart {
                wal: index.wal.clone(),
                ..t.clone()
            } == index
        };
        if let Some(at) = self.targets.iter().rposition(same) {
            self.targets.drain(..=at);
        }
        let wal_behind = index.wal != self.wal;
        self.uploaded = Some(index);
        self.attempted_wal.clear();
        // A WAL change made during the upload still has to reach the store.
        if wal_behind && self.targets.is_empty() {
            if let Some(mut target) = self.uploaded.clone() {
                target.wal = self.wal.clone();
                target.generation = self.generation;
                self.targets.push_back(target);
            }
        }
        self.prune();
    }

    /// The upload of `index` begins: until an index is known durable, its WAL objects stay.
    pub(crate) fn index_attempted(&mut self, index: &IndexPart) {
        self.attempted_wal.extend(index.wal.object_names());
    }

    /// Layer `name`'s object is gone from the store.
    pub(crate) fn layer_deleted(&mut self, name: &str) {
        self.present.remove(name);
    }

    pub(crate) fn swept(&mut self) {
        self.swept = true;
    }

    /// Whether the sweep may delete layer object `name` of `generation`: nothing the plan knows
    /// lists it, and no newer generation wrote it.
    pub(crate) fn is_unlisted_object(&self, name: &str, generation: Generation) -> bool {
        if generation > self.generation {
            return false;
        }
        let listed_as = |i: &IndexPart| i.layers.get(name).map(|l| l.generation);
        let mut listed = self.present.get(name).map(|l| l.generation) == Some(generation);
        listed |= self
            .uploaded
            .iter()
            .chain(self.targets.iter())
            .any(|i| listed_as(i) == Some(generation));
        !listed
    }
}

#[cfg(test)]
mod tests;
