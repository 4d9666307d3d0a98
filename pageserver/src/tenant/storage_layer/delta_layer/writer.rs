//! Writing a delta layer file: values streamed out in (key, LSN) order, the index built in
//! memory alongside, then the summary; durable under its final name when `finish` returns (see
//! "Creation is atomic" in the `delta_layer` module documentation).
//!
//! An [undated](DeltaLayerWriter::new_undated) writer takes versions whose one LSN is not known
//! yet (an import's, dated by the end of its input): it keeps each key's value offset in
//! memory, about 32 bytes a version, and builds the index only when
//! [`finish_at`](DeltaLayerWriter::finish_at) gives the LSN. The file is the same either way.

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
    index: Index,
    /// Set by [`DeltaLayerWriter::with_compression`]: the file is then of version 2.
    compressor: Option<ValueCompressor>,
    /// The bytes the values written so far would take stored as they are.
    plain_bytes: u64,
}

enum Index {
    /// Built as the values stream out: their LSNs are known.
    Building(DiskBtreeBuilder<INDEX_KEY_LEN, VecBlockSink>),
    /// An undated writer's keys, strictly increasing, each with its index value (the blob's
    /// offset << 1 | will_init); the index is built from them once the LSN is known.
    Undated(Vec<(Key, u64)>),
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
    ) -> Result<DeltaLayerWriter, LayerFileError> {
        let temp_name = LayerFileWriter::temp_name("delta");
        if lsn_start >= lsn_end {
            return Err(LayerFileError::Usage {
                kind: LayerFileKind::Delta,
                path: dir.join(temp_name),
                message: format!("empty LSN range {lsn_start}..{lsn_end}"),
            });
        }
        let file = LayerFileWriter::create(LayerFileKind::Delta, dir, &temp_name, "layer")?;
        Ok(DeltaLayerWriter {
            file,
            tenant_id,
            timeline_id,
            lsn_start,
            lsn_end,
            first_key: None,
            last_key: None,
            scratch: Vec::new(),
            index: Index::Building(DiskBtreeBuilder::new(VecBlockSink::new())),
            compressor: None,
            plain_bytes: 0,
        })
    }

    /// A writer of one version per key, all at one LSN that [`Self::finish_at`] gives: values
    /// go in with [`Self::put_undated`], in strictly increasing key order.
    pub fn new_undated(
        dir: &Path,
        tenant_id: TenantId,
        timeline_id: TimelineId,
    ) -> Result<DeltaLayerWriter, LayerFileError> {
        let file = LayerFileWriter::create(
            LayerFileKind::Delta,
            dir,
            &LayerFileWriter::temp_name("delta"),
            "layer",
        )?;
        Ok(DeltaLayerWriter {
            file,
            tenant_id,
            timeline_id,
            // Set by finish_at.
            lsn_start: Lsn(0),
            lsn_end: Lsn(1),
            first_key: None,
            last_key: None,
            scratch: Vec::new(),
            index: Index::Undated(Vec::new()),
            compressor: None,
            plain_bytes: 0,
        })
    }

    /// Stores the values that are worth it compressed (see `format::compression`), in a
    /// version 2 file; [`Compression::Off`] keeps version 1.
    pub fn with_compression(
        mut self,
        compression: Compression,
    ) -> Result<DeltaLayerWriter, LayerFileError> {
        self.compressor = compression
            .compressor()
            .map_err(|e| self.usage(format!("compression {compression}: {e}")))?;
        Ok(self)
    }

    fn usage(&self, message: String) -> LayerFileError {
        LayerFileError::Usage {
            kind: LayerFileKind::Delta,
            path: self.file.temp_path().to_owned(),
            message,
        }
    }

    /// Bytes of values written so far (the file will be this plus its index and summary).
    pub fn values_bytes(&self) -> u64 {
        self.file.offset()
    }

    /// [`Self::values_bytes`] as if no value were compressed: what the values are, whatever the
    /// setting (an import's report counts this).
    pub fn plain_values_bytes(&self) -> u64 {
        self.plain_bytes
    }

    /// Whether an undated writer holds `key` (a binary search of its keys).
    pub fn holds_undated(&self, key: Key) -> bool {
        match &self.index {
            Index::Undated(entries) => entries.binary_search_by_key(&key, |(k, _)| *k).is_ok(),
            Index::Building(_) => false,
        }
    }

    /// The first key put so far.
    pub fn first_key(&self) -> Option<Key> {
        self.first_key
    }

    /// The last key put so far.
    pub fn last_key(&self) -> Option<Key> {
        self.last_key
    }

    /// Appends version `lsn` of `key`. Calls must come in strictly increasing (key, lsn) order.
    pub fn put_value(&mut self, key: Key, lsn: Lsn, value: &Value) -> Result<(), LayerFileError> {
        let serialized = self.serialize(key, value, &lsn.to_string())?;
        let result = self.put_serialized(key, lsn, &serialized, value.will_init());
        self.scratch = serialized;
        result
    }

    /// [`Self::put_value`] of a value already in its byte format (checked by the caller with
    /// [`Value::check_serialized`], which also says whether it will init): the bytes are copied
    /// as they are, with no decoding and encoding on the way. A flush copies the ephemeral
    /// file's blobs so, since they are byte for byte what this file stores.
    pub fn put_serialized(
        &mut self,
        key: Key,
        lsn: Lsn,
        serialized: &[u8],
        will_init: bool,
    ) -> Result<(), LayerFileError> {
        if lsn < self.lsn_start || lsn >= self.lsn_end {
            return Err(self.usage(format!(
                "LSN {lsn} of key {key} is outside the layer's range {}..{}",
                self.lsn_start, self.lsn_end
            )));
        }
        let Index::Building(tree) = &mut self.index else {
            return Err(self.usage(format!("key {key} at {lsn}: the writer is undated")));
        };
        let entry = (self.file.offset() << 1) | will_init_bit(will_init);
        // The index checks the order; nothing is written before it accepts the key.
        if let Err(e) = tree.append(&index_key(key, lsn), entry) {
            return Err(self.usage(format!("key {key} at {lsn}: {e}")));
        }
        self.append_blob(key, serialized, &lsn.to_string())
    }

    /// Appends the version of `key` of an undated writer. Keys must strictly increase.
    pub fn put_undated(&mut self, key: Key, value: &Value) -> Result<(), LayerFileError> {
        let last = self.last_key;
        let Index::Undated(_) = &self.index else {
            return Err(self.usage(format!("key {key}: the writer is dated")));
        };
        if last.is_some_and(|last| key <= last) {
            return Err(self.usage(format!(
                "key {key} does not follow the previous key {}",
                last.expect("checked")
            )));
        }
        let serialized = self.serialize(key, value, "the undated LSN")?;
        let entry = (self.file.offset() << 1) | will_init_bit(value.will_init());
        if let Index::Undated(entries) = &mut self.index {
            entries.push((key, entry));
        }
        let result = self.append_blob(key, &serialized, "the undated LSN");
        self.scratch = serialized;
        result
    }

    /// `value` in its byte format, in the writer's scratch buffer (taken out of the writer
    /// until the caller gives it back, so that the writer can append it).
    fn serialize(&mut self, key: Key, value: &Value, at: &str) -> Result<Vec<u8>, LayerFileError> {
        let mut out = std::mem::take(&mut self.scratch);
        out.clear();
        if let Err(e) = value.serialize_into(&mut out) {
            return Err(self.usage(format!("value of key {key} at {at}: {e}")));
        }
        Ok(out)
    }

    /// Writes a value's bytes as the next blob (compressed, if the writer compresses and the
    /// frame is worth keeping), followed by the CRC-32C of the stored bytes.
    fn append_blob(&mut self, key: Key, serialized: &[u8], at: &str) -> Result<(), LayerFileError> {
        let frame = self
            .compressor
            .as_mut()
            .and_then(|c| c.compress(serialized));
        let (kind, stored): (&[u8], &[u8]) = match frame {
            Some(frame) => (&[COMPRESSED_VALUE_KIND], frame),
            None => (&[], serialized),
        };
        let plain_blob = serialized.len() + VALUE_CRC_LEN;
        if let Ok(plain_header) = BlobHeader::new(plain_blob) {
            self.plain_bytes += (plain_header.encoded_len() + plain_blob) as u64;
        }
        let crc = utils::crc32c::crc32c_append(utils::crc32c::crc32c(kind), stored);
        let header = match BlobHeader::new(kind.len() + stored.len() + VALUE_CRC_LEN) {
            Ok(header) => header,
            Err(e) => {
                let message = format!("value of key {key} at {at}: {e}");
                return Err(self.usage(message));
            }
        };
        self.file.append(header.as_bytes())?;
        self.file.append(kind)?;
        self.file.append(stored)?;
        self.file.append(&crc.to_be_bytes())?;
        self.first_key.get_or_insert(key);
        self.last_key = Some(key);
        Ok(())
    }

    /// Dates an undated writer's versions at `lsn` (the layer's range is `[range_start, lsn +
    /// 1)`: an import's files cover the LSNs from its base on, see `timeline::import`) and
    /// finishes it as [`Self::finish`] does.
    pub fn finish_at(mut self, range_start: Lsn, lsn: Lsn) -> Result<WrittenLayer, LayerFileError> {
        let Index::Undated(entries) = std::mem::replace(
            &mut self.index,
            Index::Building(DiskBtreeBuilder::new(VecBlockSink::new())),
        ) else {
            return Err(self.usage(format!("dated at {lsn}: the writer is not undated")));
        };
        let Some(lsn_end) = lsn.0.checked_add(1).map(Lsn) else {
            return Err(self.usage(format!("LSN {lsn} leaves no room for the layer's end")));
        };
        if range_start > lsn {
            return Err(self.usage(format!(
                "dated at {lsn}, below its range's start {range_start}"
            )));
        }
        (self.lsn_start, self.lsn_end) = (range_start, lsn_end);
        let Index::Building(tree) = &mut self.index else {
            unreachable!("just set");
        };
        for (key, entry) in entries {
            if let Err(e) = tree.append(&index_key(key, lsn), entry) {
                let message = format!("key {key} at {lsn}: {e}");
                return Err(self.usage(message));
            }
        }
        self.finish()
    }

    /// Writes the index and summary, makes the file durable under its final name, and returns
    /// what the manifest needs to list it.
    pub fn finish(mut self) -> Result<WrittenLayer, LayerFileError> {
        let (Some(first), Some(last)) = (self.first_key, self.last_key) else {
            return Err(self.usage("a delta layer needs at least one value".to_owned()));
        };
        let tree = match std::mem::replace(&mut self.index, Index::Undated(Vec::new())) {
            Index::Building(tree) => tree,
            Index::Undated(_) => {
                return Err(self.usage("an undated writer is finished by finish_at".to_owned()))
            }
        };
        let values_end = self.file.offset();
        let index_start = values_end.div_ceil(PAGE_SZ as u64);
        let index_start_blk = u32::try_from(index_start)
            .map_err(|_| self.usage(format!("values end at byte {values_end}: file too large")))?;
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
            format_version: match self.compressor {
                Some(_) => DELTA_FORMAT_VERSION,
                None => DELTA_FORMAT_VERSION_PLAIN,
            },
            lsn_start: self.lsn_start,
            lsn_end: self.lsn_end,
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

fn will_init_bit(will_init: bool) -> u64 {
    if will_init {
        WILL_INIT_BIT
    } else {
        0
    }
}
