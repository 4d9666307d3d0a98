//! One layer's part of a scan: its versions in key order, a buffered chunk at a time.

use pageserver_api::Key;
use utils::Lsn;

use crate::tenant::storage_layer::{Layer, VersionRef};
use crate::tenant::timeline::TimelineError;

/// How many keys a stream asks its layer for: `first` for its first chunk, twice its previous
/// chunk after that, never more than `most`.
#[derive(Clone, Copy, Debug)]
pub(super) struct ChunkSizes {
    pub(super) first: usize,
    pub(super) most: usize,
}

/// The versions of one layer a scan needs, a buffered chunk at a time (see the module
/// documentation of `timeline::scan`).
#[derive(Debug)]
pub(super) struct VersionStream {
    /// The layer's place in the layer list of the cursor's layer set.
    pub(super) layer: usize,
    /// The buffered chunk, in key order, each key's versions newest first; `versions[next..]`
    /// are still to come.
    pub(super) versions: Vec<VersionRef>,
    pub(super) next: usize,
    /// Where the layer's next chunk starts; `None` once it has no more.
    resume: Option<Key>,
    /// The size (in keys) of the last chunk read; 0 before the first.
    last_chunk: usize,
}

impl VersionStream {
    /// A stream of `layer`'s versions from `from` on; `from` is `None` for an empty range.
    pub(super) fn new(layer: usize, from: Option<Key>) -> VersionStream {
        VersionStream {
            layer,
            versions: Vec::new(),
            next: 0,
            resume: from,
            last_chunk: 0,
        }
    }

    /// The stream's next key, reading a chunk from `layer` if the buffer is drained.
    pub(super) fn head(
        &mut self,
        layer: &Layer,
        end: Key,
        lsn: Lsn,
        sizes: ChunkSizes,
    ) -> Result<Option<Key>, TimelineError> {
        while self.next == self.versions.len() {
            let Some(from) = self.resume else {
                return Ok(None);
            };
            let size = (self.last_chunk * 2).clamp(sizes.first, sizes.most);
            self.last_chunk = size;
            let chunk = layer.versions_at_lsn(from, end, lsn, size)?;
            // A layer lists keys in order from `from` on, so a chunk makes progress even when
            // it is empty (its `resume` then lies further on, or is `None`). A damaged index
            // that does not is refused rather than looped on or merged out of order.
            let in_order = chunk.versions.windows(2).all(|w| w[0].key <= w[1].key)
                && chunk.versions.first().is_none_or(|v| v.key >= from)
                && chunk
                    .resume
                    .is_none_or(|r| r > from && chunk.versions.last().is_none_or(|v| v.key < r));
            if !in_order {
                return Err(TimelineError::LayerSet {
                    file: format!("layer {} of the scan's layer set", self.layer),
                    reason: format!("its versions from key {from} on are not in key order"),
                });
            }
            self.versions = chunk.versions;
            self.next = 0;
            self.resume = chunk.resume;
        }
        Ok(Some(self.versions[self.next].key))
    }

    /// The buffered versions of `key`, newest first, taken from the head of the stream (none
    /// if its head is another key).
    pub(super) fn take(&mut self, key: Key) -> &[VersionRef] {
        let start = self.next;
        while self.versions.get(self.next).is_some_and(|v| v.key == key) {
            self.next += 1;
        }
        &self.versions[start..self.next]
    }

    pub(super) fn exhausted(&self) -> bool {
        self.next == self.versions.len() && self.resume.is_none()
    }

    /// Drops the versions already taken and the buffer's slack.
    pub(super) fn compact(&mut self) {
        self.versions.drain(..self.next);
        self.versions.shrink_to_fit();
        self.next = 0;
    }

    /// Heap bytes of the buffer, by capacity.
    pub(super) fn heap_bytes(&self) -> usize {
        self.versions.capacity() * size_of::<VersionRef>()
    }
}
