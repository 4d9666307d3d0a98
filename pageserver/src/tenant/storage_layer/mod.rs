//! What every kind of layer shares: the records it hands to page reconstruction, the chunks of
//! keys it hands to a scan, and the bound on a stored value's size.

use pageserver_api::{Key, Value};
use utils::Lsn;

pub mod delta_layer;
pub mod ephemeral_file;
pub mod inmemory_layer;
pub mod layer_name;

pub use layer_name::LayerName;

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
