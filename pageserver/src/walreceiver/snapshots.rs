//! Background snapshots: stock PostgreSQL replays the newest snapshot to a later LSN, and the
//! directory it shuts down with is imported as a new snapshot there, so that a restore replays
//! at most about `snapshot_wal_distance` of WAL and GetPage@LSN is exact at every snapshot.
//!
//! A thread of its own per receiver whose `snapshot_wal_distance` is not 0, beside the one that
//! streams and page ingest's:
//!
//! ```text
//!   flushed WAL ≥ newest snapshot P + distance / 2
//!     └─▶ page ingest held at the checkpoint records from P + distance / 2 on
//!     └─▶ scan the stored WAL from P for the checkpoint record C the window takes (`Window`;
//!         page ingest let past the others) and the record after it (the replay must read it
//!         to know it reached C's end S)
//!     └─▶ page ingest held before C (it stops at C's start; its versions end before S)
//!     └─▶ one at a time per server: basebackup of P with the WAL to past S, unpacked into
//!         the server's `snapshot_replay_dir`, replayed by PostgreSQL to S (`pg_replay.rs`)
//!     └─▶ C's spread (from its redo point R) read: the counters at S, and whether a
//!         transaction was prepared in it (`checkpoint_spread.rs`)
//!     └─▶ imported at S (only what differs from the timeline's state below S is stored;
//!         not its `pg_wal/`, which the timeline's WAL gives a restore from C on, or from R
//!         after a prepared transaction), with the counters page ingest followed, moved by C
//!         (or the spread's)
//!     └─▶ the directory removed, page ingest let go: it resumes after S
//! ```
//!
//! Why at a checkpoint record: PostgreSQL writes the pages it replayed only at a restartpoint,
//! which it makes at a checkpoint record (see `pg_replay.rs`). So snapshots come at the
//! primary's checkpoints: the last before the next is expected past `snapshot_wal_distance`,
//! the first past it at the latest ([`Window`]). A restore from one
//! replays from the checkpoint record (`datadir/checkpoint_start.rs`), or from the
//! checkpoint's redo point when a transaction prepared in the spread is in that WAL alone: the
//! snapshot is listed with its WAL from there (`Snapshot::wal_from`), and a restore's `pg_wal/`
//! comes from the timeline's WAL.
//!
//! Crash safety: the import is one [`crate::tenant::timeline::Import`], durable whole at its
//! commit or not at all; the directory of a killed replay is removed by the next snapshot,
//! before it starts. A stop (the receiver's, the timeline's shutdown) stops
//! the replay at once (`SIGQUIT`). Disk: one directory the size of the cluster at a time per
//! server ([`ONE_AT_A_TIME`]). Memory: a WAL chunk while scanning, and what an import holds.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pageserver_api::datadir::{
    counters_key, snapshot_list_key, ClusterCounters, Snapshot, SnapshotList,
};
use postgres_wal::record::{
    RM_XLOG_ID, XLOG_CHECKPOINT_ONLINE, XLOG_CHECKPOINT_SHUTDOWN, XLOG_PARAMETER_CHANGE,
};
use postgres_wal::{DecodedRecord, WalDecoder, XLOG_BLCKSZ};
use utils::Lsn;

use super::checkpoint_spread::read_spread;
use super::pg_replay::{self, PgPrograms, ReplayRunError};
use super::replay_plan::replay_of;
use super::state::{IngestLimit, Shared};
use super::wal_reader::WalReader;
use crate::datadir::pg_control::Checkpoint;
use crate::datadir::{import_replayed, snapshot_at, write_basebackup, Restore};
use crate::tenant::timeline::Timeline;

/// Only one replay runs on a server at a time: each holds a copy of a cluster on disk and
/// keeps a CPU busy.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
/// The longest a replay may run.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(3600);
/// The longest page ingest may take to reach the checkpoint record.
const INGEST_WAIT: Duration = Duration::from_secs(120);
/// WAL scanned per step (the thread looks at its stop flag between steps).
const SCAN_CHUNK: u64 = 4 << 20;
const WAIT: Duration = Duration::from_secs(1);
/// How long a checkpoint record found waits for the record after it.
const NEXT_RECORD_WAIT: Duration = Duration::from_secs(5);
const RETRY: Duration = Duration::from_secs(5);
/// How long a snapshot waits for the WAL archive to hold the WAL below it, before it keeps
/// that WAL itself.
const ARCHIVE_WAIT: Duration = Duration::from_secs(30);
/// Failed attempts in a row that keep page ingest held at their checkpoint.
const HELD_ATTEMPTS: u32 = 3;

/// A receiver's background snapshot settings.
#[derive(Clone, Debug)]
pub struct SnapshotConf {
    pub distance: u64,
    /// Where the replay runs (the server's one directory for it).
    pub replay_dir: PathBuf,
    /// The programs, or why there are none (reported as the snapshots' error).
    pub programs: Result<PgPrograms, String>,
}

impl SnapshotConf {
    /// The window of the next snapshot after one at `lsn`: the checkpoint records it may go
    /// to start in it or past it (see [`Window`]).
    fn window_after(&self, lsn: Lsn) -> Window {
        Window {
            from: Lsn(lsn.0.saturating_add(self.distance / 2)),
            due: Lsn(lsn.0.saturating_add(self.distance)),
        }
    }
}

/// Which checkpoint record the next snapshot goes to. The one starting at or past `due` at the
/// latest; before it, from `from` on, the last one before the next is expected past `due`
/// (that next one as far past it as it is past the checkpoint before it, or past its own redo
/// point): so that with checkpoints at an even pace, no LSN is more than the distance past a
/// snapshot, rather than up to a checkpoint interval more.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Window {
    from: Lsn,
    due: Lsn,
}

impl Window {
    /// Whether the checkpoint record at `start` (`redo` its redo point; `previous` the start
    /// of the checkpoint record before it, or the snapshot's LSN) is the snapshot's.
    fn takes(&self, start: Lsn, redo: Lsn, previous: Lsn) -> bool {
        let gap = start
            .0
            .saturating_sub(previous.0)
            .max(start.0.saturating_sub(redo.0));
        start >= self.from && (start >= self.due || start.0.saturating_add(gap) > self.due.0)
    }
}

/// The thread's loop: snapshots until the receiver stops or the timeline shuts down.
pub(super) fn run(timeline: Arc<Timeline>, shared: Arc<Shared>, conf: SnapshotConf) {
    let stopped = || shared.stop.load(Ordering::Acquire) || timeline.is_shutting_down();
    // However the thread ends (a panic too), page ingest is not left held.
    let _release = ReleaseIngest(&shared);
    let labels = [
        timeline.tenant_id().to_string(),
        timeline.timeline_id().to_string(),
    ];
    let labels = [labels[0].as_str(), labels[1].as_str()];
    let mut scan: Option<Scan> = None;
    let mut failures = 0;
    while !stopped() {
        let seen = shared.state().flushed_lsn;
        match round(&timeline, &shared, &conf, &mut scan, &labels) {
            Ok(Some(lsn)) => {
                failures = 0;
                let mut s = shared.state();
                s.snapshot_lsn = Some(lsn);
                s.snapshot_error = None;
            }
            Ok(None) => shared.wait_for_flush(seen, WAIT),
            Err(e) => {
                // Page ingest stays held at the snapshot's checkpoint for the next attempts
                // (let go, it would pass it in the meantime, and the snapshot would wait for
                // the primary's next checkpoint), but not for a failure that lasts: after
                // `HELD_ATTEMPTS` in a row it goes on, and the snapshot goes to a later one.
                failures += 1;
                if failures >= HELD_ATTEMPTS {
                    failures = 0;
                    shared.set_ingest_limit(IngestLimit::default());
                }
                if !stopped() {
                    // Said once while it stays the same (no PostgreSQL programs, say), not at
                    // every retry; the state and the metric show every attempt.
                    let mut state = shared.state();
                    if state.snapshot_error.as_deref() == Some(e.as_str()) {
                        tracing::debug!(tenant = %timeline.tenant_id(), timeline = %timeline.timeline_id(),
                            "background snapshot: {e}");
                    } else {
                        tracing::warn!(tenant = %timeline.tenant_id(), timeline = %timeline.timeline_id(),
                            "background snapshot: {e}");
                    }
                    state.snapshot_error = Some(e);
                    drop(state);
                    crate::metrics::BACKGROUND_SNAPSHOTS
                        .with_label_values(&["error"])
                        .inc();
                }
                scan = None;
                let until = Instant::now() + RETRY;
                while Instant::now() < until && !stopped() {
                    shared.wait_for_flush(None, WAIT);
                }
            }
        }
    }
    let _ = crate::metrics::BACKGROUND_SNAPSHOT_LAG_BYTES.remove_label_values(&labels);
}

/// Lifts every hold on page ingest when dropped.
struct ReleaseIngest<'a>(&'a Shared);

impl Drop for ReleaseIngest<'_> {
    fn drop(&mut self) {
        self.0.set_ingest_limit(IngestLimit::default());
    }
}

/// The checkpoint record a snapshot goes to.
struct Target {
    /// Where the checkpoint record starts and ends (the snapshot's LSN).
    start: Lsn,
    end: Lsn,
    /// The end of the record before it: page ingest stops there.
    prev_end: Lsn,
    /// The end of the record after it: the replay reads that one to know it is done.
    next_end: Lsn,
    record: DecodedRecord,
    /// The most prepared transactions the primary allowed in the WAL before it (its
    /// parameter-change records): the replay needs as many slots.
    max_prepared_xacts: u32,
}

/// A decoding of the stored WAL from a snapshot on, looking for checkpoint records.
struct Scan {
    /// The snapshot it started from: records ending at or before it are skipped.
    from: Lsn,
    decoder: WalDecoder,
    reader: WalReader,
    fed: Lsn,
    prev_end: Lsn,
    /// A checkpoint record found, waiting for the record after it, since when.
    pending: Option<(DecodedRecord, Lsn, Instant)>,
    /// Page ingest stops at checkpoint records starting here or past it: it moves past those
    /// the window does not take, and past a checkpoint nothing followed for
    /// [`NEXT_RECORD_WAIT`] (a primary's shutdown).
    hold_from: Lsn,
    /// The highest `max_prepared_transactions` a parameter-change record set so far.
    max_prepared_xacts: u32,
    /// Where the last checkpoint record decoded starts (`from` before one).
    last_checkpoint: Lsn,
}

impl Scan {
    fn new(from: Lsn, segment_size: u32) -> Scan {
        // From the WAL page `from` is on, whose header says where its first record starts.
        let start = Lsn(from.0 - from.0 % XLOG_BLCKSZ as u64);
        Scan {
            from,
            decoder: WalDecoder::new(start, segment_size).keeping_records_up_to(8192),
            reader: WalReader::new(segment_size),
            fed: start,
            prev_end: from,
            pending: None,
            hold_from: Lsn(0),
            max_prepared_xacts: 0,
            last_checkpoint: from,
        }
    }

    /// Decodes up to `SCAN_CHUNK` more of the WAL stored up to `flushed`; the first checkpoint
    /// record `window` takes that has a record after it. Page ingest may pass those it does
    /// not take (`hold_from` moves past them).
    fn step(
        &mut self,
        timeline_dir: &Path,
        flushed: Lsn,
        window: Window,
    ) -> Result<Option<Target>, String> {
        let bytes = self
            .reader
            .read(timeline_dir, self.fed, flushed, SCAN_CHUNK)?;
        self.decoder.feed(&bytes);
        self.fed = Lsn(self.fed.0 + bytes.len() as u64);
        while let Some(record) = self.decoder.next_record().map_err(|e| e.to_string())? {
            let end = record.end_rec_ptr();
            if end <= self.from {
                continue;
            }
            if let Some((checkpoint, prev_end, _)) = self.pending.take() {
                self.prev_end = end;
                return Ok(Some(Target {
                    start: checkpoint.start,
                    end: checkpoint.end_rec_ptr(),
                    prev_end,
                    next_end: end,
                    record: checkpoint,
                    max_prepared_xacts: self.max_prepared_xacts,
                }));
            }
            let info = record.header.rm_info();
            if record.header.rmid == RM_XLOG_ID && info == XLOG_PARAMETER_CHANGE {
                self.max_prepared_xacts = self.max_prepared_xacts.max(prepared_slots(&record)?);
            }
            let is_checkpoint = record.header.rmid == RM_XLOG_ID
                && matches!(info, XLOG_CHECKPOINT_ONLINE | XLOG_CHECKPOINT_SHUTDOWN);
            if is_checkpoint {
                let previous = std::mem::replace(&mut self.last_checkpoint, record.start);
                if record.start >= window.from.max(self.hold_from) {
                    if window.takes(record.start, checkpoint_redo(&record)?, previous) {
                        self.pending = Some((record, self.prev_end, Instant::now()));
                    } else {
                        self.hold_from = end;
                    }
                }
            }
            self.prev_end = end;
        }
        // A checkpoint nothing follows (a primary shut down): page ingest may pass it, and the
        // snapshot goes to a later one.
        if let Some((checkpoint, _, since)) = &self.pending {
            if since.elapsed() > NEXT_RECORD_WAIT {
                self.hold_from = checkpoint.end_rec_ptr();
                self.pending = None;
            }
        }
        Ok(None)
    }
}

/// The redo point a checkpoint record names.
fn checkpoint_redo(record: &DecodedRecord) -> Result<Lsn, String> {
    let parts = postgres_wal::record::parse_parts(&record.bytes).map_err(|e| e.to_string())?;
    Checkpoint::parse(&record.bytes[parts.main_data])
        .map(|c| c.redo)
        .ok_or_else(|| format!("the checkpoint record at {} is too short", record.start))
}

/// `max_prepared_xacts` of a parameter-change record (`xl_parameter_change`: four `int`s, of
/// which it is the fourth).
fn prepared_slots(record: &DecodedRecord) -> Result<u32, String> {
    let parts = postgres_wal::record::parse_parts(&record.bytes).map_err(|e| e.to_string())?;
    record.bytes[parts.main_data]
        .get(12..16)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
        .ok_or_else(|| {
            format!(
                "the parameter-change record at {} is too short",
                record.start
            )
        })
}

/// Whether the WAL up to `lsn` survives a lost local disk as the snapshot's layers do: there is
/// no remote storage (both are on this disk), or the WAL archive has it, waited for up to
/// [`ARCHIVE_WAIT`] (it uploads every `wal_upload_interval`, 1 s by default).
fn wal_durable_to(timeline: &Timeline, lsn: Lsn, cancel: &dyn Fn() -> bool) -> bool {
    let Some(remote) = timeline.remote_copy() else {
        return true;
    };
    let deadline = Instant::now() + ARCHIVE_WAIT;
    loop {
        if remote
            .archived_lsn()
            .is_some_and(|archived| archived >= lsn)
        {
            return true;
        }
        if cancel() || Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The newest snapshot at or below `lsn`.
fn newest_snapshot(timeline: &Timeline, lsn: Lsn) -> Result<Option<Snapshot>, String> {
    let list = timeline
        .get_page(snapshot_list_key(), lsn)
        .map_err(|e| format!("reading the snapshot list: {e}"))?
        .map(|b| SnapshotList::decode(&b))
        .transpose()
        .map_err(|e| e.to_string())?;
    Ok(list.and_then(|l| l.snapshots.last().copied()))
}

/// Holds page ingest, before it starts, at the checkpoint records from where the next
/// snapshot's window begins: otherwise, with stored WAL to read at once after a restart, it
/// could pass the checkpoint the window takes before the thread looks, and the snapshot would
/// wait for a later one.
pub(super) fn hold_at_window(timeline: &Timeline, shared: &Shared, conf: &SnapshotConf) {
    let last = timeline.last_record_lsn();
    if conf.programs.is_err() || last == Lsn(0) {
        return;
    }
    if let Ok(Some(newest)) = newest_snapshot(timeline, last) {
        let window = conf.window_after(newest.lsn);
        shared.set_ingest_limit(IngestLimit::checkpoints_from(window.from));
    }
}

/// One look: a snapshot made (its LSN), or nothing to do yet.
fn round(
    timeline: &Arc<Timeline>,
    shared: &Shared,
    conf: &SnapshotConf,
    scan: &mut Option<Scan>,
    labels: &[&str; 2],
) -> Result<Option<Lsn>, String> {
    let segment_size = shared.segment_size.load(Ordering::Acquire);
    let Some(flushed) = shared.state().flushed_lsn else {
        return Ok(None);
    };
    let last = timeline.last_record_lsn();
    if segment_size == 0 || last == Lsn(0) {
        return Ok(None);
    }
    let Some(newest) = newest_snapshot(timeline, last)? else {
        return Ok(None);
    };
    crate::metrics::BACKGROUND_SNAPSHOT_LAG_BYTES
        .with_label_values(labels)
        .set(flushed.0.saturating_sub(newest.lsn.0) as i64);
    let window = conf.window_after(newest.lsn);
    if flushed < window.from {
        return Ok(None);
    }
    let programs = conf.programs.as_ref().map_err(Clone::clone)?;
    if scan.as_ref().is_none_or(|s| s.from != newest.lsn) {
        *scan = Some(Scan::new(newest.lsn, segment_size));
    }
    let s = scan.as_mut().expect("set above");
    // Page ingest stops at the first checkpoint record in the window (perhaps the
    // snapshot's), so that it is not past it when the scan finds it.
    let hold_from = |s: &Scan| IngestLimit::checkpoints_from(window.from.max(s.hold_from));
    shared.set_ingest_limit(hold_from(s));
    let found = s.step(timeline.dir(), flushed, window);
    // Past the checkpoints the scan let go.
    let hold = hold_from(s);
    shared.set_ingest_limit(hold);
    let Some(target) = found? else {
        return Ok(None);
    };
    let started = Instant::now();
    // Page ingest stops before the checkpoint record; if it is past it, the next one.
    shared.set_ingest_limit(IngestLimit {
        before: Some(target.start),
        checkpoint_from: None,
    });
    let result = hold_ingest_and_snapshot(timeline, shared, programs, &conf.replay_dir, &target);
    shared.set_ingest_limit(hold);
    shared.state().snapshot_running = false;
    let Some(stored) = result? else {
        return Ok(None);
    };
    // Held at once from the next one's window: let go meanwhile, page ingest could pass a
    // checkpoint there before the next round looks.
    shared.set_ingest_limit(IngestLimit::checkpoints_from(
        conf.window_after(target.end).from,
    ));
    crate::metrics::BACKGROUND_SNAPSHOTS
        .with_label_values(&["made"])
        .inc();
    crate::metrics::BACKGROUND_SNAPSHOT_SECONDS.observe(started.elapsed().as_secs_f64());
    crate::metrics::BACKGROUND_SNAPSHOT_BYTES.inc_by(stored);
    tracing::info!(tenant = %timeline.tenant_id(), timeline = %timeline.timeline_id(),
        lsn = %target.end, from = %newest.lsn, bytes_stored = stored,
        seconds = started.elapsed().as_secs_f64(), "background snapshot made");
    Ok(Some(target.end))
}

/// With page ingest held before the checkpoint record: waits for it to get there, replays and
/// imports. `Ok(None)` if page ingest was already past it.
fn hold_ingest_and_snapshot(
    timeline: &Arc<Timeline>,
    shared: &Shared,
    programs: &PgPrograms,
    dir: &Path,
    target: &Target,
) -> Result<Option<u64>, String> {
    let ingest = shared.state().ingest_pages;
    if timeline.last_record_lsn() >= target.end {
        return Ok(None);
    }
    if ingest {
        let deadline = Instant::now() + INGEST_WAIT;
        while timeline.last_record_lsn() < target.prev_end {
            if shared.stop.load(Ordering::Acquire) || timeline.is_shutting_down() {
                return Err("stopped".to_owned());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "page ingest did not reach {} within {INGEST_WAIT:?} (it is at {})",
                    target.prev_end,
                    timeline.last_record_lsn()
                ));
            }
            shared.wait_for_flush(None, Duration::from_millis(100));
        }
    }
    let _one = loop {
        match ONE_AT_A_TIME.try_lock() {
            Ok(guard) => break guard,
            Err(std::sync::TryLockError::Poisoned(e)) => break e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {}
        }
        if shared.stop.load(Ordering::Acquire) || timeline.is_shutting_down() {
            return Err("stopped".to_owned());
        }
        // Another timeline's snapshot runs.
        std::thread::sleep(Duration::from_millis(200));
    };
    shared.state().snapshot_running = true;
    let stored = make_snapshot(timeline, shared, programs, dir, target);
    // Whatever happened: the copy goes (a crash leaves it to the next snapshot, which
    // removes it first).
    if let Err(e) = pg_replay::remove_dir(dir) {
        tracing::warn!("removing {}: {e}", dir.display());
    }
    Ok(Some(stored?))
}

/// Replays the newest snapshot to `target.end` and imports the result there; the bytes stored.
fn make_snapshot(
    timeline: &Arc<Timeline>,
    shared: &Shared,
    programs: &PgPrograms,
    dir: &Path,
    target: &Target,
) -> Result<u64, String> {
    let base = timeline.last_record_lsn();
    let snapshot = snapshot_at(timeline, base).map_err(|e| e.to_string())?;
    // Held until the import: GC keeps what the basebackup reads.
    let _lease = timeline
        .lease_lsn(snapshot.lsn)
        .map_err(|e| format!("a lease on the snapshot at {}: {e}", snapshot.lsn))?;
    let replay = replay_of(timeline, snapshot.wal_from, target.next_end)
        .map_err(|e| e.to_string())?
        .ok_or("the timeline holds no WAL")?;
    // `end` is where the record ends, `next_end` the next record's start past it.
    if Lsn(replay.end.0.next_multiple_of(8)) < target.next_end {
        return Err(format!(
            "the WAL given to the replay ends at {}, before the record after the checkpoint \
             ({})",
            replay.end, target.next_end
        ));
    }
    // Each step's seconds are logged: where a snapshot's time goes.
    let started = Instant::now();
    pg_replay::prepare_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let (reader, writer) = std::io::pipe().map_err(|e| format!("a pipe: {e}"))?;
    std::thread::scope(|scope| {
        // By reference: the pipe closes when the thread ends, also when the basebackup fails
        // (which never ends its archive), so the unpack sees the end.
        let written = scope.spawn(move || {
            let writer = writer;
            write_basebackup(timeline, snapshot, Restore::Replay(&replay), &writer)
        });
        let mut archive = tar::Archive::new(reader);
        archive.set_preserve_permissions(true);
        let unpacked = archive.unpack(dir);
        drop(archive);
        let written = written
            .join()
            .expect("the basebackup thread does not panic");
        written.map_err(|e| format!("the basebackup of the snapshot at {}: {e}", snapshot.lsn))?;
        unpacked.map_err(|e| format!("unpacking it: {e}"))
    })?;
    let unpacked = Instant::now();
    fail::fail_point!("background-snapshot-before-replay");
    let cancel = || shared.stop.load(Ordering::Acquire) || timeline.is_shutting_down();
    let control = pg_replay::replay_to(
        programs,
        dir,
        target.start,
        target.end,
        target.max_prepared_xacts,
        REPLAY_TIMEOUT,
        &cancel,
    )
    .map_err(|e| match e {
        ReplayRunError::Cancelled => "stopped".to_owned(),
        ReplayRunError::Failed(e) => format!("the replay to {}: {e}", target.end),
    })?;
    let replayed = Instant::now();
    let segment_size = shared.segment_size.load(Ordering::Acquire);
    // A start from the snapshot replays from the checkpoint's redo point. The timeline's WAL
    // gives that WAL to a restore when it has it: from where this replay's began on (it just
    // gave it), and as durably as the snapshot (with remote storage, once the WAL archive has
    // it). Otherwise (a checkpoint that started before the snapshot this one comes from, an
    // archive behind) the snapshot keeps those segments, as an imported directory does.
    let redo = control.checkpoint_copy.redo;
    let from_timeline = redo >= snapshot.wal_from && wal_durable_to(timeline, target.end, &cancel);
    // A restore starts at the checkpoint record itself when the checkpoint's spread holds
    // nothing the snapshot lacks (`datadir/checkpoint_start.rs`); read, that spread also
    // gives the counters at the snapshot.
    let spread_started = Instant::now();
    let spread = if from_timeline && redo < target.start {
        match read_spread(timeline.dir(), segment_size, redo, &target.record, &cancel) {
            Ok(spread) => Some(spread),
            Err(e) if cancel() => return Err(e),
            Err(e) => {
                tracing::warn!(tenant = %timeline.tenant_id(), timeline = %timeline.timeline_id(),
                    "background snapshot at {}: restores from it replay from the checkpoint's \
                     redo point {redo}, as its spread could not be read: {e}", target.end);
                None
            }
        }
    } else {
        None
    };
    let spread_seconds = spread_started.elapsed().as_secs_f64();
    // What of the spread the snapshot lacks, if anything.
    let lacks = match &spread {
        _ if redo >= target.start => None,
        Some(s) => match s.still_prepared.iter().next() {
            Some((xid, at)) => Some(format!(
                "transaction {xid}, prepared at {at} in the checkpoint's spread and still \
                 prepared, is in its WAL alone"
            )),
            // Replay moves the newest transaction with a commit timestamp on.
            None if control.track_commit_timestamp => {
                Some("the cluster tracks commit timestamps".to_owned())
            }
            None => None,
        },
        None => Some("the spread was not read".to_owned()),
    };
    let wal_from = match lacks {
        _ if !from_timeline => target.end,
        None => target.start,
        Some(why) => {
            tracing::info!(tenant = %timeline.tenant_id(), timeline = %timeline.timeline_id(),
                "background snapshot at {}: restores from it replay from the checkpoint's \
                 redo point {redo}: {why}", target.end);
            redo
        }
    };
    let keep_wal = (wal_from == target.end).then_some((redo, target.end));
    pg_replay::finish_dir(dir, keep_wal, segment_size)
        .map_err(|e| format!("finishing the replayed directory: {e}"))?;
    // Page ingest's counters are those at `base`; only when it stopped right before the
    // checkpoint record is that record the one between them and the snapshot. Otherwise
    // those the spread gives (or, without, `pg_control`'s: the record's, from when the
    // checkpoint began).
    let counters = if shared.state().ingest_pages && base == target.prev_end {
        counters_at(timeline, base, &target.record)?
    } else {
        None
    };
    let counters = counters.or(spread.map(|s| s.counters));
    let import_started = Instant::now();
    fail::fail_point!("background-snapshot-before-import");
    let (reader, writer) = std::io::pipe().map_err(|e| format!("a pipe: {e}"))?;
    let report = std::thread::scope(|scope| {
        let written = scope.spawn(move || {
            let writer = writer;
            pg_replay::tar_dir(dir, &writer)
        });
        let report = import_replayed(timeline, reader, target.end, wal_from, counters);
        let written = written.join().expect("the archive thread does not panic");
        let report = report.map_err(|e| format!("importing the replayed directory: {e}"))?;
        written.map_err(|e| format!("reading the replayed directory: {e}"))?;
        Ok::<_, String>(report)
    })?;
    tracing::info!(tenant = %timeline.tenant_id(), timeline = %timeline.timeline_id(),
        lsn = %target.end, redo = %redo, wal_from = %wal_from,
        blocks_changed = report.blocks_changed, blocks_new = report.blocks_new,
        blocks_unchanged = report.blocks_unchanged, bytes_read = report.bytes_read,
        unpack_seconds = (unpacked - started).as_secs_f64(),
        replay_seconds = (replayed - unpacked).as_secs_f64(),
        spread_seconds,
        import_seconds = import_started.elapsed().as_secs_f64(),
        "background snapshot imported");
    Ok(report.bytes_stored)
}

/// The counters at the snapshot: those page ingest followed to `base`, moved by the checkpoint
/// record (the one record between `base` and the snapshot); `None` (those of `pg_control`)
/// without any stored.
fn counters_at(
    timeline: &Timeline,
    base: Lsn,
    checkpoint: &DecodedRecord,
) -> Result<Option<ClusterCounters>, String> {
    let Some(stored) = timeline
        .get_page(counters_key(), base)
        .map_err(|e| format!("reading the counters: {e}"))?
    else {
        return Ok(None);
    };
    let mut counters = ClusterCounters::decode(&stored).map_err(|e| e.to_string())?;
    let parts = postgres_wal::record::parse_parts(&checkpoint.bytes).map_err(|e| e.to_string())?;
    let main = &checkpoint.bytes[parts.main_data.clone()];
    crate::datadir::wal_counters::follow(&mut counters, checkpoint, main, None)?;
    Ok(Some(counters))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn conf(distance: u64) -> SnapshotConf {
        SnapshotConf {
            distance,
            replay_dir: PathBuf::new(),
            programs: Err(String::new()),
        }
    }

    #[test]
    fn the_window_takes_the_last_checkpoint_before_the_next_would_pass_the_distance() {
        let window = conf(512 * MIB).window_after(Lsn(0));
        assert_eq!((window.from, window.due), (Lsn(256 * MIB), Lsn(512 * MIB)));
        let takes = |start, redo, previous| {
            window.takes(Lsn(start * MIB), Lsn(redo * MIB), Lsn(previous * MIB))
        };
        // Before the window: never.
        assert!(!takes(200, 190, 0));
        // The next one, as far again, would be past the distance.
        assert!(takes(300, 290, 0));
        assert!(takes(450, 440, 300));
        // The next one is expected before it: not this one.
        assert!(!takes(300, 290, 200));
        // The gap to the checkpoint's own redo point counts (the one before it unseen).
        assert!(takes(300, 60, 250));
        // At or past the distance: whatever comes next.
        assert!(takes(512, 511, 500));
        assert!(takes(2000, 1999, 1990));
    }

    #[test]
    fn checkpoints_at_an_even_pace_give_snapshots_within_the_distance() {
        let distance = 512 * MIB;
        for gap in [16, 64, 100, 170, 255, 256, 300, 511, 512, 600, 1500].map(|g| g * MIB) {
            // Snapshots made one after another from 0, each at the checkpoint the window takes.
            let mut snapshot = 0;
            let mut checkpoint = 0;
            for _ in 0..5 {
                let window = conf(distance).window_after(Lsn(snapshot));
                let mut previous = Lsn(snapshot);
                let taken = loop {
                    checkpoint += gap;
                    let redo = Lsn(checkpoint - gap * 9 / 10);
                    if window.takes(Lsn(checkpoint), redo, previous) {
                        break checkpoint;
                    }
                    previous = Lsn(checkpoint);
                };
                let replay = taken - snapshot;
                // Within the distance, unless the checkpoints are further apart than it; and
                // not one checkpoint too early.
                assert!(
                    replay <= distance.max(gap),
                    "gap {gap}: {replay} after {snapshot}"
                );
                assert!(
                    replay + gap > distance,
                    "gap {gap}: {replay} after {snapshot}"
                );
                snapshot = taken;
            }
        }
    }
}
