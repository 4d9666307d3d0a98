//! [`WalDecoder`]: WAL bytes in, in order and in chunks of any size; whole, checked records out.
//!
//! The decoder walks the bytes as PostgreSQL's reader does. At every page boundary it decodes
//! the page header ([`PageHeader::decode`]: version, address, segment geometry) and checks it
//! against what it is in the middle of: a record that continues must find a page that says so,
//! with the number of bytes still to come; a page that says it was written over a lost
//! continuation (`XLP_FIRST_IS_OVERWRITE_CONTRECORD`) drops the record cut off before it, and
//! decoding goes on with that page's records. Between pages, records start at 8-byte
//! boundaries; each one's header gives its length (at least the header's 24 bytes, at most
//! [`MAX_RECORD_LEN`]), the start of the record before it (`xl_prev`, checked), and a CRC-32C
//! of its bytes (checked once they are all in). After an `XLOG_SWITCH` record the rest of the
//! segment is padding, skipped.
//!
//! Where decoding starts: at a record's start, or at a page boundary. A page there that begins
//! with the continuation of a record begun earlier (as a segment's first page often does) has
//! that continuation skipped.
//!
//! The first thing that does not check is an error, kept: the decoder stops there, and
//! [`WalDecoder::valid_end`] is the end of the last good record (where a reader of files takes
//! the WAL to end). Memory: the bytes fed and not yet decoded, and the record being assembled,
//! which grows only as its bytes arrive, whatever length its header claims, and not past the
//! limit of [`WalDecoder::keeping_records_up_to`] when one is set.

use std::fmt;

use utils::Lsn;

use crate::page::PageHeader;
use crate::record::{RecordHeader, RECORD_HEADER_LEN, RM_XLOG_ID, XLOG_SWITCH};
use crate::{MAX_RECORD_LEN, RECORD_ALIGN, XLOG_BLCKSZ};

/// WAL that does not check, and where.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("WAL at {lsn}: {reason}")]
pub struct WalError {
    pub lsn: Lsn,
    pub reason: String,
}

/// One record, whole and checked.
#[derive(Clone, PartialEq, Eq)]
pub struct DecodedRecord {
    /// The LSN of its first byte.
    pub start: Lsn,
    /// The LSN just past its last byte. PostgreSQL's `EndRecPtr`, the LSN redo stamps on the
    /// pages the record changes, is this aligned: [`DecodedRecord::end_rec_ptr`].
    pub end: Lsn,
    pub header: RecordHeader,
    /// All of it, header included, without the page headers it spanned; its header alone for
    /// a record longer than the decoder keeps ([`WalDecoder::keeping_records_up_to`]).
    pub bytes: Vec<u8>,
}

impl fmt::Debug for DecodedRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "record {}..{} rmgr {} info {:#04x} xid {} len {}",
            self.start,
            self.end,
            self.header.rmid,
            self.header.info,
            self.header.xid,
            self.bytes.len()
        )
    }
}

impl DecodedRecord {
    /// PostgreSQL's `EndRecPtr` for it: its end aligned to 8 bytes, what `XLogInsert` returns
    /// and redo sets as the `pd_lsn` of the pages it changes.
    pub fn end_rec_ptr(&self) -> Lsn {
        Lsn(self.end.0.next_multiple_of(RECORD_ALIGN))
    }
}

enum State {
    /// At a record boundary.
    Between,
    /// In the continuation of a record begun before decoding started.
    SkipContinuation { left: u64 },
    /// Assembling the record that starts at `start`; `total` once its header is in,
    /// `claimed` the total a page's `rem_len` implied before that.
    InRecord {
        start: Lsn,
        /// The header, and the rest if the record is kept whole.
        bytes: Vec<u8>,
        /// Bytes of the record gathered so far.
        gathered: usize,
        /// The CRC-32C of what was gathered after the header.
        body_crc: u32,
        total: Option<u32>,
        claimed: Option<u64>,
    },
    /// After an `XLOG_SWITCH` record: padding up to the segment's end.
    SkipToSegmentEnd,
}

/// See the module documentation.
pub struct WalDecoder {
    segment_size: u32,
    /// Bytes fed and not yet consumed start at `buf[head]`, the LSN `at`.
    buf: Vec<u8>,
    head: usize,
    at: Lsn,
    /// Whether the header of the page `at` is in was consumed (or decoding started mid-page).
    page_header_done: bool,
    /// Whether a page header has been seen yet (the first may begin with a continuation).
    seen_page: bool,
    state: State,
    /// The start of the last record decoded, which the next must name.
    prev: Option<Lsn>,
    valid_end: Lsn,
    tli: Option<u32>,
    system_id: Option<u64>,
    /// The page magic expected: PostgreSQL 15's unless told otherwise.
    magic: u16,
    /// Records longer than this are checked as their bytes stream through, and handed back
    /// with their header alone.
    keep_up_to: usize,
    /// Records of this resource manager are kept whole up to this many bytes instead.
    keep_rmgr: Option<(u8, usize)>,
    error: Option<WalError>,
}

impl WalDecoder {
    /// A decoder whose first byte is at `start`: a record's start, or a page boundary.
    pub fn new(start: Lsn, segment_size: u32) -> WalDecoder {
        WalDecoder {
            segment_size,
            buf: Vec::new(),
            head: 0,
            at: start,
            page_header_done: !start.0.is_multiple_of(XLOG_BLCKSZ as u64),
            seen_page: false,
            state: State::Between,
            prev: None,
            valid_end: start,
            tli: None,
            system_id: None,
            magic: crate::XLOG_PAGE_MAGIC,
            keep_up_to: usize::MAX,
            keep_rmgr: None,
            error: None,
        }
    }

    /// Keeps only records of at most `len` bytes whole: a longer one is checked (length,
    /// CRC-32C) as its bytes pass and handed back with its header alone, so the decoder holds
    /// at most `len` bytes of a record, whatever length a header claims (PostgreSQL allows
    /// records of up to 1020 MiB).
    pub fn keeping_records_up_to(mut self, len: usize) -> WalDecoder {
        self.keep_up_to = len.max(RECORD_HEADER_LEN);
        self
    }

    /// Keeps the records of resource manager `rmid` whole up to `len` bytes, whatever the
    /// limit of [`WalDecoder::keeping_records_up_to`] (a reader of commit times keeps the
    /// transaction records and no others).
    pub fn keeping_records_of(mut self, rmid: u8, len: usize) -> WalDecoder {
        self.keep_rmgr = Some((rmid, len));
        self
    }

    /// Expects pages of `magic` instead of PostgreSQL 15's: for walking the records of another
    /// version whose page and record headers are laid out the same (13 to 16), where only
    /// their boundaries matter, never their contents.
    pub fn expecting_magic(mut self, magic: u16) -> WalDecoder {
        self.magic = magic;
        self
    }

    /// [`WalDecoder::new`], with the start of the record just before `start` known: the first
    /// record's `xl_prev` is checked against it too.
    pub fn with_prev(start: Lsn, prev: Lsn, segment_size: u32) -> WalDecoder {
        let mut decoder = WalDecoder::new(start, segment_size);
        decoder.prev = Some(prev);
        decoder
    }

    /// Appends the WAL bytes that follow those fed so far.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.head > 0 && self.head >= self.buf.len() / 2 {
            self.buf.drain(..self.head);
            self.head = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The LSN just past the last byte fed.
    pub fn fed_end(&self) -> Lsn {
        Lsn(self.at.0 + (self.buf.len() - self.head) as u64)
    }

    /// The end of the last whole, checked record (or where decoding started, past a page
    /// header and a continuation, before the first).
    pub fn valid_end(&self) -> Lsn {
        self.valid_end
    }

    /// The start of the last record decoded.
    pub fn last_record_start(&self) -> Option<Lsn> {
        self.prev
    }

    /// The timeline of the last page header decoded.
    pub fn timeline(&self) -> Option<u32> {
        self.tli
    }

    /// The system identifier of the last long page header decoded.
    pub fn system_id(&self) -> Option<u64> {
        self.system_id
    }

    /// The next record, `Ok(None)` when more bytes are needed first, or the first thing that
    /// does not check (again on every later call).
    pub fn next_record(&mut self) -> Result<Option<DecodedRecord>, WalError> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        let result = self.decode();
        if let Err(e) = &result {
            self.error = Some(e.clone());
        }
        result
    }

    fn available(&self) -> usize {
        self.buf.len() - self.head
    }

    /// Consumes `n` available bytes.
    fn take(&mut self, n: usize) -> &[u8] {
        let from = self.head;
        self.head += n;
        self.at = Lsn(self.at.0 + n as u64);
        if n > 0 && self.at.0.is_multiple_of(XLOG_BLCKSZ as u64) {
            // On to the next page, whose header comes first.
            self.page_header_done = false;
        }
        &self.buf[from..from + n]
    }

    /// Bytes left on the current page.
    fn page_left(&self) -> usize {
        XLOG_BLCKSZ - (self.at.0 % XLOG_BLCKSZ as u64) as usize
    }

    fn decode(&mut self) -> Result<Option<DecodedRecord>, WalError> {
        loop {
            if self.at.0.is_multiple_of(XLOG_BLCKSZ as u64) && !self.page_header_done {
                if matches!(self.state, State::SkipToSegmentEnd)
                    && self.at.0.is_multiple_of(u64::from(self.segment_size))
                {
                    self.state = State::Between;
                }
                if matches!(self.state, State::SkipToSegmentEnd) {
                    // Padding pages after a switch: not read.
                    let n = self.page_left().min(self.available());
                    if n == 0 {
                        return Ok(None);
                    }
                    self.take(n);
                    continue;
                }
                if !self.page_header()? {
                    return Ok(None);
                }
                continue;
            }
            let page_left = self.page_left();
            let available = self.available();
            match &mut self.state {
                State::SkipToSegmentEnd => {
                    let n = page_left.min(available);
                    if n == 0 {
                        return Ok(None);
                    }
                    self.take(n);
                }
                State::SkipContinuation { left } => {
                    let n = ((*left).min(page_left as u64) as usize).min(available);
                    if n == 0 && *left > 0 {
                        return Ok(None);
                    }
                    *left -= n as u64;
                    let done = *left == 0;
                    self.take(n);
                    if done {
                        self.state = State::Between;
                        let aligned = self.at.0.next_multiple_of(RECORD_ALIGN);
                        self.valid_end = Lsn(aligned);
                    }
                }
                State::Between => {
                    let aligned = self.at.0.next_multiple_of(RECORD_ALIGN);
                    let pad = (aligned - self.at.0) as usize;
                    if pad > 0 {
                        if self.available() < pad {
                            return Ok(None);
                        }
                        self.take(pad);
                        continue;
                    }
                    if self.at.0.is_multiple_of(XLOG_BLCKSZ as u64) && !self.page_header_done {
                        continue;
                    }
                    self.state = State::InRecord {
                        start: self.at,
                        bytes: Vec::new(),
                        gathered: 0,
                        body_crc: 0,
                        total: None,
                        claimed: None,
                    };
                }
                State::InRecord { .. } => {
                    if let Some(record) = self.gather()? {
                        return Ok(Some(record));
                    }
                    if self.available() == 0 {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// Decodes and checks the header of the page at `at`; `false` if its bytes are not all in.
    fn page_header(&mut self) -> Result<bool, WalError> {
        let page_lsn = self.at;
        let need = if page_lsn.0.is_multiple_of(u64::from(self.segment_size)) {
            crate::page::LONG_HEADER_LEN
        } else {
            crate::page::SHORT_HEADER_LEN
        };
        if self.available() < need {
            return Ok(false);
        }
        let header = PageHeader::decode(
            &self.buf[self.head..self.head + need],
            page_lsn,
            self.segment_size,
            self.magic,
        )
        .or_else(|reason| invalid(page_lsn, reason))?;
        if let Some(tli) = self.tli {
            if header.tli < tli {
                return invalid(
                    page_lsn,
                    format!(
                        "the page is of timeline {}, after timeline {tli}",
                        header.tli
                    ),
                );
            }
        }
        if let (Some(long), Some(system_id)) = (header.long, self.system_id) {
            if long.system_id != system_id {
                return invalid(
                    page_lsn,
                    format!(
                        "the segment is of database system {}, not {system_id}",
                        long.system_id
                    ),
                );
            }
        }
        let first = !self.seen_page;
        match &mut self.state {
            State::InRecord {
                start,
                gathered,
                total,
                claimed,
                ..
            } => {
                if header.overwrites_contrecord() {
                    // The rest of the record was lost, and new WAL begins here.
                    self.state = State::Between;
                } else if !header.continues_record() {
                    return invalid(
                        page_lsn,
                        format!(
                            "the record at {start} goes on here, but the page does not continue it"
                        ),
                    );
                } else {
                    let rem = u64::from(header.rem_len);
                    let gathered = *gathered as u64;
                    match total {
                        Some(total) if u64::from(*total) - gathered != rem => {
                            let left = u64::from(*total) - gathered;
                            return invalid(
                                page_lsn,
                                format!(
                                    "the page continues a record with {rem} bytes, but the record at {start} has {left} left"
                                ),
                            );
                        }
                        Some(_) => {}
                        None => *claimed = Some(gathered + rem),
                    }
                }
            }
            State::SkipContinuation { left } => {
                if header.overwrites_contrecord() {
                    self.state = State::Between;
                } else if !header.continues_record() || u64::from(header.rem_len) != *left {
                    return invalid(
                        page_lsn,
                        "the page does not continue the record begun before decoding started",
                    );
                }
            }
            State::Between => {
                if header.continues_record() {
                    if !first {
                        return invalid(
                            page_lsn,
                            "the page continues a record, but the one before it ended on the page before",
                        );
                    }
                    if header.rem_len > 0 {
                        self.state = State::SkipContinuation {
                            left: u64::from(header.rem_len),
                        };
                    }
                }
            }
            State::SkipToSegmentEnd => unreachable!("padding pages are not decoded"),
        }
        self.seen_page = true;
        self.tli = Some(header.tli);
        if let Some(long) = header.long {
            self.system_id = Some(long.system_id);
        }
        self.take(need);
        self.page_header_done = true;
        if first && self.valid_end.0 < self.at.0 {
            // Nothing before the first page's header (and continuation) is ours to check.
            self.valid_end = self.at;
        }
        Ok(true)
    }

    /// Adds what is available of the record being assembled (up to the page's end); the
    /// record once it is whole and checked.
    fn gather(&mut self) -> Result<Option<DecodedRecord>, WalError> {
        let page_left = self.page_left();
        let available = self.available();
        let (keep_up_to, keep_rmgr) = (self.keep_up_to, self.keep_rmgr);
        let State::InRecord {
            start,
            bytes,
            gathered,
            body_crc,
            total,
            ..
        } = &mut self.state
        else {
            unreachable!("gather is called in a record");
        };
        let start = *start;
        let want = total.map_or(RECORD_HEADER_LEN, |t| t as usize);
        let n = (want - *gathered).min(page_left).min(available);
        let mut chunk = &self.buf[self.head..self.head + n];
        if *gathered < RECORD_HEADER_LEN {
            let header_part = (RECORD_HEADER_LEN - *gathered).min(chunk.len());
            bytes.extend_from_slice(&chunk[..header_part]);
            chunk = &chunk[header_part..];
        }
        *body_crc = utils::crc32c::crc32c_append(*body_crc, chunk);
        // The header is whole once the total is known: its resource manager is at 17.
        let limit = match keep_rmgr {
            Some((rmid, len)) if bytes.get(17) == Some(&rmid) => len.max(keep_up_to),
            _ => keep_up_to,
        };
        if total.is_some_and(|t| t as usize <= limit) {
            bytes.extend_from_slice(chunk);
        }
        *gathered += n;
        self.take(n);
        let prev = self.prev;
        let State::InRecord {
            bytes,
            gathered,
            total,
            claimed,
            ..
        } = &mut self.state
        else {
            unreachable!("still in the record");
        };
        if total.is_none() && *gathered == RECORD_HEADER_LEN {
            let header = RecordHeader::decode(bytes);
            if let Some(reason) = check_header(&header, *claimed, prev) {
                return invalid(start, reason);
            }
            *total = Some(header.tot_len);
        }
        match *total {
            Some(total) if *gathered == total as usize => {}
            _ => return Ok(None),
        }
        let State::InRecord {
            bytes, body_crc, ..
        } = std::mem::replace(&mut self.state, State::Between)
        else {
            unreachable!("still in the record");
        };
        let header = RecordHeader::decode(&bytes);
        let crc = utils::crc32c::crc32c_append(body_crc, &bytes[..crate::record::CRC_OFFSET]);
        if crc != header.crc {
            return invalid(
                start,
                format!(
                    "the record's CRC-32C is {:#010x}, its bytes give {crc:#010x} (a torn or damaged record)",
                    header.crc
                ),
            );
        }
        let end = self.at;
        self.prev = Some(start);
        self.valid_end = end;
        if header.rmid == RM_XLOG_ID && header.info & 0xF0 == XLOG_SWITCH {
            self.state = State::SkipToSegmentEnd;
        }
        Ok(Some(DecodedRecord {
            start,
            end,
            header,
            bytes,
        }))
    }
}

/// What is wrong with a record's header, if anything: its length, and the record it names as
/// the one before it.
fn check_header(header: &RecordHeader, claimed: Option<u64>, prev: Option<Lsn>) -> Option<String> {
    if header.tot_len == 0 {
        return Some("no record here: zeros (the end of the WAL written)".to_owned());
    }
    if (header.tot_len as usize) < RECORD_HEADER_LEN || header.tot_len > MAX_RECORD_LEN {
        return Some(format!(
            "a record of {} bytes: not a record length",
            header.tot_len
        ));
    }
    if header.rmid > crate::record::RM_MAX_BUILTIN_ID
        && header.rmid < crate::record::RM_MIN_CUSTOM_ID
    {
        return Some(format!("resource manager {} does not exist", header.rmid));
    }
    if let Some(claimed) = claimed {
        if claimed != u64::from(header.tot_len) {
            return Some(format!(
                "the record says it is {} bytes, the page after its start {claimed}",
                header.tot_len
            ));
        }
    }
    match prev {
        Some(prev) if header.prev != prev => Some(format!(
            "the record names {} as the one before it, not {prev}",
            header.prev
        )),
        _ => None,
    }
}

fn invalid<T>(lsn: Lsn, reason: impl Into<String>) -> Result<T, WalError> {
    Err(WalError {
        lsn,
        reason: reason.into(),
    })
}
