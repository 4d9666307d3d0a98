//! A paged scan's reads of an in-memory layer: the versions a range needs at an LSN, from the
//! index, and then their values one by one from the ephemeral file.

use std::collections::BinaryHeap;

use super::*;
use crate::tenant::storage_layer::{ValueAt, VersionRef};

impl InMemoryLayer {
    /// The versions of the keys in `[from, end)` at or below `lsn` that reconstruction needs, in
    /// key order, a chunk of at most `max_keys` keys (at least one is asked for): a scan's next
    /// chunk of this layer (see [`VersionChunk`]). Only the index is read, under its read lock;
    /// each version is named by its blob's offset for [`Self::read_version`].
    ///
    /// The key map is a hash map, so key order costs something. A frozen layer never changes:
    /// its first scan sorts the keys once and keeps them (24 bytes a key, counted in
    /// [`Self::index_bytes`]), and every chunk after that is a binary search and a walk. The
    /// open layer still takes puts, so each chunk is one pass over all its keys keeping the
    /// `max_keys` smallest in range: O(keys × log max_keys) per chunk, with no memory held
    /// between chunks. (Versions added after a chunk was taken cannot matter to the scan: a
    /// scan reads at or below `last_record_lsn`, and puts only add versions above it.)
    pub fn versions_at_lsn(&self, from: Key, end: Key, lsn: Lsn, max_keys: usize) -> VersionChunk {
        let max_keys = max_keys.max(1);
        let mut chunk = VersionChunk::default();
        if from >= end || lsn < self.start_lsn || self.is_empty() {
            return chunk;
        }
        let in_range = |key: &Key| from <= *key && *key < end;
        // Only the index is read under its lock, no values: a put's insert waits at most for
        // this pass over the keys.
        let index = self.read_index();
        let bound = self.version_bound(lsn);
        let mut keys = 0;
        if self.end_lsn().is_some() {
            let sorted = self.sorted_heads.get_or_init(|| {
                let mut sorted: Vec<(Key, u32)> =
                    index.heads.iter().map(|(k, h)| (*k, *h)).collect();
                sorted.sort_unstable_by_key(|(k, _)| *k);
                sorted
            });
            let first = sorted.partition_point(|(k, _)| *k < from);
            for (key, head) in sorted[first..].iter().take_while(|(k, _)| in_range(k)) {
                if index.has_version_at_or_below(*head, bound) {
                    if chunk.is_full(keys, max_keys) {
                        chunk.resume = Some(*key);
                        break;
                    }
                    self.push_versions(&index, *key, *head, bound, &mut chunk);
                    keys += 1;
                }
            }
            return chunk;
        }
        // The `max_keys` smallest qualifying keys, largest on top so it is the one replaced.
        let mut smallest: BinaryHeap<(Key, u32)> = BinaryHeap::with_capacity(max_keys + 1);
        for (key, head) in &index.heads {
            if !in_range(key)
                || smallest
                    .peek()
                    .is_some_and(|(top, _)| smallest.len() == max_keys && key > top)
            {
                continue;
            }
            if index.has_version_at_or_below(*head, bound) {
                smallest.push((*key, *head));
                if smallest.len() > max_keys {
                    smallest.pop();
                }
            }
        }
        let full = smallest.len() == max_keys;
        let smallest = smallest.into_sorted_vec();
        for (key, head) in &smallest {
            if chunk.is_full(keys, max_keys) {
                chunk.resume = Some(*key);
                return chunk;
            }
            self.push_versions(&index, *key, *head, bound, &mut chunk);
            keys += 1;
        }
        if full {
            // `key` < `end` <= Key::MAX, so it has a successor.
            chunk.resume = smallest.last().map(|(key, _)| key.next());
        }
        chunk
    }

    /// Adds the versions of `key` at or below `bound` (see [`Self::version_bound`]) down to the
    /// first that needs no older history, newest first, from its chain starting at `head`.
    fn push_versions(
        &self,
        index: &Index,
        key: Key,
        head: u32,
        bound: Option<u32>,
        chunk: &mut VersionChunk,
    ) {
        let mut next = head;
        while next != NONE {
            let entry = index.entries.get(next);
            next = entry.older;
            if bound.is_some_and(|b| entry.lsn_delta > b) {
                continue;
            }
            chunk.versions.push(VersionRef {
                key,
                lsn: self.entry_lsn(entry),
                will_init: entry.will_init(),
                at: ValueAt::InMemory {
                    offset: entry.offset(),
                },
            });
            if entry.will_init() {
                break;
            }
        }
    }

    /// The value of a version [`Self::versions_at_lsn`] listed, read as [`Self::get`] reads it.
    pub fn read_version(&self, key: Key, lsn: Lsn, offset: u64) -> Result<Value, GetError> {
        let blob = self.cursor().read_blob(offset)?;
        Value::deserialize_bytes(blob.into()).map_err(|source| GetError::Corrupt {
            key,
            lsn,
            source,
        })
    }
}
