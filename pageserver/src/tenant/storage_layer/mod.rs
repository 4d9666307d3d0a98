//! Layers: the in-memory layer over its ephemeral file, and the layer files. [`Layer`] is what
//! every kind answers a read with, so GetPage and scans walk any mix of kinds in one loop:
//!
//! - the LSN range its versions lie in and the key range they cover, so a walk skips a layer
//!   that cannot hold a key without any I/O;
//! - a key's versions at or below an LSN, newest first, down to one that needs no older
//!   history ([`LayerRecords`]);
//! - the versions in a range at or below an LSN that reconstruction needs, in key order, a
//!   chunk at a time, as references to where their values lie ([`VersionChunk`]), and the value
//!   one such reference names ([`Layer::read_version`]): what a paged scan merges.

use std::ops::Range;
use std::sync::Arc;

use pageserver_api::{Key, Value};
use utils::Lsn;

use delta_layer::DeltaLayer;
use image_layer::ImageLayer;
use inmemory_layer::{GetError, InMemoryLayer};
use on_demand::OnDemandLayer;

pub mod delta_layer;
pub mod ephemeral_file;
pub mod image_layer;
pub mod inmemory_layer;
pub mod key_history;
mod layer_file;
pub mod layer_name;
pub mod merge_iter;
pub mod on_demand;

pub use layer_file::{LayerFileError, LayerFileKind};
pub use layer_name::LayerName;

/// One layer, of any kind, as a read sees it. Cloning it clones an `Arc`.
#[derive(Clone)]
pub enum Layer {
    /// The open layer or a frozen one.
    InMemory(Arc<InMemoryLayer>),
    Delta(Arc<DeltaLayer>),
    Image(Arc<ImageLayer>),
    /// A delta or image layer file whose local copy may be evicted and downloaded again (with
    /// remote storage): reads ask it for its resident copy.
    OnDemand(Arc<OnDemandLayer>),
}

/// A read of one layer failed.
#[derive(Debug, thiserror::Error)]
pub enum LayerReadError {
    #[error(transparent)]
    InMemory(#[from] GetError),
    #[error(transparent)]
    File(#[from] LayerFileError),
    #[error("the value of key {key} at {lsn} was looked for in a layer of another kind")]
    WrongLayer { key: Key, lsn: Lsn },
    #[error("layer file {name} is not on the local disk, and downloading it failed: {reason}")]
    Download { name: String, reason: String },
    #[error("layer file {file} is an image layer: its versions are read by key, not streamed")]
    NotStreamed { file: String },
}

/// Every version a layer holds, in (key, LSN) order, values and all: see [`Layer::versions`].
pub type VersionStream<'a> =
    Box<dyn Iterator<Item = Result<(Key, Lsn, Value), LayerReadError>> + Send + 'a>;

impl Layer {
    /// The LSNs its versions lie in. An in-memory layer's ends after its newest version so
    /// far (the open layer's grows with every put).
    pub fn lsn_range(&self) -> Range<Lsn> {
        match self {
            Layer::InMemory(l) => l.start_lsn()..Lsn(l.last_lsn().0 + 1),
            Layer::Delta(l) => l.summary().lsn_start..l.summary().lsn_end,
            Layer::Image(l) => l.summary().lsn..Lsn(l.summary().lsn.0 + 1),
            Layer::OnDemand(l) => l.lsn_range(),
        }
    }

    /// The keys its versions are of. An in-memory layer may hold any key.
    pub fn key_range(&self) -> Range<Key> {
        match self {
            Layer::InMemory(_) => Key::MIN..Key::MAX,
            Layer::Delta(l) => l.summary().key_start..l.summary().key_end,
            Layer::Image(l) => l.summary().key_start..l.summary().key_end,
            Layer::OnDemand(l) => l.key_range(),
        }
    }

    /// Whether it can hold a version at or below `lsn` of a key in `keys`: a read skips a
    /// layer that cannot, without touching it.
    pub fn may_hold(&self, keys: &Range<Key>, lsn: Lsn) -> bool {
        let own = self.key_range();
        let empty = matches!(self, Layer::InMemory(l) if l.is_empty());
        !empty && self.lsn_range().start <= lsn && own.start < keys.end && keys.start < own.end
    }

    /// `key`'s versions at or below `lsn`, newest first, down to the first that needs no older
    /// history.
    pub fn get(&self, key: Key, lsn: Lsn) -> Result<LayerRecords, LayerReadError> {
        Ok(match self {
            Layer::InMemory(l) => l.get(key, lsn)?,
            Layer::Delta(l) => l.get(key, lsn)?,
            Layer::Image(l) => l.get(key, lsn)?,
            Layer::OnDemand(l) => l.resident()?.get(key, lsn)?,
        })
    }

    /// [`Layer::get`] for a read that already holds the page as of `floor` (a materialized
    /// page): a delta layer reads no value at or below it, and stops there with the history
    /// complete. Other layers answer as [`Layer::get`] (an in-memory layer's values cost no
    /// read; an image layer's one image is below the floor only when the read skips the layer).
    pub fn get_above(
        &self,
        key: Key,
        lsn: Lsn,
        floor: Option<Lsn>,
    ) -> Result<LayerRecords, LayerReadError> {
        Ok(match self {
            Layer::Delta(l) => l.get_above(key, lsn, floor)?,
            Layer::OnDemand(l) => l.resident()?.get_above(key, lsn, floor)?,
            Layer::InMemory(_) | Layer::Image(_) => self.get(key, lsn)?,
        })
    }

    /// Brings the values of `versions` (as [`Layer::versions_at_lsn`] listed them) into the
    /// page cache, in as few reads as their blocks allow, for the reads about to need them.
    /// An in-memory layer's blocks are in memory or were cached as written: it reads nothing.
    pub fn prefetch_values(&self, versions: &[VersionRef]) -> Result<(), LayerReadError> {
        match self {
            Layer::Delta(l) => l.prefetch_values(versions)?,
            Layer::Image(l) => l.prefetch_values(versions)?,
            Layer::OnDemand(l) => l.resident()?.prefetch_values(versions)?,
            Layer::InMemory(_) => {}
        }
        Ok(())
    }

    /// The versions of the keys in `[from, end)` at or below `lsn` that reconstruction needs,
    /// in key order, a chunk of at most `max_keys` keys: see [`VersionChunk`].
    pub fn versions_at_lsn(
        &self,
        from: Key,
        end: Key,
        lsn: Lsn,
        max_keys: usize,
    ) -> Result<VersionChunk, LayerReadError> {
        Ok(match self {
            Layer::InMemory(l) => l.versions_at_lsn(from, end, lsn, max_keys),
            Layer::Delta(l) => l.versions_at_lsn(from, end, lsn, max_keys)?,
            Layer::Image(l) => l.versions_at_lsn(from, end, lsn, max_keys)?,
            Layer::OnDemand(l) => l.resident()?.versions_at_lsn(from, end, lsn, max_keys)?,
        })
    }

    /// The value of a version this layer listed in a [`VersionChunk`], read and checked as
    /// [`Layer::get`] reads and checks it. A reference the layer did not hand out (from another
    /// kind of layer) is a usage error, never a wrong value.
    pub fn read_version(&self, version: &VersionRef) -> Result<Value, LayerReadError> {
        let (key, lsn) = (version.key, version.lsn);
        if let Layer::OnDemand(l) = self {
            return l.resident()?.read_version(version);
        }
        Ok(match (self, version.at) {
            (Layer::InMemory(l), ValueAt::InMemory { offset }) => {
                l.read_version(key, lsn, offset)?
            }
            (Layer::Delta(l), ValueAt::Delta { entry, end }) => {
                l.read_version(key, lsn, entry, end)?
            }
            (Layer::Image(l), ValueAt::Image { stored }) => l.read_version(key, stored)?,
            _ => return Err(LayerReadError::WrongLayer { key, lsn }),
        })
    }

    /// The layer with its file on the local disk: itself, or an on-demand layer's resident
    /// copy, downloaded first if it was evicted.
    pub fn resident(&self) -> Result<Layer, LayerReadError> {
        match self {
            Layer::OnDemand(l) => l.resident(),
            _ => Ok(self.clone()),
        }
    }

    /// Every version it holds, in (key, LSN) order, values and all, in bounded memory (a
    /// delta layer's window, see `delta_layer::stream`): what compaction merges. An on-demand
    /// layer streams its resident copy. An image layer's versions are read by key instead.
    pub fn versions(&self) -> Result<VersionStream<'_>, LayerReadError> {
        fn delta(layer: &Arc<DeltaLayer>) -> VersionStream<'static> {
            Box::new(layer.stream().map(|r| r.map_err(LayerReadError::from)))
        }
        match self {
            Layer::InMemory(l) => Ok(Box::new(
                l.iter_sorted().map(|r| r.map_err(LayerReadError::from)),
            )),
            Layer::Delta(l) => Ok(delta(l)),
            Layer::OnDemand(l) => match l.resident()? {
                Layer::Delta(resident) => Ok(delta(&resident)),
                _ => Err(LayerReadError::NotStreamed {
                    file: l.file_name().to_owned(),
                }),
            },
            Layer::Image(l) => Err(LayerReadError::NotStreamed {
                file: l.summary().layer_name().to_string(),
            }),
        }
    }

    /// Whether the layer answers for every key of its range at its LSN, holding an entry or
    /// not (an image layer): a read at or above that LSN needs nothing older for such a key.
    pub fn is_authoritative_for(&self, key: Key) -> bool {
        self.is_image() && self.key_range().contains(&key)
    }

    /// An image layer (resident or not).
    pub fn is_image(&self) -> bool {
        match self {
            Layer::Image(_) => true,
            Layer::OnDemand(l) => l.is_image(),
            Layer::Delta(_) | Layer::InMemory(_) => false,
        }
    }

    /// A delta layer file (resident or not).
    pub fn is_delta_file(&self) -> bool {
        match self {
            Layer::Delta(_) => true,
            Layer::OnDemand(l) => !l.is_image(),
            Layer::Image(_) | Layer::InMemory(_) => false,
        }
    }

    /// The file name of a layer file; `None` for an in-memory layer.
    pub fn file_name(&self) -> Option<String> {
        match self {
            Layer::Delta(d) => Some(d.summary().file_name()),
            Layer::Image(i) => Some(i.summary().layer_name().to_string()),
            Layer::OnDemand(l) => Some(l.file_name().to_owned()),
            Layer::InMemory(_) => None,
        }
    }

    /// The size of a layer file (listed, for one not resident); 0 for an in-memory layer.
    pub fn file_size(&self) -> u64 {
        match self {
            Layer::Delta(d) => d.file_size(),
            Layer::Image(i) => i.file_size(),
            Layer::OnDemand(l) => l.file_size(),
            Layer::InMemory(_) => 0,
        }
    }

    /// Whether its file is on the local disk (always, but for an evicted on-demand layer).
    pub fn is_resident(&self) -> bool {
        match self {
            Layer::OnDemand(l) => l.is_resident(),
            _ => true,
        }
    }

    /// A committed change replaced this layer file: its local copy goes with its last reader.
    pub fn retire(&self) {
        match self {
            Layer::Delta(d) => d.retire(),
            Layer::Image(i) => i.retire(),
            Layer::OnDemand(l) => l.retire(),
            Layer::InMemory(_) => {}
        }
    }

    /// Whether `self` and `other` are the same layer (not merely equal ones).
    pub fn same_as(&self, other: &Layer) -> bool {
        match (self, other) {
            (Layer::Delta(a), Layer::Delta(b)) => Arc::ptr_eq(a, b),
            (Layer::Image(a), Layer::Image(b)) => Arc::ptr_eq(a, b),
            (Layer::InMemory(a), Layer::InMemory(b)) => Arc::ptr_eq(a, b),
            (Layer::OnDemand(a), Layer::OnDemand(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

/// What one layer contributes to reconstructing a page.
#[derive(Debug, Default)]
pub struct LayerRecords {
    /// The key's versions at or below the requested LSN, newest first.
    pub records: Vec<(Lsn, Value)>,
    /// The last record needs no older history: older layers need not be visited.
    pub complete: bool,
    /// Some record was stored compressed: a reader that keeps the page it makes spares the
    /// next read the decompression.
    pub decompressed: bool,
}

/// Where a version's value lies in its layer: what a scan buffers instead of the value, so
/// that a version a newer base makes useless is never read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueAt {
    /// A delta layer's index entry (blob offset << 1 | will_init) and the byte where the blob
    /// ends (where the next entry's begins, or the end of the values).
    Delta { entry: u64, end: u64 },
    /// An image layer's index entry (offset << 25 | length).
    Image { stored: u64 },
    /// The offset of an in-memory layer's blob in its ephemeral file.
    InMemory { offset: u64 },
}

/// One version of a key that a layer holds, without its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VersionRef {
    pub key: Key,
    pub lsn: Lsn,
    /// Needs no older history (an image, or a delta that initializes the page).
    pub will_init: bool,
    pub at: ValueAt,
}

/// A run of a layer's versions at or below some LSN, for the keys in a range, in key order:
/// what a scan's stream over that layer buffers (see `timeline::scan`).
///
/// A key's versions are the ones [`Layer::get`] would return for it at that LSN: newest first,
/// down to the first that needs no older history (or the oldest the layer holds), and never
/// split between chunks. A key with no version at or below the LSN is not listed. A chunk ends
/// after `max_keys` keys, or once it holds [`CHUNK_VERSIONS_PER_KEY`] times that many versions
/// (after a whole key: a key with a longer history than that comes whole, in a chunk of its
/// own at worst).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct VersionChunk {
    pub versions: Vec<VersionRef>,
    /// Where the next chunk starts; `None` when the range holds no more such keys.
    pub resume: Option<Key>,
}

/// Block ranges merged into runs: overlapping or adjacent ranges become one, in block order.
pub(crate) fn merge_block_runs(mut blocks: Vec<Range<u32>>) -> Vec<Range<u32>> {
    blocks.sort_unstable_by_key(|r| r.start);
    let mut runs: Vec<Range<u32>> = Vec::new();
    for range in blocks {
        match runs.last_mut() {
            Some(run) if range.start <= run.end => run.end = run.end.max(range.end),
            _ => runs.push(range),
        }
    }
    runs
}

/// See [`VersionChunk`].
pub const CHUNK_VERSIONS_PER_KEY: usize = 4;

impl VersionChunk {
    /// The keys listed, in order, each once.
    pub fn keys(&self) -> Vec<Key> {
        let mut keys: Vec<Key> = self.versions.iter().map(|v| v.key).collect();
        keys.dedup();
        keys
    }

    /// Whether a chunk asked for `max_keys` keys is full after holding `keys` whole keys.
    pub(crate) fn is_full(&self, keys: usize, max_keys: usize) -> bool {
        keys >= max_keys || self.versions.len() >= max_keys.saturating_mul(CHUNK_VERSIONS_PER_KEY)
    }
}

/// A stored value (its serialized form) may exceed `max_value_size` by this much: its kind
/// byte and delta patch headers.
const STORED_VALUE_SLACK: usize = 64;

/// The longest serialized value a layer accepts or reads back, for a configured
/// `max_value_size`. Readers use it to refuse a corrupt length before allocating for it.
pub fn max_stored_value_len(max_value_size: usize) -> usize {
    max_value_size.saturating_add(STORED_VALUE_SLACK)
}

/// Why a layer cannot store a value (the message follows "value of key K at L").
#[derive(Debug, thiserror::Error)]
pub enum StoreValueError {
    #[error("cannot be encoded: {0}")]
    NotEncodable(pageserver_api::value::ValueEncodeError),
    #[error("takes {len} bytes stored, over the limit of {max}")]
    TooLarge { len: usize, max: usize },
}

/// Whether a layer can store `value` under `max_value_size`: it can be encoded, and its stored
/// form is within [`max_stored_value_len`]. Returns that length. The one check a batch's
/// validation, an import and a layer's put each make.
pub fn check_storable(value: &Value, max_value_size: usize) -> Result<usize, StoreValueError> {
    value
        .check_encodable()
        .map_err(StoreValueError::NotEncodable)?;
    let (len, max) = (value.serialized_len(), max_stored_value_len(max_value_size));
    if len > max {
        return Err(StoreValueError::TooLarge { len, max });
    }
    Ok(len)
}
