use proptest::prelude::*;

use super::*;
use crate::record::{RM_XLOG_ID, XLOG_CHECKPOINT_ONLINE, XLOG_NOOP};
use crate::synthetic::{main_data_parts, WalBuilder};
use crate::{DecodedRecord, WalDecoder};

const SEGMENT: u32 = 1 << 20;

/// Every record position from 0 to `end`, in order: the bytes of records are those between.
fn record_positions(end: u64) -> Vec<u64> {
    (0..end)
        .filter(|p| p % XLOG_BLCKSZ as u64 >= header_len(p - p % XLOG_BLCKSZ as u64, SEGMENT))
        .collect()
}

#[test]
fn back_by_counts_the_bytes_of_records_and_skips_page_headers() {
    let end = 2 * u64::from(SEGMENT) + 3 * XLOG_BLCKSZ as u64;
    let positions = record_positions(end);
    let around = |x: u64| x.saturating_sub(70)..x + 70;
    let mut spots: Vec<u64> = Vec::new();
    for boundary in [
        XLOG_BLCKSZ as u64,
        5 * XLOG_BLCKSZ as u64,
        u64::from(SEGMENT),
        2 * u64::from(SEGMENT) + XLOG_BLCKSZ as u64,
    ] {
        spots.extend(around(boundary));
    }
    for at in spots {
        let Ok(i) = positions.binary_search(&at) else {
            continue;
        };
        for n in [0, 1, 8, 40, 120, 8200] {
            if n > i {
                continue;
            }
            assert_eq!(
                back_by(Lsn(at), n as u64, SEGMENT),
                Lsn(positions[i - n]),
                "{n} back from {at}"
            );
        }
    }
    // From a page's end (the next page's start): as from the page's last byte's end.
    let page_end = 2 * XLOG_BLCKSZ as u64;
    let last = positions.binary_search(&(page_end - 1)).unwrap();
    assert_eq!(
        back_by(Lsn(page_end), 120, SEGMENT),
        Lsn(positions[last + 1 - 120])
    );
}

proptest! {
    #[test]
    fn back_by_undoes_going_forward(start in 40u64..(3 << 20), n in 0u64..40_000) {
        // A position, and the one `n` bytes of records on from it.
        let start = if start % XLOG_BLCKSZ as u64 >= header_len(start - start % XLOG_BLCKSZ as u64, SEGMENT) {
            start
        } else {
            start - start % XLOG_BLCKSZ as u64 + header_len(start - start % XLOG_BLCKSZ as u64, SEGMENT)
        };
        let forward = record_end(Lsn(start), n as usize + 1, SEGMENT);
        // The end of n + 1 bytes is one past the last; back n + 1 from it is the start.
        prop_assert_eq!(back_by(forward, n + 1, SEGMENT), Lsn(start));
    }
}

fn checkpoint_record(prev: Lsn, redo: Lsn) -> Vec<u8> {
    let mut checkpoint = vec![0u8; 88];
    checkpoint[..8].copy_from_slice(&redo.0.to_le_bytes());
    checkpoint[8..12].copy_from_slice(&1u32.to_le_bytes());
    encode_record(
        prev,
        RM_XLOG_ID,
        XLOG_CHECKPOINT_ONLINE,
        0,
        &main_data_parts(&checkpoint),
    )
}

/// WAL from `start` with a record of `filler` bytes of main data, then one of 9000 (crossing a
/// page), then two small ones; the bytes, and where the big record starts.
fn wal(start: u64, filler: usize) -> (WalBuilder, Lsn) {
    let mut wal = WalBuilder::new(Lsn(start), SEGMENT);
    wal.main_data_record(RM_XLOG_ID, 0x30, 0, &vec![7; filler]);
    wal.main_data_record(RM_XLOG_ID, 0x30, 0, &[1; 4]);
    let big = wal.main_data_record(RM_XLOG_ID, 0x30, 0, &vec![9; 9000]);
    wal.commit(1200, 5);
    wal.main_data_record(RM_XLOG_ID, 0x30, 0, &[2; 4]);
    (wal, big)
}

fn apply(bytes: &mut [u8], start: u64, writes: &[(Lsn, Vec<u8>)]) {
    for (lsn, piece) in writes {
        let off = (lsn.0 - start) as usize;
        bytes[off..off + piece.len()].copy_from_slice(piece);
    }
}

fn header_in(bytes: &[u8], start: u64) -> impl FnMut(Lsn) -> Result<PageHeader, String> + '_ {
    move |page: Lsn| {
        let off = (page.0 - start) as usize;
        PageHeader::decode(&bytes[off..], page, SEGMENT, crate::XLOG_PAGE_MAGIC)
    }
}

fn decode_from(bytes: &[u8], start: u64, from: Lsn) -> (Vec<DecodedRecord>, Lsn) {
    let mut decoder = WalDecoder::new(from, SEGMENT);
    decoder.feed(&bytes[(from.0 - start) as usize..]);
    let mut records = Vec::new();
    loop {
        match decoder.next_record() {
            Ok(Some(r)) => records.push(r),
            Ok(None) => break,
            // The end of the WAL written (zeros), or of what is there.
            Err(_) => break,
        }
    }
    (records, decoder.valid_end())
}

/// Fillers that put the records at every 8 bytes around a page's end, and around a segment's
/// end (its first page has the long header).
fn placements() -> Vec<(u64, usize)> {
    let page = XLOG_BLCKSZ;
    let mut all = Vec::new();
    for start in [0, u64::from(SEGMENT) - page as u64] {
        for filler in (page - 500..page - 20).step_by(8) {
            all.push((start, filler));
        }
    }
    all
}

#[test]
fn a_checkpoint_put_just_before_a_record_is_read_from_there_and_the_record_follows_it() {
    for (start, filler) in placements() {
        let (wal, n) = wal(start, filler);
        let original = decode_from(wal.bytes(), start, wal.start()).0;
        let mut bytes = wal.bytes().to_vec();
        let at = back_by(n, 120, SEGMENT);
        let checkpoint = checkpoint_record(Lsn(0), at);
        let end = record_end(at, checkpoint.len(), SEGMENT);
        assert_eq!(next_record_start(end, SEGMENT), n, "{start} {filler}");
        let writes = place_record(at, &checkpoint, SEGMENT, header_in(wal.bytes(), start)).unwrap();
        apply(&mut bytes, start, &writes);
        let i = original.iter().position(|r| r.start == n).unwrap();
        let relinked = with_prev(&original[i].bytes, at);
        let writes = place_record(n, &relinked, SEGMENT, header_in(&bytes.clone(), start)).unwrap();
        apply(&mut bytes, start, &writes);
        let (after, _) = decode_from(&bytes, start, at);
        assert_eq!(after.len(), 1 + original.len() - i, "{start} {filler}");
        assert_eq!((after[0].start, &after[0].bytes), (at, &checkpoint));
        assert_eq!(after[1].header.prev, at);
        assert_eq!(after[1].bytes[24..], original[i].bytes[24..]);
        for (a, b) in after[2..].iter().zip(&original[i + 1..]) {
            assert_eq!((a.start, &a.bytes), (b.start, &b.bytes));
        }
    }
}

#[test]
fn records_put_past_the_end_of_wal_cut_there_are_read_after_it() {
    for (start, filler) in placements() {
        let (wal, n) = wal(start, filler);
        let original = decode_from(wal.bytes(), start, wal.start()).0;
        let i = original.iter().position(|r| r.start == n).unwrap();
        // Cut before the big record: zeros from its start on.
        let mut bytes = wal.bytes().to_vec();
        let cut = original[i - 1].end_rec_ptr();
        bytes[(cut.0 - start) as usize..].fill(0);
        let template =
            PageHeader::decode(wal.bytes(), wal.start(), SEGMENT, crate::XLOG_PAGE_MAGIC).unwrap();
        let checkpoint = checkpoint_record(original[i - 1].start, n);
        let noop_at = next_record_start(record_end(n, checkpoint.len(), SEGMENT), SEGMENT);
        let noop = encode_record(n, RM_XLOG_ID, XLOG_NOOP, 0, &[]);
        let snapshot = bytes.clone();
        let header = |page: Lsn| {
            let off = (page.0 - start) as usize;
            Ok(
                PageHeader::decode(&snapshot[off..], page, SEGMENT, crate::XLOG_PAGE_MAGIC)
                    .unwrap_or(template),
            )
        };
        let mut writes = place_record(n, &checkpoint, SEGMENT, header).unwrap();
        writes.extend(place_record(noop_at, &noop, SEGMENT, header).unwrap());
        apply(&mut bytes, start, &writes);
        let (after, _) = decode_from(&bytes, start, wal.start());
        assert_eq!(after.len(), i + 2, "{start} {filler}");
        for (a, b) in after[..i].iter().zip(&original) {
            assert_eq!(a.bytes, b.bytes);
        }
        assert_eq!((after[i].start, &after[i].bytes), (n, &checkpoint));
        assert_eq!((after[i + 1].start, &after[i + 1].bytes), (noop_at, &noop));
    }
}
