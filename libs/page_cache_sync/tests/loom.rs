//! Loom models of the page cache's concurrency protocols.
//!
//! Each model is a small scenario, two or three threads on one or two slots, that loom runs
//! under every interleaving up to a bound on preemptions (`LOOM_MAX_PREEMPTIONS`, default 3
//! here), with its model of the C11 memory orderings. A model fails when an assertion fails in
//! any of them, when two threads touch a cell without being ordered (the slot's key, or the
//! page frame standing in as `Frame`), or when a thread waits forever.
//!
//! Built only with `--cfg loom` (`scripts/loom-test`); a normal `cargo test` skips this file.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;

use page_cache_sync::index::Index;
use page_cache_sync::inflight::{Boarding, Flights};
use page_cache_sync::slot::{Slot, SlotKey, Sweep, COUNTER_REBASE_THRESHOLD, MAX_COUNTDOWN};

const K1: SlotKey = SlotKey { hi: 1, lo: 10 };
const K2: SlotKey = SlotKey { hi: 2, lo: 20 };

/// Runs `f` under loom with a preemption bound, so each model stays within seconds, and
/// prints how many executions it explored (`cargo test -- --nocapture` shows them).
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(5);
    }
    let executions = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = executions.clone();
    builder.check(move || {
        counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        f();
    });
    let name = std::thread::current().name().unwrap_or("model").to_owned();
    let executions = executions.load(std::sync::atomic::Ordering::Relaxed);
    println!("{name}: {executions} executions explored");
}

/// One slot and the page frame it guards, as the cache pairs them (the frame lives in the
/// cache's arena at the slot's index).
struct CachedPage {
    slot: Slot,
    frame: UnsafeCell<u64>,
}

// SAFETY: the frame is accessed only under the slot protocol, which is what the models check.
unsafe impl Sync for CachedPage {}

impl CachedPage {
    fn empty() -> Self {
        CachedPage {
            slot: Slot::new(),
            frame: UnsafeCell::new(0),
        }
    }

    /// Claims, fills and publishes the slot the way an insert does.
    fn visible(key: SlotKey, page: u64, countdown: u64) -> Self {
        let cached = CachedPage::empty();
        assert!(cached.slot.claim_fresh());
        cached.fill(key, page);
        cached.slot.publish(countdown, false);
        cached
    }

    /// Writes key and page into a slot the caller owns (Construction).
    fn fill(&self, key: SlotKey, page: u64) {
        // SAFETY: the caller owns the slot.
        unsafe { self.slot.set_key(key) };
        self.frame.with_mut(|frame| unsafe { *frame = page });
    }

    /// A lookup that found this slot through the index: on a hit, reads the page under the
    /// lease and returns it.
    fn read(&self, key: SlotKey) -> Option<u64> {
        if !self.slot.try_acquire(key) {
            return None;
        }
        let page = self.frame.with(|frame| unsafe { *frame });
        self.slot.release();
        Some(page)
    }

    /// The clock hand passing the slot up to `steps` times; a claimed slot is refilled with
    /// `key` and `page`. Returns what the slot held if it was claimed.
    fn evict_into(&self, steps: usize, key: SlotKey, page: u64) -> Option<SlotKey> {
        for _ in 0..steps {
            match self.slot.sweep(true) {
                Sweep::Claimed { previous } => {
                    self.fill(key, page);
                    self.slot.publish(0, false);
                    return previous;
                }
                Sweep::Pinned | Sweep::Cooled | Sweep::Warm | Sweep::Busy => {}
            }
        }
        None
    }
}

/// The property a lease exists for: a reader that acquired K1 reads K1's page, however the
/// clock hand races it, and an evicted slot's key and page change only while nobody holds it.
#[test]
fn a_lease_sees_its_own_page_while_the_slot_is_evicted_and_reused() {
    model(|| {
        let cached = Arc::new(CachedPage::visible(K1, 1, 0));
        let reader = {
            let cached = cached.clone();
            thread::spawn(move || {
                let first = cached.read(K1);
                assert!(matches!(first, None | Some(1)), "K1 read as {first:?}");
                let second = cached.read(K2);
                assert!(matches!(second, None | Some(2)), "K2 read as {second:?}");
            })
        };
        let evicted = cached.evict_into(2, K2, 2);
        assert!(matches!(evicted, None | Some(K1)));
        reader.join().unwrap();
        assert!(!cached.slot.is_pinned(), "every reference was given back");
    });
}

/// Two clock hands reach one cold slot at once (the hand is shared, but an insert and a cache
/// drop can both sweep): exactly one claims it, and only that one writes its key and page.
#[test]
fn two_clock_hands_never_own_one_slot() {
    model(|| {
        let cached = Arc::new(CachedPage::visible(K1, 1, 0));
        let other_hand = {
            let cached = cached.clone();
            thread::spawn(move || cached.evict_into(1, K2, 2).is_some())
        };
        let claimed_here = cached.evict_into(1, SlotKey { hi: 3, lo: 30 }, 3).is_some();
        let claimed_there = other_hand.join().unwrap();
        assert!(
            claimed_here || claimed_there,
            "a cold, unreferenced slot was not evicted"
        );
        let held = [(K2, 2), (SlotKey { hi: 3, lo: 30 }, 3)]
            .into_iter()
            .filter(|&(key, page)| cached.read(key) == Some(page))
            .count();
        assert_eq!(
            held, 1,
            "the slot must hold exactly one of the two new pages"
        );
    });
}

/// Two readers and the clock hand on a warm slot: the countdown protocol (hits raise it, the
/// hand lowers it by compare-and-swap) never loses a reference or evicts a pinned slot.
#[test]
fn hits_and_cooling_race_without_losing_a_reference() {
    model(|| {
        let cached = Arc::new(CachedPage::visible(K1, 1, 1));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let cached = cached.clone();
                thread::spawn(move || {
                    let read = cached.read(K1);
                    assert!(matches!(read, None | Some(1)), "K1 read as {read:?}");
                })
            })
            .collect();
        cached.evict_into(2, K2, 2);
        for reader in readers {
            reader.join().unwrap();
        }
        assert!(!cached.slot.is_pinned());
        // With every thread done, the hand claims the slot within MAX_COUNTDOWN + 1 steps,
        // whichever page it holds and however warm the hits left it.
        assert!(cached
            .evict_into(MAX_COUNTDOWN as usize + 1, K2, 2)
            .is_some());
    });
}

/// A reader that finds a slot while its owner is still building it leaves an increment behind
/// (the acquire is optimistic). Publishing overwrites it: the slot ends unreferenced.
#[test]
fn stray_increments_on_a_slot_being_built_are_discarded() {
    model(|| {
        let cached = Arc::new(CachedPage::empty());
        assert!(cached.slot.claim_fresh());
        let reader = {
            let cached = cached.clone();
            thread::spawn(move || {
                let read = cached.read(K1);
                assert!(matches!(read, None | Some(1)), "K1 read as {read:?}");
            })
        };
        cached.fill(K1, 1);
        cached.slot.publish(1, false);
        reader.join().unwrap();
        assert!(
            !cached.slot.is_pinned(),
            "a stray increment survived publish"
        );
        assert_eq!(cached.slot.claim_if_unreferenced(), Some(K1));
    });
}

/// The inserting reader's reference (`publish` with a reference, dropped by `release_unhit`)
/// against a hit and the clock hand: the slot is pinned until both references are gone.
#[test]
fn the_inserting_readers_reference_pins_the_slot() {
    model(|| {
        let cached = Arc::new(CachedPage::empty());
        assert!(cached.slot.claim_fresh());
        cached.fill(K1, 1);
        cached.slot.publish(0, true);
        let hand = {
            let cached = cached.clone();
            thread::spawn(move || {
                cached.evict_into(1, K2, 2);
            })
        };
        let page = cached.frame.with(|frame| unsafe { *frame });
        assert_eq!(
            page, 1,
            "the inserting reader's page changed under its lease"
        );
        cached.slot.release_unhit();
        hand.join().unwrap();
        assert!(!cached.slot.is_pinned());
    });
}

/// Counters near the rebase threshold, two hits and the clock hand at once: rebasing keeps
/// the reference count, so the slot ends unreferenced and below the threshold.
#[test]
fn counter_rebase_keeps_the_reference_count() {
    model(|| {
        let cached = Arc::new(CachedPage::visible(K1, 1, 1));
        let near = COUNTER_REBASE_THRESHOLD - 1;
        cached.slot.set_visible_counters(near, near);
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let cached = cached.clone();
                thread::spawn(move || assert_eq!(cached.read(K1), Some(1)))
            })
            .collect();
        // Warm (countdown 7): the hand only cools it, never claims it.
        assert!(matches!(
            cached.slot.sweep(true),
            Sweep::Pinned | Sweep::Cooled | Sweep::Busy
        ));
        for reader in readers {
            reader.join().unwrap();
        }
        assert!(
            !cached.slot.is_pinned(),
            "rebasing lost or invented a reference"
        );
        assert!(cached.slot.try_acquire(K1));
        assert!(cached.slot.is_pinned());
        cached.slot.release();
        assert!(!cached.slot.is_pinned());
    });
}

/// One probe chain (every key hashes alike): a key that stays linked is found by a lookup
/// while a key before it on the chain is unlinked and its slot linked again under a new key,
/// and a link that happened before a lookup (by a flag it saw) is found by that lookup.
#[test]
fn index_lookups_find_linked_keys_while_the_chain_changes() {
    const HASH: u64 = 0x5EED_0000_0000_0001;
    model(|| {
        let index = Arc::new(Index::with_slots(4));
        index.link(HASH, 0).unwrap();
        index.link(HASH, 1).unwrap();
        let linked = Arc::new(AtomicBool::new(false));
        let owner = {
            let (index, linked) = (index.clone(), linked.clone());
            thread::spawn(move || {
                // Slot 0 is evicted and reused, and slot 2 is inserted.
                assert!(index.unlink(HASH, 0));
                index.link(HASH, 0).unwrap();
                index.link(HASH, 2).unwrap();
                linked.store(true, Ordering::Release);
            })
        };
        let reader = {
            let (index, linked) = (index.clone(), linked.clone());
            thread::spawn(move || {
                let saw_link = linked.load(Ordering::Acquire);
                assert_eq!(index.find(HASH, |s| s == 1), Some(1), "slot 1 was lost");
                if saw_link {
                    assert_eq!(index.find(HASH, |s| s == 2), Some(2), "slot 2 was lost");
                }
            })
        };
        owner.join().unwrap();
        reader.join().unwrap();
        for slot in [1, 0, 2] {
            assert_eq!(index.find(HASH, |s| s == slot), Some(slot));
            assert!(index.unlink(HASH, slot));
        }
        assert_eq!(index.total_displacements(), 0, "displacements leaked");
    });
}

/// Two readers miss one block: exactly one leads the read, the other waits for it to land and
/// is woken (a lost wake-up would leave it waiting, which loom reports as a deadlock).
#[test]
fn a_follower_is_woken_when_the_flight_lands() {
    const HASH: u64 = 7;
    model(|| {
        let flights = Arc::new(Flights::new());
        let led = Arc::new(loom::sync::atomic::AtomicUsize::new(0));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (flights, led) = (flights.clone(), led.clone());
                thread::spawn(move || match flights.board(K1, HASH) {
                    Boarding::Lead(ticket) => {
                        led.fetch_add(1, Ordering::Relaxed);
                        flights.land(K1, HASH, ticket);
                    }
                    Boarding::Follow(ticket) => flights.wait(K1, HASH, ticket),
                    Boarding::Unshared => panic!("one shard cannot be full with two readers"),
                })
            })
            .collect();
        for reader in readers {
            reader.join().unwrap();
        }
        assert!(led.load(Ordering::Relaxed) >= 1);
        // Every flight landed: the next miss leads again.
        assert!(matches!(flights.board(K1, HASH), Boarding::Lead(_)));
    });
}
