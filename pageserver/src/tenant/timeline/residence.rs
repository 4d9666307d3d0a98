//! Which of the timeline's layer files are on the local disk, with remote storage: the local
//! disk is a cache of the store, L0 layers always resident, L1 and image layers evictable once
//! the store has them (`storage_layer::on_demand`).

use super::*;

/// One layer file's local copy, for the eviction pass and the prefetch after an attach.
#[derive(Clone)]
pub struct LocalCopy {
    pub layer: Arc<OnDemandLayer>,
    /// The durable index lists it, and it is no L0: its local copy may go.
    pub evictable: bool,
}

impl Timeline {
    /// Bytes of layer files on the local disk: every L0, and the resident L1 and image layers.
    pub fn resident_layer_bytes(&self) -> u64 {
        let map = self.layer_map();
        map.l0
            .iter()
            .chain(map.below_l0.iter())
            .filter(|l| l.is_resident())
            .map(|l| l.file_size())
            .sum()
    }

    /// The on-demand layers (with remote storage: L1 and image layers, and L0s an attach or a
    /// start left in the store), newest first.
    pub fn on_demand_layers(&self) -> Vec<LocalCopy> {
        let remote = self.remote.get();
        let map = self.layer_map();
        let l0 = map.l0.iter().rev().map(|l| (true, l));
        let below = map.below_l0.iter().map(|l| (false, l));
        l0.chain(below)
            .filter_map(|(is_l0, l)| match l {
                Layer::OnDemand(layer) => Some(LocalCopy {
                    layer: layer.clone(),
                    evictable: !is_l0
                        && remote.is_some_and(|r| {
                            r.is_in_store(layer.file_name(), layer.file_size(), layer.crc32c())
                        }),
                }),
                _ => None,
            })
            .collect()
    }
}
