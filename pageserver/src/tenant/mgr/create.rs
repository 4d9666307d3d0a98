//! Branches of a tenant's timelines: creation checks the branch point against the ancestor;
//! the link itself and the reads through it are `timeline::ancestry`'s.

use std::collections::BTreeMap;
use std::sync::Arc;

use utils::{Lsn, TimelineId};

use super::{Tenant, TenantError};
use crate::tenant::timeline::{Ancestry, Timeline};

impl Tenant {
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
        let ancestor = self.get_timeline(ancestor_id)?;
        let last_record = ancestor.last_record_lsn();
        let lsn = lsn.unwrap_or(last_record);
        let invalid = |reason: String| TenantError::InvalidBranch {
            ancestor: ancestor_id,
            lsn,
            reason,
        };
        if lsn > last_record {
            return Err(invalid(format!(
                "the ancestor's last record LSN is {last_record}"
            )));
        }
        if lsn == Lsn::INVALID {
            return Err(invalid("a branch starts above LSN 0".to_owned()));
        }
        // Registered first, atomically with GC's cutoff: from here GC keeps what the branch
        // point needs, whatever happens until the branch is linked.
        ancestor.reserve_branch_point(lsn).map_err(|cutoff| {
            invalid(format!(
                "its history below the GC cutoff {cutoff} is no longer kept"
            ))
        })?;
        let created = (|| {
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
        ancestor.add_branch_point(ancestry.lsn);
        branch
            .set_ancestor(ancestor.clone(), ancestry.lsn)
            .map_err(|e| format!("timeline {timeline_id}: {e}"))?;
    }
    Ok(())
}
