//! The page cache's index: a fixed-size open-addressed hash table from a key's hash to a slot.
//!
//! Each entry is one `AtomicU64`:
//!
//! ```text
//!  63                  40 39          24 23              0
//! +----------------------+--------------+-----------------+
//! | displacements (24)   |   tag (16)   |  slot + 1 (24)  |
//! +----------------------+--------------+-----------------+
//! ```
//!
//! * `slot + 1` is 0 when the entry is free.
//! * `tag` is 16 bits of the key's hash, so a probe rarely touches a slot that holds another key.
//! * `displacements` counts the keys whose probe sequence passed *through* this entry to land
//!   further on. A lookup stops at the first entry that does not hold its key and has no
//!   displacements: no key it could be looking for lives beyond it. This replaces tombstones,
//!   which would slowly turn every miss into a scan of the whole table.
//!
//! Probing is double hashing over a power-of-two table with an odd step, which visits every
//! entry. The table has at least `1 / MAX_LOAD_FACTOR` entries per slot and only slots in use
//! are linked, so a free entry always exists and probe sequences stay short.
//!
//! Lookups never lock and never write to the index. Linking and unlinking are done only by the
//! thread that owns the slot (in Construction), so a slot is linked at most once.

use crate::sync::{AtomicU64, Ordering};

const SLOT_BITS: u32 = 24;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;
const TAG_SHIFT: u32 = SLOT_BITS;
const TAG_MASK: u64 = 0xFFFF;
const OCCUPANT_MASK: u64 = (1 << (SLOT_BITS + 16)) - 1;
const DISPLACEMENT_SHIFT: u32 = SLOT_BITS + 16;
const DISPLACEMENT_ONE: u64 = 1 << DISPLACEMENT_SHIFT;

/// The most slots one index can address (`slot + 1` must fit in 24 bits): 128 GiB of 8 KiB pages.
pub const MAX_SLOTS: usize = (SLOT_MASK - 1) as usize;

/// Entries per slot is at least `1 / MAX_LOAD_FACTOR`.
const MAX_LOAD_FACTOR: f64 = 0.7;

pub struct Index {
    entries: Box<[AtomicU64]>,
    mask: u64,
}

/// Where a hash's probe sequence starts and how it steps, plus its tag.
#[derive(Clone, Copy)]
struct Probe {
    start: u64,
    step: u64,
    tag: u64,
}

impl Probe {
    fn new(hash: u64, mask: u64) -> Self {
        Probe {
            start: hash & mask,
            step: ((hash >> 20) | 1) & mask.max(1),
            tag: (hash >> 48) & TAG_MASK,
        }
    }

    fn position(&self, i: u64, mask: u64) -> usize {
        // The table has at most 2^25 entries, so the masked value always fits in usize.
        (self.start.wrapping_add(i.wrapping_mul(self.step)) & mask) as usize
    }
}

#[derive(Debug)]
pub struct IndexFull;

impl Index {
    pub fn with_slots(slots: usize) -> Self {
        assert!(slots <= MAX_SLOTS, "checked by PageCache::new");
        let wanted = (slots as f64 / MAX_LOAD_FACTOR).ceil() as usize;
        let len = wanted.max(2).next_power_of_two();
        let entries = (0..len).map(|_| AtomicU64::new(0)).collect();
        Index {
            entries,
            mask: len as u64 - 1,
        }
    }

    /// Entries in the table (a power of two, at least `1 / MAX_LOAD_FACTOR` per slot).
    pub fn entry_count(&self) -> usize {
        self.entries.len()
    }

    /// Walks the probe sequence of `hash`, calling `try_slot` for every entry whose tag matches,
    /// until it returns true (that slot is returned) or the sequence provably ends.
    #[inline]
    pub fn find(&self, hash: u64, mut try_slot: impl FnMut(u32) -> bool) -> Option<u32> {
        let probe = Probe::new(hash, self.mask);
        for i in 0..=self.mask {
            let e = self.entries[probe.position(i, self.mask)].load(Ordering::Acquire);
            let occupant = e & SLOT_MASK;
            if occupant != 0 && (e >> TAG_SHIFT) & TAG_MASK == probe.tag {
                // occupant - 1 < 2^24 fits in u32.
                let slot = (occupant - 1) as u32;
                if try_slot(slot) {
                    return Some(slot);
                }
            }
            if e >> DISPLACEMENT_SHIFT == 0 {
                return None;
            }
        }
        None
    }

    /// Links `slot` under `hash` at the first free entry of its probe sequence, counting a
    /// displacement on every occupied entry it passes.
    #[inline]
    pub fn link(&self, hash: u64, slot: u32) -> Result<(), IndexFull> {
        let probe = Probe::new(hash, self.mask);
        let occupant = (probe.tag << TAG_SHIFT) | (u64::from(slot) + 1);
        for i in 0..=self.mask {
            let entry = &self.entries[probe.position(i, self.mask)];
            let mut e = entry.load(Ordering::Relaxed);
            loop {
                if e & OCCUPANT_MASK != 0 {
                    entry.fetch_add(DISPLACEMENT_ONE, Ordering::Relaxed);
                    break;
                }
                match entry.compare_exchange_weak(
                    e,
                    e | occupant,
                    Ordering::Release,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return Ok(()),
                    Err(now) => e = now,
                }
            }
        }
        // Unreachable while only slots in use are linked; undo the displacements anyway.
        for i in 0..=self.mask {
            self.entries[probe.position(i, self.mask)]
                .fetch_sub(DISPLACEMENT_ONE, Ordering::Relaxed);
        }
        Err(IndexFull)
    }

    /// Unlinks `slot` from under `hash`, taking back the displacements its link counted.
    /// Returns false if the slot was not linked there (a bug in the caller; the index is left
    /// unchanged).
    #[inline]
    pub fn unlink(&self, hash: u64, slot: u32) -> bool {
        let probe = Probe::new(hash, self.mask);
        let wanted = u64::from(slot) + 1;
        let mut passed = 0;
        let mut found = false;
        for i in 0..=self.mask {
            let entry = &self.entries[probe.position(i, self.mask)];
            let mut e = entry.load(Ordering::Relaxed);
            if e & SLOT_MASK != wanted {
                passed = i + 1;
                continue;
            }
            loop {
                match entry.compare_exchange_weak(
                    e,
                    e & !OCCUPANT_MASK,
                    Ordering::Release,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => break,
                    Err(now) => e = now,
                }
            }
            found = true;
            break;
        }
        if found {
            for i in 0..passed {
                self.entries[probe.position(i, self.mask)]
                    .fetch_sub(DISPLACEMENT_ONE, Ordering::Relaxed);
            }
        }
        found
    }

    /// Entries a lookup of `hash` examines when nothing matches (tests: misses stay short).
    pub fn miss_probe_len(&self, hash: u64) -> u64 {
        let mut examined = 0;
        let probe = Probe::new(hash, self.mask);
        for i in 0..=self.mask {
            examined += 1;
            let e = self.entries[probe.position(i, self.mask)].load(Ordering::Acquire);
            if e >> DISPLACEMENT_SHIFT == 0 {
                break;
            }
        }
        examined
    }

    /// Sum of all displacement counters (tests and statistics: 0 when nothing is linked).
    pub fn total_displacements(&self) -> u64 {
        self.entries
            .iter()
            .map(|e| e.load(Ordering::Relaxed) >> DISPLACEMENT_SHIFT)
            .sum()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn link_find_unlink_with_colliding_hashes() {
        let index = Index::with_slots(64);
        // Every key has the same hash: one long probe chain.
        let hash = 0xDEAD_BEEF_0000_0001;
        for slot in 0..40 {
            index.link(hash, slot).unwrap();
        }
        for slot in 0..40 {
            assert_eq!(index.find(hash, |s| s == slot), Some(slot));
        }
        // Remove every other one; the rest must stay reachable past the holes.
        for slot in (0..40).step_by(2) {
            assert!(index.unlink(hash, slot));
        }
        for slot in 0..40 {
            let found = index.find(hash, |s| s == slot);
            assert_eq!(found.is_some(), slot % 2 == 1, "slot {slot}");
        }
        for slot in (1..40).step_by(2) {
            assert!(index.unlink(hash, slot));
        }
        assert_eq!(index.total_displacements(), 0);
        assert!(!index.unlink(hash, 3), "unlinking twice finds nothing");
    }

    #[test]
    fn churn_against_a_model_leaves_no_garbage() {
        let index = Index::with_slots(100);
        let mut model: HashMap<u32, u64> = HashMap::new();
        let mut x: u64 = 0x1234_5678;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let slot = (x % 100) as u32;
            // Few distinct hash values: many collisions.
            let hash = ((x >> 8) % 7).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            if let Some(old) = model.remove(&slot) {
                assert!(index.unlink(old, slot));
            } else {
                index.link(hash, slot).unwrap();
                model.insert(slot, hash);
            }
            for (&s, &h) in model.iter().take(3) {
                assert_eq!(index.find(h, |c| c == s), Some(s));
            }
        }
        for (s, h) in model.drain() {
            assert!(index.unlink(h, s));
        }
        assert_eq!(index.total_displacements(), 0);
    }
}
