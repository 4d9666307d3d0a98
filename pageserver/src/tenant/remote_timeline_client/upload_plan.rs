//! The upload queue's ordering rules, as a plan with no I/O: what the store holds (as far as
//! this pageserver knows), what the newest committed manifest asks for, and the next step
//! towards it. The executor (`mod.rs`) runs the steps and reports each object as it lands.
//!
//! Rules, in the order [`UploadPlan::next`] applies them:
//!
//! 1. **Layers first.** Every layer the target lists that the store lacks is uploaded (as an
//!    object of this generation) before any index that lists it.
//! 2. **Then the index.** Once the store holds every layer of the target, the target is
//!    uploaded as this generation's index. Indexes are never queued one per commit: whatever
//!    the newest target is when the layers are in is the one uploaded, so a burst of commits
//!    costs one index upload.
//! 3. **Deletions last.** A layer object is deleted only when neither the durable index nor
//!    the target lists it: an index that no longer needs it is durable, and no index about to
//!    be uploaded needs it.
//! 4. **A sweep, once.** After this generation's first index is durable, the store is listed
//!    once: layer objects of this or older generations that no index lists (uploads a crash
//!    cut off before their index) and older generations' indexes are deleted.
//!
//! A newer generation's index found by a listing means another pageserver has attached the
//! tenant since: the plan is then **fenced** and does nothing more, so a stale attachment never
//! deletes what the newer one's index lists, and never writes an object of another generation.

use std::collections::BTreeMap;

use utils::Generation;
#[cfg(test)]
use utils::Lsn;

use super::index::{IndexLayer, IndexPart};

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct UploadPlan {
    generation: Generation,
    /// The index the newest committed manifest makes: where the store should get to.
    target: Option<IndexPart>,
    /// The newest index durable in the store (this generation's, or the one it started from).
    uploaded: Option<IndexPart>,
    /// The layer objects the store holds, by layer name: those the durable index lists, and
    /// those uploaded since.
    present: BTreeMap<String, IndexLayer>,
    swept: bool,
    fenced: bool,
}

/// What to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Upload these layers (each as an object of this generation).
    UploadLayers(Vec<(String, IndexLayer)>),
    UploadIndex(IndexPart),
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
            target: None,
            present: durable
                .as_ref()
                .map(|i| i.layers.clone())
                .unwrap_or_default(),
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

    /// The store's object of layer `name`, if the store has it.
    pub(crate) fn present_layer(&self, name: &str) -> Option<&IndexLayer> {
        self.present.get(name)
    }

    /// The generation of the store's object of layer `name`, if the store has it.
    pub(crate) fn present_generation(&self, name: &str) -> Option<Generation> {
        self.present.get(name).map(|l| l.generation)
    }

    /// A new manifest was committed: its index is the new target.
    pub(crate) fn set_target(&mut self, target: IndexPart) {
        self.target = Some(target);
    }

    /// Everything at or below it is in the store: the durable index's `disk_consistent_lsn`.
    #[cfg(test)]
    pub(crate) fn remote_consistent_lsn(&self) -> Lsn {
        self.uploaded
            .as_ref()
            .map_or(Lsn::INVALID, |i| i.disk_consistent_lsn)
    }

    /// Bytes of target layers not yet in the store: the upload queue's length.
    pub(crate) fn pending_bytes(&self) -> u64 {
        self.missing().iter().map(|(_, l)| l.size).sum()
    }

    pub(crate) fn is_fenced(&self) -> bool {
        self.fenced
    }

    /// A listing found a newer generation's index: stop for good.
    pub(crate) fn fence(&mut self) {
        self.fenced = true;
    }

    /// Nothing left to do: the durable index is the target, and nothing waits deletion.
    pub(crate) fn is_settled(&self) -> bool {
        self.next() == Step::Idle
    }

    fn missing(&self) -> Vec<(String, IndexLayer)> {
        let Some(target) = &self.target else {
            return Vec::new();
        };
        target
            .layers
            .iter()
            .filter(|(name, _)| !self.present.contains_key(*name))
            .map(|(name, l)| {
                let mut l = l.clone();
                l.generation = self.generation;
                (name.clone(), l)
            })
            .collect()
    }

    pub(crate) fn next(&self) -> Step {
        if self.fenced {
            return Step::Idle;
        }
        let missing = self.missing();
        if !missing.is_empty() {
            return Step::UploadLayers(missing);
        }
        if let Some(target) = &self.target {
            if self.uploaded.as_ref() != Some(target) {
                return Step::UploadIndex(target.clone());
            }
        }
        let listed = |name: &str| {
            self.uploaded
                .as_ref()
                .is_some_and(|i| i.layers.contains_key(name))
                || self
                    .target
                    .as_ref()
                    .is_some_and(|t| t.layers.contains_key(name))
        };
        let garbage: Vec<(String, IndexLayer)> = self
            .present
            .iter()
            .filter(|(name, _)| !listed(name))
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

    /// Layer `name` is in the store now, as `layer` says.
    pub(crate) fn layer_uploaded(&mut self, name: &str, layer: IndexLayer) {
        self.present.insert(name.to_owned(), layer);
    }

    /// `index` is durable in the store.
    pub(crate) fn index_uploaded(&mut self, index: IndexPart) {
        self.uploaded = Some(index);
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
        listed |= self.uploaded.as_ref().and_then(listed_as) == Some(generation);
        listed |= self.target.as_ref().and_then(listed_as) == Some(generation);
        !listed
    }
}

#[cfg(test)]
mod tests;
