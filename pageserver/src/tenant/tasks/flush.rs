//! The background flush loop: one thread that writes frozen in-memory layers to delta layer
//! files, so ingest never waits for the disk in the common case.
//!
//! ```text
//!   put_batch freezes a full layer ──notify──> Wakeup ──> loop: for every timeline:
//!                                                 ^                freeze_if_due (age)
//!                                 tick ───────────┘                flush_frozen
//! ```
//!
//! The loop wakes when a timeline freezes a layer (by `checkpoint_distance`) and at least once
//! per tick, which is how open layers reach `checkpoint_timeout` without any put to notice.
//! One thread serves every timeline: flushes are sequential writes that share one disk, and a
//! timeline that falls behind is protected by the put path's own backpressure (see
//! [`crate::tenant::timeline`]). A failed flush leaves its layer frozen and is retried on the
//! next wakeup; each failure is logged.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::tenant::timeline::{Timeline, TimelineError};

/// The tick for a `checkpoint_timeout`: a quarter of it (a layer is frozen within a quarter of
/// the timeout after it is due), but never longer than a second nor shorter than 10 ms.
pub fn tick_for(checkpoint_timeout: Duration) -> Duration {
    (checkpoint_timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// One pass over `timelines`: what the loop runs at each wakeup and tick.
pub fn run_pass(timelines: &[Arc<Timeline>]) {
    let now = Instant::now();
    for timeline in timelines {
        fail::fail_point!("flush-loop");
        let outcome = timeline.freeze_if_due(now).and_then(|frozen_waiting| {
            if frozen_waiting {
                timeline.flush_frozen()
            } else {
                Ok(())
            }
        });
        // A timeline that refuses changes said why when it broke; a load resumes it.
        if let Err(e) = outcome.or_else(|e| match e {
            TimelineError::Broken { .. } => Ok(()),
            e => Err(e),
        }) {
            tracing::error!(
                tenant = %timeline.tenant_id(),
                timeline = %timeline.timeline_id(),
                "background flush failed, will retry: {e}"
            );
        }
    }
}
