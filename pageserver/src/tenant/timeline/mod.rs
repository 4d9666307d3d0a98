//! A timeline: the layer map of one (tenant, timeline), ingest into it, GetPage@LSN from it,
//! checkpoints to disk, and loading it back after a restart.
//!
//! The struct, its settings and errors live here; `ingest.rs` holds batches and freezes,
//! `layer_set/map.rs` the snapshot of layers, `read.rs` GetPage@LSN and the scan layers,
//! `lsn_wait.rs` the wait for an LSN, `flush.rs` flushes, checkpoints and shutdown,
//! `import.rs` imports (many versions at one LSN, all or none), `ancestry.rs` branches, `compaction.rs` L0 → L1
//! compaction, `image_creation.rs` image layers, `gc.rs` garbage
//! collection and the GC cutoff, `layer_set/manifest.rs` the manifest, `layer_set/change.rs` the
//! one commit every change of the layer set ends in, `init.rs` creation and loading against the
//! manifest.
//!
//! # Layer map
//!
//! ```text
//!   newest                                                        oldest
//!   open InMemoryLayer -> frozen InMemoryLayers -> delta layer files (by LSN range)
//! ```
//!
//! The map is an immutable snapshot (`layer_set/map.rs`): a read clones the current one and walks
//! it without a lock; a freeze or a flush's swap publishes a new one. Each new map has a new
//! version, which identifies the layer set for paged scans ([`Timeline::scan_page`],
//! `timeline::scan`): a scan cursor resumes only on the layer set its version streams were
//! built on.
//!
//! GetPage@LSN walks the layers from newest to oldest through one interface (`Layer`), skipping
//! without I/O those that hold nothing at or below the LSN or not the key, each other one
//! contributing the key's versions at or below the LSN, until one reaches a base (an image or a
//! `will_init` delta), and redoes the page. A materialized page in the page cache at or below the LSN serves as the base when there
//! is one: only newer versions are collected and applied on top of it. Those pages are keyed by
//! the timeline's incarnation, so a reloaded timeline never builds on a page that an earlier
//! incarnation reconstructed from versions a crash discarded.
//!
//! # Durability
//!
//! `last_record_lsn` is the newest LSN ingested; `disk_consistent_lsn` (persisted in
//! `metadata`) is the newest LSN whose versions are all in fsynced layer files. A checkpoint
//! freezes the open layer, writes each frozen layer as a delta layer (durable under its final
//! name), and only then advances `disk_consistent_lsn` in the metadata. After a crash the
//! timeline restarts at `disk_consistent_lsn`: a layer file beyond it (written, but its
//! metadata update lost) is removed, because the client re-sends everything after
//! `disk_consistent_lsn` and the versions must not exist twice. Nothing at or below
//! `disk_consistent_lsn` is ever lost or changed.
//!
//! # Ingest in batches
//!
//! Versions arrive in batches ([`Timeline::put_batch`]), like WAL records: LSNs within a batch
//! never decrease, and a batch starts above `last_record_lsn`, which it advances to its last
//! LSN. A batch is validated whole before any of it is stored, so a refused batch changes
//! nothing. Because no later batch can reuse `last_record_lsn`, the open layer can be frozen at
//! `last_record_lsn + 1` between any two batches.
//!
//! # Flushing while ingest continues
//!
//! ```text
//!   put_batch ──> open layer ──freeze──> frozen layers ──flush──> delta layer + metadata
//!                  (write_lock)            (queue)      (flush_lock, no write_lock)
//! ```
//!
//! A freeze only moves the open layer to the frozen queue, under `write_lock`: it is cheap. The
//! open layer is frozen when it reaches `checkpoint_distance` bytes (by the batch that crosses
//! it), when it is older than `checkpoint_timeout` ([`Timeline::freeze_if_due`], called by the
//! background flush loop), on [`Timeline::checkpoint`], and on shutdown. Writing frozen layers
//! to disk ([`Timeline::flush_frozen`]) holds only `flush_lock`, so puts go on into a new open
//! layer meanwhile; readers see a frozen layer until its delta layer replaces it in one swap
//! of the map snapshot. When more than `max_frozen_layers` wait, the putting thread waits, still
//! holding `write_lock`, until the oldest is written (by the background flush when it runs,
//! watched; else by the putting thread itself): ingest slows to the disk's pace instead of
//! filling memory and the ephemeral files without bound, and a batch waits for one layer's
//! write, not for every frozen layer's. Before it comes to that, while `max_frozen_layers`
//! wait, the answer to each HTTP batch is held after the batch is stored (outside `write_lock`,
//! holding no thread) for its bytes over the measured flush rate (`pacing.rs`): the open layer
//! then fills no faster than the flush empties the queue, and the slowdown is spread over every
//! batch instead of landing on one; while the upload queue is over its bound, each batch is also
//! held for its share of the time the queue needs to drain, spread over the bytes that can still
//! be stored before a batch must wait. With remote storage a flush also waits, for at most
//! `upload_queue_wait_timeout`, while the upload queue is over its bound; a batch that may have
//! to flush (the frozen layers at their bound, and the batch would fill the open layer) waits
//! so first, outside `write_lock`, and is refused (`UploadQueueFull`, a 503) with nothing
//! stored if the store takes nothing meanwhile; under `write_lock` it checks again (another
//! batch may have filled the layer first) and lets go of the lock to wait if it must.
//!
//! # Backpressure on L0 layers
//!
//! Each flush adds an L0 layer (an import a group of them at one LSN range, counted once: see
//! `layer_set/map.rs`), and a read may visit every one; the background compaction loop
//! (`tenant::tasks::compaction`, woken by a flush that reaches `compaction_threshold`) merges
//! them into L1s. If it falls behind, ingest waits for it instead of letting reads slow down
//! without bound: at an L0 depth of `l0_slowdown_threshold` a batch first waits 10 ms per L0
//! past it (at most 100 ms) or until a compaction finishes; at `l0_stop_threshold` it waits
//! until compaction brings the depth below that (refused with a 503 after `L0_STOP_MAX_WAIT`), with
//! a log line and the `pageserver_ingest_l0_wait_seconds` histogram. The wait happens outside
//! `write_lock` (nothing else waits behind a held batch) and the count is checked again under
//! it, so one batch at a time goes through on the room there is. At most
//! `max_frozen_layers + 1` frozen layers wait to be flushed past that check, so the L0 count
//! stays at or below `l0_stop_threshold + max_frozen_layers`. With `compaction_threshold = 0` there is no loop
//! and no backpressure.
//!
//! # Failure
//!
//! An error while storing a validated batch (an ephemeral file write failed) leaves part of the
//! batch in the open layer above `last_record_lsn`, where no read can see it. The timeline then
//! refuses further puts ("broken") until it is loaded again, which restarts it at
//! `disk_consistent_lsn`. A failed flush leaves its frozen layer queued; it is retried.
//!
//! A manifest store that fails after its rename leaves the change's outcome unknown until a
//! load reads the directory: the timeline breaks with its layer set unknown ([`Broken`]), and
//! then also refuses every change of the layer set and removes no file (`commit_manifest`).
//!
//! # Locks
//!
//! A thread holding one of these takes only those below it, never one above:
//!
//! | order | lock | held by | while |
//! |---|---|---|---|
//! | 1 | `import_lock` | an import | from `begin_import` to its commit or drop |
//! | 2 | `compaction_lock` | an L0 compaction | all of it (one at a time) |
//! | 3 | `image_lock` | an image creation, a GC pass, a branch point's reservation | all of it |
//! | 4 | `write_lock` | a batch, a freeze, an import's start and commit, shutdown | storing into the open layer (memory and the ephemeral file) |
//! | 5 | `flush_lock` | a flush, an import's commit | writing the frozen layers out |
//! | 6 | `lsn_leases` | a GC pass, a lease taken | from reading the oldest lease until the new cutoff is in the map |
//! | 7 | `manifest` | `commit_manifest` (`layer_set/change.rs`) | storing the manifest |
//! | 8 | `broken` | marking or reading a fault (`broken.rs`) | memory only |
//! | 9 | `l0_lock` | backpressure's wait | reading the map's L0 depth (`layers` is the one lock taken under it) |
//! | 10 | `layers` | everyone | cloning the map's `Arc`, or publishing a new map: memory, and the ephemeral file of a new open layer; never a layer file's I/O |
//! | leaf | `branch_points` | GC's retained LSNs, branch creation | memory only; nothing is taken under it |
//!
//! A batch is stored into the open layer with no map lock at all: each version becomes
//! readable as soon as its bytes are stored, so reads never wait for a batch, not even for its
//! ephemeral file writes. `wait_lsn` takes no lock: it is a future watching `last_record_lsn`
//! (`timeline/lsn_wait.rs`). Where the timeline is in its life is one atomic state
//! (`lifecycle.rs`), read without a lock.

use std::collections::HashSet;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
pub use pageserver_api::ingest::PutRecord;
use pageserver_api::{
    reconstruct_page, reconstruct_page_taking, Key, RedoError, RedoErrorKind, Value,
};
use utils::{Lsn, TenantId, TimelineId, Wakeup};

use crate::page_cache::{MaterializedPageKey, PageCache};
use crate::tenant::storage_layer::delta_layer::WrittenLayer;
use crate::tenant::storage_layer::inmemory_layer::{
    FreezeError, GetError, InMemoryLayer, PutError, WriteToDiskError, MAX_LSN_SPAN,
};
use crate::tenant::storage_layer::on_demand::{OnDemandLayer, OpenSettings};
use crate::tenant::storage_layer::LayerFileError;
use crate::tenant::storage_layer::{check_storable, Layer, LayerReadError, StoreValueError};
use crate::tenant::timeline::layer_set::manifest::{LayerLevel, Manifest, MetadataError};
use crate::PAGE_SZ;
use broken::Broken;
pub use lifecycle::Lifecycle;
use lifecycle::LifecycleCell;
use scan::{ScanCursor, ScanPage};

/// How much longer a batch waits per L0 layer past `l0_slowdown_threshold`.
const L0_SLOWDOWN_STEP: Duration = Duration::from_millis(10);
/// The longest a batch waits at slowdown.
const L0_SLOWDOWN_MAX: Duration = Duration::from_millis(100);
/// The longest a batch waits at `l0_stop_threshold` before it is refused.
pub const L0_STOP_MAX_WAIT: Duration = Duration::from_secs(60);
/// The most batches that wait at `l0_stop_threshold` on one timeline at once.
pub const MAX_L0_STOP_WAITERS: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum TimelineError {
    #[error("LSN {lsn} is at or below the durable LSN {disk_consistent}: that history is fixed")]
    LsnDurable { lsn: Lsn, disk_consistent: Lsn },
    #[error(
        "LSN {lsn} does not advance past the last ingested LSN {last_record}: a batch must start above it"
    )]
    LsnNotAdvancing { lsn: Lsn, last_record: Lsn },
    #[error("record {index} of the batch: LSN {lsn} goes backwards from {previous}")]
    BatchLsnBackwards {
        index: usize,
        lsn: Lsn,
        previous: Lsn,
    },
    #[error("record {index} of the batch: key {key} appears twice at LSN {lsn}")]
    BatchDuplicate { index: usize, key: Key, lsn: Lsn },
    #[error("record {index} of the batch: value of key {key} at {lsn} {source}")]
    BatchValue {
        index: usize,
        key: Key,
        lsn: Lsn,
        source: StoreValueError,
    },
    #[error("record {index} of the batch: {what} of key {key} at {lsn} would make a page of {len} bytes, over the limit of {max}")]
    PageTooLarge {
        index: usize,
        what: &'static str,
        key: Key,
        lsn: Lsn,
        len: usize,
        max: usize,
    },
    #[error("the batch spans LSNs {first} to {last}, more than one layer can hold")]
    BatchSpanTooWide { first: Lsn, last: Lsn },
    #[error("record {index} of the batch: {what} is reserved and cannot hold a page version")]
    Reserved { index: usize, what: String },
    #[error("LSN {lsn} is beyond the last ingested LSN {last_record}")]
    LsnNotYetIngested { lsn: Lsn, last_record: Lsn },
    #[error("LSN {lsn} is below the GC cutoff {cutoff}: history older than the cutoff is no longer kept (read at {cutoff} or later)")]
    BelowGcCutoff { lsn: Lsn, cutoff: Lsn },
    #[error(
        "timed out after {timeout:?} waiting for LSN {lsn}; the last ingested LSN is {last_record}"
    )]
    WaitLsnTimeout {
        lsn: Lsn,
        last_record: Lsn,
        timeout: Duration,
    },
    #[error("the timeline takes no more writes: {reason}")]
    Broken { reason: String },
    #[error("the timeline is shutting down")]
    ShuttingDown,
    #[error("an import into the timeline is in progress; writes wait for it to finish")]
    ImportInProgress,
    #[error("ingest is stopped: an L0 depth of {l0} waits for compaction (l0_stop_threshold is {limit}), and none was compacted in {waited:?}; try again later")]
    IngestStopped {
        l0: usize,
        limit: usize,
        waited: Duration,
    },
    #[error("{limit} reads already wait for an LSN on this timeline; try again later")]
    TooManyLsnWaiters { limit: usize },
    #[error("the upload queue holds {queued_bytes} bytes of layers, over upload_queue_max_bytes {limit}, and remote storage took none of them for {waited:?}{store_error}; nothing was lost: try again later")]
    UploadQueueFull {
        queued_bytes: u64,
        limit: u64,
        waited: Duration,
        /// "; the last upload error: ..." or empty.
        store_error: String,
    },
    #[error(transparent)]
    Put(#[from] PutError),
    #[error(transparent)]
    Get(#[from] GetError),
    #[error(transparent)]
    Freeze(#[from] FreezeError),
    #[error(transparent)]
    Flush(#[from] WriteToDiskError),
    #[error(transparent)]
    Layer(#[from] LayerFileError),
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    #[error("{0}; every layer file is kept, and the timeline takes no more writes until it is loaded again (reload the timeline)")]
    ChangeIndeterminate(MetadataError),
    #[error("layer file {name} is not on the local disk, and downloading it from remote storage failed: {reason}")]
    LayerDownload { name: String, reason: String },
    #[error("layer file {file} of the timeline: {reason}; the timeline does not serve from a layer set it cannot vouch for")]
    LayerSet { file: String, reason: String },
    #[error(
        "page {key} at {lsn} needs PostgreSQL's redo of {wal_records} WAL record(s), the oldest at {redo_from}; {}",
        materialized_words(*.materialized, *.redo_from)
    )]
    NeedsWalRedo {
        key: Key,
        lsn: Lsn,
        wal_records: usize,
        /// The oldest WAL record the read would need.
        redo_from: Lsn,
        /// The newest version below it, if the page exists there: every LSN from it up to
        /// `redo_from - 1` answers with a page.
        materialized: Option<Lsn>,
    },
    #[error("page {key} at {lsn} cannot be reconstructed: {source}")]
    Redo {
        key: Key,
        lsn: Lsn,
        source: RedoError,
    },
    #[error("timeline directory {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl TimelineError {
    /// The error of a read whose `records` (newest first) did not redo: a page that needs
    /// PostgreSQL's redo names the LSNs of the records involved.
    pub(super) fn of_redo(
        key: Key,
        lsn: Lsn,
        records: &[(Lsn, Value)],
        source: RedoError,
    ) -> TimelineError {
        let lsn_of = |index: Option<usize>| index.and_then(|i| records.get(i)).map(|(l, _)| *l);
        match (source.kind.clone(), lsn_of(source.record)) {
            (
                RedoErrorKind::NeedsWalRedo {
                    wal_records,
                    materialized,
                },
                Some(redo_from),
            ) => TimelineError::NeedsWalRedo {
                key,
                lsn,
                wal_records,
                redo_from,
                materialized: lsn_of(materialized),
            },
            _ => TimelineError::Redo { key, lsn, source },
        }
    }
}

/// Where a page that needs WAL redo is materialized, in words.
fn materialized_words(materialized: Option<Lsn>, redo_from: Lsn) -> String {
    match materialized {
        // Versions have distinct LSNs, so the one below the record is at most redo_from - 1.
        Some(at) => format!(
            "the nearest LSN where it is materialized is {} (its version of {at})",
            Lsn(redo_from.0 - 1)
        ),
        None => "it is not materialized at any LSN below that".to_owned(),
    }
}

impl From<LayerReadError> for TimelineError {
    fn from(e: LayerReadError) -> Self {
        match e {
            LayerReadError::InMemory(e) => TimelineError::Get(e),
            LayerReadError::File(e) => TimelineError::Layer(e),
            LayerReadError::Download { name, reason } => {
                TimelineError::LayerDownload { name, reason }
            }
            e @ LayerReadError::WrongLayer { .. } => TimelineError::LayerSet {
                file: "a layer a scan read".to_owned(),
                reason: e.to_string(),
            },
            LayerReadError::NotStreamed { file } => TimelineError::LayerSet {
                file,
                reason: "an image layer where versions were to be streamed".to_owned(),
            },
        }
    }
}

/// What the layer map holds, for inspection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerCounts {
    pub open_values: usize,
    pub frozen: usize,
    /// Delta layer files: `l0 + l1`.
    pub deltas: usize,
    pub l0: usize,
    pub l1: usize,
    pub images: usize,
}

/// One layer of the map, for inspection (the HTTP API's layer listing, `pagectl`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerDescription {
    pub kind: LayerKind,
    pub lsn_start: Lsn,
    /// Exclusive; `None` for the open layer.
    pub lsn_end: Option<Lsn>,
    /// Bytes on disk: the ephemeral file's length or the layer file's size.
    pub size_bytes: u64,
    /// Versions held, where cheaply known.
    pub values: u64,
    /// The layer file's name, for layer files.
    pub file_name: Option<String>,
    /// For layer files.
    pub level: Option<LayerLevel>,
    /// Whether its file is on the local disk (an on-demand layer's may be evicted).
    pub resident: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    Open,
    Frozen,
    Delta,
    Image,
}

/// The timeline's copy in remote storage, as the timeline sees it (implemented by
/// `tenant::remote_timeline_client`, which drives the uploads; the timeline knows nothing of
/// object stores).
pub trait RemoteCopy: Send + Sync {
    /// A manifest was committed. Called under the manifest's lock, so in commit order, with
    /// every layer it lists durable on the local disk.
    fn manifest_committed(&self, manifest: &Manifest);
    /// Called by a flush before it writes a layer: blocks while too many bytes wait for
    /// upload (the upload queue's backpressure), until `cancelled` says to stop waiting (then
    /// `Ok`), or for at most `upload_queue_wait_timeout` (then
    /// [`TimelineError::UploadQueueFull`]).
    fn wait_for_upload_room(&self, cancelled: &dyn Fn() -> bool) -> Result<(), TimelineError>;
    /// Whether a flush would find room in the upload queue now, without waiting.
    fn has_upload_room(&self) -> bool;
    /// How long the upload queue will take to get back within its bound at the rate uploads
    /// have been going: zero while it is within it, or before any upload was timed. What the
    /// ingest pacer spreads over the batches that can still be stored before one must wait.
    fn upload_backlog(&self) -> Duration;
    /// Everything at or below it is in remote storage.
    fn remote_consistent_lsn(&self) -> Lsn;
    /// Whether the store holds layer file `name` as listed (so its local copy may be evicted).
    fn is_in_store(&self, name: &str, size: u64, crc32c: u32) -> bool;
    /// Stops the uploads once the timeline stops; with `drain`, first waits (bounded) for
    /// what is queued to reach the store.
    fn stop(&self, drain: bool);
    /// The timeline's WAL receiver made WAL of PostgreSQL timeline `tli` durable in the local
    /// directory `dir` up to `flushed`: it is archived from there.
    fn wal_flushed(&self, _dir: &Path, _tli: u32, _segment_size: u32, _flushed: Lsn) {}
    /// The WAL receiver's settings were stored (`Some`) or removed, to follow the timeline.
    fn set_wal_receiver(&self, _settings: Option<serde_json::Value>) {}
    /// The WAL receiver's settings as the remote index has them.
    fn wal_receiver_settings(&self) -> Option<serde_json::Value> {
        None
    }
    /// Just past the last byte of WAL in remote storage.
    fn archived_lsn(&self) -> Option<Lsn> {
        None
    }
    /// Makes WAL segment `name` a file in the local WAL directory `dir`, from remote storage
    /// when the directory lacks it; `Ok(false)` when neither has it.
    fn fetch_wal(&self, _dir: &Path, _name: &str) -> Result<bool, String> {
        Ok(false)
    }
    /// The WAL segments remote storage holds, oldest first, with their commits: the index of
    /// searches by time (`walreceiver::commit_time`). `None` without WAL.
    fn archived_wal_segments(&self) -> Option<ArchivedWalSegments> {
        None
    }
    /// An LSN at or below the state at `unix_micros` (microseconds since the Unix epoch), from
    /// the commit times of the WAL archive; `None` when it has none.
    fn lsn_floor_at_time(&self, _unix_micros: i64) -> Option<Lsn> {
        None
    }
    /// WAL below `floor` serves no restore any more (`gc/wal_floor.rs`): the archive removes
    /// its whole segments, locally and in the store.
    fn retain_wal_from(&self, _floor: Lsn) {}
    /// Makes every WAL segment remote storage holds of `from..=to` a file in `dir`.
    fn fetch_wal_range(&self, _dir: &Path, _from: Lsn, _to: Lsn) -> Result<(), String> {
        Ok(())
    }
}

/// The WAL segments of a timeline's WAL archive (see [`RemoteCopy::archived_wal_segments`]).
#[derive(Clone, Debug, Default)]
pub struct ArchivedWalSegments {
    pub segment_size: u32,
    /// Segment number, file name, and the first and last commit ending in it (when read).
    pub segments: Vec<(u64, String, Option<postgres_wal::xact::CommitRange>)>,
}

/// What only the writer (the holder of `write_lock`) looks at.
#[derive(Default)]
struct WriterState {
    /// When the open layer got its first version (what `checkpoint_timeout` measures).
    open_since: Option<Instant>,
}

/// See the module documentation.
pub struct Timeline {
    tenant_id: TenantId,
    timeline_id: TimelineId,
    /// Keys this incarnation's materialized pages in the page cache. A new one per load: pages
    /// reconstructed by an earlier incarnation may rest on versions that a crash discarded
    /// (above `disk_consistent_lsn`), and the cache outlives the timeline.
    cache_scope: TimelineId,
    dir: PathBuf,
    cache: Arc<PageCache>,
    conf: TimelineConf,
    /// The current layer map; see `layer_set/map.rs`. Held only to clone or replace the `Arc`.
    layers: RwLock<Arc<LayerMap>>,
    write_lock: Mutex<WriterState>,
    /// Why the timeline refuses writes, once it does (never cleared: only a load recovers).
    /// Apart from `write_lock` so that describing the timeline never waits for a put.
    broken: Mutex<Option<Broken>>,
    flush_lock: Mutex<()>,
    /// Holds HTTP batches at the pace of the flush and of the uploads while the frozen layers or
    /// the upload queue are at their bounds (`pacing.rs`).
    pacer: pacing::IngestPacer,
    /// Held by a compaction: one at a time.
    compaction_lock: Mutex<()>,
    /// Held by image creation and by GC: one of them at a time, never waited for by L0
    /// compaction.
    image_lock: Mutex<()>,
    /// The durable manifest: `disk_consistent_lsn` and the layer files. Held while a new one
    /// is stored (`commit_manifest`), and replaced once it is.
    manifest: Mutex<Manifest>,
    flush_wakeup: Option<Arc<Wakeup>>,
    /// Wakes the background compaction loop; without one there is no L0 backpressure (nothing
    /// would lower the count).
    compaction_wakeup: Option<Arc<Wakeup>>,
    /// Notified whenever a compaction lowers the L0 count, for batches held by backpressure.
    l0_lock: Mutex<()>,
    l0_changed: std::sync::Condvar,
    /// Batches waiting at `l0_stop_threshold` now.
    l0_stop_waiters: std::sync::atomic::AtomicUsize,
    /// For a branch: its ancestor and the branch LSN (`ancestry.rs`); set before sharing.
    ancestor: OnceLock<(Arc<Timeline>, Lsn)>,
    /// The LSNs this timeline's branches start at: GC retains them.
    branch_points: Mutex<Vec<Lsn>>,
    /// The LSNs leased by reads in progress (`lsn_lease.rs`): GC's cutoff stays at or below
    /// the oldest.
    lsn_leases: Mutex<lsn_lease::Leases>,
    /// Held by an import (`import.rs`): one at a time.
    import_lock: Mutex<()>,
    /// Active, importing, shutting down or stopped (`lifecycle.rs`).
    lifecycle: LifecycleCell,
    last_record_lsn: AtomicU64,
    disk_consistent_lsn: AtomicU64,
    /// Reads waiting for `last_record_lsn` to reach theirs.
    lsn_wait: LsnWait,
    /// Set once, before the timeline is shared: its copy in remote storage.
    remote: OnceLock<Arc<dyn RemoteCopy>>,
    /// With remote storage: how L1 and image layers download on demand (they are then
    /// `Layer::OnDemand`, and their local copies can be evicted).
    on_demand: Option<OpenSettings>,
}

impl Timeline {
    /// Wakes `wakeup` whenever a layer is frozen, so a background flush loop writes it out.
    pub fn with_flush_wakeup(mut self, wakeup: Arc<Wakeup>) -> Timeline {
        self.flush_wakeup = Some(wakeup);
        self
    }

    /// Wakes `wakeup` whenever a flush adds an L0 layer past `compaction_threshold`, and turns
    /// on the backpressure that waits for the loop it wakes.
    pub fn with_compaction_wakeup(mut self, wakeup: Arc<Wakeup>) -> Timeline {
        self.compaction_wakeup = Some(wakeup);
        self
    }

    /// Tells `remote` of every manifest committed from now on. Call it before the timeline
    /// is shared (with the manifest it has now: [`Timeline::manifest_snapshot`]); a second
    /// call is refused.
    pub fn set_remote_copy(&self, remote: Arc<dyn RemoteCopy>) -> Result<(), TimelineError> {
        self.remote.set(remote).map_err(|_| TimelineError::Broken {
            reason: "the timeline already has a remote copy".to_owned(),
        })
    }

    /// Its copy in remote storage, if it has one.
    pub fn remote_copy(&self) -> Option<&Arc<dyn RemoteCopy>> {
        self.remote.get()
    }

    /// Everything at or below it is in remote storage; `None` without remote storage.
    pub fn remote_consistent_lsn(&self) -> Option<Lsn> {
        self.remote.get().map(|r| r.remote_consistent_lsn())
    }

    pub fn tenant_id(&self) -> TenantId {
        self.tenant_id
    }

    pub fn timeline_id(&self) -> TimelineId {
        self.timeline_id
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn conf(&self) -> &TimelineConf {
        &self.conf
    }

    pub fn last_record_lsn(&self) -> Lsn {
        Lsn(self.last_record_lsn.load(Ordering::SeqCst))
    }

    pub fn disk_consistent_lsn(&self) -> Lsn {
        Lsn(self.disk_consistent_lsn.load(Ordering::Acquire))
    }

    /// The L0 layers' depth: what the compaction and backpressure thresholds count (see
    /// `layer_set/map.rs`: an import's group of L0s counts once).
    pub fn l0_depth(&self) -> usize {
        self.layer_map().l0_depth()
    }

    pub fn layer_counts(&self) -> LayerCounts {
        let map = self.layer_map();
        let images = map.below_l0.iter().filter(|l| l.is_image()).count();
        let l1 = map.below_l0.len() - images;
        LayerCounts {
            open_values: map.open.as_ref().map_or(0, |l| l.len()),
            frozen: map.frozen.len(),
            deltas: map.l0.len() + l1,
            l0: map.l0.len(),
            l1,
            images,
        }
    }

    /// Every layer, newest first.
    pub fn layers(&self) -> Vec<LayerDescription> {
        let map = self.layer_map();
        let in_memory = |kind, l: &InMemoryLayer| LayerDescription {
            kind,
            lsn_start: l.range_start(),
            lsn_end: l.end_lsn(),
            size_bytes: l.bytes_written(),
            values: l.len() as u64,
            file_name: None,
            level: None,
            resident: true,
        };
        let open = map.open.iter().map(|l| in_memory(LayerKind::Open, l));
        let frozen = map
            .frozen
            .iter()
            .rev()
            .map(|l| in_memory(LayerKind::Frozen, l));
        let files = map.files().into_iter().map(|(level, layer)| {
            let lsns = layer.lsn_range();
            let (kind, size_bytes, values, file_name) = match &layer {
                Layer::Delta(l) => (
                    LayerKind::Delta,
                    l.file_size(),
                    l.summary().entries,
                    l.summary().file_name(),
                ),
                Layer::Image(l) => (
                    LayerKind::Image,
                    l.file_size(),
                    l.summary().entries,
                    l.summary().layer_name().to_string(),
                ),
                Layer::OnDemand(l) => {
                    let values = match l.loaded() {
                        Some(Layer::Delta(d)) => d.summary().entries,
                        Some(Layer::Image(i)) => i.summary().entries,
                        _ => 0,
                    };
                    let kind = if l.is_image() {
                        LayerKind::Image
                    } else {
                        LayerKind::Delta
                    };
                    (kind, l.file_size(), values, l.file_name().to_owned())
                }
                Layer::InMemory(_) => unreachable!("layer files only"),
            };
            LayerDescription {
                kind,
                lsn_start: lsns.start,
                lsn_end: Some(lsns.end),
                size_bytes,
                values,
                file_name: Some(file_name),
                level: Some(level),
                resident: layer.is_resident(),
            }
        });
        open.chain(frozen).chain(files).collect()
    }

    /// Makes every `wait_lsn`, now and later, that would have to wait return "shutting down".
    pub fn cancel_lsn_waits(&self) {
        self.lsn_wait.cancel();
    }

    /// Waits until `lsn` has been ingested, for at most `timeout`, holding no thread (see
    /// `timeline/lsn_wait.rs`). Refused at once when `max_lsn_waiters` reads already wait.
    pub async fn wait_lsn(&self, lsn: Lsn, timeout: Duration) -> Result<(), TimelineError> {
        if self.last_record_lsn() >= lsn {
            return Ok(());
        }
        self.lsn_wait.wait(lsn, timeout).await
    }

    /// Reads waiting in [`Timeline::wait_lsn`] now.
    pub fn lsn_waiters(&self) -> usize {
        self.lsn_wait.waiters()
    }

    /// The manifest as last stored.
    fn manifest(&self) -> MutexGuard<'_, Manifest> {
        self.manifest.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The layer files of the timeline as its durable manifest lists them.
    pub fn manifest_snapshot(&self) -> Manifest {
        self.manifest().clone()
    }

    fn writer(&self) -> MutexGuard<'_, WriterState> {
        self.write_lock.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current layer map: a snapshot that no change affects (see `layer_set/map.rs`).
    fn layer_map(&self) -> Arc<LayerMap> {
        self.layers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Changes the layer map: `change` edits a copy of the current one, which replaces it
    /// (with a new version) unless `change` fails. Changes are serialized by the map's lock,
    /// held for the edit: keep it to memory work.
    fn update_layer_map<T, E>(
        &self,
        change: impl FnOnce(&mut LayerMap) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut current = self.layers.write().unwrap_or_else(|e| e.into_inner());
        let mut next = LayerMap::clone(&current);
        let result = change(&mut next)?;
        next.version = current.version + 1;
        *current = Arc::new(next);
        Ok(result)
    }
}

mod ancestry;
mod broken;
mod compaction;
mod conf;
mod flush;
mod gc;
mod image_creation;
mod import;
mod ingest;
mod init;
pub mod layer_set;
mod lifecycle;
mod lsn_lease;
mod lsn_wait;
mod pacing;
mod read;
mod residence;
pub mod scan;
#[cfg(test)]
mod test_model;
pub use ancestry::{Ancestry, ANCESTOR_FILE};
pub use compaction::CompactionOutcome;
pub use conf::TimelineConf;
pub use gc::GcOutcome;
pub use image_creation::ImageCreationOutcome;
pub use import::{Import, IMPORT_RUN_MIN_BYTES, MAX_IMPORT_RUNS};
pub use init::{open_listed_layer, RemoteLayers, WAL_DIR, WAL_RECEIVER_FILE};
use layer_set::change::{ChangeKind, LayerChange, NewLayerFile};
use layer_set::manifest;
use layer_set::map::LayerMap;
pub use layer_set::policy::MAX_COMPACTION_INPUTS;
use layer_set::policy::{self, CompactionChoice};
pub use lsn_lease::LsnLease;
use lsn_wait::LsnWait;
pub use residence::LocalCopy;
#[cfg(test)]
mod tests;
