//! A checkpoint's spread (the WAL from its redo point to its record) read for what a restore
//! that starts at the record, not at the redo point, would lack (see
//! `datadir/checkpoint_start.rs`):
//!
//! - the counters as they stand at the record's end: the record's own (taken when the
//!   checkpoint began), moved by every record of the spread as redo would move them
//!   (`wal_counters::follow`);
//! - whether a transaction prepared in the spread is still prepared at the record's end: its
//!   state is in that WAL alone (a restartpoint writes out only those prepared before the redo
//!   point), so a snapshot there must be started from the redo point. One prepared and then
//!   committed or rolled back within the spread leaves nothing behind.
//!
//! Memory: a chunk of WAL and one record at a time (as page ingest keeps them).

use std::collections::BTreeMap;
use std::path::Path;

use pageserver_api::datadir::ClusterCounters;
use postgres_wal::record::{parse_parts, RM_XACT_ID};
use postgres_wal::xact::{xact_end_details, XactEnd, XLOG_XACT_OPMASK, XLOG_XACT_PREPARE};
use postgres_wal::{DecodedRecord, WalDecoder, XLOG_BLCKSZ};
use utils::Lsn;

use super::page_ingest::{MAX_RECORD_LEN, MAX_XACT_RECORD_LEN};
use super::wal_reader::WalReader;
use crate::datadir::pg_control::Checkpoint;
use crate::datadir::wal_counters::follow;

/// WAL read per step (the caller's stop flag is looked at between steps).
const CHUNK: u64 = 4 << 20;

/// The resource managers whose records' main data moves the counters: XLOG, transactions,
/// `pg_xact`, multixacts, standby.
const COUNTER_RMGRS: [u8; 5] = [0, 1, 3, 6, 8];

/// What the spread of a checkpoint holds.
#[derive(Debug)]
pub(super) struct Spread {
    /// The counters at the end of the checkpoint record.
    pub counters: ClusterCounters,
    /// The transactions prepared in the spread and still prepared at its end: their ids, and
    /// where their `PREPARE TRANSACTION` records start.
    pub still_prepared: BTreeMap<u32, Lsn>,
}

/// Reads the stored WAL of `timeline_dir` from `redo` to the end of `checkpoint` (an online
/// checkpoint record whose redo point that is).
pub(super) fn read_spread(
    timeline_dir: &Path,
    segment_size: u32,
    redo: Lsn,
    checkpoint: &DecodedRecord,
    cancel: &dyn Fn() -> bool,
) -> Result<Spread, String> {
    let main = |record: &DecodedRecord| -> Result<std::ops::Range<usize>, String> {
        Ok(parse_parts(&record.bytes)
            .map_err(|e| format!("the record at {}: {e}", record.start))?
            .main_data)
    };
    let stored = Checkpoint::parse(&checkpoint.bytes[main(checkpoint)?])
        .ok_or_else(|| format!("the checkpoint record at {} is short", checkpoint.start))?;
    let mut spread = Spread {
        counters: stored.counters(false),
        still_prepared: BTreeMap::new(),
    };
    let end = checkpoint.end;
    // From the page the redo point is on (its header says where the first record starts).
    let mut fed = Lsn(redo.0 - redo.0 % XLOG_BLCKSZ as u64);
    let mut decoder = WalDecoder::new(fed, segment_size)
        .keeping_records_up_to(MAX_RECORD_LEN)
        .keeping_records_of(RM_XACT_ID, MAX_XACT_RECORD_LEN);
    let mut reader = WalReader::new(segment_size);
    loop {
        while let Some(record) = decoder.next_record().map_err(|e| e.to_string())? {
            if record.start < redo {
                continue;
            }
            if record.end > end {
                return Err(format!(
                    "the record at {} ends at {}, past the checkpoint record's end {end}: the \
                     stored WAL is not the one scanned",
                    record.start, record.end
                ));
            }
            let xact_end = match record.header.rmid {
                RM_XACT_ID => xact_end_details(&record)?,
                _ => None,
            };
            let is_prepare = record.header.rmid == RM_XACT_ID
                && record.header.rm_info() & XLOG_XACT_OPMASK == XLOG_XACT_PREPARE;
            if is_prepare {
                spread
                    .still_prepared
                    .insert(record.header.xid, record.start);
            }
            if let Some(end) = xact_end
                .as_ref()
                .filter(|e| matches!(e.kind, XactEnd::CommitPrepared | XactEnd::AbortPrepared))
            {
                spread.still_prepared.remove(&end.xid);
            }
            // A record longer than is kept moves only the transaction id, unless it is of a
            // resource manager whose main data moves the counters.
            let main = if record.bytes.len() == record.header.tot_len as usize {
                &record.bytes[main(&record)?]
            } else if COUNTER_RMGRS.contains(&record.header.rmid) {
                return Err(format!(
                    "the record at {} is {} bytes, longer than is read",
                    record.start, record.header.tot_len
                ));
            } else {
                &[][..]
            };
            follow(&mut spread.counters, &record, main, xact_end.as_ref())
                .map_err(|e| format!("the record at {}: {e}", record.start))?;
            if record.end == end {
                return Ok(spread);
            }
        }
        if cancel() {
            return Err("stopped".to_owned());
        }
        let bytes = reader.read(timeline_dir, fed, end, CHUNK)?;
        if bytes.is_empty() {
            return Err(format!(
                "the stored WAL from {redo} ends at {fed}, before the checkpoint record's end {end}"
            ));
        }
        decoder.feed(&bytes);
        fed = Lsn(fed.0 + bytes.len() as u64);
    }
}
