//! Layers: the in-memory layer over its ephemeral file, and the layer files. [`Layer`] is what
//! every kind answers a read with, so GetPage and scans walk any mix of kinds in one loop:
//!
//! - the LSN range its versions lie in and the key range they cover, so a walk skips a layer
//!   that cannot hold a key without any I/O;
//! - a key's versions at or below an LSN, newest first, down to one that needs no older
//!   history ([`LayerRecords`]);
//! - the keys in a range with a version at or below an LSN, a chunk at a time ([`KeyChunk`]).

use std::ops::Range;
use std::sync::Arc;

use pageserver_api::{Key, Value};
use utils::Lsn;

use delta_layer::{DeltaLayer, DeltaLayerError};
use image_layer::{ImageLayer, ImageLayerError};
use inmemory_layer::{GetError, InMemoryLayer};

pub mod delta_layer;
pub mod ephemeral_file;
pub mod image_layer;
pub mod inmemory_layer;
mod layer_file;
pub mod layer_name;
pub mod merge_iter;

pub use layer_name::LayerName;

/// One layer, of any kind, as a read sees it. Cloning it clones an `Arc`.
#[derive(Clone)]
pub enum Layer {
    /// The open layer or a frozen one.
    InMemory(Arc<InMemoryLayer>),
    Delta(Arc<DeltaLayer>),
    Image(Arc<ImageLayer>),
}

/// A read of one layer failed.
#[derive(Debug, thiserror::Error)]
pub enum LayerReadError {
    #[error(transparent)]
    InMemory(#[from] GetError),
    #[error(transparent)]
    Delta(#[from] DeltaLayerError),
    #[error(transparent)]
    Image(#[from] ImageLayerError),
}

impl Layer {
    /// The LSNs its versions lie in. An in-memory layer's ends after its newest version so
    /// far (the open layer's grows with every put).
    pub fn lsn_range(&self) -> Range<Lsn> {
        match self {
            Layer::InMemory(l) => l.start_lsn()..Lsn(l.last_lsn().0 + 1),
            Layer::Delta(l) => l.summary().lsn_start..l.summary().lsn_end,
            Layer::Image(l) => l.summary().lsn..Lsn(l.summary().lsn.0 + 1),
        }
    }

    /// The keys its versions are of. An in-memory layer may hold any key.
    pub fn key_range(&self) -> Range<Key> {
        match self {
            Layer::InMemory(_) => Key::MIN..Key::MAX,
            Layer::Delta(l) => l.summary().key_start..l.summary().key_end,
            Layer::Image(l) => l.summary().key_start..l.summary().key_end,
        }
    }

    /// Whether it can hold a version at or below `lsn` of a key in `keys`: a read skips a
    /// layer that cannot, without touching it.
    pub fn may_hold(&self, keys: &Range<Key>, lsn: Lsn) -> bool {
        let own = self.key_range();
        let empty = matches!(self, Layer::InMemory(l) if l.is_empty());
        !empty && self.lsn_range().start <= lsn && own.start < keys.end && keys.start < own.end
    }

    /// `key`'s versions at or below `lsn`, newest first, down to the first that needs no older
    /// history.
    pub fn get(&self, key: Key, lsn: Lsn) -> Result<LayerRecords, LayerReadError> {
        Ok(match self {
            Layer::InMemory(l) => l.get(key, lsn)?,
            Layer::Delta(l) => l.get(key, lsn)?,
            Layer::Image(l) => l.get(key, lsn)?,
        })
    }

    /// The keys in `[from, end)` with a version at or below `lsn`, in key order, at most
    /// `max_keys` of them.
    pub fn keys_at_lsn(
        &self,
        from: Key,
        end: Key,
        lsn: Lsn,
        max_keys: usize,
    ) -> Result<KeyChunk, LayerReadError> {
        Ok(match self {
            Layer::InMemory(l) => l.keys_at_lsn(from, end, lsn, max_keys),
            Layer::Delta(l) => l.keys_at_lsn(from, end, lsn, max_keys)?,
            Layer::Image(l) => l.keys_at_lsn(from, end, lsn, max_keys)?,
        })
    }
}

/// What one layer contributes to reconstructing a page.
#[derive(Debug, Default)]
pub struct LayerRecords {
    /// The key's versions at or below the requested LSN, newest first.
    pub records: Vec<(Lsn, Value)>,
    /// The last record needs no older history: older layers need not be visited.
    pub complete: bool,
}

/// A run of the keys a layer holds with a version at or below some LSN, in key order: what a
/// scan's key stream over that layer buffers (see `timeline::scan`).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct KeyChunk {
    pub keys: Vec<Key>,
    /// Where the next chunk starts; `None` when the range holds no more such keys.
    pub resume: Option<Key>,
}

/// A stored value (its serialized form) may exceed `max_value_size` by this much: its kind
/// byte and delta patch headers.
const STORED_VALUE_SLACK: usize = 64;

/// The longest serialized value a layer accepts or reads back, for a configured
/// `max_value_size`. Readers use it to refuse a corrupt length before allocating for it.
pub fn max_stored_value_len(max_value_size: usize) -> usize {
    max_value_size.saturating_add(STORED_VALUE_SLACK)
}
