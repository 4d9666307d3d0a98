//! The rate at which a timeline's layers reach the store, measured over its uploads: what the
//! ingest pacer reads to see how long an upload queue over its bound will take to drain.
//!
//! Each layer upload that completes is a sample of its bytes over the time since the previous
//! completion of the same step (or since the step began): with several uploads in flight, that
//! is the step's throughput, not one transfer's. Samples are summed with a decay, bytes and
//! seconds apart, and the rate is their quotient: a large layer weighs by its bytes, so a run of
//! small layers (mostly their fsyncs) cannot read the rate far below what a large one shows.

use std::time::Duration;

/// How much of the past a new sample leaves: the weight of history falls by this at each one.
const KEPT: f64 = 0.7;

/// See the module documentation.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct UploadRate {
    bytes: f64,
    secs: f64,
}

impl UploadRate {
    /// A layer of `bytes` finished `took` after the step's previous one.
    pub(super) fn uploaded(&mut self, bytes: u64, took: Duration) {
        if bytes == 0 || took.is_zero() {
            return;
        }
        self.bytes = self.bytes * KEPT + bytes as f64;
        self.secs = self.secs * KEPT + took.as_secs_f64();
    }

    /// Bytes a second; `None` before any upload was timed.
    pub(super) fn bytes_per_sec(&self) -> Option<f64> {
        (self.secs > 0.0).then(|| self.bytes / self.secs)
    }

    /// How long `bytes` take at the measured rate; zero before any upload was timed.
    pub(super) fn time_for(&self, bytes: u64) -> Duration {
        match self.bytes_per_sec() {
            Some(rate) if bytes > 0 => Duration::from_secs_f64(bytes as f64 / rate),
            _ => Duration::ZERO,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn the_rate_weighs_samples_by_their_bytes_and_follows_the_newest() {
        let mut rate = UploadRate::default();
        assert_eq!(rate.bytes_per_sec(), None);
        assert_eq!(rate.time_for(MIB), Duration::ZERO);
        rate.uploaded(0, Duration::from_secs(1));
        rate.uploaded(MIB, Duration::ZERO);
        assert_eq!(rate.bytes_per_sec(), None);
        rate.uploaded(100 * MIB, Duration::from_secs(1));
        assert_eq!(rate.time_for(50 * MIB), Duration::from_millis(500));
        // A small layer that took long (its fsyncs) moves the rate little: it weighs by bytes.
        rate.uploaded(MIB / 8, Duration::from_millis(50));
        let after_small = rate.bytes_per_sec().unwrap() / MIB as f64;
        assert!(after_small > 65.0 && after_small < 100.0, "{after_small}");
        // A slower store is followed within a few layers.
        for _ in 0..10 {
            rate.uploaded(100 * MIB, Duration::from_secs(4));
        }
        let slow = rate.bytes_per_sec().unwrap() / MIB as f64;
        assert!((slow - 25.0).abs() < 1.0, "{slow}");
    }
}
