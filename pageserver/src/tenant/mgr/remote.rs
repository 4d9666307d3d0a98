//! A tenant's attachment to remote storage: its generation (kept in `<tenant>/generation`)
//! and each timeline's upload client, started when the timeline loads or is created.

use std::path::Path;
use std::sync::Arc;

use utils::{Generation, TenantId};

use super::{io_error, TenantError};
use crate::tenant::remote_timeline_client::{RemoteContext, RemoteTimelineClient};
use crate::tenant::timeline::Timeline;

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

/// Writes `dir/generation` (a directory being built, fsynced with it).
pub(super) fn write_generation(dir: &Path, generation: Generation) -> Result<(), TenantError> {
    let path = dir.join(GENERATION_FILE);
    std::fs::write(&path, format!("{generation}\n")).map_err(io_error(&path))?;
    let file = std::fs::File::open(&path).map_err(io_error(&path))?;
    file.sync_all().map_err(io_error(&path))
}

/// Starts `timeline`'s upload client and hands it the timeline's manifest. Refuses a timeline
/// whose remote index is ahead of its local manifest: its local disk is older than what the
/// store holds (restored from a backup, or another attachment's), and uploading from it
/// would take the store back.
pub(super) fn start_uploads(
    context: &Arc<RemoteContext>,
    tenant_id: TenantId,
    generation: Generation,
    timeline: &Timeline,
) -> Result<Arc<RemoteTimelineClient>, TenantError> {
    let (client, durable) = RemoteTimelineClient::start(
        context.clone(),
        tenant_id,
        timeline.timeline_id(),
        generation,
        timeline.dir(),
    )
    .map_err(|e| TenantError::Remote(e.to_string()))?;
    let manifest = timeline.manifest_snapshot();
    if let Some(remote) = &durable {
        if remote.disk_consistent_lsn > manifest.disk_consistent_lsn {
            use crate::tenant::timeline::RemoteCopy;
            client.stop(false);
            return Err(TenantError::Remote(format!(
                "timeline {}: the remote index (generation {}) is at disk_consistent_lsn {}, ahead of the local disk's {}; the local copy is stale",
                timeline.timeline_id(),
                remote.generation,
                remote.disk_consistent_lsn,
                manifest.disk_consistent_lsn
            )));
        }
    }
    use crate::tenant::timeline::RemoteCopy;
    client.manifest_committed(&manifest);
    timeline
        .set_remote_copy(client.clone())
        .map_err(TenantError::Timeline)?;
    Ok(client)
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
