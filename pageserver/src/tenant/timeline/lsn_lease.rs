//! Leases on LSNs: what a long read at one LSN (a basebackup streaming a data directory)
//! holds so that GC does not pass it half way.
//!
//! GC raises the cutoff below which reads are refused, and removes what only reads below it
//! need. A basebackup reads hundreds of megabytes at its snapshot's LSN, for as long as its
//! client takes: without a lease a GC pass in the meantime moves the cutoff past that LSN, and
//! the archive stops with an error after part of it was sent.
//!
//! A lease is taken at an LSN at or above the cutoff (below it, the read could not start) and
//! lasts until the [`LsnLease`] is dropped: GC never raises the cutoff past the oldest LSN
//! leased (see `gc.rs`), so every read at a leased LSN stays allowed and finds its layers.
//! A GC pass holds the list of leases from the moment it reads the oldest until its new cutoff
//! is in the layer map, and a lease checks the cutoff under the same lock, so a lease either
//! sees the cutoff of a pass that committed before it, or caps the cutoff of one that reads the
//! leases after it. (Not `image_lock`, which an image creation holds for as long as it writes:
//! a basebackup does not wait for one.)
//!
//! A branch's reads below its branch point go to its ancestor, so a lease on a branch leases
//! the LSN those reads reach in each ancestor too, except where that is a branch point (GC
//! retains what reads there need, and the cutoff does not apply to them).
//!
//! Leases live in memory: a restart ends the reads that held them. They are for reads that end
//! by themselves; a branch, which lasts, holds a branch point instead (`ancestry.rs`).
//!
//! A client can also take a lease until a time (`POST .../lsn_lease`, for `lsn_lease_length`):
//! for a restore or a branch it is about to make at that LSN. Those are in memory too, so a
//! restart ends them: a client renews its lease after one, as it renews it anyway.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use utils::Lsn;

use super::{Timeline, TimelineError};

/// A timeline's leases: those reads in progress hold ([`LsnLease`]), and those taken until a
/// time (`POST .../lsn_lease`: a restore or a branch about to be made at that LSN), each
/// LSN's latest expiry.
#[derive(Default)]
pub(super) struct Leases {
    held: Vec<Lsn>,
    until: BTreeMap<Lsn, Instant>,
}

impl Leases {
    /// Forgets the leases that expired by `now`.
    fn expire(&mut self, now: Instant) {
        self.until.retain(|_, until| *until > now);
    }

    /// Every LSN leased now (expired ones are gone first).
    pub(super) fn current(&mut self) -> Vec<Lsn> {
        self.expire(Instant::now());
        let mut all: Vec<Lsn> = self.held.to_vec();
        all.extend(self.until.keys().copied());
        all
    }
}

/// A lease on an LSN of a timeline, and on the LSN its reads reach in each ancestor, until
/// dropped (see the module documentation).
#[must_use = "the lease ends when it is dropped"]
pub struct LsnLease {
    /// Each timeline leased, with its LSN: the timeline itself first.
    held: Vec<(Arc<Timeline>, Lsn)>,
}

impl LsnLease {
    /// The LSN leased on the timeline itself.
    pub fn lsn(&self) -> Lsn {
        self.held[0].1
    }
}

impl Drop for LsnLease {
    fn drop(&mut self) {
        for (timeline, lsn) in &self.held {
            let mut leases = timeline.leases();
            if let Some(i) = leases.held.iter().position(|l| l == lsn) {
                leases.held.swap_remove(i);
            }
        }
    }
}

impl Timeline {
    /// Leases `lsn` until the lease is dropped: GC keeps its cutoff at or below it, here and,
    /// for a branch, in each ancestor at the LSN a read there reaches (unless that is a branch
    /// point, which GC retains anyway). Refused below a cutoff
    /// ([`TimelineError::BelowGcCutoff`]): reads there are refused already.
    pub fn lease_lsn(self: &Arc<Self>, lsn: Lsn) -> Result<LsnLease, TimelineError> {
        let mut lease = LsnLease { held: Vec::new() };
        let (mut timeline, mut at) = (self.clone(), lsn);
        loop {
            timeline.lease_here(at)?;
            lease.held.push((timeline.clone(), at));
            // Down the ancestors, as a read walks them.
            loop {
                let Some((ancestor, branch_lsn)) = timeline.ancestor() else {
                    return Ok(lease);
                };
                let ancestor = ancestor.clone();
                at = at.min(branch_lsn);
                let at_branch_point = ancestor.branch_points().contains(&at);
                timeline = ancestor;
                if !at_branch_point {
                    break;
                }
            }
        }
    }

    /// Adds a lease on `lsn` to this timeline's, unless it is below the cutoff.
    fn lease_here(&self, lsn: Lsn) -> Result<(), TimelineError> {
        let mut leases = self.leases();
        let cutoff = self.gc_cutoff_lsn();
        if lsn < cutoff {
            return Err(TimelineError::BelowGcCutoff { lsn, cutoff });
        }
        leases.held.push(lsn);
        Ok(())
    }

    /// Leases `lsn` until `until` (or later, if it is leased longer already): for a restore or
    /// a branch at `lsn` that a client is about to make. Refused below the cutoff. A branch's
    /// reads below its branch point reach its ancestors at the branch point, which they retain
    /// anyway, so the lease is this timeline's alone.
    pub fn lease_lsn_until(&self, lsn: Lsn, until: Instant) -> Result<(), TimelineError> {
        let mut leases = self.leases();
        let cutoff = self.gc_cutoff_lsn();
        if lsn < cutoff {
            return Err(TimelineError::BelowGcCutoff { lsn, cutoff });
        }
        leases.expire(Instant::now());
        let entry = leases.until.entry(lsn).or_insert(until);
        *entry = (*entry).max(until);
        Ok(())
    }

    /// The leases taken until a time, and until when.
    pub fn timed_leases(&self) -> Vec<(Lsn, Instant)> {
        let mut leases = self.leases();
        leases.expire(Instant::now());
        leases.until.iter().map(|(l, u)| (*l, *u)).collect()
    }

    /// The leases, locked: a GC pass holds them from reading the oldest until its cutoff is in
    /// the layer map (see the module documentation).
    pub(super) fn leases(&self) -> std::sync::MutexGuard<'_, Leases> {
        self.lsn_leases.lock().unwrap_or_else(|e| e.into_inner())
    }
}
