//! Delta layer files: an immutable, sorted run of page versions for a key range and an LSN range.
//!
//! Reading lives here; `summary.rs` holds block 0 and the file name grammar, `writer.rs` the
//! creation of a file, `inspect.rs` what tools and whole-file checks read.
//!
//! # File layout
//!
//! ```text
//! block 0                 summary (below)
//! blocks 1 ..             values: blobs (blob_io format) back to back from byte 8192,
//!                         each the stored value of one (key, lsn) followed by the
//!                         CRC-32C of those bytes (4 bytes, big-endian)
//! blocks index_start ..   B-tree index (disk_btree), block numbers relative to index_start:
//!                         key ++ big-endian lsn (26 bytes) -> blob offset << 1 | will_init
//! ```
//!
//! A stored value is the value's byte format (`pageserver_api::value`: kind 0, 1 or 2), or, in
//! a version 2 file only, kind 3: the byte `0x03` then one Zstandard frame of the value's byte
//! format (`format::compression`), written where it saves at least an eighth. A version 1 file
//! is what a writer without compression makes; readers take both.
//!
//! Summary (block 0, big-endian, the rest of the block zero):
//!
//! ```text
//! offset size field
//!      0    4 magic              0x44454C54 ("DELT")
//!      4    2 format version     1, or 2 if values may be compressed
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
//! trusted: a bad magic, version, checksum, range or offset is a [`LayerFileError::Corrupt`]
//! naming the file, never a panic or a wrong page.
//!
//! [`DeltaLayer::versions_at_lsn`] lists, from the index alone, the versions at or below an LSN
//! that reconstruction needs, key by key, a bounded chunk at a time, with where each value lies;
//! [`DeltaLayer::read_version`] reads one of them: a paged scan's stream over the layer
//! (`timeline::scan`).
//!
//! # Inspection
//!
//! For tools that look inside a file (`pagectl`): [`DeltaLayer::visit_index`] lists the raw
//! index entries without reading values, [`DeltaLayer::read_entry`] reads the value of one entry
//! with the same checks as [`DeltaLayer::get`], and [`DeltaLayer::verify`] reads every index node
//! and every value and checks everything the format promises, reporting the first problem.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use pageserver_api::value::{ValueDecodeError, KIND_IMAGE};
use pageserver_api::{Key, Value};
use utils::{Lsn, TenantId, TimelineId};

use crate::format::blob_io::{BlobHeader, BlobReadError, BlockCursor};
use crate::format::block_io::{
    read_range_through_cache, warm_blocks_through_cache, FileBlockReader,
};
use crate::format::cached_range::CachedRange;
use crate::format::compression::{decompress, Compression, ValueCompressor};
use crate::format::disk_btree::{
    node_is_valid, BtreeReadError, DiskBtreeBuilder, DiskBtreeReader, VecBlockSink,
};
use crate::io::read_cost::BlockKind;
use crate::page_cache::PageCache;
use crate::tenant::storage_layer::layer_file::{
    u32_at, u64_at, Access, IndexBlocks, LayerFile, LayerFileError, LayerFileKind, LayerFileWriter,
    SummaryHead, SummaryLayout,
};
use crate::tenant::storage_layer::layer_name::{DeltaLayerName, LayerName};
use crate::tenant::storage_layer::{
    max_stored_value_len, merge_block_runs, LayerRecords, ValueAt, VersionChunk, VersionRef,
};
use crate::PAGE_SZ;

pub const DELTA_MAGIC: u32 = 0x4445_4C54;
/// The version of a file whose values are all stored as they are.
pub const DELTA_FORMAT_VERSION_PLAIN: u16 = 1;
/// The version of a file whose values may be stored compressed (kind 3).
pub const DELTA_FORMAT_VERSION: u16 = 2;

/// The kind byte of a compressed stored value, after the value kinds of `pageserver_api::value`.
const COMPRESSED_VALUE_KIND: u8 = 3;

const INDEX_KEY_LEN: usize = 26;
const KEY_LEN: usize = 18;
const WILL_INIT_BIT: u64 = 1;
/// The CRC-32C that follows each stored value.
const VALUE_CRC_LEN: usize = 4;
/// [`DeltaLayer::versions_at_lsn`] walks past this many further versions of one key, about a leaf's
/// worth, before it descends the index to the next key instead.
const PASS_OVER_BEFORE_SEEK: usize = crate::format::disk_btree::leaf_capacity(INDEX_KEY_LEN);

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

/// An open delta layer file.
pub struct DeltaLayer {
    file: LayerFile,
    summary: Summary,
    /// The longest value blob (serialized value and its checksum) a read accepts.
    max_blob_len: usize,
    /// The longest serialized value a compressed one may decompress to.
    max_value_len: usize,
}

impl DeltaLayer {
    /// Opens and validates a delta layer file. `max_value_size` (the configured limit) bounds
    /// every stored value, so a corrupt length cannot make a read allocate gigabytes.
    pub fn open(
        path: &Path,
        cache: Arc<PageCache>,
        max_value_size: usize,
    ) -> Result<DeltaLayer, LayerFileError> {
        let (file, block) = LayerFile::open(LayerFileKind::Delta, path, cache)?;
        let summary = Summary::decode(&block, file.size()).map_err(|e| file.corrupt(e))?;
        Ok(DeltaLayer {
            file,
            summary,
            max_blob_len: max_stored_value_len(max_value_size).saturating_add(VALUE_CRC_LEN),
            max_value_len: max_stored_value_len(max_value_size),
        })
    }

    pub fn summary(&self) -> &Summary {
        &self.summary
    }

    /// CRC-32C of the whole file, read straight from the file (not through the page cache: a
    /// bulk read must not push out the hot set).
    pub fn file_crc32c(&self) -> Result<u32, LayerFileError> {
        self.file.crc32c()
    }

    /// Checks that this is the file its name says, of the timeline it is found in: the name
    /// encodes the summary's key and LSN ranges, and the summary names the tenant and timeline.
    /// A layer copied from elsewhere, or renamed, fails with what differs.
    pub fn check_identity(
        &self,
        tenant_id: TenantId,
        timeline_id: TimelineId,
    ) -> Result<(), LayerFileError> {
        let s = &self.summary;
        self.file
            .check_identity(&s.layer_name(), &s.head(), tenant_id, timeline_id)
    }

    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// The file's size in bytes.
    pub fn file_size(&self) -> u64 {
        self.file.size()
    }

    /// Marks the file as replaced by a committed manifest: it is removed once the last reader
    /// lets go of this layer.
    pub fn retire(&self) {
        self.file.retire()
    }

    fn corrupt(&self, reason: impl std::fmt::Display) -> LayerFileError {
        self.file.corrupt(reason)
    }

    fn check_offset(&self, key: Key, lsn: Lsn, offset: u64) -> Result<(), LayerFileError> {
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
    ) -> Result<Value, LayerFileError> {
        let offset = entry >> 1;
        self.check_offset(key, lsn, offset)?;
        cursor
            .read_blob_into_buf(offset, buf)
            .map_err(|e: BlobReadError| self.corrupt(e))?;
        self.decode_value(key, lsn, entry, buf)
    }

    /// The value stored at `entry`'s offset, which ends at byte `end` (where the next value
    /// starts, or the end of the values), and whether it was stored compressed: exactly the
    /// blocks it spans are needed, and each run of them that the page cache lacks is read with
    /// one call.
    fn read_value_range(
        &self,
        key: Key,
        lsn: Lsn,
        entry: u64,
        end: u64,
    ) -> Result<(Value, bool), LayerFileError> {
        let offset = entry >> 1;
        self.check_offset(key, lsn, offset)?;
        // The longest a stored value can be: its blob header, the blob, nothing else.
        let longest = 4 + self.max_blob_len as u64;
        if end <= offset || end > self.summary.values_end || end - offset > longest {
            return Err(self.corrupt(format!(
                "value of key {key} at {lsn} would span bytes {offset}..{end}"
            )));
        }
        if let Some(cached) = CachedRange::lookup(
            self.file.cache(),
            self.file.file_id(),
            offset..end,
            BlockKind::Value,
        ) {
            return self.decode_cached(key, lsn, entry, cached);
        }
        let bytes = Bytes::from(
            read_range_through_cache(
                self.file.cache(),
                self.file.file(),
                self.file.file_id(),
                self.file.path(),
                offset..end,
                BlockKind::Value,
            )
            .map_err(|e| self.corrupt(e))?,
        );
        let header_len = self.value_header_len(key, lsn, &bytes, bytes.len())?;
        let compressed = bytes.get(header_len) == Some(&COMPRESSED_VALUE_KIND);
        let value = self.decode_value_bytes(key, lsn, entry, bytes.slice(header_len..))?;
        Ok((value, compressed))
    }

    /// [`Self::read_value_range`] of a value whose blocks are all cached: the length header and
    /// the checksum are read in place, and only the checked body is copied out, once.
    fn decode_cached(
        &self,
        key: Key,
        lsn: Lsn,
        entry: u64,
        cached: CachedRange<'_>,
    ) -> Result<(Value, bool), LayerFileError> {
        let len = cached.len();
        let head = if len >= 4 {
            cached.array::<4>(0)
        } else {
            let mut head = [0u8; 4];
            cached.copy_to(0, &mut head[..len]);
            head
        };
        let header_len = self.value_header_len(key, lsn, &head[..len.min(4)], len)?;
        let body_len = self.body_len(key, lsn, len - header_len)?;
        let body = header_len..header_len + body_len;
        let stored = cached.array::<VALUE_CRC_LEN>(body.end);
        self.check_checksum(key, lsn, cached.crc32c(body.clone()), stored)?;
        if !body.is_empty() && cached.array::<1>(body.start)[0] == KIND_IMAGE {
            // An image is its kind byte and the page: the page alone is copied out, into a
            // buffer of its own that a redo can write into (`reconstruct_page_taking`).
            let page = Bytes::from(cached.to_vec(body.start + 1..body.end));
            let value = self.check_will_init(key, lsn, entry, Ok(Value::Image(page)))?;
            return Ok((value, false));
        }
        let body = Bytes::from(cached.to_vec(body));
        // The blocks are let go before decoding (which may decompress).
        drop(cached);
        let compressed = body.first() == Some(&COMPRESSED_VALUE_KIND);
        Ok((self.decode_body(key, lsn, entry, body)?, compressed))
    }

    /// Brings the values of `versions` (listed by [`Self::versions_at_lsn`]) into the page
    /// cache ahead of the reads that will need them: their blocks, merged into runs of
    /// adjacent blocks, each run the cache lacks read with one call. A batch of neighbouring
    /// pages, whose values lie side by side, costs a few reads instead of one per page. Entries
    /// this layer did not list are skipped; their reads will say what is wrong.
    pub fn prefetch_values(&self, versions: &[VersionRef]) -> Result<(), LayerFileError> {
        let longest = 4 + self.max_blob_len as u64;
        let blocks: Vec<Range<u32>> = versions
            .iter()
            .filter_map(|v| match v.at {
                ValueAt::Delta { entry, end } => Some((entry >> 1, end)),
                _ => None,
            })
            .filter(|&(offset, end)| {
                offset >= PAGE_SZ as u64
                    && offset < end
                    && end <= self.summary.values_end
                    && end - offset <= longest
            })
            .map(|(offset, end)| {
                let first = (offset / PAGE_SZ as u64) as u32;
                let last = ((end - 1) / PAGE_SZ as u64) as u32;
                first..last + 1
            })
            .collect();
        for run in merge_block_runs(blocks) {
            warm_blocks_through_cache(
                self.file.cache(),
                self.file.file(),
                self.file.file_id(),
                self.file.path(),
                run,
                BlockKind::Value,
                // A value's own checksum is checked when it is read.
                None,
            )
            .map_err(|e| self.corrupt(e))?;
        }
        Ok(())
    }

    /// Where the value at `offset` ends, if its length header lies in a cached block: then no
    /// index lookup is needed to read exactly its bytes. (An end past the values is caught by
    /// the read's own checks.)
    fn cached_value_end(&self, offset: u64) -> Option<u64> {
        let blkno = u32::try_from(offset / PAGE_SZ as u64).ok()?;
        let in_block = (offset % PAGE_SZ as u64) as usize;
        let block = self
            .file
            .cache()
            .peek_file_page(self.file.file_id(), blkno)?;
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
    ) -> Result<u64, LayerFileError> {
        let above = match lsn.0.checked_add(1) {
            Some(next) => index_key(key, Lsn(next)),
            None => index_key(key.next(), Lsn(0)),
        };
        match tree.iter_from(&above).next() {
            Some(entry) => Ok(entry.map_err(|e: BtreeReadError| self.corrupt(e))?.1 >> 1),
            None => Ok(self.summary.values_end),
        }
    }

    /// A stored value (its body, then the body's CRC-32C), checked and decoded.
    fn decode_value(
        &self,
        key: Key,
        lsn: Lsn,
        entry: u64,
        buf: &[u8],
    ) -> Result<Value, LayerFileError> {
        let body = self.checked_body(key, lsn, buf)?;
        if body.first() == Some(&COMPRESSED_VALUE_KIND) {
            return self.decode_compressed(key, lsn, entry, body);
        }
        self.check_will_init(key, lsn, entry, Value::deserialize(body))
    }

    /// [`Self::decode_value`] of a buffer the value may keep: an image's bytes are a slice of
    /// it, not a copy.
    fn decode_value_bytes(
        &self,
        key: Key,
        lsn: Lsn,
        entry: u64,
        buf: Bytes,
    ) -> Result<Value, LayerFileError> {
        let body_len = self.checked_body(key, lsn, &buf)?.len();
        self.decode_body(key, lsn, entry, buf.slice(..body_len))
    }

    /// A stored value's body, its checksum checked, decoded: an image's bytes are a slice of
    /// it, not a copy.
    fn decode_body(
        &self,
        key: Key,
        lsn: Lsn,
        entry: u64,
        body: Bytes,
    ) -> Result<Value, LayerFileError> {
        if body.first() == Some(&COMPRESSED_VALUE_KIND) {
            return self.decode_compressed(key, lsn, entry, &body);
        }
        self.check_will_init(key, lsn, entry, Value::deserialize_bytes(body))
    }

    /// A compressed stored value (kind byte, then one frame), decompressed and decoded.
    fn decode_compressed(
        &self,
        key: Key,
        lsn: Lsn,
        entry: u64,
        body: &[u8],
    ) -> Result<Value, LayerFileError> {
        if self.summary.format_version == DELTA_FORMAT_VERSION_PLAIN {
            return Err(self.corrupt(format!(
                "value of key {key} at {lsn} is compressed, in a version {DELTA_FORMAT_VERSION_PLAIN} file"
            )));
        }
        let plain = decompress(&body[1..], self.max_value_len)
            .map_err(|e| self.corrupt(format!("value of key {key} at {lsn}: {e}")))?;
        if plain.first() == Some(&COMPRESSED_VALUE_KIND) {
            return Err(self.corrupt(format!("value of key {key} at {lsn} is compressed twice")));
        }
        self.check_will_init(
            key,
            lsn,
            entry,
            Value::deserialize_bytes(Bytes::from(plain)),
        )
    }

    /// The length of the length header of a stored value of `len` bytes (header included),
    /// from its first bytes `head`: checked to say exactly `len`.
    fn value_header_len(
        &self,
        key: Key,
        lsn: Lsn,
        head: &[u8],
        len: usize,
    ) -> Result<usize, LayerFileError> {
        let Some((header_len, blob_len)) = BlobHeader::parse(head) else {
            return Err(self.corrupt(format!(
                "value of key {key} at {lsn}: {len} bytes cannot hold its length header"
            )));
        };
        if header_len.checked_add(blob_len) != Some(len) {
            return Err(self.corrupt(format!(
                "value of key {key} at {lsn}: its header says {blob_len} bytes, but the next value starts {} bytes on",
                len - header_len
            )));
        }
        Ok(header_len)
    }

    /// The length of the body of a stored value whose blob (body and checksum) is `blob_len`.
    fn body_len(&self, key: Key, lsn: Lsn, blob_len: usize) -> Result<usize, LayerFileError> {
        blob_len.checked_sub(VALUE_CRC_LEN).ok_or_else(|| {
            self.corrupt(format!(
                "value of key {key} at {lsn} is {blob_len} bytes, too short for its checksum"
            ))
        })
    }

    fn check_checksum(
        &self,
        key: Key,
        lsn: Lsn,
        computed: u32,
        stored: [u8; VALUE_CRC_LEN],
    ) -> Result<(), LayerFileError> {
        if computed != u32::from_be_bytes(stored) {
            return Err(self.corrupt(format!("value of key {key} at {lsn}: checksum mismatch")));
        }
        Ok(())
    }

    /// The body of a stored value whose checksum checks out.
    fn checked_body<'b>(
        &self,
        key: Key,
        lsn: Lsn,
        buf: &'b [u8],
    ) -> Result<&'b [u8], LayerFileError> {
        let (body, crc) = buf.split_at(self.body_len(key, lsn, buf.len())?);
        let stored = crate::format::array_at(crc, 0);
        self.check_checksum(key, lsn, utils::crc32c::crc32c(body), stored)?;
        Ok(body)
    }

    /// A decoded value, if it decoded and agrees with its index entry about `will_init`.
    fn check_will_init(
        &self,
        key: Key,
        lsn: Lsn,
        entry: u64,
        decoded: Result<Value, ValueDecodeError>,
    ) -> Result<Value, LayerFileError> {
        let value =
            decoded.map_err(|e| self.corrupt(format!("value of key {key} at {lsn}: {e}")))?;
        if value.will_init() != (entry & WILL_INIT_BIT != 0) {
            return Err(self.corrupt(format!(
                "value of key {key} at {lsn} disagrees with its index entry about will_init"
            )));
        }
        Ok(value)
    }

    /// Runs `read` with the layer's index and a cursor over its value blocks, reading through
    /// the page cache as `access` says.
    fn with_index<T>(
        &self,
        access: Access,
        read: impl FnOnce(
            &DiskBtreeReader<'_, INDEX_KEY_LEN, IndexBlocks<'_>>,
            &BlockCursor<'_, FileBlockReader<'_>>,
        ) -> Result<T, LayerFileError>,
    ) -> Result<T, LayerFileError> {
        let blocks = self.file.blocks(access);
        let index = self.file.index(
            access,
            self.summary.index_start_blk,
            &node_is_valid::<INDEX_KEY_LEN>,
        );
        let tree = DiskBtreeReader::new(self.summary.index_root_blk, &index);
        let cursor = BlockCursor::new(&blocks).with_max_blob_len(self.max_blob_len);
        read(&tree, &cursor)
    }

    /// The versions of `key` at or below `lsn`, newest first, down to the first that needs no
    /// older history.
    pub fn get(&self, key: Key, lsn: Lsn) -> Result<LayerRecords, LayerFileError> {
        self.get_above(key, lsn, None)
    }

    /// [`Self::get`] for a read that already holds the page as of `floor`: the versions at or
    /// below it are not read (nor decompressed), and reaching one completes the history.
    pub fn get_above(
        &self,
        key: Key,
        lsn: Lsn,
        floor: Option<Lsn>,
    ) -> Result<LayerRecords, LayerFileError> {
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
                if floor.is_some_and(|floor| version <= floor) {
                    result.complete = true;
                    break;
                }
                let value_end = match end {
                    Some(end) => end,
                    None => match self.cached_value_end(value >> 1) {
                        Some(end) => end,
                        None => self.entry_above(tree, key, lsn)?,
                    },
                };
                let (record, compressed) = self.read_value_range(key, version, value, value_end)?;
                result.decompressed |= compressed;
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

    /// The bytes of the values of keys in `keys`, from the index alone (two descents): values
    /// lie in key order, so they are the span between the first entries at or above each end.
    /// What image creation weighs a key range's history by.
    pub fn value_bytes_in(&self, keys: Range<Key>) -> Result<u64, LayerFileError> {
        let start = keys.start.max(self.summary.key_start);
        let end = keys.end.min(self.summary.key_end);
        if start >= end {
            return Ok(0);
        }
        self.with_index(Access::Point, |tree, _| {
            let offset_at = |key: Key| -> Result<u64, LayerFileError> {
                match tree.iter_from(&index_key(key, Lsn(0))).next() {
                    Some(entry) => Ok(entry.map_err(|e: BtreeReadError| self.corrupt(e))?.1 >> 1),
                    None => Ok(self.summary.values_end),
                }
            };
            let (from, to) = (offset_at(start)?, offset_at(end)?);
            // Offsets grow with the index order unless the file is corrupt; a corrupt file
            // weighs nothing here and is reported when read.
            Ok(to.saturating_sub(from))
        })
    }

    /// Every (key, lsn, value) in the file in order: for verification and dumps.
    pub fn iter(&self) -> Result<Vec<(Key, Lsn, Value)>, LayerFileError> {
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
}

mod inspect;
mod stream;
mod summary;
mod versions;
mod writer;
pub use inspect::{IndexEntry, VerifyReport};
pub use stream::{DeltaStream, STREAM_INDEX_CHUNK, STREAM_WINDOW};
pub use summary::Summary;
pub use writer::{DeltaLayerWriter, WrittenLayer};

#[cfg(test)]
mod tests;
