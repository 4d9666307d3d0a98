//! Ingest: batches validated whole, then stored into the open layer with no lock on the layer
//! map (see "Ingest in batches" and "Backpressure on L0 layers" in the `timeline` module
//! documentation); freezing the open layer.

use super::*;

impl Timeline {
    /// Ingests one version: a batch of one record.
    pub fn put(&self, key: Key, lsn: Lsn, value: &Value) -> Result<(), TimelineError> {
        self.put_batch(&[PutRecord {
            key,
            lsn,
            value: value.clone(),
        }])
    }

    /// Ingests a batch of versions (see the module documentation for the LSN rules). The whole
    /// batch is validated first: a refused batch changes nothing. Returns once every version is
    /// readable.
    pub fn put_batch(&self, records: &[PutRecord]) -> Result<(), TimelineError> {
        self.store_batch(records).map(drop)
    }

    /// [`Timeline::put_batch`], paced: returns how long the caller is to hold its answer
    /// while the frozen layers are at their bound or the upload queue is over its own
    /// (`pacing.rs`), zero otherwise. The batch is stored and readable either way; the caller
    /// waits without holding a thread (an HTTP request sleeps on the runtime), so that ingest
    /// slows to the pace of the flush and of the uploads.
    pub fn put_batch_paced(&self, records: &[PutRecord]) -> Result<Duration, TimelineError> {
        let stored = self.store_batch(records)?;
        if stored == 0 {
            return Ok(Duration::ZERO);
        }
        let pace = self.pace();
        if !pace.applies() {
            return Ok(Duration::ZERO);
        }
        let hold = self.pacer.hold_for(stored, Instant::now(), pace);
        if !hold.is_zero() {
            crate::metrics::INGEST_PACE_SECONDS.observe(hold.as_secs_f64());
        }
        Ok(hold)
    }

    /// Stores a batch; returns the bytes it added to the open layer.
    fn store_batch(&self, records: &[PutRecord]) -> Result<u64, TimelineError> {
        // Held outside write_lock, so that a held batch keeps no checkpoint, flush or shutdown
        // waiting; then checked again under it, so that batches that waited together do not
        // all go through on the same room.
        // A broken timeline refuses at once: no compaction will make room for it, so waiting
        // for room would only hold the thread (checked again under write_lock below).
        if let Some(reason) = self.broken_reason() {
            return Err(TimelineError::Broken { reason });
        }
        let mut writer = loop {
            if !records.is_empty() {
                self.wait_for_l0_room()?;
                self.wait_for_upload_room_before_batch(records)?;
            }
            let writer = self.writer();
            // Again under the lock: a batch that went in meanwhile may have left this one the
            // batch that fills the open layer, with no room to flush it. A timeline shutting
            // down stops waiting for room (so the wait returns at once): it is refused below,
            // rather than looping.
            if records.is_empty()
                || self.is_shutting_down()
                || !(self.l0_stopped() || self.must_wait_for_upload_room(records))
            {
                break writer;
            }
        };
        if self.is_shutting_down() {
            return Err(TimelineError::ShuttingDown);
        }
        if let Some(reason) = self.broken_reason() {
            return Err(TimelineError::Broken { reason });
        }
        let (Some(first), Some(last)) = (records.first(), records.last()) else {
            return Ok(0);
        };
        if self.lifecycle.get() == Lifecycle::Importing {
            return Err(TimelineError::ImportInProgress);
        }
        self.validate_batch(records)?;

        let open = self.open_layer_for(&mut writer, first.lsn, last.lsn)?;
        let bytes_before = open.bytes_written();
        // No lock on the layer map from here: readers go on while the batch is stored, and
        // each version is readable as soon as it is (a read at or below last_record_lsn does
        // not see the ones above it).
        for record in records {
            if let Err(e) = open.put(record.key, record.lsn, &record.value) {
                // No resume LSN in the reason: frozen layers may still flush and move it.
                let reason = format!(
                    "storing version {} of key {} failed after the batch was validated: {e}",
                    record.lsn, record.key,
                );
                // Set under write_lock.
                self.break_timeline(reason, false);
                return Err(e.into());
            }
        }
        let stored = open.bytes_written() - bytes_before;
        let full = open.bytes_written() >= self.conf.checkpoint_distance;
        self.advance_last_record_lsn(last.lsn);
        let backlog = if full {
            self.update_layer_map(|map| self.freeze_open(&mut writer, map, Lsn(last.lsn.0 + 1)))?;
            self.layer_map().frozen.len() > self.conf.max_frozen_layers
        } else {
            false
        };
        if backlog {
            // Still holding write_lock: other writers wait too, which is the point; for the
            // oldest frozen layer's write only (the background flush's, or this thread's when
            // none runs), not every frozen layer's. The batch is stored and readable whatever
            // happens here, so a failed flush is not this batch's failure: the layers stay
            // frozen and the flush loop retries them.
            crate::metrics::BACKPRESSURE_FLUSHES.inc();
            if let Err(e) = self.flush_frozen_to_bound() {
                tracing::error!(
                    tenant = %self.tenant_id,
                    timeline = %self.timeline_id,
                    "flush for ingest backpressure failed, will retry: {e}"
                );
            }
        }
        drop(writer);
        Ok(stored)
    }

    /// The open layer a batch from `first` to `last` goes into: the current one if it can hold
    /// `last`, else a new one (the current one frozen first). Callers hold `write_lock`.
    fn open_layer_for(
        &self,
        writer: &mut WriterState,
        first: Lsn,
        last: Lsn,
    ) -> Result<Arc<InMemoryLayer>, TimelineError> {
        if let Some(open) = &self.layer_map().open {
            if open.can_hold_lsn(last) {
                return Ok(open.clone());
            }
        }
        self.update_layer_map(|map| {
            if map.open.is_some() {
                self.freeze_open(writer, map, first)?;
            }
            // The open layer starts where the newest frozen or flushed one ended, so the
            // layers' ranges tile the LSN space; unless the batch jumps too far ahead for a
            // layer from there to index it, and then it indexes from the batch on, while the
            // file it becomes still covers the LSNs from there (no version lies in between,
            // and the history stays without gaps: `manifest::history`). disk_consistent_lsn
            // is read under the map's lock, which a flush holds while it moves both.
            let previous_end = map
                .frozen
                .last()
                .and_then(|l| l.end_lsn())
                .unwrap_or(Lsn(self.disk_consistent_lsn().0 + 1));
            let start = if last.0 - previous_end.0 < MAX_LSN_SPAN {
                previous_end
            } else {
                first
            };
            let layer = InMemoryLayer::create(
                &self.dir,
                self.cache.clone(),
                start,
                self.conf.max_value_size,
            )
            .map_err(|source| TimelineError::Io {
                path: self.dir.clone(),
                source,
            })?;
            let layer = Arc::new(layer.covering_from(previous_end));
            map.open = Some(layer.clone());
            writer.open_since = Some(Instant::now());
            Ok(layer)
        })
    }

    /// Backpressure on the L0 count (its depth: an import's group counts once, see
    /// `layer_set/map.rs`), when a compaction loop serves this timeline: with
    /// `l0_slowdown_threshold` L0 layers a batch first waits a little (longer the more L0s) or
    /// until a compaction finishes; with `l0_stop_threshold` it waits until compaction brings
    /// the count below that, for at most `L0_STOP_MAX_WAIT`, then is refused (503). At most
    /// `MAX_L0_STOP_WAITERS` batches wait so at once; more are refused at once.
    fn wait_for_l0_room(&self) -> Result<(), TimelineError> {
        let Some(compaction) = &self.compaction_wakeup else {
            return Ok(());
        };
        let conf = &self.conf;
        if conf.compaction_threshold == 0 {
            return Ok(());
        }
        let l0 = self.layer_map().l0_depth();
        if l0 < conf.l0_slowdown_threshold {
            return Ok(());
        }
        compaction.notify();
        let started = Instant::now();
        let guard = self.l0_lock.lock().unwrap_or_else(|e| e.into_inner());
        if l0 < conf.l0_stop_threshold {
            let excess = (l0 + 1 - conf.l0_slowdown_threshold) as u32;
            let delay = (L0_SLOWDOWN_STEP * excess).min(L0_SLOWDOWN_MAX);
            let _ = self.l0_changed.wait_timeout(guard, delay);
            crate::metrics::INGEST_L0_WAIT_SECONDS
                .with_label_values(&["slowdown"])
                .observe(started.elapsed().as_secs_f64());
            return Ok(());
        }
        // Each waiting batch holds a thread of the blocking pool that reads use too: past a
        // few per timeline (its batches go through one at a time anyway), refuse at once.
        if self.l0_stop_waiters.fetch_add(1, Ordering::AcqRel) >= MAX_L0_STOP_WAITERS {
            self.l0_stop_waiters.fetch_sub(1, Ordering::AcqRel);
            return Err(TimelineError::IngestStopped {
                l0,
                limit: conf.l0_stop_threshold,
                waited: started.elapsed(),
            });
        }
        tracing::warn!(
            tenant = %self.tenant_id,
            timeline = %self.timeline_id,
            "ingest stopped: an L0 depth of {l0} waits for compaction (l0_stop_threshold {})",
            conf.l0_stop_threshold
        );
        let mut guard = guard;
        let outcome = loop {
            let now = self.layer_map().l0_depth();
            if now < conf.l0_stop_threshold {
                break Ok(());
            }
            if self.is_shutting_down() {
                break Err(TimelineError::ShuttingDown);
            }
            if started.elapsed() >= L0_STOP_MAX_WAIT {
                break Err(TimelineError::IngestStopped {
                    l0: now,
                    limit: conf.l0_stop_threshold,
                    waited: started.elapsed(),
                });
            }
            compaction.notify();
            guard = self
                .l0_changed
                .wait_timeout(guard, Duration::from_millis(100))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        };
        drop(guard);
        self.l0_stop_waiters.fetch_sub(1, Ordering::AcqRel);
        let waited = started.elapsed();
        crate::metrics::INGEST_L0_WAIT_SECONDS
            .with_label_values(&["stop"])
            .observe(waited.as_secs_f64());
        tracing::info!(
            tenant = %self.tenant_id,
            timeline = %self.timeline_id,
            waited_ms = waited.as_millis() as u64,
            "ingest resumed after waiting for compaction"
        );
        outcome
    }

    /// Whether the L0 count is at `l0_stop_threshold` (with backpressure on).
    fn l0_stopped(&self) -> bool {
        self.compaction_wakeup.is_some()
            && self.conf.compaction_threshold != 0
            && self.layer_map().l0_depth() >= self.conf.l0_stop_threshold
    }

    /// Tells batches held by backpressure that the L0 count may have dropped.
    pub(super) fn l0_count_changed(&self) {
        let _guard = self.l0_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.l0_changed.notify_all();
    }

    /// Checks everything about a batch that can be checked before storing any of it.
    fn validate_batch(&self, records: &[PutRecord]) -> Result<(), TimelineError> {
        let first = records[0].lsn;
        let last_record = self.last_record_lsn();
        let durable = self.disk_consistent_lsn();
        if first <= durable {
            return Err(TimelineError::LsnDurable {
                lsn: first,
                disk_consistent: durable,
            });
        }
        if first <= last_record {
            return Err(TimelineError::LsnNotAdvancing {
                lsn: first,
                last_record,
            });
        }
        let mut keys_at_lsn: HashSet<Key> = HashSet::new();
        let mut previous = first;
        for (index, PutRecord { key, lsn, value }) in records.iter().enumerate() {
            let (key, lsn) = (*key, *lsn);
            // Key::MAX is the exclusive end of key ranges, and a layer's LSN range ends one
            // past its last LSN: neither limit can hold a version.
            if key == Key::MAX {
                return Err(TimelineError::Reserved {
                    index,
                    what: format!("key {key}"),
                });
            }
            if lsn == Lsn::MAX {
                return Err(TimelineError::Reserved {
                    index,
                    what: format!("LSN {lsn}"),
                });
            }
            if lsn < previous {
                return Err(TimelineError::BatchLsnBackwards {
                    index,
                    lsn,
                    previous,
                });
            }
            if lsn != previous {
                keys_at_lsn.clear();
            }
            if !keys_at_lsn.insert(key) {
                return Err(TimelineError::BatchDuplicate { index, key, lsn });
            }
            previous = lsn;
            let refused = |source| TimelineError::BatchValue {
                index,
                key,
                lsn,
                source,
            };
            // In this order, each refusal naming the first thing wrong: a value that cannot be
            // encoded, then a page redo would refuse, then a stored form over the limit.
            let storable = check_storable(value, self.conf.max_value_size);
            if let Err(source @ StoreValueError::NotEncodable(_)) = storable {
                return Err(refused(source));
            }
            // What redo would refuse later must be refused now, while nothing is stored.
            let page_len = match value {
                Value::Image(page) => Some(("an image", page.len())),
                Value::Delta { patches, .. } => patches
                    .iter()
                    .map(|p| p.offset as usize + p.data.len())
                    .max()
                    .map(|end| ("a delta", end)),
                // Not redone here: its size is PostgreSQL's to bound.
                Value::WalRecord { .. } => None,
            };
            if let Some((what, len)) = page_len.filter(|(_, len)| *len > self.conf.max_value_size) {
                return Err(TimelineError::PageTooLarge {
                    index,
                    what,
                    key,
                    lsn,
                    len,
                    max: self.conf.max_value_size,
                });
            }
            storable.map_err(refused)?;
        }
        // A new layer starting at the batch's first LSN must hold all of it.
        if previous.0 - first.0 >= MAX_LSN_SPAN {
            return Err(TimelineError::BatchSpanTooWide {
                first,
                last: previous,
            });
        }
        Ok(())
    }

    /// Moves `last_record_lsn` up to `lsn` with no version: the history up to it (WAL that
    /// changed no page) holds nothing more, and reads up to it are answered. No move if it is
    /// there already. Not durable by itself: after a restart `last_record_lsn` is where the
    /// layers on disk end, and the writer goes on from there.
    pub fn advance_last_record_lsn_to(&self, lsn: Lsn) -> Result<(), TimelineError> {
        let _writer = self.writer();
        if self.is_shutting_down() {
            return Err(TimelineError::ShuttingDown);
        }
        if let Some(reason) = self.broken_reason() {
            return Err(TimelineError::Broken { reason });
        }
        if self.lifecycle.get() == Lifecycle::Importing {
            return Err(TimelineError::ImportInProgress);
        }
        if lsn == Lsn::MAX {
            return Err(TimelineError::Reserved {
                index: 0,
                what: format!("LSN {lsn}"),
            });
        }
        if lsn > self.last_record_lsn() {
            self.advance_last_record_lsn(lsn);
        }
        Ok(())
    }

    pub(super) fn advance_last_record_lsn(&self, lsn: Lsn) {
        // Readable first, then announced: a woken waiter's read finds the LSN ingested.
        self.last_record_lsn.store(lsn.0, Ordering::SeqCst);
        self.lsn_wait.advanced(lsn);
    }

    /// Moves the open layer, if it holds anything, to the frozen queue of `map` with `end` as
    /// its exclusive end. Callers hold `write_lock`.
    pub(super) fn freeze_open(
        &self,
        writer: &mut WriterState,
        map: &mut LayerMap,
        end: Lsn,
    ) -> Result<(), FreezeError> {
        let Some(open) = map.open.take() else {
            return Ok(());
        };
        writer.open_since = None;
        // An empty layer is just dropped: its successor starts at the same LSN.
        if !open.is_empty() {
            if let Err(e) = open.freeze(end) {
                map.open = Some(open);
                return Err(e);
            }
            map.frozen.push(open);
            if let Some(wakeup) = &self.flush_wakeup {
                wakeup.notify();
            }
        }
        Ok(())
    }
}
