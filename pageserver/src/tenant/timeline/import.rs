//! Imports: many versions stored at one LSN, all of them or none.
//!
//! An import (a snapshot of a PostgreSQL data directory, `crate::datadir`) stores hundreds of
//! megabytes at one LSN, which it may learn only at the end of its input, and must be applied
//! whole or not at all: a basebackup must never see half of one. Batches cannot do that (each
//! batch is its own LSN, and a freeze between two of them makes the first durable), so an
//! import writes into layers of its own that no reader sees until its commit:
//!
//! ```text
//!   begin_import ──> runs: undated delta layer files, written as the input streams in
//!       │            (put_in_order: one large input's values in key order, straight to disk)
//!       │            rest: a private InMemoryLayer at a placeholder LSN (put: any order)
//!       │            read_current: the state at the base LSN, for comparisons
//!       ├── commit(lsn): every run finished at lsn, the private layer dated at lsn and written
//!       │                as one more file; what the open layer held flushed; then one manifest
//!       │                lists them all as L0s [base+1, lsn+1) with disk_consistent_lsn = lsn,
//!       │                and last_record_lsn = lsn: durable and visible together
//!       └── dropped:     the runs' temporary files and the private layer go; nothing changed
//! ```
//!
//! # Why runs
//!
//! A version that goes through the private layer is written twice: into its ephemeral file, and
//! from there, in key order, into a layer file at the commit. The values of one relation
//! segment or one file arrive in key order, so a new one of [`IMPORT_RUN_MIN_BYTES`] or more,
//! or what an older one stores past its first [`IMPORT_RUN_MIN_BYTES`], is written once,
//! straight into a layer file (a run), whose index is built when the commit gives the LSN. A run goes on as long as the keys keep increasing (the
//! next large input may continue it); one whose first key is lower starts a new run, up to
//! [`MAX_IMPORT_RUNS`], after which the rest goes through the private layer. A key is put once
//! (a second put is refused), so the import's layers hold disjoint sets of keys at the same LSN
//! range: an L0 group, which reads walk like any L0s and compaction takes whole (see
//! `layer_set/map.rs`). A read probes every layer of the group whose key range covers its key: the
//! private layer's file spans most of the key space (it holds the metadata keys, above every
//! block), and runs overlap when the archive's path order is not the key order, so up to
//! `MAX_IMPORT_RUNS + 1` until a compaction merges the group.
//!
//! # The group's LSN range
//!
//! The group's files cover `[base + 1, lsn + 1)`, every version at `lsn`: they start where the
//! timeline's history before the import ends (the commit's flush leaves `disk_consistent_lsn`
//! at the base, since batches are refused meanwhile), so the layers' ranges meet with no gap
//! (`manifest::history`), and a manifest that lost a layer below the import cannot pass for
//! one where nothing was written. A read between the base and `lsn` probes the group and finds
//! no version there, as it would find no layer.
//!
//! If storing the commit's manifest fails before its rename, the files are removed; after its
//! rename (the directory's fsync), they are kept and the timeline is broken (`commit_manifest`):
//! the manifest on disk lists them unless a crash comes first, and a load finds out which it
//! is (listed: the import is there; unlisted above `disk_consistent_lsn`: removed).
//!
//! While an import runs, batches are refused (`ImportInProgress`): the import compares what it
//! is given with the state at its base LSN and stores only what differs, which is right only if
//! nothing lands between the base and the snapshot. A crash before the commit's manifest leaves
//! temporary run files and the private layer's ephemeral file, which the next load removes, or
//! finished files above `disk_consistent_lsn` that no manifest lists, which it removes too.

use super::*;
use crate::tenant::storage_layer::delta_layer::DeltaLayerWriter;
use crate::tenant::storage_layer::layer_name::LayerName;

/// The most runs one import writes straight into layer files (the size of its L0 group is at
/// most one more: the private layer's file).
pub const MAX_IMPORT_RUNS: usize = 8;

/// What an input that is not new stores through the private layer before the rest of it goes
/// into a run (a new one this large goes there from its first value): one that stores less (a
/// few changed blocks of a large file) adds no file, which would cost more than writing its
/// values twice.
pub const IMPORT_RUN_MIN_BYTES: u64 = 1 << 20;

/// An import in progress: see the module documentation.
pub struct Import<'t> {
    timeline: &'t Timeline,
    /// `last_record_lsn` when the import began: the state it compares with.
    base_lsn: Lsn,
    layer: Option<InMemoryLayer>,
    /// Oldest first; only the last one takes more values.
    runs: Vec<DeltaLayerWriter>,
    /// Held for the import's lifetime: one import per timeline at a time.
    _exclusive: MutexGuard<'t, ()>,
}

impl Timeline {
    /// Begins an import; see the module documentation. Refused while another one runs.
    pub fn begin_import(&self) -> Result<Import<'_>, TimelineError> {
        let exclusive = match self.import_lock.try_lock() {
            Ok(guard) => guard,
            // An import that panicked is over: its layers were dropped with it.
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                return Err(TimelineError::ImportInProgress)
            }
        };
        let writer = self.writer();
        if self.is_shutting_down() {
            return Err(TimelineError::ShuttingDown);
        }
        if let Some(reason) = self.broken_reason() {
            return Err(TimelineError::Broken { reason });
        }
        let base_lsn = self.last_record_lsn();
        // A placeholder until the commit dates the versions: above everything ingested.
        // Unread until the commit writes it out (reading it back bypassing the page cache):
        // its values stay out of the cache, an import of gigabytes leaves readers' pages there.
        let layer = InMemoryLayer::create_unread(
            &self.dir,
            self.cache.clone(),
            Lsn(base_lsn.0 + 1),
            self.conf.max_value_size,
        )
        .map_err(|source| TimelineError::Io {
            path: self.dir.clone(),
            source,
        })?;
        // Under write_lock, where batches look at it.
        self.lifecycle
            .begin_import()
            .map_err(|_| TimelineError::ShuttingDown)?;
        drop(writer);
        Ok(Import {
            timeline: self,
            base_lsn,
            layer: Some(layer),
            runs: Vec::new(),
            _exclusive: exclusive,
        })
    }
}

impl Import<'_> {
    /// The LSN whose state the import compares with (`last_record_lsn` when it began).
    pub fn base_lsn(&self) -> Lsn {
        self.base_lsn
    }

    /// The page or value of `key` as of the base LSN; `None` if it has none, or if only
    /// PostgreSQL's redo would make it (a page ingested from WAL records): either way the
    /// import stores what it has.
    pub fn read_current(&self, key: Key) -> Result<Option<Bytes>, TimelineError> {
        if self.base_lsn == Lsn(0) {
            return Ok(None);
        }
        match self.timeline.get_page(key, self.base_lsn) {
            Err(TimelineError::NeedsWalRedo { .. }) => Ok(None),
            other => other,
        }
    }

    fn check_put(&self, key: Key) -> Result<(), TimelineError> {
        if self.timeline.is_shutting_down() {
            return Err(TimelineError::ShuttingDown);
        }
        if key == Key::MAX {
            return Err(TimelineError::Reserved {
                index: 0,
                what: format!("key {key}"),
            });
        }
        Ok(())
    }

    /// Whether a run holds `key`.
    fn in_a_run(&self, key: Key) -> bool {
        self.runs.iter().any(|run| {
            run.first_key().is_some_and(|first| first <= key)
                && run.last_key().is_some_and(|last| key <= last)
                && run.holds_undated(key)
        })
    }

    /// A key put twice: its two versions would be in two layers of the group at one LSN.
    fn duplicate(&self, key: Key) -> TimelineError {
        let layer = self.layer.as_ref().expect("present until commit");
        TimelineError::Put(PutError::Duplicate {
            key,
            lsn: layer.start_lsn(),
        })
    }

    /// Stores `value` as the new version of `key`, in any order. A key can be put once per
    /// import (by this or by [`Self::put_in_order`]); a second time is refused.
    pub fn put(&mut self, key: Key, value: &Value) -> Result<(), TimelineError> {
        self.check_put(key)?;
        if self.in_a_run(key) {
            return Err(self.duplicate(key));
        }
        let layer = self.layer.as_ref().expect("present until commit");
        layer.put(key, layer.start_lsn(), value)?;
        Ok(())
    }

    /// Stores `value` as the new version of `key`, for the values of one large input put in
    /// increasing key order (see [`IMPORT_RUN_MIN_BYTES`]): written straight
    /// into a run's layer file when the keys allow (see the module documentation), else as
    /// [`Self::put`]. A key put before is refused.
    pub fn put_in_order(&mut self, key: Key, value: &Value) -> Result<(), TimelineError> {
        self.check_put(key)?;
        if check_storable(value, self.timeline.conf.max_value_size).is_err() {
            // The private layer refuses it with the reason.
            return self.put(key, value);
        }
        let private = self.layer.as_ref().expect("present until commit");
        if private.has_key(key) || self.in_a_run(key) {
            return Err(self.duplicate(key));
        }
        let continues = self
            .runs
            .last()
            .and_then(|run| run.last_key())
            .is_some_and(|last| key > last);
        if !continues {
            if self.runs.len() >= MAX_IMPORT_RUNS {
                return self.put(key, value);
            }
            let timeline = self.timeline;
            self.runs.push(
                DeltaLayerWriter::new_undated(
                    &timeline.dir,
                    timeline.tenant_id,
                    timeline.timeline_id,
                )?
                .with_compression(timeline.conf.layer_compression)?,
            );
        }
        let run = self.runs.last_mut().expect("one was just ensured");
        run.put_undated(key, value)?;
        Ok(())
    }

    /// Bytes the import has stored so far: its values as blobs in its run files and its
    /// ephemeral file, before any compression (the same figure whatever `layer_compression`
    /// says).
    pub fn bytes_written(&self) -> u64 {
        let private = self.layer.as_ref().map_or(0, |l| l.bytes_written());
        private
            + self
                .runs
                .iter()
                .map(|r| r.plain_values_bytes())
                .sum::<u64>()
    }

    /// Dates every version at `lsn` (above the base LSN) and makes them durable, as one
    /// change: readers see none of them until `last_record_lsn` reaches `lsn`, and a crash
    /// before the manifest that lists them leaves the timeline at its base.
    pub fn commit(mut self, lsn: Lsn) -> Result<(), TimelineError> {
        let timeline = self.timeline;
        if lsn <= self.base_lsn {
            return Err(TimelineError::LsnNotAdvancing {
                lsn,
                last_record: self.base_lsn,
            });
        }
        if lsn.0 >= Lsn::MAX.0 - 1 {
            return Err(TimelineError::Reserved {
                index: 0,
                what: format!("LSN {lsn}"),
            });
        }
        // Nothing is written into a timeline that is stopping (its directory may be going).
        if timeline.is_shutting_down() {
            return Err(TimelineError::ShuttingDown);
        }
        if let Some(remote) = timeline.remote.get() {
            remote.wait_for_upload_room(&|| timeline.is_shutting_down())?;
            if timeline.is_shutting_down() {
                return Err(TimelineError::ShuttingDown);
            }
        }
        let started = Instant::now();
        let mut written = Vec::new();
        let result = self.write_layers(lsn, &mut written).and_then(|()| {
            // What the open layer holds (below the base) goes first: the import's layers are
            // the newest L0s, and no in-memory layer may be left older than them.
            timeline.checkpoint()?;
            timeline.failpoint("import-before-manifest")?;
            self.publish(lsn, &written)
        });
        if let Err(e) = result {
            // The files the manifest does not list are no one's. Once a store of it failed
            // after its rename, the manifest on disk may list them: then nothing is removed,
            // and the timeline is broken until a load finds out which manifest it is.
            timeline.remove_uncommitted(written.iter().map(|w| w.path.clone()));
            // A file whose commit failed after its rename (at the directory's fsync) has its
            // final name but is in no list: nothing else makes layers at this range.
            remove_unlisted_at(timeline, Lsn(self.base_lsn.0 + 1)..Lsn(lsn.0 + 1));
            return Err(e);
        }
        tracing::info!(
            tenant = %timeline.tenant_id,
            timeline = %timeline.timeline_id,
            layers = written.len(),
            bytes = written.iter().map(|w| w.size).sum::<u64>(),
            commit_ms = started.elapsed().as_millis() as u64,
            "committed an import at {lsn}"
        );
        // The commit woke the compaction loop if the new L0s call for it.
        Ok(())
    }

    /// Finishes every run at `lsn` and writes the private layer out, each durable under its
    /// final name; `written` gets each file as it is made, so a failure can remove them.
    fn write_layers(
        &mut self,
        lsn: Lsn,
        written: &mut Vec<WrittenLayer>,
    ) -> Result<(), TimelineError> {
        let timeline = self.timeline;
        let range_start = Lsn(self.base_lsn.0 + 1);
        for run in self.runs.drain(..) {
            written.push(run.finish_at(range_start, lsn)?);
        }
        let mut layer = self.layer.take().expect("present until commit");
        layer
            .move_to_lsn(lsn)
            .expect("an import's layer is unshared, unfrozen and at one LSN");
        layer.freeze(Lsn(lsn.0 + 1))?;
        if let Some(w) = layer.write_to_disk(
            &timeline.dir,
            timeline.tenant_id,
            timeline.timeline_id,
            timeline.conf.layer_compression,
        )? {
            written.push(w);
        }
        Ok(())
    }

    /// The commit point: one manifest lists the files as L0s, then the map and
    /// `last_record_lsn` show them.
    fn publish(&self, lsn: Lsn, written: &[WrittenLayer]) -> Result<(), TimelineError> {
        let timeline = self.timeline;
        // Opened before the locks below: batches and flushes wait for none of its file reads.
        let add = written
            .iter()
            .map(|w| {
                let mut file = NewLayerFile::delta(w, LayerLevel::L0);
                file.opened = Some(timeline.open_new_layer(&file)?);
                Ok(file)
            })
            .collect::<Result<Vec<_>, TimelineError>>()?;
        // The write lock, then the flush lock: the order in which a batch's inline flush takes
        // them. No flush may run between the check below and the commit: it would store a
        // manifest with an older disk_consistent_lsn after this one.
        let writer = timeline.writer();
        let _flusher = timeline
            .flush_lock
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if timeline.is_shutting_down() {
            return Err(TimelineError::ShuttingDown);
        }
        if timeline.disk_consistent_lsn() != self.base_lsn {
            // The group starts above the base: the history below it must end there.
            return Err(TimelineError::LayerSet {
                file: "the import's layers".to_owned(),
                reason: format!(
                    "they start above {}, but disk_consistent_lsn is {}",
                    self.base_lsn,
                    timeline.disk_consistent_lsn()
                ),
            });
        }
        let map = timeline.layer_map();
        if !map.frozen.is_empty() || map.open.as_ref().is_some_and(|open| !open.is_empty()) {
            // Batches are refused while an import runs, and the checkpoint flushed the rest.
            return Err(TimelineError::LayerSet {
                file: "the open layer".to_owned(),
                reason: "versions arrived in memory during an import's commit".to_owned(),
            });
        }
        drop(map);
        let mut change = LayerChange::new(ChangeKind::Import);
        change.disk_consistent_lsn = Some(lsn);
        change.add = add;
        timeline.commit(change)?;
        timeline.advance_last_record_lsn(lsn);
        timeline.lifecycle.end_import();
        drop(writer);
        Ok(())
    }
}

/// Removes the layer files of LSN range `range` (an import's group) that the manifest does not
/// list. Best effort: one left behind starts above `disk_consistent_lsn` until a later import
/// passes it.
fn remove_unlisted_at(timeline: &Timeline, range: Range<Lsn>) {
    let Ok(entries) = std::fs::read_dir(&timeline.dir) else {
        return;
    };
    let ours = entries.filter_map(|entry| {
        let path = entry.ok()?.path();
        let name: LayerName = path.file_name()?.to_str()?.parse().ok()?;
        (name.lsn_range() == range).then_some(path)
    });
    timeline.remove_uncommitted(ours.collect::<Vec<_>>());
}

impl Drop for Import<'_> {
    fn drop(&mut self) {
        // Not committed (or committed: then the flag is already down). The runs' temporary
        // files and the private layer, if still here, are dropped with it.
        self.timeline.lifecycle.end_import();
    }
}
