//! The layer map: the layers a timeline reads, as an immutable snapshot.
//!
//! ```text
//!   newest                                                                      oldest
//!   open InMemoryLayer -> frozen InMemoryLayers -> L0 deltas -> L1 deltas and images
//! ```
//!
//! L0 delta layers are the flushes' and imports' output: one per flush, their LSN ranges
//! tiling the newest history above the L1s, and a group per import (`import.rs`): up to
//! `MAX_IMPORT_RUNS + 1` layers sharing one LSN range `[base + 1, lsn + 1)` (every version at
//! `lsn`), each holding its own keys
//! (no key is in two of them). A read walks a group like any L0s, probing each layer whose key
//! range covers its key (the group's files overlap in key range: up to all of them). What the
//! L0 thresholds count is the [depth](LayerMap::l0_depth), the number of distinct LSN ranges:
//! compaction takes groups whole and cannot fold a group alone (its outputs would take the
//! group's LSN range and could take an input's name), so a group counts once, or a lone one
//! could hold ingest at a threshold that nothing can bring it under.
//!
//! Below them lie what compaction and image creation write: runs of L1 delta layers (one LSN
//! range, each a part of the key space) and image layers (every page of a key range at one
//! LSN). They are kept newest first: by the end of their LSN range, and an
//! image before the deltas that end where it does (it is their keys' pages as of their last
//! LSN). That order is a valid walk for any key because no L1 straddles an image's LSN: images
//! are made only at the LSN where the L1s end, and only L0s above it are compacted later.
//!
//! A reader takes the current snapshot (`Arc<LayerMap>`: the timeline's lock on it is held only
//! to clone the `Arc`) and walks it with no lock at all, however long its file reads take.
//! Every change to the set of layers (an open layer started, a freeze, a flush, an import, a compaction,
//! an image creation, GC) builds a new map from the current one and publishes it in one swap,
//! under the timeline's lock on the snapshot, which also orders such changes: two of them never work from the same old map.
//! A reader keeps the layers of its snapshot alive (an `Arc` each) until it lets go, so a layer
//! replaced meanwhile is still readable, and its file is removed only after the last reader.
//!
//! Puts do not change the map: the open layer takes versions through `&self` and publishes each
//! in its index as soon as its bytes are stored (see `InMemoryLayer`), so a reader never waits
//! for a batch, and sees no version above `last_record_lsn` because it reads at or below it.

use std::ops::Range;
use std::sync::Arc;

use pageserver_api::Key;
use utils::Lsn;

use crate::tenant::storage_layer::inmemory_layer::InMemoryLayer;
use crate::tenant::storage_layer::Layer;
use crate::tenant::timeline::layer_set::manifest::LayerLevel;

#[derive(Clone, Default)]
pub(crate) struct LayerMap {
    pub(crate) open: Option<Arc<InMemoryLayer>>,
    /// Oldest first.
    pub(crate) frozen: Vec<Arc<InMemoryLayer>>,
    /// L0 delta layers, oldest first (by LSN range): `Layer::Delta`, or `Layer::OnDemand` for
    /// one an attach or a start left in remote storage (never evicted once resident).
    pub(crate) l0: Vec<Layer>,
    /// L1 delta layers and image layers, newest first (see the module documentation).
    pub(crate) below_l0: Vec<Layer>,
    /// Reads below this LSN are refused: GC may have removed what they need (see `gc.rs`). It
    /// lives in the snapshot so that a read checks it against the very layers it walks.
    pub(crate) gc_cutoff: Lsn,
    /// Changes with every new map: a scan cursor whose version streams were built on another
    /// version no longer describes these layers (see `timeline::scan`).
    pub(crate) version: u64,
}

impl LayerMap {
    /// Every layer, newest first: the order in which reads visit them.
    pub(crate) fn newest_first(&self) -> impl Iterator<Item = Layer> + '_ {
        let open = self.open.iter().cloned().map(Layer::InMemory);
        let frozen = self.frozen.iter().rev().cloned().map(Layer::InMemory);
        let l0 = self.l0.iter().rev().cloned();
        open.chain(frozen)
            .chain(l0)
            .chain(self.below_l0.iter().cloned())
    }

    /// The L0 layers' distinct LSN ranges: a flush adds one, an import one for its whole group.
    pub(crate) fn l0_depth(&self) -> usize {
        l0_depth(&self.l0)
    }

    /// Where the L1 layers (and images) end: the end of the newest one's LSN range. `None`
    /// when there are none.
    pub(crate) fn l1_end(&self) -> Option<Lsn> {
        self.below_l0.iter().map(|l| l.lsn_range().end).max()
    }

    /// The key range and LSN of every image layer, in map order: what image creation cuts the
    /// key space by and what GC checks coverage against.
    pub(crate) fn image_ranges(&self) -> Vec<(Range<Key>, Lsn)> {
        self.below_l0
            .iter()
            .filter(|l| l.is_image())
            .map(|l| (l.key_range(), l.lsn_range().start))
            .collect()
    }

    /// Every layer file, newest first, with its level.
    pub(crate) fn files(&self) -> Vec<(LayerLevel, Layer)> {
        let l0 = self.l0.iter().rev().map(|l| (LayerLevel::L0, l.clone()));
        let below = self.below_l0.iter().map(|layer| {
            let level = if layer.is_image() {
                LayerLevel::Image
            } else {
                LayerLevel::L1
            };
            (level, layer.clone())
        });
        l0.chain(below).collect()
    }

    /// Puts `below_l0` in walk order: by the end of the LSN range, newest first, an image
    /// before the deltas ending where it does; then by key range, for a stable listing.
    pub(crate) fn sort_below_l0(&mut self) {
        self.below_l0.sort_by(|a, b| {
            let (ra, rb) = (a.lsn_range(), b.lsn_range());
            let image_first = |l: &Layer| !l.is_image();
            rb.end
                .cmp(&ra.end)
                .then(image_first(a).cmp(&image_first(b)))
                .then(a.key_range().start.cmp(&b.key_range().start))
        });
    }
}

/// The distinct LSN ranges of `l0`, kept oldest first (a group's layers are adjacent).
pub(crate) fn l0_depth(l0: &[Layer]) -> usize {
    let mut depth = 0;
    let mut previous = None;
    for layer in l0 {
        let range = layer.lsn_range();
        if previous.as_ref() != Some(&range) {
            depth += 1;
            previous = Some(range);
        }
    }
    depth
}
