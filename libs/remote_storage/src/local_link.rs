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
//! `object_store`'s own writes does. Short of a crash, the attempt's staging name is removed on
//! every way out but a placed object: an error, a retry, the upload's future dropped. An upload
//! again of an object that is already this inode (its answer lost, or a restart before the
//! index listed it) removes the staging name rather than renaming it over itself, which
//! would leave both names.
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
    /// No link can be made in this directory: copy instead, for this reason (said once).
    CannotLink(String),
    /// The file at the path is not the one opened: copy this upload from the open file.
    Replaced(String),
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
            // Removes the staging name on every way out but a placed object: an error, a
            // retry, or this future dropped (a stopped upload queue aborts its task).
            let guard = StagingGuard::default();
            let staged = {
                let (source, dest, slot) = (source.clone(), dest.clone(), guard.slot());
                blocking(move || stage(&source, &dest, inode, &slot)).await
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
                Ok(Staged::Replaced(why)) => {
                    tracing::debug!("remote storage: {why}: copied");
                    return Ok(None);
                }
                Err(e) => return Err(transient("linking", &dest, e)),
            };
            let sent = read_whole(upload, len)
                .await
                .and_then(|sent| upload.check(sent).map(|()| sent))
                .map_err(AttemptError::Final)?;
            let (slot, dest2) = (guard.slot(), dest.clone());
            blocking(move || place(&staging, &dest2, &slot))
                .await
                .map_err(|e| transient("placing", &dest, e))?;
            Ok(Some(sent))
        })
        .await
    }
}

/// The staging name an attempt made, shared with the blocking task that makes it.
#[derive(Default)]
struct StagingState {
    /// Made and not yet renamed into place.
    path: Option<PathBuf>,
    /// The attempt is over: a name made from now on is removed at once.
    abandoned: bool,
}

type StagingSlot = Arc<std::sync::Mutex<StagingState>>;

/// Removes the attempt's staging name when dropped, unless it was placed.
#[derive(Default)]
struct StagingGuard(StagingSlot);

impl StagingGuard {
    fn slot(&self) -> StagingSlot {
        self.0.clone()
    }
}

impl Drop for StagingGuard {
    fn drop(&mut self) {
        let mut state = self.0.lock().unwrap_or_else(|e| e.into_inner());
        state.abandoned = true;
        if let Some(path) = state.path.take() {
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(
                    "remote storage: removing staging name {}: {e}",
                    path.display()
                );
            }
        }
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
            sent.crc32c = utils::crc32c::crc32c_append(sent.crc32c, &buf[..n]);
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

/// Steps 1 and 2: links `source` to a free staging name beside `dest`, recorded in `slot`
/// (whose guard removes it), and checks that it is the regular file `inode`.
fn stage(source: &Path, dest: &Path, inode: Inode, slot: &StagingSlot) -> io::Result<Staged> {
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
            // Gone since it was opened (a layer retired meanwhile): the open file is still
            // there to copy from.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok(Staged::Replaced(format!(
                    "{} was removed after it was opened",
                    source.display()
                )))
            }
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
    {
        let mut state = slot.lock().unwrap_or_else(|e| e.into_inner());
        if state.abandoned {
            std::fs::remove_file(&staging)?;
            return Err(io::Error::other("the upload was abandoned"));
        }
        state.path = Some(staging.clone());
    }
    // Not followed: a symbolic link at the source's path is linked as itself, and is no
    // layer file.
    let staged = std::fs::symlink_metadata(&staging)?;
    if !staged.is_file() || Inode::of(&staged) != inode {
        return Ok(Staged::Replaced(format!(
            "{} was replaced after it was opened",
            source.display()
        )));
    }
    Ok(Staged::Linked(staging))
}

/// Step 4: renames `staging` onto `dest` and makes the rename durable. Where `dest` is
/// already this inode (an upload again of an object placed before, by an attempt whose
/// answer was lost or by a run before a restart), a rename would do nothing and leave the
/// staging name: it is removed instead.
fn place(staging: &Path, dest: &Path, slot: &StagingSlot) -> io::Result<()> {
    let same = match std::fs::symlink_metadata(dest) {
        Ok(placed) => Inode::of(&placed) == Inode::of(&std::fs::symlink_metadata(staging)?),
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(e) => return Err(e),
    };
    if same {
        std::fs::remove_file(staging)?;
    } else {
        std::fs::rename(staging, dest)?;
    }
    slot.lock().unwrap_or_else(|e| e.into_inner()).path = None;
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
