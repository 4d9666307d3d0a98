//! Synthetic WAL segments, written the way PostgreSQL lays records over pages, and the end of
//! WAL found in them.

use postgres_wal::record::RM_HEAP_ID;
use postgres_wal::synthetic::WalBuilder;
use utils::Lsn;

use super::super::wal_end::{
    is_recycled, segment_name_order, wal_end, wal_segment_start, PAGE_ADDR_END,
};

const PAGE: usize = 8192;
const SEGMENT: usize = 1 << 20;
const MAGIC: u16 = 0xD110;

/// Writes records of the given total lengths into a 1 MiB segment starting at LSN `start`,
/// the first one after a continuation of `continuation` bytes; returns the segment and the
/// LSN right after the last record.
pub fn segment_with(start: u64, continuation: usize, lens: &[usize]) -> (Vec<u8>, Lsn) {
    let mut wal = WalBuilder::new(Lsn(start), SEGMENT as u32);
    if continuation > 0 {
        wal.continuation(continuation);
    }
    for (i, &len) in lens.iter().enumerate() {
        let parts: Vec<u8> = (0..len - 24).map(|b| (b * 7 + i) as u8).collect();
        wal.record(RM_HEAP_ID, 0, i as u32, &parts);
    }
    let end = if lens.is_empty() && continuation == 0 {
        Lsn(start + 40)
    } else if lens.is_empty() {
        Lsn(wal.end().0.next_multiple_of(8))
    } else {
        wal.end()
    };
    let mut seg = wal.segment_file();
    seg.resize(SEGMENT, 0);
    if lens.is_empty() && continuation == 0 {
        // No record: the first page still has its header.
        header(&mut seg, start, 0, 0);
    }
    (seg, end)
}

pub fn segment(start: u64, lens: &[usize]) -> (Vec<u8>, Lsn) {
    segment_with(start, 0, lens)
}

fn header(seg: &mut [u8], start: u64, page: usize, rem_len: usize) {
    let at = page * PAGE;
    let mut info = if rem_len > 0 { 1u16 } else { 0 };
    if page == 0 {
        info |= 2;
    }
    seg[at..at + 2].copy_from_slice(&MAGIC.to_le_bytes());
    seg[at + 2..at + 4].copy_from_slice(&info.to_le_bytes());
    seg[at + 4..at + 8].copy_from_slice(&1u32.to_le_bytes());
    seg[at + 8..at + 16].copy_from_slice(&(start + at as u64).to_le_bytes());
    seg[at + 16..at + 20].copy_from_slice(&(rem_len as u32).to_le_bytes());
    if page == 0 {
        seg[at + 24..at + 32].copy_from_slice(&42u64.to_le_bytes());
        seg[at + 32..at + 36].copy_from_slice(&(SEGMENT as u32).to_le_bytes());
        seg[at + 36..at + 40].copy_from_slice(&(PAGE as u32).to_le_bytes());
    }
}

#[test]
fn the_end_is_after_the_last_whole_record_whatever_pages_it_spans() {
    let start = 0x0300_0000;
    for lens in [
        vec![],
        vec![24],
        vec![100, 200, 300],
        vec![8000, 8000, 20_000, 33],
        // A record whose header straddles a page boundary.
        vec![8192 - 40 - 10, 100],
    ] {
        let (seg, end) = segment(start, &lens);
        assert_eq!(wal_end("seg", &seg).unwrap(), end, "{lens:?}");
    }
    let (seg, end) = segment_with(start, 20_000, &[50, 60]);
    assert_eq!(wal_end("seg", &seg).unwrap(), end);
}

#[test]
fn a_torn_or_recycled_record_ends_the_wal_before_it() {
    let start = 0x0300_0000;
    let (good, _) = segment(start, &[100, 9000]);
    let (_, end_of_first) = segment(start, &[100]);
    // The second record's last byte damaged: its CRC fails.
    let mut torn = good.clone();
    let second_end = wal_end("seg", &good).unwrap().0 - start;
    torn[second_end as usize - 1] ^= 1;
    assert_eq!(wal_end("seg", &torn).unwrap(), end_of_first);
    // Its second page is from an older use of the file (a recycled segment).
    let mut recycled = good.clone();
    recycled[PAGE + 8..PAGE + 16]
        .copy_from_slice(&(start - SEGMENT as u64 + PAGE as u64).to_le_bytes());
    assert_eq!(wal_end("seg", &recycled).unwrap(), end_of_first);
    // A record that names another record before it.
    let (mut wrong_prev, _) = segment(start, &[100, 200]);
    let second = (40 + 104usize).next_multiple_of(8);
    wrong_prev[second + 8] ^= 1;
    assert_eq!(wal_end("seg", &wrong_prev).unwrap(), end_of_first);
}

#[test]
fn files_that_are_not_segments_are_refused() {
    assert!(wal_end("x", &[0; 100]).is_err());
    let (mut seg, _) = segment(0x0300_0000, &[100]);
    seg[2] = 0; // no long header on the first page
    assert!(wal_end("x", &seg).is_err());
    let (seg, _) = segment(0x0300_0000, &[100]);
    assert!(
        wal_end("x", &seg[..PAGE * 4]).is_err(),
        "size is not the header's"
    );
    assert!(
        segment_name_order("000000010000000000000003")
            < segment_name_order("000000010000000100000000")
    );
    assert_eq!(segment_name_order("00000002.history"), None);
    assert_eq!(segment_name_order("archive_status"), None);
}

#[test]
fn a_segment_whose_first_page_is_another_segments_is_recycled() {
    let size = SEGMENT as u64;
    let start = wal_segment_start("pg_wal/000000010000000000000003", size).unwrap();
    assert_eq!(start, Lsn(0x0030_0000));
    let head = |seg: &[u8]| -> [u8; PAGE_ADDR_END] { seg[..PAGE_ADDR_END].try_into().unwrap() };
    let (own, _) = segment(0x0030_0000, &[100]);
    let (older, _) = segment(0x0010_0000, &[100]);
    assert!(!is_recycled(start, &head(&own)));
    assert!(is_recycled(start, &head(&older)));
    assert!(is_recycled(start, &[0; PAGE_ADDR_END]), "created empty");
    // Not a segment: another name, another directory, a size no segment has.
    for (path, size) in [
        ("pg_wal/00000002.history", 41),
        ("pg_wal/000000010000000000000003.partial", size),
        ("pg_wal/archive_status/000000010000000000000003.done", 0),
        ("base/000000010000000000000003", size),
        ("pg_wal/000000010000000000000003", 1000),
    ] {
        assert_eq!(wal_segment_start(path, size), None, "{path}");
    }
}

/// Writes a record of `len` bytes naming `prev` at `pos` (within one page); returns its start
/// and moves `pos` past it, aligned. The LSN right after it is `start + pos` before aligning.
fn record_at(seg: &mut [u8], pos: &mut usize, start: u64, len: usize, prev: u64) -> (u64, u64) {
    let record_start = start + *pos as u64;
    let mut record: Vec<u8> = (0..len).map(|b| (b * 13) as u8).collect();
    record[0..4].copy_from_slice(&(len as u32).to_le_bytes());
    record[8..16].copy_from_slice(&prev.to_le_bytes());
    record[16] = 0;
    record[17] = RM_HEAP_ID;
    let crc = utils::crc32c::crc32c_append(utils::crc32c::crc32c(&record[24..]), &record[..20]);
    record[20..24].copy_from_slice(&crc.to_le_bytes());
    seg[*pos..*pos + len].copy_from_slice(&record);
    *pos += len;
    let end = start + *pos as u64;
    *pos = pos.next_multiple_of(8);
    (record_start, end)
}

#[test]
fn a_page_written_over_a_cut_off_record_continues_the_wal() {
    let start = 0x0300_0000;
    // A 100-byte record, then one of 9000 bytes that page 1 would continue; but a recovery
    // found that one cut off and wrote new WAL from page 1 on, marked as overwriting it.
    let (mut seg, _) = segment(start, &[100, 9000]);
    let (_, end_of_first) = segment(start, &[100]);
    let first = start + 40;
    seg[PAGE..2 * PAGE].fill(0);
    header(&mut seg, start, 1, 0);
    seg[PAGE + 2..PAGE + 4].copy_from_slice(&0x0008u16.to_le_bytes());
    let mut pos = PAGE + 24;
    // Its first record names the last valid one before the cut-off record.
    let (overwrite, _) = record_at(&mut seg, &mut pos, start, 48, first);
    let (_, end) = record_at(&mut seg, &mut pos, start, 300, overwrite);
    assert_eq!(wal_end("seg", &seg).unwrap(), Lsn(end));

    // Without the mark the page does not continue the cut-off record: the end is before it.
    let mut unmarked = seg.clone();
    unmarked[PAGE + 2..PAGE + 4].copy_from_slice(&0u16.to_le_bytes());
    assert_eq!(wal_end("seg", &unmarked).unwrap(), end_of_first);
    // A first record there that names another record before it ends the WAL before it too.
    let mut wrong_prev = seg.clone();
    wrong_prev[PAGE + 24 + 8] ^= 1;
    assert_eq!(wal_end("seg", &wrong_prev).unwrap(), end_of_first);
    // A record whose header is cut off at the page boundary is skipped the same way.
    let (mut straddling, _) = segment(start, &[8192 - 40 - 10]);
    let (_, end_of_straddling) = segment(start, &[8192 - 40 - 10]);
    let mut pos = 8192 - 8;
    // Only 8 bytes of a header fit before the page: written, then page 1 overwrites.
    straddling[pos..pos + 4].copy_from_slice(&100u32.to_le_bytes());
    straddling[PAGE..2 * PAGE].fill(0);
    header(&mut straddling, start, 1, 0);
    straddling[PAGE + 2..PAGE + 4].copy_from_slice(&0x0008u16.to_le_bytes());
    pos = PAGE + 24;
    let (_, end) = record_at(&mut straddling, &mut pos, start, 64, start + 40);
    assert!(Lsn(end) > end_of_straddling);
    assert_eq!(wal_end("seg", &straddling).unwrap(), Lsn(end));
}
