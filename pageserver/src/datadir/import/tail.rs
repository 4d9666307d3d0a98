//! The end of a tar stream, told from a cut-off one.

use std::io::{self, Read};

use super::ImportError;

/// A reader that remembers how much it read and its last 512 bytes, so that the end of the
/// archive can be told from a cut-off one: tar readers stop quietly at end of input.
pub(super) struct TailReader<R> {
    inner: R,
    pub(super) total: u64,
    tail: Vec<u8>,
}

pub(super) const TAR_BLOCK: usize = 512;

impl<R: Read> TailReader<R> {
    pub(super) fn new(inner: R) -> TailReader<R> {
        TailReader {
            inner,
            total: 0,
            tail: Vec::with_capacity(2 * TAR_BLOCK),
        }
    }

    /// After the archive's last member, which ends at `last_member_end`: the reader must have
    /// read a block of zeros right after it (the end-of-archive marker), not reached the end
    /// of input (which tar readers take quietly for the end, at a member boundary). Reads what
    /// follows (the marker's second block, the record padding) to the end.
    pub(super) fn check_end(&mut self, last_member_end: u64) -> Result<(), ImportError> {
        let at_marker = self.total == last_member_end + TAR_BLOCK as u64
            && self.tail.len() >= TAR_BLOCK
            && self.tail[self.tail.len() - TAR_BLOCK..]
                .iter()
                .all(|b| *b == 0);
        if !at_marker {
            return Err(ImportError::Invalid(if self.total == 0 {
                "the body is empty: expected a tar archive".to_string()
            } else {
                format!(
                    "the archive ends after {} bytes without its end-of-archive marker: it \
                     was cut short",
                    self.total
                )
            }));
        }
        io::copy(self, &mut io::sink()).map_err(ImportError::Read)?;
        Ok(())
    }
}

impl<R: Read> Read for TailReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.total += n as u64;
        let read = &buf[..n];
        if read.len() >= TAR_BLOCK {
            self.tail.clear();
            self.tail.extend_from_slice(&read[read.len() - TAR_BLOCK..]);
        } else {
            self.tail.extend_from_slice(read);
            let excess = self.tail.len().saturating_sub(TAR_BLOCK);
            self.tail.drain(..excess);
        }
        Ok(n)
    }
}
