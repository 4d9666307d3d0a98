//! Types shared by the page server and the programs that talk to it.
//!
//! Whatever crosses the boundary between the page server and its clients
//! (or gets written into its files) is defined here once, with a fixed
//! serialized form, so both sides agree on it byte for byte.

pub mod key;

pub use key::Key;
