//! Ingest pacing: while the frozen layers are at `max_frozen_layers`, or the upload queue is
//! over its bound, the answer to each batch is held, after the batch is stored and outside
//! `write_lock`, so that ingest slows a little at every batch rather than all at once.
//! [`Timeline::put_batch_paced`](super::Timeline::put_batch_paced) returns the hold and its
//! caller waits it out without holding a thread (the HTTP ingest route sleeps on the runtime);
//! the WAL receiver's batches are not paced (it answers no one per batch, and holds its step
//! lock while it stores one).
//!
//! Without it, a batch that freezes the layer one past the bound waits (under `write_lock`, with
//! every batch behind it) for whatever is left of the oldest frozen layer's write: seconds, when
//! a 256 MiB layer is flushed on a disk that compaction, image creation and uploads share; and
//! while the upload queue is over its bound no flush starts at all, so the batch that fills the
//! open layer then waits for the queue. A batch's hold is the longer of two shares:
//!
//! - **The flush's pace**, while the frozen layers are at their bound: the batch's bytes over
//!   the measured rate at which frozen layers leave the queue. The open layer then fills no
//!   faster than the flush empties the queue.
//! - **The upload backlog's share**, while the upload queue is over its bound: the time the
//!   queue needs to get back within it at the measured upload rate
//!   ([`RemoteCopy::upload_backlog`](super::RemoteCopy::upload_backlog)), times the batch's
//!   part of the bytes that can still be stored before a batch must wait (the open layer's
//!   room and the free frozen slots). A compaction or image creation puts a GiB of layers into
//!   the queue at once; the flush rate, an average, cannot see that coming, but the backlog
//!   is read at every batch, so the batches that fill the room are spread over the time the
//!   queue takes to drain, and the one that fills it finds room instead of waiting it all.
//!
//! The flush rate is measured, not configured: each flush of a layer of at least half
//! `checkpoint_distance` reports its bytes and how long the layer took to leave the frozen
//! queue, and the pacer keeps a moving average. That time includes the flush's wait for room in
//! the upload queue: where uploads are slower than flushes, they set the pace. Small layers do
//! not count: their time is mostly their fsyncs. Batches reserve consecutive slots of a shared
//! schedule, so concurrent writers are paced together, not each on its own. A slot is never
//! more than [`MAX_PACE`] away: a rate misread low (one slow flush or upload) can slow ingest,
//! but never hold a batch longer than that, and the bounds still hold behind it.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The longest a batch is held for pacing.
pub(super) const MAX_PACE: Duration = Duration::from_millis(500);

/// The weight of the newest flush in the average rate.
const NEWEST_WEIGHT: f64 = 0.3;

/// What a batch is paced by, read after it is stored.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pace {
    /// The frozen layers are at `max_frozen_layers`: the flush's pace applies.
    pub(super) frozen_at_bound: bool,
    /// How long the upload queue needs to get back within its bound (zero while it is).
    pub(super) upload_backlog: Duration,
    /// Bytes the open layer and the free frozen slots can still take before a batch has to
    /// wait for a flush.
    pub(super) room: u64,
}

impl Pace {
    /// Whether either share applies.
    pub(super) fn applies(&self) -> bool {
        self.frozen_at_bound || !self.upload_backlog.is_zero()
    }
}

/// See the module documentation.
#[derive(Debug, Default)]
pub(super) struct IngestPacer {
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

impl IngestPacer {
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

    /// Reserves the slot for a batch of `bytes` stored at `now`, under `pace`; returns how long
    /// the batch is to be held (zero while neither share applies).
    pub(super) fn hold_for(&self, bytes: u64, now: Instant, pace: Pace) -> Duration {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        // In seconds, capped before they become a Duration: a rate read absurdly low makes a
        // long hold, never an overflow.
        let flush_share = match state.rate {
            Some(rate) if pace.frozen_at_bound => bytes as f64 / rate,
            _ => 0.0,
        };
        let backlog_share =
            pace.upload_backlog.as_secs_f64() * bytes as f64 / pace.room.max(bytes).max(1) as f64;
        let share = flush_share.max(backlog_share).min(MAX_PACE.as_secs_f64());
        if share.is_nan() || share <= 0.0 {
            return Duration::ZERO;
        }
        let share = Duration::from_secs_f64(share);
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

    /// The frozen layers at their bound, the upload queue within its own.
    const AT_BOUND: Pace = Pace {
        frozen_at_bound: true,
        upload_backlog: Duration::ZERO,
        room: u64::MAX,
    };

    fn ms(d: Duration) -> f64 {
        d.as_secs_f64() * 1000.0
    }

    #[test]
    fn batches_are_held_for_their_bytes_at_the_measured_rate_in_shared_slots() {
        let pacer = IngestPacer::default();
        let now = Instant::now();
        // No flush measured: nothing to pace by.
        assert_eq!(pacer.hold_for(MIB, now, AT_BOUND), Duration::ZERO);
        pacer.flushed(100 * MIB, Duration::from_secs(1), MIB);
        assert_eq!(pacer.rate(), Some(100.0 * MIB as f64));
        // 10 MiB at 100 MiB/s: 100 ms; a second batch stored at the same moment (another
        // writer) takes the next slot.
        assert!((ms(pacer.hold_for(10 * MIB, now, AT_BOUND)) - 100.0).abs() < 0.01);
        assert!((ms(pacer.hold_for(10 * MIB, now, AT_BOUND)) - 200.0).abs() < 0.01);
        // Once the schedule is past, a batch starts its own slot from when it was stored.
        let later = now + Duration::from_secs(1);
        assert!((ms(pacer.hold_for(MIB, later, AT_BOUND)) - 10.0).abs() < 0.01);
        // Never longer than MAX_PACE, however far the schedule runs, or however long the
        // backlog reads.
        let endless = Pace {
            upload_backlog: Duration::MAX,
            room: 0,
            ..AT_BOUND
        };
        assert_eq!(pacer.hold_for(40 * MIB, later, endless), MAX_PACE);
        // Never longer than MAX_PACE, however far the schedule runs.
        for _ in 0..10 {
            assert!(pacer.hold_for(40 * MIB, later, AT_BOUND) <= MAX_PACE);
        }
        assert_eq!(pacer.hold_for(40 * MIB, later, AT_BOUND), MAX_PACE);
    }

    #[test]
    fn an_upload_backlog_is_spread_over_the_room_left_whatever_the_frozen_layers() {
        let pacer = IngestPacer::default();
        let now = Instant::now();
        // No flush measured, no layer frozen: an upload queue 8 s from its bound, with 256 MiB
        // of room left, holds a 2 MiB batch for its 1/128 of the 8 s.
        let backlog = |room| Pace {
            frozen_at_bound: false,
            upload_backlog: Duration::from_secs(8),
            room,
        };
        assert!((ms(pacer.hold_for(2 * MIB, now, backlog(256 * MIB))) - 62.5).abs() < 0.01);
        // A second writer's batch takes the next slot.
        assert!((ms(pacer.hold_for(2 * MIB, now, backlog(254 * MIB))) - 125.5).abs() < 0.1);
        // The less room is left, the longer each batch is held, never past MAX_PACE, also
        // when the batch is larger than the room.
        let later = now + Duration::from_secs(10);
        assert_eq!(pacer.hold_for(2 * MIB, later, backlog(MIB)), MAX_PACE);
        assert_eq!(
            pacer.hold_for(2 * MIB, later + MAX_PACE, backlog(0)),
            MAX_PACE
        );
        // Neither share: nothing held, and nothing reserved.
        let quiet = Pace {
            upload_backlog: Duration::ZERO,
            ..backlog(0)
        };
        assert!(!quiet.applies());
        let much_later = later + Duration::from_secs(10);
        assert_eq!(pacer.hold_for(2 * MIB, much_later, quiet), Duration::ZERO);
        // With the frozen layers at their bound too, the longer share counts: the flush at
        // 100 MiB/s would hold 20 ms, the backlog 62.5 ms.
        pacer.flushed(100 * MIB, Duration::from_secs(1), MIB);
        let both = Pace {
            frozen_at_bound: true,
            ..backlog(256 * MIB)
        };
        assert!((ms(pacer.hold_for(2 * MIB, much_later, both)) - 62.5).abs() < 0.01);
        let flush_only = Pace {
            upload_backlog: Duration::from_millis(1),
            ..both
        };
        let next = much_later + Duration::from_secs(1);
        assert!((ms(pacer.hold_for(2 * MIB, next, flush_only)) - 20.0).abs() < 0.01);
    }

    #[test]
    fn the_rate_follows_full_layers_and_ignores_small_ones() {
        let pacer = IngestPacer::default();
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
