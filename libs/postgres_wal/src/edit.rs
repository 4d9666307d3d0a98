//! Records written into WAL that is already laid over pages: where a record that ends at a
//! given place must start, and the bytes (its pieces, and the page headers it continues
//! after) that put it there.
//!
//! A background snapshot uses this on copies of the WAL, never on the WAL a timeline stores:
//! a checkpoint record put where the replay is to stop, and one put just before a snapshot's
//! first record to replay, so that PostgreSQL starts there (see the pageserver's
//! `datadir/checkpoint_start.rs`).
//!
//! Positions here are record positions: never inside a page header. "Bytes of records"
//! between two of them leave out the page headers between them.

use utils::Lsn;

use crate::page::{
    PageHeader, LONG_HEADER_LEN, SHORT_HEADER_LEN, XLP_FIRST_IS_CONTRECORD, XLP_LONG_HEADER,
};
use crate::record::{record_crc, CRC_OFFSET, RECORD_HEADER_LEN};
use crate::{RECORD_ALIGN, XLOG_BLCKSZ};

/// The length of the header of the page that starts at `page`.
fn header_len(page: u64, segment_size: u32) -> u64 {
    if page.is_multiple_of(u64::from(segment_size)) {
        LONG_HEADER_LEN as u64
    } else {
        SHORT_HEADER_LEN as u64
    }
}

/// Where the next record starts after one that ends at `end`: aligned, and past the header of
/// the page it would start, if it starts one.
pub fn next_record_start(end: Lsn, segment_size: u32) -> Lsn {
    let aligned = end.0.next_multiple_of(RECORD_ALIGN);
    if aligned.is_multiple_of(XLOG_BLCKSZ as u64) {
        Lsn(aligned + header_len(aligned, segment_size))
    } else {
        Lsn(aligned)
    }
}

/// The record position `n` bytes of records before `at` (a record position, or a page's end).
/// One on a page's first byte of records is given past its header, where a record starts.
pub fn back_by(at: Lsn, n: u64, segment_size: u32) -> Lsn {
    let page_len = XLOG_BLCKSZ as u64;
    let (mut at, mut left) = (at.0, n);
    loop {
        // The page `at` is on; a page's start is the end of the page before it.
        let page = if at.is_multiple_of(page_len) {
            assert!(at > 0, "{n} bytes of records before LSN 0");
            at - page_len
        } else {
            at - at % page_len
        };
        let first = page + header_len(page, segment_size);
        let here = at - first;
        if left <= here {
            return Lsn(at - left);
        }
        left -= here;
        assert!(page > 0, "{n} bytes of records reach below LSN 0");
        at = page;
    }
}

/// The bytes of a record with this header and `parts` after it (block references, main
/// data), its CRC made.
pub fn encode_record(prev: Lsn, rmid: u8, info: u8, xid: u32, parts: &[u8]) -> Vec<u8> {
    let tot_len = RECORD_HEADER_LEN + parts.len();
    let mut record = Vec::with_capacity(tot_len);
    record.extend_from_slice(&(tot_len as u32).to_le_bytes());
    record.extend_from_slice(&xid.to_le_bytes());
    record.extend_from_slice(&prev.0.to_le_bytes());
    record.extend_from_slice(&[info, rmid, 0, 0, 0, 0, 0, 0]);
    record.extend_from_slice(parts);
    let crc = record_crc(&record);
    record[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
    record
}

/// The parts of a record that has main data only.
pub fn main_data_parts(main: &[u8]) -> Vec<u8> {
    let mut parts = Vec::with_capacity(main.len() + 5);
    if main.len() < 256 {
        parts.extend_from_slice(&[255, main.len() as u8]);
    } else {
        parts.push(254);
        parts.extend_from_slice(&(main.len() as u32).to_le_bytes());
    }
    parts.extend_from_slice(main);
    parts
}

/// `record` with another previous record named (`xl_prev`), its CRC made again.
pub fn with_prev(record: &[u8], prev: Lsn) -> Vec<u8> {
    let mut record = record.to_vec();
    record[8..16].copy_from_slice(&prev.0.to_le_bytes());
    let crc = record_crc(&record);
    record[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
    record
}

impl PageHeader {
    /// The header's bytes ([`Self::header_len`] of them).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(self.header_len());
        b.extend_from_slice(&self.magic.to_le_bytes());
        b.extend_from_slice(&self.info.to_le_bytes());
        b.extend_from_slice(&self.tli.to_le_bytes());
        b.extend_from_slice(&self.pageaddr.0.to_le_bytes());
        b.extend_from_slice(&self.rem_len.to_le_bytes());
        b.extend_from_slice(&[0; 4]);
        if let Some(long) = self.long {
            b.extend_from_slice(&long.system_id.to_le_bytes());
            b.extend_from_slice(&long.segment_size.to_le_bytes());
            b.extend_from_slice(&long.xlog_blcksz.to_le_bytes());
        }
        b
    }

    /// This header made the one of the page at `page` (a segment's first page has the long
    /// one), with `rem_len` bytes of a record continued on it.
    pub fn moved(&self, page: Lsn, segment_size: u32, rem_len: u32) -> PageHeader {
        let long = page.0.is_multiple_of(u64::from(segment_size));
        let mut info = self.info & !(XLP_FIRST_IS_CONTRECORD | XLP_LONG_HEADER);
        if long {
            info |= XLP_LONG_HEADER;
        }
        if rem_len > 0 {
            info |= XLP_FIRST_IS_CONTRECORD;
        }
        PageHeader {
            info,
            pageaddr: page,
            rem_len,
            long: if long {
                Some(self.long.unwrap_or(crate::page::LongHeader {
                    system_id: 0,
                    segment_size,
                    xlog_blcksz: XLOG_BLCKSZ as u32,
                }))
            } else {
                None
            },
            ..*self
        }
    }
}

/// The writes that put `record` at `at`: its pieces, and the header of every page it
/// continues on (`header_of` gives a page's header as it is, or one to take the magic,
/// timeline and system identifier from when the page holds none: the header written says
/// how much of the record continues there). A record put right after a page's header
/// gets that header written too, saying the page continues no record (whatever it continued
/// is written over; the page may have held no header). Each write lies within one page.
pub fn place_record(
    at: Lsn,
    record: &[u8],
    segment_size: u32,
    mut header_of: impl FnMut(Lsn) -> Result<PageHeader, String>,
) -> Result<Vec<(Lsn, Vec<u8>)>, String> {
    let mut writes = Vec::new();
    let page = at.0 - at.0 % XLOG_BLCKSZ as u64;
    if at.0 - page == header_len(page, segment_size) {
        let header = header_of(Lsn(page))?.moved(Lsn(page), segment_size, 0);
        writes.push((Lsn(page), header.encode()));
    }
    let pieces = crate::page::record_pieces(at, record.len(), segment_size);
    let mut done = 0;
    for (i, (lsn, len)) in pieces.iter().enumerate() {
        if i > 0 {
            let page = Lsn(lsn.0 - lsn.0 % XLOG_BLCKSZ as u64);
            let rem_len = (record.len() - done) as u32;
            let header = header_of(page)?.moved(page, segment_size, rem_len);
            writes.push((page, header.encode()));
        }
        writes.push((*lsn, record[done..done + len].to_vec()));
        done += len;
    }
    Ok(writes)
}

/// Where a record placed at `at` with `len` bytes ends.
pub fn record_end(at: Lsn, len: usize, segment_size: u32) -> Lsn {
    let pieces = crate::page::record_pieces(at, len, segment_size);
    let (lsn, n) = pieces.last().copied().unwrap_or((at, 0));
    Lsn(lsn.0 + n as u64)
}

#[cfg(test)]
mod tests;
