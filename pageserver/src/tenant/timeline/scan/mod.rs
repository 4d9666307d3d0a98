//! Paged key-range scans at a fixed LSN: every page of `[start, end)` as of LSN L, in key order,
//! a page of them at a time, each resumable from where the last one stopped.
//!
//! # Design
//!
//! A scan is one merge over the layers, walking each of them once in key order and
//! reconstructing pages as it goes. Each layer that can hold a version at or below L of a key in
//! the range contributes a **version stream**: for each of its keys in the range, the versions
//! at or below L that a point read would take from it (newest first, down to the first image or
//! `will_init` delta), in key order, a buffered chunk at a time
//! ([`Layer::versions_at_lsn`]). The merge takes the least head key; collects that key's
//! versions from the streams newest layer first, in the layer order GetPage walks, and stops
//! collecting at the first version that needs no older history, or at an image layer, which
//! answers for every key of its range (the older streams' versions of the key are skipped past,
//! unread): the rule of [`KeyHistory`], which GetPage's walk follows too; and redoes the page
//! with `reconstruct_page_taking`, the function GetPage uses. So an entry
//! is byte for byte what `GET .../page` answers, and a key whose versions hold no base (the page
//! does not exist) is left out, as a point read would say 404.
//!
//! ```text
//!   open layer     ── versions_at_lsn ──> [k1:v9 k4:v8,v7]       ┐  least key; its versions,
//!   frozen layer   ── versions_at_lsn ──> [k2:v6 k4:v5(init)]    ├─ newest layer first, down
//!   delta layer    ── versions_at_lsn ──> [k3:v2 k4:v1 ...]      │  to a base; the rest
//!   image layer    ── versions_at_lsn ──> [k1:img k3:img ...]    ┘  skipped ─> reconstruct_page_taking
//! ```
//!
//! **Values are read when the merge takes their key, not when a chunk is buffered.** A stream
//! buffers *references* ([`VersionRef`]: key, LSN, `will_init`, and where the value lies: a
//! delta layer's index entry and the byte its blob ends at, an image layer's index entry, an
//! in-memory layer's blob offset), listed from the index alone. The merge reads only the values
//! reconstruction needs, each with [`Layer::read_version`] and the checks of a point read. This
//! differs from compaction's `MergeIter` over `DeltaStream`s, which yields every version with
//! its value in (key, LSN) order: a scan must not read a version a newer base makes useless (an
//! old image under a newer one is the common case), must walk layers in GetPage's order (images
//! first at a shared LSN end, an image layer answering for keys it does not hold), and keeps its
//! buffers in the cursor cache between requests, where buffered values (up to a page each)
//! would make a cursor weigh megabytes rather than tens of kilobytes. Knowing each value's end
//! from the index walk, the merge reads exactly its blocks with no index lookup: a resumed page
//! touches no index block until a stream's buffer runs dry.
//!
//! **Page cache.** Index blocks and values of layer files are read through the page cache as
//! point reads read them (the pages a scan returns are often read again); nothing bypasses it.
//! The materialized-page cache is neither consulted nor filled: the scan holds each key's
//! versions in hand anyway, and a long scan memorizing every page would push the point readers'
//! hot set out of the cache.
//!
//! A stream does not keep an iterator open (that would pin index blocks in the page cache, or a
//! layer, while the client thinks): it holds its **buffered chunk** and where the next chunk
//! starts. Only when its chunk is drained does it go back to its layer: a delta layer descends
//! its index from that key, an in-memory layer looks up its key map. A [`ScanCursor`] is the
//! merge state between pages: the streams with their buffers, and the position just past the
//! last key taken. The next page resumes from those buffers without seeking again; the cursor
//! cache (`scan::cursor_cache`) keeps cursors between requests.
//!
//! **Branches.** A scan of a branch merges its own layers at L and then its ancestor's at
//! min(L, branch LSN), and so on up the chain ([`Timeline::scan_layers`]): the layers and LSNs
//! GetPage walks, in its order. The ancestor's layers come after every layer of the branch, so
//! a base in the branch (an image, a `will_init` delta, an image layer's range) stops the
//! collection before the ancestor's versions of the key, as the point read stops there.
//!
//! A stream names its layer by its place in the layer map's list (newest first), which is only
//! meaningful for one layer set: the cursor remembers the [`LayerSetId`] (the incarnation and
//! layer map generation of the timeline and of each ancestor it reads) its streams were built
//! on. When a page finds another one (a freeze, flush or compaction happened, or the timeline
//! was reloaded), the streams are thrown away and rebuilt from the cursor's position: a *re-seek*. A cursor created
//! from nothing but a position (a token whose cursor was evicted) re-seeks the same way.
//! Re-seeking costs index descents, never a different answer.
//!
//! # Invariants
//!
//! * **Consistency.** A scan reads at a fixed L at or below `last_record_lsn`. Every version at
//!   or below `last_record_lsn` is stored and never changes; puts only add versions above it. So
//!   the keys with a version at or below L, and their pages as of L, are the same on every page
//!   of a scan, whatever ingest, freezes and flushes happen in between, and a chunk buffered
//!   from the open layer stays true while the layer takes more puts (its blobs never move).
//!   (A crash is the exception the durability contract allows: the timeline comes back at
//!   `disk_consistent_lsn`, as a new incarnation, so no cursor survives it; a token does, and
//!   continues on whatever the timeline holds then.)
//! * **Order and exactly-once.** Streams yield strictly increasing keys at or above the cursor's
//!   position and below `end` (a chunk out of order is refused as a damaged layer); the merge
//!   takes the least head and all its versions from every stream that has it, and the position
//!   moves just past it. A re-seek starts every stream at the position. So no key is skipped or
//!   repeated across pages, resumed or re-seeked.
//! * **Bounded state.** A stream's first chunk is what one page needs; each later one doubles,
//!   like read-ahead, up to [`MAX_CHUNK_KEYS`] and to a share of [`CURSOR_BUFFER_KEYS`] for the
//!   cursor (never below a page's worth), and a chunk holds at most
//!   [`CHUNK_VERSIONS_PER_KEY`](crate::tenant::storage_layer::CHUNK_VERSIONS_PER_KEY) versions
//!   per key it was asked for (a single key's history excepted, which a point read holds too).
//!   So a scan abandoned after a page read little ahead, and a long one goes back to each layer
//!   rarely: that matters most for the open layer, whose every chunk is a pass over its key map.
//!   A buffered version is a reference of `size_of::<VersionRef>()` bytes and no value, so a
//!   cursor holds at most about `4 × CURSOR_BUFFER_KEYS` of them (under 1 MiB) however many
//!   layers it merges; [`ScanCursor::approximate_bytes`] is what the cursor cache charges. A
//!   cursor holds no lease, lock, file or layer.
//!
//! # Cost
//!
//! The merge finds the least head with a pass over the streams: a scan merges a few layers,
//! and a point read of the same key would visit each of them. A page takes one snapshot of the
//! layer map and merges on it; no lock is held while the layers are read, so a scan never holds
//! off ingest. A hot page costs, per key, the values its page is made of (read through the page
//! cache and checked) and the redo; the index is walked once per chunk, not descended per key and
//! layer as point reads do.

use bytes::Bytes;
use pageserver_api::{reconstruct_page_taking, Key, Value};
use utils::{Lsn, TimelineId};

use crate::tenant::storage_layer::key_history::KeyHistory;
use crate::tenant::storage_layer::{Layer, VersionRef};
use crate::tenant::timeline::{Timeline, TimelineError};
use stream::{ChunkSizes, VersionStream};

mod stream;

/// The most keys one stream buffers.
pub const MAX_CHUNK_KEYS: usize = 1024;
/// The fewest keys a stream asks its layer for at a time.
pub const MIN_CHUNK_KEYS: usize = 16;
/// What a cursor's chunks aim to hold together at most, in keys: a scan over many layers lets
/// each stream grow less, so a cursor stays about this size however many layers it merges,
/// unless one page's worth per layer is more.
pub const CURSOR_BUFFER_KEYS: usize = 4096;

/// Which set of layers a cursor's streams describe: for the timeline and each ancestor a scan
/// of a branch reads, its incarnation (a reload or a timeline created again under the same id
/// starts a new one) and its layer map's generation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerSetId {
    /// The scanned timeline first, then its ancestors, nearest first.
    pub(crate) timelines: Vec<(TimelineId, u64)>,
}

/// A layer a scan merges and the LSN its versions are read at: the scan's LSN for the scanned
/// timeline's own layers, the branch LSN (or the scan's, if lower) for an ancestor's.
#[derive(Clone)]
pub(crate) struct ScanLayer {
    pub(crate) layer: Layer,
    pub(crate) lsn: Lsn,
}

/// The streams of a positioned cursor and the layer set they were built on.
#[derive(Debug)]
struct Streams {
    layer_set: LayerSetId,
    streams: Vec<VersionStream>,
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

    /// Heap and inline bytes the cursor holds: what the cursor cache charges for it. Its
    /// buffers hold version references, never values (see the module documentation).
    pub fn approximate_bytes(&self) -> usize {
        let streams = self.positioned.as_ref().map_or(0, |p| {
            p.streams.capacity() * size_of::<VersionStream>()
                + p.streams
                    .iter()
                    .map(VersionStream::heap_bytes)
                    .sum::<usize>()
        });
        size_of::<ScanCursor>() + streams
    }

    /// Frees what the cursor holds beyond the versions still to come: done before it is kept.
    pub fn compact(&mut self) {
        if let Some(positioned) = &mut self.positioned {
            positioned.streams.retain(|s| !s.exhausted());
            positioned.streams.shrink_to_fit();
            for stream in &mut positioned.streams {
                stream.compact();
            }
        }
    }

    /// Makes the streams describe `layers`: keeps them if they were built on `layer_set`,
    /// otherwise builds them from the cursor's position. Returns whether they were kept.
    fn position(&mut self, layer_set: LayerSetId, layers: &[ScanLayer]) -> bool {
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
            .filter(|(_, l)| l.layer.may_hold(&(self.from..self.end), l.lsn))
            .map(|(index, _)| {
                VersionStream::new(index, (self.from < self.end).then_some(self.from))
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
    fn peek(
        &mut self,
        layers: &[ScanLayer],
        sizes: ChunkSizes,
    ) -> Result<Option<Key>, TimelineError> {
        let Some(positioned) = &mut self.positioned else {
            return Ok(None);
        };
        let mut least: Option<Key> = None;
        for stream in &mut positioned.streams {
            let at = &layers[stream.layer];
            if let Some(head) = stream.head(&at.layer, self.end, at.lsn, sizes)? {
                least = Some(least.map_or(head, |l| l.min(head)));
            }
        }
        Ok(least)
    }

    /// Takes the next key of the merge and its page as of the cursor's LSN (`None` if its
    /// versions hold no base): the key's versions from each stream, newest layer first, read
    /// down to the first that needs no older history, then redone. `records` is scratch room
    /// for the versions, kept by the caller from key to key.
    fn take(
        &mut self,
        layers: &[ScanLayer],
        sizes: ChunkSizes,
        max_value_size: usize,
        records: &mut Vec<(Lsn, Value)>,
    ) -> Result<Option<(Key, Option<Bytes>)>, TimelineError> {
        let Some(key) = self.peek(layers, sizes)? else {
            return Ok(None);
        };
        if key < self.from {
            return Err(TimelineError::LayerSet {
                file: "a layer of the scan's layer set".to_owned(),
                reason: format!("it lists key {key} again after the scan passed it"),
            });
        }
        let lsn = self.lsn;
        records.clear();
        if let Some(positioned) = &mut self.positioned {
            let mut history = KeyHistory::default();
            // Streams are in layer order, newest first, as GetPage walks the layers; `peek`
            // left every stream with a head, or exhausted.
            for stream in &mut positioned.streams {
                let layer = &layers[stream.layer].layer;
                let versions: &[VersionRef] = stream.take(key);
                if history.is_complete() {
                    // Older than the base already found: skipped past, never read.
                    continue;
                }
                if !versions.is_empty() {
                    // As the GetPage walk counts a layer it asks for the key's versions.
                    crate::io::read_cost::layer_visited();
                }
                let taken = history.take(layer, key, versions);
                for version in &versions[..taken] {
                    records.push((version.lsn, layer.read_version(version)?));
                }
            }
        }
        // `key` < `end` <= Key::MAX, so it has a successor.
        self.from = key.next();
        self.last = Some(key);
        let page = reconstruct_page_taking(records, max_value_size)
            .map_err(|source| TimelineError::of_redo(key, lsn, records, source))?;
        Ok(Some((key, page)))
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
    // One snapshot for the whole page: every version at or below `lsn` is in it, whatever
    // happens to the layer map meanwhile, and holding it holds no lock.
    let (layer_set, layers) = timeline.scan_layers(lsn)?;
    let resumed = cursor.position(layer_set, &layers);
    let sizes = cursor.chunk_sizes(limit);
    let max_value_size = timeline.conf.max_value_size;
    let mut entries = Vec::with_capacity(limit.min(MAX_CHUNK_KEYS));
    let mut records = Vec::new();
    while entries.len() < limit {
        match cursor.take(&layers, sizes, max_value_size, &mut records)? {
            Some((key, Some(page))) => entries.push((key, page)),
            // No base at `lsn`: the page does not exist there.
            Some((_, None)) => {}
            None => break,
        }
    }
    let more = cursor.peek(&layers, sizes)?.is_some();
    Ok(ScanPage {
        entries,
        more,
        resumed,
    })
}

pub mod cursor_cache;
#[cfg(test)]
mod tests;
