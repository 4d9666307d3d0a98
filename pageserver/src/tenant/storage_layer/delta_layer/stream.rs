//! Every version in a delta layer, in (key, LSN) order, with memory bounded however large the
//! file: the input of a compaction's merge.
//!
//! A [`DeltaStream`] holds a chunk of at most [`STREAM_INDEX_CHUNK`] index entries and a window
//! of at most [`STREAM_WINDOW`] bytes of values (more only for a single larger value). Values
//! lie in the file in index order, so the window slides forward through the values region with
//! one large read per refill, around the page cache: a pass over a whole layer must not push
//! out what readers use. Each index chunk is found by a fresh descent from where the last one
//! ended, so the stream pins no index block between chunks. Everything read is checked as
//! [`DeltaLayer::get`] checks it, and the stream ends with an error if the index holds another
//! number of entries than the summary says.

use std::collections::VecDeque;

use super::*;

/// Index entries a stream buffers at a time.
pub const STREAM_INDEX_CHUNK: usize = 1024;
/// Bytes of values a stream reads at a time.
pub const STREAM_WINDOW: usize = 1 << 20;

/// See the module documentation.
pub struct DeltaStream {
    layer: Arc<DeltaLayer>,
    /// Buffered (key, lsn, stored entry), in order.
    entries: VecDeque<(Key, Lsn, u64)>,
    /// Where the next index chunk starts; `None` once the index is exhausted.
    resume: Option<[u8; INDEX_KEY_LEN]>,
    window: ValueWindow,
    yielded: u64,
    done: bool,
}

impl DeltaLayer {
    /// Streams every version in the file in (key, LSN) order; see [`DeltaStream`].
    pub fn stream(self: &Arc<Self>) -> DeltaStream {
        DeltaStream {
            layer: self.clone(),
            entries: VecDeque::new(),
            resume: Some([0u8; INDEX_KEY_LEN]),
            window: ValueWindow::default(),
            yielded: 0,
            done: false,
        }
    }
}

impl DeltaStream {
    /// The bytes a stream holds at most, besides one value larger than the window.
    pub const fn memory_bound() -> usize {
        STREAM_WINDOW + STREAM_INDEX_CHUNK * std::mem::size_of::<(Key, Lsn, u64)>()
    }

    fn refill_entries(&mut self) -> Result<(), LayerFileError> {
        let Some(start) = self.resume.take() else {
            return Ok(());
        };
        let layer = &self.layer;
        let entries = &mut self.entries;
        let mut last = None;
        let complete = layer.with_index(Access::Scan, |tree, _| {
            tree.visit_from(&start, |found, value| {
                let (key, lsn) = split_index_key(found);
                entries.push_back((key, lsn, value));
                last = Some((key, lsn));
                entries.len() < STREAM_INDEX_CHUNK
            })
            .map_err(|e: BtreeReadError| layer.corrupt(e))
        })?;
        if !complete {
            let (key, lsn) = last.expect("stopped after an entry");
            // LSN::MAX never holds a version, so lsn + 1 is the next possible entry.
            self.resume = Some(index_key(key, Lsn(lsn.0 + 1)));
        }
        Ok(())
    }

    fn next_version(&mut self) -> Result<Option<(Key, Lsn, Value)>, LayerFileError> {
        if self.entries.is_empty() {
            self.refill_entries()?;
        }
        let layer = &*self.layer;
        let Some((key, lsn, entry)) = self.entries.pop_front() else {
            if self.yielded != layer.summary.entries {
                return Err(layer.corrupt(format!(
                    "index holds {} entries, the summary says {}",
                    self.yielded, layer.summary.entries
                )));
            }
            return Ok(None);
        };
        let offset = entry >> 1;
        layer.check_offset(key, lsn, offset)?;
        let header_bytes = (layer.summary.values_end - offset).min(4) as usize;
        let header = self.window.bytes(layer, offset, header_bytes)?;
        let Some((header_len, blob_len)) = BlobHeader::parse(header) else {
            return Err(layer.corrupt(format!(
                "value of key {key} at {lsn}: no room for its length header"
            )));
        };
        if blob_len > layer.max_blob_len {
            return Err(layer.corrupt(format!(
                "value of key {key} at {lsn} claims {blob_len} bytes, over the limit of {}",
                layer.max_blob_len
            )));
        }
        let blob = self
            .window
            .bytes(layer, offset + header_len as u64, blob_len)?;
        let value = layer.decode_value(key, lsn, entry, blob)?;
        self.yielded += 1;
        Ok(Some((key, lsn, value)))
    }
}

/// The bytes of values a stream read last: one large read per refill, slid forward through the
/// values region.
#[derive(Default)]
struct ValueWindow {
    bytes: Vec<u8>,
    /// File offset of `bytes[0]`.
    start: u64,
}

impl ValueWindow {
    /// `len` bytes of `layer` from `offset`, which lie within its values.
    fn bytes(
        &mut self,
        layer: &DeltaLayer,
        offset: u64,
        len: usize,
    ) -> Result<&[u8], LayerFileError> {
        let values_end = layer.summary.values_end;
        let window_end = self.start + self.bytes.len() as u64;
        if offset < self.start || offset + len as u64 > window_end {
            let available = values_end.saturating_sub(offset);
            let want = len.max(STREAM_WINDOW) as u64;
            let read = usize::try_from(want.min(available)).expect("at most the larger of two");
            if read < len {
                return Err(layer.corrupt(format!(
                    "a value at byte {offset} runs past the end of the values ({values_end})"
                )));
            }
            self.bytes.resize(read, 0);
            layer.file.read_exact_at(&mut self.bytes, offset)?;
            self.start = offset;
        }
        let start = (offset - self.start) as usize;
        Ok(&self.bytes[start..start + len])
    }
}

impl Iterator for DeltaStream {
    type Item = Result<(Key, Lsn, Value), LayerFileError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let next = self.next_version().transpose();
        // After the last version or an error, nothing more.
        if !matches!(next, Some(Ok(_))) {
            self.done = true;
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use bytes::Bytes;
    use pageserver_api::DEFAULT_MAX_VALUE_SIZE;
    use proptest::prelude::*;

    use super::*;
    use crate::tenant::test_support::*;

    fn write(dir: &Path, model: &BTreeMap<(Key, Lsn), Value>) -> PathBuf {
        let mut writer = DeltaLayerWriter::new(
            dir,
            TenantId::from_bytes([1; 16]),
            TimelineId::from_bytes([2; 16]),
            Lsn(1),
            Lsn(1 << 40),
        )
        .unwrap();
        for ((key, lsn), value) in model {
            writer.put_value(*key, *lsn, value).unwrap();
        }
        writer.finish().unwrap().path
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]
        /// Enough versions to cross several index chunks, and values (some of several blocks,
        /// some larger than the window) that straddle window refills.
        #[test]
        fn streams_every_version_in_order(
            sizes in proptest::collection::vec(prop_oneof![0usize..300, Just(PAGE_SZ), 20_000usize..40_000], 1..12),
            keys in 1u32..400,
            versions in 1u64..8,
            big in any::<bool>(),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let mut model = BTreeMap::new();
            let mut n = 0usize;
            for k in 0..keys {
                for v in 0..versions {
                    let mut len = sizes[n % sizes.len()];
                    if big && n == 7 {
                        len = STREAM_WINDOW + 5000;
                    }
                    n += 1;
                    model.insert((rel_key(k), Lsn(10 + v)), Value::Image(Bytes::from(vec![n as u8; len])));
                }
            }
            let path = write(dir.path(), &model);
            let layer = Arc::new(DeltaLayer::open(&path, small_cache(16), DEFAULT_MAX_VALUE_SIZE.max(STREAM_WINDOW * 2)).unwrap());
            let streamed: Vec<_> = layer.stream().collect::<Result<_, _>>().unwrap();
            let want: Vec<_> = model.into_iter().map(|((k, l), v)| (k, l, v)).collect();
            prop_assert_eq!(streamed.len(), want.len());
            prop_assert!(streamed == want);
        }
    }

    #[test]
    fn a_damaged_value_ends_the_stream_with_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let model: BTreeMap<_, _> = (0..50)
            .map(|k| {
                (
                    (rel_key(k), Lsn(10)),
                    Value::Image(Bytes::from(vec![k as u8; 3000])),
                )
            })
            .collect();
        let path = write(dir.path(), &model);
        // A byte in the middle of the values.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[PAGE_SZ + 40_000] ^= 0x55;
        std::fs::write(&path, &bytes).unwrap();
        let layer =
            Arc::new(DeltaLayer::open(&path, small_cache(16), DEFAULT_MAX_VALUE_SIZE).unwrap());
        let out: Vec<_> = layer.stream().collect();
        let Some(Err(e)) = out.last() else {
            panic!("the stream ended without an error");
        };
        assert!(e.to_string().contains("checksum mismatch"), "{e}");
        assert!(out.len() < model.len() + 1);
    }
}
