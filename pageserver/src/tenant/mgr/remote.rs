//! A tenant's attachment to remote storage: its generation (kept in `<tenant>/generation`)
//! and each timeline's upload client, started when the timeline loads or is created.

use std::path::Path;
use std::sync::Arc;

use utils::{Generation, TenantId, TimelineId};

use super::{io_error, Shared, TenantError};
use crate::tenant::remote_timeline_client::RemoteTimelineClient;
use crate::tenant::timeline::{RemoteCopy, RemoteLayers, Timeline};

/// The file in a tenant's directory that holds its generation (8 hex digits).
pub const GENERATION_FILE: &str = "generation";

/// The tenant's generation: what `dir/generation` says, or the first for a directory from
/// before generations.
pub(super) fn read_generation(dir: &Path) -> Result<Generation, TenantError> {
    let path = dir.join(GENERATION_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => text.trim().parse().map_err(|e| TenantError::Io {
            path,
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Generation::FIRST),
        Err(e) => Err(io_error(&path)(e)),
    }
}

/// Writes `dir/generation`, a directory being built (`crashsafe::write_in_new_dir`).
pub(super) fn write_generation(dir: &Path, generation: Generation) -> Result<(), TenantError> {
    let text = format!("{generation}\n");
    crate::io::crashsafe::write_in_new_dir(dir, GENERATION_FILE, text.as_bytes())
        .map_err(|e| io_error(&e.path)(e.source))
}

/// Loads timeline `timeline_id` from `dir`. With remote storage, its upload client starts
/// first, from the store's newest index at or below `generation`: the layers that index lists
/// are then fetched from the store when the local disk lacks them (see `Timeline::load`), and
/// the client is handed the manifest. A local disk *behind* the store's index is refused
/// (`RemoteLayers::check_not_behind`).
pub(super) fn load_timeline(
    shared: &Shared,
    tenant_id: TenantId,
    generation: Generation,
    timeline_id: TimelineId,
    dir: &Path,
) -> Result<(Timeline, Option<Arc<RemoteTimelineClient>>), TenantError> {
    let Some(context) = &shared.remote else {
        let timeline = Timeline::load(
            dir,
            tenant_id,
            timeline_id,
            shared.cache.clone(),
            shared.conf.clone(),
        )?;
        return Ok((timeline, None));
    };
    let (client, durable) =
        RemoteTimelineClient::start(context.clone(), tenant_id, timeline_id, generation, dir)
            .map_err(|e| TenantError::Remote(e.to_string()))?;
    let loaded = (|| {
        let listed = durable
            .iter()
            .flat_map(|i| i.layers.iter())
            .map(|(name, l)| (name.clone(), (l.size, l.crc32c)))
            .collect();
        let remote = RemoteLayers {
            downloader: client.clone(),
            listed,
            durable: durable
                .as_ref()
                .map(|i| (i.disk_consistent_lsn, i.generation)),
        };
        let timeline = Timeline::load_with_remote(
            dir,
            tenant_id,
            timeline_id,
            shared.cache.clone(),
            shared.conf.clone(),
            Some(remote),
        )?;
        client.manifest_committed(&timeline.manifest_snapshot());
        timeline.set_remote_copy(client.clone())?;
        Ok::<_, TenantError>(timeline)
    })();
    match loaded {
        Ok(timeline) => Ok((timeline, Some(client))),
        Err(e) => {
            client.stop(false);
            Err(e)
        }
    }
}

/// Deletes a deleted timeline's objects from remote storage. A failure is logged, not
/// returned: the local deletion goes on, and what is left in the store makes a timeline
/// created again with the same id refused at its start (its remote index is ahead of it),
/// never served from the old objects.
pub(super) fn delete_remote_objects(client: &Arc<RemoteTimelineClient>) {
    if let Err(e) = client.delete_remote_objects() {
        tracing::warn!("deleting a deleted timeline's remote objects failed: {e}");
    }
}
