//! Creating a tenant's timelines: empty ones, and branches (creation checks the branch point
//! against the ancestor; the link itself and the reads through it are `timeline::ancestry`'s).

use std::collections::BTreeMap;
use std::sync::Arc;

use pageserver_api::datadir::snapshot_list_key;
use pageserver_api::ingest::PutRecord;
use pageserver_api::Value;
use utils::{Lsn, TimelineId};

use super::{create_dir_atomically, lock, remote, Tenant, TenantError, TIMELINES_DIR};
use crate::tenant::remote_timeline_client::RemoteTimelineClient;
use crate::tenant::timeline::layer_set::manifest::Manifest;
use crate::tenant::timeline::{Ancestry, Timeline, TimelineError};

impl Tenant {
    /// Creates an empty timeline with `id`, or a fresh id.
    pub fn create_timeline(&self, id: Option<TimelineId>) -> Result<Arc<Timeline>, TenantError> {
        self.create_timeline_inner(id, None)
    }

    pub(super) fn create_timeline_inner(
        &self,
        id: Option<TimelineId>,
        branch: Option<(Ancestry, Arc<Timeline>)>,
    ) -> Result<Arc<Timeline>, TenantError> {
        self.check_active()?;
        let id = id.unwrap_or_else(TimelineId::generate);
        let dirs = lock(&self.dirs);
        if dirs.deleting {
            return Err(TenantError::TenantNotFound(self.id));
        }
        if dirs.removing.contains_key(&id) {
            return Err(TenantError::TimelineBeingDeleted {
                tenant: self.id,
                timeline: id,
            });
        }
        let on_disk = self.dir.join(TIMELINES_DIR).join(id.to_string()).exists();
        if self.get_timeline(id).is_ok() || on_disk {
            return Err(TenantError::TimelineExists {
                tenant: self.id,
                timeline: id,
            });
        }
        if let Some((ancestry, ancestor)) = &branch {
            // Still the tenant's: a deletion takes `dirs` too, and checks for branches under
            // it, so the ancestor cannot go between this check and the branch's insertion.
            let current = self.get_timeline(ancestry.timeline_id).ok();
            if !current.is_some_and(|t| Arc::ptr_eq(&t, ancestor)) {
                return Err(TenantError::TimelineNotFound {
                    tenant: self.id,
                    timeline: ancestry.timeline_id,
                });
            }
        }
        let dir =
            create_dir_atomically(&self.dir.join(TIMELINES_DIR), &id.to_string(), |staging| {
                // A branch starts where its ancestor's history is taken.
                let start = branch.as_ref().map_or(Lsn(0), |(ancestry, _)| ancestry.lsn);
                let manifest = Manifest::starting_at(self.id, id, start);
                if let Some((ancestry, _)) = &branch {
                    ancestry.write(staging)?;
                }
                manifest
                    .store(staging)
                    .map_err(|e| TenantError::Timeline(e.into()))
            })?;
        let (timeline, client) =
            remote::load_timeline(&self.shared, self.id, self.generation, id, &dir)?;
        let timeline = timeline
            .with_flush_wakeup(self.shared.wakeup.clone())
            .with_compaction_wakeup(self.shared.compaction_wakeup.clone());
        if let Some((ancestry, ancestor)) = branch {
            timeline.set_ancestor(ancestor, ancestry.lsn)?;
        }
        if let Some(client) = client {
            let mut clients = lock(&self.remote_clients);
            follow_ancestor(&clients, &client);
            clients.insert(id, client);
        }
        let timeline = Arc::new(timeline);
        self.timelines
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, timeline.clone());
        tracing::info!(tenant = %self.id, timeline = %id, "created timeline");
        Ok(timeline)
    }

    /// Creates timeline `id` (or a fresh id) as a branch of timeline `ancestor_id` at `lsn`
    /// (default: its `last_record_lsn`), in constant time: nothing is copied (see
    /// `timeline::ancestry`). The ancestor's history up to `lsn` is made durable first if it
    /// is not yet.
    pub fn create_branch(
        &self,
        id: Option<TimelineId>,
        ancestor_id: TimelineId,
        lsn: Option<Lsn>,
    ) -> Result<Arc<Timeline>, TenantError> {
        self.create_branch_within(id, ancestor_id, lsn, None)
    }

    /// [`Self::create_branch`], also at an LSN past the ancestor's last record up to
    /// `wal_end`, where its WAL streamed in is durable: the branch then starts from the
    /// ancestor's newest snapshot below it and that WAL, and the ancestor takes no versions at
    /// or below the branch point from then on.
    pub fn create_branch_within(
        &self,
        id: Option<TimelineId>,
        ancestor_id: TimelineId,
        lsn: Option<Lsn>,
        wal_end: Option<Lsn>,
    ) -> Result<Arc<Timeline>, TenantError> {
        let ancestor = self.get_timeline(ancestor_id)?;
        let last_record = ancestor.last_record_lsn();
        let lsn = lsn.unwrap_or(last_record);
        let invalid = |reason: String| TenantError::InvalidBranch {
            ancestor: ancestor_id,
            lsn,
            reason,
        };
        let known_up_to = wal_end.map_or(last_record, |w| w.max(last_record));
        if lsn > known_up_to {
            return Err(invalid(match wal_end {
                Some(w) => format!(
                    "the ancestor's last record LSN is {last_record}, and its durable WAL ends at {w}"
                ),
                None => format!("the ancestor's last record LSN is {last_record}"),
            }));
        }
        if lsn == Lsn::INVALID {
            return Err(invalid("a branch starts above LSN 0".to_owned()));
        }
        // Registered first, atomically with GC's cutoff: from here GC keeps what the branch
        // point needs, whatever happens until the branch is linked.
        ancestor.reserve_branch_point(lsn).map_err(|e| match e {
            TimelineError::BelowGcCutoff { cutoff, .. } => invalid(format!(
                "its history below the GC cutoff {cutoff} is no longer kept"
            )),
            e => e.into(),
        })?;
        let created = (|| {
            if lsn > ancestor.last_record_lsn() {
                // In the WAL streamed in past the newest snapshot: the ancestor's history is
                // fixed up to the branch point as it is. Its snapshot list, written again
                // there, is a version at the branch point that the checkpoint below makes
                // durable; no batch or import lands at or below it from then on.
                let last = ancestor.last_record_lsn();
                let list = ancestor
                    .get_page(snapshot_list_key(), last)?
                    .ok_or_else(|| invalid(format!("the ancestor has no snapshot at {last}")))?;
                ancestor.put_batch(&[PutRecord {
                    key: snapshot_list_key(),
                    lsn,
                    value: Value::Image(list),
                }])?;
            }
            // (Also when a batch passed the branch point meanwhile.)
            if ancestor.disk_consistent_lsn() < lsn {
                ancestor.checkpoint()?;
            }
            let ancestry = Ancestry {
                timeline_id: ancestor_id,
                lsn,
            };
            self.create_timeline_inner(id, Some((ancestry, ancestor.clone())))
        })();
        if created.is_err() {
            ancestor.remove_branch_point(lsn);
        }
        created
    }
}

/// Links every branch among a tenant's loaded `timelines` to its ancestor (found in
/// `ancestries`, read from the branches' directories), whatever order they loaded in; the
/// reason the tenant is broken if an ancestor is missing.
pub(super) fn link_branches(
    timelines: &BTreeMap<TimelineId, Arc<Timeline>>,
    clients: &BTreeMap<TimelineId, Arc<RemoteTimelineClient>>,
    ancestries: Vec<(TimelineId, Ancestry)>,
) -> Result<(), String> {
    for (timeline_id, ancestry) in ancestries {
        let (Some(branch), Some(ancestor)) = (
            timelines.get(&timeline_id),
            timelines.get(&ancestry.timeline_id),
        ) else {
            return Err(format!(
                "timeline {timeline_id}: its ancestor {} is not here",
                ancestry.timeline_id
            ));
        };
        // The ancestor's history must reach the branch point: reads there would otherwise be
        // answered from whatever the ancestor ingests next, not from the branch's base.
        let ancestor_end = ancestor.last_record_lsn();
        if ancestor_end < ancestry.lsn {
            return Err(format!(
                "timeline {timeline_id}: its ancestor {} holds history up to {ancestor_end} only, \
                 below the branch point {}",
                ancestry.timeline_id, ancestry.lsn
            ));
        }
        if let Some(client) = clients.get(&timeline_id) {
            follow_ancestor(clients, client);
        }
        ancestor.add_branch_point(ancestry.lsn);
        branch
            .set_ancestor(ancestor.clone(), ancestry.lsn)
            .map_err(|e| format!("timeline {timeline_id}: {e}"))?;
    }
    Ok(())
}

/// Makes a branch's remote client wait for its ancestor's before each index upload (see
/// `RemoteTimelineClient::follow_ancestor`); `clients` are the tenant's by timeline.
fn follow_ancestor(
    clients: &BTreeMap<TimelineId, Arc<RemoteTimelineClient>>,
    client: &RemoteTimelineClient,
) {
    let ancestor = client
        .ancestry()
        .and_then(|a| clients.get(&a.timeline_id).cloned());
    if let Some(ancestor) = ancestor {
        client.follow_ancestor(ancestor);
    }
}
