//! libFuzzer's driver for `fuzz_targets::wal_decoder` (libs/fuzz_targets/src/wal_decoder.rs),
//! which says what it checks; `cargo test` replays this target's corpus through the same function.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| fuzz_targets::wal_decoder::check(input));
