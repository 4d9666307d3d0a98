//! libFuzzer's driver for `fuzz_targets::image_layer` (libs/fuzz_targets/src/image_layer.rs), which says what
//! it checks; `cargo test` replays this target's corpus through the same function.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| fuzz_targets::image_layer::check(input));
