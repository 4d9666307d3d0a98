//! The WAL decoder (`postgres_wal`), fed what a primary or a file could hold: never panics,
//! decodes the same records with the same error whatever the chunks the bytes arrive in, hands
//! back only records whose CRC-32C and length check, and their parts never point outside them;
//! their full-page images restore to pages or fail, never read or write out of bounds.
//!
//! The input's first byte picks the chunk size; the rest is WAL from its first page's address
//! with its segment size when its first page has a long header that says both, else from the
//! start of segment 1 of 1 MiB segments.

use postgres_wal::image::restore_page;
use postgres_wal::page::{PageHeader, LONG_HEADER_LEN};
use postgres_wal::record::{parse_parts, RECORD_HEADER_LEN};
use postgres_wal::segment::is_valid_segment_size;
use postgres_wal::xact::xact_end;
use postgres_wal::{DecodedRecord, Lsn, WalDecoder, WalError, XLOG_PAGE_MAGIC};

/// Checks one input; panics where the decoder breaks its contract.
pub fn check(input: &[u8]) {
    let Some((&chunk, wal)) = input.split_first() else {
        return;
    };
    let (start, segment_size) = geometry(wal);
    let whole = decode(wal, start, segment_size, usize::MAX);
    let chunked = decode(wal, start, segment_size, usize::from(chunk) + 1);
    assert_eq!(
        whole, chunked,
        "the records depend on how the bytes were chunked"
    );
    for record in &whole.0 {
        assert_eq!(record.bytes.len(), record.header.tot_len as usize);
        assert!(record.bytes.len() >= RECORD_HEADER_LEN);
        let crc = utils::crc32c::crc32c_append(
            utils::crc32c::crc32c(&record.bytes[RECORD_HEADER_LEN..]),
            &record.bytes[..20],
        );
        assert_eq!(crc, record.header.crc, "a record whose CRC does not check");
        assert!(record.end > record.start);
        if let Ok(parts) = parse_parts(&record.bytes) {
            for block in &parts.blocks {
                assert!(block.image_range.end <= record.bytes.len());
                assert!(block.data_range.end <= record.bytes.len());
                // An image restores to a page or fails, whatever its bytes and compression.
                if let Some(image) = &block.image {
                    let _ = restore_page(image, &record.bytes[block.image_range.clone()]);
                }
            }
            assert_eq!(parts.main_data.end, record.bytes.len());
        }
        let _ = xact_end(record);
    }
}

fn geometry(wal: &[u8]) -> (Lsn, u32) {
    let fallback = (Lsn(1 << 20), 1 << 20);
    if wal.len() < LONG_HEADER_LEN {
        return fallback;
    }
    let start = Lsn(u64::from_le_bytes(wal[8..16].try_into().expect("8 bytes")));
    let size = u32::from_le_bytes(wal[32..36].try_into().expect("4 bytes"));
    if !is_valid_segment_size(size) || !start.0.is_multiple_of(u64::from(size)) {
        return fallback;
    }
    match PageHeader::decode(wal, start, size, XLOG_PAGE_MAGIC) {
        Ok(_) => (start, size),
        Err(_) => fallback,
    }
}

fn decode(
    wal: &[u8],
    start: Lsn,
    segment_size: u32,
    chunk: usize,
) -> (Vec<DecodedRecord>, Option<WalError>, Lsn) {
    let mut decoder = WalDecoder::new(start, segment_size);
    let mut records = Vec::new();
    for piece in wal.chunks(chunk.min(wal.len()).max(1)) {
        decoder.feed(piece);
        loop {
            match decoder.next_record() {
                Ok(Some(record)) => records.push(record),
                Ok(None) => break,
                Err(e) => return (records, Some(e), decoder.valid_end()),
            }
        }
    }
    (records, None, decoder.valid_end())
}
