//! Transaction end records (`RM_XACT_ID`): which transactions committed or aborted, and when.
//!
//! A commit or abort record's main data starts with the time the transaction ended
//! (`TimestampTz`: microseconds since 2000-01-01 00:00 UTC); [`xact_end_details`] reads what
//! follows as far as the transactions whose status it sets and the relations it drops go
//! (PostgreSQL 15's `ParseCommitRecord` and `ParseAbortRecord`: with `XLOG_XACT_HAS_INFO`, an
//! `xinfo` word, then the database, the subtransactions, the relations, the dropped statistics,
//! the invalidations (commits only) and the two-phase transaction's xid, each there if `xinfo`
//! says so).

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

/// `info` bit: an `xinfo` word follows the time.
const XLOG_XACT_HAS_INFO: u8 = 0x80;
const XACT_XINFO_HAS_DBINFO: u32 = 1 << 0;
const XACT_XINFO_HAS_SUBXACTS: u32 = 1 << 1;
const XACT_XINFO_HAS_RELFILENODES: u32 = 1 << 2;
const XACT_XINFO_HAS_INVALS: u32 = 1 << 3;
const XACT_XINFO_HAS_TWOPHASE: u32 = 1 << 4;
const XACT_XINFO_HAS_DROPPED_STATS: u32 = 1 << 8;
/// Bytes of one dropped relation (`RelFileNode`), statistics item and invalidation message.
const RELFILENODE_LEN: usize = 12;
const STATS_ITEM_LEN: usize = 12;
const INVAL_MSG_LEN: usize = 16;

/// Which transactions a transaction end record ends, and the relations it drops.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XactEndDetails {
    pub kind: XactEnd,
    /// The transaction ended: the record's own, or the prepared one a two-phase end names.
    pub xid: u32,
    /// Its subtransactions, which end with it.
    pub subxacts: Vec<u32>,
    /// Relations whose files go: `(spcnode, dbnode, relnode)`.
    pub dropped: Vec<(u32, u32, u32)>,
}

/// The details of the transaction end `record` records; `Ok(None)` for every other record.
pub fn xact_end_details(record: &DecodedRecord) -> Result<Option<XactEndDetails>, String> {
    let Some(end) = xact_end(record)? else {
        return Ok(None);
    };
    let parts = parse_parts(&record.bytes)?;
    let main = &record.bytes[parts.main_data];
    let mut r = MainData { main, at: 8 };
    let xinfo = if record.header.info & XLOG_XACT_HAS_INFO != 0 {
        r.u32()?
    } else {
        0
    };
    if xinfo & XACT_XINFO_HAS_DBINFO != 0 {
        r.skip(8)?;
    }
    let mut subxacts = Vec::new();
    if xinfo & XACT_XINFO_HAS_SUBXACTS != 0 {
        let n = r.count(4)?;
        for _ in 0..n {
            subxacts.push(r.u32()?);
        }
    }
    let mut dropped = Vec::new();
    if xinfo & XACT_XINFO_HAS_RELFILENODES != 0 {
        let n = r.count(RELFILENODE_LEN)?;
        for _ in 0..n {
            dropped.push((r.u32()?, r.u32()?, r.u32()?));
        }
    }
    if xinfo & XACT_XINFO_HAS_DROPPED_STATS != 0 {
        let n = r.count(STATS_ITEM_LEN)?;
        r.skip(n * STATS_ITEM_LEN)?;
    }
    let commit = matches!(end.kind, XactEnd::Commit | XactEnd::CommitPrepared);
    if commit && xinfo & XACT_XINFO_HAS_INVALS != 0 {
        let n = r.count(INVAL_MSG_LEN)?;
        r.skip(n * INVAL_MSG_LEN)?;
    }
    let xid = if xinfo & XACT_XINFO_HAS_TWOPHASE != 0 {
        r.u32()?
    } else {
        record.header.xid
    };
    Ok(Some(XactEndDetails {
        kind: end.kind,
        xid,
        subxacts,
        dropped,
    }))
}

/// A cursor over a transaction record's main data that refuses to read past its end.
struct MainData<'a> {
    main: &'a [u8],
    at: usize,
}

impl MainData<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let end = self.at.checked_add(n).filter(|end| *end <= self.main.len());
        let Some(end) = end else {
            return Err(format!(
                "a transaction end record's main data of {} bytes ends inside a field at byte {}",
                self.main.len(),
                self.at
            ));
        };
        let bytes = &self.main[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    fn skip(&mut self, n: usize) -> Result<(), String> {
        self.take(n).map(|_| ())
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("four bytes"),
        ))
    }

    /// A count of entries of `len` bytes each, refused if the rest cannot hold them.
    fn count(&mut self, len: usize) -> Result<usize, String> {
        let n = self.u32()? as usize;
        if n.saturating_mul(len) > self.main.len() - self.at {
            return Err(format!(
                "a transaction end record counts {n} entries its main data cannot hold"
            ));
        }
        Ok(n)
    }
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
