//! Page ingest: the WAL a receiver stored, decoded record by record into the timeline's page
//! versions (`datadir::wal_versions`), when the receiver's settings ask for it
//! (`ingest_pages`).
//!
//! A thread of its own per receiver, beside the one that streams: it reads the WAL files up to
//! the flushed LSN, so the stream (and a synchronous primary's commits) never waits for ingest,
//! and ingest never holds WAL in memory that is not also on disk. Whatever stops it (a crash,
//! a restart, an import) it resumes from the timeline's `last_record_lsn`, the end of the last
//! record whose versions the timeline holds: it decodes again from the WAL page that LSN is
//! on, and skips the records that end at or below it. A record's versions are put at its end
//! LSN, in batches of at most [`MAX_BATCH_BYTES`]; WAL that changes no page moves
//! `last_record_lsn` on all the same, so a read at any LSN of the stored WAL is answered.
//!
//! ```text
//!   wal/<segment>[.partial] ──read up to flushed_lsn──▶ WalDecoder ──▶ WalVersions ──▶ put_batch
//!                                                       (records up to MAX_RECORD_LEN)
//! ```
//!
//! A record longer than [`MAX_RECORD_LEN`] ([`MAX_XACT_RECORD_LEN`] for a transaction's) is
//! decoded (checked) but not kept: one of a resource manager whose records change nothing stored
//! (standby, logical messages) is skipped; any other stops page ingest with an error saying
//! so, rather than losing what it changed. Errors are in `pages_error` of the receiver's state, and ingest tries again.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use pageserver_api::ingest::PutRecord;
use postgres_wal::record::RM_XACT_ID;
use postgres_wal::{DecodedRecord, WalDecoder, XLOG_BLCKSZ};
use utils::Lsn;

use pageserver_api::datadir::{file_chunk_key, file_dir_key, is_rel_block_key, FileDirectory};
use pageserver_api::Value;

use super::state::Shared;
use super::wal_reader::WalReader;
use crate::datadir::pg_control::{self, ControlFile};
use crate::datadir::wal_versions::WalVersions;
use crate::tenant::timeline::{Timeline, TimelineError};

/// Records longer than this are not kept whole (PostgreSQL allows 1020 MiB); a record that
/// references blocks is at most a few hundred KiB (32 blocks of images and their data).
pub const MAX_RECORD_LEN: usize = 16 << 20;
/// Versions put in one batch at most (by their stored bytes).
pub const MAX_BATCH_BYTES: usize = 8 << 20;
/// WAL read from a file at a time.
const READ_CHUNK: u64 = 1 << 20;
/// The longest the thread waits for more flushed WAL, and how long it waits after an error.
const WAIT: Duration = Duration::from_secs(1);
const RETRY: Duration = Duration::from_secs(1);

/// Resource managers whose records change nothing page ingest stores: standby
/// (`RM_STANDBY_ID`) and logical decoding messages (`RM_LOGICALMSG_ID`).
const NO_BLOCK_RMGRS: [u8; 2] = [8, 21];
/// Transaction records (their subtransactions and dropped relations) are kept whole up to
/// this; a longer one stops page ingest with an error rather than lose the statuses it sets.
pub const MAX_XACT_RECORD_LEN: usize = 64 << 20;

/// Where decoding is: what the next read feeds, and the record-to-versions state.
struct Cursor {
    decoder: WalDecoder,
    /// The next byte to feed the decoder.
    fed: Lsn,
    /// The end of the last record ingested (the timeline's `last_record_lsn` when it did).
    ingested: Lsn,
    versions: WalVersions,
    reader: WalReader,
}

/// The thread's loop: ingests until the receiver is stopped or the timeline shuts down.
pub(super) fn run(timeline: Arc<Timeline>, shared: Arc<Shared>) {
    let mut cursor: Option<Cursor> = None;
    loop {
        if shared.stop.load(Ordering::Acquire) || timeline.is_shutting_down() {
            return;
        }
        let seen = shared.state().flushed_lsn;
        let stepped = {
            let _step = shared.ingest_step.lock().unwrap_or_else(|e| e.into_inner());
            step(&timeline, &shared, &mut cursor)
        };
        match stepped {
            Ok(true) => {
                let mut s = shared.state();
                s.pages_lsn = Some(timeline.last_record_lsn());
                s.pages_error = None;
            }
            // Woken by the next flush; the timeout covers what no flush signals (a snapshot
            // imported, an import's end).
            Ok(false) => shared.wait_for_flush(seen, WAIT),
            Err(e) => {
                tracing::warn!(tenant = %timeline.tenant_id(), timeline = %timeline.timeline_id(),
                    "page ingest: {e}");
                shared.state().pages_error = Some(e);
                cursor = None;
                std::thread::sleep(RETRY);
            }
        }
    }
}

/// Ingests what is flushed and not yet ingested, a chunk at a time; `Ok(false)` if there was
/// nothing to do.
fn step(timeline: &Timeline, shared: &Shared, cursor: &mut Option<Cursor>) -> Result<bool, String> {
    let segment_size = shared.segment_size.load(Ordering::Acquire);
    let flushed = shared.state().flushed_lsn;
    let ingested = timeline.last_record_lsn();
    let (Some(flushed), true, true) = (flushed, segment_size != 0, ingested > Lsn(0)) else {
        // No WAL known yet, or no snapshot to put versions over.
        return Ok(false);
    };
    if cursor.as_ref().is_none_or(|c| c.ingested != ingested) {
        // A first start, or the timeline moved under us (an import): decode again from the
        // WAL page `ingested` is on, whose header says where the first record on it starts;
        // from the page before if `ingested` is a page's start, so that the record ending there
        // is decoded (skipped) first: after an `XLOG_SWITCH` ending there, the decoder then
        // knows the rest of the segment is padding. Not before a segment's start, whose file
        // may be gone.
        let mut start = Lsn(ingested.0 - ingested.0 % XLOG_BLCKSZ as u64);
        if start == ingested && !start.0.is_multiple_of(u64::from(segment_size)) {
            start = Lsn(start.0 - XLOG_BLCKSZ as u64);
        }
        let mut versions = WalVersions::new();
        let control = control_file(timeline, ingested)?;
        versions.set_hint_bits_logged(control.data_checksum_version != 0, control.wal_log_hints);
        // Exact only at a stopped primary's snapshot, which is at its shutdown checkpoint.
        let exact = control.is_primary_shutdown() && ingested == control.checkpoint;
        versions.set_initial_counters(control.checkpoint_copy.counters(exact));
        *cursor = Some(Cursor {
            decoder: WalDecoder::new(start, segment_size)
                .keeping_records_up_to(MAX_RECORD_LEN)
                .keeping_records_of(RM_XACT_ID, MAX_XACT_RECORD_LEN),
            fed: start,
            ingested,
            versions,
            reader: WalReader::new(segment_size),
        });
    }
    let c = cursor.as_mut().expect("set above");
    let at_limit = shared.ingest_limit().reached(c.ingested);
    if c.fed >= flushed || at_limit {
        return Ok(false);
    }
    let bytes = c.reader.read(timeline.dir(), c.fed, flushed, READ_CHUNK)?;
    c.decoder.feed(&bytes);
    c.fed = Lsn(c.fed.0 + bytes.len() as u64);

    let limit = shared.ingest_limit();
    let mut held = false;
    let mut batch: Vec<PutRecord> = Vec::new();
    let mut batch_bytes = 0usize;
    let mut last_end = c.ingested;
    while let Some(record) = c.decoder.next_record().map_err(|e| e.to_string())? {
        let end = record.end_rec_ptr();
        if end <= c.ingested {
            continue;
        }
        if limit.stops_before(&record) {
            held = true;
            break;
        }
        let before = batch.len();
        if let Err(e) = versions_of(timeline, &mut c.versions, &record, &mut batch) {
            // The records before it are good: they go in, and the error stops ingest there.
            batch.truncate(before);
            put(timeline, c, batch, last_end)?;
            return Err(e);
        }
        batch_bytes += batch[before..]
            .iter()
            .map(|v| v.value.serialized_len())
            .sum::<usize>();
        last_end = end;
        crate::metrics::WAL_INGEST_RECORDS.inc();
        if batch_bytes >= MAX_BATCH_BYTES || c.versions.should_put() {
            put(timeline, c, std::mem::take(&mut batch), last_end)?;
            batch_bytes = 0;
        }
    }
    put(timeline, c, batch, last_end)?;
    if held {
        // Decoded past the limit: decoding starts again from `last_record_lsn` once it lifts
        // (a snapshot imported meanwhile moves it).
        *cursor = None;
        return Ok(last_end > ingested);
    }
    Ok(true)
}

/// The cluster's `pg_control` as the timeline holds it at `lsn` (its newest snapshot's).
fn control_file(timeline: &Timeline, lsn: Lsn) -> Result<ControlFile, String> {
    let read = |key| {
        timeline
            .get_page(key, lsn)
            .map_err(|e| format!("reading pg_control: {e}"))
    };
    let dir = read(file_dir_key())?.ok_or("the timeline holds no file directory")?;
    let dir = FileDirectory::decode(&dir).map_err(|e| e.to_string())?;
    let entry = dir
        .get(pg_control::PG_CONTROL_PATH)
        .ok_or("the timeline holds no global/pg_control")?;
    let chunk = read(file_chunk_key(entry.id, 0))?.ok_or("global/pg_control has no bytes")?;
    pg_control::parse(&chunk).map_err(|e| format!("global/pg_control: {e}"))
}

/// The versions of one record, or why it cannot have any.
fn versions_of(
    timeline: &Timeline,
    versions: &mut WalVersions,
    record: &DecodedRecord,
    batch: &mut Vec<PutRecord>,
) -> Result<(), String> {
    if record.bytes.len() < record.header.tot_len as usize {
        if NO_BLOCK_RMGRS.contains(&record.header.rmid) {
            return Ok(());
        }
        return Err(format!(
            "the WAL record at {} is {} bytes, longer than page ingest keeps ({MAX_RECORD_LEN}, \
             {MAX_XACT_RECORD_LEN} for a transaction's), and of a resource manager that may \
             change pages: pages are not ingested past it",
            record.start, record.header.tot_len
        ));
    }
    // Sizes and directories as the timeline holds them now: what this batch changes of them
    // `versions` keeps itself.
    let at = timeline.last_record_lsn();
    versions.record(
        record,
        &mut |key| timeline.get_page(key, at).map_err(|e| e.to_string()),
        batch,
    )
}

/// Puts `batch` (the versions of the records up to `end`) and moves `last_record_lsn` to `end`.
fn put(timeline: &Timeline, c: &mut Cursor, batch: Vec<PutRecord>, end: Lsn) -> Result<(), String> {
    if end <= c.ingested {
        return Ok(());
    }
    let images = batch
        .iter()
        .filter(|v| matches!(v.value, Value::Image(_)) && is_rel_block_key(&v.key));
    crate::metrics::WAL_INGEST_IMAGES.inc_by(images.count() as u64);
    let records = batch.iter().filter(|v| v.value.is_wal_record()).count();
    crate::metrics::WAL_INGEST_WAL_RECORD_VERSIONS.inc_by(records as u64);
    let result = timeline
        .put_batch(&batch)
        .and_then(|()| timeline.advance_last_record_lsn_to(end));
    match result {
        Ok(()) => {
            c.ingested = end;
            c.versions.put_done();
            Ok(())
        }
        Err(e @ TimelineError::ImportInProgress) => {
            Err(format!("waiting for an import to finish: {e}"))
        }
        Err(e) => Err(format!("storing the versions of the WAL up to {end}: {e}")),
    }
}
