//! Freezing and flushing: frozen layers written to delta layer files while ingest goes on, each
//! committed by storing the manifest that lists it; checkpoints and shutdown (see "Flushing
//! while ingest continues" and "Durability" in the `timeline` module documentation).

use super::*;

/// How often a batch held for backpressure looks whether the running flush wrote a layer.
const FLUSH_WATCH_INTERVAL: Duration = Duration::from_millis(5);

impl Timeline {
    /// Freezes the open layer if it has reached `checkpoint_timeout` by `now`. Returns whether
    /// frozen layers wait for a flush.
    pub fn freeze_if_due(&self, now: Instant) -> Result<bool, TimelineError> {
        let mut writer = self.writer();
        let due = writer.open_since.is_some_and(|since| {
            now.saturating_duration_since(since) >= self.conf.checkpoint_timeout
        });
        // A broken timeline's open layer may hold part of a batch above last_record_lsn,
        // which must never become durable.
        if due && !self.is_shutting_down() && !self.is_broken() {
            let end = Lsn(self.last_record_lsn().0 + 1);
            self.update_layer_map(|map| self.freeze_open(&mut writer, map, end))?;
        }
        Ok(!self.layer_map().frozen.is_empty())
    }

    /// Writes every frozen layer to a delta layer file, oldest first, advancing
    /// `disk_consistent_lsn` after each. Puts continue meanwhile.
    pub fn flush_frozen(&self) -> Result<(), TimelineError> {
        self.flush_frozen_until(Lsn::MAX)
    }

    /// Like [`Timeline::flush_frozen`], but stops once `disk_consistent_lsn` reaches `target`,
    /// leaving layers frozen later for the next flush.
    pub(super) fn flush_frozen_until(&self, target: Lsn) -> Result<(), TimelineError> {
        let flusher = self.flush_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.check_layer_set_known()?;
        while self.disk_consistent_lsn() < target && !self.is_stopped() {
            if !self.flush_oldest_frozen(&flusher)? {
                break;
            }
        }
        Ok(())
    }

    /// For ingest backpressure, under `write_lock`: returns once at most `max_frozen_layers`
    /// frozen layers wait, having written the oldest itself when no flush runs, or waited for
    /// the flush that runs to write it (the background flush writes every frozen layer under
    /// one hold of `flush_lock`, so it is watched, not queued behind). So a batch waits for
    /// about one layer's write, not for every frozen layer's.
    pub(super) fn flush_frozen_to_bound(&self) -> Result<(), TimelineError> {
        while self.layer_map().frozen.len() > self.conf.max_frozen_layers && !self.is_stopped() {
            let flusher = match self.flush_lock.try_lock() {
                Ok(guard) => guard,
                Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {
                    std::thread::sleep(FLUSH_WATCH_INTERVAL);
                    continue;
                }
            };
            self.check_layer_set_known()?;
            if !self.flush_oldest_frozen(&flusher)? {
                break;
            }
        }
        Ok(())
    }

    /// Writes the oldest frozen layer to a delta layer file and commits it, advancing
    /// `disk_consistent_lsn`; false if none is frozen. `_flusher`: `flush_lock`, held (only
    /// flushers remove frozen layers, and it admits one: the oldest stays the oldest while it
    /// is written).
    pub(super) fn flush_oldest_frozen(
        &self,
        _flusher: &MutexGuard<'_, ()>,
    ) -> Result<bool, TimelineError> {
        let Some(frozen) = self.layer_map().frozen.first().cloned() else {
            return Ok(false);
        };
        // What the pacer measures: the time the layer takes to leave the frozen queue, the wait
        // for the upload queue included (uploads slower than flushes drain it at their pace).
        let waited_from = Instant::now();
        if let Some(remote) = self.remote.get() {
            // Shutdown does not wait: its flush must finish whatever the store does. A
            // store that takes nothing for upload_queue_wait_timeout fails the flush: its
            // layer stays frozen, and the next flush tries again.
            remote.wait_for_upload_room(&|| self.is_shutting_down())?;
        }
        let started = Instant::now();
        let end = frozen.end_lsn().expect("frozen layers have an end");
        let written = frozen.write_to_disk(
            &self.dir,
            self.tenant_id,
            self.timeline_id,
            self.conf.layer_compression,
        )?;
        let durable = Lsn(end.0 - 1);
        let mut change = LayerChange::new(ChangeKind::Flush);
        change.flushed_frozen = true;
        change.disk_consistent_lsn = Some(durable);
        change
            .add
            .extend(written.map(|w| NewLayerFile::delta(&w, LayerLevel::L0)));
        // The commit point: from here the layer is the timeline's.
        let delta = self.commit(change)?.pop();
        let representative = self.conf.checkpoint_distance / 2;
        (self.pacer).flushed(
            frozen.bytes_written(),
            waited_from.elapsed(),
            representative,
        );
        crate::metrics::LAYER_FLUSHES.inc();
        crate::metrics::LAYER_FLUSH_SECONDS.observe(started.elapsed().as_secs_f64());
        if let Some(delta) = &delta {
            crate::metrics::LAYER_FLUSH_BYTES.inc_by(delta.file_size());
        }
        tracing::debug!(
            tenant = %self.tenant_id,
            timeline = %self.timeline_id,
            layer = delta.as_ref().and_then(|d| d.file_name()).unwrap_or_default(),
            values = frozen.len(),
            bytes = frozen.bytes_written(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "flushed a frozen layer; disk_consistent_lsn is now {durable}"
        );
        Ok(true)
    }

    /// Before a batch that may have to flush (the frozen layers are at `max_frozen_layers`, and
    /// the batch's `records` may fill the open layer): waits, outside `write_lock`, for room in
    /// the upload queue, so that a store that takes nothing refuses the batch (503, nothing
    /// stored) after `upload_queue_wait_timeout` instead of holding it, and every batch behind
    /// it, in the flush. A batch that leaves the open layer short of `checkpoint_distance`
    /// freezes nothing and flushes nothing, and goes on at the pacer's rate: only the batch that
    /// would freeze waits here, not every batch while the frozen layers are at the bound.
    pub(super) fn wait_for_upload_room_before_batch(
        &self,
        records: &[PutRecord],
    ) -> Result<(), TimelineError> {
        match self.remote.get() {
            Some(remote) if self.may_have_to_flush(records) => {
                remote.wait_for_upload_room(&|| self.is_shutting_down())
            }
            _ => Ok(()),
        }
    }

    /// Whether `records`, stored now, may make the batch flush: the frozen layers are at their
    /// bound, and the batch may fill the open layer. Checked before `write_lock` (to wait for
    /// room outside it) and again under it, where no other batch can fill the layer first.
    pub(super) fn may_have_to_flush(&self, records: &[PutRecord]) -> bool {
        let map = self.layer_map();
        if map.frozen.len() < self.conf.max_frozen_layers {
            return false;
        }
        // An estimate on the high side: each value as serialized, plus room for its key, LSN
        // and length in the ephemeral file.
        let batch: u64 = records
            .iter()
            .map(|r| r.value.serialized_len() as u64 + 64)
            .sum();
        let open = map.open.as_ref().map_or(0, |open| open.bytes_written());
        open + batch >= self.conf.checkpoint_distance
    }

    /// What a batch stored now is paced by (`pacing.rs`): whether the frozen layers are at
    /// their bound, the upload queue's backlog, and the bytes that can still be stored before a
    /// batch has to wait for a flush (an estimate: a layer also freezes on its LSN span and at
    /// a checkpoint).
    pub(super) fn pace(&self) -> pacing::Pace {
        let upload_backlog = self
            .remote
            .get()
            .map_or(Duration::ZERO, |remote| remote.upload_backlog());
        let distance = self.conf.checkpoint_distance;
        let map = self.layer_map();
        let bound = self.conf.max_frozen_layers.max(1);
        let free_slots = bound.saturating_sub(map.frozen.len()) as u64;
        let open = map.open.as_ref().map_or(0, |open| open.bytes_written());
        pacing::Pace {
            frozen_at_bound: map.frozen.len() >= bound,
            upload_backlog,
            room: (free_slots.saturating_mul(distance))
                .saturating_add(distance.saturating_sub(open)),
        }
    }

    /// Under `write_lock`: whether this batch may have to flush while the upload queue has no
    /// room, so that it must let go of the lock and wait outside it first.
    pub(super) fn must_wait_for_upload_room(&self, records: &[PutRecord]) -> bool {
        self.remote
            .get()
            .is_some_and(|remote| !remote.has_upload_room() && self.may_have_to_flush(records))
    }

    /// Freezes the open layer and writes every frozen layer to disk. Returns when everything
    /// ingested before the call is durable (`disk_consistent_lsn` = `last_record_lsn` as of
    /// the call); puts may continue meanwhile.
    pub fn checkpoint(&self) -> Result<(), TimelineError> {
        if self.is_stopped() {
            return Err(TimelineError::ShuttingDown);
        }
        let target = {
            let mut writer = self.writer();
            if let Some(reason) = self.broken_reason() {
                // Its open layer holds versions of a half-stored batch above
                // last_record_lsn: freezing it would make them durable.
                return Err(TimelineError::Broken { reason });
            }
            let last_record = self.last_record_lsn();
            self.update_layer_map(|map| {
                self.freeze_open(&mut writer, map, Lsn(last_record.0 + 1))
            })?;
            last_record
        };
        self.flush_frozen_until(target)
    }

    /// Stops the timeline: refuses puts from now on and, with `flush`, makes everything
    /// ingested before the call durable. Waits for a flush, compaction, image creation or GC
    /// in progress either way; those starting after it do nothing.
    pub fn shutdown(&self, flush: bool) -> Result<(), TimelineError> {
        self.lifecycle.advance_to(Lifecycle::ShuttingDown);
        self.l0_count_changed();
        // A batch being stored finishes first; those after it find the state and are refused.
        drop(self.writer());
        // No read waits for an LSN that will not come.
        self.cancel_lsn_waits();
        let result = if flush { self.checkpoint() } else { Ok(()) };
        self.lifecycle.advance_to(Lifecycle::Stopped);
        drop(self.flush_lock.lock().unwrap_or_else(|e| e.into_inner()));
        // A compaction, image creation or GC in progress sees the state and gives up
        // before its commit; once these are free none is left to store a manifest in a
        // directory that may be about to go.
        drop(
            self.compaction_lock
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        drop(self.image_lock.lock().unwrap_or_else(|e| e.into_inner()));
        // Nothing commits any more: the uploads can drain and stop.
        if let Some(remote) = self.remote.get() {
            remote.stop(flush && result.is_ok());
        }
        result
    }
}
