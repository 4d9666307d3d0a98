//! The cluster's counters ([`ClusterCounters`]) as the WAL moves them: what a checkpoint
//! made at any LSN must say so that a PostgreSQL started there never hands out an id already
//! in use.
//!
//! | record | counters |
//! |---|---|
//! | any record with a transaction id (`xl_xid`) | the next transaction id past it |
//! | `XLOG_CHECKPOINT_SHUTDOWN` | all of them, as the record says (and from then on exact) |
//! | `XLOG_CHECKPOINT_ONLINE` | each raised to the record's, if it is ahead |
//! | `XLOG_NEXTOID` | the next OID, as the record says |
//! | `XLOG_XACT_ASSIGNMENT`, a commit's or abort's subtransactions | the next transaction id past them |
//! | `XLOG_MULTIXACT_CREATE_ID` | the next multixact and member offset past it, the next transaction id past its members |
//! | `XLOG_MULTIXACT_TRUNCATE_ID` | the oldest multixact |
//! | `CLOG_TRUNCATE` | the oldest transaction id, raised to the record's |
//! | `XLOG_RUNNING_XACTS` | the next transaction id, raised to the record's |
//!
//! These are the rules redo follows (`xlog_redo`, `multixact_redo`, `xact_redo`,
//! `clog_redo`), less everything that only matters while transactions run, with two on the
//! safe side: an online checkpoint's next OID and every running-transactions record's next
//! transaction id raise the counters too (redo ignores the one, and applies the other only
//! until hot standby has a snapshot), which can only leave them higher.

use pageserver_api::datadir::ClusterCounters;
use postgres_wal::record::{
    RM_XACT_ID, RM_XLOG_ID, XLOG_CHECKPOINT_ONLINE, XLOG_CHECKPOINT_SHUTDOWN,
};
use postgres_wal::xact::XactEndDetails;
use postgres_wal::DecodedRecord;

use super::pg_control::Checkpoint;
use super::wal_files::u32_at;
use super::wal_multixact::{
    multixact_create, XLOG_MULTIXACT_CREATE_ID, XLOG_MULTIXACT_TRUNCATE_ID,
};

const XLOG_NEXTOID: u8 = 0x30;
const XLOG_XACT_ASSIGNMENT: u8 = 0x50;
const RM_CLOG_ID: u8 = 3;
const CLOG_TRUNCATE: u8 = 0x10;
const RM_MULTIXACT_ID: u8 = 6;
const RM_STANDBY_ID: u8 = 8;
const XLOG_RUNNING_XACTS: u8 = 0x10;

/// Moves `counters` as `record` (whose main data is `main`, and which ends the transactions
/// `xact_end` says, if it is a commit or an abort) does; whether they changed.
pub fn follow(
    counters: &mut ClusterCounters,
    record: &DecodedRecord,
    main: &[u8],
    xact_end: Option<&XactEndDetails>,
) -> Result<bool, String> {
    let before = *counters;
    counters.saw_xid(record.header.xid);
    let info = record.header.rm_info();
    match (record.header.rmid, info) {
        (RM_XLOG_ID, XLOG_CHECKPOINT_SHUTDOWN | XLOG_CHECKPOINT_ONLINE) => {
            let checkpoint = Checkpoint::parse(main)
                .ok_or_else(|| format!("a checkpoint of {} bytes", main.len()))?;
            if info == XLOG_CHECKPOINT_SHUTDOWN {
                *counters = checkpoint.counters(true);
            } else {
                counters.saw_online_checkpoint(&checkpoint.counters(counters.exact));
            }
        }
        (RM_XLOG_ID, XLOG_NEXTOID) => counters.next_oid = u32_at(main, 0)?,
        (RM_XACT_ID, XLOG_XACT_ASSIGNMENT) => {
            // xl_xact_assignment: xtop, nsubxacts, then the subtransactions.
            let count = u32_at(main, 4)? as usize;
            if main.len() < 8 + 4 * count {
                return Err(format!(
                    "an assignment of {count} subtransactions in {} bytes",
                    main.len()
                ));
            }
            for i in 0..count {
                counters.saw_xid(u32_at(main, 8 + 4 * i)?);
            }
        }
        (RM_XACT_ID, _) => {
            if let Some(end) = xact_end {
                counters.saw_xid(end.xid);
                for xid in &end.subxacts {
                    counters.saw_xid(*xid);
                }
            }
        }
        (RM_MULTIXACT_ID, XLOG_MULTIXACT_CREATE_ID) => {
            // Then (xid, status) for each member.
            let (multi, offset, count) = multixact_create(main)?;
            counters.saw_multi(multi, offset.wrapping_add(count));
            for i in 0..count as usize {
                counters.saw_xid(u32_at(main, 12 + 8 * i)?);
            }
        }
        (RM_MULTIXACT_ID, XLOG_MULTIXACT_TRUNCATE_ID) => {
            // xl_multixact_truncate: oldestMultiDB, startTruncOff, endTruncOff, ...
            counters.oldest_multi_db = u32_at(main, 0)?;
            counters.oldest_multi = u32_at(main, 8)?;
        }
        (RM_CLOG_ID, CLOG_TRUNCATE) => {
            // xl_clog_truncate: pageno, oldestXact, oldestXactDb. The same oldest id the
            // truncating VACUUM set as the limit, which the next checkpoint would carry.
            let (oldest, db) = (u32_at(main, 4)?, u32_at(main, 8)?);
            if (oldest.wrapping_sub(counters.oldest_xid) as i32) > 0 {
                (counters.oldest_xid, counters.oldest_xid_db) = (oldest, db);
            }
        }
        (RM_STANDBY_ID, XLOG_RUNNING_XACTS) => {
            // xl_running_xacts: xcnt, subxcnt, subxid_overflow (padded to 4), nextXid.
            let next = u32_at(main, 12)?;
            counters.saw_xid(next.wrapping_sub(1));
        }
        _ => {}
    }
    Ok(*counters != before)
}

/// Counters for tests: not exact, next transaction id 1000.
#[cfg(test)]
pub(crate) fn sample_counters() -> ClusterCounters {
    ClusterCounters {
        exact: false,
        next_xid: 1000,
        next_oid: 20_000,
        next_multi: 1,
        next_multi_offset: 0,
        oldest_xid: 716,
        oldest_xid_db: 1,
        oldest_multi: 1,
        oldest_multi_db: 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use postgres_wal::record::RM_HEAP_ID;
    use postgres_wal::synthetic::WalBuilder;
    use postgres_wal::WalDecoder;
    use utils::Lsn;

    use super::sample_counters as counters;

    /// The records `build` writes, decoded, each followed in turn; the counters after each.
    fn after(build: impl FnOnce(&mut WalBuilder)) -> Vec<Result<ClusterCounters, String>> {
        let mut wal = WalBuilder::new(Lsn(1 << 24), 1 << 24);
        build(&mut wal);
        let mut decoder = WalDecoder::new(wal.start(), 1 << 24);
        decoder.feed(wal.bytes());
        let mut c = counters();
        let mut out = Vec::new();
        while let Some(record) = decoder.next_record().unwrap() {
            let parts = postgres_wal::record::parse_parts(&record.bytes).unwrap();
            let main = record.bytes[parts.main_data].to_vec();
            let end = postgres_wal::xact::xact_end_details(&record).unwrap();
            out.push(follow(&mut c, &record, &main, end.as_ref()).map(|_| c));
        }
        out
    }

    fn checkpoint(next_xid: u64, next_oid: u32) -> Vec<u8> {
        let mut b = [0u8; 88];
        b[24..32].copy_from_slice(&next_xid.to_le_bytes());
        b[32..36].copy_from_slice(&next_oid.to_le_bytes());
        b[36..40].copy_from_slice(&7u32.to_le_bytes());
        b[44..48].copy_from_slice(&800u32.to_le_bytes());
        b.to_vec()
    }

    #[test]
    fn each_record_kind_moves_what_redo_moves() {
        let out = after(|w| {
            w.main_data_record(RM_HEAP_ID, 0, 1500, &[0; 8]);
            w.main_data_record(RM_XLOG_ID, XLOG_NEXTOID, 0, &30_000u32.to_le_bytes());
            let mut assign = vec![];
            for v in [1500u32, 2, 1600, 1501] {
                assign.extend_from_slice(&v.to_le_bytes());
            }
            w.main_data_record(RM_XACT_ID, XLOG_XACT_ASSIGNMENT, 1500, &assign);
            let mut multi = vec![];
            for v in [4u32, 10, 2, 1700, 1, 1400, 2] {
                multi.extend_from_slice(&v.to_le_bytes());
            }
            w.main_data_record(RM_MULTIXACT_ID, XLOG_MULTIXACT_CREATE_ID, 0, &multi);
            let mut truncate = vec![];
            for v in [5u32, 1, 3, 0, 4] {
                truncate.extend_from_slice(&v.to_le_bytes());
            }
            w.main_data_record(RM_MULTIXACT_ID, XLOG_MULTIXACT_TRUNCATE_ID, 0, &truncate);
            let mut clog = vec![];
            for v in [0u32, 750, 5] {
                clog.extend_from_slice(&v.to_le_bytes());
            }
            w.main_data_record(RM_CLOG_ID, CLOG_TRUNCATE, 0, &clog);
            let mut running = vec![0u8; 12];
            running.extend_from_slice(&1800u32.to_le_bytes());
            w.main_data_record(RM_STANDBY_ID, XLOG_RUNNING_XACTS, 0, &running);
            w.main_data_record(
                RM_XLOG_ID,
                XLOG_CHECKPOINT_ONLINE,
                0,
                &checkpoint(1700, 25_000),
            );
            w.main_data_record(
                RM_XLOG_ID,
                XLOG_CHECKPOINT_SHUTDOWN,
                0,
                &checkpoint(1900, 26_000),
            );
        });
        let next: Vec<_> = out.iter().map(|c| c.as_ref().unwrap()).collect();
        assert_eq!(next[0].next_xid, 1501);
        assert_eq!(next[1].next_oid, 30_000);
        assert_eq!(next[2].next_xid, 1601, "the highest subtransaction");
        assert_eq!(
            (
                next[3].next_multi,
                next[3].next_multi_offset,
                next[3].next_xid
            ),
            (5, 12, 1701)
        );
        // A truncation's 20 bytes (oldestMultiDB, start and end offsets, start and end
        // members): the oldest multixact is its end.
        assert_eq!(
            (
                next[4].oldest_multi,
                next[4].oldest_multi_db,
                next[4].next_multi
            ),
            (3, 5, 5)
        );
        assert_eq!((next[5].oldest_xid, next[5].oldest_xid_db), (750, 5));
        assert_eq!(next[6].next_xid, 1800);
        let online = next[7];
        assert_eq!(
            (
                online.next_xid,
                online.next_oid,
                online.next_multi,
                online.oldest_xid
            ),
            (1800, 30_000, 7, 800)
        );
        assert!(!online.exact);
        let shutdown = next[8];
        assert_eq!(
            (shutdown.next_xid, shutdown.next_oid, shutdown.exact),
            (1900, 26_000, true)
        );
    }

    #[test]
    fn a_short_record_is_an_error_not_a_panic() {
        let out = after(|w| {
            w.main_data_record(RM_XLOG_ID, XLOG_CHECKPOINT_SHUTDOWN, 0, &[0; 40]);
            w.main_data_record(RM_XLOG_ID, XLOG_NEXTOID, 0, &[1]);
            let mut multi = [0u8; 20];
            multi[8] = 5; // five members in room for one
            w.main_data_record(RM_MULTIXACT_ID, XLOG_MULTIXACT_CREATE_ID, 0, &multi);
            w.main_data_record(
                RM_XACT_ID,
                XLOG_XACT_ASSIGNMENT,
                0,
                &[0, 0, 0, 0, 9, 0, 0, 0],
            );
        });
        assert!(out.iter().all(|r| r.is_err()), "{out:?}");
    }
}
