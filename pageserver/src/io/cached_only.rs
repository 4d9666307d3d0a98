//! Reads that may not wait: a hot page is answered on the thread that asked for it, and only a
//! read that needs the disk (or a download) is handed to a thread that may block.
//!
//! [`try_cached`] runs a read in a mode, kept in a thread-local, where every place that would
//! wait for a file or a download asks [`refuse`] first: the file seam
//! ([`super::virtual_file::VirtualFile`]'s reads) and the on-demand download. In that mode
//! `refuse` records the refusal and hands back a `WouldBlock` error, which the read returns
//! like any other failure; [`try_cached`] then discards the whole result, so the error is
//! never seen, and the caller runs the read again where it may wait. A read is synchronous
//! storage code from start to end, so the mode cannot leak to other work on the thread.
//!
//! What an abandoned attempt leaves: cache lookups it made (hits keep their blocks warm, a miss
//! it claimed is released unlanded for the next reader) and, at most, a materialized page it
//! memorized, which is as correct as any other. Waits that are not file reads are not refused:
//! a short lock, and a block another reader is reading right now (at most one I/O's time).

use std::cell::Cell;
use std::io;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Reads may wait.
    Wait,
    /// Reads may not wait; `refused` once one tried to.
    CachedOnly { refused: bool },
}

thread_local! {
    static MODE: Cell<Mode> = const { Cell::new(Mode::Wait) };
}

/// Puts the previous mode back, also when the read panics.
struct Restore(Mode);

impl Drop for Restore {
    fn drop(&mut self) {
        MODE.with(|mode| mode.set(self.0));
    }
}

/// Runs `read` so that any file read or download in it fails at once instead of waiting:
/// `Some` of its result if none was needed, `None` (the result discarded) if one was.
pub fn try_cached<T>(read: impl FnOnce() -> T) -> Option<T> {
    let outer = MODE.with(|mode| mode.replace(Mode::CachedOnly { refused: false }));
    let restore = Restore(outer);
    let result = read();
    let attempt = MODE.with(|mode| mode.get());
    drop(restore);
    (attempt == Mode::CachedOnly { refused: false }).then_some(result)
}

/// Whether the current read may wait for the disk: work that only pays off with I/O (reading
/// ahead) is skipped when it may not.
pub fn may_wait() -> bool {
    MODE.with(|mode| mode.get() == Mode::Wait)
}

/// `Some(error)` when the current read may not wait, to be returned instead of waiting; `None`
/// when it may go ahead.
pub fn refuse() -> Option<io::Error> {
    MODE.with(|mode| match mode.get() {
        Mode::Wait => None,
        Mode::CachedOnly { .. } => {
            mode.set(Mode::CachedOnly { refused: true });
            Some(io::Error::new(
                io::ErrorKind::WouldBlock,
                "a read that may not wait needed the disk",
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_that_needs_no_io_is_kept() {
        assert_eq!(try_cached(|| 7), Some(7));
        assert!(refuse().is_none(), "outside try_cached, reads may wait");
    }

    #[test]
    fn a_refused_io_discards_the_result_even_if_the_read_ignored_the_error() {
        let attempt = try_cached(|| {
            let refused = refuse();
            assert_eq!(refused.map(|e| e.kind()), Some(io::ErrorKind::WouldBlock));
            "an answer built without the data"
        });
        assert_eq!(attempt, None);
        assert!(refuse().is_none());
    }

    #[test]
    fn the_mode_is_restored_after_a_panic() {
        let caught = std::panic::catch_unwind(|| try_cached(|| panic!("in the read")));
        assert!(caught.is_err());
        assert!(refuse().is_none());
    }
}
