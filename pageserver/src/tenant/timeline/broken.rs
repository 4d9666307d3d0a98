//! A timeline that refuses writes until it is loaded again, and why: a validated batch that
//! failed half-stored (its open layer may hold part of it above `last_record_lsn`), or a
//! manifest store that failed after its rename (the layer set on disk is one of two, and only
//! a load can tell which). Nothing clears it; a load builds a new `Timeline`.

use super::*;

/// Why a timeline refuses writes until it is loaded again.
pub(super) struct Broken {
    pub(super) reason: String,
    /// A manifest store failed after its rename: the manifest on disk is the new one, or the
    /// old one if a crash comes first. Until a load reads which, no change to the layer set
    /// commits (it would build on one of them) and no layer file is removed (either may list
    /// it). Reads go on from the layer map, which neither changed.
    pub(super) layer_set_unknown: bool,
}

impl Timeline {
    /// Why the timeline refuses writes, if it does, and where a reload resumes (read now:
    /// layers frozen before the failure may have flushed since).
    pub fn broken_reason(&self) -> Option<String> {
        let broken = self.broken.lock().unwrap_or_else(|e| e.into_inner());
        broken.as_ref().map(|broken| {
            format!(
                "{}; reload the timeline to resume after {}",
                broken.reason,
                self.disk_consistent_lsn()
            )
        })
    }

    /// Makes the timeline refuse writes until it is loaded again; the first reason stays.
    /// `layer_set_unknown`: see [`Broken`].
    pub(super) fn break_timeline(&self, reason: String, layer_set_unknown: bool) {
        tracing::error!(tenant = %self.tenant_id, timeline = %self.timeline_id, "{reason}");
        let mut broken = self.broken.lock().unwrap_or_else(|e| e.into_inner());
        let broken = broken.get_or_insert(Broken {
            reason,
            layer_set_unknown,
        });
        broken.layer_set_unknown |= layer_set_unknown;
    }

    pub(super) fn is_broken(&self) -> bool {
        self.broken
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// Refuses a change to the layer set while the manifest on disk may be either of two
    /// (see [`Broken`]); checked before a change's work as well as at its commit.
    pub(super) fn check_layer_set_known(&self) -> Result<(), TimelineError> {
        if self.layer_set_unknown() {
            return Err(TimelineError::Broken {
                reason: self.broken_reason().unwrap_or_default(),
            });
        }
        Ok(())
    }

    /// Whether the manifest on disk may be either of two (see [`Broken`]).
    pub(super) fn layer_set_unknown(&self) -> bool {
        self.broken
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|broken| broken.layer_set_unknown)
    }
}
