//! The file I/O seam.
//!
//! Everything that reads or writes our files does so through [`FileIo`]: positional reads and
//! writes and `fsync`, nothing else. Production code uses `std::fs::File`; tests wrap it to
//! inject write errors and torn writes, so the error paths of the layers above are exercised
//! against real files rather than a mock of our own code.
//!
//! Positional I/O (`pread`/`pwrite`) keeps no file cursor, so one open file can serve concurrent
//! readers without a lock.

use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Positional file I/O; see the module docs.
pub trait FileIo: Send + Sync + fmt::Debug {
    /// Fills `buf` from `offset`; reading past the end of the file is `UnexpectedEof`.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes everything written so far durable.
    fn sync_all(&self) -> io::Result<()>;
}

impl FileIo for File {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        FileExt::write_all_at(self, buf, offset)
    }

    fn sync_all(&self) -> io::Result<()> {
        File::sync_all(self)
    }
}

/// Fault injection for tests: a real file whose writes start failing on request.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

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
}
