//! The end of the WAL in a backup's newest WAL segment: where a cluster restored from the
//! backup stops replaying, and so the LSN the backup's state is at.
//!
//! A `pg_basebackup -X fetch` archive holds the WAL from the backup's start to at least its
//! end in `pg_wal/`. PostgreSQL started on it replays every valid record there, so the state
//! it reaches is the one at the end of the last valid record of the newest segment. This
//! module finds it by walking that segment's records the way PostgreSQL's reader does:
//!
//! ```text
//!  segment = pages of XLOG_BLCKSZ (8192) bytes, each with a header:
//!    u16 magic | u16 info | u32 timeline | u64 pageaddr | u32 rem_len   (24 bytes with padding)
//!    the first page's is the long form: + u64 sysid | u32 seg_size | u32 blcksz (40 bytes)
//!  records follow one another in the bytes after the headers, each 8-byte aligned:
//!    u32 tot_len | u32 xid | u64 prev | u8 info | u8 rmid | 2 pad | u32 crc | data...
//! ```
//!
//! A record counts if every page it touches has a header for its own address, it names the
//! record before it as `prev`, and its CRC-32C (of the data, then of the header up to the CRC)
//! matches. The walk starts after the continuation of a record begun in an earlier segment
//! (`rem_len` of the first page) and stops at the first record that does not count: zeros,
//! a page of an older segment (a recycled file), or a torn write. One exception, as in
//! PostgreSQL: a record whose continuation page is marked as overwriting it
//! (`XLP_FIRST_IS_OVERWRITE_CONTRECORD`: a recovery found it cut off and wrote new WAL from
//! that page on) is skipped, and the walk goes on with that page's first record, which names
//! the last valid record before the skipped one as its `prev`.

use utils::Lsn;

/// Bytes in a WAL page.
const XLOG_BLCKSZ: usize = 8192;
const SHORT_HEADER: usize = 24;
const LONG_HEADER: usize = 40;
const RECORD_HEADER: usize = 24;
/// `xlp_info` bits.
const XLP_FIRST_IS_CONTRECORD: u16 = 0x0001;
const XLP_LONG_HEADER: u16 = 0x0002;
const XLP_FIRST_IS_OVERWRITE_CONTRECORD: u16 = 0x0008;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WalEndError {
    #[error("WAL segment {name}: {reason}")]
    Segment { name: String, reason: String },
}

/// The LSN right after the last valid record of segment `bytes` (named `name`, for errors).
pub fn wal_end(name: &str, bytes: &[u8]) -> Result<Lsn, WalEndError> {
    let fail = |reason: String| WalEndError::Segment {
        name: name.to_string(),
        reason,
    };
    if bytes.len() < XLOG_BLCKSZ || !bytes.len().is_multiple_of(XLOG_BLCKSZ) {
        return Err(fail(format!(
            "{} bytes is not a whole number of {XLOG_BLCKSZ}-byte pages",
            bytes.len()
        )));
    }
    let magic = u16_at(bytes, 0);
    let info = u16_at(bytes, 2);
    if info & XLP_LONG_HEADER == 0 {
        return Err(fail("its first page has no long header".to_string()));
    }
    let seg_size = u32_at(bytes, 32) as usize;
    let blcksz = u32_at(bytes, 36) as usize;
    if blcksz != XLOG_BLCKSZ || seg_size != bytes.len() {
        return Err(fail(format!(
            "page size {blcksz} and segment size {seg_size} do not match a {}-byte file of \
             {XLOG_BLCKSZ}-byte pages",
            bytes.len()
        )));
    }
    let segment = Segment {
        bytes,
        start: u64_at(bytes, 8),
        magic,
    };
    if !segment.start.is_multiple_of(seg_size as u64) {
        return Err(fail(format!(
            "its first page's address {} is not a segment boundary",
            Lsn(segment.start)
        )));
    }
    // The file's name says where it is; a recycled file keeps the header of its older use.
    if let Some((position, _)) = segment_name_order(name.rsplit('/').next().unwrap_or(name)) {
        let per_log = (1u64 << 32) / seg_size as u64;
        let named = ((position >> 32) * per_log + (position & 0xFFFF_FFFF)) * seg_size as u64;
        if named != segment.start {
            return Err(fail(format!(
                "its name is the segment at {} but its pages are of {}: a recycled file (give \
                 the snapshot's LSN with lsn=)",
                Lsn(named),
                Lsn(segment.start)
            )));
        }
    }

    let mut cursor = Cursor {
        segment: &segment,
        pos: LONG_HEADER,
    };
    // A record begun in an earlier segment continues here for rem_len bytes.
    let rem_len = u32_at(bytes, 16) as usize;
    if info & XLP_FIRST_IS_CONTRECORD != 0 && rem_len > 0 && cursor.skip(rem_len).is_none() {
        // The continuation runs past this segment: no record starts in it.
        return Ok(Lsn(segment.start + LONG_HEADER as u64));
    }
    cursor.align();
    let mut end = segment.start + cursor.pos as u64;
    let mut prev: Option<u64> = None;
    while let Some(start) = cursor.record_start() {
        let mut header = [0u8; RECORD_HEADER];
        let mut probe = cursor.clone();
        if probe.read(&mut header).is_none() {
            match probe.overwriting_page() {
                Some(next) => {
                    cursor.pos = next;
                    continue;
                }
                None => break,
            }
        }
        let tot_len = u32_at(&header, 0) as usize;
        // A record longer than what is left of the segment cannot end in it.
        if tot_len < RECORD_HEADER || tot_len > bytes.len() - start {
            break;
        }
        let xl_prev = u64_at(&header, 8);
        if prev.is_some_and(|p| p != xl_prev) {
            break;
        }
        let mut record = vec![0u8; tot_len];
        let mut reader = cursor.clone();
        if reader.read(&mut record).is_none() {
            match reader.overwriting_page() {
                Some(next) => {
                    cursor.pos = next;
                    continue;
                }
                None => break,
            }
        }
        let stored_crc = u32_at(&record, 20);
        let crc = crc32c::crc32c_append(crc32c::crc32c(&record[RECORD_HEADER..]), &record[..20]);
        if crc != stored_crc {
            break;
        }
        prev = Some(segment.start + start as u64);
        end = segment.start + reader.pos as u64;
        cursor = reader;
        cursor.align();
    }
    Ok(Lsn(end))
}

/// `(timeline, segment number)` of a WAL segment file name (24 hex digits), for picking the
/// newest one; `None` for other files of `pg_wal/` (history files, `archive_status`).
pub fn segment_name_order(name: &str) -> Option<(u64, u32)> {
    if name.len() != 24 || !name.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let tli = u32::from_str_radix(&name[0..8], 16).ok()?;
    let log = u64::from_str_radix(&name[8..16], 16).ok()?;
    let seg = u64::from_str_radix(&name[16..24], 16).ok()?;
    // Ordered by position (log, seg) first: a newer timeline's segment at the same position
    // is newer still.
    Some(((log << 32) | seg, tli))
}

struct Segment<'a> {
    bytes: &'a [u8],
    /// The LSN of its first byte.
    start: u64,
    magic: u16,
}

impl Segment<'_> {
    /// Whether page `page` has a valid header for its own address (not a recycled page).
    fn page_valid(&self, page: usize, continuation: bool) -> bool {
        let at = page * XLOG_BLCKSZ;
        if at + SHORT_HEADER > self.bytes.len() {
            return false;
        }
        let info = u16_at(self.bytes, at + 2);
        u16_at(self.bytes, at) == self.magic
            && u64_at(self.bytes, at + 8) == self.start + at as u64
            && (!continuation || info & XLP_FIRST_IS_CONTRECORD != 0)
    }

    /// Whether page `page` has a valid header for its own address that marks it as written
    /// over the continuation of a record cut off before it.
    fn overwrites_contrecord(&self, page: usize) -> bool {
        let at = page * XLOG_BLCKSZ;
        self.page_valid(page, false)
            && u16_at(self.bytes, at + 2)
                & (XLP_FIRST_IS_OVERWRITE_CONTRECORD | XLP_FIRST_IS_CONTRECORD)
                == XLP_FIRST_IS_OVERWRITE_CONTRECORD
    }
}

/// A position in the record bytes of a segment, skipping page headers.
#[derive(Clone)]
struct Cursor<'a> {
    segment: &'a Segment<'a>,
    pos: usize,
}

impl Cursor<'_> {
    /// Moves to the next 8-byte boundary, as records are aligned.
    fn align(&mut self) {
        self.pos = self.pos.next_multiple_of(8);
    }

    /// Where the next record starts (past a page header if at a page boundary), if its page
    /// is valid.
    fn record_start(&mut self) -> Option<usize> {
        if self.pos >= self.segment.bytes.len() {
            return None;
        }
        if self.pos.is_multiple_of(XLOG_BLCKSZ) {
            let page = self.pos / XLOG_BLCKSZ;
            if !self.segment.page_valid(page, false) {
                return None;
            }
            self.pos += if page == 0 { LONG_HEADER } else { SHORT_HEADER };
        } else if !self.segment.page_valid(self.pos / XLOG_BLCKSZ, false) {
            return None;
        }
        Some(self.pos)
    }

    /// After a `read` that stopped at a page boundary: that page's start if it overwrites the
    /// record being read (the walk goes on there).
    fn overwriting_page(&self) -> Option<usize> {
        let page = self.pos / XLOG_BLCKSZ;
        (self.pos.is_multiple_of(XLOG_BLCKSZ)
            && page > 0
            && self.segment.overwrites_contrecord(page))
        .then_some(self.pos)
    }

    /// Copies record bytes into `out`, crossing page headers; `None` if the bytes run past
    /// the segment or into a page that does not continue this record.
    fn read(&mut self, out: &mut [u8]) -> Option<()> {
        let mut done = 0;
        self.consume(out.len(), |chunk| {
            out[done..done + chunk.len()].copy_from_slice(chunk);
            done += chunk.len();
        })
    }

    /// Skips `len` record bytes (a continuation), crossing page headers.
    fn skip(&mut self, len: usize) -> Option<()> {
        self.consume(len, |_| {})
    }

    /// Moves over `len` record bytes, handing them to `sink` page by page.
    fn consume(&mut self, len: usize, mut sink: impl FnMut(&[u8])) -> Option<()> {
        let mut left = len;
        while left > 0 {
            if self.pos.is_multiple_of(XLOG_BLCKSZ) {
                let page = self.pos / XLOG_BLCKSZ;
                if !self.segment.page_valid(page, true) {
                    return None;
                }
                self.pos += SHORT_HEADER;
            }
            let page_end = (self.pos / XLOG_BLCKSZ + 1) * XLOG_BLCKSZ;
            let n = left.min(page_end - self.pos);
            sink(&self.segment.bytes[self.pos..self.pos + n]);
            left -= n;
            self.pos += n;
        }
        Some(())
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}
