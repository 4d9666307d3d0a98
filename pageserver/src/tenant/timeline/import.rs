//! Imports: many versions stored at one LSN, all of them or none.
//!
//! An import (a snapshot of a PostgreSQL data directory, `crate::datadir`) stores hundreds of
//! megabytes at one LSN, which it may learn only at the end of its input, and must be applied
//! whole or not at all: a basebackup must never see half of one. Batches cannot do that (each
//! batch is its own LSN, and a freeze between two of them makes the first durable), so an
//! import writes into a layer of its own:
//!
//! ```text
//!   begin_import ──> private InMemoryLayer (versions at a placeholder LSN; no reader sees it)
//!       │                 puts, read_current (the state at the base LSN, for comparisons)
//!       ├── commit(lsn): date the versions at lsn, freeze the open layer, queue the private
//!       │                one frozen [lsn, lsn+1), last_record_lsn = lsn, flush both: durable
//!       └── dropped:     the private layer and its ephemeral file are dropped; nothing changed
//! ```
//!
//! While an import runs, batches are refused (`ImportInProgress`): the import compares what it
//! is given with the state at its base LSN and stores only what differs, which is right only if
//! nothing lands between the base and the snapshot. A crash before the commit's flush leaves
//! the private layer's ephemeral file behind, which the next load removes like any other.

use super::*;

/// An import in progress: see the module documentation.
pub struct Import<'t> {
    timeline: &'t Timeline,
    /// `last_record_lsn` when the import began: the state it compares with.
    base_lsn: Lsn,
    layer: Option<InMemoryLayer>,
    /// Held for the import's lifetime: one import per timeline at a time.
    _exclusive: MutexGuard<'t, ()>,
}

impl Timeline {
    /// Begins an import; see the module documentation. Refused while another one runs.
    pub fn begin_import(&self) -> Result<Import<'_>, TimelineError> {
        let exclusive = match self.import_lock.try_lock() {
            Ok(guard) => guard,
            // An import that panicked is over: its layer was dropped with it.
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                return Err(TimelineError::ImportInProgress)
            }
        };
        let writer = self.writer();
        if writer.stopping {
            return Err(TimelineError::ShuttingDown);
        }
        if let Some(reason) = self.broken_reason() {
            return Err(TimelineError::Broken { reason });
        }
        let base_lsn = self.last_record_lsn();
        // A placeholder until the commit dates the versions: above everything ingested.
        // Unread until the commit flushes it (which reads it back bypassing the page cache):
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
        self.importing.store(true, Ordering::Release);
        drop(writer);
        Ok(Import {
            timeline: self,
            base_lsn,
            layer: Some(layer),
            _exclusive: exclusive,
        })
    }
}

impl Import<'_> {
    /// The LSN whose state the import compares with (`last_record_lsn` when it began).
    pub fn base_lsn(&self) -> Lsn {
        self.base_lsn
    }

    /// The page or value of `key` as of the base LSN; `None` if it has none.
    pub fn read_current(&self, key: Key) -> Result<Option<Bytes>, TimelineError> {
        if self.base_lsn == Lsn(0) {
            return Ok(None);
        }
        self.timeline.get_page(key, self.base_lsn)
    }

    /// Stores `value` as the new version of `key`. A key can be put once per import.
    pub fn put(&mut self, key: Key, value: &Value) -> Result<(), TimelineError> {
        if self.timeline.is_shutting_down() {
            return Err(TimelineError::ShuttingDown);
        }
        if key == Key::MAX {
            return Err(TimelineError::Reserved {
                index: 0,
                what: format!("key {key}"),
            });
        }
        let layer = self.layer.as_ref().expect("present until commit");
        layer.put(key, layer.start_lsn(), value)?;
        Ok(())
    }

    /// Bytes the import has stored so far (serialized values in its ephemeral file).
    pub fn bytes_written(&self) -> u64 {
        self.layer.as_ref().map_or(0, |l| l.bytes_written())
    }

    /// Dates every version at `lsn` (above the base LSN) and makes them durable, as one
    /// change: readers see none of them until `last_record_lsn` reaches `lsn`, and a crash
    /// before the flush's manifest commit leaves the timeline at its base.
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
        let mut layer = self.layer.take().expect("present until commit");
        layer
            .move_to_lsn(lsn)
            .expect("an import's layer is unshared, unfrozen and at one LSN");
        layer.freeze(Lsn(lsn.0 + 1))?;
        {
            let mut writer = timeline.writer();
            if writer.stopping {
                return Err(TimelineError::ShuttingDown);
            }
            // Batches were refused since the import began: nothing was ingested above the
            // base, so the open layer ends below the import's layer.
            timeline.update_layer_map(|map| {
                timeline.freeze_open(&mut writer, map, Lsn(self.base_lsn.0 + 1))?;
                map.frozen.push(Arc::new(layer));
                Ok::<_, TimelineError>(())
            })?;
            timeline.advance_last_record_lsn(lsn);
            timeline.importing.store(false, Ordering::Release);
        }
        if let Some(wakeup) = &timeline.flush_wakeup {
            wakeup.notify();
        }
        timeline.flush_frozen_until(lsn)
    }
}

impl Drop for Import<'_> {
    fn drop(&mut self) {
        // Not committed (or committed: then the flag is already down). The private layer, if
        // still here, is dropped with its ephemeral file.
        self.timeline.importing.store(false, Ordering::Release);
    }
}
