//! Moving a tenant between pageservers that share remote storage: attach (from the store, at a
//! newer generation, onto a disk without it) and detach (everything uploaded, then the local
//! copy removed).
//!
//! An attach lists the tenant's objects once, refuses a generation that is not above every
//! generation in the store, and builds the tenant's directory (its generation, and each
//! timeline's manifest from its newest index) atomically, as a creation does. The timelines
//! then load as after a restart: every layer is left on demand (nothing but the indexes is
//! downloaded before the tenant serves), and the upload clients start from the claimed
//! indexes. A timeline whose index does not hold a whole history (a layer missing: see
//! `timeline::layer_set::manifest::history`) fails to load: the tenant stays, broken with the reason, and
//! the attach answers with that error. A background prefetch then downloads the rest, newest first,
//! within `max_local_layer_bytes`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use utils::{Generation, TenantId};

use super::{
    create_dir_atomically, delete_dir_atomically, io_error, lock, remote, Tenant, TenantError,
    TenantManager, TenantState, TIMELINES_DIR,
};
use crate::tenant::remote_timeline_client::index::index_path;
use crate::tenant::remote_timeline_client::{
    download_newest_index, list_tenant, RemoteClientError,
};
use crate::tenant::tasks::eviction;

#[cfg(test)]
mod tests;

/// How long a detach waits for the tenant's uploads before it gives up (and stays attached).
pub const DETACH_UPLOAD_TIMEOUT: Duration = Duration::from_secs(60);

impl TenantManager {
    /// Attaches tenant `id` from remote storage at `generation`: see the module documentation.
    pub fn attach_tenant(
        &self,
        id: TenantId,
        generation: Generation,
    ) -> Result<Arc<Tenant>, TenantError> {
        self.check_running()?;
        let context = self.shared.remote.clone().ok_or_else(|| {
            TenantError::Remote("this pageserver has no remote storage".to_owned())
        })?;
        let deleting = lock(&self.tenant_dirs);
        if deleting.contains(&id) {
            return Err(TenantError::TenantBeingDeleted(id));
        }
        if self.get_tenant(id).is_ok() || self.tenants_dir.join(id.to_string()).exists() {
            return Err(TenantError::TenantExists(id));
        }
        let storage = context.storage.clone();
        let found = context
            .block_on(async move { list_tenant(&storage, id).await })
            .map_err(|e| TenantError::Remote(e.to_string()))?;
        if let Some(newest) = found.newest_generation.filter(|n| *n >= generation) {
            return Err(TenantError::GenerationNotNewer {
                tenant: id,
                asked: generation.get(),
                newest: newest.get(),
            });
        }
        if found.timelines.is_empty() {
            return Err(TenantError::NotInRemoteStorage(id));
        }
        let dir = create_dir_atomically(&self.tenants_dir, &id.to_string(), |staging| {
            let timelines = staging.join(TIMELINES_DIR);
            std::fs::create_dir(&timelines).map_err(io_error(&timelines))?;
            remote::write_generation(staging, generation)?;
            for &timeline in &found.timelines {
                let storage = context.storage.clone();
                let remote_dir =
                    crate::tenant::remote_timeline_client::index::timeline_path(id, timeline);
                // The newest index, claimed at once for the new generation (a conditional
                // create of the same index under it): from here a stale attachment's next
                // deletion finds it and stops, and the manifest is built from this very index.
                let claimed = context
                    .block_on(async move {
                        let newest = download_newest_index(
                            &storage,
                            &remote_dir,
                            id,
                            timeline,
                            generation,
                        )
                        .await?;
                        let Some(mut claimed) = newest else {
                            return Ok(None);
                        };
                        claimed.generation = generation;
                        let key = index_path(&remote_dir, generation);
                        let json = Bytes::from(claimed.to_json());
                        let created = storage.create_if_absent(&key, json).await?;
                        Ok::<_, RemoteClientError>(created.then_some(claimed))
                    })
                    .map_err(|e| TenantError::Remote(e.to_string()))?
                    .ok_or_else(|| {
                        TenantError::Remote(format!(
                            "timeline {timeline}: its index is gone, or generation {} was claimed meanwhile by another attach",
                            generation.get()
                        ))
                    })?;
                let dir = timelines.join(timeline.to_string());
                std::fs::create_dir(&dir).map_err(io_error(&dir))?;
                claimed
                    .to_manifest()
                    .store(&dir)
                    .map_err(|e| TenantError::Timeline(e.into()))?;
                // A branch: linked to its ancestor when the tenant loads.
                if let Some(ancestry) = claimed.ancestry {
                    ancestry.write(&dir)?;
                }
                // A WAL receiver: it streams on here, from where the WAL archive ends.
                if let Some(receiver) = &claimed.wal.receiver {
                    let bytes = serde_json::to_vec_pretty(receiver).expect("JSON serializes");
                    crate::io::crashsafe::write_private_in_new_dir(
                        &dir,
                        crate::tenant::timeline::WAL_RECEIVER_FILE,
                        &bytes,
                    )
                    .map_err(|e| io_error(&e.path)(e.source))?;
                }
            }
            Ok(())
        })?;
        let tenant = Arc::new(Tenant::load(id, dir, self.shared.clone())?);
        self.tenants
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, tenant.clone());
        drop(deleting);
        if let TenantState::Broken { reason } = tenant.state() {
            // Listed, broken, with its reason: nothing is served from a set that cannot vouch
            // for its pages (a timeline whose index lost a layer, `layer_set::manifest::history`).
            tracing::error!(tenant = %id, "attached tenant is broken: {reason}");
            let reason = reason.clone();
            return Err(TenantError::AttachedBroken { tenant: id, reason });
        }
        tracing::info!(tenant = %id, %generation, timelines = found.timelines.len(), "attached tenant");
        let timelines = tenant.list_timelines();
        let budget = context.max_local_layer_bytes;
        let spawned = std::thread::Builder::new()
            .name("prefetch".into())
            .spawn(move || {
                // It logs its start, each layer and its end (`tasks::eviction`).
                eviction::prefetch(&timelines, budget);
            });
        if let Err(e) = spawned {
            tracing::warn!(tenant = %id, "no prefetch (reads download on demand): {e}");
        }
        Ok(tenant)
    }

    /// Detaches tenant `id`: makes everything ingested durable and uploaded (refused, with the
    /// tenant still attached, if the uploads do not finish within [`DETACH_UPLOAD_TIMEOUT`]),
    /// then stops it and removes its local copy. The store keeps it for an attach elsewhere.
    pub fn detach_tenant(&self, id: TenantId) -> Result<(), TenantError> {
        let tenant = self.get_tenant(id)?;
        tenant.check_active()?;
        if self.shared.remote.is_none() {
            return Err(TenantError::Remote(
                "this pageserver has no remote storage: detaching would lose the tenant".to_owned(),
            ));
        }
        // Once before the checkpoint, so that a store that does not answer fails the detach
        // here, not in a flush waiting for upload room; once after, for what it flushed.
        tenant.wait_uploaded(DETACH_UPLOAD_TIMEOUT)?;
        for timeline in tenant.list_timelines() {
            timeline.checkpoint()?;
        }
        tenant.wait_uploaded(DETACH_UPLOAD_TIMEOUT)?;
        {
            let mut deleting = lock(&self.tenant_dirs);
            self.tenants
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
            deleting.insert(id);
        }
        let result = tenant.detach();
        if let Err(e) = &result {
            // Its timelines are stopped, its directory kept: load it again, to serve as before.
            tracing::error!(tenant = %id, "detach failed, loading the tenant again: {e}");
            if tenant.dir.exists() {
                match Tenant::load(id, tenant.dir.clone(), self.shared.clone()) {
                    Ok(again) => {
                        self.tenants
                            .write()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(id, Arc::new(again));
                    }
                    Err(e) => tracing::error!(tenant = %id, "loading it again failed too: {e}"),
                }
            }
        }
        lock(&self.tenant_dirs).remove(&id);
        result?;
        tracing::info!(tenant = %id, "detached tenant");
        Ok(())
    }
}

impl Tenant {
    /// Waits until every timeline's uploads are settled, for at most `timeout` in all.
    fn wait_uploaded(&self, timeout: Duration) -> Result<(), TenantError> {
        let deadline = std::time::Instant::now() + timeout;
        let clients: Vec<_> = lock(&self.remote_clients).clone().into_iter().collect();
        for (timeline, client) in clients {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if !client.wait_settled(left) {
                return Err(TenantError::Remote(format!(
                    "timeline {timeline}: its uploads did not finish in {timeout:?} ({}); the tenant stays attached",
                    client
                        .last_error()
                        .unwrap_or_else(|| format!("{} bytes still queued", client.queued_bytes()))
                )));
            }
        }
        Ok(())
    }

    /// The tenant's part of a detach, once it is out of the map: stops every timeline (each
    /// flushing what came in meanwhile and draining its uploads) and removes the local copy,
    /// unless an upload is left, in which case the copy stays for the next start.
    fn detach(&self) -> Result<(), TenantError> {
        lock(&self.dirs).deleting = true;
        let mut first_error = None;
        for timeline in self.list_timelines() {
            if let Err(e) = timeline.shutdown(true) {
                first_error.get_or_insert(e);
            }
        }
        if let Some(e) = first_error {
            return Err(e.into());
        }
        let unsettled: Vec<String> = lock(&self.remote_clients)
            .iter()
            .filter(|(_, c)| !c.is_settled())
            .map(|(t, _)| t.to_string())
            .collect();
        if !unsettled.is_empty() {
            return Err(TenantError::Remote(format!(
                "timelines {} have uploads left after stopping; the local copy is kept and loads again at the next start",
                unsettled.join(", ")
            )));
        }
        let _dirs = lock(&self.dirs);
        delete_dir_atomically(&self.dir)
    }
}
