//! The background loops that drive timelines: [`flush`] writes frozen layers to disk,
//! [`compaction`] merges L0 layers into L1 layers, [`images_and_gc`] writes image layers and
//! removes what GC may. Each is one thread running passes over every
//! timeline ([`BackgroundLoop`]); timelines wake it through a `utils::Wakeup` and know nothing
//! else of it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use utils::Wakeup;

pub mod compaction;
pub mod eviction;
pub mod flush;
pub mod images_and_gc;

/// A thread that runs `pass` whenever its wakeup is notified and at least once per tick;
/// stopping it (or dropping it) finishes the pass in progress and joins the thread.
pub struct BackgroundLoop {
    name: &'static str,
    stop: Arc<AtomicBool>,
    wakeup: Arc<Wakeup>,
    thread: Option<JoinHandle<()>>,
}

impl BackgroundLoop {
    pub fn spawn(
        name: &'static str,
        wakeup: Arc<Wakeup>,
        tick: Duration,
        pass: impl Fn() + Send + 'static,
    ) -> std::io::Result<BackgroundLoop> {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new().name(name.into()).spawn({
            let stop = stop.clone();
            let wakeup = wakeup.clone();
            move || {
                while !stop.load(Ordering::Acquire) {
                    wakeup.wait(tick);
                    if stop.load(Ordering::Acquire) {
                        break;
                    }
                    // A panic in one pass (a bug, or a failpoint) must not end the loop for
                    // good: log it and go on with the next pass.
                    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(&pass));
                    if outcome.is_err() {
                        tracing::error!("a {name} pass panicked; the loop goes on");
                    }
                }
            }
        })?;
        Ok(BackgroundLoop {
            name,
            stop,
            wakeup,
            thread: Some(thread),
        })
    }

    /// Asks the loop to stop after the pass in progress, without waiting for it.
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.wakeup.notify();
    }

    pub fn stop(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        self.request_stop();
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("the {} thread panicked", self.name);
            }
        }
    }
}

impl Drop for BackgroundLoop {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}
