//! Background snapshots: stock PostgreSQL replays the newest snapshot to a later LSN, and the
//! directory it shuts down with is imported as a new snapshot there, so that a restore replays
//! at most `snapshot_wal_distance` of WAL and GetPage@LSN is exact at every snapshot.
//!
//! A thread of its own per receiver whose `snapshot_wal_distance` is not 0, beside the one that
//! streams and page ingest's:
//!
//! ```text
//!   page ingest held before the first record starting at or past P + distance
//!     (P the newest snapshot; or past where page ingest is, if it is past that already)
//!   flushed WAL holds that record (ending at S; the next one will start at N):
//!     └─▶ the stored WAL from P decoded to S (`snapshot_scan.rs`): the counters at S, the
//!         prepared-transaction slots the replay needs
//!     └─▶ page ingest reaches that record (it stops before it); with remote storage, the
//!         WAL archive reaches S
//!     └─▶ one at a time per server: basebackup of P with the WAL up to S, unpacked into the
//!         server's `snapshot_replay_dir` (only the WAL, `pg_control` and the recovery files
//!         when the directory holds P already: [`KeptDir`]); an online checkpoint record put
//!         at N (redo N, the counters at S) and a no-op after it (`pg_replay::stop_before`)
//!     └─▶ PostgreSQL replays to the no-op and shuts down: its restartpoint at the checkpoint
//!         writes every page as at S (`pg_replay.rs`)
//!     └─▶ imported at S (only what differs from the timeline's state below S is stored; not
//!         its `pg_wal/`), its WAL listed from just before N (`Snapshot::wal_from`)
//!     └─▶ the directory kept, holding S, for the next snapshot; page ingest let go: it
//!         resumes after S
//! ```
//!
//! Why a checkpoint record put at N: PostgreSQL writes the pages it replayed only at a
//! restartpoint, which it makes only at a checkpoint record. The primary's come minutes and
//! hundreds of MiB apart, so one of them would set the snapshots' spacing; one put in the
//! replay's copy of the WAL makes a restartpoint wherever the snapshot is to be. A restore from
//! the snapshot starts at a checkpoint record put, in its archive, right before N
//! (`datadir/checkpoint_start.rs`), and replays from N. The timeline's own WAL is never
//! changed.
//!
//! Why the directory is kept: a snapshot otherwise unpacks the whole cluster from the one
//! before, which took half of its time (docs/benchmarks.md); kept, it replays on from where
//! the last one stopped, and the basebackup gives it only the WAL, `pg_control` (starting at
//! the checkpoint record put before P's next record, as a restore from P does) and the
//! recovery files (`Restore::ReplayOver`). It is kept only while it is known to hold the
//! newest snapshot exactly as imported: by this process, after a snapshot that succeeded.
//!
//! Crash safety: the import is one [`crate::tenant::timeline::Import`], durable whole at its
//! commit or not at all; the directory of a failed or killed replay is removed (by the next
//! snapshot, before it starts, after a crash), and one that another timeline's snapshot, a
//! newer snapshot of another origin or a restart made stale is made again. A stop (the
//! receiver's, the timeline's shutdown) stops the replay at once (`SIGQUIT`); a receiver that
//! stops removes the directory it kept. Disk: one directory the size of the cluster per
//! server, kept between snapshots ([`ONE_AT_A_TIME`]). Memory: a WAL chunk and a record while
//! scanning, and what an import holds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pageserver_api::datadir::{
    counters_key, snapshot_list_key, ClusterCounters, Snapshot, SnapshotKind, SnapshotList,
};
use postgres_wal::edit::back_by;
use postgres_wal::segment::segno_of;
use utils::{Lsn, TenantId, TimelineId};

use super::pg_replay::{self, PgPrograms, ReplayRunError};
use super::replay_plan::{latest_segment_file, replay_of};
use super::replayed_files::{self, FileStamp};
use super::snapshot_reads;
use super::snapshot_scan::{Scan, Target};
use super::state::{IngestLimit, Shared};
use crate::datadir::checkpoint_start::CHECKPOINT_RECORD_SPACE;
use crate::datadir::pg_control::{self, ControlFile};
use crate::datadir::{import_replayed, snapshot_at, write_basebackup, Restore};
use crate::tenant::timeline::Timeline;

/// Only one replay runs on a server at a time: each holds a copy of a cluster on disk and
/// keeps a CPU busy. The lock also holds what the replay directory holds between snapshots.
static ONE_AT_A_TIME: Mutex<Option<KeptDir>> = Mutex::new(None);

/// The snapshot the replay directory holds, as the snapshot that made it left it (its
/// directory imported there): the next snapshot of that timeline from that snapshot replays it
/// on, and unpacks only the WAL and the files a replay changes (`Restore::ReplayOver`), not
/// the whole cluster; and it reads only what of the relation files the WAL since names
/// (`snapshot_reads.rs`), the other blocks being the snapshot's. Known to this process
/// only: a replay runs without fsync, so after a restart the directory is never trusted and
/// is made again from the snapshot.
#[derive(Debug)]
struct KeptDir {
    tenant: TenantId,
    timeline: TimelineId,
    lsn: Lsn,
    /// Its relation files' stamps when it was imported.
    stamps: BTreeMap<String, FileStamp>,
}

impl KeptDir {
    fn holds(&self, timeline: &Timeline, lsn: Lsn) -> bool {
        self.is_of(timeline) && self.lsn == lsn
    }

    fn is_of(&self, timeline: &Timeline) -> bool {
        self.tenant == timeline.tenant_id() && self.timeline == timeline.timeline_id()
    }
}

/// The longest a replay may run.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(3600);
/// The longest page ingest may take to reach the snapshot's last record.
const INGEST_WAIT: Duration = Duration::from_secs(120);
const WAIT: Duration = Duration::from_secs(1);
const RETRY: Duration = Duration::from_secs(5);
/// How long a snapshot waits for the WAL archive to hold the WAL below it (a restore from it
/// reads that WAL from the timeline's), before it fails and tries again.
const ARCHIVE_WAIT: Duration = Duration::from_secs(30);
/// Failed attempts in a row that keep page ingest held where they would be.
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
    /// Where page ingest is held for the next snapshot after one at `lsn`, page ingest being
    /// at `ingested`: before the first record starting at or past `lsn` + the distance, or
    /// past `ingested` if it is there already.
    fn hold_after(&self, lsn: Lsn, ingested: Lsn) -> Lsn {
        Lsn(lsn.0.saturating_add(self.distance)).max(Lsn(ingested.0 + 1))
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
    // After failures that last, the next snapshot goes no nearer than this.
    let mut not_before = Lsn(0);
    while !stopped() {
        let seen = shared.state().flushed_lsn;
        match round(&timeline, &shared, &conf, &mut scan, not_before, &labels) {
            Ok(Some(lsn)) => {
                failures = 0;
                let mut s = shared.state();
                s.snapshot_lsn = Some(lsn);
                s.snapshot_error = None;
            }
            Ok(None) => shared.wait_for_flush(seen, WAIT),
            Err(e) => {
                // Page ingest stays held where the snapshot goes for the next attempts (let
                // go, it would pass it in the meantime), but not for a failure that lasts:
                // after `HELD_ATTEMPTS` in a row it goes on, and the next attempt goes the
                // distance past where it is then.
                failures += 1;
                if failures >= HELD_ATTEMPTS {
                    failures = 0;
                    shared.set_ingest_limit(IngestLimit::default());
                    not_before = Lsn(timeline.last_record_lsn().0.saturating_add(conf.distance));
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
    // A receiver that stops (its timeline detached or deleted, the server stopping) leaves no
    // copy of its cluster behind. (Another timeline's snapshot running now replaces it.)
    if let Ok(mut kept) = ONE_AT_A_TIME.try_lock() {
        if kept.as_ref().is_some_and(|k| k.is_of(&timeline)) {
            *kept = None;
            if let Err(e) = pg_replay::remove_dir(&conf.replay_dir) {
                tracing::warn!("removing {}: {e}", conf.replay_dir.display());
            }
        }
    }
}

/// Lifts every hold on page ingest when dropped.
struct ReleaseIngest<'a>(&'a Shared);

impl Drop for ReleaseIngest<'_> {
    fn drop(&mut self) {
        self.0.set_ingest_limit(IngestLimit::default());
    }
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

/// Holds page ingest, before it starts, where the next snapshot goes: otherwise, with stored
/// WAL to read at once after a restart, it could pass that place before the thread looks.
pub(super) fn hold_at_next(timeline: &Timeline, shared: &Shared, conf: &SnapshotConf) {
    let last = timeline.last_record_lsn();
    if conf.programs.is_err() || last == Lsn(0) {
        return;
    }
    if let Ok(Some(newest)) = newest_snapshot(timeline, last) {
        shared.set_ingest_limit(IngestLimit::from(conf.hold_after(newest.lsn, last)));
    }
}

/// One look: a snapshot made (its LSN), or nothing to do yet.
fn round(
    timeline: &Arc<Timeline>,
    shared: &Shared,
    conf: &SnapshotConf,
    scan: &mut Option<Scan>,
    not_before: Lsn,
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
    // Page ingest stops before the snapshot's last record: set before the scan looks, so that
    // page ingest is not past it when the scan finds it (not without the programs to make it).
    let from = conf.hold_after(newest.lsn, last).max(not_before);
    if conf.programs.is_ok() {
        shared.set_ingest_limit(IngestLimit::from(from));
    }
    if flushed <= from {
        return Ok(None);
    }
    let programs = conf.programs.as_ref().map_err(Clone::clone)?;
    if scan.as_ref().is_none_or(|s| s.snapshot != newest.lsn) {
        let (counters_from, counters, oldest_active) =
            counters_of(timeline, &newest, segment_size)?;
        *scan = Some(Scan::new(
            newest.lsn,
            counters_from,
            counters,
            oldest_active,
            segment_size,
        ));
    }
    let s = scan.as_mut().expect("set above");
    let Some(target) = s.step(timeline.dir(), flushed, from)? else {
        return Ok(None);
    };
    // The scan decoded past the target: the next round starts again from the snapshot.
    *scan = None;
    let started = Instant::now();
    let result = hold_ingest_and_snapshot(timeline, shared, programs, conf, &target);
    shared.state().snapshot_running = false;
    let Some(stored) = result? else {
        return Ok(None);
    };
    // Held at once where the next one goes: let go meanwhile, page ingest could pass it
    // before the next round looks.
    shared.set_ingest_limit(IngestLimit::from(conf.hold_after(target.end, target.end)));
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

/// The counters of `snapshot`, where they are PostgreSQL's (after replaying to there), and a
/// transaction id no transaction running there is older than. The counters are at the
/// snapshot itself when they are a shutdown checkpoint's or were followed to it (a background
/// snapshot's); else (a backup's) at the redo point of the checkpoint they are from, when the
/// timeline stores the WAL from there, or else taken as at the snapshot, as page ingest takes
/// them.
fn counters_of(
    timeline: &Timeline,
    snapshot: &Snapshot,
    segment_size: u32,
) -> Result<(Lsn, ClusterCounters, u32), String> {
    let counters = timeline
        .get_page(counters_key(), snapshot.lsn)
        .map_err(|e| format!("reading the counters: {e}"))?
        .ok_or_else(|| {
            format!(
                "no cluster counters are stored at the snapshot {}",
                snapshot.lsn
            )
        })?;
    let counters = ClusterCounters::decode(&counters).map_err(|e| e.to_string())?;
    let (_, control, _) = crate::datadir::control_file_at(timeline, snapshot.lsn)
        .map_err(|e| format!("the snapshot's pg_control: {e}"))?;
    // A shutdown checkpoint's is 0: nothing runs, none older than the next.
    let oldest_active = match control.checkpoint_copy.oldest_active_xid {
        0 => counters.next_xid as u32,
        xid => xid,
    };
    let background = snapshot.kind == SnapshotKind::Stopped && snapshot.wal_from < snapshot.lsn;
    let redo = control.checkpoint_copy.redo;
    let stored = latest_segment_file(timeline.dir(), segno_of(redo, segment_size), segment_size);
    if counters.exact || background || redo >= snapshot.lsn || stored.is_none() {
        return Ok((snapshot.lsn, counters, oldest_active));
    }
    Ok((redo, counters, oldest_active))
}

/// With page ingest held before the snapshot's last record: waits for it to get there (and
/// for the WAL archive to hold the WAL to the snapshot), replays and imports. `Ok(None)` if
/// page ingest was already past it.
fn hold_ingest_and_snapshot(
    timeline: &Arc<Timeline>,
    shared: &Shared,
    programs: &PgPrograms,
    conf: &SnapshotConf,
    target: &Target,
) -> Result<Option<u64>, String> {
    let stopped = || shared.stop.load(Ordering::Acquire) || timeline.is_shutting_down();
    if timeline.last_record_lsn() > target.ingest_to {
        return Ok(None);
    }
    if shared.state().ingest_pages {
        let deadline = Instant::now() + INGEST_WAIT;
        while timeline.last_record_lsn() < target.ingest_to {
            if stopped() {
                return Err("stopped".to_owned());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "page ingest did not reach {} within {INGEST_WAIT:?} (it is at {})",
                    target.ingest_to,
                    timeline.last_record_lsn()
                ));
            }
            shared.wait_for_flush(None, Duration::from_millis(100));
        }
    }
    // A restore from the snapshot reads the WAL from it on from the timeline's: as durable as
    // the snapshot, or no snapshot yet.
    if !wal_durable_to(timeline, target.end, &stopped) {
        return Err(format!(
            "the WAL archive does not hold the WAL to {} yet (waited {ARCHIVE_WAIT:?})",
            target.end
        ));
    }
    let mut kept = loop {
        match ONE_AT_A_TIME.try_lock() {
            Ok(guard) => break guard,
            // What the directory holds is not known after a panic: made again.
            Err(std::sync::TryLockError::Poisoned(e)) => {
                let mut guard = e.into_inner();
                *guard = None;
                break guard;
            }
            Err(std::sync::TryLockError::WouldBlock) => {}
        }
        if stopped() {
            return Err("stopped".to_owned());
        }
        // Another timeline's snapshot runs.
        std::thread::sleep(Duration::from_millis(200));
    };
    shared.state().snapshot_running = true;
    let dir = &conf.replay_dir;
    // Taken: until this snapshot is made, the directory holds nothing to go on from.
    let from = kept.take();
    match make_snapshot(timeline, shared, programs, dir, target, from) {
        // Kept for the next snapshot, which goes on from this one.
        Ok((stored, stamps)) => {
            *kept = Some(KeptDir {
                tenant: timeline.tenant_id(),
                timeline: timeline.timeline_id(),
                lsn: target.end,
                stamps,
            });
            Ok(Some(stored))
        }
        // The copy goes (a crash leaves it to the next snapshot, which removes it first).
        Err(e) => {
            if let Err(e) = pg_replay::remove_dir(dir) {
                tracing::warn!("removing {}: {e}", dir.display());
            }
            Err(e)
        }
    }
}

/// Replays the newest snapshot to `target.end` and imports the result there; the bytes stored,
/// and the stamps of the relation files imported. `kept`: the snapshot `dir` holds already,
/// if any.
fn make_snapshot(
    timeline: &Arc<Timeline>,
    shared: &Shared,
    programs: &PgPrograms,
    dir: &Path,
    target: &Target,
    kept: Option<KeptDir>,
) -> Result<(u64, BTreeMap<String, FileStamp>), String> {
    let base = timeline.last_record_lsn();
    let snapshot = snapshot_at(timeline, base).map_err(|e| e.to_string())?;
    // Held until the import: GC keeps what the basebackup reads.
    let _lease = timeline
        .lease_lsn(snapshot.lsn)
        .map_err(|e| format!("a lease on the snapshot at {}: {e}", snapshot.lsn))?;
    let replay = replay_of(timeline, snapshot.wal_from, target.end)
        .map_err(|e| e.to_string())?
        .ok_or("the timeline holds no WAL")?;
    // `end` is where the record's bytes end; the snapshot's LSN is that aligned, as
    // PostgreSQL's end of a record is.
    if Lsn(replay.end.0.next_multiple_of(8)) != target.end {
        return Err(format!(
            "the WAL given to the replay ends at {}, not at the end of the record before the \
             snapshot's first ({})",
            replay.end, target.end
        ));
    }
    let segment_size = shared.segment_size.load(Ordering::Acquire);
    // Each step's seconds are logged: where a snapshot's time goes.
    let started = Instant::now();
    // The directory holds the snapshot already: only the WAL and the files a replay changes.
    // (And what the scan listed the WAL's writes from.)
    let kept = kept.filter(|k| k.holds(timeline, snapshot.lsn) && k.lsn == target.scanned_from);
    let over = kept.is_some();
    let restore = if over {
        Restore::ReplayOver(&replay)
    } else {
        pg_replay::prepare_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Restore::Replay(&replay)
    };
    let (reader, writer) = std::io::pipe().map_err(|e| format!("a pipe: {e}"))?;
    std::thread::scope(|scope| {
        // By reference: the pipe closes when the thread ends, also when the basebackup fails
        // (which never ends its archive), so the unpack sees the end.
        let written = scope.spawn(move || {
            let writer = writer;
            write_basebackup(timeline, snapshot, restore, &writer)
        });
        let mut archive = tar::Archive::new(reader);
        archive.set_preserve_permissions(true);
        archive.set_overwrite(true);
        let unpacked = archive.unpack(dir);
        drop(archive);
        let written = written
            .join()
            .expect("the basebackup thread does not panic");
        written.map_err(|e| format!("the basebackup of the snapshot at {}: {e}", snapshot.lsn))?;
        unpacked.map_err(|e| format!("unpacking it: {e}"))
    })?;
    // The replay stops before the record at `next` with a restartpoint there: a checkpoint
    // put there in its copy of the WAL, with the counters at the snapshot.
    let control = read_control(dir)?;
    let checkpoint = control.checkpoint_copy.online_at(
        target.next,
        &target.counters,
        target.oldest_active_xid,
        control.track_commit_timestamp,
    );
    let stop = pg_replay::stop_before(
        dir,
        target.last_start,
        target.next,
        &checkpoint,
        segment_size,
    )
    .map_err(|e| format!("the checkpoint that stops the replay: {e}"))?;
    let unpacked = Instant::now();
    fail::fail_point!("background-snapshot-before-replay");
    let cancel = || shared.stop.load(Ordering::Acquire) || timeline.is_shutting_down();
    pg_replay::replay_to(
        programs,
        dir,
        target.next,
        stop,
        control.max_prepared_xacts.max(target.max_prepared_xacts),
        REPLAY_TIMEOUT,
        &cancel,
    )
    .map_err(|e| match e {
        ReplayRunError::Cancelled => "stopped".to_owned(),
        ReplayRunError::Failed(e) => format!("the replay to {}: {e}", target.end),
    })?;
    let replayed = Instant::now();
    pg_replay::finish_dir(dir, segment_size)
        .map_err(|e| format!("finishing the replayed directory: {e}"))?;
    // A restore starts at the checkpoint put right before the record at `next`.
    let wal_from = back_by(target.next, CHECKPOINT_RECORD_SPACE, segment_size);
    let import_started = Instant::now();
    // Of a kept directory, only what the replay may have written is read (`snapshot_reads.rs`).
    let stamps = replayed_files::relation_file_stamps(dir)
        .map_err(|e| format!("the replayed directory's relation files: {e}"))?;
    let partly_read =
        snapshot_reads::partly_read(&stamps, kept.as_ref().map(|k| &k.stamps), &target.touched);
    let partly_read = &partly_read[..];
    fail::fail_point!("background-snapshot-before-import");
    let (reader, writer) = std::io::pipe().map_err(|e| format!("a pipe: {e}"))?;
    let report = std::thread::scope(|scope| {
        let written = scope.spawn(move || {
            let writer = writer;
            replayed_files::tar_dir(dir, &writer, partly_read)
        });
        let report = import_replayed(
            timeline,
            reader,
            target.end,
            wal_from,
            Some(target.counters),
            (base, partly_read),
        );
        let written = written.join().expect("the archive thread does not panic");
        let report = report.map_err(|e| format!("importing the replayed directory: {e}"))?;
        written.map_err(|e| format!("reading the replayed directory: {e}"))?;
        Ok::<_, String>(report)
    })?;
    tracing::info!(tenant = %timeline.tenant_id(), timeline = %timeline.timeline_id(),
        lsn = %target.end, wal_from = %wal_from, from = %snapshot.lsn, kept = over,
        blocks_changed = report.blocks_changed, blocks_new = report.blocks_new,
        blocks_unchanged = report.blocks_unchanged, bytes_read = report.bytes_read,
        relation_files = stamps.len(),
        relation_files_unread = partly_read.iter().filter(|f| f.blocks.is_empty()).count(),
        relation_files_partly_read = partly_read.iter().filter(|f| !f.blocks.is_empty()).count(),
        blocks_read_of_those = partly_read.iter().map(|f| f.blocks.len()).sum::<usize>(),
        unpack_seconds = (unpacked - started).as_secs_f64(),
        replay_seconds = (replayed - unpacked).as_secs_f64(),
        import_seconds = import_started.elapsed().as_secs_f64(),
        "background snapshot imported");
    Ok((report.bytes_stored, stamps))
}

/// The `pg_control` of the unpacked directory.
fn read_control(dir: &Path) -> Result<ControlFile, String> {
    std::fs::read(dir.join(pg_control::PG_CONTROL_PATH))
        .map_err(|e| e.to_string())
        .and_then(|b| pg_control::parse(&b).map_err(|e| e.to_string()))
        .map_err(|e| format!("the unpacked pg_control: {e}"))
}
