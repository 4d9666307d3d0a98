//! libFuzzer's driver for `fuzz_targets::value_frame` (libs/fuzz_targets/src/value_frame.rs), which says
//! what it checks; `cargo test` replays this target's corpus through the same function.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| fuzz_targets::value_frame::check(input));
