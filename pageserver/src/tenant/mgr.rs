//! Tenants and their timelines on disk: the directory layout, creation and deletion that
//! survive crashes, loading everything at startup, and the background flush loop that serves
//! all timelines.
//!
//! # Layout
//!
//! ```text
//!   <workdir>/tenants/<tenant id>/timelines/<timeline id>/   metadata, delta layer files
//! ```
//!
//! Ids are 32 lowercase hex digits. Anything else found there is left alone and logged.
//!
//! # Crash safety
//!
//! A tenant or timeline directory is built under a temporary name (`<id>.___temp`), fsynced,
//! renamed to `<id>` and the parent directory fsynced: after a crash it either exists whole or
//! not at all. Deletion renames `<id>` to `<id>.___deleted` (durably) before removing the
//! tree, so a crash halfway through never leaves a half-deleted timeline that looks alive.
//! Startup removes both kinds of leftovers.
//!
//! # Creation against deletion
//!
//! A deletion excludes creations of what it deletes, so that the loser of a race gets "not
//! found" or "already exists" rather than an I/O error from a directory that vanished under it:
//!
//! - The manager's `tenant_dirs` lock is held while a tenant's directory is created; a tenant
//!   being deleted is listed there until its directory is gone, and creating its id meanwhile is
//!   refused.
//! - Each tenant's `dirs` lock is held while a timeline's directory is created or removed and
//!   while the tenant's own directory is removed. A tenant being deleted is marked there first
//!   (after which it takes no timelines), and timelines being deleted are listed there until
//!   their directories are gone.
//!
//! Neither lock is held while waiting for a flush. Lock order: `tenant_dirs`, then the tenants
//! map; a tenant's `dirs`, then its timelines map.
//!
//! # Failure
//!
//! A timeline that fails to load (a corrupt layer file, unreadable metadata) makes its tenant
//! **broken**: the tenant is listed with the reason, its data is refused, nothing is deleted,
//! and the other tenants load and serve normally.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Instant;

use utils::{Generation, Lsn, TenantId, TimelineId, Wakeup};

use crate::io::crashsafe;
use crate::page_cache::PageCache;
use crate::tenant::remote_timeline_client::{RemoteContext, RemoteTimelineClient};
use crate::tenant::tasks::flush::tick_for;
use crate::tenant::tasks::{compaction, eviction, flush, images_and_gc, BackgroundLoop};
use crate::tenant::timeline::{Ancestry, Timeline, TimelineConf, TimelineError};

pub const TENANTS_DIR: &str = "tenants";
pub const TIMELINES_DIR: &str = "timelines";
/// Suffix of a tenant or timeline directory still being created.
const CREATING_SUFFIX: &str = crashsafe::TEMP_SUFFIX;
/// Suffix of a tenant or timeline directory being deleted.
const DELETING_SUFFIX: &str = ".___deleted";

#[derive(Debug, thiserror::Error)]
pub enum TenantError {
    #[error("tenant {0} not found")]
    TenantNotFound(TenantId),
    #[error("tenant {0} already exists")]
    TenantExists(TenantId),
    #[error("tenant {0} is being deleted; it can be created again once that is done")]
    TenantBeingDeleted(TenantId),
    #[error("timeline {timeline} of tenant {tenant} not found")]
    TimelineNotFound {
        tenant: TenantId,
        timeline: TimelineId,
    },
    #[error("timeline {timeline} of tenant {tenant} already exists")]
    TimelineExists {
        tenant: TenantId,
        timeline: TimelineId,
    },
    #[error(
        "timeline {timeline} of tenant {tenant} is being deleted; it can be created again once that is done"
    )]
    TimelineBeingDeleted {
        tenant: TenantId,
        timeline: TimelineId,
    },
    #[error("tenant {tenant} is broken: {reason}")]
    TenantBroken { tenant: TenantId, reason: String },
    #[error(
        "tenant {tenant} was attached, but what remote storage holds of it cannot be served, so it stays here broken: {reason}"
    )]
    AttachedBroken { tenant: TenantId, reason: String },
    #[error("the page server is shutting down")]
    ShuttingDown,
    #[error("remote storage: {0}")]
    Remote(String),
    #[error("tenant {tenant}: generation {asked} is not newer than generation {newest} in remote storage; an attach needs a newer one")]
    GenerationNotNewer {
        tenant: TenantId,
        asked: u32,
        newest: u32,
    },
    #[error("timeline {timeline} of tenant {tenant} has branches ({branches}); delete them first")]
    TimelineHasBranches {
        tenant: TenantId,
        timeline: TimelineId,
        branches: String,
    },
    #[error("cannot branch timeline {ancestor} at {lsn}: {reason}")]
    InvalidBranch {
        ancestor: TimelineId,
        lsn: Lsn,
        reason: String,
    },
    #[error("tenant {0} has no timeline in remote storage")]
    NotInRemoteStorage(TenantId),
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error(transparent)]
    Timeline(#[from] TimelineError),
}

impl From<crashsafe::PathError> for TenantError {
    fn from(e: crashsafe::PathError) -> Self {
        TenantError::Io {
            path: e.path,
            source: e.source,
        }
    }
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> TenantError + '_ {
    move |source| TenantError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Everything a tenant's timelines share.
struct Shared {
    cache: Arc<PageCache>,
    conf: TimelineConf,
    /// Wakes the flush loop.
    wakeup: Arc<Wakeup>,
    /// Wakes the compaction loop.
    compaction_wakeup: Arc<Wakeup>,
    /// Where timelines upload their layers; `None`: the local disk only.
    remote: Option<Arc<RemoteContext>>,
}

/// What is changing in a tenant's directory; see "Creation against deletion" above.
#[derive(Default)]
struct TenantDirs {
    /// The tenant is being deleted: it takes no new timelines and deletes no more of them.
    deleting: bool,
    /// Timelines out of the map whose directories are not removed yet (their deletion may
    /// still be waiting for a flush in progress, which a deletion of the tenant waits for too).
    removing: BTreeMap<TimelineId, Arc<Timeline>>,
}

/// Whether a tenant serves its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TenantState {
    Active,
    Broken { reason: String },
}

/// One tenant: its timelines, or why it is broken.
pub struct Tenant {
    id: TenantId,
    dir: PathBuf,
    state: TenantState,
    shared: Arc<Shared>,
    /// Held while a directory under the tenant's is created or removed (so creations write
    /// and fsync directories without holding up readers of the maps).
    dirs: Mutex<TenantDirs>,
    timelines: RwLock<BTreeMap<TimelineId, Arc<Timeline>>>,
    /// This attachment's generation: every object it writes to remote storage carries it.
    generation: Generation,
    /// Each timeline's upload client, with remote storage.
    remote_clients: Mutex<BTreeMap<TimelineId, Arc<RemoteTimelineClient>>>,
}

/// What startup found, for its log line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadReport {
    pub tenants: usize,
    pub broken_tenants: usize,
    pub timelines: usize,
    pub delta_layers: usize,
}

/// Every tenant of one work directory, and the flush loop serving their timelines.
pub struct TenantManager {
    tenants_dir: PathBuf,
    shared: Arc<Shared>,
    tenants: Arc<RwLock<BTreeMap<TenantId, Arc<Tenant>>>>,
    /// Held while a tenant directory is created; holds the tenants being deleted.
    tenant_dirs: Mutex<BTreeSet<TenantId>>,
    flush_loop: Mutex<Option<BackgroundLoop>>,
    compaction_loop: Mutex<Option<BackgroundLoop>>,
    images_gc_loop: Mutex<Option<BackgroundLoop>>,
    /// With remote storage and `max_local_layer_bytes`.
    eviction_loop: Mutex<Option<BackgroundLoop>>,
}

/// Timelines a graceful shutdown stops at once.
const SHUTDOWN_THREADS: usize = 8;

/// How often the eviction loop checks the local disk against `max_local_layer_bytes`.
const EVICTION_TICK: std::time::Duration = std::time::Duration::from_millis(500);

impl TenantManager {
    /// Loads every tenant under `<workdir>/tenants` (creating the directory if needed), removes
    /// leftovers of interrupted creations and deletions, and starts the flush loop.
    pub fn load(
        workdir: &Path,
        cache: Arc<PageCache>,
        conf: TimelineConf,
    ) -> Result<(TenantManager, LoadReport), TenantError> {
        Self::load_with_remote(workdir, cache, conf, None)
    }

    /// [`TenantManager::load`], with every timeline's layers uploaded to `remote`.
    pub fn load_with_remote(
        workdir: &Path,
        cache: Arc<PageCache>,
        conf: TimelineConf,
        remote: Option<Arc<RemoteContext>>,
    ) -> Result<(TenantManager, LoadReport), TenantError> {
        let tenants_dir = workdir.join(TENANTS_DIR);
        std::fs::create_dir_all(&tenants_dir).map_err(io_error(&tenants_dir))?;
        let tick = tick_for(conf.checkpoint_timeout);
        let shared = Arc::new(Shared {
            cache,
            conf,
            wakeup: Arc::new(Wakeup::new()),
            compaction_wakeup: Arc::new(Wakeup::new()),
            remote,
        });
        let mut report = LoadReport::default();
        let mut tenants = BTreeMap::new();
        for (id, dir) in scan_ids::<TenantId>(&tenants_dir)? {
            let tenant = Tenant::load(id, dir, shared.clone())?;
            report.tenants += 1;
            if let TenantState::Broken { reason } = &tenant.state {
                tracing::error!(tenant = %id, "tenant is broken: {reason}");
                report.broken_tenants += 1;
            }
            for timeline in tenant.list_timelines() {
                report.timelines += 1;
                report.delta_layers += timeline.layer_counts().deltas;
            }
            tenants.insert(id, Arc::new(tenant));
        }
        let tenants = Arc::new(RwLock::new(tenants));
        let flush_loop = BackgroundLoop::spawn("flush-loop", shared.wakeup.clone(), tick, {
            let tenants = tenants.clone();
            move || flush::run_pass(&all_timelines(&tenants))
        })
        .map_err(io_error(&tenants_dir))?;
        let images_gc_wakeup = Arc::new(Wakeup::new());
        let compaction_loop =
            BackgroundLoop::spawn("compaction-loop", shared.compaction_wakeup.clone(), tick, {
                let tenants = tenants.clone();
                let again = shared.compaction_wakeup.clone();
                let images_gc_wakeup = images_gc_wakeup.clone();
                move || compaction::run_pass(&all_timelines(&tenants), &again, &images_gc_wakeup)
            })
            .map_err(io_error(&tenants_dir))?;
        let images_gc_loop = BackgroundLoop::spawn("images-gc-loop", images_gc_wakeup, tick, {
            let tenants = tenants.clone();
            move || images_and_gc::run_pass(&all_timelines(&tenants))
        })
        .map_err(io_error(&tenants_dir))?;
        let budget = shared
            .remote
            .as_ref()
            .map_or(0, |r| r.max_local_layer_bytes);
        let eviction_loop = if budget > 0 {
            let tenants = tenants.clone();
            Some(
                BackgroundLoop::spawn(
                    "eviction-loop",
                    Arc::new(Wakeup::new()),
                    EVICTION_TICK,
                    move || {
                        eviction::run_pass(&all_timelines(&tenants), budget);
                    },
                )
                .map_err(io_error(&tenants_dir))?,
            )
        } else {
            None
        };
        Ok((
            TenantManager {
                tenants_dir,
                shared,
                tenants,
                tenant_dirs: Mutex::new(BTreeSet::new()),
                flush_loop: Mutex::new(Some(flush_loop)),
                compaction_loop: Mutex::new(Some(compaction_loop)),
                images_gc_loop: Mutex::new(Some(images_gc_loop)),
                eviction_loop: Mutex::new(eviction_loop),
            },
            report,
        ))
    }

    pub fn page_cache(&self) -> &Arc<PageCache> {
        &self.shared.cache
    }

    pub fn timeline_conf(&self) -> &TimelineConf {
        &self.shared.conf
    }

    /// Creates a tenant with `id`, or a fresh id.
    pub fn create_tenant(&self, id: Option<TenantId>) -> Result<Arc<Tenant>, TenantError> {
        self.check_running()?;
        let id = id.unwrap_or_else(TenantId::generate);
        let deleting = lock(&self.tenant_dirs);
        if deleting.contains(&id) {
            return Err(TenantError::TenantBeingDeleted(id));
        }
        // On disk but not in the map: a deletion that failed to remove it; the next start
        // finishes it or loads the tenant again.
        if self.get_tenant(id).is_ok() || self.tenants_dir.join(id.to_string()).exists() {
            return Err(TenantError::TenantExists(id));
        }
        let generation = Generation::FIRST;
        let dir = create_dir_atomically(&self.tenants_dir, &id.to_string(), |staging| {
            let timelines = staging.join(TIMELINES_DIR);
            std::fs::create_dir(&timelines).map_err(io_error(&timelines))?;
            remote::write_generation(staging, generation)
        })?;
        let tenant = Arc::new(Tenant {
            id,
            dir,
            state: TenantState::Active,
            shared: self.shared.clone(),
            dirs: Mutex::default(),
            timelines: RwLock::new(BTreeMap::new()),
            generation,
            remote_clients: Mutex::default(),
        });
        self.tenants
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, tenant.clone());
        tracing::info!(tenant = %id, "created tenant");
        Ok(tenant)
    }

    pub fn get_tenant(&self, id: TenantId) -> Result<Arc<Tenant>, TenantError> {
        self.tenants
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned()
            .ok_or(TenantError::TenantNotFound(id))
    }

    /// Every tenant, by id.
    pub fn list_tenants(&self) -> Vec<Arc<Tenant>> {
        let tenants = self.tenants.read().unwrap_or_else(|e| e.into_inner());
        tenants.values().cloned().collect()
    }

    /// Shorthand for a tenant's active timeline.
    pub fn get_timeline(
        &self,
        tenant: TenantId,
        timeline: TimelineId,
    ) -> Result<Arc<Timeline>, TenantError> {
        self.get_tenant(tenant)?.get_timeline(timeline)
    }

    /// Stops every timeline of the tenant (without flushing: the data goes) and removes the
    /// tenant's directory. If removing the directory fails, the tenant stays out of the map,
    /// stopped, until the next start loads it again (or finishes the deletion, if the rename
    /// to `<id>.___deleted` happened).
    ///
    /// The tenant leaves the map first, so waiting for its flush in progress holds up no
    /// request for another tenant; until its directory is gone, creating it again is refused.
    /// A timeline creation in progress finishes first (and its timeline is deleted with the
    /// rest); later ones find no tenant.
    pub fn delete_tenant(&self, id: TenantId) -> Result<(), TenantError> {
        let tenant = {
            let mut deleting = lock(&self.tenant_dirs);
            let tenant = self
                .tenants
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id)
                .ok_or(TenantError::TenantNotFound(id))?;
            deleting.insert(id);
            tenant
        };
        let result = tenant.delete();
        lock(&self.tenant_dirs).remove(&id);
        result?;
        tracing::info!(tenant = %id, "deleted tenant");
        Ok(())
    }

    /// Wakes every read waiting for an LSN with a "shutting down" error, so a graceful
    /// shutdown does not wait `wait_lsn_timeout` for them.
    pub fn cancel_lsn_waits(&self) {
        for timeline in all_timelines(&self.tenants) {
            timeline.cancel_lsn_waits();
        }
    }

    /// Graceful shutdown: stops the flush loop, then makes everything ingested durable and
    /// refuses further puts. Returns the first flush error after trying every timeline.
    pub fn shutdown(&self) -> Result<(), TenantError> {
        // A compaction or image creation in progress stops early once its timeline shuts
        // down below.
        if let Some(eviction_loop) = lock(&self.eviction_loop).take() {
            eviction_loop.stop();
        }
        let compaction_loop = lock(&self.compaction_loop).take();
        let images_gc_loop = lock(&self.images_gc_loop).take();
        for background in [&compaction_loop, &images_gc_loop].into_iter().flatten() {
            background.request_stop();
        }
        if let Some(flush_loop) = lock(&self.flush_loop).take() {
            flush_loop.stop();
        }
        // A few timelines at a time: each flushes, then waits (bounded) for its uploads, and a
        // store that does not answer must not cost that bound once per timeline in turn.
        let timelines = Mutex::new(all_timelines(&self.tenants).into_iter());
        let first_error = Mutex::new(None);
        std::thread::scope(|s| {
            for _ in 0..SHUTDOWN_THREADS {
                s.spawn(|| loop {
                    let Some(timeline) = lock(&timelines).next() else {
                        return;
                    };
                    if let Err(e) = timeline.shutdown(true) {
                        tracing::error!(
                            tenant = %timeline.tenant_id(),
                            timeline = %timeline.timeline_id(),
                            "flush at shutdown failed: {e}"
                        );
                        lock(&first_error).get_or_insert(TenantError::Timeline(e));
                    }
                });
            }
        });
        let first_error = first_error.into_inner().unwrap_or_else(|e| e.into_inner());
        for background in [compaction_loop, images_gc_loop].into_iter().flatten() {
            background.stop();
        }
        first_error.map_or(Ok(()), Err)
    }

    fn check_running(&self) -> Result<(), TenantError> {
        if lock(&self.flush_loop).is_some() {
            Ok(())
        } else {
            Err(TenantError::ShuttingDown)
        }
    }
}

impl Tenant {
    fn load(id: TenantId, dir: PathBuf, shared: Arc<Shared>) -> Result<Tenant, TenantError> {
        let timelines_dir = dir.join(TIMELINES_DIR);
        let mut timelines = BTreeMap::new();
        let mut remote_clients = BTreeMap::new();
        let mut state = TenantState::Active;
        let broken = |reason: String, generation| Tenant {
            id,
            dir: dir.clone(),
            state: TenantState::Broken { reason },
            shared: shared.clone(),
            dirs: Mutex::default(),
            timelines: RwLock::new(BTreeMap::new()),
            generation,
            remote_clients: Mutex::default(),
        };
        let generation = match remote::read_generation(&dir) {
            Ok(generation) => generation,
            Err(e) => {
                return Ok(broken(
                    format!("its generation cannot be read: {e}"),
                    Generation::FIRST,
                ))
            }
        };
        let found = match scan_ids::<TimelineId>(&timelines_dir) {
            Ok(found) => found,
            Err(e) => {
                return Ok(broken(
                    format!("its timelines cannot be listed: {e}"),
                    generation,
                ));
            }
        };
        let mut ancestries = Vec::new();
        for (timeline_id, timeline_dir) in found {
            match Ancestry::read(&timeline_dir) {
                Ok(Some(ancestry)) => ancestries.push((timeline_id, ancestry)),
                Ok(None) => {}
                Err(e) => {
                    state = TenantState::Broken {
                        reason: format!("timeline {timeline_id}: {e}"),
                    };
                    break;
                }
            }
            let started = Instant::now();
            match remote::load_timeline(&shared, id, generation, timeline_id, &timeline_dir) {
                Ok((timeline, client)) => {
                    tracing::info!(
                        tenant = %id,
                        timeline = %timeline_id,
                        disk_consistent_lsn = %timeline.disk_consistent_lsn(),
                        delta_layers = timeline.layer_counts().deltas,
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "loaded timeline"
                    );
                    let timeline = timeline
                        .with_flush_wakeup(shared.wakeup.clone())
                        .with_compaction_wakeup(shared.compaction_wakeup.clone());
                    if let Some(client) = client {
                        remote_clients.insert(timeline_id, client);
                    }
                    timelines.insert(timeline_id, Arc::new(timeline));
                }
                Err(e) => {
                    state = TenantState::Broken {
                        reason: format!("timeline {timeline_id} failed to load: {e}"),
                    };
                    timelines.clear();
                    break;
                }
            }
        }
        if matches!(state, TenantState::Active) {
            if let Err(reason) = create::link_branches(&timelines, &remote_clients, ancestries) {
                state = TenantState::Broken { reason };
                timelines.clear();
            }
        }
        if !matches!(state, TenantState::Active) {
            // Broken: the uploads of timelines loaded before the failure stop too.
            for client in std::mem::take(&mut remote_clients).into_values() {
                use crate::tenant::timeline::RemoteCopy;
                client.stop(false);
            }
        }
        Ok(Tenant {
            id,
            dir,
            state,
            shared,
            dirs: Mutex::default(),
            timelines: RwLock::new(timelines),
            generation,
            remote_clients: Mutex::new(remote_clients),
        })
    }

    /// This attachment's generation.
    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// The upload client of timeline `id`, with remote storage.
    pub fn remote_client(&self, id: TimelineId) -> Option<Arc<RemoteTimelineClient>> {
        lock(&self.remote_clients).get(&id).cloned()
    }

    pub fn id(&self) -> TenantId {
        self.id
    }

    pub fn state(&self) -> &TenantState {
        &self.state
    }

    fn check_active(&self) -> Result<(), TenantError> {
        match &self.state {
            TenantState::Active => Ok(()),
            TenantState::Broken { reason } => Err(TenantError::TenantBroken {
                tenant: self.id,
                reason: reason.clone(),
            }),
        }
    }

    pub fn get_timeline(&self, id: TimelineId) -> Result<Arc<Timeline>, TenantError> {
        self.check_active()?;
        self.timelines
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned()
            .ok_or(TenantError::TimelineNotFound {
                tenant: self.id,
                timeline: id,
            })
    }

    /// Every timeline, by id (none for a broken tenant).
    pub fn list_timelines(&self) -> Vec<Arc<Timeline>> {
        let timelines = self.timelines.read().unwrap_or_else(|e| e.into_inner());
        timelines.values().cloned().collect()
    }

    /// Stops the timeline (without flushing: the data goes) and removes its directory. It
    /// leaves the map first, as in [`TenantManager::delete_tenant`]; until its directory is
    /// gone, creating it again is refused. If the tenant's deletion begins meanwhile, that
    /// removes the directory.
    pub fn delete_timeline(&self, id: TimelineId) -> Result<(), TenantError> {
        self.check_active()?;
        let not_found = TenantError::TimelineNotFound {
            tenant: self.id,
            timeline: id,
        };
        let timeline = {
            let mut dirs = lock(&self.dirs);
            if dirs.deleting {
                return Err(not_found);
            }
            let mut timelines = self.timelines.write().unwrap_or_else(|e| e.into_inner());
            let branches: Vec<String> = timelines
                .values()
                .filter(|t| t.ancestor().is_some_and(|(a, _)| a.timeline_id() == id))
                .map(|t| t.timeline_id().to_string())
                .collect();
            if !branches.is_empty() {
                return Err(TenantError::TimelineHasBranches {
                    tenant: self.id,
                    timeline: id,
                    branches: branches.join(", "),
                });
            }
            let timeline = timelines.remove(&id).ok_or(not_found)?;
            drop(timelines);
            dirs.removing.insert(id, timeline.clone());
            timeline
        };

        // Only waits for a flush in progress; errors do not matter for data being deleted.
        let _ = timeline.shutdown(false);
        if let Some(client) = lock(&self.remote_clients).remove(&id) {
            remote::delete_remote_objects(&client);
        }
        let mut dirs = lock(&self.dirs);
        let result = if dirs.deleting {
            Ok(())
        } else {
            delete_dir_atomically(timeline.dir())
        };
        dirs.removing.remove(&id);
        drop(dirs);
        result?;
        // Only once the directory is gone: until then a restart would load the branch again,
        // and its ancestor must still keep what its branch point needs.
        if let Some((ancestor, lsn)) = timeline.ancestor() {
            ancestor.remove_branch_point(lsn);
        }
        tracing::info!(tenant = %self.id, timeline = %id, "deleted timeline");
        Ok(())
    }

    /// The tenant's part of [`TenantManager::delete_tenant`], once it is out of the map: waits
    /// for a creation or removal of a timeline directory in progress, takes no more, stops every
    /// timeline (those whose own deletion is under way too, so no flush of theirs writes into
    /// the directory being removed) and removes the tenant's directory.
    fn delete(&self) -> Result<(), TenantError> {
        let being_deleted: Vec<Arc<Timeline>> = {
            let mut dirs = lock(&self.dirs);
            dirs.deleting = true;
            dirs.removing.values().cloned().collect()
        };
        for timeline in self.list_timelines().into_iter().chain(being_deleted) {
            // Only waits for a flush in progress; errors do not matter for data being deleted.
            let _ = timeline.shutdown(false);
        }
        let clients = std::mem::take(&mut *lock(&self.remote_clients));
        for client in clients.values() {
            remote::delete_remote_objects(client);
        }
        let _dirs = lock(&self.dirs);
        delete_dir_atomically(&self.dir)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn all_timelines(tenants: &RwLock<BTreeMap<TenantId, Arc<Tenant>>>) -> Vec<Arc<Timeline>> {
    let tenants = tenants.read().unwrap_or_else(|e| e.into_inner());
    tenants.values().flat_map(|t| t.list_timelines()).collect()
}

/// The entries of `dir` named by a valid id, after removing leftovers of interrupted creations
/// and deletions. Other entries are logged and left alone.
fn scan_ids<Id: std::str::FromStr>(dir: &Path) -> Result<Vec<(Id, PathBuf)>, TenantError> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_error(dir))? {
        let path = entry.map_err(io_error(dir))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.ends_with(CREATING_SUFFIX) || name.ends_with(DELETING_SUFFIX) {
            tracing::info!(path = %path.display(), "removing leftover of an interrupted create or delete");
            std::fs::remove_dir_all(&path).map_err(io_error(&path))?;
            continue;
        }
        match name.parse::<Id>() {
            Ok(id) if path.is_dir() => found.push((id, path)),
            _ => tracing::warn!(path = %path.display(), "ignoring an entry that is not an id"),
        }
    }
    Ok(found)
}

/// Creates `<parent>/<name>` whole or not at all: `fill` populates a staging directory, which
/// is then fsynced, renamed into place, and the rename made durable.
fn create_dir_atomically(
    parent: &Path,
    name: &str,
    fill: impl FnOnce(&Path) -> Result<(), TenantError>,
) -> Result<PathBuf, TenantError> {
    let staging = parent.join(format!("{name}{CREATING_SUFFIX}"));
    let target = parent.join(name);
    if target.exists() {
        // Not in the map, yet on disk: refuse rather than overwrite.
        return Err(TenantError::Io {
            path: target,
            source: io::Error::new(io::ErrorKind::AlreadyExists, "directory already exists"),
        });
    }
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(io_error(&staging))?;
    }
    std::fs::create_dir(&staging).map_err(io_error(&staging))?;
    let result = fill(&staging)
        .and_then(|()| fsync_dir(&staging))
        .and_then(|()| crashsafe::rename_durably(&staging, &target).map_err(TenantError::from));
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(e);
    }
    Ok(target)
}

/// Removes `dir` so that a crash midway leaves a leftover for startup, never a live half.
fn delete_dir_atomically(dir: &Path) -> Result<(), TenantError> {
    let mut doomed = dir.as_os_str().to_owned();
    doomed.push(DELETING_SUFFIX);
    let doomed = PathBuf::from(doomed);
    crashsafe::rename_durably(dir, &doomed)?;
    std::fs::remove_dir_all(&doomed).map_err(io_error(&doomed))
}

fn fsync_dir(dir: &Path) -> Result<(), TenantError> {
    crashsafe::fsync_dir(dir).map_err(io_error(dir))
}

mod attach;
mod create;
mod remote;
#[cfg(test)]
mod tests;
