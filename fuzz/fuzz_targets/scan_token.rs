//! libFuzzer's driver for `fuzz_targets::scan_token` (libs/fuzz_targets/src/scan_token.rs), which says what
//! it checks; `cargo test` replays this target's corpus through the same function.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| fuzz_targets::scan_token::check(input));
