//! A timeline's `metadata` file (its layer manifest), in any format, and the history check a
//! load runs on what it decodes: never panics.

use pageserver::tenant::timeline::layer_set::manifest::{history, Manifest, StoredMetadata};

/// Checks one input; panics where the decoder breaks its contract.
pub fn check(input: &[u8]) {
    if let Ok(StoredMetadata::Manifest(manifest)) = Manifest::decode(input) {
        let _ = history::check(&manifest);
    }
}
