//! The layer map: the layers a timeline reads, as an immutable snapshot.
//!
//! ```text
//!   newest                                                        oldest
//!   open InMemoryLayer -> frozen InMemoryLayers -> delta layer files (by LSN range)
//! ```
//!
//! A reader takes the current snapshot (`Arc<LayerMap>`: the timeline's lock on it is held only
//! to clone the `Arc`) and walks it with no lock at all, however long its file reads take.
//! Every change to the set of layers (an open layer started, a freeze, a flush's swap) builds
//! a new map from the current one and publishes it in one swap, under the timeline's lock on
//! the snapshot, which also orders such changes: two of them never work from the same old map.
//! A reader keeps the layers of its snapshot alive (an `Arc` each) until it lets go, so a layer
//! replaced meanwhile is still readable, and its file is removed only after the last reader.
//!
//! Puts do not change the map: the open layer takes versions through `&self` and publishes each
//! in its index as soon as its bytes are stored (see `InMemoryLayer`), so a reader never waits
//! for a batch, and sees no version above `last_record_lsn` because it reads at or below it.

use std::sync::Arc;

use crate::tenant::storage_layer::delta_layer::DeltaLayer;
use crate::tenant::storage_layer::inmemory_layer::InMemoryLayer;
use crate::tenant::storage_layer::Layer;

#[derive(Clone, Default)]
pub(crate) struct LayerMap {
    pub(crate) open: Option<Arc<InMemoryLayer>>,
    /// Oldest first.
    pub(crate) frozen: Vec<Arc<InMemoryLayer>>,
    /// Oldest first (by LSN range).
    pub(crate) deltas: Vec<Arc<DeltaLayer>>,
    /// Changes with every new map: a scan cursor whose key streams were built on another
    /// version no longer describes these layers (see `timeline::scan`).
    pub(crate) version: u64,
}

impl LayerMap {
    /// Every layer, newest first: the order in which reads visit them.
    pub(crate) fn newest_first(&self) -> impl Iterator<Item = Layer> + '_ {
        let open = self.open.iter().cloned().map(Layer::InMemory);
        let frozen = self.frozen.iter().rev().cloned().map(Layer::InMemory);
        let deltas = self.deltas.iter().rev().cloned().map(Layer::Delta);
        open.chain(frozen).chain(deltas)
    }
}
