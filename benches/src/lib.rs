//! Benchmarks live in `benches/`; this crate only hosts them.
