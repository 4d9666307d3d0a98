//! Paged key-range scans at a fixed LSN: every page of `[start, end)` as of LSN L, in key order,
//! a page of them at a time, each resumable from where the last one stopped.
//!
//! # Design
//!
//! A scan has two halves. **Which keys**: each layer that can hold a version at or below L of a
//! key in the range contributes a *key stream*, the keys it holds that have such a version, in
//! key order; the streams are merged, and a key present in several layers is taken once.
//! **Which bytes**: each key the merge yields is read with [`Timeline::get_page`], exactly as
//! `GET .../page` reads it (the same layer walk, the same materialized pages), so a scan entry
//! is byte for byte what a point read answers, and a key whose versions hold no base (the page
//! does not exist) is left out as a point read would say 404.
//!
//! ```text
//!   open layer     ── keys_at_lsn chunk ──> [k1 k4 k9]      ┐
//!   frozen layer   ── keys_at_lsn chunk ──> [k2 k4]         ├─ merge ─> k1 k2 k3 k4 ... ─> get_page
//!   delta layer    ── keys_at_lsn chunk ──> [k3 k7 k8 k11]  ┘      (each key once)
//! ```
//!
//! A stream does not keep an iterator open (that would pin index blocks in the page cache, or a
//! layer, while the client thinks): it holds a **buffered chunk** of upcoming keys and where the
//! next chunk starts. Only when its chunk is drained does it go back to its layer: a delta layer
//! descends its index from that key ([`DeltaLayer::keys_at_lsn`]), an in-memory layer looks up
//! its key map ([`InMemoryLayer::keys_at_lsn`]). A [`ScanCursor`] is the merge state between
//! pages: the streams with their buffers, and the position just past the last key taken. The
//! next page resumes from those buffers without seeking again; the cursor cache
//! (`scan::cursor_cache`) keeps cursors between requests.
//!
//! A stream names its layer by its place in the layer map's list (newest first), which is only
//! meaningful for one layer set: the cursor remembers the [`LayerSetId`] (the timeline's
//! incarnation and the layer map's generation) its streams were built on. When a page finds
//! another one (a freeze or flush happened, or the timeline was reloaded), the streams are thrown
//! away and rebuilt from the cursor's position: a *re-seek*. A cursor created from nothing but a
//! position (a token whose cursor was evicted) re-seeks the same way. Re-seeking costs index
//! descents, never a different answer.
//!
//! # Invariants
//!
//! * **Consistency.** A scan reads at a fixed L at or below `last_record_lsn`. Every version at
//!   or below `last_record_lsn` is stored and never changes; puts only add versions above it. So
//!   the keys with a version at or below L, and their pages as of L, are the same on every page
//!   of a scan, whatever ingest, freezes and flushes happen in between, and a chunk of keys
//!   buffered from the open layer stays true while the layer takes more puts. (A crash is the
//!   exception the durability contract allows: the timeline comes back at
//!   `disk_consistent_lsn`, as a new incarnation, so no cursor survives it; a token does, and
//!   continues on whatever the timeline holds then.)
//! * **Order and exactly-once.** Streams yield strictly increasing keys at or above the cursor's
//!   position and below `end`; the merge takes the least head and drops it from every stream
//!   that has it, and the position moves just past it. A re-seek starts every stream at the
//!   position. So no key is skipped or repeated across pages, resumed or re-seeked.
//! * **Bounded state.** A stream's first chunk is what one page needs; each later one doubles,
//!   like read-ahead, up to [`MAX_CHUNK_KEYS`] and to a share of [`CURSOR_BUFFER_KEYS`] for the
//!   cursor (never below a page's worth). So a scan abandoned after a page read little ahead,
//!   and a long one goes back to each layer rarely: that matters most for the open layer, whose
//!   every chunk is a pass over its key map. [`ScanCursor::approximate_bytes`] is what the cursor
//!   cache charges. A cursor holds no lease, lock, file or layer.
//!
//! # Cost
//!
//! The merge finds the least head with a pass over the streams: a scan merges a few layers, and
//! each page it yields costs a walk of the same layers anyway. Each round of a page takes a
//! snapshot of the layer map and merges on it, and each key is then read as a point read
//! reads it; no lock is held while the layers are read, so a scan never holds off ingest.

use bytes::Bytes;
use pageserver_api::Key;
use utils::{Lsn, TimelineId};

use crate::tenant::storage_layer::Layer;
#[cfg(doc)]
use crate::tenant::storage_layer::{delta_layer::DeltaLayer, inmemory_layer::InMemoryLayer};
use crate::tenant::timeline::{Timeline, TimelineError};

/// The most keys one stream buffers.
pub const MAX_CHUNK_KEYS: usize = 1024;
/// The fewest keys a stream asks its layer for at a time.
pub const MIN_CHUNK_KEYS: usize = 16;
/// What a cursor's chunks aim to hold together at most: a scan over many layers lets each
/// stream grow less, so a cursor stays about this size (20 bytes a key) however many layers it
/// merges, unless one page's worth per layer is more.
pub const CURSOR_BUFFER_KEYS: usize = 4096;

/// How many keys a stream asks its layer for: `first` for its first chunk, twice its previous
/// chunk after that, never more than `most`.
#[derive(Clone, Copy, Debug)]
struct ChunkSizes {
    first: usize,
    most: usize,
}

/// Which set of layers a cursor's streams describe: the timeline's incarnation (a reload or a
/// timeline created again under the same id starts a new one) and the layer map's generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerSetId {
    pub(crate) incarnation: TimelineId,
    pub(crate) version: u64,
}

/// The keys of one layer, a buffered chunk at a time.
#[derive(Debug)]
struct KeyStream {
    /// The layer's place in the layer list of the cursor's layer set.
    layer: usize,
    /// The buffered chunk; `keys[next..]` are still to come.
    keys: Vec<Key>,
    next: usize,
    /// Where the layer's next chunk starts; `None` once it has no more.
    resume: Option<Key>,
    /// The size of the last chunk read; 0 before the first.
    last_chunk: usize,
}

impl KeyStream {
    /// The stream's next key, reading a chunk from `layer` if the buffer is drained.
    fn head(
        &mut self,
        layer: &Layer,
        end: Key,
        lsn: Lsn,
        sizes: ChunkSizes,
    ) -> Result<Option<Key>, TimelineError> {
        while self.next == self.keys.len() {
            let Some(from) = self.resume else {
                return Ok(None);
            };
            let size = (self.last_chunk * 2).clamp(sizes.first, sizes.most);
            self.last_chunk = size;
            let chunk = layer.keys_at_lsn(from, end, lsn, size)?;
            // A chunk starts at or after `from`, so progress is made even when it is empty
            // (its `resume` then lies further on, or is `None`).
            debug_assert!(chunk.resume.is_none_or(|r| r > from));
            self.keys = chunk.keys;
            self.next = 0;
            self.resume = chunk.resume;
        }
        Ok(Some(self.keys[self.next]))
    }

    fn exhausted(&self) -> bool {
        self.next == self.keys.len() && self.resume.is_none()
    }
}

/// The streams of a positioned cursor and the layer set they were built on.
#[derive(Debug)]
struct Streams {
    layer_set: LayerSetId,
    streams: Vec<KeyStream>,
}

/// The state of a paged scan between pages; see the module documentation.
#[derive(Debug)]
pub struct ScanCursor {
    lsn: Lsn,
    end: Key,
    /// Every key still to come is at or above this: the scan's start, then just past the last
    /// key taken.
    from: Key,
    /// The last key taken from the merge (returned, or left out for having no page).
    last: Option<Key>,
    /// `None` until the first page positions the streams.
    positioned: Option<Streams>,
}

/// What one call of [`Timeline::scan_page`] found.
#[derive(Debug)]
pub struct ScanPage {
    /// At most the page's limit of entries, in key order.
    pub entries: Vec<(Key, Bytes)>,
    /// Whether keys with a version at or below the LSN remain after this page: `false` on the
    /// page that takes the last of them. (Such a key may still have no page, when its versions
    /// hold no base, so a page after one that said `true` can be empty.)
    pub more: bool,
    /// Whether the cursor's streams were used as they were (`false`: the page re-seeked, because
    /// the cursor was new or its layer set had changed).
    pub resumed: bool,
}

impl ScanCursor {
    /// A scan of `[start, end)` as of `lsn`.
    pub fn new(start: Key, end: Key, lsn: Lsn) -> ScanCursor {
        ScanCursor {
            lsn,
            end,
            from: start,
            last: None,
            positioned: None,
        }
    }

    /// A scan of the keys after `last` and below `end` as of `lsn`: where a scan whose cursor
    /// was lost picks up. `last` must be below `end` (so it has a successor).
    pub fn after(last: Key, end: Key, lsn: Lsn) -> ScanCursor {
        debug_assert!(last < end);
        ScanCursor {
            lsn,
            end,
            from: last.next(),
            last: Some(last),
            positioned: None,
        }
    }

    pub fn lsn(&self) -> Lsn {
        self.lsn
    }

    pub fn end(&self) -> Key {
        self.end
    }

    /// The last key taken so far: the next page starts after it.
    pub fn last(&self) -> Option<Key> {
        self.last
    }

    /// Heap and inline bytes the cursor holds: what the cursor cache charges for it.
    pub fn approximate_bytes(&self) -> usize {
        let streams = self.positioned.as_ref().map_or(0, |p| {
            p.streams.capacity() * size_of::<KeyStream>()
                + p.streams
                    .iter()
                    .map(|s| s.keys.capacity() * size_of::<Key>())
                    .sum::<usize>()
        });
        size_of::<ScanCursor>() + streams
    }

    /// Frees what the cursor holds beyond the keys still to come: done before it is kept.
    pub fn compact(&mut self) {
        if let Some(positioned) = &mut self.positioned {
            positioned.streams.retain(|s| !s.exhausted());
            positioned.streams.shrink_to_fit();
            for stream in &mut positioned.streams {
                stream.keys.drain(..stream.next);
                stream.keys.shrink_to_fit();
                stream.next = 0;
            }
        }
    }

    /// Makes the streams describe `layers`: keeps them if they were built on `layer_set`,
    /// otherwise builds them from the cursor's position. Returns whether they were kept.
    fn position(&mut self, layer_set: LayerSetId, layers: &[Layer]) -> bool {
        if self
            .positioned
            .as_ref()
            .is_some_and(|p| p.layer_set == layer_set)
        {
            return true;
        }
        let streams = layers
            .iter()
            .enumerate()
            .filter(|(_, layer)| layer.may_hold(&(self.from..self.end), self.lsn))
            .map(|(index, _)| KeyStream {
                layer: index,
                keys: Vec::new(),
                next: 0,
                resume: (self.from < self.end).then_some(self.from),
                last_chunk: 0,
            })
            .collect();
        self.positioned = Some(Streams { layer_set, streams });
        false
    }

    /// How many keys a stream asks its layer for, for pages of `limit` entries.
    fn chunk_sizes(&self, limit: usize) -> ChunkSizes {
        let streams = self
            .positioned
            .as_ref()
            .map_or(1, |p| p.streams.len().max(1));
        // A page and the look past its end: what the first page of a scan needs from a layer
        // that holds all of its keys.
        let first = (limit + 1).clamp(MIN_CHUNK_KEYS, MAX_CHUNK_KEYS);
        ChunkSizes {
            first,
            most: (CURSOR_BUFFER_KEYS / streams).clamp(first, MAX_CHUNK_KEYS),
        }
    }

    /// The least key any stream holds next, reading chunks where buffers are drained.
    fn peek(&mut self, layers: &[Layer], sizes: ChunkSizes) -> Result<Option<Key>, TimelineError> {
        let Some(positioned) = &mut self.positioned else {
            return Ok(None);
        };
        let mut least: Option<Key> = None;
        for stream in &mut positioned.streams {
            if let Some(head) = stream.head(&layers[stream.layer], self.end, self.lsn, sizes)? {
                least = Some(least.map_or(head, |l| l.min(head)));
            }
        }
        Ok(least)
    }

    /// Takes the next key of the merge.
    fn take(&mut self, layers: &[Layer], sizes: ChunkSizes) -> Result<Option<Key>, TimelineError> {
        let Some(key) = self.peek(layers, sizes)? else {
            return Ok(None);
        };
        if let Some(positioned) = &mut self.positioned {
            for stream in &mut positioned.streams {
                // `peek` left every stream with a head, or exhausted.
                if stream.keys.get(stream.next) == Some(&key) {
                    stream.next += 1;
                }
            }
        }
        // `key` < `end` <= Key::MAX, so it has a successor.
        self.from = key.next();
        self.last = Some(key);
        Ok(Some(key))
    }
}

/// The next page of `cursor`'s scan of `timeline`, at most `limit` entries.
pub(crate) fn next_page(
    timeline: &Timeline,
    cursor: &mut ScanCursor,
    limit: usize,
) -> Result<ScanPage, TimelineError> {
    let lsn = cursor.lsn;
    let last_record = timeline.last_record_lsn();
    if lsn > last_record {
        return Err(TimelineError::LsnNotYetIngested { lsn, last_record });
    }
    let mut entries = Vec::new();
    let mut resumed = None;
    loop {
        let wanted = limit - entries.len();
        let (layer_set, layers) = timeline.scan_layers(lsn)?;
        let kept = cursor.position(layer_set, &layers);
        // A later round of the same page may find a newer layer set (a flush finished
        // meanwhile); what the caller wants to know is whether the page began resumed.
        resumed.get_or_insert(kept);
        let sizes = cursor.chunk_sizes(limit);
        let mut keys = Vec::with_capacity(wanted);
        while keys.len() < wanted {
            match cursor.take(&layers, sizes)? {
                Some(key) => keys.push(key),
                None => break,
            }
        }
        let more = cursor.peek(&layers, sizes)?.is_some();
        drop(layers);
        // Each key is read as a point read reads it, on the layer set of the moment.
        for key in keys {
            if let Some(page) = timeline.get_page(key, lsn)? {
                entries.push((key, page));
            }
        }
        if !more || entries.len() == limit {
            return Ok(ScanPage {
                entries,
                more,
                resumed: resumed.unwrap_or(false),
            });
        }
    }
}

pub mod cursor_cache;
#[cfg(test)]
mod tests;
