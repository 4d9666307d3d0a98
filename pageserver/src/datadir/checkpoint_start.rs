//! A restore from a background snapshot starts replaying right at the snapshot.
//!
//! A background snapshot (`walreceiver/snapshots.rs`) is a standby's directory shut down in
//! recovery right after a checkpoint record that its replay's copy of the WAL had put at `N`,
//! where the record after the snapshot's LSN `S` starts (or will). Every page, SLRU, relation
//! map and prepared transaction in it is whole at `S`, and its `pg_control` names that record,
//! which the timeline's WAL does not hold. So the archive a restore starts from gets, in its
//! `pg_wal/` (the timeline's WAL from the snapshot's `wal_from` on):
//!
//! - an online checkpoint record in the 120 bytes of WAL that end where `N` starts (the end of
//!   the WAL below `S`, whose effect the snapshot holds; its `wal_from`), naming itself as its
//!   redo point, with the counters at `S` (`counters_key`, followed to `S` by the snapshot);
//!   the header of every page it continues on says so;
//! - when the restore goes past `S`, the record at `N` naming it as the record before
//!   (`xl_prev`), its CRC made again;
//!
//! and `global/pg_control` names that record, with recovery consistent at its end. PostgreSQL
//! reads the checkpoint, finds its redo point there, and replays from `N`: at `S`, nothing.
//!
//! A snapshot made by an earlier version, at one of the primary's online checkpoint records
//! `C` (ending at `S`), names `C` and `C`'s redo point `R`. Listed with its WAL from `C`, the
//! archive's `pg_control` and the record at `C` both say `redo = C`, with the counters at `S`
//! (the record's CRC made again); listed from `R`, it starts as stored.
//!
//! The timeline's own WAL is never changed: only the bytes written into the archive (which a
//! branch started from the archive may stream back: a stored record rewritten already, whole
//! or in part, is taken as the one it was).
//!
//! The cost: until the restored server's first checkpoint, its crash recovery starts there too,
//! where the WAL after it has no full-page image of a page the primary first changed since its
//! own last checkpoint; a torn write of such a page in that window would not be repaired
//! (docs/pitr.md).

use std::os::unix::fs::FileExt;

use pageserver_api::datadir::{counters_key, ClusterCounters, Snapshot, SnapshotKind};
use postgres_wal::edit::{
    back_by, encode_record, main_data_parts, place_record, record_end, with_prev,
};
use postgres_wal::page::{record_pieces, PageHeader, LONG_HEADER_LEN};
use postgres_wal::record::{
    record_crc, RecordHeader, CRC_OFFSET, RECORD_HEADER_LEN, RM_XLOG_ID, XLOG_CHECKPOINT_ONLINE,
};
use postgres_wal::segment::{segno_of, SegmentName};
use postgres_wal::{RECORD_ALIGN, XLOG_BLCKSZ, XLOG_PAGE_MAGIC};
use utils::Lsn;

use super::archive::{BasebackupError, Replay};
use super::materialize::control_file_at;
use super::pg_control::{self, Checkpoint, ControlFile, CHECKPOINT_LEN};
use crate::tenant::timeline::Timeline;

/// A checkpoint record's length: its header, the short header of its main data (two bytes),
/// and the `CheckPoint`.
const CHECKPOINT_RECORD_LEN: usize = RECORD_HEADER_LEN + 2 + CHECKPOINT_LEN;
/// The bytes of records it takes up, to where the next record starts (aligned).
pub const CHECKPOINT_RECORD_SPACE: u64 =
    (CHECKPOINT_RECORD_LEN as u64).next_multiple_of(RECORD_ALIGN);

/// What an archive writes in place of the stored bytes so that its replay starts at the
/// snapshot's checkpoint record.
#[derive(Debug)]
pub struct CheckpointStart {
    /// `global/pg_control`, with the rewritten checkpoint as its copy.
    pub control: Vec<u8>,
    /// The checkpoint record's bytes as written: (index of the segment in the replay's list,
    /// offset in it, bytes).
    patches: Vec<(usize, u64, Vec<u8>)>,
}

impl CheckpointStart {
    /// The byte ranges of the `i`-th segment of the replay that differ from the stored ones.
    pub fn patches_of(&self, i: usize) -> Vec<(u64, &[u8])> {
        self.patches
            .iter()
            .filter(|(segment, _, _)| *segment == i)
            .map(|(_, offset, bytes)| (*offset, bytes.as_slice()))
            .collect()
    }
}

/// The rewrite a replay from `snapshot` gets, if the snapshot is listed with its WAL from its
/// checkpoint record, or from the one put before its first record (`None` otherwise: it
/// starts as stored).
pub fn plan(
    timeline: &Timeline,
    snapshot: Snapshot,
    replay: &Replay,
) -> Result<Option<CheckpointStart>, BasebackupError> {
    if snapshot.kind != SnapshotKind::Stopped || snapshot.wal_from >= snapshot.lsn {
        return Ok(None);
    }
    let (original, control, _) = control_file_at(timeline, snapshot.lsn)?;
    let at = control.checkpoint;
    // Made at any record: its checkpoint is where the record after its LSN starts (its LSN
    // itself, unless that is a page's end). One made at a checkpoint record ends there.
    let put_before = at >= snapshot.lsn;
    if !put_before && (snapshot.wal_from != at || control.checkpoint_copy.redo == at) {
        return Ok(None);
    }
    let damaged = |what: String| {
        BasebackupError::Damaged(format!("the snapshot at {}: {what}", snapshot.lsn))
    };
    if !control.is_shut_down_in_recovery() {
        return Err(damaged(format!(
            "its WAL is listed from {}, but its pg_control says {:?}, not shut down in recovery",
            snapshot.wal_from,
            control.state_name()
        )));
    }
    let counters = timeline
        .get_page(counters_key(), snapshot.lsn)?
        .ok_or_else(|| damaged("no cluster counters are stored there".to_owned()))?;
    let counters = ClusterCounters::decode(&counters)?;
    let segments = ReplaySegments::of(replay).map_err(damaged)?;
    if put_before {
        return put_checkpoint_before(&segments, snapshot, replay, &original, &control, &counters)
            .map(Some)
            .map_err(damaged);
    }
    let rewritten = Checkpoint {
        redo: at,
        ..control.checkpoint_copy.with_counters(&counters)
    };
    let read = |lsn: Lsn, buf: &mut [u8]| segments.read(lsn, buf);
    let patches = rewrite_checkpoint(
        read,
        at,
        segments.segment_size,
        &control.checkpoint_copy,
        &rewritten,
    )
    .map_err(damaged)?;
    Ok(Some(CheckpointStart {
        control: pg_control::with_checkpoint_copy(&original, &rewritten),
        patches,
    }))
}

/// The segment files of a replay, read by LSN.
struct ReplaySegments<'a> {
    replay: &'a Replay,
    segment_size: u32,
    first_segno: u64,
}

impl<'a> ReplaySegments<'a> {
    fn of(replay: &'a Replay) -> Result<ReplaySegments<'a>, String> {
        let (first_name, first) = replay
            .segments
            .first()
            .ok_or_else(|| "no WAL segment to replay".to_owned())?;
        let len = first
            .metadata()
            .map_err(|e| format!("WAL segment {first_name}: {e}"))?
            .len();
        let segment_size = u32::try_from(len)
            .ok()
            .filter(|s| postgres_wal::segment::is_valid_segment_size(*s))
            .ok_or_else(|| format!("WAL segment {first_name} has no valid size"))?;
        let first_segno = SegmentName::parse(first_name, segment_size)
            .map(|n| segno_of(n.start(segment_size), segment_size))
            .ok_or_else(|| format!("WAL segment name {first_name:?}"))?;
        Ok(ReplaySegments {
            replay,
            segment_size,
            first_segno,
        })
    }

    /// Which of the replay's segments holds `lsn`.
    fn index(&self, lsn: Lsn) -> Result<usize, String> {
        segno_of(lsn, self.segment_size)
            .checked_sub(self.first_segno)
            .map(|i| i as usize)
            .filter(|i| *i < self.replay.segments.len())
            .ok_or_else(|| format!("no WAL segment of the replay holds {lsn}"))
    }

    /// Fills `buf` from `lsn` on (within one segment); which segment it read.
    fn read(&self, lsn: Lsn, buf: &mut [u8]) -> Result<usize, String> {
        let i = self.index(lsn)?;
        let offset = lsn.0 % u64::from(self.segment_size);
        self.replay.segments[i]
            .1
            .read_exact_at(buf, offset)
            .map_err(|e| format!("reading the WAL at {lsn}: {e}"))?;
        Ok(i)
    }

    /// The header of the page at `page`, as stored.
    fn page_header(&self, page: Lsn) -> Result<PageHeader, String> {
        let mut buf = [0; LONG_HEADER_LEN];
        let len = if page.0.is_multiple_of(u64::from(self.segment_size)) {
            LONG_HEADER_LEN
        } else {
            postgres_wal::page::SHORT_HEADER_LEN
        };
        self.read(page, &mut buf[..len])?;
        PageHeader::decode(&buf[..len], page, self.segment_size, XLOG_PAGE_MAGIC)
            .map_err(|e| format!("the WAL page at {page}: {e}"))
    }

    /// The writes as patches: (segment index, offset in it, bytes).
    fn patches(&self, writes: Vec<(Lsn, Vec<u8>)>) -> Result<Patches, String> {
        writes
            .into_iter()
            .map(|(lsn, bytes)| {
                Ok((
                    self.index(lsn)?,
                    lsn.0 % u64::from(self.segment_size),
                    bytes,
                ))
            })
            .collect()
    }
}

type Patches = Vec<(usize, u64, Vec<u8>)>;

/// A snapshot made at any record (`snapshots.rs`): its replay stopped before the record at
/// `N` (`pg_control`'s checkpoint, a record put there that the timeline's WAL does not hold).
/// The archive gets an online checkpoint record ending right before `N`, at the snapshot's
/// `wal_from`, naming itself as its redo point, with the counters at the snapshot;
/// `pg_control` names it; and the record at `N`, when the replay goes on past it, names it as
/// the record before (`xl_prev`, its CRC made again). What the new record is written over is
/// the end of the WAL below the snapshot, which the snapshot holds the result of.
fn put_checkpoint_before(
    segments: &ReplaySegments<'_>,
    snapshot: Snapshot,
    replay: &Replay,
    original: &[u8],
    control: &ControlFile,
    counters: &ClusterCounters,
) -> Result<CheckpointStart, String> {
    let segment_size = segments.segment_size;
    let next = control.checkpoint;
    let at = back_by(next, CHECKPOINT_RECORD_SPACE, segment_size);
    if snapshot.wal_from != at {
        return Err(format!(
            "its WAL is listed from {}, where the checkpoint before its first record (at \
             {next}) would start at {at}",
            snapshot.wal_from
        ));
    }
    let copy = &control.checkpoint_copy;
    let checkpoint = copy.online_at(
        at,
        counters,
        copy.oldest_active_xid,
        control.track_commit_timestamp,
    );
    let record = checkpoint_record(Lsn(0), &checkpoint);
    // After a segment switch, the rest of the segment holds no page headers: such a page
    // gets one made from the header of the first page of the snapshot's last segment.
    let last_segment = Lsn(snapshot.lsn.0 - 1 - (snapshot.lsn.0 - 1) % u64::from(segment_size));
    let template = segments.page_header(last_segment)?;
    let header_of = |page: Lsn| {
        Ok(segments
            .page_header(page)
            .unwrap_or_else(|_| template.moved(page, segment_size, 0)))
    };
    let mut writes = place_record(at, &record, segment_size, header_of)?;
    // The header of the page it starts on: that page may lie past the replay's end (after
    // a segment switch), where the archive gives zeros.
    let page = Lsn(at.0 - at.0 % XLOG_BLCKSZ as u64);
    if !writes.iter().any(|(lsn, _)| *lsn == page) {
        writes.insert(0, (page, header_of(page)?.encode()));
    }
    let end = record_end(at, record.len(), segment_size);
    if replay.end > snapshot.lsn {
        // The first record replayed: read whole, to be written with its new link.
        let mut header = [0; RECORD_HEADER_LEN];
        read_pieces(segments, next, &mut header)?;
        let len = RecordHeader::decode(&header).tot_len as usize;
        if len < RECORD_HEADER_LEN || len as u64 > u64::from(postgres_wal::MAX_RECORD_LEN) {
            return Err(format!("the record at {next} says it is {len} bytes"));
        }
        let mut next_record = vec![0; len];
        read_pieces(segments, next, &mut next_record)?;
        writes.extend(place_record(
            next,
            &with_prev(&next_record, at),
            segment_size,
            |page| segments.page_header(page),
        )?);
    }
    Ok(CheckpointStart {
        control: pg_control::with_checkpoint_at(original, at, &checkpoint, end),
        patches: segments.patches(writes)?,
    })
}

/// Fills `buf` with the bytes of the record at `at` (past the page headers between).
fn read_pieces(segments: &ReplaySegments<'_>, at: Lsn, buf: &mut [u8]) -> Result<(), String> {
    let mut done = 0;
    for (lsn, len) in record_pieces(at, buf.len(), segments.segment_size) {
        segments.read(lsn, &mut buf[done..done + len])?;
        done += len;
    }
    Ok(())
}

/// An online checkpoint record holding `checkpoint`, naming `prev` as the record before.
pub fn checkpoint_record(prev: Lsn, checkpoint: &Checkpoint) -> Vec<u8> {
    encode_record(
        prev,
        RM_XLOG_ID,
        XLOG_CHECKPOINT_ONLINE,
        0,
        &main_data_parts(&checkpoint.encode()),
    )
}

/// The online checkpoint record at `at`, read with `read` (which returns which segment it read
/// from), checked to hold `expected` (or `want` already) and rewritten to hold `want`: its
/// pieces as they are to be written, (segment, offset in the segment, bytes).
fn rewrite_checkpoint<S>(
    mut read: impl FnMut(Lsn, &mut [u8]) -> Result<S, String>,
    at: Lsn,
    segment_size: u32,
    expected: &Checkpoint,
    want: &Checkpoint,
) -> Result<Vec<(S, u64, Vec<u8>)>, String> {
    let pieces = record_pieces(at, CHECKPOINT_RECORD_LEN, segment_size);
    let mut record = Vec::with_capacity(CHECKPOINT_RECORD_LEN);
    let mut segments = Vec::with_capacity(pieces.len());
    for (lsn, len) in &pieces {
        let mut buf = vec![0; *len];
        segments.push(read(*lsn, &mut buf)?);
        record.extend_from_slice(&buf);
    }
    let header = RecordHeader::decode(&record);
    let is_checkpoint = header.tot_len as usize == CHECKPOINT_RECORD_LEN
        && header.rmid == RM_XLOG_ID
        && header.rm_info() == XLOG_CHECKPOINT_ONLINE
        && header.prev < at
        && record[RECORD_HEADER_LEN..RECORD_HEADER_LEN + 2] == [255, CHECKPOINT_LEN as u8];
    if !is_checkpoint {
        return Err(format!(
            "the WAL at {at}, which its pg_control names, is not an online checkpoint record"
        ));
    }
    // The stored record may be the rewritten one already, or half of each when it crosses a
    // segment: a restore's WAL streamed back into a branch holds what the archive gave it.
    // Whichever, it is written whole from pg_control's copy; an intact one must be one of
    // the two.
    if header.crc == record_crc(&record) {
        let stored =
            Checkpoint::parse(&record[RECORD_HEADER_LEN + 2..]).expect("the length is checked");
        if stored != *expected && stored != *want {
            return Err(format!(
                "the checkpoint record at {at} holds {stored:?}, its pg_control {expected:?}"
            ));
        }
    }
    record[RECORD_HEADER_LEN + 2..].copy_from_slice(&want.encode());
    let crc = record_crc(&record);
    record[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
    let mut done = 0;
    Ok(pieces
        .iter()
        .zip(segments)
        .map(|((lsn, len), segment)| {
            let bytes = record[done..done + len].to_vec();
            done += len;
            (segment, lsn.0 % u64::from(segment_size), bytes)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use postgres_wal::synthetic::WalBuilder;
    use postgres_wal::WalDecoder;

    const SEGMENT: u32 = 1 << 20;

    fn checkpoint(redo: u64) -> Checkpoint {
        Checkpoint {
            redo: Lsn(redo),
            tli: 1,
            prev_tli: 1,
            full_page_writes: true,
            next_xid: 1000,
            next_oid: 20_000,
            next_multi: 3,
            next_multi_offset: 7,
            oldest_xid: 716,
            oldest_xid_db: 1,
            oldest_multi: 1,
            oldest_multi_db: 1,
            time: 42,
            oldest_commit_ts_xid: 0,
            newest_commit_ts_xid: 0,
            oldest_active_xid: 990,
        }
    }

    /// A WAL stretch from `start` whose second record is an online checkpoint that starts
    /// `filler` bytes of main data past the first; its bytes, and where the checkpoint is.
    fn wal_with_checkpoint(start: u64, filler: usize) -> (WalBuilder, Lsn) {
        let mut wal = WalBuilder::new(Lsn(start), SEGMENT);
        wal.main_data_record(RM_XLOG_ID, 0x30, 0, &vec![7; filler]);
        let redo = wal.end().0 - 8;
        let at = wal.main_data_record(
            RM_XLOG_ID,
            XLOG_CHECKPOINT_ONLINE,
            0,
            &checkpoint(redo).encode(),
        );
        wal.commit(1200, 5);
        (wal, at)
    }

    /// The checkpoint record at `at` of WAL `bytes` from LSN 0, decoded.
    fn stored_checkpoint(bytes: &[u8], at: Lsn) -> Checkpoint {
        let decoded = decode(bytes, Lsn(0));
        let record = decoded.iter().find(|r| r.start == at).unwrap();
        Checkpoint::parse(&record.bytes[RECORD_HEADER_LEN + 2..]).unwrap()
    }

    /// Rewrites the checkpoint in `wal`'s bytes; decodes them again.
    fn rewritten(wal: &WalBuilder, at: Lsn) -> Vec<postgres_wal::DecodedRecord> {
        let start = wal.start().0;
        let mut bytes = wal.bytes().to_vec();
        let stored = {
            let decoded = decode(&bytes, wal.start());
            let record = decoded.iter().find(|r| r.start == at).unwrap();
            Checkpoint::parse(&record.bytes[RECORD_HEADER_LEN + 2..]).unwrap()
        };
        let read = |lsn: Lsn, buf: &mut [u8]| {
            let off = (lsn.0 - start) as usize;
            buf.copy_from_slice(&bytes[off..off + buf.len()]);
            Ok::<_, String>(segno_of(lsn, SEGMENT))
        };
        let want = Checkpoint {
            redo: at,
            next_xid: 1234,
            ..stored
        };
        let patches = rewrite_checkpoint(read, at, SEGMENT, &stored, &want).unwrap();
        for (segno, offset, piece) in patches {
            let off = (segno * u64::from(SEGMENT) + offset - start) as usize;
            bytes[off..off + piece.len()].copy_from_slice(&piece);
        }
        decode(&bytes, wal.start())
    }

    fn decode(bytes: &[u8], start: Lsn) -> Vec<postgres_wal::DecodedRecord> {
        let mut decoder = WalDecoder::new(start, SEGMENT);
        decoder.feed(bytes);
        std::iter::from_fn(|| decoder.next_record().unwrap()).collect()
    }

    #[test]
    fn a_rewritten_checkpoint_names_itself_as_redo_and_decodes_with_its_neighbours_unchanged() {
        // On one page, across a page header, and across the next segment's first (long)
        // header: fillers that put the checkpoint at every 8 bytes around a page's end.
        let page = postgres_wal::XLOG_BLCKSZ;
        let mut crossed = [false; 2];
        for start in [0, u64::from(SEGMENT) - page as u64] {
            for filler in (page - 400..page - 40).step_by(8) {
                let (wal, at) = wal_with_checkpoint(start, filler);
                let pieces = record_pieces(at, CHECKPOINT_RECORD_LEN, SEGMENT);
                if pieces.len() == 2 {
                    crossed[usize::from(start > 0)] = true;
                }
                let before = decode(wal.bytes(), wal.start());
                let after = rewritten(&wal, at);
                assert_eq!(after.len(), before.len(), "start {start}, filler {filler}");
                for (a, b) in after.iter().zip(&before) {
                    if a.start == at {
                        let c = Checkpoint::parse(&a.bytes[RECORD_HEADER_LEN + 2..]).unwrap();
                        assert_eq!((c.redo, c.next_xid), (at, 1234));
                        assert_eq!(c.oldest_active_xid, 990);
                    } else {
                        assert_eq!(a.bytes, b.bytes);
                    }
                }
            }
        }
        assert_eq!(
            crossed,
            [true, true],
            "a checkpoint crossed a page and a segment"
        );
    }

    #[test]
    fn a_record_rewritten_already_whole_or_in_part_is_written_whole_again() {
        let page = postgres_wal::XLOG_BLCKSZ;
        // Across a page: the first piece rewritten, the second as stored.
        for filler in (page - 400..page - 40).step_by(8) {
            let (wal, at) = wal_with_checkpoint(0, filler);
            let mut bytes = wal.bytes().to_vec();
            let stored = stored_checkpoint(&bytes, at);
            let read = |bytes: &Vec<u8>| {
                let bytes = bytes.clone();
                move |lsn: Lsn, buf: &mut [u8]| {
                    let off = lsn.0 as usize;
                    buf.copy_from_slice(&bytes[off..off + buf.len()]);
                    Ok::<_, String>(0)
                }
            };
            let rewrite = &Checkpoint { redo: at, ..stored };
            let first = rewrite_checkpoint(read(&bytes), at, SEGMENT, &stored, rewrite).unwrap();
            let apply = |bytes: &mut Vec<u8>, pieces: &[(u32, u64, Vec<u8>)], n: usize| {
                for (_, offset, piece) in pieces.iter().take(n) {
                    bytes[*offset as usize..*offset as usize + piece.len()].copy_from_slice(piece);
                }
            };
            let mut half = bytes.clone();
            apply(&mut half, &first, 1);
            apply(&mut bytes, &first, first.len());
            for stored_now in [&bytes, &half] {
                let again =
                    rewrite_checkpoint(read(stored_now), at, SEGMENT, &stored, rewrite).unwrap();
                assert_eq!(again, first, "filler {filler}");
            }
        }
    }

    #[test]
    fn a_record_that_is_not_the_checkpoint_pg_control_names_is_refused() {
        let (wal, at) = wal_with_checkpoint(0, 100);
        let bytes = wal.bytes().to_vec();
        let read = |lsn: Lsn, buf: &mut [u8]| {
            let off = lsn.0 as usize;
            buf.copy_from_slice(&bytes[off..off + buf.len()]);
            Ok::<_, String>(0)
        };
        let other = checkpoint(8);
        let e = rewrite_checkpoint(read, at, SEGMENT, &other, &other).unwrap_err();
        assert!(e.contains("its pg_control"), "{e}");
        // Not a checkpoint at all: the first record.
        let first = decode(&bytes, wal.start())[0].start;
        let e = rewrite_checkpoint(read, first, SEGMENT, &other, &other).unwrap_err();
        assert!(e.contains("not an online checkpoint record"), "{e}");
    }
}
