//! A data directory at any LSN with nothing to replay: the pages page ingest made there, and a
//! shutdown checkpoint at that LSN of our making, as `pg_resetwal` makes one.
//!
//! In full-image mode (a primary with `wal_consistency_checking = 'all'`) every change of a
//! heap or index page carries the page's image, so page ingest holds every such page as an
//! image at every LSN it changed at; `pg_xact/`, `pg_multixact/`, relation maps, sizes and
//! directories follow the WAL as well, and `wal_counters.rs` follows the counters a checkpoint
//! carries. A basebackup at `X` is then everything read at `X` (the end of the last record at
//! or before the LSN asked for), and:
//!
//! ```text
//!  global/pg_control   the snapshot's, shut down at P: checkPoint = redo = P, the counters at X,
//!                      timeline N+1 (N: the WAL's at X), no backup or recovery left to finish
//!  pg_wal/<N+1, seg>   the stored WAL of P's segment up to X, zeros after it, and one record
//!                      at P: XLOG_CHECKPOINT_SHUTDOWN (P = X, or past the page header at a
//!                      page's start, or the next segment's start after an XLOG_SWITCH)
//!  pg_wal/<N+1>.history  the line to N, then "N  X": the restored cluster's WAL is its own
//!                      timeline from X on, as after a promotion
//! ```
//!
//! PostgreSQL started on it reads the checkpoint, finds the cluster shut down there and starts
//! at once: no WAL is replayed, so the time a restore takes is that of the archive, whatever the
//! distance to the last snapshot. Map pages (free space, visibility) that would need redo are
//! written as zeros: maps that know nothing, which PostgreSQL reads as such and refills.
//!
//! Only from a snapshot of a stopped primary ([`SnapshotKind::Stopped`] with exact counters): a
//! backup's pages may have been copied while they changed, which only the WAL before the
//! backup's end repairs, and page ingest starts at that end. A transaction running at `X` is
//! aborted, as after a crash; a prepared transaction's state is in the WAL before `X` only
//! and is lost with it. Unlogged relations start empty, as after a crash. Data checksums are
//! turned off in the restored cluster (as `pg_checksums --disable` does): a page image in the
//! WAL carries the checksum the page had when last written out, not one of its contents.

use std::io::{self, Read, Write};

use pageserver_api::datadir::{
    counters_key, file_chunk_key, ClusterCounters, FileDirectory, Snapshot, SnapshotKind,
};
use postgres_wal::record::{RM_XLOG_ID, XLOG_CHECKPOINT_SHUTDOWN};
use postgres_wal::segment::{history_file_name, segment_start, segno_of, SegmentName};
use postgres_wal::synthetic::WalBuilder;
use postgres_wal::XLOG_BLCKSZ;
use utils::Lsn;

use super::archive::{append_file, BasebackupError, PositionalReader, Replay};
use super::pg_control::{self, PG_CONTROL_FILE_SIZE, PG_CONTROL_PATH};
use crate::tenant::timeline::Timeline;

/// The files a materialized archive writes itself, and the LSN its pages are read at.
#[derive(Debug)]
pub struct Materialized {
    /// Where every page, size and file is read: the end of the last record at or before the
    /// LSN asked for (aligned, as page ingest puts versions there).
    pub at: Lsn,
    /// Where the checkpoint record is.
    pub checkpoint: Lsn,
    pub tli: u32,
    control: Vec<u8>,
    control_mtime: u64,
    history: Vec<(String, Vec<u8>)>,
    segment_name: String,
    segment_size: u64,
    /// The stored WAL of the segment before `tail` starts, and how much of it.
    prefix: Option<(std::fs::File, u64)>,
    /// The segment's bytes from `tail_offset` on: the page the checkpoint starts on, to the
    /// end of the record.
    tail: Vec<u8>,
    tail_offset: u64,
}

/// Why an archive without replay cannot be made.
fn refused(reason: String) -> BasebackupError {
    BasebackupError::NotMaterialized(reason)
}

/// Whether PostgreSQL started on `snapshot` itself replays nothing: a primary's directory
/// shut down at its checkpoint. A standby's, or a background snapshot's, replays its `pg_wal/`
/// from its restartpoint when it starts.
pub fn starts_clean(timeline: &Timeline, snapshot: Snapshot) -> Result<bool, BasebackupError> {
    if snapshot.kind != SnapshotKind::Stopped {
        return Ok(false);
    }
    let (_, control, _) = control_file_at(timeline, snapshot.lsn)?;
    Ok(control.is_primary_shutdown() && control.checkpoint == snapshot.lsn)
}

/// `global/pg_control` as the timeline holds it at `at`: its bytes, parsed, and its mtime.
pub fn control_file_at(
    timeline: &Timeline,
    at: Lsn,
) -> Result<(bytes::Bytes, pg_control::ControlFile, u64), BasebackupError> {
    let read = |key| Ok::<_, BasebackupError>(timeline.get_page(key, at)?);
    let files = read(pageserver_api::datadir::file_dir_key())?
        .ok_or_else(|| BasebackupError::Damaged(format!("no file directory at {at}")))?;
    let files = FileDirectory::decode(&files)?;
    let entry = files
        .get(PG_CONTROL_PATH)
        .ok_or_else(|| BasebackupError::Damaged(format!("no {PG_CONTROL_PATH} at {at}")))?;
    let original = read(file_chunk_key(entry.id, 0))?
        .filter(|b| b.len() == PG_CONTROL_FILE_SIZE)
        .ok_or_else(|| BasebackupError::Damaged(format!("{PG_CONTROL_PATH} at {at} is short")))?;
    let control = pg_control::parse(&original)
        .map_err(|e| BasebackupError::Damaged(format!("{PG_CONTROL_PATH}: {e}")))?;
    Ok((original, control, entry.mtime))
}

/// Plans the archive at `replay.target` from `snapshot` (below it) and the WAL `replay` names
/// (whose last segments reach the target).
pub fn plan(
    timeline: &Timeline,
    snapshot: Snapshot,
    replay: &Replay,
) -> Result<Materialized, BasebackupError> {
    let target = replay.target;
    if snapshot.kind != SnapshotKind::Stopped {
        return Err(refused(format!(
            "the snapshot below {target} (at {}) is a backup of a running cluster, whose pages may \
             have been copied while they changed: a restore without replay needs a snapshot of a \
             stopped primary below it (restore with replay instead)",
            snapshot.lsn
        )));
    }
    let (last_start, last_end, switch) = replay.last_record.ok_or_else(|| {
        refused(format!(
            "no WAL record ends between {} and {target} in the WAL stored",
            snapshot.lsn
        ))
    })?;
    if last_end != replay.end {
        return Err(refused(format!(
            "the last WAL record that ends at or before {target} is not in the stretch of WAL \
             looked at before it"
        )));
    }
    let at = Lsn(replay.end.0.next_multiple_of(postgres_wal::RECORD_ALIGN));
    if at < snapshot.lsn {
        return Err(refused(format!(
            "no WAL record ends between the snapshot at {} and {target}",
            snapshot.lsn
        )));
    }
    let ingested = timeline.last_record_lsn();
    if at > ingested {
        return Err(refused(format!(
            "page ingest holds the WAL up to {ingested}, not yet to {at} (the end of the last \
             record at or before {target}): is ingest_pages on?"
        )));
    }
    let read = |key| Ok::<_, BasebackupError>(timeline.get_page(key, at)?);
    let counters = read(counters_key())?
        .ok_or_else(|| refused(format!("the timeline holds no cluster counters at {at}")))?;
    let counters = ClusterCounters::decode(&counters)?;
    if !counters.exact {
        return Err(refused(format!(
            "the transaction id and OID counters at {at} are not known exactly (the snapshot \
             below was not taken at a primary's shutdown checkpoint, and the primary has not \
             shut down since)"
        )));
    }
    let (original, control, control_mtime) = control_file_at(timeline, at)?;
    if control.track_commit_timestamp {
        return Err(refused(
            "the cluster tracks commit timestamps (track_commit_timestamp), whose pg_commit_ts/ \
             page ingest does not follow: restore with replay"
                .to_string(),
        ));
    }

    let (last_name, last_file) = replay
        .segments
        .last()
        .ok_or_else(|| refused(format!("no WAL segment reaches {target}")))?;
    let segment_size = last_file.metadata()?.len();
    let size = u32::try_from(segment_size)
        .ok()
        .filter(|s| postgres_wal::segment::is_valid_segment_size(*s))
        .ok_or_else(|| {
            BasebackupError::Damaged(format!("WAL segment {last_name} is {segment_size} bytes"))
        })?;
    // Where the checkpoint goes: on the page the next record would go on, after the stored
    // bytes up to the cut; at the next segment's start after a switch (whose padding runs to
    // the end of its segment), or when it would not fit in the rest of this one (PostgreSQL
    // reads the checkpoint record alone, and needs only `xl_prev` below it).
    let old_tli = replay.tli;
    let tli = new_timeline(timeline, replay)?;
    let time = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let next_segment = segment_start(segno_of(Lsn(replay.end.0 - 1), size) + 1, size);
    let mut start = if switch {
        next_segment
    } else {
        Lsn(replay.end.0 - replay.end.0 % XLOG_BLCKSZ as u64)
    };
    let (checkpoint_at, checkpoint, tail, segno, tail_offset, stored) = loop {
        let segno = segno_of(start, size);
        let stored = replay
            .segments
            .iter()
            .find(|(name, _)| SegmentName::parse(name, size).is_some_and(|s| s.segno == segno))
            .map(|(_, file)| file);
        let mut kept = vec![0u8; (replay.end.0.max(start.0) - start.0) as usize];
        let tail_offset = start.0 - segment_start(segno, size).0;
        if !kept.is_empty() {
            let file = stored.ok_or_else(|| {
                BasebackupError::Damaged(format!("the WAL segment holding {start} went away"))
            })?;
            std::os::unix::fs::FileExt::read_exact_at(file, &mut kept, tail_offset)?;
        }
        let mut wal = WalBuilder::new(start, size)
            .timeline(tli)
            .system_id(control.system_identifier)
            .resume(kept, last_start);
        // A shutdown checkpoint's redo point is the record itself.
        let checkpoint_at = wal.next_record_start();
        let checkpoint =
            control
                .checkpoint_copy
                .shutdown_at(checkpoint_at, tli, old_tli, &counters, time);
        let laid = wal.main_data_record(
            RM_XLOG_ID,
            XLOG_CHECKPOINT_SHUTDOWN,
            0,
            &checkpoint.encode(),
        );
        assert_eq!(laid, checkpoint_at, "the record goes where it was said to");
        let tail = wal.bytes().to_vec();
        if tail_offset + tail.len() as u64 <= segment_size {
            break (checkpoint_at, checkpoint, tail, segno, tail_offset, stored);
        }
        if start == next_segment {
            return Err(BasebackupError::Damaged(format!(
                "a checkpoint record does not fit in a WAL segment of {size} bytes"
            )));
        }
        start = next_segment;
    };
    let prefix = match stored {
        Some(file) if tail_offset > 0 => Some((file.try_clone()?, tail_offset)),
        _ => None,
    };

    let mut history: Vec<(String, Vec<u8>)> = replay.history.clone();
    let mut line = history
        .iter()
        .find(|(name, _)| *name == history_file_name(old_tli))
        .map(|(_, bytes)| bytes.clone())
        .unwrap_or_default();
    // As PostgreSQL writes one: the parent's lines, a blank line, the switch.
    if !line.is_empty() {
        line.push(b'\n');
    }
    line.extend_from_slice(
        format!("{old_tli}\t{at}\trestored without replay at {at}\n").as_bytes(),
    );
    history.push((history_file_name(tli), line));
    Ok(Materialized {
        at,
        checkpoint: checkpoint_at,
        tli,
        control: pg_control::shut_down_at(&original, checkpoint_at, &checkpoint),
        control_mtime,
        history,
        segment_name: SegmentName { tli, segno }.file_name(size),
        segment_size,
        prefix,
        tail,
        tail_offset,
    })
}

/// The PostgreSQL timeline the restored cluster goes on: one past every timeline the WAL line
/// and the timeline's own WAL directory know (PostgreSQL's promotion takes one past the newest
/// it finds, too).
fn new_timeline(timeline: &Timeline, replay: &Replay) -> Result<u32, BasebackupError> {
    let mut newest = replay.tli;
    let names = replay.history.iter().map(|(name, _)| name.clone());
    let stored = std::fs::read_dir(timeline.dir().join(crate::tenant::timeline::WAL_DIR))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned());
    for name in names.chain(stored) {
        if let Some(tli) = postgres_wal::segment::parse_history_file_name(&name) {
            newest = newest.max(tli);
        }
    }
    newest
        .checked_add(1)
        .ok_or_else(|| refused("the WAL is on the last PostgreSQL timeline there is".to_string()))
}

impl Materialized {
    /// Whether the archive writes this file itself, or leaves it out: the control file, the
    /// WAL, and what would start a recovery or end a backup.
    pub fn replaces(&self, path: &str) -> bool {
        matches!(
            path,
            PG_CONTROL_PATH
                | "backup_label"
                | "tablespace_map"
                | "recovery.signal"
                | "standby.signal"
                | "postmaster.pid"
                | "postmaster.opts"
        ) || path.starts_with("pg_wal/")
            // Statistics of the snapshot's time, which a clean start would keep, and
            // replication slots holding back WAL of another history.
            || path.starts_with("pg_stat/")
            || path.starts_with("pg_replslot/")
    }

    /// Whether the archive leaves out this directory: a replication slot's, with its state
    /// file (`pg_wal/` and `pg_wal/archive_status/` stay).
    pub fn leaves_out_dir(&self, path: &str) -> bool {
        path.starts_with("pg_replslot/")
    }

    /// The control file, the history files and the WAL segment.
    pub fn append_own_files<W: Write>(
        &self,
        tar: &mut tar::Builder<W>,
    ) -> Result<(), BasebackupError> {
        let mtime = self.control_mtime;
        append_file(tar, PG_CONTROL_PATH, 0o600, mtime, &self.control)?;
        for (name, contents) in &self.history {
            append_file(tar, &format!("pg_wal/{name}"), 0o600, mtime, contents)?;
        }
        let prefix: Box<dyn Read + '_> = match &self.prefix {
            Some((file, len)) => Box::new(PositionalReader { file, at: 0 }.take(*len)),
            None => Box::new(io::repeat(0).take(self.tail_offset)),
        };
        let after = self.segment_size - self.tail_offset - self.tail.len() as u64;
        let mut contents = prefix
            .chain(&self.tail[..])
            .chain(io::repeat(0).take(after));
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o600);
        header.set_mtime(mtime);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_size(self.segment_size);
        tar.append_data(
            &mut header,
            format!("pg_wal/{}", self.segment_name),
            &mut contents,
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use postgres_wal::record::{parse_parts, RM_HEAP_ID};
    use postgres_wal::WalDecoder;

    use super::*;

    const SEG: u32 = 1 << 20;
    const PAGE: u64 = XLOG_BLCKSZ as u64;

    /// WAL from a segment's start whose last record ends exactly at `end`; its last start.
    fn wal_ending_at(end: u64) -> (WalBuilder, Lsn) {
        let mut wal = WalBuilder::new(Lsn(0), SEG);
        while end - wal.next_record_start().0 > 2000 {
            wal.main_data_record(RM_HEAP_ID, 0, 0, &[1; 1000]);
        }
        let len = (end - wal.next_record_start().0) as usize;
        let last = wal.main_data_record(RM_HEAP_ID, 0, 0, &vec![2; len - 24 - 5]);
        assert_eq!(wal.end(), Lsn(end));
        (wal, last)
    }

    #[test]
    fn the_checkpoint_follows_the_last_record_wherever_it_ends() {
        // Mid-page; at a page's end; so near it that the checkpoint runs onto the next page;
        // at the segment's end.
        for end in [3 * PAGE + 4000, 5 * PAGE, 7 * PAGE - 56, u64::from(SEG)] {
            let (wal, last) = wal_ending_at(end);
            let start = Lsn(end - end % PAGE);
            let kept = wal.bytes()[start.0 as usize..].to_vec();
            let mut tail = WalBuilder::new(start, SEG).timeline(2).resume(kept, last);
            let at = tail.next_record_start();
            let laid = tail.main_data_record(RM_XLOG_ID, XLOG_CHECKPOINT_SHUTDOWN, 0, &[7; 88]);
            assert_eq!(laid, at, "{end}");
            let expected = match end % PAGE {
                0 if end % u64::from(SEG) == 0 => end + 40,
                0 => end + 24,
                _ => end,
            };
            assert_eq!(at, Lsn(expected));

            let mut all = wal.bytes()[..start.0 as usize].to_vec();
            all.extend_from_slice(tail.bytes());
            let mut decoder = WalDecoder::new(Lsn(0), SEG);
            decoder.feed(&all);
            let mut records = Vec::new();
            while let Some(record) = decoder.next_record().unwrap() {
                records.push(record);
            }
            let checkpoint = records.pop().unwrap();
            assert_eq!(records.last().unwrap().start, last);
            assert_eq!(checkpoint.start, at);
            assert_eq!(
                checkpoint.header.prev, last,
                "it names the record before it"
            );
            assert_eq!(checkpoint.header.tot_len, 24 + 2 + 88);
            let parts = parse_parts(&checkpoint.bytes).unwrap();
            assert_eq!(&checkpoint.bytes[parts.main_data], &[7; 88]);
        }
    }
}
