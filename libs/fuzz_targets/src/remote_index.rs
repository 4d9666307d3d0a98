//! A timeline's index in remote storage (`index_part.json`), and the history check an attach
//! runs on the manifest it describes: never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pageserver::tenant::remote_timeline_client::index::IndexPart;
use pageserver::tenant::timeline::metadata::history;

fuzz_target!(|input: &[u8]| {
    if let Ok(index) = IndexPart::parse(input) {
        let _ = history::check(&index.to_manifest());
    }
});
