//! Reads that may not wait: a hot page is answered on the thread that asked for it, only a
//! read that needs the disk is handed to a thread that may block, and no read waits on a
//! thread for a download.
//!
//! A read runs in one of three modes, kept in a thread-local, and every place that would wait
//! asks first: the file seam ([`super::virtual_file::VirtualFile`]'s reads) asks [`refuse`],
//! the on-demand download asks [`refuse_download`].
//!
//! | mode | file reads | downloads | entered by |
//! |---|---|---|---|
//! | wait | go ahead | go ahead (background work on its own threads) | default |
//! | cached only | refused | refused | [`try_cached`], on an async worker |
//! | no downloads | go ahead | refused, and the download is handed back | [`without_downloads`], on the blocking pool |
//!
//! A refusal records itself and hands back a `WouldBlock` error, which the read returns like
//! any other failure; the caller then discards the whole result, so the error is never seen,
//! and runs the read again where it may wait (after a cached-only attempt: on the blocking
//! pool), or once the download it handed back is done (after a no-downloads attempt: see
//! `tenant::admission`). A read is synchronous storage code from start to end, so the mode
//! cannot leak to other work on the thread.
//!
//! What an abandoned attempt leaves: cache lookups it made (hits keep their blocks warm, a miss
//! it claimed is released unlanded for the next reader) and, at most, a materialized page it
//! memorized, which is as correct as any other. Waits that are not file reads are not refused:
//! a short lock, and a block another reader is reading right now (at most one I/O's time).

use std::cell::{Cell, RefCell};
use std::io;
use std::path::Path;
use std::sync::Arc;

use utils::TenantId;

/// A download a read needed and did not wait for: what the caller runs (on a thread of its
/// own) before it runs the read again.
pub trait PendingDownload: Send + Sync {
    /// The layer file it makes resident: one download per path, however many readers.
    fn path(&self) -> &Path;
    /// The layer file's name, for messages.
    fn name(&self) -> String;
    fn tenant_id(&self) -> TenantId;
    /// Downloads the file and makes it resident, waiting as long as that takes.
    fn download(&self) -> Result<(), String>;
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Reads may wait.
    Wait,
    /// Reads may not wait; `refused` once one tried to.
    CachedOnly { refused: bool },
    /// Reads may wait for the disk, not for a download (which is kept in `PENDING`).
    NoDownloads,
}

thread_local! {
    static MODE: Cell<Mode> = const { Cell::new(Mode::Wait) };
    /// The first download refused in `NoDownloads` mode.
    static PENDING: RefCell<Option<Arc<dyn PendingDownload>>> = const { RefCell::new(None) };
}

/// Puts the previous mode back (and forgets a download handed back), also when the read
/// panics.
struct Restore(Mode);

impl Drop for Restore {
    fn drop(&mut self) {
        MODE.with(|mode| mode.set(self.0));
        PENDING.with(|pending| pending.borrow_mut().take());
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

/// Runs `read` so that file reads wait but a download fails at once: `Ok` of its result if
/// it needed no download, `Err` with the download it needed (the result discarded) if it did.
pub fn without_downloads<T>(read: impl FnOnce() -> T) -> Result<T, Arc<dyn PendingDownload>> {
    let outer = MODE.with(|mode| mode.replace(Mode::NoDownloads));
    let restore = Restore(outer);
    let result = read();
    let pending = PENDING.with(|pending| pending.borrow_mut().take());
    drop(restore);
    match pending {
        None => Ok(result),
        Some(download) => Err(download),
    }
}

/// Whether the current read may wait for the disk: work that only pays off with I/O (reading
/// ahead) is skipped when it may not.
pub fn may_wait() -> bool {
    MODE.with(|mode| !matches!(mode.get(), Mode::CachedOnly { .. }))
}

/// `Some(error)` when the current read may not wait for the disk, to be returned instead of
/// waiting; `None` when it may go ahead.
pub fn refuse() -> Option<io::Error> {
    MODE.with(|mode| match mode.get() {
        Mode::Wait | Mode::NoDownloads => None,
        Mode::CachedOnly { .. } => {
            mode.set(Mode::CachedOnly { refused: true });
            Some(would_block("a read that may not wait needed the disk"))
        }
    })
}

/// `Some(error)` when the current read may not wait for a download, to be returned instead of
/// downloading; `None` when it may go ahead. In no-downloads mode the download `pending`
/// makes is kept for [`without_downloads`] to hand back (the first one: the read stops there).
pub fn refuse_download(pending: impl FnOnce() -> Arc<dyn PendingDownload>) -> Option<io::Error> {
    MODE.with(|mode| match mode.get() {
        Mode::Wait => None,
        Mode::CachedOnly { .. } => {
            mode.set(Mode::CachedOnly { refused: true });
            Some(would_block("a read that may not wait needed a download"))
        }
        Mode::NoDownloads => {
            PENDING.with(|slot| {
                let mut slot = slot.borrow_mut();
                if slot.is_none() {
                    *slot = Some(pending());
                }
            });
            Some(would_block(
                "a read that may not wait for a download needed one",
            ))
        }
    })
}

fn would_block(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::WouldBlock, what.to_owned())
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

    struct Layer(std::path::PathBuf);

    impl PendingDownload for Layer {
        fn path(&self) -> &Path {
            &self.0
        }
        fn name(&self) -> String {
            self.0.display().to_string()
        }
        fn tenant_id(&self) -> TenantId {
            TenantId::from_bytes([1; 16])
        }
        fn download(&self) -> Result<(), String> {
            Ok(())
        }
    }

    fn layer(name: &str) -> Arc<dyn PendingDownload> {
        Arc::new(Layer(name.into()))
    }

    #[test]
    fn without_downloads_disk_reads_go_ahead_and_the_first_download_is_handed_back() {
        let attempt = without_downloads(|| {
            assert!(refuse().is_none(), "the disk may be read");
            assert!(may_wait());
            let refused = refuse_download(|| layer("a"));
            assert_eq!(refused.map(|e| e.kind()), Some(io::ErrorKind::WouldBlock));
            assert!(refuse_download(|| layer("b")).is_some());
            "an answer without the layer"
        });
        let Err(pending) = attempt else {
            panic!("a download was needed");
        };
        assert_eq!(pending.path(), Path::new("a"));
        // Outside, downloads go ahead, and nothing is left over for the next read.
        assert!(refuse_download(|| layer("c")).is_none());
        assert_eq!(without_downloads(|| 5).ok(), Some(5));
        // A cached-only read refuses downloads too, and hands nothing back.
        assert_eq!(
            try_cached(|| refuse_download(|| layer("d")).is_some()),
            None
        );
    }

    #[test]
    fn the_mode_is_restored_after_a_panic() {
        let caught = std::panic::catch_unwind(|| try_cached(|| panic!("in the read")));
        assert!(caught.is_err());
        assert!(refuse().is_none());
    }
}
