//! The checks of the fuzz targets (docs/fuzzing.md): one module per decoder of untrusted bytes,
//! each with a `check(input)` that feeds it one input and panics where the decoder breaks its
//! contract (a panic of its own, a hang, a wrong answer, an error that does not name its file).
//!
//! Two drivers call the same functions:
//! - `fuzz/`, a crate outside this workspace, has one libFuzzer binary per module whose whole
//!   body is `fuzz_target!(|input: &[u8]| fuzz_targets::<module>::check(input))`; `cargo fuzz`
//!   builds those with coverage instrumentation and a sanitizer and searches for new inputs;
//! - `tests/corpus.rs` replays every input of `fuzz/corpus/<module>` through `check` in a
//!   plain `cargo test`, so the inputs that once found a bug stay fixed without building
//!   libFuzzer (a C++ library) or a second copy of the server's dependencies.
//!
//! Each module is named after its fuzz target and its corpus directory; the replay test fails
//! when the three lists differ.

pub mod damage;

pub mod datadir_values;
pub mod delta_layer;
pub mod disk_btree;
pub mod image_layer;
pub mod ingest_body;
pub mod manifest;
pub mod remote_index;
pub mod remote_object_names;
pub mod scan_token;
pub mod tar_import;
pub mod value;
pub mod value_frame;
pub mod wal_decoder;
