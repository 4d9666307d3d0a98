//! One slot of the page cache: the metadata word that governs it and the key it holds.
//! The page bytes live in the cache's arena at the same index.
//!
//! # The metadata word
//!
//! ```text
//!  63 62 61 60 59                      30 29                       0
//! +-----+-----+--------------------------+--------------------------+
//! |  0  |state|   release counter (30)   |   acquire counter (30)   |
//! +-----+-----+--------------------------+--------------------------+
//! ```
//!
//! * `refcount = acquire - release`. Taking a reference is one `fetch_add` on the acquire
//!   counter and dropping it is one `fetch_add` on the release counter, so a cache hit costs
//!   two uncontended atomic adds on the slot's own cache line and nothing shared.
//! * While a slot is unreferenced, its counters double as the CLOCK countdown:
//!   `countdown = min(acquire, MAX_COUNTDOWN)`. A hit raises it for free (the acquire it needs
//!   anyway); a sweep of the clock hand lowers it by resetting both counters to `countdown - 1`;
//!   a slot whose countdown is 0 when the hand passes is evicted.
//! * States: `Empty -> Construction -> Visible -> Construction -> ...`. Construction is
//!   exclusive: exactly one thread owns the slot and may write its key and page bytes. Only a
//!   Visible slot can be referenced.
//!
//! # Optimistic acquire
//!
//! A reader that found the slot through the index adds to the acquire counter without knowing
//! the state. If the slot turns out not to be Visible, the increment is left behind: the owner
//! of a Construction slot publishes it (or empties it) by writing the whole word, which
//! overwrites the counters, so stray increments never need undoing. If the slot is Visible but holds another
//! key (it was evicted and reused since the index was read), the reader takes its increment back.
//! Eviction needs `acquire == release` in the same CAS that claims the slot, so a referenced slot
//! can never change its key or bytes under a lease.
//!
//! # Every write is a read-modify-write
//!
//! `publish` and `vacate` overwrite the word with `swap` where a `store` would do: the state
//! they write is the same, and the owner needs nothing from the old value. The swap costs one
//! locked instruction on the insert path, which reads a file anyway, and makes every write of
//! the word an atomic read-modify-write. Loom 0.7 lets a plain store land between the read and
//! the write of a concurrent `fetch_add` (tokio-rs/loom#254), so with a store the models in
//! tests/loom.rs fail on executions no machine can produce; with swaps they check the protocol
//! as it runs.

use crate::sync::{AtomicU32, AtomicU64, Ordering, UnsafeCell};

const COUNTER_BITS: u32 = 30;
const COUNTER_MASK: u64 = (1 << COUNTER_BITS) - 1;
const ACQUIRE_ONE: u64 = 1;
const RELEASE_SHIFT: u32 = COUNTER_BITS;
const RELEASE_ONE: u64 = 1 << RELEASE_SHIFT;
const STATE_SHIFT: u32 = 2 * COUNTER_BITS;

const STATE_EMPTY: u64 = 0;
const STATE_CONSTRUCTION: u64 = 1;
const STATE_VISIBLE: u64 = 2;

/// The highest CLOCK countdown: a page that keeps being hit survives this many sweeps of the
/// clock hand without a further hit. Above 3 (HyperClockCache's cap) the countdown also
/// separates often-read pages from sometimes-read ones; much higher, and a page that was hot
/// once takes too long to age out.
pub const MAX_COUNTDOWN: u64 = 7;

/// When a long-lived hot page's counters reach this, `release` rebases them so they never
/// carry into the neighbouring field.
pub const COUNTER_REBASE_THRESHOLD: u64 = 1 << (COUNTER_BITS - 1);

const fn meta(state: u64, acquire: u64, release: u64) -> u64 {
    (state << STATE_SHIFT) | (release << RELEASE_SHIFT) | acquire
}

const fn state_of(m: u64) -> u64 {
    m >> STATE_SHIFT
}

const fn acquire_of(m: u64) -> u64 {
    m & COUNTER_MASK
}

const fn release_of(m: u64) -> u64 {
    (m >> RELEASE_SHIFT) & COUNTER_MASK
}

const CONSTRUCTION: u64 = meta(STATE_CONSTRUCTION, 0, 0);
const EMPTY: u64 = meta(STATE_EMPTY, 0, 0);

/// The exact identity of a cached page: 16 bytes, compared in full on every hit.
/// File pages are `(file id, block number)`; materialized pages are
/// `(MATERIALIZED_BIT | version-directory id, lsn)` (see `pageserver::page_cache::materialized`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct SlotKey {
    pub hi: u64,
    pub lo: u64,
}

/// What one step of the clock hand did to a slot.
pub enum Sweep {
    /// The slot is now ours (Construction). `previous` is the key it held if it was Visible,
    /// which the caller must unlink from the index.
    Claimed { previous: Option<SlotKey> },
    /// Referenced: skipped. Counts against the eviction effort.
    Pinned,
    /// Unreferenced but still warm: its countdown was lowered. Counts as progress.
    Cooled,
    /// Unreferenced and warm, left as it was (a probation check, which never cools).
    Warm,
    /// Another thread owns it or changed it under us: skipped.
    Busy,
}

#[repr(C, align(64))]
pub struct Slot {
    meta: AtomicU64,
    /// Written only by the thread that holds the slot in Construction; read only by holders of
    /// a reference to the Visible slot or by its owner. See the module docs.
    key: UnsafeCell<SlotKey>,
    /// Bumped by every publish, so a hint naming this slot can tell whether it still refers to
    /// the same page. Written only by the owner; read as a hint by anyone.
    generation: AtomicU32,
}

// SAFETY: `key` is only accessed under the ownership protocol described in the module docs;
// all cross-thread hand-offs go through `meta` with release/acquire ordering.
unsafe impl Sync for Slot {}

impl Default for Slot {
    fn default() -> Self {
        Slot::new()
    }
}

impl Slot {
    pub fn new() -> Self {
        Slot {
            meta: AtomicU64::new(EMPTY),
            key: UnsafeCell::new(SlotKey::default()),
            generation: AtomicU32::new(0),
        }
    }

    /// Tries to take a reference to this slot if it is Visible and holds `key`.
    #[inline]
    pub fn try_acquire(&self, key: SlotKey) -> bool {
        let old = self.meta.fetch_add(ACQUIRE_ONE, Ordering::Acquire);
        if state_of(old) != STATE_VISIBLE {
            // Stray increment on a slot being built or emptied: its owner overwrites it.
            return false;
        }
        // SAFETY: the slot is Visible and we hold a reference, so no thread can claim it and
        // the key cannot change until we release.
        if self.key.with(|k| unsafe { *k }) == key {
            return true;
        }
        self.meta.fetch_sub(ACQUIRE_ONE, Ordering::Release);
        false
    }

    /// Drops a reference taken by `try_acquire` or handed out by `publish`.
    #[inline]
    pub fn release(&self) {
        let old = self.meta.fetch_add(RELEASE_ONE, Ordering::Release);
        if acquire_of(old) >= COUNTER_REBASE_THRESHOLD {
            self.rebase_counters();
        }
    }

    /// Drops the reference `publish` handed to the inserting reader. Its read is the one the
    /// page was inserted for, not a repeat, so the countdown stays at the arrival's level: the
    /// reference is given back by undoing its acquire rather than counting a release.
    #[inline]
    pub fn release_unhit(&self) {
        self.meta.fetch_sub(ACQUIRE_ONE, Ordering::Release);
    }

    #[cold]
    fn rebase_counters(&self) {
        let mut m = self.meta.load(Ordering::Relaxed);
        loop {
            if state_of(m) != STATE_VISIBLE || acquire_of(m) < COUNTER_REBASE_THRESHOLD {
                return;
            }
            let refs = acquire_of(m) - release_of(m);
            let rebased = meta(STATE_VISIBLE, refs + MAX_COUNTDOWN, MAX_COUNTDOWN);
            match self
                .meta
                .compare_exchange_weak(m, rebased, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(now) => m = now,
            }
        }
    }

    /// One step of the clock hand over this slot. With `cool`, a warm slot's countdown is
    /// lowered; without, it is left alone.
    #[inline]
    pub fn sweep(&self, cool: bool) -> Sweep {
        let m = self.meta.load(Ordering::Relaxed);
        match state_of(m) {
            STATE_EMPTY => match self.claim_from(m) {
                true => Sweep::Claimed { previous: None },
                false => Sweep::Busy,
            },
            STATE_VISIBLE => {
                let (acquire, release) = (acquire_of(m), release_of(m));
                if acquire != release {
                    return Sweep::Pinned;
                }
                let countdown = acquire.min(MAX_COUNTDOWN);
                if countdown == 0 {
                    return match self.claim_from(m) {
                        true => Sweep::Claimed {
                            // SAFETY: we own the slot now (Construction).
                            previous: Some(self.key.with(|k| unsafe { *k })),
                        },
                        false => Sweep::Busy,
                    };
                }
                if !cool {
                    return Sweep::Warm;
                }
                let cooled = meta(STATE_VISIBLE, countdown - 1, countdown - 1);
                match self
                    .meta
                    .compare_exchange(m, cooled, Ordering::Relaxed, Ordering::Relaxed)
                {
                    Ok(_) => Sweep::Cooled,
                    Err(_) => Sweep::Busy,
                }
            }
            _ => Sweep::Busy,
        }
    }

    /// Claims the slot if it is Visible and unreferenced, whatever its countdown. Returns the
    /// key it held. Used to drop everything that is not in use.
    #[inline]
    pub fn claim_if_unreferenced(&self) -> Option<SlotKey> {
        let m = self.meta.load(Ordering::Relaxed);
        if state_of(m) != STATE_VISIBLE || acquire_of(m) != release_of(m) || !self.claim_from(m) {
            return None;
        }
        // SAFETY: we own the slot now (Construction).
        Some(self.key.with(|k| unsafe { *k }))
    }

    /// Claims a slot if it is Empty. Used for never-used slots, which only the clock hand could
    /// also reach; the CAS settles that race.
    #[inline]
    pub fn claim_fresh(&self) -> bool {
        let m = self.meta.load(Ordering::Relaxed);
        state_of(m) == STATE_EMPTY && self.claim_from(m)
    }

    fn claim_from(&self, seen: u64) -> bool {
        self.meta
            .compare_exchange(seen, CONSTRUCTION, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Sets the key of a slot we own.
    ///
    /// # Safety
    /// The caller must own the slot (it claimed it and has not published or vacated it).
    pub unsafe fn set_key(&self, key: SlotKey) {
        self.key.with_mut(|k| unsafe { *k = key });
    }

    /// Makes a slot we own Visible with the given countdown, optionally handing one reference
    /// to the caller. The page bytes and key must be in place and the slot linked in the index.
    /// Returns the slot's new generation.
    #[inline]
    pub fn publish(&self, countdown: u64, with_reference: bool) -> u32 {
        let generation = self.generation().wrapping_add(1);
        self.generation.store(generation, Ordering::Relaxed);
        let countdown = countdown.min(MAX_COUNTDOWN);
        let acquire = countdown + u64::from(with_reference);
        // A swap, not a store, though the old value is not needed: see "Every write is a
        // read-modify-write" in the module docs.
        self.meta
            .swap(meta(STATE_VISIBLE, acquire, countdown), Ordering::Release);
        generation
    }

    /// How many times the slot was published (a hint; see the field).
    #[inline]
    pub fn generation(&self) -> u32 {
        self.generation.load(Ordering::Relaxed)
    }

    /// Returns a slot we own to Empty (a failed fill, or a page dropped on request).
    #[inline]
    pub fn vacate(&self) {
        self.meta.swap(EMPTY, Ordering::Release);
    }

    /// Sets a Visible slot's counters outright: the models (tests/loom.rs) start a slot near
    /// [`COUNTER_REBASE_THRESHOLD`], which no model could count up to.
    #[cfg(loom)]
    pub fn set_visible_counters(&self, acquire: u64, release: u64) {
        self.meta
            .swap(meta(STATE_VISIBLE, acquire, release), Ordering::Release);
    }

    /// Whether the slot is Visible and referenced (for statistics only; racy by nature).
    #[inline]
    pub fn is_pinned(&self) -> bool {
        let m = self.meta.load(Ordering::Relaxed);
        state_of(m) == STATE_VISIBLE && acquire_of(m) != release_of(m)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const K: SlotKey = SlotKey { hi: 7, lo: 9 };

    fn visible(slot: &Slot, countdown: u64) {
        assert!(slot.claim_fresh());
        unsafe { slot.set_key(K) };
        slot.publish(countdown, false);
    }

    #[test]
    fn acquire_checks_state_and_key() {
        let slot = Slot::new();
        assert!(!slot.try_acquire(K), "an empty slot cannot be acquired");
        visible(&slot, 1);
        assert!(!slot.try_acquire(SlotKey { hi: 7, lo: 10 }));
        assert!(slot.try_acquire(K));
        assert!(slot.is_pinned());
        slot.release();
        assert!(!slot.is_pinned());
    }

    #[test]
    fn countdown_decays_then_evicts() {
        let slot = Slot::new();
        visible(&slot, 2);
        assert!(matches!(slot.sweep(true), Sweep::Cooled));
        assert!(matches!(slot.sweep(true), Sweep::Cooled));
        match slot.sweep(true) {
            Sweep::Claimed { previous } => assert_eq!(previous, Some(K)),
            _ => panic!("a slot at countdown 0 must be claimed"),
        }
    }

    #[test]
    fn sweep_without_cooling_takes_only_cold_slots() {
        let slot = Slot::new();
        visible(&slot, 1);
        assert!(matches!(slot.sweep(false), Sweep::Warm));
        assert!(
            matches!(slot.sweep(false), Sweep::Warm),
            "nothing was lowered"
        );
        assert!(matches!(slot.sweep(true), Sweep::Cooled));
        assert!(matches!(slot.sweep(false), Sweep::Claimed { .. }));
    }

    #[test]
    fn hits_raise_countdown_up_to_the_cap() {
        let slot = Slot::new();
        visible(&slot, 0);
        for _ in 0..10 {
            assert!(slot.try_acquire(K));
            slot.release();
        }
        let mut cooled = 0;
        while let Sweep::Cooled = slot.sweep(true) {
            cooled += 1;
        }
        assert_eq!(cooled, MAX_COUNTDOWN);
    }

    #[test]
    fn inserting_readers_reference_is_not_a_hit() {
        let slot = Slot::new();
        assert!(slot.claim_fresh());
        unsafe { slot.set_key(K) };
        slot.publish(0, true);
        assert!(slot.is_pinned());
        slot.release_unhit();
        assert!(!slot.is_pinned());
        assert!(
            matches!(slot.sweep(true), Sweep::Claimed { .. }),
            "countdown must still be 0"
        );
    }

    #[test]
    fn pinned_slot_is_never_claimed() {
        let slot = Slot::new();
        visible(&slot, 0);
        assert!(slot.try_acquire(K));
        for _ in 0..10 {
            assert!(matches!(slot.sweep(true), Sweep::Pinned));
        }
        assert_eq!(slot.claim_if_unreferenced(), None);
        slot.release();
        assert_eq!(slot.claim_if_unreferenced(), Some(K));
    }

    #[test]
    fn stray_increment_on_construction_is_overwritten() {
        let slot = Slot::new();
        assert!(slot.claim_fresh());
        assert!(!slot.try_acquire(K)); // stray
        unsafe { slot.set_key(K) };
        slot.publish(1, false);
        assert!(!slot.is_pinned(), "publish must discard stray increments");
    }

    #[test]
    fn counters_rebase_before_overflow() {
        let slot = Slot::new();
        visible(&slot, 1);
        // Far more hits than the counter width would allow without rebasing.
        let hits = COUNTER_REBASE_THRESHOLD + 1000;
        // Jump near the threshold directly to keep the test fast.
        slot.meta.store(
            meta(STATE_VISIBLE, hits - 1000, hits - 1000),
            Ordering::Relaxed,
        );
        assert!(slot.try_acquire(K));
        assert!(slot.try_acquire(K));
        slot.release();
        assert!(slot.is_pinned(), "one reference is still held");
        let m = slot.meta.load(Ordering::Relaxed);
        assert!(acquire_of(m) < COUNTER_REBASE_THRESHOLD);
        assert_eq!(acquire_of(m) - release_of(m), 1);
        slot.release();
        assert!(!slot.is_pinned());
    }
}
