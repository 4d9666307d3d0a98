//! The files remote storage uploads from and downloads into: a [`VirtualFile`] behind remote
//! storage's [`LocalFile`] seam, so transfers count against `max_file_descriptors` like every
//! other file of ours, and fail through the same failpoints as the rest of our I/O.
//!
//! A download is written through [`TransferFile::create`] (durable: its descriptor stays open
//! until it is dropped, so its `sync_all` reports every write-back error), and trusted only
//! after [`crc32c_of`] has read it back from the disk: the checksum remote storage computes
//! covers the bytes that arrived, not the bytes that landed.
//!
//! Failpoints (`testing` builds): `remote-upload-read` fails a read of a file being uploaded
//! (`return`), or returns its bytes with the first one flipped (`return(corrupt)`);
//! `remote-download-torn-write` writes half of a download's chunk and reports it
//! all written (`return`), a torn write that only a read back finds.

use std::io;
use std::path::Path;

use remote_storage::{Inode, LocalFile};

use crate::io::virtual_file::{FileIo, VirtualFile};

/// Chunks a file is read back in.
const READ_CHUNK: usize = 1 << 20;

/// See the module documentation.
#[derive(Debug)]
pub struct TransferFile {
    file: VirtualFile,
    /// Where an upload of a file still being filled stops.
    limit: Option<u64>,
    /// Whether nothing will write the file again: see [`TransferFile::open_immutable`].
    immutable: bool,
}

impl TransferFile {
    fn new(file: VirtualFile, limit: Option<u64>, immutable: bool) -> TransferFile {
        TransferFile {
            file,
            limit,
            immutable,
        }
    }

    /// Opens `path` for an upload.
    pub fn open(path: &Path) -> io::Result<TransferFile> {
        VirtualFile::open(path).map(|f| TransferFile::new(f, None, false))
    }

    /// Opens `path`, a file nothing of ours writes again (a layer file: written under a
    /// temporary name, fsynced and renamed into place, and only ever replaced whole), for an
    /// upload that may make the object a hard link to it (remote storage's `local_link.rs`:
    /// the object then shares the file's fate).
    pub fn open_immutable(path: &Path) -> io::Result<TransferFile> {
        VirtualFile::open(path).map(|f| TransferFile::new(f, None, true))
    }

    /// Opens `path` for an upload of its first `len` bytes (a file still being filled).
    pub fn open_prefix(path: &Path, len: u64) -> io::Result<TransferFile> {
        VirtualFile::open(path).map(|f| TransferFile::new(f, Some(len), false))
    }

    /// Creates `path` for a download, replacing a file left there by an earlier attempt.
    pub fn create(path: &Path) -> io::Result<TransferFile> {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        VirtualFile::create_durable(path).map(|f| TransferFile::new(f, None, false))
    }

    /// The length and CRC-32C of the file (of its first bytes, for a prefix) as the disk
    /// holds it now.
    pub fn read_back(&self) -> io::Result<(u64, u32)> {
        let len = self.size()?;
        Ok((len, crc32c_of(&self.file, len)?))
    }
}

impl LocalFile for TransferFile {
    fn path(&self) -> &Path {
        self.file.path()
    }

    fn size(&self) -> io::Result<u64> {
        let len = self.file.metadata()?.len();
        Ok(self.limit.map_or(len, |limit| limit.min(len)))
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        fail::fail_point!("remote-upload-read", |action| {
            if action.as_deref() != Some("corrupt") {
                return Err(io::Error::other("failpoint remote-upload-read"));
            }
            self.file.read_exact_at(buf, offset)?;
            if let Some(byte) = buf.first_mut() {
                *byte ^= 0xff;
            }
            Ok(())
        });
        self.file.read_exact_at(buf, offset)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        fail::fail_point!("remote-download-torn-write", |_| self
            .file
            .write_all_at(&buf[..buf.len() / 2], offset));
        self.file.write_all_at(buf, offset)
    }

    fn sync_all(&self) -> io::Result<()> {
        self.file.sync_all()
    }

    fn immutable_inode(&self) -> io::Result<Option<Inode>> {
        if !self.immutable {
            return Ok(None);
        }
        Ok(Some(Inode::of(&self.file.metadata()?)))
    }
}

/// The CRC-32C of the first `len` bytes of `file`, read straight from the file in chunks (not
/// through the page cache: a bulk read must not push out the hot set).
pub fn crc32c_of(file: &dyn FileIo, len: u64) -> io::Result<u32> {
    let mut crc = 0;
    let mut buf = vec![0u8; READ_CHUNK.min(len as usize)];
    let mut offset = 0;
    while offset < len {
        let n = (len - offset).min(READ_CHUNK as u64) as usize;
        file.read_exact_at(&mut buf[..n], offset)?;
        crc = utils::crc32c::crc32c_append(crc, &buf[..n]);
        offset += n as u64;
    }
    Ok(crc)
}
