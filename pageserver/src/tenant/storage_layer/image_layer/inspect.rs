//! Looking inside an image layer file, for `pagectl` and for checks that read it whole: the
//! raw index entries, one entry's image, and [`ImageLayer::verify`], which reads every block
//! and checks everything the format promises.

use super::*;
use crate::tenant::storage_layer::layer_file::WRITE_CHUNK;

/// One entry of an image layer's index as stored, for tools that inspect a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    pub key: Key,
    /// Byte offset of the image in the file.
    pub offset: u64,
    /// The stored image's length in bytes (its frame's, if compressed).
    pub len: usize,
    /// The image is stored as one Zstandard frame (a version 2 file's).
    pub compressed: bool,
}

impl ImageLayer {
    fn index_entry(&self, key: &[u8; KEY_LEN], stored: u64) -> IndexEntry {
        let StoredImage {
            offset,
            len,
            compressed,
        } = self.stored(stored);
        IndexEntry {
            key: Key::from_bytes(*key),
            offset,
            len,
            compressed,
        }
    }
}

/// What [`ImageLayer::verify`] read in a sound file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Index entries, each with its image.
    pub entries: u64,
    /// Bytes of images as stored (a compressed one's frame).
    pub image_bytes: u64,
    /// Images stored compressed (a version 2 file's).
    pub compressed: u64,
    /// Zero bytes in the values region that no image holds: before images that would have
    /// straddled a block boundary, and after the last image.
    pub padding_bytes: u64,
    pub value_blocks: u64,
    pub checksum_blocks: u64,
    /// Blocks of the index, from its first block to its root.
    pub index_blocks: u64,
}

impl ImageLayer {
    /// Calls `visitor` with each index entry from `start` on, in key order, until it returns
    /// `false`. Reads only index blocks, each checked as on every read. Returns `Ok(true)` if
    /// every such entry was visited, `Ok(false)` if the visitor stopped early; entries visited
    /// before an error have been visited.
    pub fn visit_index(
        &self,
        start: Key,
        mut visitor: impl FnMut(IndexEntry) -> bool,
    ) -> Result<bool, LayerFileError> {
        let index = self.index(Access::Scan);
        let tree = DiskBtreeReader::new(self.summary.index_root_blk, &index);
        tree.visit_from(&start.to_bytes(), |found, stored| {
            visitor(self.index_entry(found, stored))
        })
        .map_err(|e| self.btree_error(e))
    }

    /// Reads the image `entry` points at, with the checks [`Self::get`] makes: the image lies
    /// within the values, is placed as the format requires, is no longer than allowed, and every
    /// block it spans matches its checksum. An image does not repeat its key, so `entry` should
    /// be one that [`Self::visit_index`] gave: a made-up entry reads whatever bytes it points at.
    pub fn read_entry(&self, entry: &IndexEntry) -> Result<Bytes, LayerFileError> {
        // A version 2 entry's offset leaves the top bit to the compressed flag; a version 1
        // file has no compressed entries.
        let v1 = self.summary.format_version == IMAGE_FORMAT_VERSION_PLAIN;
        let max_offset = if v1 {
            MAX_IMAGE_OFFSET
        } else {
            MAX_COMPRESSING_OFFSET
        };
        if entry.offset > max_offset || entry.len > MAX_IMAGE_LEN || (v1 && entry.compressed) {
            return Err(LayerFileError::Usage {
                kind: LayerFileKind::Image,
                path: self.path().to_owned(),
                message: format!(
                    "no index entry of this version {} file can hold offset {}, length {}{}",
                    self.summary.format_version,
                    entry.offset,
                    entry.len,
                    if entry.compressed { ", compressed" } else { "" }
                ),
            });
        }
        let flag = if entry.compressed { COMPRESSED_BIT } else { 0 };
        self.read_image(
            entry.key,
            index_value(entry.offset, entry.len) | flag,
            Access::Point,
        )
    }

    /// Reads the whole file and checks everything the format promises, returning the first
    /// problem as [`LayerFileError::Corrupt`]. Beyond what every read checks (the summary, each
    /// index node, each image's bounds and placement):
    ///
    /// - the summary block's reserved bytes are zero, and the file has not changed size;
    /// - every checksum table block matches its own checksum, and its unused slots are zero;
    /// - every value block matches its checksum in the table;
    /// - every key lies within the key range, and the index holds as many as the summary says;
    /// - the images lie in key order from byte 8192 to `values_end`, each where the placement
    ///   rule puts it after the one before, and every byte between and after them is zero;
    /// - every compressed image decompresses, to at most the largest image allowed.
    ///
    /// The values are read straight from the file, a chunk at a time, around the page cache.
    pub fn verify(&self) -> Result<VerifyReport, LayerFileError> {
        self.file.check_unread_bytes(&summary::LAYOUT)?;
        let s = self.summary;
        let mut report = VerifyReport {
            value_blocks: u64::from(s.value_blocks()),
            checksum_blocks: u64::from(s.checksum_blocks()),
            index_blocks: u64::from(s.index_root_blk) + 1,
            ..VerifyReport::default()
        };
        let crcs = self.read_checksum_table()?;
        let mut values = ValueStream {
            layer: self,
            crcs: &crcs,
            chunk: Vec::new(),
            chunk_start: PAGE_SZ as u64,
            pos: PAGE_SZ as u64,
        };
        let index = self.index(Access::Scan);
        let tree = DiskBtreeReader::new(s.index_root_blk, &index);
        for entry in tree.iter_from(&[0u8; KEY_LEN]) {
            let (found, stored) = entry.map_err(|e| self.btree_error(e))?;
            let e = self.index_entry(&found, stored);
            if e.key < s.key_start || e.key >= s.key_end {
                return Err(self.corrupt(format!(
                    "key {} lies outside the layer's key range {}..{}",
                    e.key, s.key_start, s.key_end
                )));
            }
            let expected = placement(values.pos, e.len);
            if e.offset != expected {
                return Err(self.corrupt(format!(
                    "image of key {} starts at byte {}, but the placement rule puts it at \
                     {expected}, after the previous image",
                    e.key, e.offset
                )));
            }
            if e.offset + e.len as u64 > s.values_end || e.len > self.max_image_len {
                return Err(self.corrupt(format!(
                    "image of key {} at byte {}, {} bytes long, is not within the values or is \
                     longer than {} bytes",
                    e.key, e.offset, e.len, self.max_image_len
                )));
            }
            report.padding_bytes += values.skip_zeros(e.offset)?;
            if e.compressed {
                let frame = values.take_image(e.len)?;
                decompress(&frame, self.max_image_len)
                    .map_err(|err| self.corrupt(format!("image of key {}: {err}", e.key)))?;
                report.compressed += 1;
            } else {
                values.skip_image(e.len)?;
            }
            report.entries += 1;
            report.image_bytes += e.len as u64;
        }
        if values.pos != s.values_end {
            return Err(self.corrupt(format!(
                "the images end at byte {}, the summary says {}",
                values.pos, s.values_end
            )));
        }
        report.padding_bytes +=
            values.skip_zeros(u64::from(s.checksums_start_blk) * PAGE_SZ as u64)?;
        if report.entries != s.entries {
            return Err(self.corrupt(format!(
                "index holds {} entries, the summary says {}",
                report.entries, s.entries
            )));
        }
        Ok(report)
    }

    /// The CRC-32C of every value block, from the checksum table, each table block checked.
    fn read_checksum_table(&self) -> Result<Vec<u32>, LayerFileError> {
        let s = &self.summary;
        let value_blocks = s.value_blocks() as usize;
        let table = self.table(Access::Scan);
        let mut crcs = Vec::with_capacity(value_blocks);
        for table_blk in 0..s.checksum_blocks() {
            let block = self.table_block(&table, table_blk)?;
            let used = (value_blocks - crcs.len()).min(CRCS_PER_BLOCK);
            crcs.extend((0..used).map(|slot| u32_at(&block[..], slot * 4)));
            if let Some(at) = block[used * 4..TABLE_CRC_OFF].iter().position(|b| *b != 0) {
                return Err(self.corrupt(format!(
                    "checksum table block {}: byte {} past its last checksum is not zero",
                    s.checksums_start_blk + table_blk,
                    used * 4 + at
                )));
            }
        }
        Ok(crcs)
    }
}

/// The values region read front to back, a chunk of whole blocks at a time, each block
/// checked against its CRC-32C as it is read.
struct ValueStream<'a> {
    layer: &'a ImageLayer,
    crcs: &'a [u32],
    /// Blocks from byte `chunk_start` on.
    chunk: Vec<u8>,
    chunk_start: u64,
    /// Where the next byte to check is.
    pos: u64,
}

impl ValueStream<'_> {
    /// The bytes from `pos` to the end of the chunk, reading the next chunk if `pos` is past
    /// the current one.
    fn next_bytes(&mut self) -> Result<&[u8], LayerFileError> {
        let page = PAGE_SZ as u64;
        if self.pos >= self.chunk_start + self.chunk.len() as u64 {
            let first = self.pos / page;
            // `pos` stays below the table's start, so there is a block left to read.
            let blocks = (self.crcs.len() as u64 + 1 - first).min((WRITE_CHUNK / PAGE_SZ) as u64);
            self.chunk.resize(blocks as usize * PAGE_SZ, 0);
            self.chunk_start = first * page;
            self.layer
                .file
                .read_exact_at(&mut self.chunk, self.chunk_start)?;
            for (i, block) in self.chunk.chunks_exact(PAGE_SZ).enumerate() {
                let blkno = first + i as u64;
                let expected = self.crcs[blkno as usize - 1];
                let computed = utils::crc32c::crc32c(block);
                if computed != expected {
                    return Err(self.layer.corrupt(format!(
                        "value block {blkno}: checksum mismatch: the table says \
                         {expected:#010x}, the block's is {computed:#010x}"
                    )));
                }
            }
        }
        Ok(&self.chunk[(self.pos - self.chunk_start) as usize..])
    }

    /// Reads up to byte `end`, which must all be zero; returns how many bytes that was.
    fn skip_zeros(&mut self, end: u64) -> Result<u64, LayerFileError> {
        let skipped = end - self.pos;
        while self.pos < end {
            let n = (end - self.pos) as usize;
            let pos = self.pos;
            let bytes = self.next_bytes()?;
            let n = n.min(bytes.len());
            if let Some(at) = bytes[..n].iter().position(|b| *b != 0) {
                return Err(self.layer.corrupt(format!(
                    "byte {} of the values region is not zero, but no image holds it",
                    pos + at as u64
                )));
            }
            self.pos += n as u64;
        }
        Ok(skipped)
    }

    /// The `len` bytes of a stored image, which the block checksums vouch for.
    fn take_image(&mut self, len: usize) -> Result<Vec<u8>, LayerFileError> {
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            let bytes = self.next_bytes()?;
            let n = (len - out.len()).min(bytes.len());
            out.extend_from_slice(&bytes[..n]);
            self.pos += n as u64;
        }
        Ok(out)
    }

    /// Reads an image of `len` bytes, which the block checksums vouch for.
    fn skip_image(&mut self, len: usize) -> Result<(), LayerFileError> {
        let end = self.pos + len as u64;
        while self.pos < end {
            let n = ((end - self.pos) as usize).min(self.next_bytes()?.len());
            self.pos += n as u64;
        }
        Ok(())
    }
}
