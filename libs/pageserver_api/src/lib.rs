//! Types shared by the page server and the programs that talk to it.
//!
//! Whatever crosses the boundary between the page server and its clients
//! (or gets written into its files) is defined here once, with a fixed
//! serialized form, so both sides agree on it byte for byte:
//!
//! - [`key`]: [`Key`], the 18-byte address of a page or piece of metadata.
//! - [`value`]: [`Value`], one version of a page (a full image or a delta of
//!   [`Patch`]es), and its stable byte format, used inside ephemeral and
//!   delta layer files.
//! - [`ingest`]: the body of an ingest request, a batch of [`ingest::PutRecord`]s, with its
//!   encoder and a decoder that trusts nothing.
//! - [`datadir`]: the key space of a PostgreSQL data directory (relation blocks and sizes,
//!   relation directories, files byte for byte, snapshots) and its metadata value formats.
//! - [`reconstruct`]: redo, which builds a page from its newest image or
//!   `will_init` delta and the deltas after it ([`reconstruct_page`],
//!   [`apply_delta`]).

pub mod datadir;
pub mod ingest;
pub mod key;
pub mod reconstruct;
pub mod value;

pub use key::Key;
pub use reconstruct::{
    apply_delta, reconstruct_page, reconstruct_page_taking, RedoError, RedoErrorKind,
    ZERO_PAGE_SIZE,
};
pub use value::{
    Patch, Value, ValueDecodeError, ValueEncodeError, ValueField, DEFAULT_MAX_VALUE_SIZE,
};
