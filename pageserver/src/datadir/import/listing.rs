//! What an archive holds, as its members arrive: its files and directories other than relation
//! segments (the file directory to be), and its relation segments.
//!
//! This is the part of an import that grows with the number of members (their data is stored
//! as it streams and never held), so it is bounded as each member arrives, before anything of
//! it is kept, and a hostile archive is refused at the member that passes a bound rather than
//! after the server has held all of them:
//!
//! - **Entries** (files and directories): each path is held once, as its map key (the
//!   `FileEntry` it becomes takes that string at the end). They become the file directory, one
//!   value of at most `max_value_size` bytes: its encoded size ([`FILE_DIRECTORY_HEADER_LEN`]
//!   and [`ENTRY_FIXED_LEN`] bytes plus the path per entry, parent directories included) is
//!   kept as entries come, and the member that would take it past the limit is refused. So
//!   the entries hold at most about `max_value_size` bytes of paths in at most
//!   `max_value_size / 28` entries of about 100 bytes each: some 5 MiB at the default 1 MiB.
//! - **Relation segments**: a (fork, segment number) pair and its block count, no path; about
//!   50 bytes each, for at most [`MAX_MEMBERS`] members: 100 MiB at worst.
//!
//! - **Members left out** (WAL segments recycled ahead, which hold no WAL): their paths, so that
//!   a second member of the same path is refused as for a listed one; at least 1 MiB of
//!   archive each, and counted as members.
//!
//! Invariants: a path is listed once (a member twice is refused, one left out too); every
//! listed path's parent
//! directories are listed, named by the archive or implied (mode 0700, no mtime; a member that
//! names one later gives it its mode), so a basebackup recreates them; no path is both a file
//! and a directory (a member inside a file, or a file where members already are, is refused).

use std::collections::btree_map::{self, BTreeMap};
use std::collections::BTreeSet;
use std::iter::Peekable;

use pageserver_api::datadir::{EntryKind, FileEntry, RelTag, RELSEG_BLOCKS};

use crate::datadir::path::{abbreviated, classify, DatadirPath};

/// The most members an archive may have: each costs memory until the import ends. A data
/// directory of 100,000 relations of three forks has about 300,000; each database's relation
/// directory holds at most about 200,000 forks at the default `max_value_size`.
pub const MAX_MEMBERS: usize = 2_000_000;

/// The file directory's encoded size before its entries: format version, next id, count.
pub const FILE_DIRECTORY_HEADER_LEN: usize = 1 + 4 + 4;
/// An entry's encoded size besides its path: path length, kind, mode, mtime, size, id.
pub const ENTRY_FIXED_LEN: usize = 2 + 1 + 4 + 8 + 8 + 4;

/// Why a member cannot be listed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ListingError {
    #[error(
        "the archive has more than {MAX_MEMBERS} members (each costs the import memory until \
         it ends)"
    )]
    TooManyMembers,
    #[error("archive member {0:?} appears twice")]
    Twice(String),
    #[error("archive member {member:?} is inside {file:?}, which is a file")]
    InsideAFile { member: String, file: String },
    #[error("archive member {0:?} is a file, but members before it are inside it")]
    FileOverDirectory(String),
    #[error(
        "the archive's files and directories other than relation files do not fit the file \
         directory, one value of at most max_value_size ({max} bytes): {entries} entries fit, \
         member {member:?} does not (about 20,000 fit at the default 1 MiB)"
    )]
    FileDirectoryFull {
        member: String,
        entries: usize,
        max: usize,
    },
}

/// A file or directory as listed; its path is the map key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub kind: EntryKind,
    pub mode: u32,
    pub mtime: u64,
    pub size: u64,
    pub id: u32,
    /// Named by the archive, not only implied by a path inside it.
    pub named: bool,
}

impl Entry {
    pub fn file(mode: u32, mtime: u64, size: u64, id: u32) -> Entry {
        Entry {
            kind: EntryKind::File,
            mode,
            mtime,
            size,
            id,
            named: true,
        }
    }

    pub fn directory(mode: u32, mtime: u64) -> Entry {
        Entry {
            kind: EntryKind::Directory,
            mode,
            mtime,
            size: 0,
            id: 0,
            named: true,
        }
    }

    /// A parent directory the archive did not name (PostgreSQL's own mode).
    fn implied() -> Entry {
        Entry {
            named: false,
            ..Entry::directory(0o700, 0)
        }
    }
}

/// A relation fork as its segments make it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fork {
    pub rel: RelTag,
    /// Where its last segment with blocks ends (an empty segment past the data, which
    /// PostgreSQL leaves after a truncation until the relation is dropped, adds none).
    pub size: u32,
    /// The blocks of all its segments together: `size` unless a segment is missing or short.
    pub blocks: u64,
}

/// See the module documentation.
pub struct Listing {
    entries: BTreeMap<Box<str>, Entry>,
    /// The encoded size of the file directory `entries` make.
    file_directory_len: usize,
    max_file_directory_len: usize,
    /// Blocks of each relation segment.
    segments: BTreeMap<(RelTag, u32), u32>,
    /// Members not listed: see [`Listing::add_left_out`].
    left_out: BTreeSet<Box<str>>,
    members: usize,
    root: bool,
}

impl Listing {
    /// An empty listing whose entries must fit a file directory of `max_file_directory_len`
    /// bytes (`max_value_size`).
    pub fn new(max_file_directory_len: usize) -> Listing {
        Listing {
            entries: BTreeMap::new(),
            file_directory_len: FILE_DIRECTORY_HEADER_LEN,
            max_file_directory_len,
            segments: BTreeMap::new(),
            left_out: BTreeSet::new(),
            members: 0,
            root: false,
        }
    }

    /// Counts a member, before anything of it is kept.
    pub fn count_member(&mut self) -> Result<(), ListingError> {
        if self.members >= MAX_MEMBERS {
            return Err(ListingError::TooManyMembers);
        }
        self.members += 1;
        Ok(())
    }

    /// The data directory itself (`./`).
    pub fn add_root(&mut self) -> Result<(), ListingError> {
        if std::mem::replace(&mut self.root, true) {
            return Err(ListingError::Twice("./".to_string()));
        }
        Ok(())
    }

    /// A file or directory other than a relation segment, and its parents.
    pub fn add_entry(&mut self, path: String, entry: Entry) -> Result<(), ListingError> {
        if let Some(listed) = self.entries.get_mut(path.as_str()) {
            return match (listed.named, entry.kind) {
                (false, EntryKind::Directory) => {
                    // An implied parent, now named: same path, same encoded size.
                    *listed = entry;
                    Ok(())
                }
                (false, EntryKind::File) => Err(ListingError::FileOverDirectory(path)),
                (true, _) => Err(ListingError::Twice(path)),
            };
        }
        if self.is_segment(&path) || self.left_out.contains(path.as_str()) {
            return Err(ListingError::Twice(path));
        }
        self.add_parents(&path, ENTRY_FIXED_LEN + path.len())?;
        self.file_directory_len += ENTRY_FIXED_LEN + path.len();
        self.entries.insert(path.into_boxed_str(), entry);
        Ok(())
    }

    /// A file left out of the snapshot (a WAL segment recycled ahead): not listed, but its path
    /// is held so that a member of the same path, before or after, is refused; its parents are
    /// listed, as a directory restored without them would lack them.
    pub fn add_left_out(&mut self, path: String) -> Result<(), ListingError> {
        match self.entries.get(path.as_str()) {
            Some(listed) if listed.named => return Err(ListingError::Twice(path)),
            Some(_) => return Err(ListingError::FileOverDirectory(path)),
            None => {}
        }
        if self.is_segment(&path) || self.left_out.contains(path.as_str()) {
            return Err(ListingError::Twice(path));
        }
        self.add_parents(&path, 0)?;
        self.left_out.insert(path.into_boxed_str());
        Ok(())
    }

    /// Segment `segno` of fork `rel`, of `blocks` blocks, at `path`, and its parents.
    pub fn add_segment(
        &mut self,
        path: &str,
        rel: RelTag,
        segno: u32,
        blocks: u32,
    ) -> Result<(), ListingError> {
        match self.entries.get(path) {
            Some(listed) if listed.named => return Err(ListingError::Twice(path.to_string())),
            Some(_) => return Err(ListingError::FileOverDirectory(path.to_string())),
            None => {}
        }
        if self.segments.contains_key(&(rel, segno)) {
            return Err(ListingError::Twice(path.to_string()));
        }
        self.add_parents(path, 0)?;
        self.segments.insert((rel, segno), blocks);
        Ok(())
    }

    /// Lists `path`'s parent directories that are not listed yet, once the file directory is
    /// known to hold them and `own_len` more bytes (the entry itself, if it becomes one).
    fn add_parents(&mut self, path: &str, own_len: usize) -> Result<(), ListingError> {
        let mut needed = own_len;
        for parent in parents(path) {
            match self.entries.get(parent) {
                Some(listed) if listed.kind == EntryKind::File => {
                    return Err(ListingError::InsideAFile {
                        member: path.to_string(),
                        file: parent.to_string(),
                    })
                }
                Some(_) => {}
                None if self.is_segment(parent) => {
                    return Err(ListingError::InsideAFile {
                        member: path.to_string(),
                        file: parent.to_string(),
                    })
                }
                None => needed += ENTRY_FIXED_LEN + parent.len(),
            }
        }
        if self.file_directory_len + needed > self.max_file_directory_len {
            return Err(ListingError::FileDirectoryFull {
                member: abbreviated(path),
                entries: self.entries.len(),
                max: self.max_file_directory_len,
            });
        }
        for parent in parents(path) {
            if !self.entries.contains_key(parent) {
                self.file_directory_len += ENTRY_FIXED_LEN + parent.len();
                self.entries.insert(parent.into(), Entry::implied());
            }
        }
        Ok(())
    }

    /// Whether `path` names a listed relation segment.
    fn is_segment(&self, path: &str) -> bool {
        match classify(path, true) {
            Ok(DatadirPath::Relation { rel, segno }) => self.segments.contains_key(&(rel, segno)),
            _ => false,
        }
    }

    /// The listed paths, in order.
    pub fn paths(&self) -> impl Iterator<Item = &str> + '_ {
        self.entries.keys().map(|path| &**path)
    }

    /// The forks the archive holds, in key order.
    pub fn forks(&self) -> Forks<'_> {
        Forks(self.segments.iter().peekable())
    }

    /// The encoded size of the file directory the entries make.
    pub fn file_directory_len(&self) -> usize {
        self.file_directory_len
    }

    /// The entries as the file directory's, in path order; the listing keeps none.
    pub fn take_entries(&mut self) -> Vec<FileEntry> {
        std::mem::take(&mut self.entries)
            .into_iter()
            .map(|(path, e)| FileEntry {
                path: path.into_string(),
                kind: e.kind,
                mode: e.mode,
                mtime: e.mtime,
                size: e.size,
                id: e.id,
            })
            .collect()
    }
}

/// The forks of a listing's segments, in key order (see [`Listing::forks`]).
pub struct Forks<'a>(Peekable<btree_map::Iter<'a, (RelTag, u32), u32>>);

impl Iterator for Forks<'_> {
    type Item = Fork;

    fn next(&mut self) -> Option<Fork> {
        let (&(rel, _), _) = self.0.peek()?;
        let mut fork = Fork {
            rel,
            size: 0,
            blocks: 0,
        };
        while let Some((&(_, segno), &blocks)) = self.0.next_if(|((r, _), _)| *r == rel) {
            fork.blocks += u64::from(blocks);
            if blocks > 0 {
                // The import checked that a segment's blocks are numbered within a u32.
                let end = segno.saturating_mul(RELSEG_BLOCKS).saturating_add(blocks);
                fork.size = fork.size.max(end);
            }
        }
        Some(fork)
    }
}

/// `a/b/c` → `a`, `a/b`.
fn parents(path: &str) -> impl Iterator<Item = &str> + '_ {
    path.match_indices('/').map(|(i, _)| &path[..i])
}
