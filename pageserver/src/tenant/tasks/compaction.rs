//! The background compaction loop: one thread that merges L0 layers into L1 layers whenever a
//! timeline's L0 depth (an import's group counted once) reaches `compaction_threshold`.
//!
//! ```text
//!   flush adds an L0 ──notify──> Wakeup ──> loop: for every timeline:
//!                                  ^          if L0 depth >= compaction_threshold: compact_l0
//!                  tick ───────────┘
//! ```
//!
//! It has its own thread and nothing else ever queues in front of it (no image creation, no
//! GC, no flush): L0 compaction is what ingest backpressure waits for (see "Backpressure" in the
//! `timeline` module documentation), so it must never wait behind slower work. A failed
//! compaction changes nothing and is retried on the next wakeup; each failure is logged.

use std::sync::Arc;

use utils::Wakeup;

use crate::tenant::timeline::{Timeline, TimelineError};

/// One pass over `timelines`: what the loop runs at each wakeup and tick. Each timeline gets
/// at most one compaction per pass, so one that ingests as fast as it is compacted cannot keep
/// the others waiting; the pass wakes `again` (its own loop) when one is still over its
/// threshold, and `after_compaction` (the image creation and GC loop) once L1s were added.
pub fn run_pass(timelines: &[Arc<Timeline>], again: &Wakeup, after_compaction: &Wakeup) {
    for timeline in timelines {
        fail::fail_point!("compaction-loop");
        let threshold = timeline.conf().compaction_threshold;
        if threshold == 0 {
            continue;
        }
        match timeline.compact_l0(threshold) {
            Ok(outcome) if outcome.inputs > 0 => {
                after_compaction.notify();
                if timeline.l0_depth() >= threshold {
                    again.notify();
                }
            }
            // Image creation has to catch up first: make sure its loop knows.
            Ok(outcome) if outcome.waiting_for_images => after_compaction.notify(),
            // A timeline that refuses changes said why when it broke; a load resumes it.
            Ok(_) | Err(TimelineError::ShuttingDown | TimelineError::Broken { .. }) => {}
            Err(e) => {
                tracing::error!(
                    tenant = %timeline.tenant_id(),
                    timeline = %timeline.timeline_id(),
                    "background compaction failed, will retry: {e}"
                );
            }
        }
    }
}
