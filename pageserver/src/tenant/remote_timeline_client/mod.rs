//! A timeline's copy in remote storage: the upload queue that follows every committed
//! manifest into the object store, and the remote index (`index.rs`) that is its commit point.
//!
//! # Remote layout
//!
//! ```text
//!   tenants/<tenant>/timelines/<timeline>/index_part.json-<generation>
//!   tenants/<tenant>/timelines/<timeline>/<layer file name>-<generation>
//!   tenants/<tenant>/timelines/<timeline>/wal/<WAL segment>[.partial]-<generation>
//! ```
//!
//! Every object carries the generation of the attachment that wrote it (`utils::Generation`),
//! so two attachments never write the same object.
//!
//! # Upload queue
//!
//! The timeline tells its client of each manifest it commits ([`RemoteCopy::manifest_committed`],
//! under the manifest's lock, so in commit order). The client turns it into the index it wants
//! in the store (a *target*, queued in commit order) and wakes its task, which works towards
//! the newest step by step by the rules of `upload_plan.rs`: the newest target whose layers are
//! all in the store is uploaded as this generation's index; otherwise the oldest target's
//! missing layers are uploaded (four at a time to S3, one at a time into a local directory, each
//! streamed from its local file); objects no
//! index needs are deleted last. Each storage operation of a step is retried by remote storage
//! itself, with backoff, until its deadline (`remote_storage_operation_timeout`); a step that
//! still failed is logged and tried again after [`STEP_RETRY_DELAY`], or after
//! [`OPERATOR_RETRY_DELAY`] when its error needs an operator (no such bucket, access denied,
//! credentials refused), which waiting alone cannot cure: forever either way, because the queue
//! is the durability path and is never dropped. It is not persisted: the local manifest and
//! the remote index rebuild it at the next start.
//!
//! Ingest never waits for the store, except through the queue's bound: a flush waits before
//! writing a layer while more than `upload_queue_max_bytes` of layers wait for upload
//! (`pageserver_upload_queue_wait_seconds`, and a log line per wait), for at most
//! `upload_queue_wait_timeout`; then the flush fails with
//! [`TimelineError::UploadQueueFull`](crate::tenant::timeline::TimelineError::UploadQueueFull),
//! which an ingest batch answers as 503 with `Retry-After`. Before that, while the queue is over
//! its bound, the timeline paces HTTP ingest by the time the queue needs to drain at the rate
//! layers have been reaching the store (`upload_rate.rs`; `timeline/pacing.rs`).
//!
//! # WAL
//!
//! The WAL a receiver stores locally is archived by a task of its own (`wal_archive.rs`), and
//! listed in the index's WAL section (`wal_index.rs`), which the queue uploads like any
//! change: see `upload_plan.rs` for how a WAL change overtakes layers in flight.
//!
//! # Downloads
//!
//! Reads of layers that are not on the local disk download them through the client
//! (`download.rs`), with remote storage's deadlines.
//!
//! # Durability
//!
//! `remote_consistent_lsn` is the `disk_consistent_lsn` of the newest durable index: every
//! version at or below it can be rebuilt from the store alone, after the local disk is lost.
//!
//! # Threads
//!
//! The client's task runs on the remote storage runtime ([`RemoteContext`]); the timeline's
//! threads only lock the plan, and a flush waits on a condition variable.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use remote_storage::{RemoteError, RemotePath, RemoteStorage, Transferred};
use utils::{Generation, TenantId, TimelineId};

use crate::io::transfer_file::TransferFile;
use crate::tenant::timeline::layer_set::manifest::history;
use crate::tenant::timeline::Ancestry;
use crate::tenant::timeline::RemoteCopy;

mod discovery;
mod download;
pub mod index;
mod remote_copy;
#[cfg(test)]
mod tests;
mod upload_plan;
mod upload_rate;
mod wal_archive;
mod wal_commits;
pub mod wal_index;

use index::{
    classify_object, index_path, layer_path, timeline_path, IndexLayer, IndexPart, RemoteObject,
};
use upload_plan::{Step, UploadPlan};
use upload_rate::{DrainEstimate, UploadRate};
use wal_index::WalIndex;

use discovery::parse_index;
pub use discovery::{download_newest_index, list_tenant, TenantInStore};

/// A failed step is tried again after this: its operations were retried with backoff already,
/// up to their deadline, so this is only a pause between rounds.
pub const STEP_RETRY_DELAY: Duration = Duration::from_secs(1);
/// ...or after this, when the error needs an operator: logged each time, without spinning.
pub const OPERATOR_RETRY_DELAY: Duration = Duration::from_secs(30);
/// The default of `upload_queue_wait_timeout`.
pub const DEFAULT_UPLOAD_ROOM_TIMEOUT: Duration = Duration::from_secs(30);
/// The default of `wal_upload_interval`.
pub const DEFAULT_WAL_UPLOAD_INTERVAL: Duration = Duration::from_secs(1);
/// A branch waiting for its ancestor's uploads looks again at least this often (a stop, or an
/// ancestor index uploaded while it was not listening yet).
const ANCESTOR_RECHECK: Duration = Duration::from_secs(1);
/// How long a graceful shutdown waits for a timeline's uploads to drain.
pub const SHUTDOWN_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// The remote storage every timeline of a pageserver shares, and the runtime its transfers run
/// on (two threads: the work is waiting on the network or the disk).
pub struct RemoteContext {
    pub storage: RemoteStorage,
    runtime: Option<tokio::runtime::Runtime>,
    /// A flush waits while more than this many bytes of layers wait for upload...
    pub upload_queue_max_bytes: u64,
    /// ...for at most this long.
    pub upload_room_timeout: Duration,
    /// The local layer files are kept within this many bytes by eviction (0: no limit).
    pub max_local_layer_bytes: u64,
    /// The WAL archive uploads the partial tail of the WAL at least this often
    /// (`wal_upload_interval`).
    pub wal_upload_interval: Duration,
}

impl RemoteContext {
    pub fn new(
        storage: RemoteStorage,
        upload_queue_max_bytes: u64,
        max_local_layer_bytes: u64,
    ) -> std::io::Result<RemoteContext> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("remote-storage")
            .enable_all()
            .build()?;
        Ok(RemoteContext {
            storage,
            runtime: Some(runtime),
            upload_queue_max_bytes,
            upload_room_timeout: DEFAULT_UPLOAD_ROOM_TIMEOUT,
            max_local_layer_bytes,
            wal_upload_interval: DEFAULT_WAL_UPLOAD_INTERVAL,
        })
    }

    /// Sets how long a flush waits for room in the upload queue (`upload_queue_wait_timeout`).
    pub fn with_upload_room_timeout(mut self, timeout: Duration) -> RemoteContext {
        self.upload_room_timeout = timeout;
        self
    }

    /// Sets how often the WAL archive uploads the WAL's partial tail (`wal_upload_interval`).
    pub fn with_wal_upload_interval(mut self, interval: Duration) -> RemoteContext {
        self.wal_upload_interval = interval;
        self
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        self.runtime
            .as_ref()
            .expect("the runtime lives as long as the context")
            .handle()
    }

    /// Runs `future` on the remote runtime and waits for it, from any thread that is not one
    /// of an async runtime's workers (the blocking pool, our own threads, tests).
    pub fn block_on<T: Send + 'static>(
        &self,
        future: impl std::future::Future<Output = T> + Send + 'static,
    ) -> T {
        futures::executor::block_on(self.handle().spawn(future))
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
    }
}

impl Drop for RemoteContext {
    fn drop(&mut self) {
        // Dropping a runtime inside another's context panics; this works anywhere.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RemoteClientError {
    #[error(transparent)]
    Storage(#[from] RemoteError),
    #[error("remote index {key} is corrupt: {reason}")]
    CorruptIndex { key: String, reason: String },
    #[error("remote index {key} belongs to timeline {found_timeline} of tenant {found_tenant}")]
    WrongIndex {
        key: String,
        found_tenant: TenantId,
        found_timeline: TimelineId,
    },
    #[error("the timeline's local directory: {0}")]
    Local(String),
}

impl RemoteClientError {
    /// Whether only an operator can end it (see [`RemoteError::needs_operator`]).
    fn needs_operator(&self) -> bool {
        match self {
            RemoteClientError::Storage(e) => e.needs_operator(),
            RemoteClientError::CorruptIndex { .. } | RemoteClientError::WrongIndex { .. } => true,
            RemoteClientError::Local(_) => false,
        }
    }
}

struct ClientState {
    plan: UploadPlan,
    stopping: bool,
    /// The indexes this client tried to claim its generation with (see `Step::UploadIndex`).
    claims: Vec<Bytes>,
    /// The error of the last failed step, until a step succeeds.
    last_error: Option<String>,
    /// How fast layers have been reaching the store (`upload_rate.rs`).
    upload_rate: UploadRate,
}

/// See the module documentation.
pub struct RemoteTimelineClient {
    /// Itself, for the tasks it starts after `start`.
    me: std::sync::Weak<RemoteTimelineClient>,
    context: Arc<RemoteContext>,
    /// For a branch: written into every index.
    ancestry: Option<Ancestry>,
    /// For a branch: its ancestor's client. No index of the branch is uploaded before the
    /// ancestor's `remote_consistent_lsn` reaches the branch LSN, so the store never holds a
    /// branch whose ancestor's history there ends below its branch point (an attach from it
    /// would find reads at the branch point answered from history the ancestor does not have).
    ancestor: std::sync::OnceLock<Arc<RemoteTimelineClient>>,
    /// Signalled whenever an index of this timeline is uploaded (for branches waiting on it).
    index_uploaded: tokio::sync::Notify,
    /// Index uploads of this branch held back because the ancestor's store lagged.
    held_for_ancestor: AtomicU64,
    /// How long the queue needs to get back within its bound, for the ingest pacer.
    drain: DrainEstimate,
    /// Layer downloads that failed lately: name → when, and the error (see
    /// [`FAILED_DOWNLOAD_SHARED_FOR`]).
    failed_downloads: Mutex<HashMap<String, (Instant, String)>>,
    tenant_id: TenantId,
    timeline_id: TimelineId,
    generation: Generation,
    remote_dir: RemotePath,
    local_dir: PathBuf,
    state: Mutex<ClientState>,
    /// Signalled whenever the plan moves (for flushes waiting for room, and drains).
    progressed: Condvar,
    /// Wakes the task.
    wakeup: tokio::sync::Notify,
    remote_consistent_lsn: AtomicU64,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The WAL archive's state (`wal_archive.rs`), and what wakes its task.
    wal: Mutex<wal_archive::WalArchiveState>,
    wal_wakeup: tokio::sync::Notify,
}

impl RemoteTimelineClient {
    /// Reads the timeline's newest index at or below `generation` from the store, and starts
    /// the upload task from it. Returns the client and that index (`None`: the store has
    /// nothing of the timeline). Nothing is uploaded until the first manifest is handed over
    /// ([`RemoteCopy::manifest_committed`]).
    pub fn start(
        context: Arc<RemoteContext>,
        tenant_id: TenantId,
        timeline_id: TimelineId,
        generation: Generation,
        local_dir: &Path,
    ) -> Result<(Arc<RemoteTimelineClient>, Option<IndexPart>), RemoteClientError> {
        let remote_dir = timeline_path(tenant_id, timeline_id);
        let durable = {
            let storage = context.storage.clone();
            let remote_dir = remote_dir.clone();
            context.block_on(async move {
                download_newest_index(&storage, &remote_dir, tenant_id, timeline_id, generation)
                    .await
            })?
        };
        // Before anything acts on it: the queue's sweep deletes every layer object the durable
        // index does not list, so an index that lost a layer would take the layer's object
        // with it. Refused here, the timeline fails to load and the store stays as it is.
        if let Some(index) = &durable {
            if let Err(e) = history::check(&index.to_manifest()) {
                return Err(RemoteClientError::CorruptIndex {
                    key: index_path(&remote_dir, index.generation).to_string(),
                    reason: format!("its layers do not hold the whole history it claims: {e}"),
                });
            }
        }
        // Written with the timeline's directory and never changed: read once.
        let ancestry =
            Ancestry::read(local_dir).map_err(|e| RemoteClientError::Local(e.to_string()))?;
        let client = Arc::new_cyclic(|me| RemoteTimelineClient {
            me: me.clone(),
            ancestry,
            ancestor: std::sync::OnceLock::new(),
            index_uploaded: tokio::sync::Notify::new(),
            held_for_ancestor: AtomicU64::new(0),
            drain: DrainEstimate::default(),
            failed_downloads: Mutex::new(HashMap::new()),
            tenant_id,
            timeline_id,
            generation,
            remote_dir,
            local_dir: local_dir.to_owned(),
            remote_consistent_lsn: AtomicU64::new(
                durable.as_ref().map_or(0, |i| i.disk_consistent_lsn.0),
            ),
            state: Mutex::new(ClientState {
                plan: UploadPlan::new(generation, durable.clone()),
                stopping: false,
                claims: Vec::new(),
                last_error: None,
                upload_rate: UploadRate::default(),
            }),
            progressed: Condvar::new(),
            wakeup: tokio::sync::Notify::new(),
            task: Mutex::new(None),
            wal: Mutex::new(Default::default()),
            wal_wakeup: tokio::sync::Notify::new(),
            context: context.clone(),
        });
        let task = context.handle().spawn(client.clone().run());
        *lock(&client.task) = Some(task);
        Ok((client, durable))
    }

    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// Holds this branch's index uploads until `ancestor` (the client of its ancestor) has
    /// its history up to the branch LSN in the store; see the field `ancestor`. Once per
    /// client; a client that is not a branch's ignores it.
    pub fn follow_ancestor(&self, ancestor: Arc<RemoteTimelineClient>) {
        if self.ancestry.is_some() {
            let _ = self.ancestor.set(ancestor);
            self.wakeup.notify_one();
        }
    }

    /// For a branch: its ancestor and branch LSN, as its directory names them.
    pub fn ancestry(&self) -> Option<Ancestry> {
        self.ancestry
    }

    /// How many times an index upload of this branch was held back for its ancestor's.
    pub fn index_uploads_held_for_ancestor(&self) -> u64 {
        self.held_for_ancestor.load(Ordering::Acquire)
    }

    /// The ancestor's client, while its `remote_consistent_lsn` is below the branch LSN.
    fn ancestor_behind(&self) -> Option<&Arc<RemoteTimelineClient>> {
        let (ancestor, branch_lsn) = (self.ancestor.get()?, self.ancestry?.lsn);
        (RemoteCopy::remote_consistent_lsn(ancestor.as_ref()) < branch_lsn).then_some(ancestor)
    }

    /// Bytes of committed layers not yet in the store.
    pub fn queued_bytes(&self) -> u64 {
        self.state().plan.pending_bytes()
    }

    /// Whether the store holds exactly what the newest committed manifest lists, and nothing
    /// more of this generation's making, and all the WAL reported flushed.
    pub fn is_settled(&self) -> bool {
        let state = self.state();
        state.plan.is_settled() && self.wal_caught_up(&state.plan)
    }

    /// Whether a newer generation's index was found: this attachment is stale and uploads
    /// nothing more.
    pub fn is_fenced(&self) -> bool {
        self.state().plan.is_fenced()
    }

    /// The error of the last failed step, while steps fail.
    pub fn last_error(&self) -> Option<String> {
        let state = self.state();
        let wal =
            || (lock(&self.wal).last_error.clone()).map(|e| format!("archiving the WAL: {e}"));
        state.last_error.clone().or_else(wal)
    }

    /// Waits until the queue is settled, for at most `timeout`; `false` if it is not.
    pub fn wait_settled(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        // The WAL archive archives its tail now, not at its next interval.
        self.wal_wakeup.notify_one();
        let mut state = self.state();
        loop {
            let settled = state.plan.is_settled() && self.wal_caught_up(&state.plan);
            if settled || state.plan.is_fenced() {
                return settled;
            }
            let now = Instant::now();
            if now >= deadline || state.stopping {
                return false;
            }
            state = self
                .progressed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// The timeline is being deleted: stops the uploads and deletes its objects of this and
    /// older generations, the indexes first (so a crash midway leaves unlisted layers, which
    /// a later upload's sweep removes, never an index listing deleted layers). A stale
    /// attachment deletes nothing.
    pub fn delete_remote_objects(self: &Arc<Self>) -> Result<(), RemoteClientError> {
        RemoteCopy::stop(self.as_ref(), false);
        let this = self.clone();
        self.context.block_on(async move {
            if this.fenced_by_newer_index().await? {
                return Ok(());
            }
            let mut listed = this.list().await?;
            // Indexes first.
            listed.sort_by_key(|(object, _)| !matches!(object, RemoteObject::Index(_)));
            for (object, key) in listed {
                let ours = match object {
                    RemoteObject::Index(g) => g <= this.generation,
                    RemoteObject::Layer { generation, .. }
                    | RemoteObject::Wal { generation, .. } => generation <= this.generation,
                    RemoteObject::Other => false,
                };
                if ours {
                    let result = this.context.storage.delete(&key).await;
                    count("delete", &result);
                    result?;
                }
            }
            Ok(())
        })
    }

    fn state(&self) -> MutexGuard<'_, ClientState> {
        lock(&self.state)
    }

    /// The task: steps towards the target until stopped.
    async fn run(self: Arc<Self>) {
        loop {
            let step = {
                let state = self.state();
                if state.stopping {
                    break;
                }
                state.plan.next()
            };
            if step == Step::Idle {
                self.wakeup.notified().await;
                continue;
            }
            match self.execute(step).await {
                Ok(()) => self.state().last_error = None,
                Err(e) => {
                    let delay = if e.needs_operator() {
                        tracing::error!(tenant = %self.tenant_id, timeline = %self.timeline_id,
                            retry_in_s = OPERATOR_RETRY_DELAY.as_secs(),
                            "remote upload queue step failed, and only a change of the remote storage settings, credentials or bucket can fix it: {e}");
                        OPERATOR_RETRY_DELAY
                    } else {
                        tracing::error!(tenant = %self.tenant_id, timeline = %self.timeline_id,
                            retry_in_s = STEP_RETRY_DELAY.as_secs(), "remote upload queue step failed: {e}");
                        STEP_RETRY_DELAY
                    };
                    self.state().last_error = Some(e.to_string());
                    self.progressed.notify_all();
                    // Woken early by a stop; a new commit does not cut the wait short.
                    let _ = tokio::time::timeout(delay, async {
                        while !self.state().stopping {
                            self.wakeup.notified().await;
                        }
                    })
                    .await;
                }
            }
            self.publish_drain(&self.state());
            self.progressed.notify_all();
        }
        self.progressed.notify_all();
    }

    /// Whether the upload queue is within its bound (a fenced plan uploads nothing more: it
    /// holds no flush back).
    fn has_room(&self, state: &ClientState) -> bool {
        state.plan.pending_bytes() <= self.context.upload_queue_max_bytes || state.plan.is_fenced()
    }

    /// Publishes how long the queue needs to get back within its bound (`upload_rate.rs`):
    /// called under the state's lock after every change of the queue.
    fn publish_drain(&self, state: &ClientState) {
        let excess = if state.plan.is_fenced() || state.stopping {
            0
        } else {
            (state.plan.pending_bytes()).saturating_sub(self.context.upload_queue_max_bytes)
        };
        let parallel = (self.context.storage.objects_in_flight()).min(state.plan.pending_layers());
        self.drain.publish(excess, &state.upload_rate, parallel);
    }

    async fn execute(&self, step: Step) -> Result<(), RemoteClientError> {
        let storage = &self.context.storage;
        match step {
            Step::Idle => Ok(()),
            Step::UploadLayers(layers) => {
                let mut uploads = futures::stream::iter(layers)
                    .map(|(name, layer)| async move {
                        let started = Instant::now();
                        let result = self.upload_layer(&name, &layer).await;
                        (name, layer, result, started.elapsed())
                    })
                    .buffer_unordered(storage.objects_in_flight());
                let mut first_error = None;
                while let Some((name, layer, result, took)) = uploads.next().await {
                    match result {
                        Ok(true) => {
                            let mut state = self.state();
                            state.upload_rate.uploaded(layer.size, took);
                            state.plan.layer_uploaded(&name, layer);
                            self.publish_drain(&state);
                            drop(state);
                            self.progressed.notify_all();
                        }
                        Ok(false) => {}
                        Err(e) => {
                            first_error.get_or_insert(e);
                        }
                    }
                }
                first_error.map_or(Ok(()), Err)
            }
            Step::UploadIndex(index) => {
                let index = *index;
                if let Some(ancestor) = self.ancestor_behind() {
                    // Not a failure: the step is planned again once the ancestor's next index
                    // is up (or after a while, to see a stop).
                    if self.held_for_ancestor.fetch_add(1, Ordering::AcqRel) == 0 {
                        tracing::info!(tenant = %self.tenant_id, timeline = %self.timeline_id,
                            "the branch's index waits for its ancestor's history up to the branch point to reach the store");
                    }
                    let uploaded = ancestor.index_uploaded.notified();
                    if self.ancestor_behind().is_some() {
                        let _ = tokio::time::timeout(ANCESTOR_RECHECK, uploaded).await;
                    }
                    return Ok(());
                }
                let key = index_path(&self.remote_dir, self.generation);
                fail::fail_point!("remote-before-index-upload", |_| Err(
                    RemoteClientError::Storage(RemoteError::Failed {
                        op: "put",
                        key: key.to_string(),
                        attempts: 1,
                        elapsed: Duration::ZERO,
                        reason: "failpoint remote-before-index-upload".to_owned(),
                    })
                ));
                // From here the store may hold this index, whatever the answer says.
                self.state().plan.index_attempted(&index);
                let json = Bytes::from(index.to_json());
                // The first index of this generation claims it: created only if no index of
                // the generation exists, so two attachments given one generation cannot both
                // write as it. Later ones replace it.
                let claiming = self.state().plan.durable_generation() != Some(self.generation);
                if claiming {
                    // Every claim this client tried: one whose answer was lost is found in
                    // the store later, and is ours, whichever of them it is.
                    self.state().claims.push(json.clone());
                    let result = storage.create_if_absent(&key, json.clone()).await;
                    count("upload_index", &result);
                    let created = result?;
                    let found = if created {
                        json.clone()
                    } else {
                        storage.get(&key).await?
                    };
                    if !self.state().claims.contains(&found) {
                        tracing::error!(tenant = %self.tenant_id, timeline = %self.timeline_id,
                            generation = %self.generation,
                            "another attachment has claimed this generation (its index {key} exists): this attachment is stale, and deletes and uploads nothing more");
                        self.state().plan.fence();
                        return Ok(());
                    }
                    if found != json {
                        // An earlier claim of ours landed: it is the durable index, and the
                        // next step replaces it with this one.
                        let durable = parse_index(&key, &found, self.tenant_id, self.timeline_id)?;
                        self.remote_consistent_lsn
                            .store(durable.disk_consistent_lsn.0, Ordering::Release);
                        self.index_uploaded.notify_waiters();
                        self.state().plan.index_uploaded(durable);
                        return Ok(());
                    }
                } else {
                    let result = storage.put(&key, json).await;
                    count("upload_index", &result);
                    result?;
                }
                self.remote_consistent_lsn
                    .store(index.disk_consistent_lsn.0, Ordering::Release);
                self.index_uploaded.notify_waiters();
                tracing::debug!(tenant = %self.tenant_id, timeline = %self.timeline_id,
                    layers = index.layers.len(), "uploaded index {key}; remote_consistent_lsn is now {}",
                    index.disk_consistent_lsn);
                self.state().plan.index_uploaded(index);
                Ok(())
            }
            Step::Delete(layers) => {
                if self.fenced_by_newer_index().await? {
                    return Ok(());
                }
                for (name, layer) in layers {
                    if self.state().stopping {
                        return Ok(());
                    }
                    let key = layer_path(&self.remote_dir, &name, layer.generation)?;
                    let result = storage.delete(&key).await;
                    count("delete", &result);
                    result?;
                    self.state().plan.layer_deleted(&name);
                }
                Ok(())
            }
            Step::Sweep => self.sweep().await,
        }
    }

    /// Uploads layer `name` from the local disk; `Ok(false)` if its file is gone because a
    /// newer manifest no longer lists it (the plan then drops it). Bytes read that are not the
    /// file the manifest lists (a local copy damaged since it was written, a torn read) fail
    /// the upload before the store has them: they never become the store's.
    async fn upload_layer(
        &self,
        name: &str,
        layer: &IndexLayer,
    ) -> Result<bool, RemoteClientError> {
        let key = layer_path(&self.remote_dir, name, layer.generation)?;
        let path = self.local_dir.join(name);
        let opened = TransferFile::open_immutable(&path);
        if let Err(e) = &opened {
            if e.kind() == std::io::ErrorKind::NotFound && !self.is_still_wanted(name) {
                return Ok(false);
            }
        }
        let expected = Transferred {
            len: layer.size,
            crc32c: layer.crc32c,
        };
        let result = match opened {
            Ok(file) => {
                (self.context.storage)
                    .upload(&key, Arc::new(file), Some(expected))
                    .await
            }
            Err(source) => Err(RemoteError::LocalIo {
                op: "upload",
                key: key.to_string(),
                path,
                source,
            }),
        };
        count("upload_layer", &result);
        let sent = result?;
        crate::metrics::REMOTE_UPLOADED_BYTES.inc_by(sent.len);
        fail::fail_point!("remote-after-layer-upload");
        Ok(true)
    }

    /// Whether the newest target still lists layer `name`.
    fn is_still_wanted(&self, name: &str) -> bool {
        self.state().plan.newest_lists(name)
    }

    /// Lists the timeline's objects; if a newer generation's index is among them, fences the
    /// plan and returns `true`.
    async fn fenced_by_newer_index(&self) -> Result<bool, RemoteClientError> {
        let listed = self.list().await?;
        let newer = listed.iter().find_map(|(object, _)| match object {
            RemoteObject::Index(g) if *g > self.generation => Some(*g),
            _ => None,
        });
        if let Some(newer) = newer {
            tracing::error!(tenant = %self.tenant_id, timeline = %self.timeline_id,
                generation = %self.generation,
                "generation {newer} has attached this tenant elsewhere: this attachment is stale, and deletes and uploads nothing more");
            self.state().plan.fence();
            return Ok(true);
        }
        Ok(false)
    }

    async fn list(&self) -> Result<Vec<(RemoteObject, RemotePath)>, RemoteClientError> {
        let result = self.context.storage.list(&self.remote_dir).await;
        count("list", &result);
        Ok(result?
            .into_iter()
            .map(|o| (classify_object(o.key.file_name()), o.key))
            .collect())
    }

    /// Rule 4 of the plan: deletes layer objects no index lists and older indexes.
    async fn sweep(&self) -> Result<(), RemoteClientError> {
        let listed = self.list().await?;
        if listed
            .iter()
            .any(|(o, _)| matches!(o, RemoteObject::Index(g) if *g > self.generation))
        {
            return self.fenced_by_newer_index().await.map(|_| ());
        }
        let doomed: Vec<RemotePath> = {
            let state = self.state();
            listed
                .into_iter()
                .filter(|(object, _)| match object {
                    RemoteObject::Index(g) => *g < self.generation,
                    RemoteObject::Layer { name, generation } => {
                        state.plan.is_unlisted_object(name, *generation)
                    }
                    RemoteObject::Wal {
                        name,
                        partial,
                        generation,
                    } => state.plan.is_unlisted_wal_object(
                        &WalIndex::object_name(name, *partial, *generation),
                        *generation,
                    ),
                    RemoteObject::Other => false,
                })
                .map(|(_, key)| key)
                .collect()
        };
        for key in doomed {
            if self.state().stopping {
                return Ok(());
            }
            tracing::info!(tenant = %self.tenant_id, timeline = %self.timeline_id,
                "deleting remote object {key}: no index lists it");
            let result = self.context.storage.delete(&key).await;
            count("delete", &result);
            result?;
        }
        self.state().plan.swept();
        Ok(())
    }
}

fn count<T>(op: &str, result: &Result<T, RemoteError>) {
    let outcome = if result.is_ok() { "ok" } else { "error" };
    crate::metrics::REMOTE_OPERATIONS
        .with_label_values(&[op, outcome])
        .inc();
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
