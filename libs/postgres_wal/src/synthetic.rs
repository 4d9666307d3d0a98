//! WAL written the way PostgreSQL lays records over pages, for tests of everything that reads
//! it, and for the one record the page server writes itself (the shutdown checkpoint a restore
//! without replay starts from): page headers at every page boundary (the long one at a segment's start), records at
//! 8-byte boundaries that run across pages and segments with their continuation counted in
//! the next page's header, each naming the one before it, with its CRC-32C.

use utils::Lsn;

use crate::page::{LONG_HEADER_LEN, SHORT_HEADER_LEN, XLP_FIRST_IS_CONTRECORD, XLP_LONG_HEADER};
use crate::record::{RM_XACT_ID, RM_XLOG_ID, XLOG_SWITCH};
use crate::{RECORD_ALIGN, XLOG_BLCKSZ, XLOG_PAGE_MAGIC};

/// Builds a stretch of WAL from a page boundary on.
pub struct WalBuilder {
    segment_size: u32,
    tli: u32,
    system_id: u64,
    start: Lsn,
    bytes: Vec<u8>,
    prev: Lsn,
}

impl WalBuilder {
    /// WAL from `start`, a page boundary, of timeline 1 of system 42.
    pub fn new(start: Lsn, segment_size: u32) -> WalBuilder {
        assert!(
            start.0.is_multiple_of(XLOG_BLCKSZ as u64),
            "WAL is built from a page boundary"
        );
        WalBuilder {
            segment_size,
            tli: 1,
            system_id: 42,
            start,
            bytes: Vec::new(),
            prev: Lsn(0),
        }
    }

    /// The WAL from the start is `bytes` already (page headers and all, as stored): the next
    /// record goes after them, naming `prev` as the one before it.
    pub fn resume(mut self, bytes: Vec<u8>, prev: Lsn) -> WalBuilder {
        self.bytes = bytes;
        self.prev = prev;
        self
    }

    pub fn timeline(mut self, tli: u32) -> WalBuilder {
        self.tli = tli;
        self
    }

    pub fn system_id(mut self, system_id: u64) -> WalBuilder {
        self.system_id = system_id;
        self
    }

    /// Where the WAL starts.
    pub fn start(&self) -> Lsn {
        self.start
    }

    /// Just past its last byte.
    pub fn end(&self) -> Lsn {
        Lsn(self.start.0 + self.bytes.len() as u64)
    }

    /// The bytes from [`WalBuilder::start`] to [`WalBuilder::end`].
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The bytes, zero-filled to the end of the segment they end in (as a segment file is).
    pub fn segment_file(&self) -> Vec<u8> {
        let mut file = self.bytes.clone();
        let end = self.end().0.next_multiple_of(u64::from(self.segment_size));
        file.resize((end - self.start.0) as usize, 0);
        file
    }

    /// Where the next record will start: the end aligned, past a page header at a page's start.
    pub fn next_record_start(&self) -> Lsn {
        let aligned = self.end().0.next_multiple_of(RECORD_ALIGN);
        let header = if !aligned.is_multiple_of(XLOG_BLCKSZ as u64) {
            0
        } else if aligned.is_multiple_of(u64::from(self.segment_size)) {
            LONG_HEADER_LEN
        } else {
            SHORT_HEADER_LEN
        };
        Lsn(aligned + header as u64)
    }

    /// `len` bytes continuing a record begun before the start (only first).
    pub fn continuation(&mut self, len: usize) {
        assert!(self.bytes.is_empty(), "a continuation comes first");
        self.put(&vec![0xcc; len], true);
    }

    /// Appends a record of resource manager `rmid`, with `info` and `xid`, whose bytes after
    /// the header are `parts`; returns its start.
    pub fn record(&mut self, rmid: u8, info: u8, xid: u32, parts: &[u8]) -> Lsn {
        let aligned = self.end().0.next_multiple_of(RECORD_ALIGN);
        self.bytes.resize((aligned - self.start.0) as usize, 0);
        if self.end().0.is_multiple_of(XLOG_BLCKSZ as u64) {
            self.page_header(0);
        }
        let start = self.end();
        let record = crate::edit::encode_record(self.prev, rmid, info, xid, parts);
        self.put(&record, false);
        self.prev = start;
        start
    }

    /// A record with main data only.
    pub fn main_data_record(&mut self, rmid: u8, info: u8, xid: u32, main: &[u8]) -> Lsn {
        self.record(rmid, info, xid, &main_data_parts(main))
    }

    /// A commit of `xid` at `time` (microseconds since 2000-01-01 UTC), with nothing else.
    pub fn commit(&mut self, xid: u32, time: i64) -> Lsn {
        self.main_data_record(RM_XACT_ID, 0x00, xid, &time.to_le_bytes())
    }

    /// An `XLOG_SWITCH` record, and the rest of its segment as padding pages.
    pub fn switch(&mut self) -> Lsn {
        let start = self.record(RM_XLOG_ID, XLOG_SWITCH, 0, &[]);
        let segment_end = self.end().0.next_multiple_of(u64::from(self.segment_size));
        while self.end().0 < segment_end {
            if self.end().0.is_multiple_of(XLOG_BLCKSZ as u64) {
                self.page_header(0);
            }
            let page_end = self.end().0.next_multiple_of(XLOG_BLCKSZ as u64);
            self.bytes.resize((page_end - self.start.0) as usize, 0);
        }
        start
    }

    /// Writes `record` from the current end, with a page header at every page boundary; a
    /// `continuation` began before the first page.
    fn put(&mut self, record: &[u8], continuation: bool) {
        let mut done = 0;
        while done < record.len() {
            if self.end().0.is_multiple_of(XLOG_BLCKSZ as u64) {
                // Bytes of this record still to come, if it began on an earlier page.
                let rem = if done > 0 || continuation {
                    record.len() - done
                } else {
                    0
                };
                self.page_header(rem);
            }
            let page_left = XLOG_BLCKSZ - (self.end().0 % XLOG_BLCKSZ as u64) as usize;
            let n = (record.len() - done).min(page_left);
            self.bytes.extend_from_slice(&record[done..done + n]);
            done += n;
        }
    }

    fn page_header(&mut self, rem_len: usize) {
        let at = self.end();
        let long = at.0.is_multiple_of(u64::from(self.segment_size));
        let mut info = if rem_len > 0 {
            XLP_FIRST_IS_CONTRECORD
        } else {
            0
        };
        if long {
            info |= XLP_LONG_HEADER;
        }
        self.bytes.extend_from_slice(&XLOG_PAGE_MAGIC.to_le_bytes());
        self.bytes.extend_from_slice(&info.to_le_bytes());
        self.bytes.extend_from_slice(&self.tli.to_le_bytes());
        self.bytes.extend_from_slice(&at.0.to_le_bytes());
        self.bytes
            .extend_from_slice(&(rem_len as u32).to_le_bytes());
        self.bytes.extend_from_slice(&[0; 4]);
        if long {
            self.bytes.extend_from_slice(&self.system_id.to_le_bytes());
            self.bytes
                .extend_from_slice(&self.segment_size.to_le_bytes());
            self.bytes
                .extend_from_slice(&(XLOG_BLCKSZ as u32).to_le_bytes());
        }
        debug_assert_eq!(
            self.end().0 - at.0,
            if long {
                LONG_HEADER_LEN
            } else {
                SHORT_HEADER_LEN
            } as u64
        );
    }
}

pub use crate::edit::main_data_parts;
