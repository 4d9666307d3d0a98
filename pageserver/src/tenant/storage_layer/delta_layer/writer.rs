//! Writing a delta layer file: values streamed out in (key, LSN) order, the index built in
//! memory alongside, then the summary; durable under its final name when `finish` returns (see
//! "Creation is atomic" in the `delta_layer` module documentation).

use super::*;

/// Writes one delta layer file; see the module docs.
pub struct DeltaLayerWriter {
    /// Removed if the writer is dropped before `finish`.
    file: StagedFile,
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
        let temp_name = format!("delta-{}-{serial}{TEMP_SUFFIX}", std::process::id());
        if lsn_start >= lsn_end {
            return Err(DeltaLayerError::Usage {
                path: dir.join(temp_name),
                message: format!("empty LSN range {lsn_start}..{lsn_end}"),
            });
        }
        let file = StagedFile::create(dir, &temp_name, "layer").map_err(DeltaLayerError::from)?;
        Ok(DeltaLayerWriter {
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
        })
    }

    fn io_error(&self, source: io::Error) -> DeltaLayerError {
        DeltaLayerError::Io {
            path: self.file.temp_path().to_owned(),
            source,
        }
    }

    fn usage(&self, message: String) -> DeltaLayerError {
        DeltaLayerError::Usage {
            path: self.file.temp_path().to_owned(),
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
            .file()
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
                .file()
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
            .file()
            .write_all_at(&summary_block[..], 0)
            .map_err(|e| self.io_error(e))?;
        let crc32c = crc32c::crc32c_combine(
            crc32c::crc32c(&summary_block[..]),
            self.crc_after_summary,
            usize::try_from(size - PAGE_SZ as u64)
                .map_err(|_| self.usage(format!("a file of {size} bytes")))?,
        );
        let path = self.file.commit(&summary.file_name())?;
        Ok(WrittenLayer {
            path,
            summary,
            size,
            crc32c,
        })
    }
}
