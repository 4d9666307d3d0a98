//! Eviction policy hints: the probation FIFO and the ghost fingerprints.
//!
//! Most pages read once are never read again. Counting CLOCK alone gives them the same run of
//! the clock as everything else, and while the hand goes round for them it wears down the
//! countdown of the hot pages too. So, as in S3-FIFO:
//!
//! * **Probation.** A page a reader asks for for the first time, or a page read by a scan,
//!   starts at countdown 0 and its slot is appended to a small FIFO (a tenth of the cache).
//!   While the FIFO is full, inserts evict from its front: a page that was not hit since it
//!   arrived is evicted there, a page that was hit has earned its place and is simply dropped
//!   from the FIFO. The clock hand over the whole cache moves only when probation has nothing
//!   to give, so one-hit pages recycle among themselves and never age the hot set.
//! * **Ghosts.** A fixed table of fingerprints of keys recently evicted from probation. A page
//!   asked for again soon after such an eviction was evicted too early: it skips probation.
//!   (Pages the clock hand evicts had their chance in the main cache and leave no ghost.)
//!
//! Both are hints. A FIFO entry names a slot and the generation it had when the entry was made;
//! if the slot was reused since, the entry is skipped. Entries lost to races and fingerprint
//! collisions only change which page is evicted, never what a lookup returns.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Share of the cache (1/N) that probation may hold.
const PROBATION_SHARE: usize = 10;

const ENTRY_PRESENT: u64 = 1 << 63;
const GENERATION_MASK: u64 = 0x7FFF_FFFF;

/// A bounded multi-producer, multi-consumer FIFO of `(slot, generation)` hints.
pub(super) struct Probation {
    ring: Box<[AtomicU64]>,
    mask: u64,
    head: AtomicU64,
    tail: AtomicU64,
    target: u64,
}

impl Probation {
    pub(super) fn new(capacity_pages: usize) -> Self {
        let target = (capacity_pages / PROBATION_SHARE).max(1);
        // Twice the target, so pushes rarely find the ring full while inserts drain it.
        let len = (2 * target).next_power_of_two();
        Probation {
            ring: (0..len).map(|_| AtomicU64::new(0)).collect(),
            mask: len as u64 - 1,
            head: AtomicU64::new(0),
            tail: AtomicU64::new(0),
            target: target as u64,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.ring.len()
    }

    /// Whether probation holds its share and the next eviction should come from it.
    #[inline]
    pub(super) fn is_full(&self) -> bool {
        let tail = self.tail.load(Ordering::Relaxed);
        let head = self.head.load(Ordering::Relaxed);
        tail.saturating_sub(head) >= self.target
    }

    pub(super) fn push(&self, slot: u32, generation: u32) {
        let entry =
            ENTRY_PRESENT | ((u64::from(generation) & GENERATION_MASK) << 32) | u64::from(slot);
        let tail = self.tail.load(Ordering::Relaxed);
        if tail.saturating_sub(self.head.load(Ordering::Relaxed)) >= self.ring.len() as u64 {
            return; // Full: the page lives outside probation; only a hint is lost.
        }
        if self
            .tail
            .compare_exchange(tail, tail + 1, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.ring[(tail & self.mask) as usize].store(entry, Ordering::Release);
        }
    }

    /// The oldest hint, if one is ready.
    pub(super) fn pop(&self) -> Option<(u32, u32)> {
        loop {
            let head = self.head.load(Ordering::Relaxed);
            if head >= self.tail.load(Ordering::Relaxed) {
                return None;
            }
            if self
                .head
                .compare_exchange(head, head + 1, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            let entry = self.ring[(head & self.mask) as usize].swap(0, Ordering::Acquire);
            if entry & ENTRY_PRESENT == 0 {
                // Its producer has not stored it yet; skip it rather than wait.
                continue;
            }
            // Slot numbers fit in 24 bits and generations in 31 (masked above).
            return Some((
                entry as u32 & 0x00FF_FFFF,
                ((entry >> 32) & GENERATION_MASK) as u32,
            ));
        }
    }
}

/// Fingerprints of keys recently evicted from probation, one per table entry, overwritten freely.
pub(super) struct Ghosts {
    table: Box<[AtomicU32]>,
    mask: u64,
}

impl Ghosts {
    pub(super) fn new(capacity_pages: usize) -> Self {
        let len = capacity_pages.max(1).next_power_of_two();
        Ghosts {
            table: (0..len).map(|_| AtomicU32::new(0)).collect(),
            mask: len as u64 - 1,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.table.len()
    }

    fn place(&self, hash: u64) -> (usize, u32) {
        // Bits the index does not use for its start position; a fingerprint is never 0.
        let pos = ((hash >> 24) & self.mask) as usize;
        let fingerprint = (hash >> 32) as u32 | 1;
        (pos, fingerprint)
    }

    pub(super) fn remember(&self, hash: u64) {
        let (pos, fingerprint) = self.place(hash);
        self.table[pos].store(fingerprint, Ordering::Relaxed);
    }

    pub(super) fn contains(&self, hash: u64) -> bool {
        let (pos, fingerprint) = self.place(hash);
        self.table[pos].load(Ordering::Relaxed) == fingerprint
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probation_is_fifo_and_reports_fullness() {
        let p = Probation::new(100); // target 10
        assert!(!p.is_full());
        for slot in 0..10 {
            p.push(slot, slot + 100);
        }
        assert!(p.is_full());
        for slot in 0..10 {
            assert_eq!(p.pop(), Some((slot, slot + 100)));
        }
        assert_eq!(p.pop(), None);
        assert!(!p.is_full());
    }

    #[test]
    fn probation_drops_pushes_when_the_ring_is_full() {
        let p = Probation::new(10); // target 1, ring 2
        for slot in 0..5 {
            p.push(slot, 0);
        }
        assert_eq!(p.pop(), Some((0, 0)));
        assert_eq!(p.pop(), Some((1, 0)));
        assert_eq!(p.pop(), None);
    }

    #[test]
    fn ghosts_remember_recent_evictions() {
        let g = Ghosts::new(64);
        let hash = 0x1234_5678_9abc_def0;
        assert!(!g.contains(hash));
        g.remember(hash);
        assert!(g.contains(hash));
        assert!(
            !g.contains(hash ^ (1 << 40)),
            "another fingerprint at the same place"
        );
    }
}
