//! The header at the start of every WAL page.
//!
//! ```text
//!  short header, 24 bytes:  u16 magic | u16 info | u32 tli | u64 pageaddr | u32 rem_len | 4 pad
//!  long header, 40 bytes (a segment's first page): the short one, then
//!                           u64 system identifier | u32 segment size | u32 XLOG_BLCKSZ
//! ```
//!
//! `pageaddr` is the LSN of the page's first byte: a page whose address is not its own is
//! left from an earlier use of a recycled file. `rem_len` is how many bytes of a record begun
//! on an earlier page continue on this one (`XLP_FIRST_IS_CONTRECORD`).

use utils::Lsn;

use crate::{u16_at, u32_at, u64_at, XLOG_BLCKSZ, XLOG_PAGE_MAGIC};

pub const SHORT_HEADER_LEN: usize = 24;
pub const LONG_HEADER_LEN: usize = 40;

/// `xlp_info`: the page begins with the continuation of a record.
pub const XLP_FIRST_IS_CONTRECORD: u16 = 0x0001;
/// `xlp_info`: the long header (a segment's first page).
pub const XLP_LONG_HEADER: u16 = 0x0002;
/// `xlp_info`: the page may be removed by an archiver (set by a backup's end).
pub const XLP_BKP_REMOVABLE: u16 = 0x0004;
/// `xlp_info`: the continuation of a record was lost, and WAL was written over it from here.
pub const XLP_FIRST_IS_OVERWRITE_CONTRECORD: u16 = 0x0008;
const XLP_ALL_FLAGS: u16 = 0x000F;

/// Where the `len` bytes of a record that starts at `start` lie in the WAL: the pieces
/// (LSN, length) between the page headers they continue after, in order. A piece never
/// crosses a page, so never a segment either.
pub fn record_pieces(start: Lsn, len: usize, segment_size: u32) -> Vec<(Lsn, usize)> {
    let mut pieces = Vec::new();
    let (mut at, mut left) = (start.0, len);
    while left > 0 {
        if at.is_multiple_of(XLOG_BLCKSZ as u64) {
            at += if at.is_multiple_of(u64::from(segment_size)) {
                LONG_HEADER_LEN
            } else {
                SHORT_HEADER_LEN
            } as u64;
        }
        let n = left.min(XLOG_BLCKSZ - (at % XLOG_BLCKSZ as u64) as usize);
        pieces.push((Lsn(at), n));
        at += n as u64;
        left -= n;
    }
    pieces
}

/// A page header, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageHeader {
    pub magic: u16,
    pub info: u16,
    pub tli: u32,
    pub pageaddr: Lsn,
    pub rem_len: u32,
    /// Only on a segment's first page.
    pub long: Option<LongHeader>,
}

/// What only a segment's first page says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LongHeader {
    pub system_id: u64,
    pub segment_size: u32,
    pub xlog_blcksz: u32,
}

impl PageHeader {
    /// Its length: 40 bytes with the long header, 24 without.
    pub fn header_len(&self) -> usize {
        if self.long.is_some() {
            LONG_HEADER_LEN
        } else {
            SHORT_HEADER_LEN
        }
    }

    /// Decodes the header of the page at `lsn` from `bytes` (at least
    /// [`LONG_HEADER_LEN`] bytes for a segment's first page, [`SHORT_HEADER_LEN`] else) and
    /// checks it: the `magic` expected ([`XLOG_PAGE_MAGIC`] for PostgreSQL 15), known flags,
    /// the page's own address, the long header exactly on a segment's first page, with this
    /// segment size and page size.
    pub fn decode(
        bytes: &[u8],
        lsn: Lsn,
        segment_size: u32,
        expected_magic: u16,
    ) -> Result<PageHeader, String> {
        let first_of_segment = lsn.0.is_multiple_of(u64::from(segment_size));
        let need = if first_of_segment {
            LONG_HEADER_LEN
        } else {
            SHORT_HEADER_LEN
        };
        if bytes.len() < need {
            return Err(format!(
                "a page header is {need} bytes, {} given",
                bytes.len()
            ));
        }
        let magic = u16_at(bytes, 0);
        if magic != expected_magic {
            let expected = if expected_magic == XLOG_PAGE_MAGIC {
                format!("PostgreSQL 15's {XLOG_PAGE_MAGIC:#06x}")
            } else {
                format!("{expected_magic:#06x}")
            };
            return Err(format!(
                "page magic {magic:#06x}, not {expected}{}",
                if magic == 0 {
                    " (an empty page)"
                } else {
                    " (WAL of another PostgreSQL version, or not WAL)"
                }
            ));
        }
        let info = u16_at(bytes, 2);
        if info & !XLP_ALL_FLAGS != 0 {
            return Err(format!("unknown page flags {info:#06x}"));
        }
        let pageaddr = Lsn(u64_at(bytes, 8));
        if pageaddr != lsn {
            return Err(format!(
                "the page at {lsn} says it is the page at {pageaddr} (a recycled segment file, or WAL from elsewhere)"
            ));
        }
        let has_long = info & XLP_LONG_HEADER != 0;
        if has_long != first_of_segment {
            return Err(if has_long {
                "a long page header on a page that does not start a segment".to_owned()
            } else {
                "the first page of a segment without the long header".to_owned()
            });
        }
        let long = if has_long {
            let long = LongHeader {
                system_id: u64_at(bytes, 24),
                segment_size: u32_at(bytes, 32),
                xlog_blcksz: u32_at(bytes, 36),
            };
            if long.segment_size != segment_size || long.xlog_blcksz as usize != XLOG_BLCKSZ {
                return Err(format!(
                    "segment size {} and page size {}, where {segment_size} and {XLOG_BLCKSZ} are expected",
                    long.segment_size, long.xlog_blcksz
                ));
            }
            Some(long)
        } else {
            None
        };
        let rem_len = u32_at(bytes, 16);
        if info & XLP_FIRST_IS_CONTRECORD == 0 && rem_len != 0 {
            return Err(format!(
                "{rem_len} bytes of continuation on a page that does not continue a record"
            ));
        }
        Ok(PageHeader {
            magic,
            info,
            tli: u32_at(bytes, 4),
            pageaddr,
            rem_len,
            long,
        })
    }

    /// Whether the page begins with the continuation of a record.
    pub fn continues_record(&self) -> bool {
        self.info & XLP_FIRST_IS_CONTRECORD != 0
    }

    /// Whether the page was written over a record whose continuation was lost.
    pub fn overwrites_contrecord(&self) -> bool {
        self.info & XLP_FIRST_IS_OVERWRITE_CONTRECORD != 0
    }
}
