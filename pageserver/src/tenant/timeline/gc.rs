//! Garbage collection: the history older than `gc_horizon` below the last ingested LSN is
//! given up, and the layers that only reads of it need are removed.
//!
//! # The cutoff
//!
//! Reads below the GC cutoff are refused ([`TimelineError::BelowGcCutoff`], a 410 over HTTP,
//! naming the cutoff). A GC pass moves it to `last_record_lsn - gc_horizon`, but never below
//! where it is (it only rises), never above the last LSN of the L1 layers: images are only
//! ever made there (see `image_creation.rs`), so a cutoff above it would refuse reads without
//! letting anything more be removed, and image creation reads at it; and never above an LSN
//! leased by a read in progress (a basebackup, `lsn_lease.rs`).
//!
//! # What is removed
//!
//! An L1 delta layer or an image layer (never an L0: L0s lie above the L1s, so above the
//! cutoff) is removed when both hold:
//!
//! - its whole LSN range is at or below the cutoff, and
//! - newer image layers at or below the cutoff cover its key range: images at or after its
//!   last LSN (for an image, after its LSN), whose key ranges together hold all of its own.
//!
//! A read at the cutoff or above then reaches one of those images first, for every key the
//! removed layer held, and stops there (an image layer answers for every key in its range): it
//! never needed the removed layer. GC takes a list of LSNs to *retain* (branch points): a layer
//! that a read at a retained LSN would reach is kept, by the same rule with the retained LSN in
//! place of the cutoff.
//!
//! # Steps, and what a crash after each leaves
//!
//! 1. One manifest with the new cutoff names the removed layers as retired (failpoint
//!    `gc-before-manifest` just before): the commit point. A crash after it: the next load
//!    removes the retired files and starts with the new cutoff.
//! 2. The layer map drops them and takes the new cutoff in one swap (failpoint
//!    `gc-after-manifest` just before). A read that began on the older snapshot goes on with
//!    it; each file is deleted when its last reader lets go.
//!
//! # WAL
//!
//! Each pass also tells the WAL archive which of the received WAL restores may still read
//! (`gc/wal_floor.rs`); the archive removes the rest.
//!
//! GC holds `image_lock`: it never runs during an image creation, whose reads must find the
//! layers it planned with.

use super::*;

/// What one GC pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcOutcome {
    /// The cutoff after the pass.
    pub cutoff: Lsn,
    pub layers_removed: usize,
    pub bytes_removed: u64,
}

impl Timeline {
    /// Raises the GC cutoff to `gc_horizon` below the last ingested LSN (see the module
    /// documentation) and removes the layers only reads below it, and at none of `retain`,
    /// would need.
    pub fn gc(&self, retain: &[Lsn]) -> Result<GcOutcome, TimelineError> {
        let _gc = self.image_lock.lock().unwrap_or_else(|e| e.into_inner());
        if self.is_stopped() {
            return Err(TimelineError::ShuttingDown);
        }
        self.check_layer_set_known()?;
        // Branch points are retained like the caller's LSNs.
        let mut retain = retain.to_vec();
        retain.extend(self.branch_points());
        let retain = &retain[..];
        // Held until the new cutoff is in the map: no lease slips in below it meanwhile.
        let mut leases = self.leases();
        let leased = leases.current();
        // Retention by time: no cutoff past the state `pitr_interval` ago, as far as the
        // commit times of the WAL archive know it (a timeline without them keeps none).
        let pitr = self.pitr_floor();
        let map = self.layer_map();
        let old = map.gc_cutoff;
        let cutoff = policy::gc_cutoff(
            &map,
            self.last_record_lsn(),
            self.conf.gc_horizon,
            leased.iter().copied().chain(pitr).min(),
        );
        let removed = policy::gc_removable(&map, cutoff, retain);
        drop(map);
        // What restores at retained and leased LSNs replay, as well as at the cutoff and up.
        let kept: Vec<Lsn> = retain.iter().chain(leased.iter()).copied().collect();
        let mut outcome = GcOutcome {
            cutoff,
            ..GcOutcome::default()
        };
        if cutoff == old && removed.is_empty() {
            drop(leases);
            self.retain_wal(cutoff, &kept);
            return Ok(outcome);
        }
        let mut change = LayerChange::new(ChangeKind::Gc);
        change.gc_cutoff = Some(cutoff);
        change.remove = removed.clone();
        // The leases are held until the cutoff is in the map: no lease is taken below it.
        self.commit_then(change, move || drop(leases))?;
        outcome.bytes_removed = removed.iter().map(|layer| layer.file_size()).sum();
        outcome.layers_removed = removed.len();
        crate::metrics::GC_LAYERS_REMOVED.inc_by(outcome.layers_removed as u64);
        crate::metrics::GC_BYTES_REMOVED.inc_by(outcome.bytes_removed);
        if removed.is_empty() {
            tracing::debug!(tenant = %self.tenant_id, timeline = %self.timeline_id, "GC cutoff {old} -> {cutoff}");
        } else {
            tracing::info!(
                tenant = %self.tenant_id,
                timeline = %self.timeline_id,
                layers_removed = outcome.layers_removed,
                bytes_removed = outcome.bytes_removed,
                "GC cutoff {old} -> {cutoff}, removed layers"
            );
        }
        self.retain_wal(cutoff, &kept);
        Ok(outcome)
    }
}

impl Timeline {
    /// The oldest LSN `pitr_interval` keeps restorable: at or below the state that long ago,
    /// from the WAL archive's commit times. `None` when retention by time is off (0) or the
    /// timeline has no commit times.
    fn pitr_floor(&self) -> Option<Lsn> {
        if self.conf.pitr_interval.is_zero() {
            return None;
        }
        let since = std::time::SystemTime::now()
            .checked_sub(self.conf.pitr_interval)?
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?;
        self.remote
            .get()?
            .lsn_floor_at_time(i64::try_from(since.as_micros()).ok()?)
    }
}

#[cfg(test)]
mod tests;
mod wal_floor;
