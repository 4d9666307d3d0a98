//! How fast a timeline's upload queue drains, measured over its uploads: what the ingest pacer
//! reads ([`RemoteCopy::upload_backlog`](crate::tenant::timeline::RemoteCopy::upload_backlog))
//! to see how long a queue over its bound will take to get back within it.
//!
//! Each layer upload is timed on its own, from its start to its end: a sample of one object's
//! transfer rate, whatever else was in flight or failed meanwhile. The queue drains at that
//! rate times the uploads that run at once (one into a local directory, four to S3, never more
//! than there are layers waiting). Samples are summed with a decay, bytes and seconds apart,
//! and the rate is their quotient. A layer smaller than [`REPRESENTATIVE_BYTES`] counts only
//! while nothing larger was timed: its time is mostly the store's fixed cost per object (an
//! fsync, a request), and a run of small layers (frozen by `checkpoint_timeout`, small
//! compaction outputs) would otherwise read the rate far below what a burst of large ones
//! drains at.
//!
//! Before the first upload there is no rate, and no backlog to pace by; while the store takes
//! nothing the last rate stands, so the backlog reads short, and the queue's bound
//! (`upload_queue_wait_timeout`, then 503) is what holds ingest.
//!
//! The estimate is published in atomics after every change of the queue
//! ([`DrainEstimate`]), so a batch reads it without the client's lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How much of the past a new sample leaves.
const KEPT: f64 = 0.7;

/// Smaller layers count only until a layer of at least this was timed.
pub(super) const REPRESENTATIVE_BYTES: u64 = 1 << 20;

/// See the module documentation.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct UploadRate {
    bytes: f64,
    secs: f64,
    /// Whether a layer of at least [`REPRESENTATIVE_BYTES`] was timed.
    representative: bool,
}

impl UploadRate {
    /// A layer of `bytes` took `took` to upload.
    pub(super) fn uploaded(&mut self, bytes: u64, took: Duration) {
        if bytes == 0 || took.is_zero() {
            return;
        }
        let large = bytes >= REPRESENTATIVE_BYTES;
        if !large && self.representative {
            return;
        }
        if large && !self.representative {
            // The first large layer replaces what the small ones read.
            *self = UploadRate::default();
            self.representative = true;
        }
        self.bytes = self.bytes * KEPT + bytes as f64;
        self.secs = self.secs * KEPT + took.as_secs_f64();
    }

    /// One upload's bytes a second; `None` before any upload was timed.
    pub(super) fn bytes_per_sec(&self) -> Option<f64> {
        (self.secs > 0.0).then(|| self.bytes / self.secs)
    }
}

/// The queue's bytes past its bound and the rate they drain at, as of the last change of the
/// queue: read by batches without a lock.
#[derive(Debug, Default)]
pub(super) struct DrainEstimate {
    excess_bytes: AtomicU64,
    /// An `f64`'s bits; 0.0 (the bits 0) while no rate is known.
    bytes_per_sec: AtomicU64,
}

impl DrainEstimate {
    /// Publishes `excess` bytes over the bound, draining at `rate` per upload with `parallel`
    /// uploads at once.
    pub(super) fn publish(&self, excess: u64, rate: &UploadRate, parallel: usize) {
        let drain = rate.bytes_per_sec().unwrap_or(0.0) * parallel.max(1) as f64;
        self.bytes_per_sec.store(drain.to_bits(), Ordering::Relaxed);
        self.excess_bytes.store(excess, Ordering::Relaxed);
    }

    /// How long the excess takes to drain; zero while there is none or no rate is known.
    pub(super) fn backlog(&self) -> Duration {
        let excess = self.excess_bytes.load(Ordering::Relaxed);
        let drain = f64::from_bits(self.bytes_per_sec.load(Ordering::Relaxed));
        if excess == 0 || !drain.is_finite() || drain <= 0.0 {
            return Duration::ZERO;
        }
        Duration::try_from_secs_f64(excess as f64 / drain).unwrap_or(Duration::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn rate_mib(rate: &UploadRate) -> f64 {
        rate.bytes_per_sec().unwrap() / MIB as f64
    }

    #[test]
    fn large_layers_set_the_rate_and_small_ones_only_until_one_was_timed() {
        let mut rate = UploadRate::default();
        assert_eq!(rate.bytes_per_sec(), None);
        rate.uploaded(0, Duration::from_secs(1));
        rate.uploaded(MIB, Duration::ZERO);
        assert_eq!(rate.bytes_per_sec(), None);
        // Only small layers so far: they are the rate.
        rate.uploaded(MIB / 8, Duration::from_millis(50));
        assert!((rate_mib(&rate) - 2.5).abs() < 0.01);
        // The first large layer replaces them.
        rate.uploaded(100 * MIB, Duration::from_secs(1));
        assert!((rate_mib(&rate) - 100.0).abs() < 0.01);
        // A run of small layers after it (mostly their fsyncs) leaves it alone.
        for _ in 0..20 {
            rate.uploaded(MIB / 8, Duration::from_millis(50));
        }
        assert!((rate_mib(&rate) - 100.0).abs() < 0.01);
        // A slower store is followed within a few large layers.
        for _ in 0..10 {
            rate.uploaded(100 * MIB, Duration::from_secs(4));
        }
        assert!((rate_mib(&rate) - 25.0).abs() < 1.0, "{}", rate_mib(&rate));
    }

    #[test]
    fn the_backlog_is_the_excess_over_the_rate_of_the_uploads_at_once() {
        let estimate = DrainEstimate::default();
        let mut rate = UploadRate::default();
        // No rate yet: nothing to pace by, whatever the excess.
        estimate.publish(100 * MIB, &rate, 1);
        assert_eq!(estimate.backlog(), Duration::ZERO);
        rate.uploaded(50 * MIB, Duration::from_secs(1));
        estimate.publish(100 * MIB, &rate, 1);
        assert_eq!(estimate.backlog(), Duration::from_secs(2));
        // Four at once drain four times as fast.
        estimate.publish(100 * MIB, &rate, 4);
        assert_eq!(estimate.backlog(), Duration::from_millis(500));
        // Within the bound: none.
        estimate.publish(0, &rate, 4);
        assert_eq!(estimate.backlog(), Duration::ZERO);
    }
}
