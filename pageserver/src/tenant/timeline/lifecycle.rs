//! Where a timeline is in its life: one state, read without a lock.
//!
//! ```text
//!             begin_import                    shutdown begins           its flush ended
//!   Active ────────────────> Importing ───────────────────> ShuttingDown ───────────────> Stopped
//!     │    <────────────────                                     ^
//!     │    the import ends                                       │
//!     └──────────────────────────── shutdown begins ─────────────┘
//! ```
//!
//! - **Active**: batches, imports, flushes, compaction, image creation and GC run.
//! - **Importing**: one import writes (`import.rs`); batches are refused (`ImportInProgress`).
//!   Set under `write_lock`, where batches look at it; left when the import commits (under
//!   `write_lock`) or is dropped.
//! - **ShuttingDown**: `shutdown` began: batches and new imports are refused, held batches and
//!   upload waits give up, compaction, image creation and GC do not commit; the shutdown's own
//!   checkpoint still flushes.
//! - **Stopped**: the last flush is done; nothing writes to the directory again (it may be
//!   about to be deleted), and flushes that start later do nothing.
//!
//! The state only moves right, except Importing back to Active. A fault (`broken.rs`: a batch
//! that failed half-stored, a manifest store with an unknown outcome) is apart from it: a broken
//! timeline still reads, and still shuts down.

use std::sync::atomic::{AtomicU8, Ordering};

use super::Timeline;

/// The state of a timeline (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Lifecycle {
    Active = 0,
    Importing = 1,
    ShuttingDown = 2,
    Stopped = 3,
}

impl Lifecycle {
    fn from_u8(value: u8) -> Lifecycle {
        match value {
            0 => Lifecycle::Active,
            1 => Lifecycle::Importing,
            2 => Lifecycle::ShuttingDown,
            _ => Lifecycle::Stopped,
        }
    }
}

/// A [`Lifecycle`] shared by the timeline's threads.
#[derive(Debug)]
pub(super) struct LifecycleCell(AtomicU8);

impl LifecycleCell {
    pub fn new() -> LifecycleCell {
        LifecycleCell(AtomicU8::new(Lifecycle::Active as u8))
    }

    pub fn get(&self) -> Lifecycle {
        Lifecycle::from_u8(self.0.load(Ordering::Acquire))
    }

    /// Active to Importing; otherwise the state it is in.
    pub fn begin_import(&self) -> Result<(), Lifecycle> {
        self.0
            .compare_exchange(
                Lifecycle::Active as u8,
                Lifecycle::Importing as u8,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .map(|_| ())
            .map_err(Lifecycle::from_u8)
    }

    /// Importing back to Active; nothing if shutdown began meanwhile.
    pub fn end_import(&self) {
        let _ = self.0.compare_exchange(
            Lifecycle::Importing as u8,
            Lifecycle::Active as u8,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// To ShuttingDown, or to Stopped: never back.
    pub fn advance_to(&self, state: Lifecycle) {
        debug_assert!(state >= Lifecycle::ShuttingDown);
        self.0.fetch_max(state as u8, Ordering::AcqRel);
    }
}

impl Timeline {
    /// Whether shutdown has begun: background work for the timeline stops.
    pub fn is_shutting_down(&self) -> bool {
        self.lifecycle.get() >= Lifecycle::ShuttingDown
    }

    /// Whether shutdown's last flush is done: nothing writes to the directory again.
    pub(super) fn is_stopped(&self) -> bool {
        self.lifecycle.get() == Lifecycle::Stopped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_only_moves_forward_but_for_an_import_ending() {
        let cell = LifecycleCell::new();
        assert_eq!(cell.get(), Lifecycle::Active);
        cell.begin_import().unwrap();
        assert_eq!(cell.begin_import(), Err(Lifecycle::Importing));
        cell.end_import();
        assert_eq!(cell.get(), Lifecycle::Active);
        cell.begin_import().unwrap();
        cell.advance_to(Lifecycle::ShuttingDown);
        // An import that ends after shutdown began leaves it shutting down.
        cell.end_import();
        assert_eq!(cell.get(), Lifecycle::ShuttingDown);
        assert_eq!(cell.begin_import(), Err(Lifecycle::ShuttingDown));
        cell.advance_to(Lifecycle::Stopped);
        cell.advance_to(Lifecycle::ShuttingDown);
        assert_eq!(cell.get(), Lifecycle::Stopped);
    }
}
