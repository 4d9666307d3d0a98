//! The in-memory layer: the newest page versions of a timeline, before they are flushed to a
//! delta layer file.
//!
//! Values are serialized (`pageserver_api::Value`'s stable format) into the layer's
//! [`EphemeralFile`]; only a compact index stays in memory:
//!
//! ```text
//!   heads: HashMap<Key, u32>    key -> its newest entry            (one per distinct key)
//!
//!   chunks: [chunk 0][chunk 1]...[chunk n]   each a fixed block of CHUNK_ENTRIES entries,
//!                                            allocated when the one before it is full
//!
//!   entry (14 bytes, packed, 2-byte aligned):
//!     lsn_delta      u32   the version's LSN minus the layer's start_lsn
//!     older          u32   the previous (older) entry of the same key, or NONE
//!     position_low   u32   \ position, 48 bits: offset of the value's blob in the
//!     position_high  u16   / ephemeral file << 1 | will_init
//! ```
//!
//! Entry `i` lives in chunk `i / CHUNK_ENTRIES` at slot `i % CHUNK_ENTRIES`. A chunk is
//! allocated at its full size once and never grows, so the index has no growth slack beyond
//! the unused part of the last chunk and the ingest path never copies entries to a bigger
//! allocation (only the key map rehashes as it grows, and the small vector of chunk pointers
//! doubles).
//!
//! What an indexed value costs, as [`InMemoryLayer::index_bytes`] counts it (every heap byte
//! by capacity, the key map with its control bytes), measured by `index_stays_compact` with
//! 160,000 small values:
//!
//! | versions per key | bytes per value | of which the key map |
//! |---:|---:|---:|
//! | 16 (10,000 keys) | 16.9 | 2.6 |
//! | 1 (160,000 keys) | 55.3 | 41.0 |
//!
//! The entry itself is 14 bytes; the key map costs 25 bytes per bucket (the 24-byte
//! `(Key, u32)` pair and one control byte) at a load factor between 7/16 and 7/8, so a layer
//! of mostly one-version keys is dominated by the map.
//!
//! Why these widths:
//!
//! - **`lsn_delta`, 32 bits**: a layer spans fewer than 2^32 LSNs (4 GiB of WAL) from its
//!   `start_lsn`. [`InMemoryLayer::can_hold_lsn`] tells the caller when to start a new layer;
//!   `put` refuses an LSN beyond the span ([`PutError::SpanTooWide`]) and changes nothing.
//! - **`older`, 32 bits**: a layer holds at most `u32::MAX` values ([`PutError::Full`]).
//! - **position, 48 bits**: offsets up to 2^47 bytes. The ephemeral file numbers its 8 KiB
//!   blocks with a `u32`, so it ends before 2^45 bytes: every offset it can hand out fits, and
//!   no layer limit beyond the file's own comes from this field. (A 40-bit position would save
//!   one byte per value but add a limit, 512 GiB, below the file's.)
//!
//! A key's versions form a chain from newest to oldest, because puts arrive in LSN order: a
//! lookup at LSN L skips the versions above L and collects the rest until a version that needs
//! no older history (an image or a `will_init` delta). A chain step reads one 14-byte entry.
//!
//! # Lifecycle
//!
//! ```text
//!   open --freeze(end_lsn)--> frozen --(delta layer written)--> dropped
//!    put, get,                 get, iter_sorted,
//!    versions_at_lsn (a pass)  versions_at_lsn (sorted once)
//! ```
//!
//! A layer covers `[start_lsn, end_lsn)`. Puts must come in non-decreasing LSN order, within
//! that range and within `2^32` LSNs of `start_lsn`; the same key at the same LSN twice is
//! refused, since reconstruction would be ambiguous. A refused put changes nothing.
//!
//! # Concurrency
//!
//! Every method takes `&self`: the open layer is shared, one writer putting while readers get.
//!
//! ```text
//!   put:  [put mutex: validate ─ serialize ─ append blob (file I/O) ─ [index write: insert]]
//!   get:  [index read: walk the chain, collect (lsn, offset, will_init)] ─ read the blobs
//! ```
//!
//! * **The put mutex** serializes puts and `freeze`: validation, the blob's append and the
//!   index insert happen as one step, so two concurrent puts stay correct (of two puts of the
//!   same version, one is refused as a duplicate) and a refused put still changes nothing.
//!   Readers never take it.
//! * **The index lock** (a read-write lock over the key map and the entry chunks) is taken for
//!   writing only for the in-memory insert of one entry, after its blob is in the ephemeral
//!   file: the index is published record by record, and every entry a reader finds points at
//!   bytes it can read. The insert may rehash the key map as it grows (memory work, amortized).
//! * **Readers** hold the index's read lock only while walking it, never across file I/O:
//!   `get` collects the (LSN, offset, `will_init`) of the versions it needs, releases the lock,
//!   then reads the blobs through the ephemeral file, which never makes a reader wait for a
//!   block write (see [`EphemeralFile`]). `versions_at_lsn` and `iter_sorted` read only the index
//!   under it.
//! * `last_lsn`, `len` and `distinct_keys` are atomics, stored under the index's write lock
//!   right after the insert, so under the read lock they match the index (`versions_at_lsn` relies
//!   on that for `last_lsn`); `end_lsn` is set once. Reading them waits for nothing.
//!
//! A reader walking the index sees a put entirely or not at all: the entry and its key's new
//! head appear together under the write lock. A `get` while a put is appending its blob sees
//! the layer as it was before that put.

use std::collections::HashMap;
use std::mem::size_of;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use pageserver_api::value::{ValueDecodeError, KIND_IMAGE};
use pageserver_api::{Key, Value};
use utils::Lsn;

use crate::format::blob_io::{BlobReadError, BlockCursor};
use crate::format::compression::Compression;
use crate::page_cache::PageCache;
use crate::tenant::storage_layer::delta_layer::{DeltaLayerWriter, WrittenLayer};
use crate::tenant::storage_layer::ephemeral_file::{EphemeralFile, EphemeralWriteError};
use crate::tenant::storage_layer::LayerFileError;
use crate::tenant::storage_layer::{check_storable, max_stored_value_len, StoreValueError};
pub use crate::tenant::storage_layer::{LayerRecords, VersionChunk};

/// A layer holds LSNs in `[start_lsn, start_lsn + MAX_LSN_SPAN)`: entries store the LSN as a
/// 32-bit offset from `start_lsn`.
pub const MAX_LSN_SPAN: u64 = 1 << 32;

/// "No entry": the end of a key's chain. Never a valid entry number.
const NONE: u32 = u32::MAX;

/// Entries per chunk: 4096 × 14 bytes, 56 KiB per chunk.
const CHUNK_ENTRIES: usize = 1 << CHUNK_SHIFT;
const CHUNK_SHIFT: u32 = 12;

/// Bits of an entry's position: the blob offset shifted left by one, and the `will_init` bit.
const POSITION_BITS: u32 = 48;
const WILL_INIT_BIT: u64 = 1;
/// Blob offsets an entry can hold: `[0, MAX_OFFSET)`.
const MAX_OFFSET: u64 = 1 << (POSITION_BITS - 1);

// The ephemeral file numbers its blocks with a u32, so its offsets stay below 2^45: every one
// of them fits an entry.
const _: () = assert!((u32::MAX as u64 + 1) * crate::PAGE_SZ as u64 <= MAX_OFFSET);
const _: () = assert!(size_of::<Entry>() == 14);

/// One indexed value. Packed to 14 bytes; fields are only ever copied out, never borrowed.
#[derive(Clone, Copy, Debug)]
#[repr(C, packed(2))]
struct Entry {
    lsn_delta: u32,
    older: u32,
    position_low: u32,
    position_high: u16,
}

impl Entry {
    /// `None` if `offset` is past what a position can hold.
    fn new(lsn_delta: u32, older: u32, offset: u64, will_init: bool) -> Option<Entry> {
        if offset >= MAX_OFFSET {
            return None;
        }
        let position = (offset << 1) | if will_init { WILL_INIT_BIT } else { 0 };
        Some(Entry {
            lsn_delta,
            older,
            // The low 32 bits, then the next 16: `position` has at most 48 significant bits.
            position_low: (position & 0xFFFF_FFFF) as u32,
            position_high: (position >> 32) as u16,
        })
    }

    fn position(self) -> u64 {
        (u64::from(self.position_high) << 32) | u64::from(self.position_low)
    }

    /// Offset of the value's blob in the ephemeral file.
    fn offset(self) -> u64 {
        self.position() >> 1
    }

    fn will_init(self) -> bool {
        self.position() & WILL_INIT_BIT != 0
    }
}

/// Heap bytes of a `std::collections::HashMap` with `capacity` (as it reports it) and
/// `entry_size`-byte (key, value) pairs. The std map (hashbrown) allocates a power-of-two
/// number of buckets and reports 7/8 of them as its capacity (all but one below 8 buckets);
/// one allocation holds the buckets and a control byte per bucket plus one SIMD group of
/// trailing control bytes (16 on x86-64, 8 or 16 elsewhere: counted as 16). Checked against a
/// counting allocator for capacities from 3 to 229,376.
fn hash_map_heap_bytes(capacity: usize, entry_size: usize) -> usize {
    const GROUP_WIDTH: usize = 16;
    if capacity == 0 {
        return 0;
    }
    let buckets = if capacity < 8 {
        (capacity + 1).next_power_of_two()
    } else {
        (capacity / 7 * 8).next_power_of_two()
    };
    buckets * (entry_size + 1) + GROUP_WIDTH
}

/// The entries, in fixed-size chunks: entry `i` is at slot `i % CHUNK_ENTRIES` of chunk
/// `i / CHUNK_ENTRIES`. Every chunk is allocated with room for exactly `CHUNK_ENTRIES` and
/// never grows; every chunk but the last is full.
#[derive(Default)]
struct Entries {
    chunks: Vec<Vec<Entry>>,
    len: usize,
}

impl Entries {
    /// Entry number `index`, which must be below `len` (heads and chains hold only such).
    fn get(&self, index: u32) -> Entry {
        let index = index as usize;
        self.chunks[index >> CHUNK_SHIFT][index & (CHUNK_ENTRIES - 1)]
    }

    fn push(&mut self, entry: Entry) {
        match self.chunks.last_mut() {
            Some(chunk) if chunk.len() < CHUNK_ENTRIES => chunk.push(entry),
            _ => {
                let mut chunk = Vec::with_capacity(CHUNK_ENTRIES);
                chunk.push(entry);
                self.chunks.push(chunk);
            }
        }
        self.len += 1;
    }

    /// Heap bytes by capacity: the chunks and the vector of chunk pointers.
    fn heap_bytes(&self) -> usize {
        self.chunks.capacity() * size_of::<Vec<Entry>>()
            + self
                .chunks
                .iter()
                .map(|chunk| chunk.capacity() * size_of::<Entry>())
                .sum::<usize>()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PutError {
    #[error("LSN {lsn} of key {key} goes backwards: the layer is already at {last}")]
    LsnBackwards { key: Key, lsn: Lsn, last: Lsn },
    #[error("LSN {lsn} is outside the layer's range starting at {start}")]
    OutOfRange { lsn: Lsn, start: Lsn },
    #[error(
        "LSN {lsn} is 2^32 or more past the layer's start {start}, more than one layer can span: \
         start a new layer"
    )]
    SpanTooWide { lsn: Lsn, start: Lsn },
    #[error("key {key} already has a version at LSN {lsn}")]
    Duplicate { key: Key, lsn: Lsn },
    #[error("the layer is frozen at {end}; it takes no more puts")]
    Frozen { end: Lsn },
    #[error("value of key {key} at {lsn} {source}")]
    Value {
        key: Key,
        lsn: Lsn,
        source: StoreValueError,
    },
    #[error("the layer is full: it holds {max} values")]
    Full { max: usize },
    #[error(
        "the layer's ephemeral file is {len} bytes long, past the {max} its index can address"
    )]
    FileTooLong { len: u64, max: u64 },
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
    Write(#[from] LayerFileError),
}

#[derive(Debug, thiserror::Error)]
pub enum MoveError {
    #[error("the layer is frozen at {end}; its versions can no longer move")]
    Frozen { end: Lsn },
    #[error("the layer holds versions from {start} to {last}; only one LSN can move")]
    SeveralLsns { start: Lsn, last: Lsn },
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
    /// Where the layer file written from it starts its LSN range: `start_lsn`, or below it
    /// when the layer continues the timeline's history across LSNs that hold no version (see
    /// [`InMemoryLayer::covering_from`]).
    range_start: Lsn,
    end_lsn: OnceLock<Lsn>,
    /// The highest LSN indexed (`start_lsn` while empty).
    last_lsn: AtomicU64,
    /// Entries in the index.
    len: AtomicUsize,
    /// Keys in the index.
    distinct_keys: AtomicUsize,
    index: RwLock<Index>,
    /// The index's heads in key order, built by the first scan of the layer once it is frozen.
    sorted_heads: OnceLock<Vec<(Key, u32)>>,
    /// Serializes puts and `freeze`; holds the buffer values are serialized into.
    put_lock: Mutex<Vec<u8>>,
    max_value_size: usize,
}

/// The layer's index: see the module documentation.
#[derive(Default)]
struct Index {
    heads: HashMap<Key, u32>,
    entries: Entries,
}

impl Index {
    /// Whether the chain starting at entry `head` holds a version at or below `bound` (see
    /// [`InMemoryLayer::version_bound`]; `None`: every version is).
    fn has_version_at_or_below(&self, head: u32, bound: Option<u32>) -> bool {
        let Some(bound) = bound else {
            return true;
        };
        let mut next = head;
        while next != NONE {
            let entry = self.entries.get(next);
            if entry.lsn_delta <= bound {
                return true;
            }
            next = entry.older;
        }
        false
    }

    /// The chain starting at entry `head`, newest first.
    fn chain(&self, head: u32) -> Vec<Entry> {
        let mut chain = Vec::new();
        let mut next = head;
        while next != NONE {
            let entry = self.entries.get(next);
            chain.push(entry);
            next = entry.older;
        }
        chain
    }
}

/// What `get` takes from the index to read one version.
struct VersionRef {
    lsn: Lsn,
    offset: u64,
    will_init: bool,
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
        let file = EphemeralFile::create(timeline_dir, cache)?;
        Ok(Self::with_file(file, start_lsn, max_value_size))
    }

    /// [`InMemoryLayer::create`] for a layer no reader sees before it is flushed: its values
    /// are not put into the page cache as they are written (see
    /// [`EphemeralFile::create_without_pre_warm`]), where they would push out the pages
    /// readers use.
    pub fn create_unread(
        timeline_dir: &Path,
        cache: Arc<PageCache>,
        start_lsn: Lsn,
        max_value_size: usize,
    ) -> std::io::Result<InMemoryLayer> {
        let file = EphemeralFile::create_without_pre_warm(timeline_dir, cache)?;
        Ok(Self::with_file(file, start_lsn, max_value_size))
    }

    /// A new, empty layer starting at `start_lsn`, its values in `file`, which must be empty.
    pub(crate) fn with_file(
        file: EphemeralFile,
        start_lsn: Lsn,
        max_value_size: usize,
    ) -> InMemoryLayer {
        debug_assert!(file.is_empty());
        InMemoryLayer {
            file,
            start_lsn,
            range_start: start_lsn,
            end_lsn: OnceLock::new(),
            last_lsn: AtomicU64::new(start_lsn.0),
            len: AtomicUsize::new(0),
            distinct_keys: AtomicUsize::new(0),
            index: RwLock::new(Index::default()),
            sorted_heads: OnceLock::new(),
            put_lock: Mutex::new(Vec::new()),
            max_value_size,
        }
    }

    pub fn start_lsn(&self) -> Lsn {
        self.start_lsn
    }

    /// The layer, its written range starting at `range_start` (at or below `start_lsn`): the
    /// layer files of a timeline tile its LSNs with no gap (`layer_set::manifest::history`), also where a
    /// batch jumps too far ahead for a layer starting where the last one ended to index it, or
    /// where an import's versions all lie at its last LSN. No version lies below `start_lsn`,
    /// so a read of those LSNs finds nothing here either way.
    pub fn covering_from(mut self, range_start: Lsn) -> InMemoryLayer {
        debug_assert!(range_start <= self.start_lsn);
        self.range_start = range_start.min(self.start_lsn);
        self
    }

    /// Where the layer file written from it starts its LSN range (see
    /// [`InMemoryLayer::covering_from`]).
    pub fn range_start(&self) -> Lsn {
        self.range_start
    }

    /// The exclusive end of the layer's range once frozen.
    pub fn end_lsn(&self) -> Option<Lsn> {
        self.end_lsn.get().copied()
    }

    /// The highest LSN put so far.
    pub fn last_lsn(&self) -> Lsn {
        Lsn(self.last_lsn.load(Ordering::Acquire))
    }

    /// Whether `lsn` lies within the span this layer can index: at or above `start_lsn` and
    /// less than [`MAX_LSN_SPAN`] past it. A caller rolls to a new layer before putting an LSN
    /// for which this is false; `put` refuses it.
    pub fn can_hold_lsn(&self, lsn: Lsn) -> bool {
        lsn.0
            .checked_sub(self.start_lsn.0)
            .is_some_and(|delta| delta < MAX_LSN_SPAN)
    }

    /// Number of values indexed.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of values written to the ephemeral file (what `checkpoint_distance` compares with).
    pub fn bytes_written(&self) -> u64 {
        self.file.len()
    }

    /// Whether the layer holds any version of `key`.
    pub fn has_key(&self, key: Key) -> bool {
        self.read_index().heads.contains_key(&key)
    }

    pub fn distinct_keys(&self) -> usize {
        self.distinct_keys.load(Ordering::Acquire)
    }

    /// Heap bytes held by the index, by capacity: the entry chunks, the vector of chunk
    /// pointers, the key map with its control bytes, and its sorted copy once a scan made one.
    pub fn index_bytes(&self) -> usize {
        let index = self.read_index();
        index.entries.heap_bytes()
            + hash_map_heap_bytes(index.heads.capacity(), size_of::<(Key, u32)>())
            + self
                .sorted_heads
                .get()
                .map_or(0, |sorted| sorted.capacity() * size_of::<(Key, u32)>())
    }

    /// Adds version `lsn` of `key`. Concurrent puts are serialized; readers are not blocked
    /// while the value is written to the ephemeral file.
    pub fn put(&self, key: Key, lsn: Lsn, value: &Value) -> Result<(), PutError> {
        // Nothing under the lock leaves the layer inconsistent if it panics: the index is only
        // changed under its own lock, in one step.
        let mut scratch = self.put_lock.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(end) = self.end_lsn() {
            return Err(PutError::Frozen { end });
        }
        if lsn < self.start_lsn {
            return Err(PutError::OutOfRange {
                lsn,
                start: self.start_lsn,
            });
        }
        // Only puts change it, and we hold the put lock.
        let last = self.last_lsn();
        if lsn < last {
            return Err(PutError::LsnBackwards { key, lsn, last });
        }
        // At or above start_lsn, checked above.
        let Ok(lsn_delta) = u32::try_from(lsn.0 - self.start_lsn.0) else {
            return Err(PutError::SpanTooWide {
                lsn,
                start: self.start_lsn,
            });
        };
        check_storable(value, self.max_value_size).map_err(|source| PutError::Value {
            key,
            lsn,
            source,
        })?;
        // An image's stored form is its kind byte and the page (`Value::serialize_into`): it
        // goes to the file in those two pieces, without being copied into `scratch` first.
        let kind = [KIND_IMAGE];
        let (image_parts, delta_part);
        let parts: &[&[u8]] = match value {
            Value::Image(page) => {
                image_parts = [&kind[..], &page[..]];
                &image_parts
            }
            Value::Delta { .. } | Value::WalRecord { .. } => {
                scratch.clear();
                value
                    .serialize_into(&mut scratch)
                    .map_err(|e| PutError::Value {
                        key,
                        lsn,
                        source: StoreValueError::NotEncodable(e),
                    })?;
                delta_part = [&scratch[..]];
                &delta_part
            }
        };
        // The blob goes at the end of the file: build its entry before writing, so a position
        // it cannot hold changes nothing.
        let offset = self.file.len();
        let mut entry = Entry::new(lsn_delta, NONE, offset, value.will_init()).ok_or(
            PutError::FileTooLong {
                len: offset,
                max: MAX_OFFSET,
            },
        )?;
        let (number, head) = {
            let index = self.read_index();
            let number = u32::try_from(index.entries.len)
                .ok()
                .filter(|i| *i != NONE)
                .ok_or(PutError::Full { max: NONE as usize })?;
            let head = index.heads.get(&key).copied().unwrap_or(NONE);
            if head != NONE && index.entries.get(head).lsn_delta == lsn_delta {
                return Err(PutError::Duplicate { key, lsn });
            }
            (number, head)
        };
        entry.older = head;
        // With no index lock held: readers go on while the blob's blocks are written. After
        // this only the insert is left, which cannot fail.
        let written_at = self.file.write_blob_parts(parts)?;
        debug_assert_eq!(written_at, offset, "blobs are appended at the file's end");
        let mut index = self.write_index();
        index.entries.push(entry);
        index.heads.insert(key, number);
        self.len.store(index.entries.len, Ordering::Release);
        self.distinct_keys
            .store(index.heads.len(), Ordering::Release);
        self.last_lsn.store(lsn.0, Ordering::Release);
        Ok(())
    }

    /// The versions of `key` at or below `lsn` that reconstruction needs, newest first, down to
    /// the first one that needs no older history. Reads the values with no lock held.
    pub fn get(&self, key: Key, lsn: Lsn) -> Result<LayerRecords, GetError> {
        let versions = {
            let index = self.read_index();
            let mut versions = Vec::new();
            let mut next = index.heads.get(&key).copied().unwrap_or(NONE);
            while next != NONE {
                let entry = index.entries.get(next);
                next = entry.older;
                let version_lsn = self.entry_lsn(entry);
                if version_lsn > lsn {
                    continue;
                }
                versions.push(VersionRef {
                    lsn: version_lsn,
                    offset: entry.offset(),
                    will_init: entry.will_init(),
                });
                if entry.will_init() {
                    break;
                }
            }
            versions
        };
        let mut result = LayerRecords::default();
        let cursor = self.cursor();
        let mut buf = Vec::new();
        for version in versions {
            cursor.read_blob_into_buf(version.offset, &mut buf)?;
            let value = Value::deserialize(&buf).map_err(|source| GetError::Corrupt {
                key,
                lsn: version.lsn,
                source,
            })?;
            result.records.push((version.lsn, value));
            result.complete = version.will_init;
        }
        Ok(result)
    }

    /// `lsn` (at or above `start_lsn`) as an entry's `lsn_delta` to compare with, or `None`
    /// when every indexed version is at or below it. Called under the index's read lock, so
    /// `last_lsn` matches the index.
    fn version_bound(&self, lsn: Lsn) -> Option<u32> {
        if lsn >= self.last_lsn() {
            return None;
        }
        // Below `last_lsn`, which is less than 2^32 past `start_lsn`.
        u32::try_from(lsn.0 - self.start_lsn.0).ok()
    }

    /// Moves a layer whose versions are all at its `start_lsn` to `lsn`: an import puts its
    /// versions before it knows the LSN of its snapshot (the cluster's `pg_control` may come
    /// last in the archive), into a layer no reader can see, and dates them once it does.
    /// Its written range still starts where the layer did (an import's file covers the LSNs
    /// from its base on, its versions at the last). Takes `&mut self`: the layer is not
    /// shared yet, so no reader can see it change.
    pub fn move_to_lsn(&mut self, lsn: Lsn) -> Result<(), MoveError> {
        if let Some(end) = self.end_lsn() {
            return Err(MoveError::Frozen { end });
        }
        let last = self.last_lsn();
        if last != self.start_lsn {
            return Err(MoveError::SeveralLsns {
                start: self.start_lsn,
                last,
            });
        }
        // Every entry's lsn_delta is 0 (its LSN is the start): moving the start moves them all.
        self.range_start = self.range_start.min(lsn);
        self.start_lsn = lsn;
        self.last_lsn.store(lsn.0, Ordering::Release);
        Ok(())
    }

    /// Closes the layer's range at `end_lsn` (exclusive): no more puts. Waits for a put under
    /// way to finish.
    pub fn freeze(&self, end_lsn: Lsn) -> Result<(), FreezeError> {
        let _puts = self.put_lock.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(end) = self.end_lsn() {
            return Err(FreezeError::AlreadyFrozen { end });
        }
        let last = self.last_lsn();
        if !self.is_empty() && end_lsn <= last {
            return Err(FreezeError::EndTooLow { end: end_lsn, last });
        }
        // Cannot be set already: only freeze sets it, under the put lock.
        let _ = self.end_lsn.set(end_lsn);
        Ok(())
    }

    /// Every indexed value in (key, lsn) order, read back through the ephemeral file's block
    /// reader. Blocks the page cache does not hold are read without being inserted: a scan of
    /// the whole layer must not push out what readers use.
    pub fn iter_sorted(&self) -> impl Iterator<Item = Result<(Key, Lsn, Value), GetError>> + '_ {
        let reader = self.file.bypassing_cache();
        self.sorted_entries().map(move |(key, lsn, offset)| {
            let cursor = BlockCursor::new(&reader).with_max_blob_len(self.max_stored_len());
            let blob = cursor.read_blob(offset)?;
            // The value's payloads become slices of the blob's buffer: no second copy.
            let value = Value::deserialize_bytes(blob.into())
                .map_err(|source| GetError::Corrupt { key, lsn, source })?;
            Ok((key, lsn, value))
        })
    }

    /// Every indexed version in (key, lsn) order, with the offset of its blob in the ephemeral
    /// file. The index's read lock is held only to list the keys and then to walk each key's
    /// chain, never while values are read; on an open layer, the walk covers the versions put
    /// before it started.
    fn sorted_entries(&self) -> impl Iterator<Item = (Key, Lsn, u64)> + '_ {
        let mut keys: Vec<(Key, u32)> = self
            .read_index()
            .heads
            .iter()
            .map(|(k, h)| (*k, *h))
            .collect();
        keys.sort_unstable_by_key(|(k, _)| *k);
        keys.into_iter().flat_map(move |(key, head)| {
            // Entries never change once inserted, so the chain from the head listed above is
            // the key's versions as of then. It runs newest to oldest; emit oldest first.
            let chain = self.read_index().chain(head);
            chain
                .into_iter()
                .rev()
                .map(move |entry| (key, self.entry_lsn(entry), entry.offset()))
        })
    }

    /// Writes the frozen layer as one L0 delta layer file covering all its keys and
    /// `[range_start, end_lsn)`. Returns `None` for an empty layer.
    ///
    /// The values are read back in (key, lsn) order through the ephemeral file's block reader,
    /// without filling the page cache, into one reused buffer, and copied into the delta layer
    /// as they are: the ephemeral file holds each value in the byte format the delta layer
    /// stores, so each is only checked ([`Value::check_serialized`]), never decoded and encoded
    /// again.
    pub fn write_to_disk(
        &self,
        timeline_dir: &Path,
        tenant_id: utils::TenantId,
        timeline_id: utils::TimelineId,
        compression: Compression,
    ) -> Result<Option<WrittenLayer>, WriteToDiskError> {
        let Some(end_lsn) = self.end_lsn() else {
            return Err(WriteToDiskError::NotFrozen);
        };
        if self.is_empty() {
            return Ok(None);
        }
        let mut writer = DeltaLayerWriter::new(
            timeline_dir,
            tenant_id,
            timeline_id,
            self.range_start,
            end_lsn,
        )?
        .with_compression(compression)?;
        let reader = self.file.bypassing_cache();
        let cursor = BlockCursor::new(&reader).with_max_blob_len(self.max_stored_len());
        let mut blob = Vec::new();
        for (key, lsn, offset) in self.sorted_entries() {
            cursor
                .read_blob_into_buf(offset, &mut blob)
                .map_err(GetError::from)?;
            let will_init = Value::check_serialized(&blob).map_err(|source| GetError::Corrupt {
                key,
                lsn,
                source,
            })?;
            writer.put_serialized(key, lsn, &blob, will_init)?;
        }
        Ok(Some(writer.finish()?))
    }

    /// The full LSN of an entry. Cannot overflow: `put` accepted it as an LSN.
    fn entry_lsn(&self, entry: Entry) -> Lsn {
        Lsn(self.start_lsn.0 + u64::from(entry.lsn_delta))
    }

    fn max_stored_len(&self) -> usize {
        max_stored_value_len(self.max_value_size)
    }

    fn cursor(&self) -> BlockCursor<'_, EphemeralFile> {
        BlockCursor::new(&self.file).with_max_blob_len(self.max_stored_len())
    }

    fn read_index(&self) -> RwLockReadGuard<'_, Index> {
        // A panic while inserting (only an allocation failure could cause one) leaves at worst
        // an entry no head points to yet: readers walk from heads, so that is never seen.
        self.index.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_index(&self) -> RwLockWriteGuard<'_, Index> {
        self.index.write().unwrap_or_else(PoisonError::into_inner)
    }
}

mod versions;

#[cfg(test)]
mod tests;
