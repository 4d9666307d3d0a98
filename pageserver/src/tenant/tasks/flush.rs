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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use utils::Wakeup;

use crate::tenant::timeline::Timeline;

/// The running loop; stopping it (or dropping it) finishes the pass in progress and joins the
/// thread.
pub struct FlushLoop {
    stop: Arc<AtomicBool>,
    wakeup: Arc<Wakeup>,
    thread: Option<JoinHandle<()>>,
}

impl FlushLoop {
    /// Starts the loop. `timelines` lists the timelines to serve on each pass.
    pub fn spawn<F>(wakeup: Arc<Wakeup>, tick: Duration, timelines: F) -> std::io::Result<Self>
    where
        F: Fn() -> Vec<Arc<Timeline>> + Send + 'static,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new()
            .name("flush-loop".into())
            .spawn({
                let stop = stop.clone();
                let wakeup = wakeup.clone();
                move || {
                    while !stop.load(Ordering::Acquire) {
                        wakeup.wait(tick);
                        if stop.load(Ordering::Acquire) {
                            break;
                        }
                        // A panic in one pass (a bug, or a failpoint) must not end background
                        // flushing for good: log it and go on with the next pass.
                        let pass = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            run_pass(&timelines())
                        }));
                        if pass.is_err() {
                            tracing::error!("a flush loop pass panicked; the loop goes on");
                        }
                    }
                }
            })?;
        Ok(FlushLoop {
            stop,
            wakeup,
            thread: Some(thread),
        })
    }

    pub fn stop(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.wakeup.notify();
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("the flush loop panicked");
            }
        }
    }
}

impl Drop for FlushLoop {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

/// The tick for a `checkpoint_timeout`: a quarter of it (a layer is frozen within a quarter of
/// the timeout after it is due), but never longer than a second nor shorter than 10 ms.
pub fn tick_for(checkpoint_timeout: Duration) -> Duration {
    (checkpoint_timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

fn run_pass(timelines: &[Arc<Timeline>]) {
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
        if let Err(e) = outcome {
            tracing::error!(
                tenant = %timeline.tenant_id(),
                timeline = %timeline.timeline_id(),
                "background flush failed, will retry: {e}"
            );
        }
    }
}
