//! Writing an image layer file: images streamed out in key order, placed so that none that
//! fits in a block straddles two, each value block's CRC-32C kept as it fills; then the
//! checksum table, the index (built in memory alongside) and the summary; durable under its
//! final name when `finish` returns (see "Creation is atomic" in the module documentation).
//!
//! Memory: one write chunk, the index being built, and 4 bytes per value block for the table
//! (a sixth of what the index takes for 8 KiB images).

use super::*;

/// What padding is written from.
static ZEROS: [u8; PAGE_SZ] = [0; PAGE_SZ];

/// Writes one image layer file; see the module docs.
pub struct ImageLayerWriter {
    /// Removed if the writer is dropped before `finish`.
    file: LayerFileWriter,
    tenant_id: TenantId,
    timeline_id: TimelineId,
    key_range: Range<Key>,
    lsn: Lsn,
    last_key: Option<Key>,
    tree: DiskBtreeBuilder<KEY_LEN, VecBlockSink>,
    /// The CRC-32C of each value block written whole, in block order.
    block_crcs: Vec<u32>,
    /// The CRC-32C of the part of the current value block written so far.
    partial_crc: u32,
    /// Set by [`ImageLayerWriter::with_compression`]: the file is then of version 2.
    compressor: Option<ValueCompressor>,
}

/// What [`ImageLayerWriter::finish`] made: a durable layer file under its final name.
pub type WrittenLayer = crate::tenant::storage_layer::layer_file::WrittenLayer<Summary>;

impl ImageLayerWriter {
    /// A writer of the image layer of `key_range` at `lsn`, in `dir`.
    pub fn new(
        dir: &Path,
        tenant_id: TenantId,
        timeline_id: TimelineId,
        key_range: Range<Key>,
        lsn: Lsn,
    ) -> Result<ImageLayerWriter, LayerFileError> {
        let temp_name = LayerFileWriter::temp_name("image");
        let refuse = |message| LayerFileError::Usage {
            kind: LayerFileKind::Image,
            path: dir.join(&temp_name),
            message,
        };
        if key_range.start >= key_range.end {
            return Err(refuse(format!(
                "empty key range {}..{}",
                key_range.start, key_range.end
            )));
        }
        if lsn == Lsn::MAX {
            return Err(refuse(format!("the LSN {lsn} is reserved")));
        }
        let file = LayerFileWriter::create(LayerFileKind::Image, dir, &temp_name, "image-layer")?;
        Ok(ImageLayerWriter {
            file,
            tenant_id,
            timeline_id,
            key_range,
            lsn,
            last_key: None,
            tree: DiskBtreeBuilder::new(VecBlockSink::new()),
            block_crcs: Vec::new(),
            partial_crc: 0,
            compressor: None,
        })
    }

    /// Stores the images that are worth it compressed (see `format::compression`), in a
    /// version 2 file; [`Compression::Off`] keeps version 1.
    pub fn with_compression(
        mut self,
        compression: Compression,
    ) -> Result<ImageLayerWriter, LayerFileError> {
        self.compressor = compression
            .compressor()
            .map_err(|e| self.usage(format!("compression {compression}: {e}")))?;
        Ok(self)
    }

    fn usage(&self, message: String) -> LayerFileError {
        LayerFileError::Usage {
            kind: LayerFileKind::Image,
            path: self.file.temp_path().to_owned(),
            message,
        }
    }

    /// Appends the image of `key`. Keys must come in strictly increasing order, within the
    /// layer's key range. A refused image changes nothing: the writer goes on as if it had not
    /// been offered.
    pub fn put_image(&mut self, key: Key, image: &[u8]) -> Result<(), LayerFileError> {
        if !self.key_range.contains(&key) {
            return Err(self.usage(format!(
                "key {key} is outside the layer's key range {}..{}",
                self.key_range.start, self.key_range.end
            )));
        }
        if let Some(last) = self.last_key.filter(|last| key <= *last) {
            return Err(self.usage(format!(
                "key {key} is not after the previous key {last}: keys must be strictly increasing"
            )));
        }
        if image.len() > MAX_IMAGE_LEN {
            return Err(self.usage(format!(
                "image of key {key} is {} bytes, more than the {MAX_IMAGE_LEN} an image layer holds",
                image.len()
            )));
        }
        // Out of the writer while its frame is borrowed, back before returning.
        let mut compressor = self.compressor.take();
        let result = self.put_stored(key, image, compressor.as_mut());
        self.compressor = compressor;
        result
    }

    /// [`Self::put_image`] of a checked image: its frame if `compressor` makes one worth
    /// keeping, else the image.
    fn put_stored(
        &mut self,
        key: Key,
        image: &[u8],
        compressor: Option<&mut ValueCompressor>,
    ) -> Result<(), LayerFileError> {
        let max_offset = match compressor {
            Some(_) => MAX_COMPRESSING_OFFSET,
            None => MAX_IMAGE_OFFSET,
        };
        let (stored, flag) = match compressor.and_then(|c| c.compress(image)) {
            Some(frame) => (frame, COMPRESSED_BIT),
            None => (image, 0),
        };
        let end = self.file.offset();
        let offset = placement(end, stored.len());
        if offset > max_offset {
            return Err(self.usage(format!(
                "image of key {key} would start at byte {offset}, past the {max_offset} an \
                 index entry can hold"
            )));
        }
        self.tree
            .append(&key.to_bytes(), index_value(offset, stored.len()) | flag)
            .map_err(|e| self.usage(format!("key {key}: {e}")))?;
        // Less than a block: the image did not fit in the rest of the current one.
        self.append_values(&ZEROS[..(offset - end) as usize])?;
        self.append_values(stored)?;
        self.last_key = Some(key);
        Ok(())
    }

    /// Appends bytes of the values region, keeping each value block's CRC-32C.
    fn append_values(&mut self, bytes: &[u8]) -> Result<(), LayerFileError> {
        let mut in_block = (self.file.offset() % PAGE_SZ as u64) as usize;
        self.file.append(bytes)?;
        let mut rest = bytes;
        while !rest.is_empty() {
            let n = (PAGE_SZ - in_block).min(rest.len());
            self.partial_crc = utils::crc32c::crc32c_append(self.partial_crc, &rest[..n]);
            rest = &rest[n..];
            in_block += n;
            if in_block == PAGE_SZ {
                self.block_crcs.push(std::mem::take(&mut self.partial_crc));
                in_block = 0;
            }
        }
        Ok(())
    }

    fn block_number(&self, what: &str) -> Result<u32, LayerFileError> {
        let blkno = self.file.offset() / PAGE_SZ as u64;
        u32::try_from(blkno).map_err(|_| self.usage(format!("{what} at block {blkno}: too far")))
    }

    /// Whether no image was put yet.
    pub fn is_empty(&self) -> bool {
        self.last_key.is_none()
    }

    /// The bytes of images and padding written so far: where a writer that cuts its output
    /// into layers of a target size looks.
    pub fn values_bytes(&self) -> u64 {
        self.file.offset()
    }

    /// [`finish`](Self::finish), with the layer's key range ending at `end` instead: a writer
    /// that learns where a layer ends only when the first key past it arrives. `end` must be
    /// above every key put and within the range the writer was made with.
    pub fn finish_before(mut self, end: Key) -> Result<WrittenLayer, LayerFileError> {
        let below_last = self.last_key.is_some_and(|last| end <= last);
        if below_last || end <= self.key_range.start || end > self.key_range.end {
            return Err(self.usage(format!(
                "key range end {end} is not above the last key put, or outside {}..{}",
                self.key_range.start, self.key_range.end
            )));
        }
        self.key_range.end = end;
        self.finish()
    }

    /// Writes the checksum table, the index and the summary, makes the file durable under its
    /// final name, and returns what the manifest needs to list it.
    pub fn finish(mut self) -> Result<WrittenLayer, LayerFileError> {
        let values_end = self.file.offset();
        let in_block = (values_end % PAGE_SZ as u64) as usize;
        if in_block != 0 {
            self.append_values(&ZEROS[in_block..])?;
        }
        let checksums_start_blk = self.block_number("the checksum table")?;
        let crcs = std::mem::take(&mut self.block_crcs);
        for chunk in crcs.chunks(CRCS_PER_BLOCK) {
            let mut block = [0u8; PAGE_SZ];
            for (slot, crc) in block.chunks_exact_mut(4).zip(chunk) {
                slot.copy_from_slice(&crc.to_be_bytes());
            }
            let own = utils::crc32c::crc32c(&block[..TABLE_CRC_OFF]);
            block[TABLE_CRC_OFF..].copy_from_slice(&own.to_be_bytes());
            self.file.append(&block)?;
        }
        let index_start_blk = self.block_number("the index")?;
        let tree = std::mem::replace(&mut self.tree, DiskBtreeBuilder::new(VecBlockSink::new()));
        let (info, blocks) = tree
            .finish()
            .map_err(|e| self.usage(format!("index: {e}")))?;
        for block in blocks.blocks() {
            self.file.append(block)?;
        }
        let summary = Summary {
            tenant_id: self.tenant_id,
            timeline_id: self.timeline_id,
            key_start: self.key_range.start,
            key_end: self.key_range.end,
            format_version: match self.compressor {
                Some(_) => IMAGE_FORMAT_VERSION,
                None => IMAGE_FORMAT_VERSION_PLAIN,
            },
            lsn: self.lsn,
            checksums_start_blk,
            index_start_blk,
            index_root_blk: info.root_blk,
            entries: info.entries,
            values_end,
        };
        let summary_block = summary.encode();
        let name = summary.file_name();
        self.file.commit(&summary_block, summary, &name)
    }
}
