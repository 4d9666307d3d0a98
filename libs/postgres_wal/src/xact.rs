//! Transaction end records (`RM_XACT_ID`): which transactions committed or aborted, and when.
//!
//! A commit or abort record's main data starts with the time the transaction ended
//! (`TimestampTz`: microseconds since 2000-01-01 00:00 UTC); what follows (subtransactions,
//! dropped relations, invalidations, two-phase details) is not read here.

use utils::Lsn;

use crate::record::{parse_parts, RM_XACT_ID};
use crate::DecodedRecord;

/// `info & XLOG_XACT_OPMASK` of a transaction record.
pub const XLOG_XACT_OPMASK: u8 = 0x70;
pub const XLOG_XACT_COMMIT: u8 = 0x00;
pub const XLOG_XACT_PREPARE: u8 = 0x10;
pub const XLOG_XACT_ABORT: u8 = 0x20;
pub const XLOG_XACT_COMMIT_PREPARED: u8 = 0x30;
pub const XLOG_XACT_ABORT_PREPARED: u8 = 0x40;

/// Microseconds from the Unix epoch to PostgreSQL's (2000-01-01 00:00 UTC).
pub const POSTGRES_EPOCH_UNIX_MICROS: i64 = 946_684_800 * 1_000_000;

/// How a transaction ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XactEnd {
    Commit,
    Abort,
    CommitPrepared,
    AbortPrepared,
}

impl XactEnd {
    pub fn is_commit(self) -> bool {
        matches!(self, XactEnd::Commit | XactEnd::CommitPrepared)
    }
}

/// A transaction's end, as its record says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XactRecord {
    pub kind: XactEnd,
    /// Microseconds since 2000-01-01 00:00 UTC.
    pub time: i64,
}

impl XactRecord {
    /// The time as microseconds since the Unix epoch.
    pub fn unix_micros(&self) -> i64 {
        self.time.saturating_add(POSTGRES_EPOCH_UNIX_MICROS)
    }
}

/// The end of a transaction `record` records; `Ok(None)` for every other record.
pub fn xact_end(record: &DecodedRecord) -> Result<Option<XactRecord>, String> {
    if record.header.rmid != RM_XACT_ID {
        return Ok(None);
    }
    let kind = match record.header.info & XLOG_XACT_OPMASK {
        XLOG_XACT_COMMIT => XactEnd::Commit,
        XLOG_XACT_ABORT => XactEnd::Abort,
        XLOG_XACT_COMMIT_PREPARED => XactEnd::CommitPrepared,
        XLOG_XACT_ABORT_PREPARED => XactEnd::AbortPrepared,
        _ => return Ok(None),
    };
    let parts = parse_parts(&record.bytes)?;
    let main = &record.bytes[parts.main_data];
    if main.len() < 8 {
        return Err(format!(
            "a transaction end record at {} with {} bytes of main data, fewer than its time's 8",
            record.start,
            main.len()
        ));
    }
    let mut time = [0u8; 8];
    time.copy_from_slice(&main[..8]);
    Ok(Some(XactRecord {
        kind,
        time: i64::from_le_bytes(time),
    }))
}

/// The first and the last commit of a stretch of WAL: each commit's end LSN (where the state
/// after it begins) and its time, in microseconds since the Unix epoch. An index of these
/// per segment finds the segment that holds the last commit before a given time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommitRange {
    pub first_end: Lsn,
    pub first_time: i64,
    pub last_end: Lsn,
    pub last_time: i64,
}

impl CommitRange {
    /// The range of the commits so far with one more, at `end`, made at `time`.
    pub fn with(range: Option<CommitRange>, end: Lsn, time: i64) -> CommitRange {
        match range {
            None => CommitRange {
                first_end: end,
                first_time: time,
                last_end: end,
                last_time: time,
            },
            Some(r) => CommitRange {
                last_end: end,
                last_time: time,
                ..r
            },
        }
    }
}

/// A commit's end and time, if `record` is a commit.
pub fn commit_of(record: &DecodedRecord) -> Option<(Lsn, i64)> {
    match xact_end(record) {
        Ok(Some(x)) if x.kind.is_commit() => Some((record.end, x.unix_micros())),
        _ => None,
    }
}
