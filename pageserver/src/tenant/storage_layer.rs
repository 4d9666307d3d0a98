//! What every kind of layer shares: the records it hands to page reconstruction, and the
//! bound on a stored value's size.

use pageserver_api::Value;
use utils::Lsn;

/// What one layer contributes to reconstructing a page.
#[derive(Debug, Default)]
pub struct LayerRecords {
    /// The key's versions at or below the requested LSN, newest first.
    pub records: Vec<(Lsn, Value)>,
    /// The last record needs no older history: older layers need not be visited.
    pub complete: bool,
}

/// A stored value (its serialized form) may exceed `max_value_size` by this much: its kind
/// byte and delta patch headers.
const STORED_VALUE_SLACK: usize = 64;

/// The longest serialized value a layer accepts or reads back, for a configured
/// `max_value_size`. Readers use it to refuse a corrupt length before allocating for it.
pub fn max_stored_value_len(max_value_size: usize) -> usize {
    max_value_size.saturating_add(STORED_VALUE_SLACK)
}
