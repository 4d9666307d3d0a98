//! The steps that make a change to a directory durable, written once.
//!
//! A file becomes durable under its final name in four steps: write it under a temporary name
//! (ending in [`TEMP_SUFFIX`]), `sync_all` it, rename it, and fsync the directory, so that after
//! a crash either the old name (or nothing) or the whole new file is there. [`StagedFile`] is
//! those steps; every file we commit (layer files, the manifest) is written through it. A
//! directory built whole is the same dance with [`rename_durably`].
//!
//! Failpoints: a [`StagedFile`] created with failpoint prefix `p` evaluates `p-before-rename`
//! (the file is written and fsynced under its temporary name) and `p-after-rename` (the file
//! has its final name, the directory is not fsynced yet).
//!
//! Files named `*.___temp` are never the truth: loading removes them, and a staged file that is
//! dropped before its commit removes itself.

use std::io;
use std::path::{Path, PathBuf};

use crate::io::virtual_file::{FileIo, VirtualFile};

/// What a file or directory is called while it is being built.
pub const TEMP_SUFFIX: &str = ".___temp";

/// An I/O error and the path it happened to.
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", path.display())]
pub struct PathError {
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

impl PathError {
    fn at(path: &Path) -> impl FnOnce(io::Error) -> PathError + '_ {
        move |source| PathError {
            path: path.to_owned(),
            source,
        }
    }
}

/// A failed [`StagedFile::commit`], and whether the file had taken its final name first.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct CommitError {
    pub error: PathError,
    /// The rename happened and the directory's fsync did not: the new file is in place now,
    /// and whether it survives a crash is unknown. `false`: the final name is untouched.
    pub renamed: bool,
}

impl From<CommitError> for PathError {
    fn from(e: CommitError) -> PathError {
        e.error
    }
}

/// Makes the directory entries of `dir` (creations, renames, removals) durable. The directory
/// is opened through the table of open files, like every file of ours.
pub fn fsync_dir(dir: &Path) -> io::Result<()> {
    VirtualFile::open(dir)?.sync_all()
}

/// Renames `from` to `to` and makes the rename durable (fsyncs `to`'s directory). What `from`
/// holds must already be durable.
pub fn rename_durably(from: &Path, to: &Path) -> Result<(), PathError> {
    rename_durably_holding(from, to, ())
}

/// [`rename_durably`] with `guard` held over the rename alone: the directory's fsync, which
/// may take long, runs after it is dropped.
pub fn rename_durably_holding<G>(from: &Path, to: &Path, guard: G) -> Result<(), PathError> {
    let renamed = std::fs::rename(from, to).map_err(PathError::at(to));
    drop(guard);
    renamed?;
    let dir = to.parent().unwrap_or(Path::new("."));
    fsync_dir(dir).map_err(PathError::at(dir))
}

/// Writes `bytes` as `dir/name`, a small file of a directory that is being built under a
/// temporary name (no one reads it until the directory is renamed into place), and makes the
/// file and its entry in `dir` durable. `dir`'s own entry is the caller's to make durable.
pub fn write_in_new_dir(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), PathError> {
    write_in_new_dir_with_mode(dir, name, bytes, 0o644)
}

/// [`write_in_new_dir`] for a file only the server's user may read (it holds a password).
pub fn write_private_in_new_dir(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), PathError> {
    write_in_new_dir_with_mode(dir, name, bytes, 0o600)
}

fn write_in_new_dir_with_mode(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    mode: u32,
) -> Result<(), PathError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(name);
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&path)
        .and_then(|mut file| {
            file.write_all(bytes)?;
            file.sync_all()
        })
        .map_err(PathError::at(&path))?;
    fsync_dir(dir).map_err(PathError::at(dir))
}

/// A file written under a temporary name in one directory, durable under its final name once
/// [`StagedFile::commit`] returns. Dropped uncommitted, it removes its temporary file.
pub struct StagedFile {
    dir: PathBuf,
    temp_path: PathBuf,
    /// `None` once committed. Durable: its descriptor stays open while it is written.
    file: Option<VirtualFile>,
    /// The failpoints' prefix; failpoints exist only in `testing` builds.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    failpoints: &'static str,
}

impl StagedFile {
    /// Creates `<dir>/<temp_name>`, which must end in [`TEMP_SUFFIX`]. A file of that name (left
    /// by a failed attempt earlier in this run) is replaced. `failpoints` names the failpoints
    /// of the commit (see the module documentation).
    pub fn create(
        dir: &Path,
        temp_name: &str,
        failpoints: &'static str,
    ) -> Result<StagedFile, PathError> {
        let temp_path = dir.join(temp_name);
        if !temp_name.ends_with(TEMP_SUFFIX) {
            return Err(PathError {
                path: temp_path,
                source: io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("a staged file's name must end in {TEMP_SUFFIX}"),
                ),
            });
        }
        match std::fs::remove_file(&temp_path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(PathError::at(&temp_path)(e))
            }
            _ => {}
        }
        let file = VirtualFile::create_durable(&temp_path).map_err(PathError::at(&temp_path))?;
        Ok(StagedFile {
            dir: dir.to_owned(),
            temp_path,
            file: Some(file),
            failpoints,
        })
    }

    /// The file to write, at any offsets.
    pub fn file(&self) -> &VirtualFile {
        self.file
            .as_ref()
            .expect("a staged file is open until committed")
    }

    pub fn temp_path(&self) -> &Path {
        &self.temp_path
    }

    /// Makes the file durable as `<dir>/<final_name>`, replacing any file of that name: fsync,
    /// rename, fsync the directory. Returns the final path. An error says whether the file had
    /// its final name by then ([`CommitError::renamed`]); its directory entry is durable only
    /// on success.
    pub fn commit(mut self, final_name: &str) -> Result<PathBuf, CommitError> {
        let final_path = self.dir.join(final_name);
        let before = |error| CommitError {
            error,
            renamed: false,
        };
        self.file()
            .sync_all()
            .map_err(|e| before(PathError::at(&self.temp_path)(e)))?;
        fail::fail_point!(&format!("{}-before-rename", self.failpoints), |_| {
            Err(before(failpoint_error(
                &self.temp_path,
                self.failpoints,
                "before",
            )))
        });
        std::fs::rename(&self.temp_path, &final_path)
            .map_err(|e| before(PathError::at(&final_path)(e)))?;
        // Committed: from here the file is not ours to remove.
        self.file = None;
        let after = |error| CommitError {
            error,
            renamed: true,
        };
        fail::fail_point!(&format!("{}-after-rename", self.failpoints), |_| {
            Err(after(failpoint_error(
                &final_path,
                self.failpoints,
                "after",
            )))
        });
        fsync_dir(&self.dir).map_err(|e| after(PathError::at(&self.dir)(e)))?;
        Ok(final_path)
    }
}

#[cfg(feature = "testing")]
fn failpoint_error(path: &Path, prefix: &str, when: &str) -> PathError {
    PathError {
        path: path.to_owned(),
        source: io::Error::other(format!("failpoint {prefix}-{when}-rename")),
    }
}

impl Drop for StagedFile {
    fn drop(&mut self) {
        if let Some(file) = self.file.take() {
            drop(file);
            if let Err(e) = std::fs::remove_file(&self.temp_path) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::error!(path = %self.temp_path.display(), "failed to remove an unfinished file: {e}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_file_has_its_final_name_and_contents() {
        let dir = tempfile::tempdir().unwrap();
        let staged = StagedFile::create(dir.path(), "x.___temp", "test").unwrap();
        staged.file().write_all_at(b"hello", 0).unwrap();
        let path = staged.commit("x").unwrap();
        assert_eq!(path, dir.path().join("x"));
        assert_eq!(std::fs::read(&path).unwrap(), b"hello");
        assert!(!dir.path().join("x.___temp").exists());
    }

    #[test]
    fn dropped_uncommitted_file_removes_itself() {
        let dir = tempfile::tempdir().unwrap();
        let staged = StagedFile::create(dir.path(), "y.___temp", "test").unwrap();
        staged.file().write_all_at(b"half", 0).unwrap();
        assert!(dir.path().join("y.___temp").exists());
        drop(staged);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_leftover_temp_file_is_replaced_and_a_bad_name_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("z.___temp"), b"old and longer").unwrap();
        let staged = StagedFile::create(dir.path(), "z.___temp", "test").unwrap();
        staged.file().write_all_at(b"new", 0).unwrap();
        let path = staged.commit("z").unwrap();
        assert_eq!(std::fs::read(path).unwrap(), b"new");
        let err = StagedFile::create(dir.path(), "z.tmp", "test")
            .err()
            .unwrap();
        assert!(err.to_string().contains("must end in .___temp"), "{err}");
    }
}
