//! Where the WAL of a restore comes from, and where to cut it.
//!
//! A restore at LSN `X` replays the WAL from the snapshot below it. That WAL is the
//! timeline's own (`wal_store`), then, for a branch, its ancestor's up to the branch point
//! (and so on up the line): [`wal_sources`]. For each segment position the first source that
//! has it gives it, under the latest PostgreSQL timeline stored for it (a timeline switch
//! inside a segment moves the segment to the new timeline's name, as PostgreSQL copies it).
//! What the local disks lack is fetched from the WAL archives first ([`replay_of`]).
//!
//! The last segment is cut after the last record that ends at or before `X`, so that a
//! PostgreSQL replaying everything given stops exactly there; recovery targets the timeline
//! of that segment, whose history file goes with the WAL.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use postgres_wal::history::TimelineHistory;
use postgres_wal::segment::segment_files_in;
use postgres_wal::{SegmentName, WalDecoder};
use utils::Lsn;

use super::wal_store::{find_file, PARTIAL_SUFFIX, WAL_DIR};
use crate::datadir::Replay;
use crate::tenant::timeline::Timeline;

/// Where a restore finds WAL: a timeline's WAL directory, and the last segment it may give
/// (a branch's ancestor gives nothing past the branch point: its WAL after it is another
/// history).
#[derive(Clone, Debug)]
pub struct WalSource {
    pub timeline_dir: PathBuf,
    pub last_segment_at: Option<Lsn>,
}

/// Where the WAL that replays `timeline` is: its own, then its ancestor's up to the branch
/// point, and so on up the line (a branch made between two snapshots starts from the snapshot
/// below its branch point and the WAL its ancestor received after it; what a PostgreSQL
/// started from the branch streamed back is the branch's own).
pub fn wal_sources(timeline: &Arc<Timeline>) -> Vec<(Arc<Timeline>, WalSource)> {
    let source = |t: &Arc<Timeline>, bound| {
        (
            t.clone(),
            WalSource {
                timeline_dir: t.dir().to_owned(),
                last_segment_at: bound,
            },
        )
    };
    let mut sources = vec![source(timeline, None)];
    let mut at = timeline.clone();
    let mut bound: Option<Lsn> = None;
    while let Some((ancestor, branch_lsn)) = at.ancestor() {
        let ancestor = ancestor.clone();
        let b = bound.map_or(branch_lsn, |b| b.min(branch_lsn));
        bound = Some(b);
        sources.push(source(&ancestor, Some(b)));
        at = ancestor;
    }
    sources
}

/// Why the WAL of a restore is not there.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The archive could not be read: worth a retry.
    #[error("fetching the WAL from remote storage: {0}")]
    Fetch(String),
    #[error("{0}")]
    Missing(String),
}

/// [`replay_segments`] over [`wal_sources`], with what the local disks lack of it (lost, or
/// attached from elsewhere) fetched from the WAL archives first.
pub fn replay_of(
    timeline: &Arc<Timeline>,
    from: Lsn,
    to: Lsn,
) -> Result<Option<Replay>, ReplayError> {
    let sources = wal_sources(timeline);
    for (t, source) in &sources {
        let upto = source.last_segment_at.map_or(to, |b| b.min(to));
        let Some(remote) = t.remote_copy().filter(|_| upto >= from) else {
            continue;
        };
        remote
            .fetch_wal_range(&t.dir().join(WAL_DIR), from, upto)
            .map_err(|e| ReplayError::Fetch(format!("from {from} to {upto}: {e}")))?;
    }
    let sources: Vec<WalSource> = sources.into_iter().map(|(_, s)| s).collect();
    replay_segments(&sources, from, to).map_err(ReplayError::Missing)
}

/// The segment files of a WAL directory: for each position, the file of the latest timeline
/// (a switch inside a segment moves it to the new timeline's name: see
/// [`WalStore::switch_timeline`]).
fn segment_files(dir: &Path, size: u32) -> io::Result<BTreeMap<u64, SegmentName>> {
    let mut found: BTreeMap<u64, SegmentName> = BTreeMap::new();
    for file in segment_files_in(dir, size)? {
        let s = file.segment;
        let slot = found.entry(s.segno).or_insert(s);
        if s.tli > slot.tli {
            *slot = s;
        }
    }
    Ok(found)
}

/// The segment size of the WAL in `dir`, from a whole-size file's long page header (a file
/// still being zero-filled, or cut short by a crash then, says nothing).
fn segment_size_of(dir: &Path) -> Result<Option<u32>, String> {
    let entries = match std::fs::read_dir(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        entries => entries.map_err(|e| e.to_string())?,
    };
    for entry in entries {
        let entry = entry.map_err(|e| e.to_string())?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let base = name.strip_suffix(PARTIAL_SUFFIX).unwrap_or(&name);
        if !(base.len() == 24 && base.bytes().all(|b| b.is_ascii_hexdigit())) {
            continue;
        }
        let Ok(file) = File::open(entry.path()) else {
            continue;
        };
        let mut header = [0u8; postgres_wal::page::LONG_HEADER_LEN];
        if file.read_exact_at(&mut header, 0).is_err() {
            continue;
        }
        let claimed = u32::from_le_bytes(header[32..36].try_into().expect("4 bytes"));
        let len = file.metadata().map_err(|e| e.to_string())?.len();
        if postgres_wal::segment::is_valid_segment_size(claimed) && len == u64::from(claimed) {
            return Ok(Some(claimed));
        }
    }
    Ok(None)
}

/// Where `timeline`'s durable WAL ends: `flushed`, what its running receiver reported to the
/// primary as fsynced, or, with none running, the end of the last whole record of its newest
/// local segment (what a receiver started now resumes after); or where its WAL archive ends,
/// if later. `None` when it has no WAL.
pub fn durable_end(timeline: &Timeline, flushed: Option<Lsn>) -> Option<Lsn> {
    let archived = timeline.remote_copy().and_then(|r| r.archived_lsn());
    if flushed.is_some() {
        return flushed.max(archived);
    }
    let dir = timeline.dir().join(WAL_DIR);
    let local = segment_size_of(&dir).ok().flatten().and_then(|size| {
        let (segno, segment) = segment_files(&dir, size).ok()?.pop_last()?;
        let path = find_file(timeline.dir(), &segment.file_name(size))?;
        let bytes = std::fs::read(path).ok()?;
        let mut decoder = WalDecoder::new(postgres_wal::segment::segment_start(segno, size), size)
            .keeping_records_up_to(0);
        decoder.feed(&bytes);
        while let Ok(Some(_)) = decoder.next_record() {}
        Some(decoder.valid_end())
    });
    local.max(archived)
}

/// The history file of PostgreSQL timeline `tli`, from the first of `sources` that has it.
fn find_history(sources: &[WalSource], tli: u32) -> Result<Vec<u8>, String> {
    let name = postgres_wal::segment::history_file_name(tli);
    sources
        .iter()
        .find_map(|s| std::fs::read(s.timeline_dir.join(WAL_DIR).join(&name)).ok())
        .ok_or_else(|| {
            format!(
                "the WAL is of PostgreSQL timeline {tli}, and its history file {name} is missing"
            )
        })
}

/// The file of segment `segno` in `timeline_dir`'s WAL, under the latest timeline stored for it.
pub fn latest_segment_file(timeline_dir: &Path, segno: u64, size: u32) -> Option<PathBuf> {
    let files = segment_files(&timeline_dir.join(WAL_DIR), size).ok()?;
    find_file(timeline_dir, &files.get(&segno)?.file_name(size))
}

/// The WAL that replays `from..to` ([`Replay`]), from `sources` in order (a timeline's own
/// directory, then its ancestors' up to their branch points): every segment from the one
/// holding `from` to the one holding `to`, each from the first source that has it, under the
/// latest timeline stored for it, and the WAL reaching `to`; where to cut the last one (the end
/// of the last record that ends at or before `to`: what a replay of everything given stops
/// at); and the history file of the last segment's timeline, when it is not the first.
/// `Ok(None)` when no source has WAL; an error says what is missing.
pub fn replay_segments(
    sources: &[WalSource],
    from: Lsn,
    to: Lsn,
) -> Result<Option<Replay>, String> {
    let mut size = None;
    for source in sources {
        size = segment_size_of(&source.timeline_dir.join(WAL_DIR))?;
        if size.is_some() {
            break;
        }
    }
    let Some(size) = size else {
        return Ok(None);
    };
    let segno_of = |lsn: Lsn| postgres_wal::segment::segno_of(lsn, size);
    let mut listings = Vec::new();
    for source in sources {
        let dir = source.timeline_dir.join(WAL_DIR);
        let mut files = segment_files(&dir, size).map_err(|e| e.to_string())?;
        if let Some(last) = source.last_segment_at {
            files.retain(|segno, _| *segno <= segno_of(last));
        }
        listings.push((source, files));
    }
    // The newest segment any source has bounds what can be asked for; the WAL's exact end is
    // found below, in the segments read anyway.
    let Some(newest) = listings
        .iter()
        .filter_map(|(_, f)| f.keys().next_back())
        .max()
        .copied()
    else {
        return Ok(None);
    };
    if segno_of(to) > newest {
        let end = postgres_wal::segment::segment_start(newest + 1, size);
        return Err(format!(
            "the timeline's WAL ends at {end} at the latest (its newest segment), before {to}"
        ));
    }
    // Opened now: a segment that fills up and is renamed while the archive is written is
    // still the file opened.
    let mut segments: Vec<(String, File)> = Vec::new();
    let mut last_tli = 1;
    for segno in segno_of(from)..=segno_of(to) {
        let found = listings
            .iter()
            .find_map(|(source, files)| files.get(&segno).map(|s| (source, *s)));
        let Some((source, segment)) = found else {
            return Err(format!(
                "the timeline has no WAL segment from {}: its WAL does not reach back to {from}",
                postgres_wal::segment::segment_start(segno, size)
            ));
        };
        // Listed again if it went away: a segment that fills up is renamed once, one that a
        // timeline switch moves as well.
        let open = |segment: SegmentName| {
            find_file(&source.timeline_dir, &segment.file_name(size))
                .and_then(|path| File::open(path).ok())
                .map(|file| (segment, file))
        };
        let relisted = || {
            segment_files(&source.timeline_dir.join(WAL_DIR), size)
                .ok()
                .and_then(|files| files.get(&segno).copied())
                .and_then(open)
        };
        let (segment, file) = open(segment).or_else(relisted).ok_or_else(|| {
            format!(
                "the WAL segment {} went away while a restore read it",
                segment.file_name(size)
            )
        })?;
        segments.push((segment.file_name(size), file));
        last_tli = segment.tli;
    }
    // Where the WAL given is cut: the end of the last record that ends at or before `to`,
    // decoded from the segment before the last one when there is one, so that a record that
    // began there and ends in the last one counts.
    let tail = &segments[segments.len().saturating_sub(2)..];
    let first = segno_of(to) + 1 - tail.len() as u64;
    let mut decoder = WalDecoder::new(postgres_wal::segment::segment_start(first, size), size)
        .keeping_records_up_to(0);
    let mut cut = from;
    let mut last_record = None;
    // Whether the WAL reaches past `to`: a later segment is stored, or a record ends past it.
    let mut reached = segno_of(to) < newest;
    let mut buf = vec![0u8; size as usize];
    'files: for (_, file) in tail {
        file.read_exact_at(&mut buf, 0).map_err(|e| e.to_string())?;
        decoder.feed(&buf);
        loop {
            match decoder.next_record() {
                Ok(Some(record)) if record.end <= to => {
                    cut = cut.max(record.end);
                    let switch = (record.header.rmid, record.header.rm_info())
                        == (
                            postgres_wal::record::RM_XLOG_ID,
                            postgres_wal::record::XLOG_SWITCH,
                        );
                    last_record = Some((record.start, record.end, switch));
                }
                Ok(Some(_)) => {
                    reached = true;
                    break 'files;
                }
                Ok(None) => break,
                Err(_) => break 'files,
            }
        }
    }
    if !reached {
        // The WAL ends at or before `to`: `to` may still be where the next record would
        // start, past the padding and a page header at a page boundary
        // (`pg_current_wal_insert_lsn()` says so, for one).
        let end = decoder.valid_end();
        let mut next = end.0.next_multiple_of(postgres_wal::RECORD_ALIGN);
        if next.is_multiple_of(postgres_wal::XLOG_BLCKSZ as u64) {
            next += if next.is_multiple_of(u64::from(size)) {
                postgres_wal::page::LONG_HEADER_LEN
            } else {
                postgres_wal::page::SHORT_HEADER_LEN
            } as u64;
        }
        if to.0 > next {
            return Err(format!("the timeline's WAL ends at {end}, before {to}"));
        }
    }
    // Recovery targets the PostgreSQL timeline the line holds at the cut (the last segment's
    // file may be under a later one, when the cut is before a switch inside it: its bytes
    // there are the earlier timeline's too, and it is named so), and follows the line its
    // history file names; the history files of the line go with it.
    let mut tli = last_tli;
    if last_tli > 1 {
        let bytes = find_history(sources, last_tli)?;
        let line = TimelineHistory::parse(last_tli, &bytes).map_err(|e| e.to_string())?;
        tli = line.tli_of(cut);
    }
    if tli != last_tli {
        if let Some(last) = segments.last_mut() {
            last.0 = SegmentName {
                tli,
                segno: segno_of(to),
            }
            .file_name(size);
        }
    }
    let mut history = Vec::new();
    if tli > 1 {
        let bytes = find_history(sources, tli)?;
        let line = TimelineHistory::parse(tli, &bytes).map_err(|e| e.to_string())?;
        history.push((postgres_wal::segment::history_file_name(tli), bytes));
        for earlier in line.timelines().filter(|t| *t > 1 && *t < tli) {
            // Not needed by recovery (the target's file names the whole line), but by a
            // `recovery_target_timeline = 'latest'` that looks for them in turn.
            if let Ok(bytes) = find_history(sources, earlier) {
                history.push((postgres_wal::segment::history_file_name(earlier), bytes));
            }
        }
    }
    Ok(Some(Replay {
        target: to,
        end: cut,
        tli,
        history,
        goes_on: reached,
        last_record,
        segments,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::walreceiver::wal_store::WalStore;
    use postgres_wal::record::RM_HEAP_ID;
    use postgres_wal::synthetic::WalBuilder;

    const SEG: u32 = 1 << 20;

    fn own(dir: &Path) -> Vec<WalSource> {
        vec![WalSource {
            timeline_dir: dir.to_owned(),
            last_segment_at: None,
        }]
    }

    #[test]
    fn a_replay_is_cut_after_the_last_record_at_or_before_its_lsn_even_one_from_the_segment_before()
    {
        let dir = tempfile::tempdir().unwrap();
        let start = Lsn(4 * SEG as u64);
        let mut wal = WalBuilder::new(start, SEG);
        wal.main_data_record(RM_HEAP_ID, 0, 1, &[1; 100]);
        // Records up to just before the segment's end, then one that crosses into the next.
        while wal.end().0 < start.0 + SEG as u64 - 30_000 {
            wal.main_data_record(RM_HEAP_ID, 0, 2, &[2; 10_000]);
        }
        wal.main_data_record(RM_HEAP_ID, 0, 3, &[3; 50_000]);
        let crossing_end = wal.end();
        assert!(crossing_end.0 > start.0 + SEG as u64);
        wal.main_data_record(RM_HEAP_ID, 0, 4, &[4; 100]);
        let last_end = wal.end();
        let (mut store, _) = WalStore::open(dir.path(), SEG).unwrap();
        store.start_at(start);
        store.write(1, start, wal.bytes()).unwrap();
        store.flush().unwrap();
        let from = Lsn(start.0 + 100);
        for (to, end) in [
            (crossing_end, crossing_end),
            (Lsn(crossing_end.0 + 4), crossing_end),
            (last_end, last_end),
        ] {
            let replay = replay_segments(&own(dir.path()), from, to)
                .unwrap()
                .unwrap();
            assert_eq!(replay.end, end, "to {to}");
            assert_eq!(replay.segments.len(), 2);
        }
        assert!(
            replay_segments(&own(dir.path()), from, Lsn(last_end.0 + (64 << 10)))
                .unwrap_err()
                .contains("WAL ends at")
        );
        let before = replay_segments(&own(dir.path()), Lsn(start.0 - 8), last_end).unwrap_err();
        assert!(before.contains("does not reach back"), "{before}");
    }

    #[test]
    fn a_branch_reads_its_ancestors_segments_below_its_own_and_follows_its_timeline() {
        let ancestor = tempfile::tempdir().unwrap();
        let branch = tempfile::tempdir().unwrap();
        let start = Lsn(4 * SEG as u64);
        let mut wal = WalBuilder::new(start, SEG);
        while wal.end().0 < start.0 + SEG as u64 + 200_000 {
            wal.main_data_record(RM_HEAP_ID, 0, 1, &[1; 20_000]);
        }
        let branch_point = wal.end();
        let second = Lsn(start.0 + SEG as u64);
        let split = (second.0 - start.0) as usize;
        // The ancestor has both segments; the branch streamed the second one back, promoted.
        let (mut store, _) = WalStore::open(ancestor.path(), SEG).unwrap();
        store.start_at(start);
        store.write(1, start, wal.bytes()).unwrap();
        store.flush().unwrap();
        let (mut store, _) = WalStore::open(branch.path(), SEG).unwrap();
        store.start_at(second);
        store.write(1, second, &wal.bytes()[split..]).unwrap();
        store.switch_timeline(2, branch_point).unwrap();
        store.flush().unwrap();
        let sources = |bound| {
            vec![
                WalSource {
                    timeline_dir: branch.path().to_owned(),
                    last_segment_at: None,
                },
                WalSource {
                    timeline_dir: ancestor.path().to_owned(),
                    last_segment_at: Some(bound),
                },
            ]
        };
        let from = Lsn(start.0 + 100);
        // No history file for timeline 2: refused, by name.
        let e = replay_segments(&sources(branch_point), from, branch_point).unwrap_err();
        assert!(e.contains("00000002.history"), "{e}");
        let history = format!("1\t{branch_point}\tno recovery target specified\n").into_bytes();
        store.store_history(2, &history).unwrap();
        let replay = replay_segments(&sources(branch_point), from, branch_point)
            .unwrap()
            .unwrap();
        let names: Vec<&str> = replay.segments.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["000000010000000000000004", "000000020000000000000005"]
        );
        assert_eq!((replay.tli, replay.end), (2, branch_point));
        assert_eq!(
            replay.history,
            vec![("00000002.history".to_owned(), history.clone())]
        );
        // Before the switch, in its segment: timeline 1's WAL, named so, and nothing of 2.
        let before = Lsn(second.0 + 100_000);
        let replay = replay_segments(&sources(branch_point), from, before)
            .unwrap()
            .unwrap();
        let names: Vec<&str> = replay.segments.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["000000010000000000000004", "000000010000000000000005"]
        );
        assert_eq!(replay.tli, 1);
        assert!(replay.end <= before && replay.history.is_empty());
        // Without the branch's own WAL, the ancestor's stops at the branch point's segment.
        let ancestor_only = &sources(Lsn(start.0 + 1000))[1..];
        let e = replay_segments(ancestor_only, from, branch_point).unwrap_err();
        assert!(e.contains("WAL ends at"), "{e}");
    }
}
