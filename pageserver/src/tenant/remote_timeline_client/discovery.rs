//! Finding what the store holds: a tenant's timelines (one listing), and a timeline's newest
//! index at or below a generation, read and checked as untrusted input.

use remote_storage::{RemoteError, RemotePath, RemoteStorage};
use utils::{Generation, TenantId, TimelineId};

use super::index::{
    classify_object, index_path, tenant_path, IndexPart, RemoteObject, MAX_INDEX_BYTES,
};
use super::{count, RemoteClientError};

/// What the store holds of a tenant: its timelines (those with an index) and the newest
/// generation of any of their indexes.
#[derive(Debug, Default)]
pub struct TenantInStore {
    pub timelines: std::collections::BTreeSet<TimelineId>,
    pub newest_generation: Option<Generation>,
}

/// Lists the tenant's objects (one listing) for [`TenantInStore`].
pub async fn list_tenant(
    storage: &RemoteStorage,
    tenant_id: TenantId,
) -> Result<TenantInStore, RemoteClientError> {
    let listed = storage.list(&tenant_path(tenant_id)).await;
    count("list", &listed);
    let mut found = TenantInStore::default();
    for object in listed? {
        // tenants/<tenant>/timelines/<timeline>/<file>
        let parts: Vec<&str> = object.key.as_str().split('/').collect();
        let [_, _, "timelines", timeline, file] = parts[..] else {
            continue;
        };
        let (Ok(timeline), RemoteObject::Index(generation)) =
            (timeline.parse::<TimelineId>(), classify_object(file))
        else {
            continue;
        };
        found.timelines.insert(timeline);
        found.newest_generation = found.newest_generation.max(Some(generation));
    }
    Ok(found)
}

/// The newest index of the timeline at or below `generation`: this generation's own if it
/// has one (a restart), else the highest older one a listing finds.
pub async fn download_newest_index(
    storage: &RemoteStorage,
    remote_dir: &RemotePath,
    tenant_id: TenantId,
    timeline_id: TimelineId,
    generation: Generation,
) -> Result<Option<IndexPart>, RemoteClientError> {
    let own = index_path(remote_dir, generation);
    let key = match storage.get(&own).await {
        Ok(bytes) => return parse_index(&own, &bytes, tenant_id, timeline_id).map(Some),
        Err(RemoteError::NotFound { .. }) => {
            let listed = storage.list(remote_dir).await;
            count("list", &listed);
            let newest = listed?
                .into_iter()
                .filter_map(|o| match classify_object(o.key.file_name()) {
                    RemoteObject::Index(g) if g < generation => Some((g, o.key, o.size)),
                    _ => None,
                })
                .max_by_key(|(g, _, _)| *g);
            match newest {
                None => return Ok(None),
                Some((_, _, size)) if size > MAX_INDEX_BYTES => {
                    return Err(RemoteClientError::CorruptIndex {
                        key: own.to_string(),
                        reason: format!("{size} bytes, more than any index takes"),
                    })
                }
                Some((_, key, _)) => key,
            }
        }
        Err(e) => return Err(e.into()),
    };
    let bytes = storage.get(&key).await;
    count("download", &bytes);
    let bytes = bytes?;
    crate::metrics::REMOTE_DOWNLOADED_BYTES.inc_by(bytes.len() as u64);
    parse_index(&key, &bytes, tenant_id, timeline_id).map(Some)
}

pub(super) fn parse_index(
    key: &RemotePath,
    bytes: &[u8],
    tenant_id: TenantId,
    timeline_id: TimelineId,
) -> Result<IndexPart, RemoteClientError> {
    let corrupt = |reason: String| RemoteClientError::CorruptIndex {
        key: key.to_string(),
        reason,
    };
    if bytes.len() as u64 > MAX_INDEX_BYTES {
        return Err(corrupt(format!(
            "{} bytes, more than any index takes",
            bytes.len()
        )));
    }
    let index = IndexPart::parse(bytes).map_err(corrupt)?;
    let named = match classify_object(key.file_name()) {
        RemoteObject::Index(generation) => Some(generation),
        _ => None,
    };
    if named != Some(index.generation) {
        return Err(corrupt(format!(
            "it says generation {}, its name another",
            index.generation.get()
        )));
    }
    if (index.tenant_id, index.timeline_id) != (tenant_id, timeline_id) {
        return Err(RemoteClientError::WrongIndex {
            key: key.to_string(),
            found_tenant: index.tenant_id,
            found_timeline: index.timeline_id,
        });
    }
    Ok(index)
}
