//! The WAL a timeline received, durable, as PostgreSQL's own files: `<timeline>/wal/`, one file
//! per 16 MiB segment under its PostgreSQL name, `.partial` while it is being filled (as
//! `pg_receivewal` does), renamed when whole.
//!
//! Bytes are written at their LSN's place in their segment file; [`WalStore::flush`] fsyncs
//! the file being filled, and only then is the flushed LSN reported to the primary (a
//! synchronous primary's commit waits for it). A segment filled up is fsynced, renamed to its
//! final name, and its directory fsynced, before the next one is written.
//!
//! After a restart the store finds where its WAL ends by decoding its newest file
//! (`postgres_wal`): every byte up to the end of the last whole, checked record is WAL as the
//! primary wrote it. Streaming resumes from the start of that segment, so the file is written
//! again from its first byte with the same bytes, and nothing depends on whether the last
//! write before a crash reached the disk.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use postgres_wal::{SegmentName, WalDecoder};
use utils::Lsn;

use crate::datadir::Replay;
use crate::io::crashsafe;

pub use crate::tenant::timeline::WAL_DIR;
pub const PARTIAL_SUFFIX: &str = ".partial";

/// See the module documentation.
pub struct WalStore {
    dir: PathBuf,
    segment_size: u32,
    /// The segment being filled, and its file.
    current: Option<(SegmentName, File)>,
    /// Just past the last byte written.
    written: Lsn,
    /// Just past the last byte fsynced.
    flushed: Lsn,
}

/// What a store found on disk when it opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredEnd {
    /// The newest segment.
    pub segment: SegmentName,
    /// The end of its last whole, checked record.
    pub valid_end: Lsn,
}

impl WalStore {
    /// Opens (creating) the WAL directory of the timeline at `timeline_dir`.
    pub fn open(
        timeline_dir: &Path,
        segment_size: u32,
    ) -> io::Result<(WalStore, Option<StoredEnd>)> {
        let dir = timeline_dir.join(WAL_DIR);
        if !dir.exists() {
            std::fs::create_dir(&dir)?;
            crashsafe::fsync_dir(timeline_dir)?;
        }
        let newest = newest_segment(&dir, segment_size)?;
        let stored = match newest {
            None => None,
            Some((segment, path)) => {
                let bytes = std::fs::read(&path)?;
                let mut decoder = WalDecoder::new(segment.start(segment_size), segment_size)
                    .keeping_records_up_to(0);
                decoder.feed(&bytes);
                while let Ok(Some(_)) = decoder.next_record() {}
                Some(StoredEnd {
                    segment,
                    valid_end: decoder.valid_end(),
                })
            }
        };
        let store = WalStore {
            dir,
            segment_size,
            current: None,
            written: Lsn(0),
            flushed: Lsn(0),
        };
        Ok((store, stored))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the next bytes go: the start of the stream (a segment's start) for a store just
    /// opened.
    pub fn start_at(&mut self, lsn: Lsn) {
        self.current = None;
        self.written = lsn;
        self.flushed = lsn;
    }

    pub fn written(&self) -> Lsn {
        self.written
    }

    pub fn flushed(&self) -> Lsn {
        self.flushed
    }

    /// Writes `bytes`, the WAL of timeline `tli` from `lsn` (which must be where the last
    /// write ended), into their segment files.
    pub fn write(&mut self, tli: u32, lsn: Lsn, mut bytes: &[u8]) -> io::Result<()> {
        if lsn != self.written {
            return Err(io::Error::other(format!(
                "WAL from {lsn} arrived where {} was next",
                self.written
            )));
        }
        let size = u64::from(self.segment_size);
        while !bytes.is_empty() {
            let segment = SegmentName::of(tli, self.written, self.segment_size);
            let offset = self.written.0 % size;
            let n = bytes.len().min((size - offset) as usize);
            let file = self.file_for(segment)?;
            file.write_all_at(&bytes[..n], offset)?;
            self.written = Lsn(self.written.0 + n as u64);
            bytes = &bytes[n..];
            if self.written.0.is_multiple_of(size) {
                self.finish_segment()?;
            }
        }
        Ok(())
    }

    /// Makes every byte written durable; returns the flushed LSN.
    pub fn flush(&mut self) -> io::Result<Lsn> {
        if self.flushed < self.written {
            if let Some((_, file)) = &self.current {
                file.sync_data()?;
            }
            self.flushed = self.written;
        }
        Ok(self.flushed)
    }

    fn file_for(&mut self, segment: SegmentName) -> io::Result<&File> {
        if self.current.as_ref().is_none_or(|(s, _)| *s != segment) {
            let name = segment.file_name(self.segment_size);
            let whole = self.dir.join(&name);
            let partial = self.dir.join(format!("{name}{PARTIAL_SUFFIX}"));
            // Streaming a segment again (after a restart): its whole file becomes the one
            // being filled again; the bytes written are the same.
            if whole.exists() && !partial.exists() {
                std::fs::rename(&whole, &partial)?;
            }
            let file = OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(false)
                .open(&partial)?;
            let len = file.metadata()?.len();
            if len < u64::from(self.segment_size) {
                // Whole-size from the start, written with zeros as PostgreSQL's own files are
                // (not a sparse file or unwritten extents): a write then allocates nothing, so
                // each fdatasync flushes its data alone, not a journal commit too. That is one
                // 16 MiB write per segment, against a journal commit per flush, which a
                // synchronous primary waits for.
                let zeros = vec![0u8; 1 << 20];
                let mut at = len;
                while at < u64::from(self.segment_size) {
                    let n = (u64::from(self.segment_size) - at).min(zeros.len() as u64) as usize;
                    file.write_all_at(&zeros[..n], at)?;
                    at += n as u64;
                }
                file.sync_all()?;
                crashsafe::fsync_dir(&self.dir)?;
            }
            self.current = Some((segment, file));
        }
        Ok(&self.current.as_ref().expect("just set").1)
    }

    /// The segment being filled is whole: durable under its final name.
    fn finish_segment(&mut self) -> io::Result<()> {
        let Some((segment, file)) = self.current.take() else {
            return Ok(());
        };
        file.sync_data()?;
        self.flushed = self.written;
        let name = segment.file_name(self.segment_size);
        crashsafe::rename_durably(
            &self.dir.join(format!("{name}{PARTIAL_SUFFIX}")),
            &self.dir.join(&name),
        )
        .map_err(|e| io::Error::other(e.to_string()))
    }
}

/// The newest segment file in `dir` (whole or `.partial`), by position, then timeline.
fn newest_segment(dir: &Path, segment_size: u32) -> io::Result<Option<(SegmentName, PathBuf)>> {
    let mut newest: Option<(SegmentName, PathBuf)> = None;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let base = name.strip_suffix(PARTIAL_SUFFIX).unwrap_or(name);
        let Some(segment) = SegmentName::parse(base, segment_size) else {
            continue;
        };
        let key = |s: &SegmentName| (s.segno, s.tli);
        if newest.as_ref().is_none_or(|(n, _)| key(&segment) > key(n)) {
            newest = Some((segment, entry.path()));
        }
    }
    Ok(newest)
}

/// The path of WAL file `name` (a segment or a history file) in `timeline_dir`, whole or
/// partial, if the store has it.
pub fn find_file(timeline_dir: &Path, name: &str) -> Option<PathBuf> {
    let dir = timeline_dir.join(WAL_DIR);
    [dir.join(name), dir.join(format!("{name}{PARTIAL_SUFFIX}"))]
        .into_iter()
        .find(|p| p.is_file())
}

/// The WAL that replays `from..to` ([`Replay`]): every segment from the one holding `from` to the one
/// holding `to`, of the newest timeline stored, each present, and the stored WAL reaching `to`;
/// and where to cut the last one: the end of the last record that ends at or before `to`
/// (what a replay of everything given stops at). `Ok(None)` when the timeline has no WAL at
/// all; an error says what is missing.
pub fn replay_segments(timeline_dir: &Path, from: Lsn, to: Lsn) -> Result<Option<Replay>, String> {
    let dir = timeline_dir.join(WAL_DIR);
    if !dir.exists() {
        return Ok(None);
    }
    // The segment size, from a whole-size file's long page header (a file still being
    // zero-filled, or cut short by a crash then, says nothing).
    let mut size = None;
    for entry in std::fs::read_dir(&dir).map_err(|e| e.to_string())? {
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
            size = Some(claimed);
            break;
        }
    }
    let Some(size) = size else {
        return Ok(None);
    };
    // The newest segment's name gives the timeline, and bounds what can be asked for; the
    // WAL's exact end is found below, in the segments read anyway.
    let Some((newest, _)) = newest_segment(&dir, size).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    if postgres_wal::segment::segno_of(to, size) > newest.segno {
        return Err(format!(
            "the timeline's WAL ends at segment {}, before {to}",
            newest.file_name(size)
        ));
    }
    let tli = newest.tli;
    // Opened now: a segment that fills up and is renamed while the archive is written is
    // still the file opened.
    let mut segments: Vec<(String, File)> = Vec::new();
    for segno in
        postgres_wal::segment::segno_of(from, size)..=postgres_wal::segment::segno_of(to, size)
    {
        let name = SegmentName { tli, segno }.file_name(size);
        let missing = || {
            format!("the timeline has no WAL segment {name}: its WAL does not reach back to {from}")
        };
        // Looked up twice: a rename between the lookup and the open moves it once.
        let file = find_file(timeline_dir, &name)
            .and_then(|path| File::open(path).ok())
            .or_else(|| find_file(timeline_dir, &name).and_then(|path| File::open(path).ok()))
            .ok_or_else(missing)?;
        segments.push((name, file));
    }
    // Where the WAL given is cut: the end of the last record that ends at or before `to`,
    // decoded from the segment before the last one when there is one, so that a record that
    // began there and ends in the last one counts.
    let tail = &segments[segments.len().saturating_sub(2)..];
    let first = postgres_wal::segment::segno_of(to, size) + 1 - tail.len() as u64;
    let mut decoder = WalDecoder::new(postgres_wal::segment::segment_start(first, size), size)
        .keeping_records_up_to(0);
    let mut cut = from;
    // Whether the WAL reaches past `to`: a later segment is stored, or a record ends past it.
    let mut reached = postgres_wal::segment::segno_of(to, size) < newest.segno;
    let mut buf = vec![0u8; size as usize];
    'files: for (_, file) in tail {
        file.read_exact_at(&mut buf, 0).map_err(|e| e.to_string())?;
        decoder.feed(&buf);
        loop {
            match decoder.next_record() {
                Ok(Some(record)) if record.end <= to => cut = cut.max(record.end),
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
    Ok(Some(Replay {
        target: to,
        end: cut,
        segments,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use postgres_wal::record::RM_HEAP_ID;
    use postgres_wal::synthetic::WalBuilder;

    const SEG: u32 = 1 << 20;

    #[test]
    fn segments_fill_rename_and_a_reopened_store_finds_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let start = Lsn(4 * SEG as u64);
        let mut wal = WalBuilder::new(start, SEG);
        for i in 0..40u32 {
            wal.main_data_record(RM_HEAP_ID, 0, i, &vec![i as u8; 40_000]);
        }
        assert!(
            wal.end().0 > start.0 + SEG as u64,
            "the WAL spans two segments"
        );
        let (mut store, stored) = WalStore::open(dir.path(), SEG).unwrap();
        assert_eq!(stored, None);
        store.start_at(start);
        // Written in uneven pieces, as XLogData messages come.
        for piece in wal.bytes().chunks(77_777) {
            let at = store.written();
            store.write(1, at, piece).unwrap();
        }
        assert_eq!(store.flush().unwrap(), wal.end());
        let first = SegmentName::of(1, start, SEG).file_name(SEG);
        let second = SegmentName::of(1, wal.end(), SEG).file_name(SEG);
        let wal_dir = dir.path().join(WAL_DIR);
        // The first segment is whole under its name; the second is being filled.
        assert!(wal_dir.join(&first).is_file());
        assert!(wal_dir.join(format!("{second}{PARTIAL_SUFFIX}")).is_file());
        let bytes = std::fs::read(wal_dir.join(&first)).unwrap();
        assert_eq!(bytes.len(), SEG as usize);
        assert_eq!(&bytes[..], &wal.bytes()[..SEG as usize]);
        // A write that does not follow the last one is refused.
        assert!(store.write(1, Lsn(start.0 + 8), b"x").is_err());
        drop(store);

        let (mut store, stored) = WalStore::open(dir.path(), SEG).unwrap();
        let stored = stored.unwrap();
        assert_eq!(stored.segment, SegmentName::of(1, wal.end(), SEG));
        assert_eq!(stored.valid_end, wal.end());
        // Streamed again from that segment's start: the same bytes, in place.
        let again = stored.segment.start(SEG);
        store.start_at(again);
        let offset = (again.0 - start.0) as usize;
        store.write(1, again, &wal.bytes()[offset..]).unwrap();
        store.flush().unwrap();
        let (_, reopened) = WalStore::open(dir.path(), SEG).unwrap();
        assert_eq!(reopened.unwrap().valid_end, wal.end());
        assert_eq!(
            find_file(dir.path(), &second),
            Some(wal_dir.join(format!("{second}{PARTIAL_SUFFIX}")))
        );
        assert_eq!(find_file(dir.path(), "000000010000000000000099"), None);
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
            let replay = replay_segments(dir.path(), from, to).unwrap().unwrap();
            assert_eq!(replay.end, end, "to {to}");
            assert_eq!(replay.segments.len(), 2);
        }
        assert!(
            replay_segments(dir.path(), from, Lsn(last_end.0 + (64 << 10)))
                .unwrap_err()
                .contains("WAL ends at")
        );
        let before = replay_segments(dir.path(), Lsn(start.0 - 8), last_end).unwrap_err();
        assert!(before.contains("does not reach back"), "{before}");
    }

    #[test]
    fn a_torn_tail_ends_the_stored_wal_at_the_last_whole_record() {
        let dir = tempfile::tempdir().unwrap();
        let start = Lsn(2 * SEG as u64);
        let mut wal = WalBuilder::new(start, SEG);
        wal.main_data_record(RM_HEAP_ID, 0, 1, &[1; 5000]);
        let first_end = wal.end();
        wal.main_data_record(RM_HEAP_ID, 0, 2, &[2; 5000]);
        let (mut store, _) = WalStore::open(dir.path(), SEG).unwrap();
        store.start_at(start);
        let mut bytes = wal.bytes().to_vec();
        // The second record's last bytes never reached the disk.
        let len = bytes.len();
        bytes[len - 100..].fill(0);
        store.write(1, start, &bytes).unwrap();
        store.flush().unwrap();
        let (_, stored) = WalStore::open(dir.path(), SEG).unwrap();
        assert_eq!(stored.unwrap().valid_end, first_end);
    }
}
