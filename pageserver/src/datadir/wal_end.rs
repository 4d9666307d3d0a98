//! The end of the WAL in a backup's newest WAL segment: where a cluster restored from the
//! backup stops replaying, and so the LSN the backup's state is at.
//!
//! A `pg_basebackup -X fetch` archive holds the WAL from the backup's start to at least its
//! end in `pg_wal/`. PostgreSQL started on it replays every valid record there, so the state
//! it reaches is the one at the end of the last valid record of the newest segment. This
//! module finds it by walking that segment's records the way PostgreSQL's reader does:
//!
//! ```text
//!  segment = pages of XLOG_BLCKSZ (8192) bytes, each with a header:
//!    u16 magic | u16 info | u32 timeline | u64 pageaddr | u32 rem_len   (24 bytes with padding)
//!    the first page's is the long form: + u64 sysid | u32 seg_size | u32 blcksz (40 bytes)
//!  records follow one another in the bytes after the headers, each 8-byte aligned:
//!    u32 tot_len | u32 xid | u64 prev | u8 info | u8 rmid | 2 pad | u32 crc | data...
//! ```
//!
//! The records are walked by `postgres_wal`'s decoder, which checks them as PostgreSQL's reader
//! does (see `postgres_wal::decoder`): the walk starts after the continuation of a record begun
//! in an earlier segment and stops at the first record that does not count (zeros, a page of an
//! older segment in a recycled file, a torn write, a wrong `prev`); a page marked as written
//! over a record cut off before it (`XLP_FIRST_IS_OVERWRITE_CONTRECORD`) drops that record and
//! the walk goes on with the page's own. The end is the end of the last record that counted.
//! Pages of PostgreSQL 13 to 16 are walked alike (their magic is taken from the first page).

use postgres_wal::page::XLP_LONG_HEADER;
use postgres_wal::{SegmentName, WalDecoder, XLOG_BLCKSZ};
use utils::Lsn;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WalEndError {
    #[error("WAL segment {name}: {reason}")]
    Segment { name: String, reason: String },
}

/// The LSN right after the last valid record of segment `bytes` (named `name`, for errors).
pub fn wal_end(name: &str, bytes: &[u8]) -> Result<Lsn, WalEndError> {
    let fail = |reason: String| WalEndError::Segment {
        name: name.to_string(),
        reason,
    };
    if bytes.len() < XLOG_BLCKSZ || !bytes.len().is_multiple_of(XLOG_BLCKSZ) {
        return Err(fail(format!(
            "{} bytes is not a whole number of {XLOG_BLCKSZ}-byte pages",
            bytes.len()
        )));
    }
    let magic = u16_at(bytes, 0);
    let info = u16_at(bytes, 2);
    if info & XLP_LONG_HEADER == 0 {
        return Err(fail("its first page has no long header".to_string()));
    }
    let seg_size = u32_at(bytes, 32) as usize;
    let blcksz = u32_at(bytes, 36) as usize;
    if blcksz != XLOG_BLCKSZ || seg_size != bytes.len() {
        return Err(fail(format!(
            "page size {blcksz} and segment size {seg_size} do not match a {}-byte file of \
             {XLOG_BLCKSZ}-byte pages",
            bytes.len()
        )));
    }
    let start = u64_at(bytes, 8);
    if !start.is_multiple_of(seg_size as u64) {
        return Err(fail(format!(
            "its first page's address {} is not a segment boundary",
            Lsn(start)
        )));
    }
    // The file's name says where it is; a recycled file keeps the header of its older use.
    let file_name = name.rsplit('/').next().unwrap_or(name);
    if let Some(named) = SegmentName::parse(file_name, seg_size as u32) {
        let named = named.start(seg_size as u32);
        if named.0 != start {
            return Err(fail(format!(
                "its name is the segment at {named} but its pages are of {}: a recycled file (give \
                 the snapshot's LSN with lsn=)",
                Lsn(start)
            )));
        }
    }
    // Only the records' boundaries matter here: none is kept whole.
    let mut decoder = WalDecoder::new(Lsn(start), seg_size as u32)
        .expecting_magic(magic)
        .keeping_records_up_to(0);
    decoder.feed(bytes);
    // Every record that counts; the first that does not ends the WAL.
    while let Ok(Some(_)) = decoder.next_record() {}
    Ok(decoder.valid_end())
}

/// `(timeline, segment number)` of a WAL segment file name (24 hex digits), for picking the
/// newest one; `None` for other files of `pg_wal/` (history files, `archive_status`).
pub fn segment_name_order(name: &str) -> Option<(u64, u32)> {
    if name.len() != 24 || !name.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let tli = u32::from_str_radix(&name[0..8], 16).ok()?;
    let log = u64::from_str_radix(&name[8..16], 16).ok()?;
    let seg = u64::from_str_radix(&name[16..24], 16).ok()?;
    // Ordered by position (log, seg) first: a newer timeline's segment at the same position
    // is newer still.
    Some(((log << 32) | seg, tli))
}

/// Where the page address of a WAL page header ends (`u16` magic, `u16` info, `u32` timeline,
/// `u64` address): what [`is_recycled`] reads of a segment.
pub const PAGE_ADDR_END: usize = 16;

/// The LSN a data directory's member starts at, if it is a WAL segment of `pg_wal/`: named as
/// one, and of a valid segment size.
pub fn wal_segment_start(path: &str, size: u64) -> Option<Lsn> {
    let name = path.strip_prefix("pg_wal/")?;
    let segment_size = u32::try_from(size)
        .ok()
        .filter(|s| postgres_wal::segment::is_valid_segment_size(*s))?;
    SegmentName::parse(name, segment_size).map(|n| n.start(segment_size))
}

/// Whether a segment starting at `start` whose first [`PAGE_ADDR_END`] bytes are `head` is one
/// PostgreSQL recycled ahead (renamed to a future name with an older segment's pages, or
/// created empty): its first page's address is not its own, so it holds no WAL.
pub fn is_recycled(start: Lsn, head: &[u8; PAGE_ADDR_END]) -> bool {
    u64_at(head, 8) != start.0
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}
