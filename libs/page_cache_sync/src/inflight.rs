//! Shared misses: the file blocks being read into the cache right now.
//!
//! When several readers miss the same block at once (a hot index node after a cache drop, many
//! clients asking for one page), only the first reads it. It registers the block here as a
//! *flight*; the others find the flight, wait for it to land and then take the page from the
//! cache. Without this, N concurrent misses are N reads of the same 8 KiB and N copies racing
//! to be inserted.
//!
//! # Design
//!
//! * A table of flights, sharded by the page's hash. A shard is a mutex over a short list of
//!   `(page key, ticket)` and a condition variable. A shard is locked only on a miss, which
//!   reads a file anyway, and only for a probe of a handful of entries: the table is never on
//!   the hit path.
//! * **Nothing is allocated.** Each shard's list has a fixed capacity reserved up front; when a
//!   shard is full, a miss simply reads unshared. (The page cache promises read-through without
//!   touching the heap; a test counts allocations.)
//! * The leader lands its flight (removes its entry, wakes the shard's waiters) when its guard
//!   drops: after the page was published, or when the read failed or panicked. Waiters then look
//!   the page up; if it is not there (the read failed, the cache had no free slot, or the page
//!   was already evicted) each reads it on its own. A flight is a hint that saves I/O, never a
//!   promise.
//!
//! # Invariants
//!
//! * A key has at most one flight at a time; only its leader removes it. Tickets are unique, so
//!   a waiter waits for the flight it found and not for a later one of the same key.
//! * **No thread waits for a flight while it leads one.** A reader that leads several blocks
//!   (a range read) lands all of them before it waits for anyone else's, so waits can never form
//!   a cycle.

use crate::slot::SlotKey;
use crate::sync::{AtomicU64, Condvar, Mutex, MutexGuard, Ordering};

const SHARDS: usize = 64;
/// Flights one shard holds at once: more than the threads that read on a small machine.
const FLIGHTS_PER_SHARD: usize = 8;

/// Names one flight.
pub type Ticket = u64;

/// What [`Flights::board`] found.
pub enum Boarding {
    /// Nobody was reading the block: the caller leads its flight and must land it.
    Lead(Ticket),
    /// Another reader is reading it.
    Follow(Ticket),
    /// The shard is full: the caller reads the block without sharing.
    Unshared,
}

struct Shard {
    flights: Mutex<Vec<(SlotKey, Ticket)>>,
    landed: Condvar,
}

pub struct Flights {
    shards: Box<[Shard]>,
    next_ticket: AtomicU64,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing under these locks can be left half-done by a panic.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Default for Flights {
    fn default() -> Self {
        Flights::new()
    }
}

impl Flights {
    pub fn new() -> Self {
        Flights {
            shards: (0..SHARDS)
                .map(|_| Shard {
                    flights: Mutex::new(Vec::with_capacity(FLIGHTS_PER_SHARD)),
                    landed: Condvar::new(),
                })
                .collect(),
            next_ticket: AtomicU64::new(0),
        }
    }

    fn shard(&self, hash: u64) -> &Shard {
        // The cache index takes its bits from the bottom of the hash; these are independent.
        &self.shards[(hash >> 58) as usize % SHARDS]
    }

    /// Joins the flight of `key`, or starts one.
    pub fn board(&self, key: SlotKey, hash: u64) -> Boarding {
        let mut flights = lock(&self.shard(hash).flights);
        if let Some(&(_, ticket)) = flights.iter().find(|(k, _)| *k == key) {
            return Boarding::Follow(ticket);
        }
        if flights.len() == FLIGHTS_PER_SHARD {
            return Boarding::Unshared;
        }
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        flights.push((key, ticket));
        Boarding::Lead(ticket)
    }

    /// Blocks until flight `ticket` of `key` has landed.
    pub fn wait(&self, key: SlotKey, hash: u64, ticket: Ticket) {
        let shard = self.shard(hash);
        let mut flights = lock(&shard.flights);
        while flights.contains(&(key, ticket)) {
            flights = shard
                .landed
                .wait(flights)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Ends flight `ticket` of `key`, which the caller leads, waking its followers.
    pub fn land(&self, key: SlotKey, hash: u64, ticket: Ticket) {
        let shard = self.shard(hash);
        let mut flights = lock(&shard.flights);
        if let Some(at) = flights.iter().position(|f| *f == (key, ticket)) {
            flights.swap_remove(at);
        }
        drop(flights);
        shard.landed.notify_all();
    }
}
