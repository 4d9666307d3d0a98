//! Basebackup: the data directory as of an LSN, written as a tar stream.
//!
//! The snapshot is the newest one at or below the LSN (the snapshot list read at that LSN);
//! everything is read at the snapshot's own LSN, so the archive is exactly what was imported
//! then. Members come in the file directory's path order (every directory before what it
//! holds), then each database's relation forks, segment by segment. Contents are read block by
//! block as the archive is written: memory stays at a block, whatever the directory's size.
//! Every value read is checked (a chunk or block of the wrong length, or a missing one, stops
//! the archive with an error rather than writing a wrong file). Members have their permission
//! bits (0777) and no owner; setuid, setgid and sticky are never written, whatever a snapshot
//! holds.

use std::io::{self, Read, Write};

use bytes::Bytes;
use pageserver_api::datadir::{
    decode_rel_dir, decode_rel_size, file_chunk_key, file_dir_key, rel_dir_key, snapshot_list_key,
    DatadirDecodeError, EntryKind, FileDirectory, RelTag, Snapshot, SnapshotList, BLCKSZ,
    FILE_CHUNK_SIZE, RELSEG_BLOCKS,
};
use pageserver_api::Key;
use utils::Lsn;

use super::path::{database_dir, database_of_dir};
use crate::tenant::timeline::{Timeline, TimelineError};

#[derive(Debug, thiserror::Error)]
pub enum BasebackupError {
    /// Nothing to give at that LSN (404).
    #[error("{0}")]
    NoSnapshot(String),
    #[error(transparent)]
    Timeline(#[from] TimelineError),
    #[error("the timeline's stored data directory is damaged: {0}")]
    Damaged(String),
    /// Writing the archive failed (the client went away).
    #[error("writing the archive failed: {0}")]
    Write(#[from] io::Error),
}

impl From<DatadirDecodeError> for BasebackupError {
    fn from(e: DatadirDecodeError) -> Self {
        BasebackupError::Damaged(e.to_string())
    }
}

/// The snapshot a basebackup at `lsn` gives: checks the LSN and finds it.
pub fn snapshot_at(timeline: &Timeline, lsn: Lsn) -> Result<Snapshot, BasebackupError> {
    // Not a wait: a later import may still land at or below such an LSN, so its answer is not
    // known yet.
    let last_record = timeline.last_record_lsn();
    if lsn > last_record {
        return Err(BasebackupError::NoSnapshot(format!(
            "LSN {lsn} is beyond the timeline's last record LSN {last_record}: which snapshot \
             it has is not known yet"
        )));
    }
    let list = timeline
        .get_page(snapshot_list_key(), lsn)?
        .ok_or_else(|| {
            BasebackupError::NoSnapshot(format!(
                "the timeline has no snapshot at or below {lsn}: import a data directory first"
            ))
        })?;
    let list = SnapshotList::decode(&list)?;
    list.at(lsn).ok_or_else(|| {
        BasebackupError::Damaged(format!(
            "the snapshot list read at {lsn} has no snapshot at or below it"
        ))
    })
}

/// WAL to replay on top of a snapshot: the LSN asked for, the end of the last record at or
/// before it (where the WAL given is cut: the rest of its segment is zeros, so a replay of
/// everything given stops exactly there), and the segment files from the snapshot to it.
#[derive(Debug)]
pub struct Replay {
    pub target: Lsn,
    pub end: Lsn,
    /// The timeline of the WAL at `end`, recovery's target timeline.
    pub tli: u32,
    /// The history files (name, contents) of that timeline's line past timeline 1.
    pub history: Vec<(String, Vec<u8>)>,
    /// Whether the WAL stored goes on past `target`.
    pub goes_on: bool,
    /// Opened when the replay was planned, so that a rename of a segment (the one being
    /// filled becomes whole) does not pull it away from the archive.
    pub segments: Vec<(String, std::fs::File)>,
}

/// The settings appended to `postgresql.auto.conf` of an archive that replays WAL.
fn recovery_settings(replay: &Replay) -> String {
    format!(
        "\n# Added by the pageserver: replay the WAL in pg_wal/, which ends at {} (the last \
         record at or before {}) on timeline {}, then promote to a new timeline. Recovery \
         needs a restore_command; this one finds nothing, as the WAL is all in pg_wal/ \
         already.\n\
         restore_command = 'false'\n\
         recovery_target_timeline = '{}'\n",
        replay.end, replay.target, replay.tli, replay.tli
    )
}

const AUTO_CONF: &str = "postgresql.auto.conf";

/// Writes the data directory of `snapshot` to `out` as a tar archive, set up to replay WAL to
/// `replay.target` if given.
pub fn write_basebackup(
    timeline: &Timeline,
    snapshot: Snapshot,
    replay: Option<&Replay>,
    out: impl Write,
) -> Result<(), BasebackupError> {
    let at = snapshot.lsn;
    let read =
        |key: Key| -> Result<Option<Bytes>, BasebackupError> { Ok(timeline.get_page(key, at)?) };
    let files = read(file_dir_key())?
        .ok_or_else(|| BasebackupError::Damaged(format!("no file directory at snapshot {at}")))?;
    let files = FileDirectory::decode(&files)?;
    // Not dropped on an error: a tar builder's drop writes the end-of-archive marker, and a
    // failed basebackup must never end like a whole one.
    let mut tar = std::mem::ManuallyDrop::new(tar::Builder::new(out));
    tar.mode(tar::HeaderMode::Complete);
    let mut databases = Vec::new();
    // The snapshot's own `postgresql.auto.conf`, when a replay appends to it.
    let mut auto_conf = None;
    for entry in &files.entries {
        let mut header = tar::Header::new_gnu();
        // The permission bits only: an import refuses or drops setuid, setgid and sticky, and
        // a snapshot stored before it did must not give them back either (restored as root,
        // its members are root's).
        header.set_mode(entry.mode & 0o777);
        header.set_mtime(entry.mtime);
        match entry.kind {
            EntryKind::Directory => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_size(0);
                tar.append_data(&mut header, format!("{}/", entry.path), io::empty())?;
                if let Some(db) = database_of_dir(&entry.path) {
                    databases.push((db, entry.mtime));
                }
            }
            EntryKind::File if replay.is_some_and(|r| replaces(r, &entry.path)) => {
                if entry.path == AUTO_CONF {
                    auto_conf = Some((
                        entry.id,
                        entry.size,
                        entry.mode,
                        entry.mtime,
                        entry.chunks(),
                    ));
                }
            }
            EntryKind::File => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(entry.size);
                let (id, size, path) = (entry.id, entry.size, entry.path.clone());
                let mut chunks = ValueReader::new(entry.chunks(), move |chunk| {
                    let expected = (size - chunk * FILE_CHUNK_SIZE as u64)
                        .min(FILE_CHUNK_SIZE as u64) as usize;
                    let value = read(file_chunk_key(id, chunk as u32))?;
                    checked_len(value, expected, || {
                        format!("chunk {chunk} of file {path:?}")
                    })
                });
                let result = tar.append_data(&mut header, &entry.path, &mut chunks);
                chunks.result(result)?;
            }
        }
    }
    if let Some(replay) = replay {
        let mut conf = Vec::new();
        let mut mode = 0o600;
        let mut mtime = 0;
        if let Some((id, size, m, t, chunks)) = auto_conf {
            for chunk in 0..chunks {
                let expected =
                    (size - chunk * FILE_CHUNK_SIZE as u64).min(FILE_CHUNK_SIZE as u64) as usize;
                let value = read(file_chunk_key(id, chunk as u32))?;
                conf.extend_from_slice(&checked_len(value, expected, || {
                    format!("chunk {chunk} of {AUTO_CONF}")
                })?);
            }
            (mode, mtime) = (m & 0o777, t);
        }
        conf.extend_from_slice(recovery_settings(replay).as_bytes());
        append_file(&mut tar, AUTO_CONF, mode, mtime, &conf)?;
        append_file(&mut tar, "recovery.signal", 0o600, mtime, b"")?;
        for (name, contents) in &replay.history {
            append_file(&mut tar, &format!("pg_wal/{name}"), 0o600, mtime, contents)?;
        }
        for (i, (name, file)) in replay.segments.iter().enumerate() {
            let len = file.metadata()?.len();
            // The last segment is given up to the replay's end, zeros after it.
            let kept = if i + 1 == replay.segments.len() {
                (replay.end.0 % len.max(1)).min(len)
            } else {
                len
            };
            let mut contents = PositionalReader { file, at: 0 }
                .take(kept)
                .chain(io::repeat(0).take(len - kept));
            let mut header = tar::Header::new_gnu();
            header.set_mode(0o600);
            header.set_mtime(mtime);
            header.set_entry_type(tar::EntryType::Regular);
            header.set_size(len);
            tar.append_data(&mut header, format!("pg_wal/{name}"), &mut contents)?;
        }
    }
    for ((spc, db), mtime) in databases {
        let Some(rels) = read(rel_dir_key(spc, db))? else {
            continue;
        };
        let dir = database_dir(spc, db);
        for (relnode, forknum) in decode_rel_dir(&rels)? {
            let rel = RelTag {
                spcnode: spc,
                dbnode: db,
                relnode,
                forknum,
            };
            let size = read(rel.size_key())?.ok_or_else(|| {
                BasebackupError::Damaged(format!("relation {rel:?} has no size at {at}"))
            })?;
            let size = decode_rel_size(&size)?;
            // A fork of no blocks is still a file; the segments after the first exist only
            // for blocks in them.
            let segments = size.div_ceil(RELSEG_BLOCKS).max(1);
            for segno in 0..segments {
                let first = segno * RELSEG_BLOCKS;
                let blocks = (size - first).min(RELSEG_BLOCKS);
                let mut header = tar::Header::new_gnu();
                header.set_mode(0o600);
                header.set_mtime(mtime);
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(u64::from(blocks) * BLCKSZ as u64);
                let mut pages = ValueReader::new(u64::from(blocks), move |i| {
                    let blknum = first + i as u32;
                    let value = read(rel.block_key(blknum))?;
                    checked_len(value, BLCKSZ, || format!("block {blknum} of {rel:?}"))
                });
                let path = format!("{dir}/{}", rel.file_name(segno));
                let result = tar.append_data(&mut header, &path, &mut pages);
                pages.result(result)?;
            }
        }
    }
    std::mem::ManuallyDrop::into_inner(tar)
        .into_inner()?
        .flush()?;
    Ok(())
}

/// Reads a shared file from its start, positionally (the file's cursor is not ours).
struct PositionalReader<'a> {
    file: &'a std::fs::File,
    at: u64,
}

impl Read for PositionalReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = std::os::unix::fs::FileExt::read_at(self.file, buf, self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}

/// Whether the replay writes a member of this path itself.
fn replaces(replay: &Replay, path: &str) -> bool {
    path == AUTO_CONF
        || path
            .strip_prefix("pg_wal/")
            .is_some_and(|name| replay.segments.iter().any(|(n, _)| n == name))
}

fn append_file<W: Write>(
    tar: &mut tar::Builder<W>,
    path: &str,
    mode: u32,
    mtime: u64,
    bytes: &[u8],
) -> io::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_mode(mode);
    header.set_mtime(mtime);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(bytes.len() as u64);
    tar.append_data(&mut header, path, bytes)
}

fn checked_len(
    value: Option<Bytes>,
    expected: usize,
    what: impl FnOnce() -> String,
) -> Result<Bytes, BasebackupError> {
    match value {
        Some(bytes) if bytes.len() == expected => Ok(bytes),
        Some(bytes) => Err(BasebackupError::Damaged(format!(
            "{} is {} bytes, expected {expected}",
            what(),
            bytes.len()
        ))),
        None => Err(BasebackupError::Damaged(format!("{} is missing", what()))),
    }
}

/// A member's contents, produced value by value as the tar writer reads them. An error of
/// ours is kept aside (the tar writer only carries `io::Error`) and returned by `result`.
struct ValueReader<F> {
    count: u64,
    next: u64,
    current: Bytes,
    produce: F,
    error: Option<BasebackupError>,
}

impl<F> ValueReader<F>
where
    F: FnMut(u64) -> Result<Bytes, BasebackupError>,
{
    fn new(count: u64, produce: F) -> ValueReader<F> {
        ValueReader {
            count,
            next: 0,
            current: Bytes::new(),
            produce,
            error: None,
        }
    }

    /// The outcome of the append that read from this reader: our error if we had one.
    fn result(self, appended: io::Result<()>) -> Result<(), BasebackupError> {
        match (self.error, appended) {
            (Some(e), _) => Err(e),
            (None, result) => Ok(result?),
        }
    }
}

impl<F> Read for ValueReader<F>
where
    F: FnMut(u64) -> Result<Bytes, BasebackupError>,
{
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            if self.next == self.count {
                return Ok(0);
            }
            match (self.produce)(self.next) {
                Ok(bytes) => self.current = bytes,
                Err(e) => {
                    let message = e.to_string();
                    self.error = Some(e);
                    return Err(io::Error::other(message));
                }
            }
            self.next += 1;
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        let _ = self.current.split_to(n);
        Ok(n)
    }
}
