//! A timeline's `metadata` file (its layer manifest), in either format: never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pageserver::tenant::timeline::metadata::TimelineMetadata;

fuzz_target!(|input: &[u8]| {
    let _ = TimelineMetadata::decode(input);
});
