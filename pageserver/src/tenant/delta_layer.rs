//! Delta layer files: an immutable, sorted run of page versions for a key range and an LSN range.
//!
//! # File layout
//!
//! ```text
//! block 0                 summary (below)
//! blocks 1 ..             values: blobs (blob_io format) back to back from byte 8192,
//!                         each the serialized Value of one (key, lsn) followed by the
//!                         CRC-32C of those bytes (4 bytes, big-endian)
//! blocks index_start ..   B-tree index (disk_btree), block numbers relative to index_start:
//!                         key ++ big-endian lsn (26 bytes) -> blob offset << 1 | will_init
//! ```
//!
//! Summary (block 0, big-endian, the rest of the block zero):
//!
//! ```text
//! offset size field
//!      0    4 magic              0x44454C54 ("DELT")
//!      4    2 format version     1
//!      6    2 reserved           0
//!      8   16 tenant id
//!     24   16 timeline id
//!     40   18 key start          first key in the file
//!     58   18 key end            exclusive: the key after the last one in the file
//!     76    8 lsn start          inclusive
//!     84    8 lsn end            exclusive
//!     92    4 index start block
//!     96    4 index root block   relative to index start
//!    100    4 reserved           0
//!    104    8 entry count
//!    112    8 values end         byte offset just past the last value blob
//!    120    4 CRC-32C of bytes 0..120
//! ```
//!
//! # Creation is atomic
//!
//! [`DeltaLayerWriter`] writes to a temporary name (`*.___temp`) in the timeline directory:
//! values first, then the index (built in memory while the values stream out, since a leaf
//! fills up long before the index's place in the file is known), then the summary; then it
//! fsyncs the file, renames it to its final name, and fsyncs the directory. A crash at any
//! point leaves either no layer or a whole one, plus perhaps a temporary file for startup to
//! delete. A writer dropped before `finish` removes its temporary file.
//!
//! # Reading
//!
//! [`DeltaLayer::open`] validates the summary; every later read goes through the page cache for
//! both index and value blocks and reads only the blocks it needs. Nothing read from the file is
//! trusted: a bad magic, version, checksum, range or offset is a [`DeltaLayerError::Corrupt`]
//! naming the file, never a panic or a wrong page.
//!
//! [`DeltaLayer::keys_at_lsn`] lists the keys with a version at or below an LSN, a bounded
//! chunk at a time, from the index alone: the key stream of a paged scan (`tenant::scan`).
//!
//! # Inspection
//!
//! For tools that look inside a file (`pagectl`): [`DeltaLayer::visit_index`] lists the raw
//! index entries without reading values, [`DeltaLayer::read_entry`] reads the value of one entry
//! with the same checks as [`DeltaLayer::get`], and [`DeltaLayer::verify`] reads every index node
//! and every value and checks everything the format promises, reporting the first problem.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use pageserver_api::value::ValueDecodeError;
use pageserver_api::{Key, Value};
use utils::{Lsn, TenantId, TimelineId};

use crate::page_cache::{FileId, PageCache};
use crate::tenant::blob_io::{BlobHeader, BlobReadError, BlockCursor};
use crate::tenant::block_io::{
    read_range_through_cache, BlockLease, BlockReadError, BlockReader, FileBlockReader,
};
use crate::tenant::disk_btree::{
    node_is_valid, BtreeBuildError, BtreeReadError, DiskBtreeBuilder, DiskBtreeReader, VecBlockSink,
};
use crate::tenant::read_cost::BlockKind;
use crate::tenant::storage_layer::{array_at, max_stored_value_len, KeyChunk, LayerRecords};
use crate::virtual_file::{crashsafe, FileIo, VirtualFile};
use crate::PAGE_SZ;

pub const DELTA_MAGIC: u32 = 0x4445_4C54;
pub const DELTA_FORMAT_VERSION: u16 = 1;
/// Suffix of a layer file being written; such a file is never a layer, and startup is to
/// delete it.
pub const TEMP_SUFFIX: &str = ".___temp";

const INDEX_KEY_LEN: usize = 26;
const KEY_LEN: usize = 18;
const WILL_INIT_BIT: u64 = 1;
/// The CRC-32C that follows each stored value.
const VALUE_CRC_LEN: usize = 4;
/// Values are written in chunks of this size rather than one syscall per value.
const WRITE_CHUNK: usize = 1 << 20;
/// [`DeltaLayer::keys_at_lsn`] walks past this many further versions of one key, about a leaf's
/// worth, before it descends the index to the next key instead.
const PASS_OVER_BEFORE_SEEK: usize = crate::tenant::disk_btree::leaf_capacity(INDEX_KEY_LEN);

/// The index key of version `lsn` of `key`: byte order is (key, lsn) order.
fn index_key(key: Key, lsn: Lsn) -> [u8; INDEX_KEY_LEN] {
    let mut out = [0u8; INDEX_KEY_LEN];
    out[..KEY_LEN].copy_from_slice(&key.to_bytes());
    out[KEY_LEN..].copy_from_slice(&lsn.0.to_be_bytes());
    out
}

fn split_index_key(index_key: &[u8; INDEX_KEY_LEN]) -> (Key, Lsn) {
    let mut key = [0u8; KEY_LEN];
    key.copy_from_slice(&index_key[..KEY_LEN]);
    let mut lsn = [0u8; 8];
    lsn.copy_from_slice(&index_key[KEY_LEN..]);
    (Key::from_bytes(key), Lsn(u64::from_be_bytes(lsn)))
}

mod summary_off {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 4;
    pub const TENANT: usize = 8;
    pub const TIMELINE: usize = 24;
    pub const KEY_START: usize = 40;
    pub const KEY_END: usize = 58;
    pub const LSN_START: usize = 76;
    pub const LSN_END: usize = 84;
    pub const INDEX_START: usize = 92;
    pub const INDEX_ROOT: usize = 96;
    pub const ENTRIES: usize = 104;
    pub const VALUES_END: usize = 112;
    pub const CHECKSUM: usize = 120;
    /// Reserved fields, zero; covered by the checksum.
    pub const RESERVED_1: usize = 6;
    pub const RESERVED_2: usize = 100;
    /// Just past the checksum: the rest of block 0 is zero.
    pub const END: usize = 124;
}

/// What block 0 says about the layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub tenant_id: TenantId,
    pub timeline_id: TimelineId,
    pub key_start: Key,
    pub key_end: Key,
    pub lsn_start: Lsn,
    pub lsn_end: Lsn,
    pub index_start_blk: u32,
    pub index_root_blk: u32,
    pub entries: u64,
    pub values_end: u64,
}

impl Summary {
    fn encode(&self) -> Box<[u8; PAGE_SZ]> {
        use summary_off::*;
        let mut b = Box::new([0u8; PAGE_SZ]);
        b[MAGIC..MAGIC + 4].copy_from_slice(&DELTA_MAGIC.to_be_bytes());
        b[VERSION..VERSION + 2].copy_from_slice(&DELTA_FORMAT_VERSION.to_be_bytes());
        b[TENANT..TENANT + 16].copy_from_slice(self.tenant_id.as_bytes());
        b[TIMELINE..TIMELINE + 16].copy_from_slice(self.timeline_id.as_bytes());
        b[KEY_START..KEY_START + KEY_LEN].copy_from_slice(&self.key_start.to_bytes());
        b[KEY_END..KEY_END + KEY_LEN].copy_from_slice(&self.key_end.to_bytes());
        b[LSN_START..LSN_START + 8].copy_from_slice(&self.lsn_start.0.to_be_bytes());
        b[LSN_END..LSN_END + 8].copy_from_slice(&self.lsn_end.0.to_be_bytes());
        b[INDEX_START..INDEX_START + 4].copy_from_slice(&self.index_start_blk.to_be_bytes());
        b[INDEX_ROOT..INDEX_ROOT + 4].copy_from_slice(&self.index_root_blk.to_be_bytes());
        b[ENTRIES..ENTRIES + 8].copy_from_slice(&self.entries.to_be_bytes());
        b[VALUES_END..VALUES_END + 8].copy_from_slice(&self.values_end.to_be_bytes());
        let crc = crc32c::crc32c(&b[..CHECKSUM]);
        b[CHECKSUM..CHECKSUM + 4].copy_from_slice(&crc.to_be_bytes());
        b
    }

    /// Parses and checks block 0 of a file of `file_len` bytes.
    fn decode(b: &[u8; PAGE_SZ], file_len: u64) -> Result<Summary, String> {
        use summary_off::*;
        let u16_at = |o: usize| u16::from_be_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| u64::from_be_bytes(array_at(b, o));
        let id = |o: usize| array_at::<16>(b, o);
        let key = |o: usize| Key::from_bytes(array_at(b, o));
        let magic = u32_at(MAGIC);
        if magic != DELTA_MAGIC {
            return Err(format!(
                "bad magic {magic:#010x}, expected {DELTA_MAGIC:#010x}"
            ));
        }
        let version = u16_at(VERSION);
        if version != DELTA_FORMAT_VERSION {
            return Err(format!("unsupported format version {version}"));
        }
        let stored = u32_at(CHECKSUM);
        let computed = crc32c::crc32c(&b[..CHECKSUM]);
        if stored != computed {
            return Err(format!(
                "summary checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"
            ));
        }
        let s = Summary {
            tenant_id: TenantId::from_bytes(id(TENANT)),
            timeline_id: TimelineId::from_bytes(id(TIMELINE)),
            key_start: key(KEY_START),
            key_end: key(KEY_END),
            lsn_start: Lsn(u64_at(LSN_START)),
            lsn_end: Lsn(u64_at(LSN_END)),
            index_start_blk: u32_at(INDEX_START),
            index_root_blk: u32_at(INDEX_ROOT),
            entries: u64_at(ENTRIES),
            values_end: u64_at(VALUES_END),
        };
        if s.key_start >= s.key_end {
            return Err(format!("empty key range {}..{}", s.key_start, s.key_end));
        }
        if s.lsn_start >= s.lsn_end {
            return Err(format!("empty LSN range {}..{}", s.lsn_start, s.lsn_end));
        }
        let index_start = u64::from(s.index_start_blk) * PAGE_SZ as u64;
        if s.values_end < PAGE_SZ as u64 || s.values_end > index_start {
            return Err(format!(
                "values end at byte {} outside 8192..={index_start}",
                s.values_end
            ));
        }
        // The index is built bottom-up and its root is the last block written: the file ends
        // right after it. A file of any other length is not the file this summary describes
        // (truncated, or with blocks appended).
        let root = u64::from(s.index_start_blk) + u64::from(s.index_root_blk);
        let end = (root + 1) * PAGE_SZ as u64;
        if file_len != end {
            return Err(format!(
                "file is {file_len} bytes, but the index root at block {root} ends it at byte {end}"
            ));
        }
        Ok(s)
    }

    /// The file name that encodes the layer's key and LSN ranges.
    pub fn file_name(&self) -> String {
        format!(
            "{}-{}__{:016X}-{:016X}",
            self.key_start, self.key_end, self.lsn_start.0, self.lsn_end.0
        )
    }
}

/// The LSN range a layer file's name claims, if the name has the layer form: lets startup set
/// aside layers it will delete without reading them. The summary inside stays the authority
/// for every layer that is kept.
pub fn lsn_range_of_file_name(name: &str) -> Option<std::ops::Range<Lsn>> {
    let (_keys, lsns) = name.split_once("__")?;
    let (start, end) = lsns.split_once('-')?;
    let parse = |s: &str| {
        (s.len() == 16)
            .then(|| u64::from_str_radix(s, 16).ok())
            .flatten()
    };
    Some(Lsn(parse(start)?)..Lsn(parse(end)?))
}

/// Whether `name` has the form of a layer file's name: two keys and two LSNs
/// (`<key>-<key>__<lsn>-<lsn>`, as [`Summary::file_name`] writes them). Startup removes such a
/// file when the manifest does not list it, and leaves any other file alone.
pub fn is_layer_file_name(name: &str) -> bool {
    let Some((keys, _)) = name.split_once("__") else {
        return false;
    };
    let keys_parse = keys
        .split_once('-')
        .is_some_and(|(a, b)| a.parse::<Key>().is_ok() && b.parse::<Key>().is_ok());
    keys_parse && lsn_range_of_file_name(name).is_some()
}

#[derive(Debug, thiserror::Error)]
pub enum DeltaLayerError {
    #[error("delta layer {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("delta layer {} is corrupt: {reason}", path.display())]
    Corrupt { path: PathBuf, reason: String },
    #[error("delta layer {}: {message}", path.display())]
    Usage { path: PathBuf, message: String },
}

/// Writes one delta layer file; see the module docs.
pub struct DeltaLayerWriter {
    dir: PathBuf,
    temp_path: PathBuf,
    /// Durable: its descriptor stays open until the writer is dropped.
    file: VirtualFile,
    tenant_id: TenantId,
    timeline_id: TimelineId,
    lsn_start: Lsn,
    lsn_end: Lsn,
    first_key: Option<Key>,
    last_key: Option<Key>,
    /// Byte offset where the next blob goes.
    next_offset: u64,
    /// Blob bytes not yet written, starting at `pending_offset`.
    pending: Vec<u8>,
    pending_offset: u64,
    scratch: Vec<u8>,
    tree: DiskBtreeBuilder<INDEX_KEY_LEN, VecBlockSink>,
    /// CRC-32C of the bytes written from block 1 on, in file order (block 0, the summary,
    /// comes last and is combined in by `finish`).
    crc_after_summary: u32,
    finished: bool,
}

/// What [`DeltaLayerWriter::finish`] made: a durable layer file under its final name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenLayer {
    pub path: PathBuf,
    pub summary: Summary,
    /// The file's length in bytes.
    pub size: u64,
    /// CRC-32C of the whole file, computed from what was written (no read back).
    pub crc32c: u32,
}

impl DeltaLayerWriter {
    pub fn new(
        dir: &Path,
        tenant_id: TenantId,
        timeline_id: TimelineId,
        lsn_start: Lsn,
        lsn_end: Lsn,
    ) -> Result<DeltaLayerWriter, DeltaLayerError> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let serial = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let temp_path = dir.join(format!(
            "delta-{}-{serial}{TEMP_SUFFIX}",
            std::process::id()
        ));
        if lsn_start >= lsn_end {
            return Err(DeltaLayerError::Usage {
                path: temp_path,
                message: format!("empty LSN range {lsn_start}..{lsn_end}"),
            });
        }
        let file =
            VirtualFile::create_durable(&temp_path).map_err(|source| DeltaLayerError::Io {
                path: temp_path.clone(),
                source,
            })?;
        Ok(DeltaLayerWriter {
            dir: dir.to_owned(),
            temp_path,
            file,
            tenant_id,
            timeline_id,
            lsn_start,
            lsn_end,
            first_key: None,
            last_key: None,
            next_offset: PAGE_SZ as u64,
            pending: Vec::with_capacity(WRITE_CHUNK),
            pending_offset: PAGE_SZ as u64,
            scratch: Vec::new(),
            tree: DiskBtreeBuilder::new(VecBlockSink::new()),
            crc_after_summary: 0,
            finished: false,
        })
    }

    fn io_error(&self, source: io::Error) -> DeltaLayerError {
        DeltaLayerError::Io {
            path: self.temp_path.clone(),
            source,
        }
    }

    fn usage(&self, message: String) -> DeltaLayerError {
        DeltaLayerError::Usage {
            path: self.temp_path.clone(),
            message,
        }
    }

    /// Appends version `lsn` of `key`. Calls must come in strictly increasing (key, lsn) order.
    pub fn put_value(&mut self, key: Key, lsn: Lsn, value: &Value) -> Result<(), DeltaLayerError> {
        if lsn < self.lsn_start || lsn >= self.lsn_end {
            return Err(self.usage(format!(
                "LSN {lsn} of key {key} is outside the layer's range {}..{}",
                self.lsn_start, self.lsn_end
            )));
        }
        let index_key = index_key(key, lsn);
        let offset = self.next_offset;
        let will_init = if value.will_init() { WILL_INIT_BIT } else { 0 };
        // The index checks the order; nothing is written before it accepts the key.
        self.tree
            .append(&index_key, (offset << 1) | will_init)
            .map_err(|e: BtreeBuildError| self.usage(format!("key {key} at {lsn}: {e}")))?;

        self.scratch.clear();
        value
            .serialize_into(&mut self.scratch)
            .map_err(|e| self.usage(format!("value of key {key} at {lsn}: {e}")))?;
        let crc = crc32c::crc32c(&self.scratch);
        self.scratch.extend_from_slice(&crc.to_be_bytes());
        let header = BlobHeader::new(self.scratch.len())
            .map_err(|e| self.usage(format!("value of key {key} at {lsn}: {e}")))?;
        self.pending.extend_from_slice(header.as_bytes());
        self.pending.extend_from_slice(&self.scratch);
        self.next_offset += (header.encoded_len() + self.scratch.len()) as u64;
        if self.pending.len() >= WRITE_CHUNK {
            self.flush_pending()?;
        }
        self.first_key.get_or_insert(key);
        self.last_key = Some(key);
        Ok(())
    }

    fn flush_pending(&mut self) -> Result<(), DeltaLayerError> {
        self.file
            .write_all_at(&self.pending, self.pending_offset)
            .map_err(|e| self.io_error(e))?;
        self.crc_after_summary = crc32c::crc32c_append(self.crc_after_summary, &self.pending);
        self.pending_offset += self.pending.len() as u64;
        self.pending.clear();
        Ok(())
    }

    /// Writes the index and summary, makes the file durable under its final name, and returns
    /// what the manifest needs to list it.
    pub fn finish(mut self) -> Result<WrittenLayer, DeltaLayerError> {
        let (Some(first), Some(last)) = (self.first_key, self.last_key) else {
            return Err(self.usage("a delta layer needs at least one value".to_owned()));
        };
        self.flush_pending()?;
        let values_end = self.next_offset;
        let index_start = values_end.div_ceil(PAGE_SZ as u64);
        let index_start_blk = u32::try_from(index_start)
            .map_err(|_| self.usage(format!("values end at byte {values_end}: file too large")))?;
        let tree = std::mem::replace(&mut self.tree, DiskBtreeBuilder::new(VecBlockSink::new()));
        let (info, blocks) = tree
            .finish()
            .map_err(|e| self.usage(format!("index: {e}")))?;
        // The values' last block is padded with zeros (a hole) up to the index.
        let padding = (index_start * PAGE_SZ as u64 - values_end) as usize;
        self.crc_after_summary =
            crc32c::crc32c_append(self.crc_after_summary, &[0u8; PAGE_SZ][..padding]);
        for (i, block) in blocks.blocks().iter().enumerate() {
            let offset = (index_start + i as u64) * PAGE_SZ as u64;
            self.file
                .write_all_at(block, offset)
                .map_err(|e| self.io_error(e))?;
            self.crc_after_summary = crc32c::crc32c_append(self.crc_after_summary, &block[..]);
        }
        let size = (index_start + blocks.blocks().len() as u64) * PAGE_SZ as u64;
        let summary = Summary {
            tenant_id: self.tenant_id,
            timeline_id: self.timeline_id,
            key_start: first,
            key_end: last.next(),
            lsn_start: self.lsn_start,
            lsn_end: self.lsn_end,
            index_start_blk,
            index_root_blk: info.root_blk,
            entries: info.entries,
            values_end,
        };
        let summary_block = summary.encode();
        self.file
            .write_all_at(&summary_block[..], 0)
            .map_err(|e| self.io_error(e))?;
        let crc32c = crc32c::crc32c_combine(
            crc32c::crc32c(&summary_block[..]),
            self.crc_after_summary,
            usize::try_from(size - PAGE_SZ as u64)
                .map_err(|_| self.usage(format!("a file of {size} bytes")))?,
        );
        // Durability: file contents, then the name, then the directory entry.
        self.file.sync_all().map_err(|e| self.io_error(e))?;
        let final_path = self.dir.join(summary.file_name());
        fail::fail_point!("layer-before-rename", |_| Err(
            self.io_error(std::io::Error::other("failpoint layer-before-rename"))
        ));
        std::fs::rename(&self.temp_path, &final_path).map_err(|e| self.io_error(e))?;
        self.finished = true;
        fail::fail_point!("layer-after-rename", |_| Err(
            self.io_error(std::io::Error::other("failpoint layer-after-rename"))
        ));
        crashsafe::fsync_dir(&self.dir).map_err(|source| DeltaLayerError::Io {
            path: self.dir.clone(),
            source,
        })?;
        Ok(WrittenLayer {
            path: final_path,
            summary,
            size,
            crc32c,
        })
    }
}

impl Drop for DeltaLayerWriter {
    fn drop(&mut self) {
        if !self.finished {
            if let Err(e) = std::fs::remove_file(&self.temp_path) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::error!(path = %self.temp_path.display(), "failed to remove unfinished delta layer: {e}");
                }
            }
        }
    }
}

/// One entry of a delta layer's index as stored, for tools that inspect a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    pub key: Key,
    pub lsn: Lsn,
    /// Byte offset of the value's blob (its length header) in the file.
    pub offset: u64,
    /// The entry's `will_init` bit: the value needs no older version.
    pub will_init: bool,
}

impl IndexEntry {
    fn from_stored(index_key: &[u8; INDEX_KEY_LEN], value: u64) -> IndexEntry {
        let (key, lsn) = split_index_key(index_key);
        IndexEntry {
            key,
            lsn,
            offset: value >> 1,
            will_init: value & WILL_INIT_BIT != 0,
        }
    }

    fn stored(&self) -> u64 {
        (self.offset << 1) | if self.will_init { WILL_INIT_BIT } else { 0 }
    }

    /// The length of this entry's serialized value (without its blob header and checksum),
    /// given where the next value's blob starts: the next entry's offset, or the summary's
    /// `values_end` for the last entry. Values lie back to back in index order, so this needs
    /// no read. `None` if no blob fits exactly in between (the file is corrupt).
    pub fn value_len(&self, next_offset: u64) -> Option<u64> {
        let span = usize::try_from(next_offset.checked_sub(self.offset)?).ok()?;
        // The header is 1 or 4 bytes; exactly one choice is consistent with its own length.
        [1, 4].into_iter().find_map(|header_len| {
            let blob_len = span.checked_sub(header_len)?;
            if BlobHeader::new(blob_len).ok()?.encoded_len() != header_len {
                return None;
            }
            u64::try_from(blob_len.checked_sub(VALUE_CRC_LEN)?).ok()
        })
    }
}

/// What [`DeltaLayer::verify`] read in a sound file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Index entries, each with its value.
    pub entries: u64,
    /// Values that are images.
    pub images: u64,
    /// Values that are deltas.
    pub deltas: u64,
    /// Blocks of the index, from its first block to its root.
    pub index_blocks: u64,
    /// Bytes of serialized values, without blob headers and checksums.
    pub value_bytes: u64,
}

/// An open delta layer file.
pub struct DeltaLayer {
    path: PathBuf,
    /// Opened again on use when its descriptor was taken (see `virtual_file`).
    file: VirtualFile,
    file_id: FileId,
    summary: Summary,
    cache: Arc<PageCache>,
    /// The longest value blob (serialized value and its checksum) a read accepts.
    max_blob_len: usize,
    /// The file's size when opened (layer files never change).
    file_size: u64,
}

/// How a read uses the page cache; see `DeltaLayer::with_index`.
#[derive(Clone, Copy)]
enum Access {
    Point,
    Scan,
}

/// Reads the index's blocks, numbered from the index's first block.
struct IndexBlocks<'a> {
    inner: FileBlockReader<'a>,
    start: u32,
    path: &'a Path,
}

impl BlockReader for IndexBlocks<'_> {
    fn read_blk(&self, blkno: u32) -> Result<BlockLease<'_>, BlockReadError> {
        let absolute = self
            .start
            .checked_add(blkno)
            .ok_or_else(|| BlockReadError::PastEnd {
                path: self.path.to_owned(),
                blkno,
            })?;
        self.inner.read_blk(absolute)
    }

    fn cached_blocks_verified(&self) -> bool {
        self.inner.cached_blocks_verified()
    }
}

impl DeltaLayer {
    /// Opens and validates a delta layer file. `max_value_size` (the configured limit) bounds
    /// every stored value, so a corrupt length cannot make a read allocate gigabytes.
    pub fn open(
        path: &Path,
        cache: Arc<PageCache>,
        max_value_size: usize,
    ) -> Result<DeltaLayer, DeltaLayerError> {
        let io_err = |source| DeltaLayerError::Io {
            path: path.to_owned(),
            source,
        };
        let file = VirtualFile::open(path).map_err(io_err)?;
        let len = file.metadata().map_err(io_err)?.len();
        if len < PAGE_SZ as u64 {
            return Err(DeltaLayerError::Corrupt {
                path: path.to_owned(),
                reason: format!("file of {len} bytes has no summary block"),
            });
        }
        let mut block = Box::new([0u8; PAGE_SZ]);
        file.read_exact_at(&mut block[..], 0).map_err(io_err)?;
        let summary = Summary::decode(&block, len).map_err(|reason| DeltaLayerError::Corrupt {
            path: path.to_owned(),
            reason,
        })?;
        Ok(DeltaLayer {
            path: path.to_owned(),
            file,
            file_id: FileId::next(),
            summary,
            cache,
            max_blob_len: max_stored_value_len(max_value_size).saturating_add(VALUE_CRC_LEN),
            file_size: len,
        })
    }

    pub fn summary(&self) -> &Summary {
        &self.summary
    }

    /// CRC-32C of the whole file, read straight from the file (not through the page cache: a
    /// bulk read must not push out the hot set).
    pub fn file_crc32c(&self) -> Result<u32, DeltaLayerError> {
        let mut crc = 0;
        let mut buf = vec![0u8; WRITE_CHUNK];
        let mut offset = 0;
        while offset < self.file_size {
            let n = usize::try_from((self.file_size - offset).min(WRITE_CHUNK as u64))
                .expect("at most WRITE_CHUNK");
            self.file
                .read_exact_at(&mut buf[..n], offset)
                .map_err(|source| DeltaLayerError::Io {
                    path: self.path.clone(),
                    source,
                })?;
            crc = crc32c::crc32c_append(crc, &buf[..n]);
            offset += n as u64;
        }
        Ok(crc)
    }

    /// Checks that this is the file its name says, of the timeline it is found in: the name
    /// encodes the summary's key and LSN ranges, and the summary names the tenant and timeline.
    /// A layer copied from elsewhere, or renamed, fails with what differs.
    pub fn check_identity(
        &self,
        tenant_id: TenantId,
        timeline_id: TimelineId,
    ) -> Result<(), DeltaLayerError> {
        let s = &self.summary;
        let name = self.path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name != s.file_name() {
            return Err(self.corrupt(format!(
                "its summary describes layer {}, not the one its name says",
                s.file_name()
            )));
        }
        if (s.tenant_id, s.timeline_id) != (tenant_id, timeline_id) {
            return Err(self.corrupt(format!(
                "it belongs to timeline {} of tenant {}, not timeline {timeline_id} of tenant {tenant_id}",
                s.timeline_id, s.tenant_id
            )));
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's size in bytes.
    pub fn file_size(&self) -> u64 {
        self.file_size
    }

    fn corrupt(&self, reason: impl std::fmt::Display) -> DeltaLayerError {
        DeltaLayerError::Corrupt {
            path: self.path.clone(),
            reason: reason.to_string(),
        }
    }

    fn blocks(&self) -> FileBlockReader<'_> {
        FileBlockReader::new(&self.file, self.file_id, &self.path, &self.cache)
    }

    fn check_offset(&self, key: Key, lsn: Lsn, offset: u64) -> Result<(), DeltaLayerError> {
        if offset < PAGE_SZ as u64 || offset >= self.summary.values_end {
            return Err(self.corrupt(format!(
                "index entry for key {key} at {lsn} points at byte {offset}, outside the values"
            )));
        }
        Ok(())
    }

    fn read_value(
        &self,
        cursor: &BlockCursor<'_, FileBlockReader<'_>>,
        key: Key,
        lsn: Lsn,
        entry: u64,
        buf: &mut Vec<u8>,
    ) -> Result<Value, DeltaLayerError> {
        let offset = entry >> 1;
        self.check_offset(key, lsn, offset)?;
        cursor
            .read_blob_into_buf(offset, buf)
            .map_err(|e: BlobReadError| self.corrupt(e))?;
        self.decode_value(key, lsn, entry, buf)
    }

    /// The value stored at `entry`'s offset, which ends at byte `end` (where the next value
    /// starts, or the end of the values): exactly the blocks it spans are needed, and each run
    /// of them that the page cache lacks is read with one call.
    fn read_value_range(
        &self,
        key: Key,
        lsn: Lsn,
        entry: u64,
        end: u64,
    ) -> Result<Value, DeltaLayerError> {
        let offset = entry >> 1;
        self.check_offset(key, lsn, offset)?;
        // The longest a stored value can be: its blob header, the blob, nothing else.
        let longest = 4 + self.max_blob_len as u64;
        if end <= offset || end > self.summary.values_end || end - offset > longest {
            return Err(self.corrupt(format!(
                "value of key {key} at {lsn} would span bytes {offset}..{end}"
            )));
        }
        let bytes = read_range_through_cache(
            &self.cache,
            &self.file,
            self.file_id,
            &self.path,
            offset..end,
            BlockKind::Value,
        )
        .map_err(|e| self.corrupt(e))?;
        let Some((header_len, blob_len)) = BlobHeader::parse(&bytes) else {
            return Err(self.corrupt(format!(
                "value of key {key} at {lsn}: {} bytes cannot hold its length header",
                bytes.len()
            )));
        };
        if header_len.checked_add(blob_len) != Some(bytes.len()) {
            return Err(self.corrupt(format!(
                "value of key {key} at {lsn}: its header says {blob_len} bytes, but the next value starts {} bytes on",
                bytes.len() - header_len
            )));
        }
        self.decode_value(key, lsn, entry, &bytes[header_len..])
    }

    /// Where the value at `offset` ends, if its length header lies in a cached block: then no
    /// index lookup is needed to read exactly its bytes. (An end past the values is caught by
    /// the read's own checks.)
    fn cached_value_end(&self, offset: u64) -> Option<u64> {
        let blkno = u32::try_from(offset / PAGE_SZ as u64).ok()?;
        let in_block = (offset % PAGE_SZ as u64) as usize;
        let block = self.cache.peek_file_page(self.file_id, blkno)?;
        let (header_len, blob_len) = BlobHeader::parse(&block[in_block..])?;
        offset.checked_add((header_len + blob_len) as u64)
    }

    /// Where the value of the newest entry at or below (key, lsn) ends: where the first entry
    /// above (key, lsn) begins, or at the end of the values.
    fn entry_above(
        &self,
        tree: &DiskBtreeReader<'_, INDEX_KEY_LEN, IndexBlocks<'_>>,
        key: Key,
        lsn: Lsn,
    ) -> Result<u64, DeltaLayerError> {
        let above = match lsn.0.checked_add(1) {
            Some(next) => index_key(key, Lsn(next)),
            None => index_key(key.next(), Lsn(0)),
        };
        match tree.iter_from(&above).next() {
            Some(entry) => Ok(entry.map_err(|e: BtreeReadError| self.corrupt(e))?.1 >> 1),
            None => Ok(self.summary.values_end),
        }
    }

    /// Checks a stored value (serialized value, then its CRC-32C) against its checksum and its
    /// index entry, and decodes it.
    fn decode_value(
        &self,
        key: Key,
        lsn: Lsn,
        entry: u64,
        buf: &[u8],
    ) -> Result<Value, DeltaLayerError> {
        let Some(body_len) = buf.len().checked_sub(VALUE_CRC_LEN) else {
            return Err(self.corrupt(format!(
                "value of key {key} at {lsn} is {} bytes, too short for its checksum",
                buf.len()
            )));
        };
        let (body, crc) = buf.split_at(body_len);
        let stored = u32::from_be_bytes([crc[0], crc[1], crc[2], crc[3]]);
        if crc32c::crc32c(body) != stored {
            return Err(self.corrupt(format!("value of key {key} at {lsn}: checksum mismatch")));
        }
        let value = Value::deserialize(body).map_err(|e: ValueDecodeError| {
            self.corrupt(format!("value of key {key} at {lsn}: {e}"))
        })?;
        if value.will_init() != (entry & WILL_INIT_BIT != 0) {
            return Err(self.corrupt(format!(
                "value of key {key} at {lsn} disagrees with its index entry about will_init"
            )));
        }
        Ok(value)
    }

    /// Runs `read` with the layer's index and a cursor over its value blocks. A `Scan` reads
    /// blocks the page cache lacks without inserting them: a pass over the whole layer must
    /// not push out what point reads use.
    fn with_index<T>(
        &self,
        access: Access,
        read: impl FnOnce(
            &DiskBtreeReader<'_, INDEX_KEY_LEN, IndexBlocks<'_>>,
            &BlockCursor<'_, FileBlockReader<'_>>,
        ) -> Result<T, DeltaLayerError>,
    ) -> Result<T, DeltaLayerError> {
        let reader = || match access {
            Access::Point => self.blocks(),
            Access::Scan => self.blocks().bypassing_cache(),
        };
        let blocks = reader();
        let index = IndexBlocks {
            inner: reader().index_blocks(node_is_valid::<INDEX_KEY_LEN>),
            start: self.summary.index_start_blk,
            path: &self.path,
        };
        let tree = DiskBtreeReader::new(self.summary.index_root_blk, &index);
        let cursor = BlockCursor::new(&blocks).with_max_blob_len(self.max_blob_len);
        read(&tree, &cursor)
    }

    /// The versions of `key` at or below `lsn`, newest first, down to the first that needs no
    /// older history.
    pub fn get(&self, key: Key, lsn: Lsn) -> Result<LayerRecords, DeltaLayerError> {
        let mut result = LayerRecords::default();
        if key < self.summary.key_start
            || key >= self.summary.key_end
            || lsn < self.summary.lsn_start
        {
            return Ok(result);
        }
        self.with_index(Access::Point, |tree, _| {
            // Values lie in index order, so a value ends where the next entry's begins: for
            // the newest version read, the first entry above (key, lsn) says where (usually in
            // the same, cached, leaf); for each older one, the version read before it.
            let mut end = None;
            for entry in tree.iter_backward_from(&index_key(key, lsn)) {
                let (found, value) = entry.map_err(|e: BtreeReadError| self.corrupt(e))?;
                let (found_key, version) = split_index_key(&found);
                if found_key != key {
                    break;
                }
                let value_end = match end {
                    Some(end) => end,
                    None => match self.cached_value_end(value >> 1) {
                        Some(end) => end,
                        None => self.entry_above(tree, key, lsn)?,
                    },
                };
                let record = self.read_value_range(key, version, value, value_end)?;
                end = Some(value >> 1);
                let base = record.will_init();
                result.records.push((version, record));
                if base {
                    result.complete = true;
                    break;
                }
            }
            Ok(result)
        })
    }

    /// The keys in `[from, end)` with a version at or below `lsn`, in key order, at most
    /// `max_keys` of them (at least one is asked for), read from the index alone: a scan's next
    /// chunk of this layer. Index blocks are read through the page cache as point reads read
    /// them, since a scan's pages are read with point reads of the same leaves right after.
    pub fn keys_at_lsn(
        &self,
        from: Key,
        end: Key,
        lsn: Lsn,
        max_keys: usize,
    ) -> Result<KeyChunk, DeltaLayerError> {
        let max_keys = max_keys.max(1);
        let from = from.max(self.summary.key_start);
        let end = end.min(self.summary.key_end);
        let mut chunk = KeyChunk::default();
        if from >= end || lsn < self.summary.lsn_start {
            return Ok(chunk);
        }
        self.with_index(Access::Point, |tree, _| {
            let mut seek = from;
            'seek: loop {
                // The key whose later versions are being passed over, and how many so far.
                let mut current: Option<(Key, usize)> = None;
                for entry in tree.iter_from(&index_key(seek, Lsn(0))) {
                    let (found, _) = entry.map_err(|e: BtreeReadError| self.corrupt(e))?;
                    let (key, version) = split_index_key(&found);
                    if key >= end {
                        return Ok(chunk);
                    }
                    match &mut current {
                        Some((k, passed)) if *k == key => {
                            *passed += 1;
                            // More versions than a leaf holds: a descent to the next key
                            // reads fewer blocks than walking the rest of them.
                            if *passed >= PASS_OVER_BEFORE_SEEK {
                                seek = key.next();
                                continue 'seek;
                            }
                        }
                        _ => {
                            // A key's first entry is its oldest version in this layer.
                            if version <= lsn {
                                chunk.keys.push(key);
                                if chunk.keys.len() == max_keys {
                                    // `key` < `end` <= Key::MAX, so it has a successor.
                                    chunk.resume = Some(key.next());
                                    return Ok(chunk);
                                }
                            }
                            current = Some((key, 0));
                        }
                    }
                }
                return Ok(chunk);
            }
        })
    }

    /// Every (key, lsn, value) in the file in order: for verification and dumps.
    pub fn iter(&self) -> Result<Vec<(Key, Lsn, Value)>, DeltaLayerError> {
        let out = self.with_index(Access::Scan, |tree, cursor| {
            let mut out = Vec::new();
            let mut buf = Vec::new();
            for entry in tree.iter_from(&[0u8; INDEX_KEY_LEN]) {
                let (found, value) = entry.map_err(|e: BtreeReadError| self.corrupt(e))?;
                let (key, lsn) = split_index_key(&found);
                out.push((
                    key,
                    lsn,
                    self.read_value(cursor, key, lsn, value, &mut buf)?,
                ));
            }
            Ok(out)
        })?;
        if out.len() as u64 != self.summary.entries {
            return Err(self.corrupt(format!(
                "index holds {} entries, the summary says {}",
                out.len(),
                self.summary.entries
            )));
        }
        Ok(out)
    }

    /// Calls `visitor` with each index entry from the first version of `start` on, in (key, lsn)
    /// order, until it returns `false`. Reads only index blocks, each checked as on every read.
    /// Returns `Ok(true)` if every such entry was visited, `Ok(false)` if the visitor stopped
    /// early; entries visited before an error have been visited.
    pub fn visit_index(
        &self,
        start: Key,
        mut visitor: impl FnMut(IndexEntry) -> bool,
    ) -> Result<bool, DeltaLayerError> {
        self.with_index(Access::Scan, |tree, _| {
            tree.visit_from(&index_key(start, Lsn(0)), |found, value| {
                visitor(IndexEntry::from_stored(found, value))
            })
            .map_err(|e: BtreeReadError| self.corrupt(e))
        })
    }

    /// Reads the value `entry` points at, with the checks [`Self::get`] makes: the offset lies
    /// within the values, the checksum matches, the bytes decode, and `will_init` agrees with
    /// the entry. A stored value does not repeat its key, so `entry` should be one that
    /// [`Self::visit_index`] gave: a made-up entry reads whatever value is at its offset.
    pub fn read_entry(&self, entry: &IndexEntry) -> Result<Value, DeltaLayerError> {
        if entry.offset > u64::MAX >> 1 {
            return Err(DeltaLayerError::Usage {
                path: self.path.clone(),
                message: format!("no index entry can hold offset {}", entry.offset),
            });
        }
        self.with_index(Access::Point, |_, cursor| {
            self.read_value(
                cursor,
                entry.key,
                entry.lsn,
                entry.stored(),
                &mut Vec::new(),
            )
        })
    }

    /// Reads the whole file and checks everything the format promises, returning the first
    /// problem as [`DeltaLayerError::Corrupt`]. Beyond what every read checks (the summary, each
    /// index node on a full scan, each value's offset, checksum, encoding and `will_init`):
    ///
    /// - the reserved summary fields and the rest of block 0 are zero;
    /// - every entry lies within the summary's key and LSN ranges, the first key is the key
    ///   range's start, and the range ends just after the last key;
    /// - the values lie back to back in index order from byte 8192 to `values_end`;
    /// - the index holds as many entries as the summary says;
    /// - the file ends with the index root.
    ///
    /// Values are read one at a time, so memory does not grow with the file.
    pub fn verify(&self) -> Result<VerifyReport, DeltaLayerError> {
        self.verify_summary_block()?;
        let s = self.summary;
        let mut report = VerifyReport {
            index_blocks: u64::from(s.index_root_blk) + 1,
            ..VerifyReport::default()
        };
        let last_key = self.with_index(Access::Scan, |tree, cursor| {
            let mut buf = Vec::new();
            let mut expected_offset = PAGE_SZ as u64;
            let mut last_key = None;
            for entry in tree.iter_from(&[0u8; INDEX_KEY_LEN]) {
                let (found, stored) = entry.map_err(|e: BtreeReadError| self.corrupt(e))?;
                let e = IndexEntry::from_stored(&found, stored);
                let (key, lsn) = (e.key, e.lsn);
                if last_key.is_none() && key != s.key_start {
                    return Err(self.corrupt(format!(
                        "first key {key} is not the key range's start {}",
                        s.key_start
                    )));
                }
                if key >= s.key_end || lsn < s.lsn_start || lsn >= s.lsn_end {
                    return Err(self.corrupt(format!(
                        "key {key} at {lsn} lies outside the layer's ranges {}..{}, {}..{}",
                        s.key_start, s.key_end, s.lsn_start, s.lsn_end
                    )));
                }
                if e.offset != expected_offset {
                    return Err(self.corrupt(format!(
                        "value of key {key} at {lsn} starts at byte {}, expected {expected_offset} \
                         right after the previous value",
                        e.offset
                    )));
                }
                let value = self.read_value(cursor, key, lsn, stored, &mut buf)?;
                // `buf` holds the blob: the serialized value and its checksum.
                let header = BlobHeader::new(buf.len()).map_err(|e| self.corrupt(e))?;
                expected_offset = e.offset + (header.encoded_len() + buf.len()) as u64;
                report.entries += 1;
                // `read_value` checked that the blob holds a checksum.
                report.value_bytes += (buf.len() - VALUE_CRC_LEN) as u64;
                match value {
                    Value::Image(_) => report.images += 1,
                    Value::Delta { .. } => report.deltas += 1,
                }
                last_key = Some(key);
            }
            if expected_offset != s.values_end {
                return Err(self.corrupt(format!(
                    "the values end at byte {expected_offset}, the summary says {}",
                    s.values_end
                )));
            }
            Ok(last_key)
        })?;
        if report.entries != s.entries {
            return Err(self.corrupt(format!(
                "index holds {} entries, the summary says {}",
                report.entries, s.entries
            )));
        }
        if let Some(last) = last_key {
            if s.key_end != last.next() {
                return Err(self.corrupt(format!(
                    "key range ends at {}, not just after the last key {last}",
                    s.key_end
                )));
            }
        }
        // The file's length against the index's end was checked by `open`: a file that
        // changed size since is not the file that was opened.
        let io_err = |source| DeltaLayerError::Io {
            path: self.path.clone(),
            source,
        };
        let len = self.file.metadata().map_err(io_err)?.len();
        if len != self.file_size {
            return Err(self.corrupt(format!(
                "file is {len} bytes now, {} when it was opened",
                self.file_size
            )));
        }
        Ok(report)
    }

    /// Checks the bytes of block 0 that decoding the summary does not look at.
    fn verify_summary_block(&self) -> Result<(), DeltaLayerError> {
        use summary_off::*;
        let mut block = vec![0u8; PAGE_SZ];
        self.file
            .read_exact_at(&mut block, 0)
            .map_err(|source| DeltaLayerError::Io {
                path: self.path.clone(),
                source,
            })?;
        let reserved = [
            RESERVED_1..RESERVED_1 + 2,
            RESERVED_2..RESERVED_2 + 4,
            END..PAGE_SZ,
        ];
        for range in reserved {
            if let Some(at) = block[range.clone()].iter().position(|b| *b != 0) {
                return Err(self.corrupt(format!(
                    "summary block byte {} is not zero (reserved)",
                    range.start + at
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
