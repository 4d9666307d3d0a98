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
//! write before a crash reached the disk. The same bytes: up to that end each one is compared
//! with the byte stored first ([`WalStore::verify_up_to`]), so a primary with another history
//! under the same timeline never overwrites this one.
//!
//! A switch of PostgreSQL timeline inside a segment moves the segment to the new timeline's
//! name ([`WalStore::switch_timeline`]): its bytes before the switch are the new timeline's
//! too, as PostgreSQL copies them, and a stream of the old timeline over it later writes into
//! that file.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use postgres_wal::segment::segment_files_in;
use postgres_wal::{SegmentName, WalDecoder};
use utils::Lsn;

use crate::io::crashsafe;

pub use crate::tenant::timeline::WAL_DIR;
pub use postgres_wal::segment::PARTIAL_SUFFIX;

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
    /// WAL stored before, which the stream goes over again: every byte below it must be the
    /// byte stored (see [`WalStore::verify_up_to`]).
    verify_below: Lsn,
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
            verify_below: Lsn(0),
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

    /// The stream goes over WAL stored before, up to `end` (its last whole record's end): the
    /// bytes must be those stored, or the primary's history is another one than the WAL's here
    /// (a cluster forked from the same point, with the same timeline), and writing would
    /// change it. A write that differs fails with [`io::ErrorKind::InvalidData`].
    pub fn verify_up_to(&mut self, end: Lsn) {
        self.verify_below = end;
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
            let verify = self.verify_below;
            let written = self.written;
            let file = self.file_for(segment)?;
            if written < verify {
                let len = n.min((verify.0 - written.0) as usize);
                let mut stored = vec![0u8; len];
                file.read_exact_at(&mut stored, offset)?;
                if let Some(i) = stored.iter().zip(&bytes[..len]).position(|(a, b)| a != b) {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "the primary's WAL at {} differs from the WAL stored there: its \
                             history is another one (a cluster forked from the same point)",
                            Lsn(written.0 + i as u64)
                        ),
                    ));
                }
            }
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
        if self
            .current
            .as_ref()
            .is_none_or(|(s, _)| s.segno != segment.segno || s.tli < segment.tli)
        {
            // A segment stored under a later timeline (the switch was in it, and streaming
            // resumed before the switch point): the same bytes below the switch, written
            // into that file.
            let segment = self.later_file_of(segment)?.unwrap_or(segment);
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
                .read(true)
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

    /// The file of `segment`'s position under the latest timeline after `segment`'s, if any.
    fn later_file_of(&self, segment: SegmentName) -> io::Result<Option<SegmentName>> {
        Ok(segment_files_in(&self.dir, self.segment_size)?
            .into_iter()
            .map(|f| f.segment)
            .filter(|s| s.segno == segment.segno && s.tli > segment.tli)
            .max_by_key(|s| s.tli))
    }

    /// The primary's WAL goes on as timeline `tli` from `at` (where the last write ended): the
    /// segment holding `at`, when the switch is inside it, moves to the new timeline's name
    /// (its bytes below the switch are the new timeline's too, as PostgreSQL copies them).
    /// Durable before it returns, with everything written.
    pub fn switch_timeline(&mut self, tli: u32, at: Lsn) -> io::Result<()> {
        if at != self.written {
            return Err(io::Error::other(format!(
                "a timeline switch at {at} where the WAL written ends at {}",
                self.written
            )));
        }
        self.flush()?;
        let Some((segment, file)) = self.current.take() else {
            return Ok(());
        };
        if segment.tli >= tli {
            self.current = Some((segment, file));
            return Ok(());
        }
        let renamed = SegmentName {
            tli,
            segno: segment.segno,
        };
        let from = self.dir.join(format!(
            "{}{PARTIAL_SUFFIX}",
            segment.file_name(self.segment_size)
        ));
        let to = self.dir.join(format!(
            "{}{PARTIAL_SUFFIX}",
            renamed.file_name(self.segment_size)
        ));
        crashsafe::rename_durably(&from, &to).map_err(|e| io::Error::other(e.to_string()))?;
        self.current = Some((renamed, file));
        Ok(())
    }

    /// Stores timeline `tli`'s history file, durably, unless the same one is stored.
    pub fn store_history(&self, tli: u32, contents: &[u8]) -> io::Result<()> {
        let name = postgres_wal::segment::history_file_name(tli);
        let path = self.dir.join(&name);
        if std::fs::read(&path).is_ok_and(|stored| stored == contents) {
            return Ok(());
        }
        let tmp = self.dir.join(format!("{name}.tmp"));
        std::fs::write(&tmp, contents)?;
        File::open(&tmp)?.sync_all()?;
        crashsafe::rename_durably(&tmp, &path).map_err(|e| io::Error::other(e.to_string()))
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
    Ok(segment_files_in(dir, segment_size)?
        .into_iter()
        .max_by_key(|f| (f.segment.segno, f.segment.tli))
        .map(|f| (f.segment, f.path)))
}

/// The path of WAL file `name` (a segment or a history file) in `timeline_dir`, whole or
/// partial, if the store has it.
pub fn find_file(timeline_dir: &Path, name: &str) -> Option<PathBuf> {
    let dir = timeline_dir.join(WAL_DIR);
    [dir.join(name), dir.join(format!("{name}{PARTIAL_SUFFIX}"))]
        .into_iter()
        .find(|p| p.is_file())
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

    #[test]
    fn a_switch_inside_a_segment_moves_it_to_the_new_timeline_and_a_restream_writes_into_it() {
        let dir = tempfile::tempdir().unwrap();
        let start = Lsn(4 * SEG as u64);
        let mut wal = WalBuilder::new(start, SEG);
        for i in 0..10u32 {
            wal.main_data_record(RM_HEAP_ID, 0, i, &vec![i as u8; 30_000]);
        }
        let switch = wal.end();
        for i in 10..50u32 {
            wal.main_data_record(RM_HEAP_ID, 0, i, &vec![i as u8; 30_000]);
        }
        assert!(
            wal.end().0 > start.0 + SEG as u64,
            "past the switch's segment"
        );
        let split = (switch.0 - start.0) as usize;
        let name = |tli, lsn| SegmentName::of(tli, lsn, SEG).file_name(SEG);
        let wal_dir = dir.path().join(WAL_DIR);

        let (mut store, _) = WalStore::open(dir.path(), SEG).unwrap();
        store.start_at(start);
        store.write(1, start, &wal.bytes()[..split]).unwrap();
        store.store_history(2, b"1\t0/4049DC0\tpromoted\n").unwrap();
        store.switch_timeline(2, switch).unwrap();
        // Written with the history again: nothing changes.
        store.store_history(2, b"1\t0/4049DC0\tpromoted\n").unwrap();
        store.write(2, switch, &wal.bytes()[split..]).unwrap();
        store.flush().unwrap();
        assert!(!wal_dir
            .join(format!("{}{PARTIAL_SUFFIX}", name(1, start)))
            .exists());
        assert!(
            wal_dir.join(name(2, start)).is_file(),
            "whole, under the new timeline"
        );
        assert!(wal_dir
            .join(format!("{}{PARTIAL_SUFFIX}", name(2, wal.end())))
            .is_file());
        assert!(wal_dir.join("00000002.history").is_file());
        // A switch anywhere but where the WAL written ends is refused.
        assert!(store.switch_timeline(3, start).is_err());
        drop(store);

        let (mut store, stored) = WalStore::open(dir.path(), SEG).unwrap();
        let stored = stored.unwrap();
        assert_eq!(stored.segment.tli, 2);
        assert_eq!(stored.valid_end, wal.end());
        // Streamed again from the switch's segment, on the old timeline first (as the
        // primary's line says for its start): the same bytes land in the new timeline's file.
        store.start_at(start);
        store.write(1, start, &wal.bytes()[..split]).unwrap();
        store.switch_timeline(2, switch).unwrap();
        store.write(2, switch, &wal.bytes()[split..]).unwrap();
        store.flush().unwrap();
        let names: Vec<String> = std::fs::read_dir(&wal_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(
            names.iter().all(|n| !n.starts_with("00000001")),
            "{names:?}"
        );
        let first = std::fs::read(wal_dir.join(name(2, start))).unwrap();
        assert_eq!(&first[..], &wal.bytes()[..SEG as usize]);
    }
}
