//! A timeline's index in remote storage (`index_part.json`): never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pageserver::tenant::remote_timeline_client::index::IndexPart;

fuzz_target!(|input: &[u8]| {
    let _ = IndexPart::parse(input);
});
