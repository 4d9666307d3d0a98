//! Image layer files: the page image of every key in a key range that has one, as of one LSN.
//!
//! Reading lives here; `summary.rs` holds block 0 and the name it gives the file, `writer.rs`
//! the creation of a file, `inspect.rs` what tools and whole-file checks read.
//!
//! An image layer is authoritative for its whole key range at its LSN: a key of the range
//! without an entry had no page at that LSN, so a read at or above the LSN need not look at
//! older layers for any key of the range. An image layer with no entries at all is valid.
//!
//! # File layout
//!
//! ```text
//! block 0                     summary (below)
//! blocks 1 ..                 values: the images' bytes, nothing else (no length header, no
//!                             value encoding: every value is an image), in key order
//! blocks checksums_start ..   checksum table: the CRC-32C of every value block
//! blocks index_start ..       B-tree index (disk_btree), block numbers relative to
//!                             index_start: key (18 bytes) -> offset << 25 | length
//! ```
//!
//! **Placement.** An image no longer than a block never straddles a block boundary: when it
//! would, zeros pad the block and the image starts the next one. A longer image starts on a
//! block boundary. So a run of 8 KiB images needs no padding at all, each image is exactly one
//! block, and reading one cold is one 8 KiB read. After the last image, zeros pad its block.
//!
//! **Checksum table.** Blocks `checksums_start .. index_start` hold the CRC-32C of each value
//! block (all 8192 bytes, padding included) in block order, 2047 big-endian `u32`s per block;
//! the last 4 bytes of each table block are the CRC-32C of its first 8188 bytes, and unused
//! slots are zero. There are `ceil((checksums_start - 1) / 2047)` table blocks.
//!
//! **Index entries.** `offset << 25 | length`: offset below 2^39 (512 GiB), length below 2^25
//! (32 MiB). An entry's image is bytes `offset .. offset + length`.
//!
//! **Compressed images (version 2).** In a version 2 file an entry's top bit says that its
//! `length` bytes are one Zstandard frame of the image (`format::compression`), and offsets are
//! below 2^38. A frame is placed like an image of its length, and written only where it saves
//! at least an eighth; the other images of the file are stored as they are. A writer without
//! compression writes version 1, and readers take both.
//!
//! Summary (block 0, big-endian, the rest of the block zero):
//!
//! ```text
//! offset size field
//!      0    4 magic                 0x494D474C ("IMGL")
//!      4    2 format version        1, or 2 if images may be compressed
//!      6    2 reserved              0
//!      8   16 tenant id
//!     24   16 timeline id
//!     40   18 key start
//!     58   18 key end               exclusive
//!     76    8 lsn                   the one LSN of every image
//!     84    4 checksums start block = ceil(values end / 8192)
//!     88    4 index start block     = checksums start + checksum table blocks
//!     92    4 index root block      relative to index start; the file's last block
//!     96    8 entry count
//!    104    8 values end            byte offset just past the last image (8192 if none)
//!    112    4 CRC-32C of bytes 0..112
//! ```
//!
//! # Creation is atomic
//!
//! [`ImageLayerWriter`] writes to a temporary name (`image-<pid>-<n>.___temp`): images first,
//! in large chunks, with each value block's CRC-32C kept as the block fills; then the checksum
//! table and the index (built in memory alongside); then the summary; then the file is
//! fsynced, renamed to its final name (`<key start>-<key end>__<lsn>`), and the directory
//! fsynced (failpoints `image-layer-before-rename` and `image-layer-after-rename`). A writer
//! dropped before `finish` removes its temporary file.
//!
//! # Reading
//!
//! [`ImageLayer::open`] validates the summary against the file's size; every later read goes
//! through the page cache and reads only the blocks it needs. Nothing read is trusted:
//!
//! - a value block is checked against its CRC-32C in the table *before* it is cached, so a
//!   damaged block is never cached and every read of it sees the damage;
//! - a checksum table block is an index-kind block (cached with the index's priority, counted
//!   as an index block in read costs), checked against its own trailing CRC before caching;
//! - an index block is checked as a B-tree node before caching, as in delta layers.
//!
//! With the index and the table cached, reading an image of at most 8 KiB is one 8 KiB read.
//! Any failed check is an [`LayerFileError::Corrupt`] naming the file (and the block), never a
//! panic or a wrong page.
//!
//! # Inspection
//!
//! For tools (`pagectl`): [`ImageLayer::visit_index`] lists the index entries,
//! [`ImageLayer::read_entry`] reads one entry's image with the checks of [`ImageLayer::get`],
//! and [`ImageLayer::verify`] reads the whole file and checks everything the format promises.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use pageserver_api::{Key, Value};
use utils::{Lsn, TenantId, TimelineId};

use crate::format::block_io::{
    warm_blocks_through_cache, BlockLease, BlockReadError, BlockReader, FileBlockReader,
};
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
use crate::tenant::storage_layer::layer_name::{ImageLayerName, LayerName};
use crate::tenant::storage_layer::{
    merge_block_runs, LayerRecords, ValueAt, VersionChunk, VersionRef,
};
use crate::PAGE_SZ;

pub const IMAGE_MAGIC: u32 = 0x494D_474C;
/// The version of a file whose images are all stored as they are.
pub const IMAGE_FORMAT_VERSION_PLAIN: u16 = 1;
/// The version of a file whose images may be stored compressed.
pub const IMAGE_FORMAT_VERSION: u16 = 2;

/// The index key: the page key's bytes, whose order is key order.
const KEY_LEN: usize = 18;
/// An index entry's low bits hold the image's length, the rest its offset.
const LEN_BITS: u32 = 25;
/// The longest image an index entry can describe.
pub const MAX_IMAGE_LEN: usize = (1 << LEN_BITS) - 1;
/// The largest offset an index entry can hold (offsets are below 2^39).
pub const MAX_IMAGE_OFFSET: u64 = (1 << (64 - LEN_BITS)) - 1;
/// In a version 2 file, the index entry's bit that says its image is stored compressed.
const COMPRESSED_BIT: u64 = 1 << 63;
/// The largest offset a version 2 index entry can hold, beside its compressed bit.
pub const MAX_COMPRESSING_OFFSET: u64 = MAX_IMAGE_OFFSET >> 1;
/// CRC-32Cs per checksum table block; its last 4 bytes are the block's own CRC-32C.
pub const CRCS_PER_BLOCK: usize = PAGE_SZ / 4 - 1;
/// The bytes of a checksum table block that its own CRC-32C covers.
const TABLE_CRC_OFF: usize = PAGE_SZ - 4;

fn index_value(offset: u64, len: usize) -> u64 {
    (offset << LEN_BITS) | len as u64
}

fn split_index_value(value: u64) -> (u64, usize) {
    (value >> LEN_BITS, (value & MAX_IMAGE_LEN as u64) as usize)
}

/// Where an index entry's image lies, and whether it is stored compressed.
#[derive(Clone, Copy, Debug)]
struct StoredImage {
    offset: u64,
    /// The stored bytes: the image's, or its frame's.
    len: usize,
    compressed: bool,
}

/// Where an image of `len` bytes goes when the values so far end at byte `end`: right there
/// if it fits in the rest of that block (or `end` is on a boundary), else at the next block.
fn placement(end: u64, len: usize) -> u64 {
    let in_block = end % PAGE_SZ as u64;
    if in_block == 0 || in_block + len as u64 <= PAGE_SZ as u64 {
        end
    } else {
        end - in_block + PAGE_SZ as u64
    }
}

/// Whether an image at `offset` of `len` bytes is placed as the format requires.
fn well_placed(offset: u64, len: usize) -> bool {
    placement(offset, len) == offset
}

/// Where the CRC-32C of value block `blkno` (1 or more) lies: its table block, relative to
/// the table's start, and its byte offset in that block.
fn table_slot(blkno: u32) -> (u32, usize) {
    let i = (blkno - 1) as usize;
    ((i / CRCS_PER_BLOCK) as u32, (i % CRCS_PER_BLOCK) * 4)
}

/// Whether a checksum table block matches its own trailing CRC-32C.
fn table_block_is_valid(block: &[u8; PAGE_SZ]) -> bool {
    utils::crc32c::crc32c(&block[..TABLE_CRC_OFF]) == u32_at(block, TABLE_CRC_OFF)
}

/// An open image layer file.
pub struct ImageLayer {
    file: LayerFile,
    summary: Summary,
    /// The longest image a read accepts.
    max_image_len: usize,
}

impl ImageLayer {
    /// Opens and validates an image layer file. `max_value_size` (the configured limit) bounds
    /// every image, so a corrupt length cannot make a read allocate more.
    pub fn open(
        path: &Path,
        cache: Arc<PageCache>,
        max_value_size: usize,
    ) -> Result<ImageLayer, LayerFileError> {
        let (file, block) = LayerFile::open(LayerFileKind::Image, path, cache)?;
        let summary = Summary::decode(&block, file.size()).map_err(|e| file.corrupt(e))?;
        Ok(ImageLayer {
            file,
            summary,
            max_image_len: max_value_size.min(MAX_IMAGE_LEN),
        })
    }

    pub fn summary(&self) -> &Summary {
        &self.summary
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

    /// CRC-32C of the whole file, read straight from the file (not through the page cache: a
    /// bulk read must not push out the hot set).
    pub fn file_crc32c(&self) -> Result<u32, LayerFileError> {
        self.file.crc32c()
    }

    /// Checks that this is the file its name says, of the timeline it is found in: the name
    /// encodes the summary's key range and LSN, and the summary names the tenant and timeline.
    pub fn check_identity(
        &self,
        tenant_id: TenantId,
        timeline_id: TimelineId,
    ) -> Result<(), LayerFileError> {
        let s = &self.summary;
        self.file
            .check_identity(&s.layer_name(), &s.head(), tenant_id, timeline_id)
    }

    fn corrupt(&self, reason: impl std::fmt::Display) -> LayerFileError {
        self.file.corrupt(reason)
    }

    /// A block that could not be read: an I/O error, or corruption (a block past the end).
    fn block_error(&self, e: BlockReadError) -> LayerFileError {
        match e {
            BlockReadError::Io { source, .. } => self.file.io_error(source),
            other => self.corrupt(other),
        }
    }

    fn btree_error(&self, e: BtreeReadError) -> LayerFileError {
        match e {
            BtreeReadError::Block(e) => self.block_error(e),
            other => self.corrupt(other),
        }
    }

    fn index(&self, access: Access) -> IndexBlocks<'_> {
        self.file.index(
            access,
            self.summary.index_start_blk,
            &node_is_valid::<KEY_LEN>,
        )
    }

    /// The checksum table's blocks, read as index blocks: a table block serves 2047 value
    /// blocks, so it earns the index's place in the cache.
    fn table(&self, access: Access) -> FileBlockReader<'_> {
        self.file.blocks(access).index_blocks(&table_block_is_valid)
    }

    /// Table block `table_blk` (relative to the table's start), checked.
    fn table_block<'r>(
        &self,
        table: &'r FileBlockReader<'_>,
        table_blk: u32,
    ) -> Result<BlockLease<'r>, LayerFileError> {
        let blkno = self.summary.checksums_start_blk + table_blk;
        let block = table.read_blk(blkno).map_err(|e| self.block_error(e))?;
        // A cached block passed the check before it was cached.
        if !matches!(block, BlockLease::Cached(_)) && !table_block_is_valid(&block) {
            return Err(self.corrupt(format!(
                "checksum table block {blkno} does not match its own checksum"
            )));
        }
        Ok(block)
    }

    /// Runs `read` on value block `blkno`, checked against `expected`, its CRC-32C from the
    /// table, before it is cached or read.
    fn with_value_block<T>(
        &self,
        blkno: u32,
        expected: u32,
        access: Access,
        read: impl FnOnce(&[u8; PAGE_SZ]) -> T,
    ) -> Result<T, LayerFileError> {
        let check = move |block: &[u8; PAGE_SZ]| utils::crc32c::crc32c(block) == expected;
        let reader = self.file.blocks(access).verified_by(&check);
        let block = reader.read_blk(blkno).map_err(|e| self.block_error(e))?;
        // A cached block passed the check before it was cached.
        if !matches!(block, BlockLease::Cached(_)) {
            let computed = utils::crc32c::crc32c(&block[..]);
            if computed != expected {
                return Err(self.corrupt(format!(
                    "value block {blkno}: checksum mismatch: the table says {expected:#010x}, \
                     the block's is {computed:#010x}"
                )));
            }
        }
        Ok(read(&block))
    }

    /// An index entry as this file's version reads it.
    fn stored(&self, entry: u64) -> StoredImage {
        let compressed = self.summary.format_version != IMAGE_FORMAT_VERSION_PLAIN
            && entry & COMPRESSED_BIT != 0;
        let (offset, len) = split_index_value(if compressed {
            entry & !COMPRESSED_BIT
        } else {
            entry
        });
        StoredImage {
            offset,
            len,
            compressed,
        }
    }

    /// The image an index entry of `key` points at, after checking that the entry is one the
    /// format allows.
    fn read_image(&self, key: Key, stored: u64, access: Access) -> Result<Bytes, LayerFileError> {
        let StoredImage {
            offset,
            len,
            compressed,
        } = self.stored(stored);
        let s = &self.summary;
        if offset < PAGE_SZ as u64 || offset + len as u64 > s.values_end {
            return Err(self.corrupt(format!(
                "image of key {key} would be bytes {offset}..{}, outside the values 8192..{}",
                offset + len as u64,
                s.values_end
            )));
        }
        if len > self.max_image_len {
            return Err(self.corrupt(format!(
                "image of key {key} is {len} bytes, more than the {} allowed",
                self.max_image_len
            )));
        }
        if !well_placed(offset, len) {
            return Err(self.corrupt(format!(
                "image of key {key} at byte {offset}, {len} bytes long, straddles a block boundary"
            )));
        }
        if len == 0 && !compressed {
            return Ok(Bytes::new());
        }
        if len == 0 {
            return Err(self.corrupt(format!(
                "image of key {key} is compressed into no bytes at all"
            )));
        }
        let page = PAGE_SZ as u64;
        // Below `values_end`, which `open` bounded by the checksum table's start, a u32.
        let first = (offset / page) as u32;
        let last = ((offset + len as u64 - 1) / page) as u32;
        let table = self.table(access);
        let mut table_block: Option<(u32, BlockLease<'_>)> = None;
        let mut image = Vec::with_capacity(len);
        for blkno in first..=last {
            let (table_blk, slot) = table_slot(blkno);
            let expected = match &table_block {
                Some((held, block)) if *held == table_blk => u32_at(&block[..], slot),
                _ => {
                    let block = self.table_block(&table, table_blk)?;
                    let expected = u32_at(&block[..], slot);
                    table_block = Some((table_blk, block));
                    expected
                }
            };
            let start = if blkno == first {
                (offset % page) as usize
            } else {
                0
            };
            let end = start + (len - image.len()).min(PAGE_SZ - start);
            self.with_value_block(blkno, expected, access, |block| {
                image.extend_from_slice(&block[start..end])
            })?;
        }
        if compressed {
            image = decompress(&image, self.max_image_len)
                .map_err(|e| self.corrupt(format!("image of key {key}: {e}")))?;
        }
        Ok(Bytes::from(image))
    }

    /// Brings the images of `versions` (listed by [`Self::versions_at_lsn`]) into the page
    /// cache ahead of the reads that will need them: their value blocks, merged into runs of
    /// adjacent blocks, each run the cache lacks read with one call, and each block cached
    /// only if it matches its checksum in the table (as a point read caches it). Entries that
    /// are not where the format allows are skipped; their reads will say what is wrong.
    pub fn prefetch_values(&self, versions: &[VersionRef]) -> Result<(), LayerFileError> {
        let page = PAGE_SZ as u64;
        let blocks: Vec<Range<u32>> = versions
            .iter()
            .filter_map(|v| match v.at {
                ValueAt::Image { stored } => {
                    let stored = self.stored(stored);
                    Some((stored.offset, stored.len))
                }
                _ => None,
            })
            .filter(|&(offset, len)| {
                len > 0
                    && len <= self.max_image_len
                    && offset >= page
                    && offset + len as u64 <= self.summary.values_end
                    && well_placed(offset, len)
            })
            .map(|(offset, len)| {
                (offset / page) as u32..((offset + len as u64 - 1) / page) as u32 + 1
            })
            .collect();
        let table = self.table(Access::Point);
        for run in merge_block_runs(blocks) {
            // Each block's checksum, from the table.
            let mut expected = Vec::with_capacity(run.len());
            let mut table_block: Option<(u32, BlockLease<'_>)> = None;
            for blkno in run.clone() {
                let (table_blk, slot) = table_slot(blkno);
                if table_block
                    .as_ref()
                    .is_none_or(|(held, _)| *held != table_blk)
                {
                    table_block = Some((table_blk, self.table_block(&table, table_blk)?));
                }
                let (_, block) = table_block.as_ref().expect("set above");
                expected.push(u32_at(&block[..], slot));
            }
            let check = |blkno: u32, block: &[u8; PAGE_SZ]| {
                utils::crc32c::crc32c(block) == expected[(blkno - run.start) as usize]
            };
            warm_blocks_through_cache(
                self.file.cache(),
                self.file.file(),
                self.file.file_id(),
                self.file.path(),
                run.clone(),
                BlockKind::Value,
                Some(&check),
            )
            .map_err(|e| self.block_error(e))?;
        }
        Ok(())
    }

    /// What the layer contributes to reading `key` at `lsn`: nothing below the layer's LSN or
    /// outside its key range (older layers must be asked); else the key's image, or, for a key
    /// without one, no records at all, and in both cases no older layer need be asked.
    pub fn get(&self, key: Key, lsn: Lsn) -> Result<LayerRecords, LayerFileError> {
        let s = &self.summary;
        if lsn < s.lsn || key < s.key_start || key >= s.key_end {
            return Ok(LayerRecords::default());
        }
        let index = self.index(Access::Point);
        let tree = DiskBtreeReader::new(s.index_root_blk, &index);
        let found = tree.get(&key.to_bytes()).map_err(|e| self.btree_error(e))?;
        let (records, decompressed) = match found {
            Some(stored) => {
                let image = self.read_image(key, stored, Access::Point)?;
                (
                    vec![(s.lsn, Value::Image(image))],
                    self.stored(stored).compressed,
                )
            }
            None => (Vec::new(), false),
        };
        Ok(LayerRecords {
            records,
            complete: true,
            decompressed,
        })
    }

    /// The images of the keys in `[from, end)`, if `lsn` is at or above the layer's LSN, in key
    /// order, at most `max_keys` of them (at least one is asked for), from the index alone: a
    /// scan's next chunk of this layer ([`VersionChunk`]), each image named by its index entry
    /// for [`Self::read_version`]. Below the layer's LSN, none.
    pub fn versions_at_lsn(
        &self,
        from: Key,
        end: Key,
        lsn: Lsn,
        max_keys: usize,
    ) -> Result<VersionChunk, LayerFileError> {
        let max_keys = max_keys.max(1);
        let s = &self.summary;
        let from = from.max(s.key_start);
        let end = end.min(s.key_end);
        let mut chunk = VersionChunk::default();
        if from >= end || lsn < s.lsn {
            return Ok(chunk);
        }
        let index = self.index(Access::Point);
        let tree = DiskBtreeReader::new(s.index_root_blk, &index);
        for entry in tree.iter_from(&from.to_bytes()) {
            let (found, stored) = entry.map_err(|e| self.btree_error(e))?;
            let key = Key::from_bytes(found);
            if key >= end {
                break;
            }
            if chunk.versions.len() == max_keys {
                chunk.resume = Some(key);
                break;
            }
            chunk.versions.push(VersionRef {
                key,
                lsn: s.lsn,
                will_init: true,
                at: ValueAt::Image { stored },
            });
        }
        Ok(chunk)
    }

    /// The image of an entry [`Self::versions_at_lsn`] listed, checked as [`Self::get`] checks
    /// it.
    pub fn read_version(&self, key: Key, stored: u64) -> Result<Value, LayerFileError> {
        Ok(Value::Image(self.read_image(key, stored, Access::Point)?))
    }

    /// Every (key, image) in the file in key order: for verification and dumps. Reads around
    /// the page cache.
    pub fn iter(&self) -> Result<Vec<(Key, Bytes)>, LayerFileError> {
        let index = self.index(Access::Scan);
        let tree = DiskBtreeReader::new(self.summary.index_root_blk, &index);
        let mut out = Vec::new();
        for entry in tree.iter_from(&[0u8; KEY_LEN]) {
            let (found, stored) = entry.map_err(|e| self.btree_error(e))?;
            let key = Key::from_bytes(found);
            out.push((key, self.read_image(key, stored, Access::Scan)?));
        }
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
mod summary;
mod writer;
pub use inspect::{IndexEntry, VerifyReport};
pub use summary::Summary;
pub use writer::{ImageLayerWriter, WrittenLayer};

#[cfg(test)]
mod tests;
