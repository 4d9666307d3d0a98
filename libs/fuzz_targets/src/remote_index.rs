//! A timeline's index in remote storage (`index_part.json`), and the history check an attach
//! runs on the manifest it describes: never panics.

use pageserver::tenant::remote_timeline_client::index::IndexPart;
use pageserver::tenant::timeline::layer_set::manifest::history;

/// Checks one input; panics where the decoder breaks its contract.
pub fn check(input: &[u8]) {
    if let Ok(index) = IndexPart::parse(input) {
        let _ = history::check(&index.to_manifest());
    }
}
