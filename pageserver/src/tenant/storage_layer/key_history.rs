//! The one rule by which every read collects a key's versions: GetPage's walk, a batch's
//! read-ahead and a scan's merge each ask [`KeyHistory`] which of a layer's versions they take.
//!
//! Layers are walked newest first (the layer map's order, then an ancestor's layers for a
//! branch). From each, the read is handed the key's versions at or below its LSN, newest first.
//! It takes them down to, and including, the first that needs no older history (an image, or a
//! delta that initializes the page), and then needs no older layer. A layer that answers for
//! every key of its range whether it holds an entry or not (an image layer: see
//! [`Layer::is_authoritative_for`]) ends the history too, even with nothing taken from it: the
//! page does not exist there. A read that starts from a materialized page takes no version at or
//! below that page's LSN (the page already includes them), and needs no layer whose versions all
//! lie there.

use pageserver_api::{Key, Value};
use utils::Lsn;

use super::{Layer, LayerRecords, VersionRef};

/// A version as a layer hands it to a read: with its value ([`Layer::get`]) or as a reference
/// to it ([`Layer::versions_at_lsn`]).
pub trait Version {
    fn lsn(&self) -> Lsn;
    fn will_init(&self) -> bool;
}

impl Version for (Lsn, Value) {
    fn lsn(&self) -> Lsn {
        self.0
    }
    fn will_init(&self) -> bool {
        self.1.will_init()
    }
}

impl Version for VersionRef {
    fn lsn(&self) -> Lsn {
        self.lsn
    }
    fn will_init(&self) -> bool {
        self.will_init
    }
}

/// Where a read of one key stands in its walk over the layers: see the module documentation.
#[derive(Debug, Default, Clone, Copy)]
pub struct KeyHistory {
    /// The LSN of the materialized page the read starts from: versions at or below it are in
    /// the page already.
    floor: Option<Lsn>,
    complete: bool,
}

impl KeyHistory {
    /// A read that starts from a materialized page of LSN `floor` (`None`: from nothing).
    pub fn from_floor(floor: Option<Lsn>) -> KeyHistory {
        KeyHistory {
            floor,
            complete: false,
        }
    }

    /// Whether the versions taken so far need nothing older: no older layer is asked.
    pub fn is_complete(&self) -> bool {
        self.complete
    }

    /// Whether `layer` can add nothing, and neither can any older one: all its versions lie at
    /// or below the floor. The history is then complete.
    pub fn ends_before(&mut self, layer: &Layer) -> bool {
        let newest = Lsn(layer.lsn_range().end.0.saturating_sub(1));
        if self.floor.is_some_and(|floor| newest <= floor) {
            self.complete = true;
        }
        self.complete
    }

    /// [`Self::take`] of what [`Layer::get_above`] handed back: a layer that stopped at the
    /// floor (complete, with every version it handed back above the floor) completes the
    /// history too.
    pub fn take_records(&mut self, layer: &Layer, key: Key, found: &LayerRecords) -> usize {
        let taken = self.take(layer, key, &found.records);
        if found.complete && taken == found.records.len() {
            self.complete = true;
        }
        taken
    }

    /// How many of `versions` (the key's versions in `layer`, newest first) the read takes;
    /// marks the history complete where they reach a base, the floor, or a layer that answers
    /// for the key. `layer` must be one the read visits: one that may hold a version of the key
    /// at or below the read's LSN ([`Layer::may_hold`]), as every walk checks first; an image
    /// layer above that LSN answers for nothing.
    pub fn take<V: Version>(&mut self, layer: &Layer, key: Key, versions: &[V]) -> usize {
        if self.complete {
            return 0;
        }
        let mut taken = 0;
        for version in versions {
            if self.floor.is_some_and(|floor| version.lsn() <= floor) {
                self.complete = true;
                break;
            }
            taken += 1;
            if version.will_init() {
                self.complete = true;
                break;
            }
        }
        self.complete |= layer.is_authoritative_for(key);
        taken
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;
    use pageserver_api::value::Patch;
    use pageserver_api::DEFAULT_MAX_VALUE_SIZE;

    use super::*;
    use crate::tenant::storage_layer::inmemory_layer::InMemoryLayer;
    use crate::tenant::test_support::{rel_key, small_cache};

    fn delta(will_init: bool) -> Value {
        Value::Delta {
            will_init,
            patches: vec![Patch::new(0, Bytes::from_static(b"x"))],
        }
    }

    /// An in-memory layer holding the versions of key 1 at `lsns` (ascending), and those
    /// versions newest first, as `Layer::get` hands them to a read.
    fn layer_with(dir: &std::path::Path, versions: &[(u64, Value)]) -> (Layer, Vec<(Lsn, Value)>) {
        let layer =
            InMemoryLayer::create(dir, small_cache(8), Lsn(10), DEFAULT_MAX_VALUE_SIZE).unwrap();
        for (lsn, value) in versions {
            layer.put(rel_key(1), Lsn(*lsn), value).unwrap();
        }
        let layer = Layer::InMemory(Arc::new(layer));
        let records = layer.get(rel_key(1), Lsn(u64::MAX >> 1)).unwrap().records;
        (layer, records)
    }

    #[test]
    fn a_read_takes_versions_down_to_the_first_base() {
        let dir = tempfile::tempdir().unwrap();
        let image = Value::Image(Bytes::from_static(b"page"));
        let (layer, newest_first) = layer_with(
            dir.path(),
            &[(10, image), (20, delta(true)), (30, delta(false))],
        );
        // The layer itself hands out the versions down to its base: 30 and 20.
        assert_eq!(newest_first.len(), 2);
        let mut history = KeyHistory::default();
        assert!(!history.ends_before(&layer));
        assert_eq!(history.take(&layer, rel_key(1), &newest_first), 2);
        assert!(history.is_complete());
        // Once complete, nothing more is taken, from any layer.
        assert_eq!(history.take(&layer, rel_key(1), &newest_first), 0);

        // Without a base the history stays open: older layers are asked.
        let dir = tempfile::tempdir().unwrap();
        let (layer, newest_first) =
            layer_with(dir.path(), &[(20, delta(false)), (30, delta(false))]);
        let mut history = KeyHistory::default();
        assert_eq!(history.take(&layer, rel_key(1), &newest_first), 2);
        assert!(!history.is_complete());
    }

    #[test]
    fn a_materialized_page_is_the_floor() {
        let dir = tempfile::tempdir().unwrap();
        let (layer, newest_first) = layer_with(
            dir.path(),
            &[(20, delta(false)), (30, delta(false)), (40, delta(false))],
        );
        // A page materialized at 30 holds 30 and 20: only 40 is taken, and nothing older is
        // needed.
        let mut history = KeyHistory::from_floor(Some(Lsn(30)));
        assert!(!history.ends_before(&layer));
        assert_eq!(history.take(&layer, rel_key(1), &newest_first), 1);
        assert!(history.is_complete());
        // A layer whose every version lies at or below the floor adds nothing, nor do older.
        let mut history = KeyHistory::from_floor(Some(Lsn(40)));
        assert!(history.ends_before(&layer));
        assert!(history.is_complete());
    }
}
