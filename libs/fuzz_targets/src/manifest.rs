//! A timeline's `metadata` file (its layer manifest), in any format, and the history check a
//! load runs on what it decodes: never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pageserver::tenant::timeline::metadata::{history, StoredMetadata, TimelineMetadata};

fuzz_target!(|input: &[u8]| {
    if let Ok(StoredMetadata::Manifest(manifest)) = TimelineMetadata::decode(input) {
        let _ = history::check(&manifest);
    }
});
