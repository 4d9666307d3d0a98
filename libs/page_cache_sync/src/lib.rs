//! The page cache's lock-free core, apart from the cache so that it can be model-checked.
//!
//! The page cache (`pageserver::page_cache`) keeps pages in a fixed arena of slots. Three pieces
//! decide which thread may touch which slot, and they are all here:
//!
//! * [`slot`]: one slot's metadata word (state, reference count, CLOCK countdown) and the key
//!   it holds. Acquire, release, the clock hand's sweep, claim and publish.
//! * [`index`]: the lock-free open-addressed table from a key's hash to its slot.
//! * [`inflight`]: the table of block reads in progress, so that concurrent misses of one
//!   block share a read.
//!
//! What they share is in `sync.rs`: atomics, a mutex, a condition variable and a cell, taken
//! from std normally and from [loom](https://docs.rs/loom) when built with `--cfg loom`.
//! `tests/loom.rs` then runs the protocols under loom, which explores the thread interleavings
//! (and the weaker memory orderings it models) of small scenarios exhaustively, up to a bound
//! on preemptions: a reader against an evicting writer, stray increments on a slot being
//! built, counter rebasing, index links and unlinks on one probe chain, and the wake-ups of
//! shared misses. `scripts/loom-test` runs them; docs/testing.md says more.
//!
//! Nothing here reads files, allocates after construction, or knows what a page is: the page
//! bytes live in the cache's arena, guarded by the same slot protocol as the key.

pub mod index;
pub mod inflight;
pub mod slot;
mod sync;
