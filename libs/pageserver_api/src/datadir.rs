//! The key space of a PostgreSQL data directory, and the byte formats of its metadata values.
//!
//! A data directory stored in a timeline is two kinds of things: relation files, stored block
//! by block so that GetPage@LSN serves them to compute, and every other file, stored byte for
//! byte so that a basebackup gives it back unchanged. Metadata values tie them together. Every
//! value here is an image (a whole value, never a delta), and every one of them is read as
//! untrusted input: a decoder refuses anything that is not exactly its format.
//!
//! ```text
//!  field1  field2     field3  field4    field5  field6     value
//!  0x00    spcnode    dbnode  relnode   fork    block      the 8 KiB block (Key::rel_block)
//!  0x01    spcnode    dbnode  relnode   fork    0          size of the fork in blocks (u32 BE)
//!  0x02    spcnode    dbnode  0         0       0          the relations of one database
//!  0x03    file id    0       0         0       chunk      8 KiB of a file (the last: shorter)
//!  0x04    0          0       0         0       0          the file directory
//!  0x05    0          0       0         0       0          the snapshot list
//!  0x06    0          0       0         0       0          the cluster's counters (counters.rs)
//! ```
//!
//! A relation fork is every segment of `base/<dbnode>/<relnode>[_fsm|_vm|_init][.N]` (spcnode
//! 1663) or `global/<relnode>...` (spcnode 1664, dbnode 0): segment N holds blocks from
//! `N × 131072`. Everything else in the directory (`pg_control`, `PG_VERSION`,
//! `pg_filenode.map`, SLRU segments, WAL segments, configuration files, `backup_label`) and
//! every directory is an entry of the file directory, with its mode and modification time;
//! a file's bytes are chunks of [`FILE_CHUNK_SIZE`] under the file's id.
//!
//! A snapshot (an import) writes all of its versions at one LSN, the last of them the snapshot
//! list with the new snapshot appended. A basebackup at LSN L reads the list at L, takes the
//! newest snapshot at or below L and reads everything at that snapshot's LSN.
//!
//! # Value formats (integers big-endian)
//!
//! ```text
//! relation size:   u32 blocks
//! relation dir:    u8 version=1 | u32 count | count × (u32 relnode, u8 fork), sorted, unique
//! file directory:  u8 version=1 | u32 next_id | u32 count | count × entry, sorted by path
//!   entry:         u16 path_len | path (UTF-8, relative, '/'-separated) | u8 kind (0 file,
//!                  1 directory) | u32 mode | u64 mtime | u64 size | u32 id (0 for a directory)
//! snapshot list:   u8 version=1 | u64 system_identifier | u32 count | count × snapshot, by LSN
//!   snapshot:      u64 lsn | u8 kind (0 a stopped cluster, 1 a backup of a running one)
//! ```

use std::fmt;

use utils::Lsn;

use crate::Key;

mod counters;
pub use counters::ClusterCounters;

/// Tablespace of `base/`: `pg_default`.
pub const DEFAULTTABLESPACE_OID: u32 = 1663;
/// Tablespace of `global/`: `pg_global`.
pub const GLOBALTABLESPACE_OID: u32 = 1664;

/// Blocks in one segment file of a relation fork (1 GiB of 8 KiB blocks).
pub const RELSEG_BLOCKS: u32 = 131_072;
/// Bytes in a relation block.
pub const BLCKSZ: usize = 8192;
/// Bytes in one chunk of a non-relation file.
pub const FILE_CHUNK_SIZE: usize = 8192;

const REL_BLOCK_KIND: u8 = 0x00;
const REL_SIZE_KIND: u8 = 0x01;
const REL_DIR_KIND: u8 = 0x02;
const FILE_CHUNK_KIND: u8 = 0x03;
const FILE_DIR_KIND: u8 = 0x04;
const SNAPSHOT_LIST_KIND: u8 = 0x05;
const COUNTERS_KIND: u8 = 0x06;

const FORMAT_VERSION: u8 = 1;

/// One fork of one relation: what a relation file's name says, with its tablespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RelTag {
    pub spcnode: u32,
    pub dbnode: u32,
    pub relnode: u32,
    pub forknum: u8,
}

impl RelTag {
    /// The key of block `blknum` of this fork.
    pub fn block_key(&self, blknum: u32) -> Key {
        Key::rel_block(
            self.spcnode,
            self.dbnode,
            self.relnode,
            self.forknum,
            blknum,
        )
    }

    /// The key of this fork's size.
    pub fn size_key(&self) -> Key {
        Key {
            field1: REL_SIZE_KIND,
            field2: self.spcnode,
            field3: self.dbnode,
            field4: self.relnode,
            field5: self.forknum,
            field6: 0,
        }
    }

    /// The relation's file name in its database directory, for segment `segno`.
    pub fn file_name(&self, segno: u32) -> String {
        let fork = match self.forknum {
            0 => "",
            1 => "_fsm",
            2 => "_vm",
            3 => "_init",
            // Never produced by the path parser; kept total so a damaged directory value
            // still names a file rather than panicking.
            _ => "_unknown",
        };
        if segno == 0 {
            format!("{}{fork}", self.relnode)
        } else {
            format!("{}{fork}.{segno}", self.relnode)
        }
    }
}

/// The fork number of a relation file name's suffix (`""`, `_fsm`, `_vm`, `_init`).
pub fn fork_number(suffix: &str) -> Option<u8> {
    match suffix {
        "" => Some(0),
        "_fsm" => Some(1),
        "_vm" => Some(2),
        "_init" => Some(3),
        _ => None,
    }
}

/// The key of the relation directory of database `dbnode` in tablespace `spcnode`.
pub fn rel_dir_key(spcnode: u32, dbnode: u32) -> Key {
    Key {
        field1: REL_DIR_KIND,
        field2: spcnode,
        field3: dbnode,
        ..Key::MIN
    }
}

/// The key of chunk `chunk` of file `file_id`.
pub fn file_chunk_key(file_id: u32, chunk: u32) -> Key {
    Key {
        field1: FILE_CHUNK_KIND,
        field2: file_id,
        field6: chunk,
        ..Key::MIN
    }
}

/// The key of the file directory.
pub fn file_dir_key() -> Key {
    Key {
        field1: FILE_DIR_KIND,
        ..Key::MIN
    }
}

/// The key of the snapshot list.
pub fn snapshot_list_key() -> Key {
    Key {
        field1: SNAPSHOT_LIST_KIND,
        ..Key::MIN
    }
}

/// The key of the cluster's counters ([`ClusterCounters`]).
pub fn counters_key() -> Key {
    Key {
        field1: COUNTERS_KIND,
        ..Key::MIN
    }
}

/// Whether `key` is a relation block key.
pub fn is_rel_block_key(key: &Key) -> bool {
    key.field1 == REL_BLOCK_KIND
}

/// Why a metadata value could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} value: {reason}")]
pub struct DatadirDecodeError {
    pub what: &'static str,
    pub reason: String,
}

/// A relation fork's size in blocks.
pub fn encode_rel_size(blocks: u32) -> Vec<u8> {
    blocks.to_be_bytes().to_vec()
}

pub fn decode_rel_size(buf: &[u8]) -> Result<u32, DatadirDecodeError> {
    let bytes: [u8; 4] = buf.try_into().map_err(|_| DatadirDecodeError {
        what: "relation size",
        reason: format!("expected 4 bytes, got {}", buf.len()),
    })?;
    Ok(u32::from_be_bytes(bytes))
}

/// The relation forks of one database: `(relnode, fork)`, sorted and unique.
pub fn encode_rel_dir(rels: &[(u32, u8)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + rels.len() * 5);
    out.push(FORMAT_VERSION);
    out.extend_from_slice(&(rels.len() as u32).to_be_bytes());
    for (relnode, fork) in rels {
        out.extend_from_slice(&relnode.to_be_bytes());
        out.push(*fork);
    }
    out
}

pub fn decode_rel_dir(buf: &[u8]) -> Result<Vec<(u32, u8)>, DatadirDecodeError> {
    let mut r = Reader::new(buf, "relation directory");
    r.version()?;
    let count = r.u32()? as usize;
    // Each entry takes 5 bytes: a count the buffer cannot hold is refused before allocating.
    r.check_room(count, 5)?;
    let mut rels = Vec::with_capacity(count);
    for _ in 0..count {
        let rel = (r.u32()?, r.u8()?);
        if rels.last().is_some_and(|last| *last >= rel) {
            return Err(r.error(format!("entries not sorted and unique at {rel:?}")));
        }
        rels.push(rel);
    }
    r.finish()?;
    Ok(rels)
}

/// What a file directory entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Directory,
}

/// One entry of the file directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileEntry {
    /// Relative to the data directory, `/`-separated, no `.` or `..` components.
    pub path: String,
    pub kind: EntryKind,
    /// Permission bits (`0o7777` at most).
    pub mode: u32,
    /// Modification time, seconds since the epoch.
    pub mtime: u64,
    /// Bytes (0 for a directory).
    pub size: u64,
    /// Where its chunks are ([`file_chunk_key`]); 0 for a directory.
    pub id: u32,
}

impl FileEntry {
    /// Chunks the file's bytes take.
    pub fn chunks(&self) -> u64 {
        self.size.div_ceil(FILE_CHUNK_SIZE as u64)
    }
}

/// The file directory: every non-relation file and every directory, sorted by path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileDirectory {
    /// The id the next new file gets; above every id in use.
    pub next_id: u32,
    pub entries: Vec<FileEntry>,
}

/// The longest path an entry may have (PostgreSQL's own limit is 1024).
pub const MAX_PATH_LEN: usize = 4096;

impl FileDirectory {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.push(FORMAT_VERSION);
        out.extend_from_slice(&self.next_id.to_be_bytes());
        out.extend_from_slice(&(self.entries.len() as u32).to_be_bytes());
        for e in &self.entries {
            out.extend_from_slice(&(e.path.len() as u16).to_be_bytes());
            out.extend_from_slice(e.path.as_bytes());
            out.push(match e.kind {
                EntryKind::File => 0,
                EntryKind::Directory => 1,
            });
            out.extend_from_slice(&e.mode.to_be_bytes());
            out.extend_from_slice(&e.mtime.to_be_bytes());
            out.extend_from_slice(&e.size.to_be_bytes());
            out.extend_from_slice(&e.id.to_be_bytes());
        }
        out
    }

    pub fn decode(buf: &[u8]) -> Result<FileDirectory, DatadirDecodeError> {
        let mut r = Reader::new(buf, "file directory");
        r.version()?;
        let next_id = r.u32()?;
        let count = r.u32()? as usize;
        // The smallest entry is 28 bytes (an empty path is refused below, but counted here).
        r.check_room(count, 27)?;
        let mut entries: Vec<FileEntry> = Vec::with_capacity(count);
        for _ in 0..count {
            let len = r.u16()? as usize;
            let path = std::str::from_utf8(r.take(len)?)
                .map_err(|_| r.error("a path is not UTF-8".to_string()))?
                .to_string();
            if path.is_empty() || path.len() > MAX_PATH_LEN {
                return Err(r.error(format!("a path of {} bytes", path.len())));
            }
            let kind = match r.u8()? {
                0 => EntryKind::File,
                1 => EntryKind::Directory,
                other => return Err(r.error(format!("entry kind {other} of {path:?}"))),
            };
            let mode = r.u32()?;
            let mtime = r.u64()?;
            let size = r.u64()?;
            let id = r.u32()?;
            if mode > 0o7777 {
                return Err(r.error(format!("mode {mode:o} of {path:?}")));
            }
            if kind == EntryKind::File && id >= next_id {
                return Err(r.error(format!("id {id} of {path:?} is not below {next_id}")));
            }
            if kind == EntryKind::Directory && (id != 0 || size != 0) {
                return Err(r.error(format!("directory {path:?} with a size or an id")));
            }
            if entries.last().is_some_and(|last| last.path >= path) {
                return Err(r.error(format!("entries not sorted and unique at {path:?}")));
            }
            entries.push(FileEntry {
                path,
                kind,
                mode,
                mtime,
                size,
                id,
            });
        }
        r.finish()?;
        Ok(FileDirectory { next_id, entries })
    }

    /// The entry at `path`.
    pub fn get(&self, path: &str) -> Option<&FileEntry> {
        self.entries
            .binary_search_by(|e| e.path.as_str().cmp(path))
            .ok()
            .map(|i| &self.entries[i])
    }
}

/// How the cluster a snapshot came from was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapshotKind {
    /// The directory of a cleanly stopped cluster: it starts at once.
    Stopped,
    /// A `pg_basebackup` of a running cluster: it recovers from its WAL when started.
    Backup,
}

impl fmt::Display for SnapshotKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SnapshotKind::Stopped => "stopped",
            SnapshotKind::Backup => "backup",
        })
    }
}

/// One snapshot: the LSN its versions are at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub lsn: Lsn,
    pub kind: SnapshotKind,
    /// Where the WAL a restore from it replays begins: its LSN, for an imported directory,
    /// whose `pg_wal/` holds the WAL it needs before that; or, for a background snapshot, from
    /// where the timeline's own WAL gives its `pg_wal/` (not stored again with it): 120 bytes
    /// of WAL before the record after the snapshot, where a restore's archive puts the
    /// checkpoint record it starts at (docs/pitr.md). Snapshots made by earlier versions at
    /// one of the primary's checkpoint records give that record's start, or its redo point, or
    /// (keeping their `pg_wal/`) their LSN.
    pub wal_from: Lsn,
}

impl Snapshot {
    /// A snapshot whose `pg_wal/` is its own.
    pub fn imported(lsn: Lsn, kind: SnapshotKind) -> Snapshot {
        Snapshot {
            lsn,
            kind,
            wal_from: lsn,
        }
    }
}

/// A snapshot's kind in the encoded list: a stopped cluster's directory, a backup, and a
/// stopped one whose WAL before its LSN is the timeline's (followed by that WAL's start).
const SNAPSHOT_STOPPED: u8 = 0;
const SNAPSHOT_BACKUP: u8 = 1;
const SNAPSHOT_STOPPED_WAL_FROM: u8 = 2;

/// Every snapshot of a timeline, oldest first, and the cluster they are of.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SnapshotList {
    /// `pg_control`'s system identifier: every snapshot is of this one cluster.
    pub system_identifier: u64,
    pub snapshots: Vec<Snapshot>,
}

impl SnapshotList {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(13 + self.snapshots.len() * 17);
        out.push(FORMAT_VERSION);
        out.extend_from_slice(&self.system_identifier.to_be_bytes());
        out.extend_from_slice(&(self.snapshots.len() as u32).to_be_bytes());
        for s in &self.snapshots {
            out.extend_from_slice(&s.lsn.0.to_be_bytes());
            match s.kind {
                SnapshotKind::Stopped if s.wal_from < s.lsn => {
                    out.push(SNAPSHOT_STOPPED_WAL_FROM);
                    out.extend_from_slice(&s.wal_from.0.to_be_bytes());
                }
                SnapshotKind::Stopped => out.push(SNAPSHOT_STOPPED),
                SnapshotKind::Backup => out.push(SNAPSHOT_BACKUP),
            }
        }
        out
    }

    pub fn decode(buf: &[u8]) -> Result<SnapshotList, DatadirDecodeError> {
        let mut r = Reader::new(buf, "snapshot list");
        r.version()?;
        let system_identifier = r.u64()?;
        let count = r.u32()? as usize;
        r.check_room(count, 9)?;
        let mut snapshots: Vec<Snapshot> = Vec::with_capacity(count);
        for _ in 0..count {
            let lsn = Lsn(r.u64()?);
            let (kind, wal_from) = match r.u8()? {
                SNAPSHOT_STOPPED => (SnapshotKind::Stopped, lsn),
                SNAPSHOT_BACKUP => (SnapshotKind::Backup, lsn),
                SNAPSHOT_STOPPED_WAL_FROM => {
                    let wal_from = Lsn(r.u64()?);
                    if wal_from >= lsn {
                        return Err(r.error(format!(
                            "the snapshot at {lsn} replays its WAL from {wal_from}, not below it"
                        )));
                    }
                    (SnapshotKind::Stopped, wal_from)
                }
                other => return Err(r.error(format!("snapshot kind {other} at {lsn}"))),
            };
            if snapshots.last().is_some_and(|last| last.lsn >= lsn) {
                return Err(r.error(format!("snapshots not in LSN order at {lsn}")));
            }
            snapshots.push(Snapshot {
                lsn,
                kind,
                wal_from,
            });
        }
        r.finish()?;
        Ok(SnapshotList {
            system_identifier,
            snapshots,
        })
    }

    /// The newest snapshot at or below `lsn`.
    pub fn at(&self, lsn: Lsn) -> Option<Snapshot> {
        self.snapshots.iter().rev().find(|s| s.lsn <= lsn).copied()
    }
}

/// A cursor over a value that refuses to read past its end.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8], what: &'static str) -> Reader<'a> {
        Reader { buf, pos: 0, what }
    }

    fn error(&self, reason: String) -> DatadirDecodeError {
        DatadirDecodeError {
            what: self.what,
            reason,
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DatadirDecodeError> {
        if self.buf.len() - self.pos < n {
            return Err(self.error(format!(
                "ends at byte {} inside a field of {n} bytes at {}",
                self.buf.len(),
                self.pos
            )));
        }
        let bytes = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(bytes)
    }

    fn u8(&mut self) -> Result<u8, DatadirDecodeError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, DatadirDecodeError> {
        Ok(u16::from_be_bytes(self.take(2)?.try_into().unwrap()))
    }

    fn u32(&mut self) -> Result<u32, DatadirDecodeError> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().unwrap()))
    }

    fn u64(&mut self) -> Result<u64, DatadirDecodeError> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().unwrap()))
    }

    fn version(&mut self) -> Result<(), DatadirDecodeError> {
        match self.u8()? {
            FORMAT_VERSION => Ok(()),
            other => Err(self.error(format!("format version {other}, expected {FORMAT_VERSION}"))),
        }
    }

    /// Refuses a count of entries of at least `min_len` bytes each that the rest cannot hold.
    fn check_room(&self, count: usize, min_len: usize) -> Result<(), DatadirDecodeError> {
        let left = self.buf.len() - self.pos;
        if count.saturating_mul(min_len) > left {
            return Err(self.error(format!(
                "{count} entries cannot fit in the {left} bytes left"
            )));
        }
        Ok(())
    }

    fn finish(&self) -> Result<(), DatadirDecodeError> {
        if self.pos != self.buf.len() {
            return Err(self.error(format!(
                "{} bytes after the last entry",
                self.buf.len() - self.pos
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
