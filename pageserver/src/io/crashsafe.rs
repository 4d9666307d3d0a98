//! The steps that make a change to a directory durable, written once.
//!
//! A file becomes durable under its final name in four steps: write it under a temporary name,
//! `sync_all` it, rename it, and fsync the directory, so that after a crash either the old name
//! (or nothing) or the whole new file is there. Each writer spells out the first three, with
//! its own failpoints between them; the last is [`fsync_dir`].

use std::io;
use std::path::Path;

use crate::io::virtual_file::{FileIo, VirtualFile};

/// Makes the directory entries of `dir` (creations, renames, removals) durable. The directory
/// is opened through the table of open files, like every file of ours.
pub fn fsync_dir(dir: &Path) -> io::Result<()> {
    VirtualFile::open(dir)?.sync_all()
}
