//! Restores by time: the LSN of the state after the last commit at or before a time, as
//! PostgreSQL's `recovery_target_time` would stop (commits at exactly that time included).
//!
//! The WAL archive's index lists each segment's first and last commit (`CommitRange`, built as
//! the segments are uploaded). The search takes the last segment whose first commit is at or
//! before the time, and decodes the WAL from the segment before it (so that a commit record
//! that spans into it is read whole) until the first commit after the time: the answer is the
//! end of the last commit before that one. The segments are read from the local disk, or
//! fetched from the archive when it lacks them, and past what the archive lists, from the
//! local disk alone (the archive is up to `wal_upload_interval` behind the WAL flushed). Only
//! transaction records are kept whole.
//!
//! The answer's kind, as Neon's `get_lsn_by_timestamp` names them: `present` (a commit after
//! the time exists: the answer is exact), `future` (no commit after the time yet: the answer is
//! the last commit, and may move as more WAL arrives), `past` (the time is before the first
//! commit the archive holds), `nodata` (the archive holds no commit).

use std::io::Read;

use postgres_wal::record::RM_XACT_ID;
use postgres_wal::segment::segment_start;
use postgres_wal::xact::commit_of;
use postgres_wal::WalDecoder;
use serde::Serialize;
use utils::Lsn;

use super::replay_plan::latest_segment_file;
use super::wal_store::{find_file, WAL_DIR};
use crate::tenant::timeline::Timeline;

/// Transaction records up to this length are read for their time.
const MAX_XACT_RECORD: usize = 1 << 20;
const CHUNK: usize = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Found {
    Present,
    Future,
    Past,
    Nodata,
}

/// See the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LsnByTime {
    pub kind: Found,
    /// The end of the last commit at or before the time (`present`, `future`); the end of the
    /// first commit the archive holds (`past`); none for `nodata`.
    pub lsn: Option<Lsn>,
    /// That commit's time, in microseconds since the Unix epoch.
    pub commit_time: Option<i64>,
}

/// The LSN of `timeline`'s state after its last commit at or before `time` (microseconds since
/// the Unix epoch); the error says what could not be read.
pub fn lsn_by_time(timeline: &Timeline, time: i64) -> Result<LsnByTime, String> {
    let nodata = LsnByTime {
        kind: Found::Nodata,
        lsn: None,
        commit_time: None,
    };
    let Some(remote) = timeline.remote_copy() else {
        return Ok(nodata);
    };
    let Some(archived) = remote.archived_wal_segments() else {
        return Ok(nodata);
    };
    let size = archived.segment_size;
    let with_commits: Vec<_> = archived
        .segments
        .iter()
        .filter_map(|(segno, _, c)| c.map(|c| (*segno, c)))
        .collect();
    let Some(&(_, first)) = with_commits.first() else {
        return Ok(nodata);
    };
    if time < first.first_time {
        return Ok(LsnByTime {
            kind: Found::Past,
            lsn: Some(first.first_end),
            commit_time: Some(first.first_time),
        });
    }
    let candidate = with_commits
        .iter()
        .rev()
        .find(|(_, c)| c.first_time <= time)
        .map(|(segno, _)| *segno)
        .expect("the first one qualifies");
    let listed = |segno: u64| archived.segments.iter().any(|(s, _, _)| *s == segno);
    let from = if candidate > 0 && listed(candidate - 1) {
        candidate - 1
    } else {
        candidate
    };
    // What the ranges before the decoded stretch say: the last commit at or before the time.
    let mut last = with_commits
        .iter()
        .filter(|(segno, c)| *segno < from && c.last_time <= time)
        .map(|(_, c)| (c.last_end, c.last_time))
        .next_back();
    let mut decoder = WalDecoder::new(segment_start(from, size), size)
        .keeping_records_up_to(0)
        .keeping_records_of(RM_XACT_ID, MAX_XACT_RECORD);
    let dir = timeline.dir().join(WAL_DIR);
    let mut buf = vec![0u8; CHUNK];
    // On through the segments the archive lists, then those only the local disk has yet (the
    // archive is up to `wal_upload_interval` behind), to where the WAL ends; each under the
    // latest PostgreSQL timeline stored for it (a switch moves its segment to the new name).
    'segments: for segno in from.. {
        let listed = archived
            .segments
            .iter()
            .find(|(s, _, _)| *s == segno)
            .map(|(_, name, _)| name.clone());
        if let Some(name) = &listed {
            remote.fetch_wal(&dir, name)?;
        }
        let path = match &listed {
            Some(name) => find_file(timeline.dir(), name),
            None => latest_segment_file(timeline.dir(), segno, size),
        };
        let Some(path) = path else {
            break;
        };
        let mut file =
            std::fs::File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        loop {
            let n = file
                .read(&mut buf)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            if n == 0 {
                break;
            }
            decoder.feed(&buf[..n]);
            loop {
                match decoder.next_record() {
                    Ok(Some(record)) => {
                        if let Some((end, at)) = commit_of(&record) {
                            if at > time {
                                return Ok(found(Found::Present, last));
                            }
                            last = Some((end, at));
                        }
                    }
                    Ok(None) => break,
                    // The end of what was written (a segment's zeros): the WAL ends here.
                    Err(_) => break 'segments,
                }
            }
        }
    }
    Ok(found(Found::Future, last))
}

fn found(kind: Found, last: Option<(Lsn, i64)>) -> LsnByTime {
    LsnByTime {
        kind,
        lsn: last.map(|(lsn, _)| lsn),
        commit_time: last.map(|(_, t)| t),
    }
}
