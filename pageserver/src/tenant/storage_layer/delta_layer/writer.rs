//! Writing a delta layer file: values streamed out in (key, LSN) order, the index built in
//! memory alongside, then the summary; durable under its final name when `finish` returns (see
//! "Creation is atomic" in the `delta_layer` module documentation).

use super::*;

/// Writes one delta layer file; see the module docs.
pub struct DeltaLayerWriter {
    /// Removed if the writer is dropped before `finish`.
    file: LayerFileWriter,
    tenant_id: TenantId,
    timeline_id: TimelineId,
    lsn_start: Lsn,
    lsn_end: Lsn,
    first_key: Option<Key>,
    last_key: Option<Key>,
    scratch: Vec<u8>,
    tree: DiskBtreeBuilder<INDEX_KEY_LEN, VecBlockSink>,
}

/// What [`DeltaLayerWriter::finish`] made: a durable layer file under its final name.
pub type WrittenLayer = crate::tenant::storage_layer::layer_file::WrittenLayer<Summary>;

impl DeltaLayerWriter {
    pub fn new(
        dir: &Path,
        tenant_id: TenantId,
        timeline_id: TimelineId,
        lsn_start: Lsn,
        lsn_end: Lsn,
    ) -> Result<DeltaLayerWriter, DeltaLayerError> {
        let temp_name = LayerFileWriter::temp_name("delta");
        if lsn_start >= lsn_end {
            return Err(DeltaLayerError::Usage {
                path: dir.join(temp_name),
                message: format!("empty LSN range {lsn_start}..{lsn_end}"),
            });
        }
        let file = LayerFileWriter::create(dir, &temp_name, "layer")?;
        Ok(DeltaLayerWriter {
            file,
            tenant_id,
            timeline_id,
            lsn_start,
            lsn_end,
            first_key: None,
            last_key: None,
            scratch: Vec::new(),
            tree: DiskBtreeBuilder::new(VecBlockSink::new()),
        })
    }

    fn usage(&self, message: String) -> DeltaLayerError {
        DeltaLayerError::Usage {
            path: self.file.temp_path().to_owned(),
            message,
        }
    }

    /// Bytes of values written so far (the file will be this plus its index and summary).
    pub fn values_bytes(&self) -> u64 {
        self.file.offset()
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
        let offset = self.file.offset();
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
        self.file.append(header.as_bytes())?;
        self.file.append(&self.scratch)?;
        self.first_key.get_or_insert(key);
        self.last_key = Some(key);
        Ok(())
    }

    /// Writes the index and summary, makes the file durable under its final name, and returns
    /// what the manifest needs to list it.
    pub fn finish(mut self) -> Result<WrittenLayer, DeltaLayerError> {
        let (Some(first), Some(last)) = (self.first_key, self.last_key) else {
            return Err(self.usage("a delta layer needs at least one value".to_owned()));
        };
        let values_end = self.file.offset();
        let index_start = values_end.div_ceil(PAGE_SZ as u64);
        let index_start_blk = u32::try_from(index_start)
            .map_err(|_| self.usage(format!("values end at byte {values_end}: file too large")))?;
        let tree = std::mem::replace(&mut self.tree, DiskBtreeBuilder::new(VecBlockSink::new()));
        let (info, blocks) = tree
            .finish()
            .map_err(|e| self.usage(format!("index: {e}")))?;
        // The values' last block is padded with zeros up to the index.
        self.file.pad_to_block()?;
        for block in blocks.blocks() {
            self.file.append(block)?;
        }
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
        let name = summary.file_name();
        Ok(self.file.commit(&summary_block, summary, &name)?)
    }
}
