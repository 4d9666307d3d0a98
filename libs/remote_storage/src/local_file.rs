//! The local side of a transfer, behind a seam: an upload reads its file and a download writes
//! its file only through [`LocalFile`], so the embedding program decides how its files are
//! opened and counted (the pageserver passes its own files, under its bound on open
//! descriptors), and a test can hand in a file whose reads fail or whose writes tear.
//!
//! [`StdFile`] is a plain `std::fs::File`, for [`RemoteStorage::put_file`] and
//! [`RemoteStorage::download_to_file`], which take paths.
//!
//! Every call blocks; a transfer runs each on tokio's blocking pool ([`blocking`]), one
//! chunk of at most a part at a time.
//!
//! [`RemoteStorage::put_file`]: crate::RemoteStorage::put_file
//! [`RemoteStorage::download_to_file`]: crate::RemoteStorage::download_to_file

use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A local file a transfer reads from (an upload) or writes into (a download), positionally.
pub trait LocalFile: Send + Sync + fmt::Debug {
    /// Where the file is, for error messages.
    fn path(&self) -> &Path;
    /// Its length now.
    fn size(&self) -> io::Result<u64>;
    /// Fills `buf` from `offset`; a file that ends first is `UnexpectedEof`.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes every write so far durable.
    fn sync_all(&self) -> io::Result<()>;
    /// For a file that nothing will write again (it is only ever replaced whole, under a new
    /// inode, or removed): its inode, so that an upload into a local directory on the same
    /// file system may make the object a hard link to it (`local_link.rs`). `None`, the
    /// default: the file may still change, and an upload copies its bytes.
    fn immutable_inode(&self) -> io::Result<Option<Inode>> {
        Ok(None)
    }
}

/// A file's identity on its machine: its device and inode numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Inode {
    pub dev: u64,
    pub ino: u64,
}

impl Inode {
    pub fn of(metadata: &std::fs::Metadata) -> Inode {
        use std::os::unix::fs::MetadataExt;
        Inode {
            dev: metadata.dev(),
            ino: metadata.ino(),
        }
    }
}

/// A `std::fs::File` and its path.
#[derive(Debug)]
pub struct StdFile {
    file: File,
    path: PathBuf,
    immutable: bool,
}

impl StdFile {
    /// Opens `path` for reading.
    pub fn open(path: &Path) -> io::Result<StdFile> {
        Ok(StdFile {
            file: File::open(path)?,
            path: path.to_owned(),
            immutable: false,
        })
    }

    /// Opens `path` for reading, declaring that nothing will write the file again (see
    /// [`LocalFile::immutable_inode`]).
    pub fn open_immutable(path: &Path) -> io::Result<StdFile> {
        Ok(StdFile {
            immutable: true,
            ..StdFile::open(path)?
        })
    }

    /// Creates `path` for writing, replacing any file there.
    pub fn create(path: &Path) -> io::Result<StdFile> {
        Ok(StdFile {
            file: File::create(path)?,
            path: path.to_owned(),
            immutable: false,
        })
    }
}

impl LocalFile for StdFile {
    fn path(&self) -> &Path {
        &self.path
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(&self.file, buf, offset)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        FileExt::write_all_at(&self.file, buf, offset)
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

/// Runs `op` on the file on tokio's blocking pool.
pub(crate) async fn blocking<T: Send + 'static>(
    file: &Arc<dyn LocalFile>,
    op: impl FnOnce(&dyn LocalFile) -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    let file = file.clone();
    tokio::task::spawn_blocking(move || op(&*file))
        .await
        .map_err(|e| io::Error::other(format!("a blocking file task failed: {e}")))?
}
