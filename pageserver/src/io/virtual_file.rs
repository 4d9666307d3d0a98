//! The file I/O seam, and the bound on open file descriptors.
//!
//! Everything that reads or writes our files does so through [`FileIo`]: positional reads and
//! writes and `fsync`, nothing else. Production code uses [`VirtualFile`]; tests wrap a file to
//! inject write errors and torn writes, so the error paths of the layers above are exercised
//! against real files rather than a mock of our own code.
//!
//! Positional I/O (`pread`/`pwrite`) keeps no file cursor, so one open file can serve concurrent
//! readers without a lock.
//!
//! # Open file descriptors
//!
//! A [`VirtualFile`] is a path and a claim on a slot of the process's table of open files
//! ([`open_files`]): at most `max_file_descriptors` of our files are open at once, however many
//! layers the timelines hold, and a file whose descriptor was given to another is opened again,
//! by path, on its next use. Layer files never change once written and ephemeral files are
//! written with positional writes only, so a reopened descriptor reads the same bytes.
//!
//! Files created for durability ([`VirtualFile::create_durable`]: layer files being written,
//! the manifest's temporary file) keep their descriptor from creation until they are dropped,
//! so their `sync_all` reports every write-back error; the table never takes their slot.
//!
//! [`crashsafe`] holds the directory fsync, through the same table.

pub mod open_files;

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use open_files::{Claim, OpenFiles};

/// Positional file I/O; see the module docs.
pub trait FileIo: Send + Sync + fmt::Debug {
    /// Fills `buf` from `offset`; reading past the end of the file is `UnexpectedEof`.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Writes all of `bufs`, one after the other, at `offset`: for a real file with one
    /// system call when the kernel takes it all (`pwritev`), since the kernel charges most of
    /// a write's cost per call, not per byte.
    fn write_all_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        let mut at = offset;
        for buf in bufs {
            self.write_all_at(buf, at)?;
            at += buf.len() as u64;
        }
        Ok(())
    }
    /// Makes everything written so far durable.
    fn sync_all(&self) -> io::Result<()>;
    /// Asks the kernel to start writing `len` bytes from `offset` to disk without waiting for
    /// them, so that a later [`FileIo::sync_all`] finds little left to do. A hint: `Ok(false)`
    /// where the system cannot do it, and durability still comes from `sync_all` alone.
    fn start_writeback(&self, _offset: u64, _len: u64) -> io::Result<bool> {
        Ok(false)
    }
}

impl FileIo for File {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        FileExt::write_all_at(self, buf, offset)
    }

    fn write_all_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        write_all_vectored_at(self, bufs, offset)
    }

    fn sync_all(&self) -> io::Result<()> {
        File::sync_all(self)
    }

    fn start_writeback(&self, offset: u64, len: u64) -> io::Result<bool> {
        start_writeback(self, offset, len)
    }
}

/// Buffers one `pwritev` call takes at most here (the kernel's limit, `IOV_MAX`, is 1024).
const IOVECS_PER_CALL: usize = 64;

/// `pwritev` until all of `bufs` is written, resuming after a short write.
fn write_all_vectored_at(file: &File, bufs: &[&[u8]], mut offset: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    for group in bufs.chunks(IOVECS_PER_CALL) {
        let mut iovecs = [io::IoSlice::new(&[]); IOVECS_PER_CALL];
        for (iovec, buf) in iovecs.iter_mut().zip(group) {
            *iovec = io::IoSlice::new(buf);
        }
        let mut left = &mut iovecs[..group.len()];
        // Leading empty buffers go first: a call with nothing to write returns 0, which the
        // loop would take for a device that accepts nothing.
        io::IoSlice::advance_slices(&mut left, 0);
        while !left.is_empty() {
            let at = libc::off_t::try_from(offset).map_err(|_| {
                io::Error::new(io::ErrorKind::InvalidInput, "write offset out of range")
            })?;
            // SAFETY: `IoSlice` is ABI-compatible with `iovec` on Unix, and every buffer it
            // points to is borrowed for the duration of the call.
            let written = unsafe {
                libc::pwritev(
                    file.as_raw_fd(),
                    left.as_ptr().cast::<libc::iovec>(),
                    left.len() as libc::c_int,
                    at,
                )
            };
            if written < 0 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(err);
            }
            if written == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            offset += written as u64;
            io::IoSlice::advance_slices(&mut left, written as usize);
        }
    }
    Ok(())
}

/// `sync_file_range(SYNC_FILE_RANGE_WRITE)`: starts writeback of the dirty pages of the range
/// and returns; it never waits for them, nor reports on them (the final fsync does). `Ok(false)`
/// where the file system or the kernel does not support it.
#[cfg(target_os = "linux")]
fn start_writeback(file: &File, offset: u64, len: u64) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return Ok(false);
    };
    // SAFETY: a plain system call on a descriptor `file` keeps open for its duration.
    let rc = unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE)
    };
    if rc == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP | libc::ESPIPE) => Ok(false),
        _ => Err(err),
    }
}

#[cfg(not(target_os = "linux"))]
fn start_writeback(_file: &File, _offset: u64, _len: u64) -> io::Result<bool> {
    Ok(false)
}

/// The table's size when [`init`] was not called (tests, embedded use).
pub const DEFAULT_MAX_FILE_DESCRIPTORS: usize = 512;

static GLOBAL: OnceLock<Arc<OpenFiles>> = OnceLock::new();

/// Sizes the process's table of open files; call once at startup, before any file is opened.
/// Returns false if the table already existed (its size stays).
pub fn init(max_file_descriptors: usize) -> bool {
    let mut fresh = false;
    GLOBAL.get_or_init(|| {
        fresh = true;
        Arc::new(OpenFiles::new(max_file_descriptors))
    });
    crate::metrics::MAX_FILE_DESCRIPTORS.set(global().capacity() as i64);
    fresh
}

/// The process's table of open files.
pub fn global() -> &'static Arc<OpenFiles> {
    GLOBAL.get_or_init(|| Arc::new(OpenFiles::new(DEFAULT_MAX_FILE_DESCRIPTORS)))
}

/// How a file is opened again after its descriptor was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    ReadWrite,
}

/// A file of ours: a path, and a claim on a descriptor in the table (see the module docs).
pub struct VirtualFile {
    path: PathBuf,
    access: Access,
    /// Durable files keep their slot from creation until dropped.
    pinned: bool,
    table: Arc<OpenFiles>,
    /// The packed [`Claim`] on a slot; changes as the file loses and regains a descriptor.
    claim: AtomicU64,
}

impl fmt::Debug for VirtualFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VirtualFile")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl VirtualFile {
    /// Opens an existing file for reading.
    pub fn open(path: &Path) -> io::Result<VirtualFile> {
        Self::open_in(global(), path)
    }

    /// [`VirtualFile::open`] in a table of one's own.
    pub fn open_in(table: &Arc<OpenFiles>, path: &Path) -> io::Result<VirtualFile> {
        let file = Self::unopened(table, path, Access::Read, false);
        file.with_file(|_| Ok(()))?;
        Ok(file)
    }

    /// Creates a new file (it must not exist) for reads and positional writes, such as an
    /// ephemeral file: its descriptor may be taken and reopened between writes.
    pub fn create(path: &Path) -> io::Result<VirtualFile> {
        Self::create_in(global(), path, false)
    }

    /// Creates a new file (it must not exist) whose writes are made durable with `sync_all`: its
    /// descriptor stays open until it is dropped.
    pub fn create_durable(path: &Path) -> io::Result<VirtualFile> {
        Self::create_in(global(), path, true)
    }

    /// [`VirtualFile::create`] or [`VirtualFile::create_durable`] in a table of one's own. A
    /// durable file waits while half the table's slots are pinned by others.
    pub fn create_in(
        table: &Arc<OpenFiles>,
        path: &Path,
        durable: bool,
    ) -> io::Result<VirtualFile> {
        if durable {
            table.acquire_pin();
        }
        // From here the pin is the file's: its drop gives it back, also if creation fails.
        let file = Self::unopened(table, path, Access::ReadWrite, durable);
        let (held, previous) = file.claim_slot(|| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(path)
        })?;
        drop(held);
        file.release_previous(previous);
        Ok(file)
    }

    fn unopened(table: &Arc<OpenFiles>, path: &Path, access: Access, pinned: bool) -> VirtualFile {
        VirtualFile {
            path: path.to_owned(),
            access,
            pinned,
            table: table.clone(),
            claim: AtomicU64::new(Claim::NONE.bits()),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's metadata (its length), through its descriptor.
    pub fn metadata(&self) -> io::Result<std::fs::Metadata> {
        self.with_file(|f| f.metadata())
    }

    /// Runs `op` on the file's descriptor, opening the file again if its descriptor was taken.
    fn with_file<R>(&self, op: impl FnOnce(&File) -> io::Result<R>) -> io::Result<R> {
        let claim = Claim::from_bits(self.claim.load(Ordering::Acquire));
        if let Some(held) = self.table.hit(claim) {
            return op(held.file());
        }
        let write = self.access == Access::ReadWrite;
        let (held, previous) =
            self.claim_slot(|| OpenOptions::new().read(true).write(write).open(&self.path))?;
        let result = op(held.file());
        drop(held);
        self.release_previous(previous);
        result
    }

    /// Opens the file with `open` into a slot of the table and claims it; returns the slot,
    /// held, and the claim it replaced.
    fn claim_slot(
        &self,
        open: impl FnOnce() -> io::Result<File>,
    ) -> io::Result<(open_files::Held<'_>, Claim)> {
        let (claim, held) = self.table.install(self.pinned, open)?;
        let previous = Claim::from_bits(self.claim.swap(claim.bits(), Ordering::AcqRel));
        let kind = if previous == Claim::NONE {
            "first"
        } else {
            "reopen"
        };
        crate::metrics::FILE_OPENS.with_label_values(&[kind]).inc();
        Ok((held, previous))
    }

    /// Two threads that both missed each opened a descriptor: the one no longer claimed is
    /// closed rather than left open until the clock comes by (for a removed file, that would
    /// keep its space in use). Called with no slot held: a thread never waits for one slot
    /// while holding another, so two threads releasing each other's slots cannot deadlock.
    fn release_previous(&self, previous: Claim) {
        self.table.release(previous);
    }
}

impl FileIo for VirtualFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if let Some(refused) = super::cached_only::refuse() {
            return Err(refused);
        }
        self.with_file(|f| FileExt::read_exact_at(f, buf, offset))
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.with_file(|f| FileExt::write_all_at(f, buf, offset))
    }

    fn write_all_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        self.with_file(|f| write_all_vectored_at(f, bufs, offset))
    }

    fn sync_all(&self) -> io::Result<()> {
        self.with_file(|f| f.sync_all())
    }

    fn start_writeback(&self, offset: u64, len: u64) -> io::Result<bool> {
        self.with_file(|f| start_writeback(f, offset, len))
    }
}

impl Drop for VirtualFile {
    /// Closes the descriptor now: a deleted file's space is freed, and the slot is free.
    fn drop(&mut self) {
        self.table.release(Claim::from_bits(*self.claim.get_mut()));
        if self.pinned {
            self.table.release_pin();
        }
    }
}

/// Fault injection for tests: real files whose writes fail, or wait, on request.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{mpsc, Arc, Mutex};
    use std::time::Duration;

    /// Fails every write from the `fail_from`-th call on (counting from 0); reads pass through.
    #[derive(Debug)]
    pub(crate) struct FailingWrites {
        pub inner: File,
        pub fail_from: u64,
        pub calls: Arc<AtomicU64>,
    }

    impl FileIo for FailingWrites {
        fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            FileExt::read_exact_at(&self.inner, buf, offset)
        }

        fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
            if self.calls.fetch_add(1, Ordering::Relaxed) >= self.fail_from {
                // Like a real failing device: part of the data may have reached the file.
                let half = &buf[..buf.len() / 2];
                FileExt::write_all_at(&self.inner, half, offset)?;
                return Err(io::Error::other("injected write failure"));
            }
            FileExt::write_all_at(&self.inner, buf, offset)
        }

        fn sync_all(&self) -> io::Result<()> {
            self.inner.sync_all()
        }
    }

    /// A real file whose write at one offset waits until the test lets it go; every other write
    /// and every read passes straight through. Made by [`hold_write_at`].
    #[derive(Debug)]
    pub(crate) struct HeldWrite {
        inner: File,
        offset: u64,
        reached: mpsc::Sender<()>,
        release: Mutex<mpsc::Receiver<()>>,
    }

    /// The test's side of a [`HeldWrite`]. Dropping it lets the write go, so a test that fails
    /// while the write is held does not leave the writer waiting forever.
    pub(crate) struct WriteHold {
        reached: mpsc::Receiver<()>,
        release: mpsc::Sender<()>,
    }

    pub(crate) fn hold_write_at(inner: File, offset: u64) -> (HeldWrite, WriteHold) {
        let (reached_tx, reached_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel();
        let file = HeldWrite {
            inner,
            offset,
            reached: reached_tx,
            release: Mutex::new(release_rx),
        };
        let hold = WriteHold {
            reached: reached_rx,
            release: release_tx,
        };
        (file, hold)
    }

    impl WriteHold {
        /// Waits until the held write has started, and fails the test after 10 s.
        pub(crate) fn wait_until_reached(&self) {
            self.reached
                .recv_timeout(Duration::from_secs(10))
                .expect("the held write never started");
        }

        /// Lets the held write go on.
        pub(crate) fn release(self) {
            // Dropping the sender ends the writer's wait.
            drop(self.release);
        }
    }

    impl FileIo for HeldWrite {
        fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            FileExt::read_exact_at(&self.inner, buf, offset)
        }

        fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
            if offset == self.offset {
                let _ = self.reached.send(());
                // Ends when the test releases the write or drops its hold.
                let _ = self
                    .release
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .recv();
            }
            FileExt::write_all_at(&self.inner, buf, offset)
        }

        fn sync_all(&self) -> io::Result<()> {
            self.inner.sync_all()
        }
    }
}

#[cfg(test)]
mod tests;
