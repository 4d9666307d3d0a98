//! Ingest pacing: once the frozen layers reach `max_frozen_layers`, the answer to each batch
//! is held, after the batch is stored and outside `write_lock`, for as long as the flush takes
//! to write its bytes, so that ingest slows to the flush's pace a little at every batch rather
//! than all at once. [`Timeline::put_batch_paced`](super::Timeline::put_batch_paced) returns
//! the hold and its caller waits it out without holding a thread (the HTTP ingest route sleeps
//! on the runtime); the WAL receiver's batches are not paced (it answers no one per batch, and
//! holds its step lock while it stores one).
//!
//! Without it, a batch that freezes the layer one past the bound waits (under `write_lock`, with
//! every batch behind it) for whatever is left of the oldest frozen layer's write: seconds, when
//! a 256 MiB layer is flushed on a disk that compaction, image creation and uploads share. With
//! it the open layer fills no faster than the flush empties the queue, so the bound is met
//! later or never, and what each batch waits is its own share: its bytes over the flush rate.
//!
//! The rate is measured, not configured: each flush of a layer of at least half
//! `checkpoint_distance` reports its bytes and how long the layer took to leave the frozen
//! queue, and the pacer keeps a moving average. That time includes the flush's wait for room in
//! the upload queue: where uploads are slower than flushes, they set the pace (else every batch
//! would stop at once whenever the upload queue is over its bound). Small layers do not count:
//! their time is mostly their fsyncs. Batches reserve consecutive slots of a shared
//! schedule, so concurrent writers are paced together at the rate, not each at it. A slot is
//! never more than [`MAX_PACE`] away: a rate misread low (one slow flush) can slow ingest, but
//! never hold a batch longer than that, and the backlog bound still holds behind it.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The longest a batch is held for pacing.
pub(super) const MAX_PACE: Duration = Duration::from_millis(500);

/// The weight of the newest flush in the average rate.
const NEWEST_WEIGHT: f64 = 0.3;

/// See the module documentation.
#[derive(Debug, Default)]
pub(super) struct FlushPacer {
    state: Mutex<PacerState>,
}

#[derive(Debug, Default)]
struct PacerState {
    /// Bytes a second the flush writes; `None` until a flush has been measured.
    rate: Option<f64>,
    /// When the last slot handed out ends.
    schedule_end: Option<Instant>,
    /// Every hold handed out, summed.
    held: Duration,
}

impl FlushPacer {
    /// A flush wrote a layer of `bytes` in `took`. Only a layer of at least `representative`
    /// bytes counts: a small one (frozen by a checkpoint or by `checkpoint_timeout`) is mostly
    /// the fixed cost of its fsyncs, and would read the rate far too low.
    pub(super) fn flushed(&self, bytes: u64, took: Duration, representative: u64) {
        if bytes == 0 || bytes < representative || took.is_zero() {
            return;
        }
        let newest = bytes as f64 / took.as_secs_f64();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.rate = Some(match state.rate {
            Some(rate) => rate + NEWEST_WEIGHT * (newest - rate),
            None => newest,
        });
    }

    /// Reserves the slot for a batch of `bytes` stored at `now`; returns how long the batch is
    /// to be held (zero before any flush was measured).
    pub(super) fn hold_for(&self, bytes: u64, now: Instant) -> Duration {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Some(rate) = state.rate else {
            return Duration::ZERO;
        };
        let share = Duration::from_secs_f64(bytes as f64 / rate);
        let start = state.schedule_end.map_or(now, |end| end.max(now));
        let end = (start + share).min(now + MAX_PACE);
        state.schedule_end = Some(end);
        state.held += end - now;
        end - now
    }

    /// Every hold handed out so far, summed.
    #[cfg(test)]
    pub(super) fn held_total(&self) -> Duration {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).held
    }

    /// The measured rate, in bytes a second.
    #[cfg(test)]
    pub(super) fn rate(&self) -> Option<f64> {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).rate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn batches_are_held_for_their_bytes_at_the_measured_rate_in_shared_slots() {
        let pacer = FlushPacer::default();
        let now = Instant::now();
        // No flush measured: nothing to pace by.
        assert_eq!(pacer.hold_for(MIB, now), Duration::ZERO);
        pacer.flushed(100 * MIB, Duration::from_secs(1), MIB);
        assert_eq!(pacer.rate(), Some(100.0 * MIB as f64));
        // 10 MiB at 100 MiB/s: 100 ms; a second batch stored at the same moment (another
        // writer) takes the next slot.
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        assert!((ms(pacer.hold_for(10 * MIB, now)) - 100.0).abs() < 0.01);
        assert!((ms(pacer.hold_for(10 * MIB, now)) - 200.0).abs() < 0.01);
        // Once the schedule is past, a batch starts its own slot from when it was stored.
        let later = now + Duration::from_secs(1);
        assert!((ms(pacer.hold_for(MIB, later)) - 10.0).abs() < 0.01);
        // Never longer than MAX_PACE, however far the schedule runs.
        for _ in 0..10 {
            assert!(pacer.hold_for(40 * MIB, later) <= MAX_PACE);
        }
        assert_eq!(pacer.hold_for(40 * MIB, later), MAX_PACE);
    }

    #[test]
    fn the_rate_follows_full_layers_and_ignores_small_ones() {
        let pacer = FlushPacer::default();
        pacer.flushed(0, Duration::from_secs(1), 0);
        pacer.flushed(MIB, Duration::ZERO, 0);
        // A small layer, mostly fsync: not a measure of the rate.
        pacer.flushed(MIB / 2, Duration::from_secs(1), MIB);
        assert_eq!(pacer.rate(), None);
        pacer.flushed(100 * MIB, Duration::from_secs(1), MIB);
        // A slow flush moves the rate part of the way, and faster ones bring it back.
        pacer.flushed(10 * MIB, Duration::from_secs(1), MIB);
        let slow = pacer.rate().unwrap() / MIB as f64;
        assert!((slow - 73.0).abs() < 0.01, "{slow}");
        for _ in 0..20 {
            pacer.flushed(100 * MIB, Duration::from_secs(1), MIB);
        }
        assert!(pacer.rate().unwrap() / MIB as f64 > 99.0);
    }
}
