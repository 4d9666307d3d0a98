//! Uploads into a local directory by hard link: the object is the file the caller already
//! wrote, not a second copy of its bytes.
//!
//! A caller's file that nothing writes again ([`LocalFile::immutable_inode`]), uploaded into a
//! local directory set to `hard_links = true` on the same file system, becomes its object in
//! four steps, each safe to stop at:
//!
//! 1. its path is linked to a staging name beside the object, `<object>#<n>`: the names
//!    `object_store`'s own staged writes use, which its listings skip;
//! 2. the staged name must be the inode the caller opened (the path may have been replaced
//!    since): if not, it is removed and the upload copies instead;
//! 3. the file is read through the caller's seam and its length and CRC-32C checked against
//!    what the caller expects, as a copy checks what it sends: bytes that differ never become
//!    an object;
//! 4. the staging name is renamed onto the object's, and the object's directory (and each
//!    directory made for it) fsynced; the file itself was fsynced when it was written.
//!
//! A crash before step 4 leaves only a staging name, which no listing shows, as a crash in
//! `object_store`'s own writes does.
//!
//! **The fate-sharing rule.** The object and the local file are one inode. The store keeps
//! the bytes when the local name goes (an eviction, a detach, a work directory removed), but
//! not when the disk fails (which a copy on the same file system shares anyway) or when a
//! byte of the file is changed in place (which a copy would not share). So a caller declares
//! a file immutable only when nothing of its own writes it in place: the pageserver does so for
//! layer files, which are written under a temporary name, fsynced and renamed, and replaced only
//! by a new file renamed over them; a WAL segment still being filled is copied. That is why
//! links are not the default: a store that is a copy still holds a good layer when the local
//! one is damaged in place (the pageserver then downloads it again at startup), one that is a
//! link does not.
//!
//! Where no link can be made (the directory is on another file system, or its file system has
//! no hard links), the upload copies, and says why once in the log.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;

use crate::local_file::Inode;
use crate::retry::AttemptError;
use crate::transfer::Upload;
use crate::{RemoteError, RemoteStorage, Transferred};

/// Step 3 reads the file in chunks of this size.
const CHECK_CHUNK: usize = 256 << 10;

/// A local directory store's handle for uploads by link.
#[derive(Debug)]
pub(crate) struct LinkingDir {
    fs: Arc<LocalFileSystem>,
    /// The directory, for the log.
    root: PathBuf,
    /// Whether the log has said that links cannot be made here.
    said_why_not: AtomicBool,
}

impl LinkingDir {
    pub(crate) fn new(fs: Arc<LocalFileSystem>, root: PathBuf) -> LinkingDir {
        LinkingDir {
            fs,
            root,
            said_why_not: AtomicBool::new(false),
        }
    }
}

/// What step 1 and 2 gave.
enum Staged {
    /// The caller's inode, under this staging name.
    Linked(PathBuf),
    /// No link: copy instead, for this reason.
    CannotLink(String),
}

impl RemoteStorage {
    /// Makes the object at `location` a hard link to `upload`'s file of `len` bytes and
    /// inode `inode`; `Ok(None)` when it cannot be one (the caller then copies).
    pub(crate) async fn upload_by_link(
        &self,
        dir: &LinkingDir,
        upload: &Upload<'_>,
        location: &ObjectPath,
        inode: Inode,
        len: u64,
    ) -> Result<Option<Transferred>, RemoteError> {
        let key = upload.key;
        let dest = dir
            .fs
            .path_to_filesystem(location)
            .map_err(|e| RemoteError::BadKey {
                key: key.to_string(),
                reason: e.to_string(),
            })?;
        let source = upload.file.path().to_owned();
        self.retrying("upload", key, || async {
            let staged = {
                let (source, dest) = (source.clone(), dest.clone());
                blocking(move || stage(&source, &dest, inode)).await
            };
            let staging = match staged {
                Ok(Staged::Linked(staging)) => staging,
                Ok(Staged::CannotLink(why)) => {
                    if !dir.said_why_not.swap(true, Ordering::Relaxed) {
                        tracing::info!(
                            "remote storage: uploads into {} copy their files: {why}",
                            dir.root.display()
                        );
                    }
                    return Ok(None);
                }
                Err(e) => return Err(transient("linking", &dest, e)),
            };
            let checked = read_whole(upload, len)
                .await
                .and_then(|sent| upload.check(sent).map(|()| sent));
            let placed = {
                let (staging, dest) = (staging.clone(), dest.clone());
                let ok = checked.is_ok();
                blocking(move || {
                    if ok {
                        place(&staging, &dest)
                    } else {
                        std::fs::remove_file(&staging)
                    }
                })
                .await
            };
            let sent = checked.map_err(AttemptError::Final)?;
            placed.map_err(|e| transient("placing", &dest, e))?;
            Ok(Some(sent))
        })
        .await
    }
}

/// Step 3's read: the length and CRC-32C of the first `len` bytes of `upload`'s file, read
/// through its seam in one blocking task with one small buffer (it stays in the CPU's cache
/// between the copy out of the kernel and the checksum; a new buffer per part would be page
/// faults and zeroing for every part).
async fn read_whole(upload: &Upload<'_>, len: u64) -> Result<Transferred, RemoteError> {
    let file = upload.file.clone();
    let read = tokio::task::spawn_blocking(move || {
        let mut buf = vec![0u8; CHECK_CHUNK.min(len as usize)];
        let mut sent = Transferred { len: 0, crc32c: 0 };
        while sent.len < len {
            let n = (len - sent.len).min(CHECK_CHUNK as u64) as usize;
            file.read_exact_at(&mut buf[..n], sent.len)
                .map_err(|e| (e, sent.len + n as u64))?;
            sent.len += n as u64;
            sent.crc32c = crc32c::crc32c_append(sent.crc32c, &buf[..n]);
        }
        Ok(sent)
    })
    .await
    .map_err(|e| {
        upload.local_error(io::Error::other(format!(
            "a blocking file task failed: {e}"
        )))
    })?;
    read.map_err(|(e, end)| upload.read_failed(e, end, len))
}

/// Steps 1 and 2: links `source` to a free staging name beside `dest` and checks that it is
/// `inode`.
fn stage(source: &Path, dest: &Path, inode: Inode) -> io::Result<Staged> {
    let parent = dest.parent().unwrap_or(Path::new("/"));
    make_dirs(parent)?;
    let mut n = 1u32;
    let staging = loop {
        let mut name = dest.as_os_str().to_owned();
        name.push(format!("#{n}"));
        let staging = PathBuf::from(name);
        match std::fs::hard_link(source, &staging) {
            Ok(()) => break staging,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => n += 1,
            Err(e) if cannot_link(&e) => {
                return Ok(Staged::CannotLink(format!(
                    "no hard link from {} to {}: {e}",
                    source.display(),
                    parent.display()
                )))
            }
            Err(e) => return Err(e),
        }
    };
    if Inode::of(&std::fs::metadata(&staging)?) != inode {
        std::fs::remove_file(&staging)?;
        return Ok(Staged::CannotLink(format!(
            "{} was replaced after it was opened",
            source.display()
        )));
    }
    Ok(Staged::Linked(staging))
}

/// Step 4: renames `staging` onto `dest` and makes the rename durable.
fn place(staging: &Path, dest: &Path) -> io::Result<()> {
    std::fs::rename(staging, dest)?;
    fsync_dir(dest.parent().unwrap_or(Path::new("/")))
}

/// Makes `dir` and its missing ancestors, each made one fsynced into its parent.
fn make_dirs(dir: &Path) -> io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        make_dirs(parent)?;
    }
    match std::fs::create_dir(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    fsync_dir(dir.parent().unwrap_or(Path::new("/")))
}

fn fsync_dir(dir: &Path) -> io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Errors that say this file system, or this pair of them, takes no hard link: copying is
/// the answer, not retrying.
fn cannot_link(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::CrossesDevices | io::ErrorKind::Unsupported | io::ErrorKind::TooManyLinks
    ) || e.kind() == io::ErrorKind::PermissionDenied
}

fn transient(what: &str, dest: &Path, e: io::Error) -> AttemptError {
    AttemptError::Transient(format!("upload: {what} {}: {e}", dest.display()))
}

async fn blocking<T: Send + 'static>(
    op: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    tokio::task::spawn_blocking(op)
        .await
        .map_err(|e| io::Error::other(format!("a blocking file task failed: {e}")))?
}
