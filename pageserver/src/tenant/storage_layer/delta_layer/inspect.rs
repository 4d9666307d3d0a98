//! Looking inside a delta layer file, for `pagectl` and for checks that read it whole: the raw
//! index entries, one entry's value, and [`DeltaLayer::verify`], which reads every index node
//! and every value and checks everything the format promises.

use super::*;

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
    /// Values that are PostgreSQL WAL records.
    pub wal_records: u64,
    /// Blocks of the index, from its first block to its root.
    pub index_blocks: u64,
    /// Bytes of stored values (a compressed one as stored), without blob headers and checksums.
    pub value_bytes: u64,
    /// Values stored compressed (a version 2 file's).
    pub compressed: u64,
}

impl DeltaLayer {
    /// Calls `visitor` with each index entry from the first version of `start` on, in (key, lsn)
    /// order, until it returns `false`. Reads only index blocks, each checked as on every read.
    /// Returns `Ok(true)` if every such entry was visited, `Ok(false)` if the visitor stopped
    /// early; entries visited before an error have been visited.
    pub fn visit_index(
        &self,
        start: Key,
        mut visitor: impl FnMut(IndexEntry) -> bool,
    ) -> Result<bool, LayerFileError> {
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
    pub fn read_entry(&self, entry: &IndexEntry) -> Result<Value, LayerFileError> {
        if entry.offset > u64::MAX >> 1 {
            return Err(LayerFileError::Usage {
                kind: LayerFileKind::Delta,
                path: self.path().to_owned(),
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
    /// problem as [`LayerFileError::Corrupt`]. Beyond what every read checks (the summary, each
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
    pub fn verify(&self) -> Result<VerifyReport, LayerFileError> {
        self.file.check_unread_bytes(&summary::LAYOUT)?;
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
                report.compressed += u64::from(buf.first() == Some(&COMPRESSED_VALUE_KIND));
                match value {
                    Value::Image(_) => report.images += 1,
                    Value::Delta { .. } => report.deltas += 1,
                    Value::WalRecord { .. } => report.wal_records += 1,
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
        Ok(report)
    }
}
