//! The in-memory layer: the newest page versions of a timeline, before they are flushed to a
//! delta layer file.
//!
//! Values are serialized (`pageserver_api::Value`'s stable format) into the layer's
//! [`EphemeralFile`]; only a compact index stays in memory:
//!
//! ```text
//!   heads: Key -> newest entry of that key          (one per distinct key)
//!
//!   entry i:  lsns[i]        u64   the version's LSN
//!             positions[i]   u64   offset of its blob in the ephemeral file << 1 | will_init
//!             older[i]       u32   the previous (older) entry of the same key, or NONE
//! ```
//!
//! Each indexed value costs 20 bytes (three parallel vectors, no padding) plus its key's share
//! of one hash map entry. A key's versions form a chain from newest to oldest, because puts
//! arrive in LSN order: a lookup at LSN L skips the versions above L and collects the rest until
//! a version that needs no older history (an image or a `will_init` delta).
//!
//! # Lifecycle
//!
//! ```text
//!   open --freeze(end_lsn)--> frozen --(delta layer written)--> dropped
//!    put, get                  get, iter_sorted
//! ```
//!
//! A layer covers `[start_lsn, end_lsn)`. Puts must come in non-decreasing LSN order and within
//! that range; the same key at the same LSN twice is refused, since reconstruction would be
//! ambiguous. A refused put changes nothing.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use pageserver_api::value::ValueDecodeError;
use pageserver_api::{Key, Value};
use utils::Lsn;

use crate::page_cache::PageCache;
use crate::tenant::blob_io::{BlobReadError, BlockCursor};
use crate::tenant::delta_layer::{DeltaLayerError, DeltaLayerWriter, Summary};
use crate::tenant::ephemeral_file::{EphemeralFile, EphemeralWriteError};
use crate::tenant::storage_layer::max_stored_value_len;
pub use crate::tenant::storage_layer::LayerRecords;

const NONE: u32 = u32::MAX;
const WILL_INIT_BIT: u64 = 1;

#[derive(Debug, thiserror::Error)]
pub enum PutError {
    #[error("LSN {lsn} of key {key} goes backwards: the layer is already at {last}")]
    LsnBackwards { key: Key, lsn: Lsn, last: Lsn },
    #[error("LSN {lsn} is outside the layer's range starting at {start}")]
    OutOfRange { lsn: Lsn, start: Lsn },
    #[error("key {key} already has a version at LSN {lsn}")]
    Duplicate { key: Key, lsn: Lsn },
    #[error("the layer is frozen at {end}; it takes no more puts")]
    Frozen { end: Lsn },
    #[error("value of key {key} at {lsn} cannot be encoded: {reason}")]
    Encode { key: Key, lsn: Lsn, reason: String },
    #[error("value of key {key} at {lsn} takes {len} bytes stored, over the limit of {max}")]
    TooLarge {
        key: Key,
        lsn: Lsn,
        len: usize,
        max: usize,
    },
    #[error("the layer is full: it holds {max} values")]
    Full { max: usize },
    #[error(transparent)]
    Write(#[from] EphemeralWriteError),
}

#[derive(Debug, thiserror::Error)]
pub enum GetError {
    #[error(transparent)]
    Read(#[from] BlobReadError),
    #[error("value of key {key} at {lsn} in the ephemeral file is corrupt: {source}")]
    Corrupt {
        key: Key,
        lsn: Lsn,
        source: ValueDecodeError,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum WriteToDiskError {
    #[error("only a frozen layer can be written to disk")]
    NotFrozen,
    #[error(transparent)]
    Read(#[from] GetError),
    #[error(transparent)]
    Write(#[from] DeltaLayerError),
}

#[derive(Debug, thiserror::Error)]
pub enum FreezeError {
    #[error("cannot freeze at {end}: the layer holds versions up to {last}")]
    EndTooLow { end: Lsn, last: Lsn },
    #[error("the layer is already frozen at {end}")]
    AlreadyFrozen { end: Lsn },
}

/// See the module documentation.
pub struct InMemoryLayer {
    file: EphemeralFile,
    start_lsn: Lsn,
    end_lsn: Option<Lsn>,
    /// The highest LSN put so far (`start_lsn` while empty).
    last_lsn: Lsn,
    heads: HashMap<Key, u32>,
    lsns: Vec<Lsn>,
    positions: Vec<u64>,
    older: Vec<u32>,
    /// Reused for serializing values.
    scratch: Vec<u8>,
    max_value_size: usize,
}

impl InMemoryLayer {
    /// A new, empty layer starting at `start_lsn`, its values in a new ephemeral file in
    /// `timeline_dir`.
    pub fn create(
        timeline_dir: &Path,
        cache: Arc<PageCache>,
        start_lsn: Lsn,
        max_value_size: usize,
    ) -> std::io::Result<InMemoryLayer> {
        Ok(InMemoryLayer {
            file: EphemeralFile::create(timeline_dir, cache)?,
            start_lsn,
            end_lsn: None,
            last_lsn: start_lsn,
            heads: HashMap::new(),
            lsns: Vec::new(),
            positions: Vec::new(),
            older: Vec::new(),
            scratch: Vec::new(),
            max_value_size,
        })
    }

    pub fn start_lsn(&self) -> Lsn {
        self.start_lsn
    }

    /// The exclusive end of the layer's range once frozen.
    pub fn end_lsn(&self) -> Option<Lsn> {
        self.end_lsn
    }

    /// The highest LSN put so far.
    pub fn last_lsn(&self) -> Lsn {
        self.last_lsn
    }

    /// Number of values indexed.
    pub fn len(&self) -> usize {
        self.lsns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lsns.is_empty()
    }

    /// Bytes of values written to the ephemeral file (what `checkpoint_distance` compares with).
    pub fn bytes_written(&self) -> u64 {
        self.file.len()
    }

    pub fn distinct_keys(&self) -> usize {
        self.heads.len()
    }

    /// Heap bytes held by the index: the three entry vectors and the key map, by capacity.
    pub fn index_bytes(&self) -> usize {
        use std::mem::size_of;
        let entries = self.lsns.capacity() * size_of::<Lsn>()
            + self.positions.capacity() * size_of::<u64>()
            + self.older.capacity() * size_of::<u32>();
        // A hash map bucket holds the (key, head) pair plus one control byte.
        let map = self.heads.capacity() * (size_of::<(Key, u32)>() + 1);
        entries + map
    }

    /// Adds version `lsn` of `key`.
    pub fn put(&mut self, key: Key, lsn: Lsn, value: &Value) -> Result<(), PutError> {
        if let Some(end) = self.end_lsn {
            return Err(PutError::Frozen { end });
        }
        if lsn < self.start_lsn {
            return Err(PutError::OutOfRange {
                lsn,
                start: self.start_lsn,
            });
        }
        if lsn < self.last_lsn {
            return Err(PutError::LsnBackwards {
                key,
                lsn,
                last: self.last_lsn,
            });
        }
        let head = self.heads.get(&key).copied().unwrap_or(NONE);
        if head != NONE && self.lsns[head as usize] == lsn {
            return Err(PutError::Duplicate { key, lsn });
        }
        let index = u32::try_from(self.lsns.len())
            .ok()
            .filter(|i| *i != NONE)
            .ok_or(PutError::Full { max: NONE as usize })?;
        self.scratch.clear();
        value
            .serialize_into(&mut self.scratch)
            .map_err(|e| PutError::Encode {
                key,
                lsn,
                reason: e.to_string(),
            })?;
        if self.scratch.len() > self.max_stored_len() {
            return Err(PutError::TooLarge {
                key,
                lsn,
                len: self.scratch.len(),
                max: self.max_stored_len(),
            });
        }
        let offset = self.file.write_blob(&self.scratch)?;
        self.lsns.push(lsn);
        self.positions
            .push((offset << 1) | if value.will_init() { WILL_INIT_BIT } else { 0 });
        self.older.push(head);
        self.heads.insert(key, index);
        self.last_lsn = lsn;
        Ok(())
    }

    /// The versions of `key` at or below `lsn` that reconstruction needs, newest first, down to
    /// the first one that needs no older history.
    pub fn get(&self, key: Key, lsn: Lsn) -> Result<LayerRecords, GetError> {
        let mut result = LayerRecords::default();
        let cursor = self.cursor();
        let mut buf = Vec::new();
        let mut entry = self.heads.get(&key).copied().unwrap_or(NONE);
        while entry != NONE {
            let i = entry as usize;
            entry = self.older[i];
            let version_lsn = self.lsns[i];
            if version_lsn > lsn {
                continue;
            }
            let position = self.positions[i];
            cursor.read_blob_into_buf(position >> 1, &mut buf)?;
            let value = Value::deserialize(&buf).map_err(|source| GetError::Corrupt {
                key,
                lsn: version_lsn,
                source,
            })?;
            result.records.push((version_lsn, value));
            if position & WILL_INIT_BIT != 0 {
                result.complete = true;
                break;
            }
        }
        Ok(result)
    }

    /// Closes the layer's range at `end_lsn` (exclusive): no more puts.
    pub fn freeze(&mut self, end_lsn: Lsn) -> Result<(), FreezeError> {
        if let Some(end) = self.end_lsn {
            return Err(FreezeError::AlreadyFrozen { end });
        }
        if !self.is_empty() && end_lsn <= self.last_lsn {
            return Err(FreezeError::EndTooLow {
                end: end_lsn,
                last: self.last_lsn,
            });
        }
        self.end_lsn = Some(end_lsn);
        Ok(())
    }

    /// Every indexed value in (key, lsn) order, read back through the ephemeral file's block
    /// reader: the input of a delta layer writer.
    pub fn iter_sorted(&self) -> impl Iterator<Item = Result<(Key, Lsn, Value), GetError>> + '_ {
        let mut keys: Vec<(Key, u32)> = self.heads.iter().map(|(k, h)| (*k, *h)).collect();
        keys.sort_unstable_by_key(|(k, _)| *k);
        keys.into_iter().flat_map(move |(key, head)| {
            // The chain runs newest to oldest; emit oldest first.
            let mut chain = Vec::new();
            let mut entry = head;
            while entry != NONE {
                chain.push(entry as usize);
                entry = self.older[entry as usize];
            }
            chain.into_iter().rev().map(move |i| {
                let lsn = self.lsns[i];
                let blob = self.cursor().read_blob(self.positions[i] >> 1)?;
                let value = Value::deserialize(&blob).map_err(|source| GetError::Corrupt {
                    key,
                    lsn,
                    source,
                })?;
                Ok((key, lsn, value))
            })
        })
    }

    /// Writes the frozen layer as one L0 delta layer file covering all its keys and
    /// `[start_lsn, end_lsn)`, reading the values back in (key, lsn) order through the
    /// ephemeral file's block reader. Returns `None` for an empty layer.
    pub fn write_to_disk(
        &self,
        timeline_dir: &Path,
        tenant_id: utils::TenantId,
        timeline_id: utils::TimelineId,
    ) -> Result<Option<(std::path::PathBuf, Summary)>, WriteToDiskError> {
        let Some(end_lsn) = self.end_lsn else {
            return Err(WriteToDiskError::NotFrozen);
        };
        if self.is_empty() {
            return Ok(None);
        }
        let mut writer = DeltaLayerWriter::new(
            timeline_dir,
            tenant_id,
            timeline_id,
            self.start_lsn,
            end_lsn,
        )?;
        for entry in self.iter_sorted() {
            let (key, lsn, value) = entry?;
            writer.put_value(key, lsn, &value)?;
        }
        Ok(Some(writer.finish()?))
    }

    fn max_stored_len(&self) -> usize {
        max_stored_value_len(self.max_value_size)
    }

    fn cursor(&self) -> BlockCursor<'_, EphemeralFile> {
        BlockCursor::new(&self.file).with_max_blob_len(self.max_stored_len())
    }
}

#[cfg(test)]
mod tests;
