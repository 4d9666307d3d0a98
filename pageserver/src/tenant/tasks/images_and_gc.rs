//! The background loop of image creation and GC: one thread that, for every timeline, writes
//! the image layers their triggers call for and then runs a GC pass.
//!
//! ```text
//!   compaction adds L1s ──notify──> Wakeup ──> loop: for every timeline:
//!                                     ^          create_images (if image_creation_threshold > 0)
//!                  tick ──────────────┘          gc
//! ```
//!
//! It is apart from the compaction loop on purpose: an image creation reads and writes a whole
//! key range and can take long, and L0 compaction, which ingest backpressure waits for, must
//! never queue behind it. The two only meet at the manifest's lock, for a commit's length. A
//! failure is logged and the timeline is tried again at the next wakeup.

use std::sync::Arc;

use crate::tenant::timeline::{Timeline, TimelineError};

/// One pass over `timelines`: what the loop runs at each wakeup and tick.
pub fn run_pass(timelines: &[Arc<Timeline>]) {
    for timeline in timelines {
        fail::fail_point!("images-gc-loop");
        let conf = timeline.conf();
        if conf.compaction_threshold == 0 {
            // No L1s are made, so there is nothing to image and nothing GC may remove.
            continue;
        }
        let log = |what: &str, e: TimelineError| {
            tracing::error!(
                tenant = %timeline.tenant_id(),
                timeline = %timeline.timeline_id(),
                "background {what} failed, will retry: {e}"
            );
        };
        if conf.image_creation_threshold != 0 {
            match timeline.create_images(false) {
                Ok(_) => {}
                // A timeline that refuses changes said why when it broke; a load resumes it.
                Err(TimelineError::ShuttingDown | TimelineError::Broken { .. }) => continue,
                Err(e) => log("image creation", e),
            }
        }
        match timeline.gc(&[]) {
            Ok(_) | Err(TimelineError::ShuttingDown | TimelineError::Broken { .. }) => {}
            Err(e) => log("GC", e),
        }
    }
}
