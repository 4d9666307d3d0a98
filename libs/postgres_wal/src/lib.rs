//! The write-ahead log of PostgreSQL 15, read from the bytes up, every byte untrusted.
//!
//! - [`segment`]: WAL file names (`000000010000000000000003`, `00000002.history`) and the
//!   arithmetic between LSNs and segments;
//! - [`history`]: timeline history files, the line of timelines a timeline descends from;
//! - [`image`]: full-page images back to their pages (pglz, LZ4 and Zstandard, the hole);
//! - [`page`]: the header every 8 KiB WAL page starts with;
//! - [`decoder`]: [`WalDecoder`], fed the WAL in order in chunks of any size (a replication
//!   stream, a segment file) and handing back whole records, each checked: every page's
//!   header names its own address, a record continues only on pages that say so, every record
//!   names the one before it and carries a CRC-32C of its bytes;
//! - [`edit`]: records written into WAL laid over pages already (copies of it: a checkpoint
//!   record where a replay is to stop or start), the page headers they continue after;
//! - [`record`]: a record's header and the parts after it (block references, main data);
//! - [`xact`]: commit and abort records, the times transactions ended;
//! - [`synthetic`]: WAL written the way PostgreSQL lays it over pages, for tests.
//!
//! The layouts are PostgreSQL 15's (`XLOG_PAGE_MAGIC` 0xD110); a page of another version is
//! refused with its magic named, not misread.

pub mod decoder;
pub mod edit;
pub mod history;
pub mod image;
pub mod page;
pub mod record;
pub mod segment;
pub mod synthetic;
pub mod xact;

pub use decoder::{DecodedRecord, WalDecoder, WalError};
pub use segment::SegmentName;
pub use utils::Lsn;

/// Bytes in a WAL page (`XLOG_BLCKSZ`).
pub const XLOG_BLCKSZ: usize = 8192;
/// Bytes in a relation page (`BLCKSZ`), the size of a full-page image with its hole.
pub const BLCKSZ: usize = 8192;
/// The segment size `initdb` picks unless told otherwise.
pub const DEFAULT_SEGMENT_SIZE: u32 = 16 << 20;
/// The page magic of PostgreSQL 15's WAL.
pub const XLOG_PAGE_MAGIC: u16 = 0xD110;
/// Records start at multiples of this (`MAXALIGN` on 64-bit machines).
pub const RECORD_ALIGN: u64 = 8;
/// The most a record may be (`XLogRecordMaxSize`, 1020 MiB).
pub const MAX_RECORD_LEN: u32 = 1020 * 1024 * 1024;

pub(crate) fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}
