//! What every kind of layer hands to page reconstruction.

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
