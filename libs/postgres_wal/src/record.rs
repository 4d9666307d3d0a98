//! A record's header, and the parts that follow it.
//!
//! ```text
//!  header, 24 bytes: u32 tot_len | u32 xid | u64 prev | u8 info | u8 rmid | 2 pad | u32 crc
//!  then the headers of its parts, in order:
//!    block reference (id 0..=32): u8 id | u8 fork_flags | u16 data_len
//!        [image: u16 len | u16 hole_offset | u8 bimg_info [u16 hole_len, if compressed with a hole]]
//!        [relation: u32 spc | u32 db | u32 rel, unless SAME_REL]  u32 block
//!    253 origin: u16 | 252 top-level xid: u32
//!    255 main data, short: u8 len | 254 main data, long: u32 len   (the last header)
//!  then the data, in the same order: each block's image, then its data; the main data last.
//! ```
//!
//! The CRC-32C covers the bytes after the header, then the header's first 20 bytes.
//! PostgreSQL 15's image flags: 0x01 has a hole, 0x02 apply at redo, 0x04 pglz, 0x08 lz4,
//! 0x10 zstd (earlier versions numbered them differently).

use crate::{u16_at, u32_at, u64_at, Lsn, BLCKSZ};

pub const RECORD_HEADER_LEN: usize = 24;
/// Where the CRC sits in the header (it covers the bytes before it).
pub const CRC_OFFSET: usize = 20;

/// The resource managers (`rmid`) of PostgreSQL 15 this crate names.
pub const RM_XLOG_ID: u8 = 0;
pub const RM_XACT_ID: u8 = 1;
pub const RM_SMGR_ID: u8 = 2;
pub const RM_DBASE_ID: u8 = 4;
pub const RM_HEAP_ID: u8 = 10;
/// The last built-in resource manager of PostgreSQL 15 (`RM_LOGICALMSG_ID`).
pub const RM_MAX_BUILTIN_ID: u8 = 21;
/// Custom resource managers (extensions) take ids from here.
pub const RM_MIN_CUSTOM_ID: u8 = 128;

/// The names `pg_waldump` gives PostgreSQL 15's resource managers, by id.
const RMGR_NAMES: [&str; 22] = [
    "XLOG",
    "Transaction",
    "Storage",
    "CLOG",
    "Database",
    "Tablespace",
    "MultiXact",
    "RelMap",
    "Standby",
    "Heap2",
    "Heap",
    "Btree",
    "Hash",
    "Gin",
    "Gist",
    "Sequence",
    "SPGist",
    "BRIN",
    "CommitTs",
    "ReplicationOrigin",
    "Generic",
    "LogicalMessage",
];

/// The name of resource manager `rmid`, as `pg_waldump` prints it (`custom###` for an
/// extension's).
pub fn rmgr_name(rmid: u8) -> String {
    match RMGR_NAMES.get(usize::from(rmid)) {
        Some(name) => (*name).to_owned(),
        None => format!("custom{rmid:03}"),
    }
}

/// `RM_XLOG_ID` record kinds (`info & 0xF0`).
pub const XLOG_CHECKPOINT_SHUTDOWN: u8 = 0x00;
pub const XLOG_CHECKPOINT_ONLINE: u8 = 0x10;
pub const XLOG_NOOP: u8 = 0x20;
pub const XLOG_SWITCH: u8 = 0x40;
pub const XLOG_PARAMETER_CHANGE: u8 = 0x60;
pub const XLOG_FPI_FOR_HINT: u8 = 0xA0;
pub const XLOG_FPI: u8 = 0xB0;
pub const XLOG_OVERWRITE_CONTRECORD: u8 = 0xD0;

/// The low bits of `info` belong to the record format, not the resource manager.
pub const XLR_INFO_MASK: u8 = 0x0F;

const XLR_MAX_BLOCK_ID: u8 = 32;
const XLR_BLOCK_ID_DATA_SHORT: u8 = 255;
const XLR_BLOCK_ID_DATA_LONG: u8 = 254;
const XLR_BLOCK_ID_ORIGIN: u8 = 253;
const XLR_BLOCK_ID_TOPLEVEL_XID: u8 = 252;

const BKPBLOCK_FORK_MASK: u8 = 0x0F;
const BKPBLOCK_HAS_IMAGE: u8 = 0x10;
const BKPBLOCK_HAS_DATA: u8 = 0x20;
const BKPBLOCK_WILL_INIT: u8 = 0x40;
const BKPBLOCK_SAME_REL: u8 = 0x80;

pub const BKPIMAGE_HAS_HOLE: u8 = 0x01;
pub const BKPIMAGE_APPLY: u8 = 0x02;
pub const BKPIMAGE_COMPRESS_PGLZ: u8 = 0x04;
pub const BKPIMAGE_COMPRESS_LZ4: u8 = 0x08;
pub const BKPIMAGE_COMPRESS_ZSTD: u8 = 0x10;
const BKPIMAGE_COMPRESSED: u8 =
    BKPIMAGE_COMPRESS_PGLZ | BKPIMAGE_COMPRESS_LZ4 | BKPIMAGE_COMPRESS_ZSTD;

/// A record's fixed header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    pub tot_len: u32,
    pub xid: u32,
    pub prev: Lsn,
    pub info: u8,
    pub rmid: u8,
    pub crc: u32,
}

impl RecordHeader {
    /// The header at the start of `bytes` (at least [`RECORD_HEADER_LEN`] of them).
    pub fn decode(bytes: &[u8]) -> RecordHeader {
        RecordHeader {
            tot_len: u32_at(bytes, 0),
            xid: u32_at(bytes, 4),
            prev: Lsn(u64_at(bytes, 8)),
            info: bytes[16],
            rmid: bytes[17],
            crc: u32_at(bytes, 20),
        }
    }

    /// The resource manager's part of `info`.
    pub fn rm_info(&self) -> u8 {
        self.info & !XLR_INFO_MASK
    }
}

/// The CRC-32C a whole record's header carries: of its bytes after the header, then of the
/// header up to the CRC.
pub fn record_crc(record: &[u8]) -> u32 {
    utils::crc32c::crc32c_append(
        utils::crc32c::crc32c(&record[RECORD_HEADER_LEN..]),
        &record[..CRC_OFFSET],
    )
}

/// The relation a block belongs to (`RelFileNode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RelFileNode {
    pub spcnode: u32,
    pub dbnode: u32,
    pub relnode: u32,
}

/// A full-page image's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockImage {
    /// Bytes of the image as stored (compressed, or the page without its hole).
    pub len: u16,
    pub hole_offset: u16,
    pub hole_len: u16,
    pub bimg_info: u8,
}

impl BlockImage {
    /// Whether redo restores the page from it (not only a consistency check).
    pub fn apply(&self) -> bool {
        self.bimg_info & BKPIMAGE_APPLY != 0
    }

    pub fn is_compressed(&self) -> bool {
        self.bimg_info & BKPIMAGE_COMPRESSED != 0
    }
}

/// One block a record changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockRef {
    pub id: u8,
    pub rel: RelFileNode,
    pub fork: u8,
    pub block: u32,
    pub will_init: bool,
    pub image: Option<BlockImage>,
    /// Where the image's bytes are in the record, and the block's data after them.
    pub image_range: std::ops::Range<usize>,
    pub data_range: std::ops::Range<usize>,
}

/// The parts of a record after its header.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecordParts {
    pub blocks: Vec<BlockRef>,
    pub origin: Option<u16>,
    pub toplevel_xid: Option<u32>,
    /// Where the main data is in the record.
    pub main_data: std::ops::Range<usize>,
}

impl RecordParts {
    /// The bytes of full-page images the record carries (`pg_waldump`'s `tot - rec`).
    pub fn image_bytes(&self) -> usize {
        self.blocks.iter().map(|b| b.image_range.len()).sum()
    }
}

/// Parses the parts of `record` (all of it, header included, as a [`DecodedRecord`] holds
/// it) and checks that they add up to its length.
///
/// [`DecodedRecord`]: crate::DecodedRecord
pub fn parse_parts(record: &[u8]) -> Result<RecordParts, String> {
    let mut parts = RecordParts::default();
    let mut reader = Reader {
        bytes: record,
        pos: RECORD_HEADER_LEN,
    };
    let mut main_len = 0usize;
    // (block index, image length, data length), to lay the data out after the headers.
    let mut lengths = Vec::new();
    let mut last_rel: Option<RelFileNode> = None;
    // Headers go on while more bytes are left than the data they announced (as PostgreSQL's
    // `DecodeXLogRecord` reads them): a record without main data ends with its blocks' data.
    let mut data_total = 0usize;
    while record.len() - reader.pos > data_total {
        let id = reader.u8()?;
        match id {
            XLR_BLOCK_ID_DATA_SHORT => {
                main_len = usize::from(reader.u8()?);
                break;
            }
            XLR_BLOCK_ID_DATA_LONG => {
                main_len = reader.u32()? as usize;
                break;
            }
            XLR_BLOCK_ID_ORIGIN => parts.origin = Some(reader.u16()?),
            XLR_BLOCK_ID_TOPLEVEL_XID => parts.toplevel_xid = Some(reader.u32()?),
            id if id <= XLR_MAX_BLOCK_ID => {
                if parts.blocks.last().is_some_and(|b| b.id >= id) {
                    return Err(format!("block reference {id} out of order"));
                }
                let fork_flags = reader.u8()?;
                let data_len = usize::from(reader.u16()?);
                let has_data = fork_flags & BKPBLOCK_HAS_DATA != 0;
                if has_data != (data_len > 0) {
                    return Err(format!(
                        "block reference {id}: {data_len} bytes of data, flags {fork_flags:#04x}"
                    ));
                }
                let image = if fork_flags & BKPBLOCK_HAS_IMAGE != 0 {
                    let len = reader.u16()?;
                    let hole_offset = reader.u16()?;
                    let bimg_info = reader.u8()?;
                    let compressed = bimg_info & BKPIMAGE_COMPRESSED != 0;
                    let has_hole = bimg_info & BKPIMAGE_HAS_HOLE != 0;
                    let hole_len = if has_hole && compressed {
                        reader.u16()?
                    } else if has_hole {
                        (BLCKSZ as u16).wrapping_sub(len)
                    } else {
                        0
                    };
                    check_image(id, len, hole_offset, hole_len, bimg_info)?;
                    Some(BlockImage {
                        len,
                        hole_offset,
                        hole_len,
                        bimg_info,
                    })
                } else {
                    None
                };
                let rel = if fork_flags & BKPBLOCK_SAME_REL != 0 {
                    last_rel.ok_or_else(|| {
                        format!("block reference {id} is of the same relation as none before it")
                    })?
                } else {
                    RelFileNode {
                        spcnode: reader.u32()?,
                        dbnode: reader.u32()?,
                        relnode: reader.u32()?,
                    }
                };
                last_rel = Some(rel);
                let block = reader.u32()?;
                let image_len = image.map_or(0, |i| usize::from(i.len));
                data_total += image_len + data_len;
                lengths.push((image_len, data_len));
                parts.blocks.push(BlockRef {
                    id,
                    rel,
                    fork: fork_flags & BKPBLOCK_FORK_MASK,
                    block,
                    will_init: fork_flags & BKPBLOCK_WILL_INIT != 0,
                    image,
                    image_range: 0..0,
                    data_range: 0..0,
                });
            }
            other => return Err(format!("unknown block id {other}")),
        }
    }
    let mut at = reader.pos;
    for (block, (image_len, data_len)) in parts.blocks.iter_mut().zip(lengths) {
        block.image_range = at..at + image_len;
        at += image_len;
        block.data_range = at..at + data_len;
        at += data_len;
    }
    parts.main_data = at..at + main_len;
    if parts.main_data.end != record.len() {
        return Err(format!(
            "the parts' headers add up to {} bytes, the record is {}",
            parts.main_data.end,
            record.len()
        ));
    }
    Ok(parts)
}

fn check_image(id: u8, len: u16, hole_offset: u16, hole_len: u16, info: u8) -> Result<(), String> {
    let compressed = info & BKPIMAGE_COMPRESSED != 0;
    let has_hole = info & BKPIMAGE_HAS_HOLE != 0;
    let bad = |what: &str| {
        Err(format!(
            "block reference {id}: image of {len} bytes with a hole of {hole_len} at {hole_offset} (flags {info:#04x}): {what}"
        ))
    };
    if info & !(BKPIMAGE_HAS_HOLE | BKPIMAGE_APPLY | BKPIMAGE_COMPRESSED) != 0 {
        return bad("unknown image flags");
    }
    if (info & BKPIMAGE_COMPRESSED).count_ones() > 1 {
        return bad("more than one compression");
    }
    if has_hole && (hole_offset == 0 || hole_len == 0 || usize::from(hole_len) >= BLCKSZ) {
        return bad("a hole that is not inside the page");
    }
    if !has_hole && (hole_offset != 0 || hole_len != 0) {
        return bad("a hole without the flag");
    }
    if usize::from(hole_offset) + usize::from(hole_len) > BLCKSZ {
        return bad("a hole past the page's end");
    }
    if !compressed && usize::from(len) + usize::from(hole_len) != BLCKSZ {
        return bad("an uncompressed image and its hole are not a page");
    }
    if compressed && usize::from(len) >= BLCKSZ {
        return bad("a compressed image as large as a page");
    }
    Ok(())
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn need(&self, n: usize) -> Result<(), String> {
        if self.pos + n > self.bytes.len() {
            return Err(format!(
                "the parts' headers run past the record's {} bytes",
                self.bytes.len()
            ));
        }
        Ok(())
    }

    fn u8(&mut self) -> Result<u8, String> {
        self.need(1)?;
        self.pos += 1;
        Ok(self.bytes[self.pos - 1])
    }

    fn u16(&mut self) -> Result<u16, String> {
        self.need(2)?;
        self.pos += 2;
        Ok(u16_at(self.bytes, self.pos - 2))
    }

    fn u32(&mut self) -> Result<u32, String> {
        self.need(4)?;
        self.pos += 4;
        Ok(u32_at(self.bytes, self.pos - 4))
    }
}
