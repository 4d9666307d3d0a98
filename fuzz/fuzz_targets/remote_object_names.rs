//! libFuzzer's driver for `fuzz_targets::remote_object_names` (libs/fuzz_targets/src/remote_object_names.rs), which says what
//! it checks; `cargo test` replays this target's corpus through the same function.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| fuzz_targets::remote_object_names::check(input));
