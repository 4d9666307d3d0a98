//! Waiting for an LSN to be ingested, without holding a thread.
//!
//! A read at an LSN beyond `last_record_lsn` waits until ingest reaches it, for at most the
//! caller's timeout. The wait is a future: a thousand waiting reads are a thousand small tasks,
//! not a thousand blocking-pool threads, so reads of one timeline waiting for its future can
//! never starve the reads of another. Dropping the future (the client went away) ends the wait
//! at once and frees its place.
//!
//! Waiters watch a [`tokio::sync::watch`] channel that every ingested batch updates with its
//! last LSN; a waiter checks the current value when it subscribes, so a batch that lands
//! between its first check and its subscription is never missed. At most `limit` waiters per
//! timeline are admitted; past that a read is refused at once with
//! [`TimelineError::TooManyLsnWaiters`] rather than queued without bound. Shutdown cancels every
//! wait, present and future, with [`TimelineError::ShuttingDown`].
//!
//! Counted in `pageserver_wait_lsn_seconds{outcome}` (ok, timeout, cancelled, abandoned),
//! `pageserver_wait_lsn_in_flight` and `pageserver_wait_lsn_refused_total`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use utils::Lsn;

use super::TimelineError;

#[derive(Debug, Clone, Copy)]
struct Progress {
    last_record: Lsn,
    cancelled: bool,
}

/// See the module documentation.
pub(super) struct LsnWait {
    progress: watch::Sender<Progress>,
    waiters: AtomicUsize,
    limit: usize,
}

impl LsnWait {
    pub(super) fn new(last_record: Lsn, limit: usize) -> LsnWait {
        LsnWait {
            progress: watch::Sender::new(Progress {
                last_record,
                cancelled: false,
            }),
            waiters: AtomicUsize::new(0),
            limit,
        }
    }

    /// Ingest reached `lsn`: wakes the waiters it satisfies.
    pub(super) fn advanced(&self, lsn: Lsn) {
        self.progress.send_modify(|p| p.last_record = lsn);
    }

    /// Ends every wait, now and later, with "shutting down".
    pub(super) fn cancel(&self) {
        self.progress.send_modify(|p| p.cancelled = true);
    }

    /// Reads waiting now.
    pub(super) fn waiters(&self) -> usize {
        self.waiters.load(Ordering::Relaxed)
    }

    /// Waits until `lsn` is ingested, for at most `timeout`.
    pub(super) async fn wait(&self, lsn: Lsn, timeout: Duration) -> Result<(), TimelineError> {
        let mut place = self.admit()?;
        let mut progress = self.progress.subscribe();
        let waited = tokio::time::timeout(
            timeout,
            progress.wait_for(|p| p.cancelled || p.last_record >= lsn),
        )
        .await
        .map(|reached| reached.map(|p| *p));
        let (outcome, result) = match waited {
            Ok(Ok(p)) if p.last_record >= lsn => ("ok", Ok(())),
            // Cancelled, or the timeline is gone.
            Ok(_) => ("cancelled", Err(TimelineError::ShuttingDown)),
            Err(_elapsed) => (
                "timeout",
                Err(TimelineError::WaitLsnTimeout {
                    lsn,
                    last_record: self.progress.borrow().last_record,
                    timeout,
                }),
            ),
        };
        place.outcome = outcome;
        result
    }

    fn admit(&self) -> Result<Place<'_>, TimelineError> {
        let admitted = self
            .waiters
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limit).then_some(n + 1)
            });
        if admitted.is_err() {
            crate::metrics::WAIT_LSN_REFUSED.inc();
            return Err(TimelineError::TooManyLsnWaiters { limit: self.limit });
        }
        crate::metrics::WAIT_LSN_IN_FLIGHT.inc();
        Ok(Place {
            wait: self,
            started: Instant::now(),
            outcome: "abandoned",
        })
    }
}

/// One admitted waiter; gives its place back and records how the wait ended when dropped,
/// which is also what happens to a wait whose future is dropped midway ("abandoned").
struct Place<'a> {
    wait: &'a LsnWait,
    started: Instant,
    outcome: &'static str,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.wait.waiters.fetch_sub(1, Ordering::AcqRel);
        crate::metrics::WAIT_LSN_IN_FLIGHT.dec();
        crate::metrics::WAIT_LSN_SECONDS
            .with_label_values(&[self.outcome])
            .observe(self.started.elapsed().as_secs_f64());
    }
}
