//! Small value types shared by every part of the page server.
//!
//! The types here cross crate and process boundaries (file names, on-disk
//! headers, the wire protocol, logs), so each one has a single canonical
//! text form and a parser that reports bad input as a typed error instead of
//! panicking. Keeping them in one dependency-light crate means every crate
//! agrees on those forms.

pub mod crc32c;
pub mod generation;
pub mod hex;
pub mod id;
pub mod lsn;
pub mod quote;
pub mod units;
pub mod wakeup;

pub use generation::Generation;
pub use id::{TenantId, TimelineId};
pub use lsn::Lsn;
pub use wakeup::Wakeup;
