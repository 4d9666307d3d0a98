//! The commit times of the archived WAL, for restores by time: as the WAL archive uploads a
//! segment (or the tail), it decodes the same bytes and notes the segment's first and last
//! commit (end LSN and time: `postgres_wal::xact::CommitRange`), which the index lists with
//! the segment. A search by time reads that index to find the segment, then decodes from there
//! (`walreceiver::commit_time`).
//!
//! One decoder runs along the archive's uploads, segment after segment, so a commit record
//! that spans two segments is seen whole, and counted in the segment where it ends. The scan
//! starts again (from the first segment it is given) after a gap or a restart: the one commit
//! that spans into that segment is then missed by its range, which only makes a search decode
//! one segment more. Only transaction records are kept whole (up to [`MAX_XACT_RECORD`]); WAL
//! that does not decode ends the scan, never the upload.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::path::Path;

use postgres_wal::record::RM_XACT_ID;
use postgres_wal::segment::{segment_start, segno_of};
use postgres_wal::xact::{commit_of, CommitRange};
use postgres_wal::WalDecoder;
use utils::Lsn;

/// Transaction records longer than this (a commit with a vast list of subtransactions or
/// invalidations) are not read for their time.
pub const MAX_XACT_RECORD: usize = 1 << 20;
/// The bytes read from a file at a time.
const CHUNK: usize = 1 << 20;

/// See the module documentation.
pub(super) struct CommitScan {
    decoder: WalDecoder,
    segment_size: u32,
    /// The LSN of the next byte to feed.
    next: Lsn,
    /// Commit ranges by segment number, for segments fed since the scan started.
    ranges: BTreeMap<u64, CommitRange>,
}

impl CommitScan {
    /// A scan whose first byte is the start of segment `segno`.
    pub(super) fn new(segno: u64, segment_size: u32) -> CommitScan {
        let start = segment_start(segno, segment_size);
        CommitScan {
            decoder: WalDecoder::new(start, segment_size)
                .keeping_records_up_to(0)
                .keeping_records_of(RM_XACT_ID, MAX_XACT_RECORD),
            segment_size,
            next: start,
            ranges: BTreeMap::new(),
        }
    }

    /// Where the next byte fed must be.
    pub(super) fn next(&self) -> Lsn {
        self.next
    }

    /// Feeds segment file `path` (of segment `segno`) from where the scan is up to `len`
    /// bytes of it.
    pub(super) fn feed_file(&mut self, path: &Path, segno: u64, len: u64) -> io::Result<()> {
        let start = segment_start(segno, self.segment_size);
        let from = self.next.0.checked_sub(start.0).filter(|f| *f <= len);
        let Some(from) = from else {
            return Err(io::Error::other(format!(
                "the scan is at {}, not in segment {segno}",
                self.next
            )));
        };
        let mut file = std::fs::File::open(path)?;
        std::io::Seek::seek(&mut file, io::SeekFrom::Start(from))?;
        let mut left = len - from;
        let mut buf = vec![0u8; CHUNK.min(left as usize)];
        while left > 0 {
            let n = (left as usize).min(CHUNK);
            file.read_exact(&mut buf[..n])?;
            self.decoder.feed(&buf[..n]);
            self.next = Lsn(self.next.0 + n as u64);
            left -= n as u64;
            self.drain()?;
        }
        Ok(())
    }

    fn drain(&mut self) -> io::Result<()> {
        loop {
            match self.decoder.next_record() {
                Ok(Some(record)) => {
                    if let Some((end, time)) = commit_of(&record) {
                        let segno = segno_of(Lsn(end.0 - 1), self.segment_size);
                        let range = self.ranges.get(&segno).copied();
                        self.ranges
                            .insert(segno, CommitRange::with(range, end, time));
                    }
                }
                Ok(None) => return Ok(()),
                Err(e) => return Err(io::Error::other(e.to_string())),
            }
        }
    }

    /// The commits of segment `segno` seen so far.
    pub(super) fn range_of(&self, segno: u64) -> Option<CommitRange> {
        self.ranges.get(&segno).copied()
    }

    /// Forgets the ranges of segments before `segno` (listed in the index by now).
    pub(super) fn forget_before(&mut self, segno: u64) {
        self.ranges = self.ranges.split_off(&segno);
    }
}

#[cfg(test)]
mod tests {
    use postgres_wal::record::RM_HEAP_ID;
    use postgres_wal::synthetic::WalBuilder;
    use postgres_wal::xact::POSTGRES_EPOCH_UNIX_MICROS;

    use super::*;

    const SEG: u32 = 1 << 20;

    #[test]
    fn a_commit_that_spans_two_segments_counts_where_it_ends_and_a_restart_misses_only_it() {
        let start = segment_start(3, SEG);
        let mut wal = WalBuilder::new(start, SEG);
        let mut commits = Vec::new();
        let mut time = 1_000_000i64;
        // Commits every few records, up to just before the segment's end...
        while wal.end().0 + 600 < start.0 + u64::from(SEG) {
            wal.main_data_record(RM_HEAP_ID, 0, 1, &[1u8; 400]);
            time += 1;
            wal.commit(1, time);
            commits.push((wal.end(), time));
        }
        // ...then one that crosses into the next segment, and more after it.
        let fill = (start.0 + u64::from(SEG) - wal.end().0 - 40) as usize;
        wal.main_data_record(RM_HEAP_ID, 0, 1, &vec![2u8; fill.saturating_sub(30)]);
        let spanning_time = time + 1;
        wal.commit(1, spanning_time);
        let spanning_end = wal.end();
        assert!(
            spanning_end.0 > start.0 + u64::from(SEG),
            "the commit crosses the segment end"
        );
        wal.main_data_record(RM_HEAP_ID, 0, 1, &[3u8; 100]);
        wal.commit(1, spanning_time + 1);
        let after = wal.end();

        let dir = tempfile::tempdir().unwrap();
        let file = wal.segment_file();
        let (first, second) = file.split_at(SEG as usize);
        std::fs::write(dir.path().join("3"), first).unwrap();
        std::fs::write(dir.path().join("4"), second).unwrap();
        let unix = |t: i64| t + POSTGRES_EPOCH_UNIX_MICROS;

        let mut scan = CommitScan::new(3, SEG);
        scan.feed_file(&dir.path().join("3"), 3, u64::from(SEG))
            .unwrap();
        let range = scan.range_of(3).unwrap();
        assert_eq!(
            (range.first_end, range.first_time),
            (commits[0].0, unix(commits[0].1))
        );
        let last = commits.last().unwrap();
        assert_eq!((range.last_end, range.last_time), (last.0, unix(last.1)));
        // The tail of segment 4 in two steps, as the archive uploads it.
        let half = (after.0 - segment_start(4, SEG).0) / 2;
        scan.feed_file(&dir.path().join("4"), 4, half).unwrap();
        scan.feed_file(&dir.path().join("4"), 4, after.0 - segment_start(4, SEG).0)
            .unwrap();
        let range = scan.range_of(4).unwrap();
        assert_eq!(
            (range.first_end, range.first_time),
            (spanning_end, unix(spanning_time))
        );
        assert_eq!(
            (range.last_end, range.last_time),
            (after, unix(spanning_time + 1))
        );

        // A scan that starts at segment 4 (after a restart) skips the record begun before it.
        let mut fresh = CommitScan::new(4, SEG);
        fresh
            .feed_file(&dir.path().join("4"), 4, after.0 - segment_start(4, SEG).0)
            .unwrap();
        let range = fresh.range_of(4).unwrap();
        assert_eq!((range.first_end, range.last_end), (after, after));
        // Not where the scan is: refused, never fed out of order.
        assert!(fresh.feed_file(&dir.path().join("3"), 3, 10).is_err());
    }
}
