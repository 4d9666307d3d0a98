//! Admission: how much long-running work one tenant, and the server, may have going at once.
//!
//! Three kinds of work can each wait on something outside the server for as long as it likes:
//! an import waits for its client's body, a basebackup for its client to read, an on-demand
//! layer download for the object store. None of them runs on the shared blocking pool, where a
//! flood of them would leave no thread for other tenants' reads, ingest and checkpoints: each
//! runs on a thread of its own, and a [`Limit`] bounds how many run at once on the server and
//! for one tenant. Past a bound the work is refused at once with [`Busy`] (a 503 with
//! `Retry-After`), naming the bound and its setting.
//!
//! On-demand downloads also never make a reader wait on a thread (see
//! [`crate::io::cached_only`]): a read on the blocking pool that needs a layer file that is
//! not on the local disk gives up, hands back the download it needs, and is run again once
//! [`Admissions::download`] has made the layer resident. Readers of one layer share one
//! download (a *flight*): only the first takes a place under the limit, the others wait for it
//! as async tasks, which hold no thread.
//!
//! ```text
//!   read (blocking pool) ──needs layer L──▶ gives up ──▶ download(L): one flight per layer
//!        ▲                                                  │ place under the limit, or 503
//!        └────────────── read again ◀── L resident ◀────────┘ a thread of its own downloads
//! ```

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use futures::future::{BoxFuture, FutureExt, Shared};
use utils::TenantId;

use crate::io::cached_only::PendingDownload;

/// A bound on one kind of work: at most `server` at once on the server, `tenant` for one
/// tenant.
pub struct Limit {
    /// What is counted, in the plural ("imports").
    what: &'static str,
    /// Its `kind` label in the metrics (`crate::metrics::WORK_KINDS`).
    kind: &'static str,
    /// The settings that set the two bounds.
    server_setting: &'static str,
    tenant_setting: &'static str,
    server: usize,
    tenant: usize,
    running: Mutex<Running>,
}

#[derive(Default)]
struct Running {
    total: usize,
    by_tenant: HashMap<TenantId, usize>,
}

/// Work refused because as much of its kind runs already (503, retry shortly).
#[derive(Debug, Clone, thiserror::Error)]
#[error("too many {what} at once {scope} ({limit}, the {setting} setting); try again shortly")]
pub struct Busy {
    pub what: &'static str,
    /// "on this server" or "for this tenant".
    pub scope: &'static str,
    pub limit: usize,
    pub setting: &'static str,
}

/// A place under a [`Limit`], given back when dropped.
#[must_use = "the place is given back when the permit is dropped"]
pub struct Permit {
    limit: Arc<Limit>,
    tenant: TenantId,
}

impl Drop for Permit {
    fn drop(&mut self) {
        crate::metrics::WORK_RUNNING
            .with_label_values(&[self.limit.kind])
            .dec();
        let mut running = self.limit.running();
        running.total -= 1;
        if let Some(n) = running.by_tenant.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                running.by_tenant.remove(&self.tenant);
            }
        }
    }
}

impl Limit {
    pub fn new(
        (what, kind): (&'static str, &'static str),
        (server_setting, server): (&'static str, usize),
        (tenant_setting, tenant): (&'static str, usize),
    ) -> Arc<Limit> {
        Arc::new(Limit {
            what,
            kind,
            server_setting,
            tenant_setting,
            server,
            tenant,
            running: Mutex::new(Running::default()),
        })
    }

    fn running(&self) -> MutexGuard<'_, Running> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for `tenant`'s work, or [`Busy`] if the server or the tenant is at its bound.
    pub fn admit(self: &Arc<Self>, tenant: TenantId) -> Result<Permit, Busy> {
        let mut running = self.running();
        let busy = |scope, label, limit, setting| {
            crate::metrics::WORK_REFUSED
                .with_label_values(&[self.kind, label])
                .inc();
            Busy {
                what: self.what,
                scope,
                limit,
                setting,
            }
        };
        if running.total >= self.server {
            return Err(busy(
                "on this server",
                "server",
                self.server,
                self.server_setting,
            ));
        }
        let of_tenant = running.by_tenant.entry(tenant).or_default();
        if *of_tenant >= self.tenant {
            return Err(busy(
                "for this tenant",
                "tenant",
                self.tenant,
                self.tenant_setting,
            ));
        }
        *of_tenant += 1;
        running.total += 1;
        crate::metrics::WORK_RUNNING
            .with_label_values(&[self.kind])
            .inc();
        Ok(Permit {
            limit: self.clone(),
            tenant,
        })
    }

    /// How many run now, on the server and for `tenant`.
    pub fn running_now(&self, tenant: TenantId) -> (usize, usize) {
        let running = self.running();
        let of_tenant = running.by_tenant.get(&tenant).copied().unwrap_or(0);
        (running.total, of_tenant)
    }
}

/// Why a download a read needed did not make its layer resident.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DownloadError {
    #[error(transparent)]
    Busy(#[from] Busy),
    /// Worded as a read that downloads on its own thread says it (`TimelineError`).
    #[error(
        "layer file {name} is not on the local disk, and downloading it from remote storage failed: {reason}"
    )]
    Failed { name: String, reason: String },
}

type Flight = Shared<BoxFuture<'static, Result<(), DownloadError>>>;

/// The bounds of the server's long-running work (see the module documentation), and the
/// downloads in flight.
pub struct Admissions {
    pub imports: Arc<Limit>,
    pub basebackups: Arc<Limit>,
    pub downloads: Arc<Limit>,
    /// By the layer file's path: one download per layer, whoever needs it.
    flights: Arc<Mutex<HashMap<PathBuf, (u64, Flight)>>>,
    next_flight: std::sync::atomic::AtomicU64,
}

/// The settings of [`Admissions`]: (server, tenant) bounds of each kind.
#[derive(Clone, Copy, Debug)]
pub struct AdmissionLimits {
    pub imports: (usize, usize),
    pub basebackups: (usize, usize),
    pub downloads: (usize, usize),
}

impl Admissions {
    pub fn new(limits: AdmissionLimits) -> Admissions {
        Admissions {
            imports: Limit::new(
                ("imports", "import"),
                ("max_concurrent_imports", limits.imports.0),
                ("max_concurrent_imports_per_tenant", limits.imports.1),
            ),
            basebackups: Limit::new(
                ("basebackups", "basebackup"),
                ("max_concurrent_basebackups", limits.basebackups.0),
                (
                    "max_concurrent_basebackups_per_tenant",
                    limits.basebackups.1,
                ),
            ),
            downloads: Limit::new(
                ("layer downloads", "download"),
                ("max_concurrent_downloads", limits.downloads.0),
                ("max_concurrent_downloads_per_tenant", limits.downloads.1),
            ),
            flights: Arc::new(Mutex::new(HashMap::new())),
            next_flight: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Makes the layer `pending` names resident: joins its download in flight, or starts one
    /// on a thread of its own if there is a place for it under [`Admissions::downloads`].
    /// Waiting holds no thread.
    pub async fn download(&self, pending: Arc<dyn PendingDownload>) -> Result<(), DownloadError> {
        let path = pending.path().to_owned();
        let flight = {
            let mut flights = lock(&self.flights);
            match flights.get(&path) {
                Some((_, flight)) => flight.clone(),
                None => {
                    let permit = self.downloads.admit(pending.tenant_id())?;
                    let id = self
                        .next_flight
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    let name = pending.name();
                    let (flights_map, key) = (self.flights.clone(), path.clone());
                    let spawned = std::thread::Builder::new()
                        .name("layer-download".into())
                        .spawn(move || {
                            let result = pending.download();
                            drop(permit);
                            // Gone from the map before the waiters wake: a read that misses
                            // the layer after this starts a new flight.
                            let mut flights = lock(&flights_map);
                            if flights.get(&key).is_some_and(|(i, _)| *i == id) {
                                flights.remove(&key);
                            }
                            drop(flights);
                            let _ = tx.send(result);
                        });
                    if let Err(e) = spawned {
                        return Err(DownloadError::Failed {
                            name,
                            reason: format!("no thread for the download: {e}"),
                        });
                    }
                    let failed_name = name;
                    let flight = async move {
                        match rx.await {
                            Ok(Ok(())) => Ok(()),
                            Ok(Err(reason)) => Err(DownloadError::Failed {
                                name: failed_name,
                                reason,
                            }),
                            Err(_) => Err(DownloadError::Failed {
                                name: failed_name,
                                reason: "the download thread ended without an answer".to_owned(),
                            }),
                        }
                    }
                    .boxed()
                    .shared();
                    flights.insert(path, (id, flight.clone()));
                    flight
                }
            }
        };
        flight.await
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests;
