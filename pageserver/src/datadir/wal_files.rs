//! The non-relation files WAL records change, as the page ingest of `wal_versions` writes
//! them: the commit status pages of `pg_xact/`, the relation maps (`pg_filenode.map`), the
//! directories of databases created and dropped.
//!
//! `pg_xact/` is an SLRU: segments of 32 pages of 8 KiB, two bits per transaction (32,768 a
//! page), named by four hex digits. The timeline stores its files byte for byte, as chunks of
//! 8 KiB under the file directory's ids (`pageserver_api::datadir`), so a chunk is exactly one
//! SLRU page. A record that sets statuses becomes, per page it changes, a delta that writes the
//! changed bytes (a `will_init` one for a page the record creates): a commit costs a few bytes,
//! not a page. `CLOG_ZEROPAGE` adds a page (and a segment file, in the file directory, when it
//! is the segment's first); `CLOG_TRUNCATE` removes the segments wholly before its page.
//!
//! A relation map update (`XLOG_RELMAP_UPDATE`) holds the whole file (512 bytes): it is stored
//! as the file's one chunk, an image. A database created by `XLOG_DBASE_CREATE_WAL_LOG` gets its
//! directory and its `PG_VERSION` (the cluster's own); a dropped one loses its directory and
//! every file under it.
//!
//! The pages and the directory are read once from the timeline and then kept here as ingest
//! changes them (pages in a small cache: a workload writes to the newest one or two).

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use pageserver_api::datadir::{
    file_chunk_key, file_dir_key, EntryKind, FileDirectory, FileEntry, FILE_CHUNK_SIZE,
};
use pageserver_api::{Key, Patch, Value};

/// The value of a key as of the last ingested LSN (what the timeline holds).
pub type ReadCurrent<'a> = dyn FnMut(Key) -> Result<Option<Bytes>, String> + 'a;

/// Transactions one commit status page holds.
pub const XACTS_PER_PAGE: u32 = (FILE_CHUNK_SIZE as u32) * 4;
/// Pages of one segment file.
pub const PAGES_PER_SEGMENT: u32 = 32;
/// The page of the highest transaction id: 4,096 segment files at most.
pub const MAX_PAGE: u32 = u32::MAX / XACTS_PER_PAGE;

/// One SLRU directory: where its segment files are, and its last page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slru {
    pub dir: &'static str,
    pub max_page: u32,
}

/// `pg_xact/`: commit status, two bits a transaction.
pub const XACT: Slru = Slru {
    dir: "pg_xact",
    max_page: MAX_PAGE,
};
/// `TRANSACTION_STATUS_COMMITTED` and `TRANSACTION_STATUS_ABORTED`.
pub const STATUS_COMMITTED: u8 = 0x01;
pub const STATUS_ABORTED: u8 = 0x02;
/// Pages kept: past this many, the caller puts what it holds and starts the cache again
/// ([`Files::cache_full`], [`Files::clear_cache`]). A page is never dropped while a change to it
/// waits to be put: the next change would be computed over the timeline's older copy.
const CACHED_PAGES: usize = 64;

/// The non-relation files as ingest has changed them: see the module documentation.
#[derive(Default)]
pub struct Files {
    /// The file directory, once read; changed in place.
    dir: Option<FileDirectory>,
    /// Pages by `(file id, page in the segment)`.
    pages: HashMap<(u32, u32), Vec<u8>>,
}

/// What one record changed: each status page's bytes before it (`None`: the record created
/// it), files written whole, and whether the file directory changed.
#[derive(Default)]
pub struct FileChanges {
    before: BTreeMap<(u32, u32), Option<Vec<u8>>>,
    whole: BTreeMap<u32, Bytes>,
    pub dir_changed: bool,
}

impl Files {
    /// Sets the status of each of `xids` to `status`.
    pub fn set_xact_status(
        &mut self,
        xids: impl IntoIterator<Item = u32>,
        status: u8,
        read: &mut ReadCurrent<'_>,
        changes: &mut FileChanges,
    ) -> Result<(), String> {
        for xid in xids {
            // At most MAX_PAGE.
            let page_no = xid / XACTS_PER_PAGE;
            let page = self.slru_page(XACT, page_no, read, changes)?;
            let in_page = xid % XACTS_PER_PAGE;
            let (byte, shift) = ((in_page / 4) as usize, (in_page % 4) * 2);
            page[byte] = (page[byte] & !(0x03 << shift)) | (status << shift);
        }
        Ok(())
    }

    /// `CLOG_ZEROPAGE`: page `page_no` starts as zeros.
    pub fn zero_xact_page(
        &mut self,
        page_no: u32,
        read: &mut ReadCurrent<'_>,
        changes: &mut FileChanges,
    ) -> Result<(), String> {
        self.zero_slru_page(XACT, page_no, read, changes)
    }

    /// Page `page_no` of `slru` starts as zeros (`*_ZEROPAGE` records).
    pub fn zero_slru_page(
        &mut self,
        slru: Slru,
        page_no: u32,
        read: &mut ReadCurrent<'_>,
        changes: &mut FileChanges,
    ) -> Result<(), String> {
        self.slru_page(slru, page_no, read, changes)?.fill(0);
        Ok(())
    }

    /// `CLOG_TRUNCATE`: the segments wholly before page `page_no` go.
    pub fn truncate_xact(
        &mut self,
        page_no: u32,
        read: &mut ReadCurrent<'_>,
        changes: &mut FileChanges,
    ) -> Result<(), String> {
        // FirstNormalTransactionId is 3.
        self.truncate_slru(XACT, page_no, XACTS_PER_PAGE, 3, read, changes)
    }

    /// `SimpleLruTruncate`: the cutoff page rounded down to its segment, and a segment goes if
    /// its first and last pages both precede it in the circular order of the ids `slru` holds
    /// `per_page` of, counted from `first` ([`page_precedes`]).
    pub fn truncate_slru(
        &mut self,
        slru: Slru,
        cutoff_page: u32,
        per_page: u32,
        first: u32,
        read: &mut ReadCurrent<'_>,
        changes: &mut FileChanges,
    ) -> Result<(), String> {
        let cutoff = cutoff_page - cutoff_page % PAGES_PER_SEGMENT;
        let precedes = |page| page_precedes(page, cutoff, per_page, first);
        self.remove_slru_segments(
            slru,
            |segment| {
                let start = segment.wrapping_mul(PAGES_PER_SEGMENT);
                precedes(start) && precedes(start.wrapping_add(PAGES_PER_SEGMENT - 1))
            },
            read,
            changes,
        )
    }

    /// Removes the segment files of `slru` that `goes` says go.
    pub fn remove_slru_segments(
        &mut self,
        slru: Slru,
        goes: impl Fn(u32) -> bool,
        read: &mut ReadCurrent<'_>,
        changes: &mut FileChanges,
    ) -> Result<(), String> {
        let dir = self.dir(read)?;
        let before = dir.entries.len();
        dir.entries
            .retain(|e| segment_of(&e.path, slru).is_none_or(|segment| !goes(segment)));
        if dir.entries.len() != before {
            changes.dir_changed = true;
            // The pages of the files that went; those of the others may wait to be put.
            let kept: std::collections::HashSet<u32> = dir.entries.iter().map(|e| e.id).collect();
            self.pages.retain(|(id, _), _| kept.contains(id));
        }
        Ok(())
    }

    /// Whether the page cache is past its bound: the caller puts the versions it holds, then
    /// [`Files::clear_cache`].
    pub fn cache_full(&self) -> bool {
        self.pages.len() >= CACHED_PAGES
    }

    /// Drops the cached pages: every change to them is in the timeline now.
    pub fn clear_cache(&mut self) {
        self.pages.clear();
    }

    /// Writes the file at `path` whole (at most one chunk), creating it with `mode` if absent.
    pub fn write_small_file(
        &mut self,
        path: &str,
        contents: &[u8],
        mode: u32,
        read: &mut ReadCurrent<'_>,
        changes: &mut FileChanges,
    ) -> Result<(), String> {
        if contents.len() > FILE_CHUNK_SIZE {
            return Err(format!("{path} of {} bytes", contents.len()));
        }
        let dir = self.dir(read)?;
        let size = contents.len() as u64;
        let id = match dir.entries.binary_search_by(|e| e.path.as_str().cmp(path)) {
            Ok(at) => {
                let entry = &mut dir.entries[at];
                if entry.kind != EntryKind::File {
                    return Err(format!("{path} is a directory"));
                }
                if entry.size != size {
                    entry.size = size;
                    changes.dir_changed = true;
                }
                entry.id
            }
            Err(at) => {
                let id = new_entry(dir, at, path, EntryKind::File, mode, size)?;
                changes.dir_changed = true;
                id
            }
        };
        changes.whole.insert(id, Bytes::copy_from_slice(contents));
        Ok(())
    }

    /// The directory at `path` exists (created with mode 0700 if absent).
    pub fn add_directory(
        &mut self,
        path: &str,
        read: &mut ReadCurrent<'_>,
        changes: &mut FileChanges,
    ) -> Result<(), String> {
        let dir = self.dir(read)?;
        if let Err(at) = dir.entries.binary_search_by(|e| e.path.as_str().cmp(path)) {
            new_entry(dir, at, path, EntryKind::Directory, 0o700, 0)?;
            changes.dir_changed = true;
        }
        Ok(())
    }

    /// The directory at `path` and everything under it go.
    pub fn remove_tree(
        &mut self,
        path: &str,
        read: &mut ReadCurrent<'_>,
        changes: &mut FileChanges,
    ) -> Result<(), String> {
        let under = format!("{path}/");
        let dir = self.dir(read)?;
        let before = dir.entries.len();
        dir.entries
            .retain(|e| e.path != path && !e.path.starts_with(&under));
        if dir.entries.len() != before {
            changes.dir_changed = true;
        }
        Ok(())
    }

    /// The bytes of the small file at `path` (its first chunk), if the directory has it.
    pub fn read_small_file(
        &mut self,
        path: &str,
        read: &mut ReadCurrent<'_>,
    ) -> Result<Option<Bytes>, String> {
        let Some(id) = self.dir(read)?.get(path).map(|e| e.id) else {
            return Ok(None);
        };
        read(file_chunk_key(id, 0))
    }

    /// The versions of what one record changed, by key.
    pub fn versions(&self, changes: FileChanges, out: &mut BTreeMap<Key, Value>) {
        for ((id, page_no), before) in changes.before {
            let Some(now) = self.pages.get(&(id, page_no)) else {
                continue;
            };
            let zeros;
            let old = match &before {
                Some(old) => old,
                None => {
                    zeros = vec![0u8; FILE_CHUNK_SIZE];
                    &zeros
                }
            };
            let patches = changed_bytes(old, now);
            if patches.is_empty() && before.is_some() {
                continue;
            }
            out.insert(
                file_chunk_key(id, page_no),
                Value::Delta {
                    will_init: before.is_none(),
                    patches,
                },
            );
        }
        for (id, contents) in changes.whole {
            out.insert(file_chunk_key(id, 0), Value::Image(contents));
        }
        if changes.dir_changed {
            if let Some(dir) = &self.dir {
                out.insert(file_dir_key(), Value::Image(dir.encode().into()));
            }
        }
    }

    fn dir(&mut self, read: &mut ReadCurrent<'_>) -> Result<&mut FileDirectory, String> {
        if self.dir.is_none() {
            let bytes = read(file_dir_key())?.ok_or("the timeline has no file directory")?;
            self.dir = Some(FileDirectory::decode(&bytes).map_err(|e| e.to_string())?);
        }
        Ok(self.dir.as_mut().expect("read above"))
    }

    /// Page `page_no` of `slru`, as this record found it noted in `changes`; its segment file
    /// and its bytes created (as zeros) if the directory does not reach it.
    pub fn slru_page(
        &mut self,
        slru: Slru,
        page_no: u32,
        read: &mut ReadCurrent<'_>,
        changes: &mut FileChanges,
    ) -> Result<&mut Vec<u8>, String> {
        if page_no > slru.max_page {
            return Err(format!(
                "{} page {page_no}: the last is {}",
                slru.dir, slru.max_page
            ));
        }
        let path = format!("{}/{:04X}", slru.dir, page_no / PAGES_PER_SEGMENT);
        let in_segment = page_no % PAGES_PER_SEGMENT;
        let end = (u64::from(in_segment) + 1) * FILE_CHUNK_SIZE as u64;
        let dir = self.dir(read)?;
        let (id, exists) = match dir.entries.binary_search_by(|e| e.path.as_str().cmp(&path)) {
            Ok(at) => {
                let entry = &mut dir.entries[at];
                let exists = entry.size >= end;
                if !exists {
                    entry.size = end;
                    changes.dir_changed = true;
                }
                (entry.id, exists)
            }
            Err(at) => {
                let id = new_entry(dir, at, &path, EntryKind::File, 0o600, end)?;
                changes.dir_changed = true;
                (id, false)
            }
        };
        let key = (id, in_segment);
        let page = match self.pages.entry(key) {
            std::collections::hash_map::Entry::Occupied(cached) => cached.into_mut(),
            std::collections::hash_map::Entry::Vacant(missing) => {
                let mut page = if exists {
                    read(file_chunk_key(id, in_segment))?.map_or_else(Vec::new, |b| b.to_vec())
                } else {
                    Vec::new()
                };
                page.resize(FILE_CHUNK_SIZE, 0);
                missing.insert(page)
            }
        };
        // The page as this record found it, once per record.
        changes
            .before
            .entry(key)
            .or_insert_with(|| exists.then(|| page.clone()));
        Ok(page)
    }
}

/// Adds an entry for `path` at `at` of the directory's entries (where a search said it
/// belongs), with the modification time of its parent directory; its id (0 for a directory).
fn new_entry(
    dir: &mut FileDirectory,
    at: usize,
    path: &str,
    kind: EntryKind,
    mode: u32,
    size: u64,
) -> Result<u32, String> {
    let id = match kind {
        EntryKind::Directory => 0,
        EntryKind::File => {
            let id = dir.next_id;
            dir.next_id = id.checked_add(1).ok_or("the file directory is full")?;
            id
        }
    };
    let parent = path.rsplit_once('/').map_or("", |(parent, _)| parent);
    let mtime = dir.get(parent).map_or(0, |d| d.mtime);
    dir.entries.insert(
        at,
        FileEntry {
            path: path.to_owned(),
            kind,
            mode,
            mtime,
            size,
            id,
        },
    );
    Ok(id)
}

/// The little-endian `u32` at `at` of a record's main data, or where the data ends.
pub fn u32_at(bytes: &[u8], at: usize) -> Result<u32, String> {
    bytes
        .get(at..at + 4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("four bytes")))
        .ok_or_else(|| {
            format!(
                "main data of {} bytes ends before byte {}",
                bytes.len(),
                at + 4
            )
        })
}

/// `CLOGPagePrecedes` and `MultiXactOffsetPagePrecedes`: whether page `a` comes before page
/// `b` in the circular order of the ids it holds `per_page` of (each page's id `first + 1`
/// compared as `TransactionIdPrecedes` and `MultiXactIdPrecedes` do).
pub fn page_precedes(a: u32, b: u32, per_page: u32, first: u32) -> bool {
    let id = |page: u32| page.wrapping_mul(per_page).wrapping_add(first + 1);
    let precedes = |x: u32, y: u32| (x.wrapping_sub(y) as i32) < 0;
    let (x1, x2) = (id(a), id(b));
    precedes(x1, x2) && precedes(x1, x2.wrapping_add(per_page - 1))
}

/// The segment number of a path of `slru`'s (`<dir>/XXXX`, four hex digits or more).
fn segment_of(path: &str, slru: Slru) -> Option<u32> {
    let name = path.strip_prefix(slru.dir)?.strip_prefix('/')?;
    if name.len() < 4 || name.contains('/') {
        return None;
    }
    u32::from_str_radix(name, 16).ok()
}

/// Patches that turn `old` into `new` (same length): one per run of changed bytes.
fn changed_bytes(old: &[u8], new: &[u8]) -> Vec<Patch> {
    let mut patches = Vec::new();
    let mut at = 0;
    while at < new.len() {
        if old.get(at) == Some(&new[at]) {
            at += 1;
            continue;
        }
        let start = at;
        while at < new.len() && old.get(at) != Some(&new[at]) {
            at += 1;
        }
        patches.push(Patch::new(
            start as u32,
            Bytes::copy_from_slice(&new[start..at]),
        ));
    }
    patches
}

#[cfg(test)]
mod tests;
