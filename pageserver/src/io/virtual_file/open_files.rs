//! The table of open file descriptors behind every [`VirtualFile`](super::VirtualFile): a fixed
//! number of slots, each holding at most one open `File`, given out by a clock.
//!
//! # Why
//!
//! A layer file is read for as long as the timeline lives, and a timeline may have thousands of
//! them; one descriptor each would run the process out of descriptors, and then ingest,
//! checkpoints and even the HTTP listener fail with "Too many open files". Instead at most
//! `capacity` files are open at once; a file whose descriptor was taken is opened again on its
//! next use (by path: our files are immutable, or append-only with positional writes, so a
//! reopened descriptor sees the same bytes).
//!
//! # Protocol
//!
//! A slot is `tag` + `file` (under a `RwLock`) + a `recently_used` bit + a `pinned` bit. A handle
//! remembers `(slot, tag)`. A use takes the slot's read lock and checks the tag: equal, and the
//! file is its own (a **hit**: concurrent readers share the slot); otherwise the handle lost its
//! slot. The tag changes only under the write lock, so a reader holding the read lock with the
//! right tag cannot have its descriptor closed under it.
//!
//! A **miss** finds a victim with the clock: the hand skips pinned slots, clears
//! `recently_used` bits it passes (a second chance), and takes the first slot whose write lock
//! it gets without waiting; then it closes the slot's file (if any), bumps the tag, opens the
//! file, and does the I/O under the write lock. After three rounds without one it waits for
//! the write lock of the next slot that is not pinned. Only when every slot is pinned does the
//! I/O fail, with an error that says so, rather than open past the budget.
//!
//! No thread ever waits for a slot's lock while it holds another's: a file that replaced its
//! claim closes the slot it no longer claims only after letting go of the new one. So threads
//! taking each other's slots as victims cannot deadlock.
//!
//! **Pinned** slots belong to files being written for durability (layer files, the manifest):
//! an fsync reports a write-back error only to descriptors open when it happened, so such a
//! descriptor must stay open from the first write to its `sync_all`. They are short lived (one
//! per flush in progress), and at most half the slots may be pinned at once: a file created
//! for durability past that waits for a pin ([`OpenFiles::acquire_pin`]), so however many
//! timelines flush at once, reads always find slots to use.
//!
//! Counted in `pageserver_open_files` (descriptors held now), `pageserver_file_opens_total`
//! (`first` or `reopen`) and `pageserver_file_evictions_total` (descriptors closed to make
//! room).

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};

/// Tags fit in the low bits of a packed handle, slot numbers in the high ones.
const TAG_BITS: u32 = 40;
const TAG_MASK: u64 = (1 << TAG_BITS) - 1;
/// The most slots a table may have (the slot number's bits in a packed handle).
pub const MAX_CAPACITY: usize = 1 << (64 - TAG_BITS);

struct Slot {
    /// Changed (under the write lock) whenever the slot's file changes. Starts at 1, so a packed
    /// handle of 0 means "no slot".
    tag: AtomicU64,
    recently_used: AtomicBool,
    pinned: AtomicBool,
    file: RwLock<Option<File>>,
}

/// See the module documentation.
pub struct OpenFiles {
    slots: Box<[Slot]>,
    hand: AtomicUsize,
    /// Pins held now, at most `max_pins`; see the module documentation.
    pins: Mutex<usize>,
    pin_released: Condvar,
    max_pins: usize,
}

/// A handle's claim on a slot, packed into one word: `slot << TAG_BITS | tag`; 0 is none.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Claim(u64);

impl Claim {
    pub(super) const NONE: Claim = Claim(0);

    fn new(slot: usize, tag: u64) -> Claim {
        Claim(((slot as u64) << TAG_BITS) | (tag & TAG_MASK))
    }

    fn slot(self) -> usize {
        (self.0 >> TAG_BITS) as usize
    }

    fn tag(self) -> u64 {
        self.0 & TAG_MASK
    }

    pub(super) fn from_bits(bits: u64) -> Claim {
        Claim(bits)
    }

    pub(super) fn bits(self) -> u64 {
        self.0
    }
}

/// A slot's file, readable while held.
pub(super) enum Held<'a> {
    Shared(RwLockReadGuard<'a, Option<File>>),
    Exclusive(RwLockWriteGuard<'a, Option<File>>),
}

impl Held<'_> {
    pub(super) fn file(&self) -> &File {
        let file = match self {
            Held::Shared(g) => g.as_ref(),
            Held::Exclusive(g) => g.as_ref(),
        };
        file.expect("a held slot holds a file")
    }
}

impl OpenFiles {
    /// A table of `capacity` slots (at least 1, at most [`MAX_CAPACITY`]).
    pub fn new(capacity: usize) -> OpenFiles {
        let capacity = capacity.clamp(1, MAX_CAPACITY);
        OpenFiles {
            slots: (0..capacity)
                .map(|_| Slot {
                    tag: AtomicU64::new(1),
                    recently_used: AtomicBool::new(false),
                    pinned: AtomicBool::new(false),
                    file: RwLock::new(None),
                })
                .collect(),
            hand: AtomicUsize::new(0),
            pins: Mutex::new(0),
            pin_released: Condvar::new(),
            max_pins: (capacity / 2).max(1),
        }
    }

    /// Waits until a file may pin a slot, and counts its pin; give it back with
    /// [`OpenFiles::release_pin`].
    pub(super) fn acquire_pin(&self) {
        let mut pins = self.pins.lock().unwrap_or_else(|e| e.into_inner());
        while *pins >= self.max_pins {
            pins = self
                .pin_released
                .wait(pins)
                .unwrap_or_else(|e| e.into_inner());
        }
        *pins += 1;
    }

    pub(super) fn release_pin(&self) {
        let mut pins = self.pins.lock().unwrap_or_else(|e| e.into_inner());
        *pins -= 1;
        self.pin_released.notify_one();
    }

    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// The file of `claim`, if the slot is still the claim's.
    pub(super) fn hit(&self, claim: Claim) -> Option<Held<'_>> {
        if claim == Claim::NONE {
            return None;
        }
        let slot = self.slots.get(claim.slot())?;
        let guard = slot.file.read().unwrap_or_else(|e| e.into_inner());
        // The tag changes only under the write lock: while this read lock is held, a matching
        // tag means the file is the claim's.
        if slot.tag.load(Ordering::Acquire) & TAG_MASK != claim.tag() || guard.is_none() {
            return None;
        }
        slot.recently_used.store(true, Ordering::Relaxed);
        Some(Held::Shared(guard))
    }

    /// Puts the file `open` opens into a victim slot (closing the slot's previous file), pinned
    /// if asked, and returns it held exclusively with the new claim.
    pub(super) fn install(
        &self,
        pin: bool,
        open: impl FnOnce() -> io::Result<File>,
    ) -> io::Result<(Claim, Held<'_>)> {
        let (index, mut guard) = self.victim()?;
        let slot = &self.slots[index];
        // Tags are compared within TAG_MASK; a masked 0 would read as "no claim", so it is
        // skipped (once in 2^40 changes of one slot).
        let mut tag = (slot.tag.fetch_add(1, Ordering::AcqRel) + 1) & TAG_MASK;
        if tag == 0 {
            tag = (slot.tag.fetch_add(1, Ordering::AcqRel) + 1) & TAG_MASK;
        }
        if guard.take().is_some() {
            crate::metrics::FILE_EVICTIONS.inc();
            crate::metrics::OPEN_FILES.dec();
        }
        *guard = Some(open()?);
        crate::metrics::OPEN_FILES.inc();
        slot.recently_used.store(true, Ordering::Relaxed);
        slot.pinned.store(pin, Ordering::Release);
        Ok((Claim::new(index, tag), Held::Exclusive(guard)))
    }

    /// Closes the claim's file if the slot is still the claim's, and unpins it.
    pub(super) fn release(&self, claim: Claim) {
        let Some(slot) = self
            .slots
            .get(claim.slot())
            .filter(|_| claim != Claim::NONE)
        else {
            return;
        };
        // The usual case, a slot long since given to another file, costs no lock.
        if slot.tag.load(Ordering::Acquire) & TAG_MASK != claim.tag() {
            return;
        }
        let mut guard = slot.file.write().unwrap_or_else(|e| e.into_inner());
        if slot.tag.load(Ordering::Acquire) & TAG_MASK == claim.tag() {
            slot.tag.fetch_add(1, Ordering::AcqRel);
            slot.pinned.store(false, Ordering::Release);
            if guard.take().is_some() {
                crate::metrics::OPEN_FILES.dec();
            }
        }
    }

    fn victim(&self) -> io::Result<(usize, RwLockWriteGuard<'_, Option<File>>)> {
        let n = self.slots.len();
        for _ in 0..3 * n {
            let index = self.hand.fetch_add(1, Ordering::Relaxed) % n;
            let slot = &self.slots[index];
            if slot.pinned.load(Ordering::Acquire) {
                continue;
            }
            if slot.recently_used.swap(false, Ordering::Relaxed) {
                continue;
            }
            let guard = match slot.file.try_write() {
                Ok(guard) => guard,
                // A panic during I/O under this lock leaves nothing half done in the slot.
                Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
                Err(TryLockError::WouldBlock) => continue,
            };
            // Pinning happens under the write lock: checked again now that it is held.
            if slot.pinned.load(Ordering::Acquire) {
                continue;
            }
            return Ok((index, guard));
        }
        // Every slot was pinned, recently used or busy all the while: wait for a slot that is
        // not pinned, in clock order, rather than fail a read because others are reading.
        for _ in 0..n {
            let index = self.hand.fetch_add(1, Ordering::Relaxed) % n;
            let slot = &self.slots[index];
            if slot.pinned.load(Ordering::Acquire) {
                continue;
            }
            let guard = slot.file.write().unwrap_or_else(|e| e.into_inner());
            if !slot.pinned.load(Ordering::Acquire) {
                return Ok((index, guard));
            }
        }
        Err(io::Error::other(format!(
            "no file descriptor free: all {n} of max_file_descriptors are held by files being \
             written"
        )))
    }
}
