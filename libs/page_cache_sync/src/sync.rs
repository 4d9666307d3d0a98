//! The synchronization primitives of this crate: std's, or loom's under `--cfg loom`.
//!
//! Everything in the crate that more than one thread touches goes through these names, so a
//! loom build models every atomic access, lock and cell access of the protocols. The cell has
//! loom's API (`with`, `with_mut`): under loom each access is checked against the accesses of
//! other threads, and a read that is not ordered after the last write fails the model.

#[cfg(not(loom))]
pub(crate) use std::sync::{
    atomic::{AtomicU32, AtomicU64, Ordering},
    Condvar, Mutex, MutexGuard,
};

#[cfg(loom)]
pub(crate) use loom::sync::{
    atomic::{AtomicU32, AtomicU64, Ordering},
    Condvar, Mutex, MutexGuard,
};

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;

/// `std::cell::UnsafeCell` with loom's access API; the closures are inlined away.
#[cfg(not(loom))]
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    pub(crate) const fn new(value: T) -> Self {
        UnsafeCell(std::cell::UnsafeCell::new(value))
    }

    /// Calls `f` with a pointer through which the value may be read.
    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Calls `f` with a pointer through which the value may be written.
    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}
