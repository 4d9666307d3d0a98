//! Basebackup: the data directory as of an LSN, written as a tar stream.
//!
//! The snapshot is the newest one at or below the LSN (the snapshot list read at that LSN);
//! everything is read at the snapshot's own LSN, so the archive is exactly what was imported
//! then ([`Restore::Snapshot`]), with the WAL that takes it to the LSN when PostgreSQL replays
//! it ([`Restore::Replay`]), or only that WAL and the few files it changes, for a directory
//! that holds the snapshot already ([`Restore::ReplayOver`]); or everything is read at the LSN
//! itself, where page ingest made every page, with a shutdown checkpoint there of our making
//! ([`Restore::Materialized`], `materialize.rs`). Members come in the file directory's path
//! order (every directory before what it holds), then each database's relation forks, segment
//! by segment. Contents are read block by block as the archive is written: memory stays at a
//! block, whatever the directory's size.
//! Every value read is checked (a chunk or block of the wrong length, or a missing one, stops
//! the archive with an error rather than writing a wrong file). Members have their permission
//! bits (0777) and no owner; setuid, setgid and sticky are never written, whatever a snapshot
//! holds.

use std::io::{self, Read, Write};

use bytes::Bytes;
use pageserver_api::datadir::{
    decode_rel_dir, decode_rel_size, file_chunk_key, file_dir_key, rel_dir_key, snapshot_list_key,
    EntryKind, FileDirectory, FileEntry, RelTag, Snapshot, SnapshotList, BLCKSZ, FILE_CHUNK_SIZE,
    RELSEG_BLOCKS,
};
use pageserver_api::Key;
use utils::Lsn;

use super::archive::{append_file, PositionalReader};
pub use super::archive::{BasebackupError, Replay};
use super::checkpoint_start;
use super::materialize::Materialized;
use super::path::{database_dir, database_of_dir};
use super::pg_control::PG_CONTROL_PATH;
use super::wal_end::{is_recycled, wal_segment_start, PAGE_ADDR_END};
use crate::tenant::timeline::{Timeline, TimelineError};

/// What PostgreSQL started on the archive does.
#[derive(Clone, Copy)]
pub enum Restore<'a> {
    /// Starts from the snapshot as it was imported.
    Snapshot,
    /// Replays WAL from the snapshot to an LSN, then promotes.
    Replay(&'a Replay),
    /// Starts at an LSN with nothing to replay: the pages there, shut down there.
    Materialized(&'a Materialized),
    /// Replays as [`Restore::Replay`] does, unpacked over a directory that holds the snapshot
    /// already (the replay directory a background snapshot kept, `walreceiver/snapshots.rs`):
    /// only what a replay adds to the snapshot's files or changes in them, `pg_control` (which
    /// starts at the checkpoint record put before the snapshot's next record),
    /// `postgresql.auto.conf`, the signal files and `pg_wal/`. Only for a snapshot that starts
    /// at such a checkpoint record (a background snapshot's); for another, an error.
    ReplayOver(&'a Replay),
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

/// The settings appended to `postgresql.auto.conf` of an archive that replays WAL; with
/// `trigger`, the file whose presence promotes a standby.
fn recovery_settings(replay: &Replay, trigger: Option<&str>) -> String {
    let mut settings = format!(
        "\n# Added by the pageserver: replay the WAL in pg_wal/, which ends at {} (the last \
         record at or before {}) on timeline {}, then promote to a new timeline. Recovery \
         needs a restore_command; this one finds nothing, as the WAL is all in pg_wal/ \
         already.\n\
         restore_command = 'false'\n\
         recovery_target_timeline = '{}'\n",
        replay.end, replay.target, replay.tli, replay.tli
    );
    if let Some(trigger) = trigger {
        settings.push_str(&format!(
            "# A standby (standby.signal) that finds {trigger} once it has replayed all of \
             pg_wal/: it promotes at once and opens, and its end-of-recovery checkpoint runs \
             after that, as after pg_ctl promote. PostgreSQL removes the file.\n\
             promote_trigger_file = '{trigger}'\n"
        ));
    }
    settings
}

/// The file an archive that replays WAL promotes on, in its data directory.
pub const PROMOTE_TRIGGER_FILE: &str = "promote.trigger";

/// Whether PostgreSQL of the major version in `PG_VERSION` reads `promote_trigger_file`:
/// 12 to 15 (16 dropped it, and refuses a configuration that sets it).
fn reads_promote_trigger_file(pg_version: &[u8]) -> bool {
    let major = std::str::from_utf8(pg_version)
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok());
    major.is_some_and(|m| (12..=15).contains(&m))
}

const AUTO_CONF: &str = "postgresql.auto.conf";

/// Writes the data directory of `snapshot` to `out` as a tar archive, set up as `restore` says.
pub fn write_basebackup(
    timeline: &Timeline,
    snapshot: Snapshot,
    restore: Restore<'_>,
    out: impl Write,
) -> Result<(), BasebackupError> {
    let (replay, materialized, over) = match restore {
        Restore::Snapshot => (None, None, false),
        Restore::Replay(replay) => (Some(replay), None, false),
        Restore::Materialized(m) => (None, Some(m), false),
        Restore::ReplayOver(replay) => (Some(replay), None, true),
    };
    let at = materialized.map_or(snapshot.lsn, |m| m.at);
    // A background snapshot's replay that starts at its checkpoint record.
    let start = match replay {
        Some(replay) => checkpoint_start::plan(timeline, snapshot, replay)?,
        None => None,
    };
    if over && start.is_none() {
        return Err(BasebackupError::NotMaterialized(format!(
            "the snapshot at {} does not start at a checkpoint record put before its next \
             record: only its whole data directory replays from it",
            snapshot.lsn
        )));
    }
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
        // Over the snapshot's files: only those a replay changes.
        if over && entry.path != PG_CONTROL_PATH && entry.path != AUTO_CONF {
            continue;
        }
        let mut header = tar::Header::new_gnu();
        // The permission bits only: an import refuses or drops setuid, setgid and sticky, and
        // a snapshot stored before it did must not give them back either (restored as root,
        // its members are root's).
        header.set_mode(entry.mode & 0o777);
        header.set_mtime(entry.mtime);
        match entry.kind {
            // A replication slot's directory, left out with its state file.
            EntryKind::Directory if materialized.is_some_and(|m| m.leaves_out_dir(&entry.path)) => {
            }
            EntryKind::Directory => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_size(0);
                tar.append_data(&mut header, format!("{}/", entry.path), io::empty())?;
                if let Some(db) = database_of_dir(&entry.path) {
                    databases.push((db, entry.mtime));
                }
            }
            EntryKind::File if materialized.is_some_and(|m| m.replaces(&entry.path)) => {}
            EntryKind::File if start.is_some() && entry.path == PG_CONTROL_PATH => {
                let control = &start.as_ref().expect("matched").control;
                append_file(
                    &mut tar,
                    PG_CONTROL_PATH,
                    entry.mode & 0o777,
                    entry.mtime,
                    control,
                )?;
            }
            EntryKind::File if is_recycled_segment(entry, &read)? => {}
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
        // Where PostgreSQL can be told so, a fast promotion: recovery that ends on its own
        // (the WAL given runs out) waits for a whole checkpoint before it opens, which takes
        // longer than the replay itself (docs/benchmarks.md, *Restore with background
        // snapshots*).
        let version = match files.get("PG_VERSION") {
            Some(entry) if entry.size <= 16 => read(file_chunk_key(entry.id, 0))?,
            _ => None,
        };
        let trigger = version
            .is_some_and(|v| reads_promote_trigger_file(&v))
            .then_some(PROMOTE_TRIGGER_FILE);
        conf.extend_from_slice(recovery_settings(replay, trigger).as_bytes());
        append_file(&mut tar, AUTO_CONF, mode, mtime, &conf)?;
        match trigger {
            Some(trigger) => {
                append_file(&mut tar, "standby.signal", 0o600, mtime, b"")?;
                append_file(&mut tar, trigger, 0o600, mtime, b"")?;
            }
            None => append_file(&mut tar, "recovery.signal", 0o600, mtime, b"")?,
        }
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
            let contents = PositionalReader { file, at: 0 }
                .take(kept)
                .chain(io::repeat(0).take(len - kept));
            let mut contents = Patched {
                inner: contents,
                at: 0,
                patches: start.as_ref().map(|s| s.patches_of(i)).unwrap_or_default(),
            };
            let mut header = tar::Header::new_gnu();
            header.set_mode(0o600);
            header.set_mtime(mtime);
            header.set_entry_type(tar::EntryType::Regular);
            header.set_size(len);
            tar.append_data(&mut header, format!("pg_wal/{name}"), &mut contents)?;
        }
    }
    if let Some(m) = materialized {
        m.append_own_files(&mut tar)?;
    }
    for ((spc, db), mtime) in databases {
        let Some(rels) = read(rel_dir_key(spc, db))? else {
            continue;
        };
        let dir = database_dir(spc, db);
        let mut forks = decode_rel_dir(&rels)?;
        // Unlogged relations (those with an init fork) start empty, as after a crash: their
        // changes are in no WAL (their main fork's creation neither), so what the snapshot
        // held of them is not their state at the LSN. Their main fork is the init fork; their
        // maps go.
        let unlogged: std::collections::BTreeSet<u32> = forks
            .iter()
            .filter(|(_, fork)| materialized.is_some() && *fork == INIT_FORKNUM)
            .map(|(relnode, _)| *relnode)
            .collect();
        forks.retain(|(relnode, fork)| !unlogged.contains(relnode) || *fork == INIT_FORKNUM);
        forks.extend(unlogged.iter().map(|relnode| (*relnode, 0)));
        forks.sort_unstable();
        for (relnode, forknum) in forks {
            let file = RelTag {
                spcnode: spc,
                dbnode: db,
                relnode,
                forknum,
            };
            let rel = if unlogged.contains(&relnode) && forknum == 0 {
                RelTag {
                    forknum: INIT_FORKNUM,
                    ..file
                }
            } else {
                file
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
                    let value = match read(rel.block_key(blknum)) {
                        // A map page that would need redo: empty, which PostgreSQL reads as a
                        // map that knows nothing (no free space noted, no page all-visible).
                        Err(BasebackupError::Timeline(TimelineError::NeedsWalRedo { .. }))
                            if materialized.is_some() && is_map_fork(rel.forknum) =>
                        {
                            Some(Bytes::from_static(&[0; BLCKSZ]))
                        }
                        value => value?,
                    };
                    checked_len(value, BLCKSZ, || format!("block {blknum} of {rel:?}"))
                });
                let path = format!("{dir}/{}", file.file_name(segno));
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

/// Whether the replay writes a member of this path itself.
fn replaces(replay: &Replay, path: &str) -> bool {
    matches!(
        path,
        AUTO_CONF | "recovery.signal" | "standby.signal" | PROMOTE_TRIGGER_FILE
    ) || path
        .strip_prefix("pg_wal/")
        .is_some_and(|name| replay.segments.iter().any(|(n, _)| n == name))
}

/// Whether a stored member is a WAL segment PostgreSQL recycled ahead (`wal_end::is_recycled`):
/// an import leaves those out, but one before it did kept them (a stopped `pgbench -i -s 50`
/// cluster has 39, 624 MiB, beside the one segment it needs). Nothing reads them: they hold no
/// WAL, and a replay past the snapshot gets those names from the timeline's WAL. So the archive
/// leaves them out too.
fn is_recycled_segment(
    entry: &FileEntry,
    read: &impl Fn(Key) -> Result<Option<Bytes>, BasebackupError>,
) -> Result<bool, BasebackupError> {
    let Some(start) = wal_segment_start(&entry.path, entry.size) else {
        return Ok(false);
    };
    // A missing or short chunk is the damage the member's own read reports.
    let first = read(file_chunk_key(entry.id, 0))?;
    Ok(first
        .as_deref()
        .and_then(|b| b.get(..PAGE_ADDR_END))
        .is_some_and(|head| is_recycled(start, head.try_into().expect("the length is taken"))))
}

const INIT_FORKNUM: u8 = 3;

/// The free space map and the visibility map: hints that PostgreSQL reads as empty when a
/// page is all zeros, and that clearing never makes wrong.
fn is_map_fork(forknum: u8) -> bool {
    matches!(forknum, 1 | 2)
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

/// A member's contents with some byte ranges (offset, bytes) written over.
struct Patched<'a, R> {
    inner: R,
    at: u64,
    patches: Vec<(u64, &'a [u8])>,
}

impl<R: Read> Read for Patched<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let (from, to) = (self.at, self.at + n as u64);
        for (offset, bytes) in &self.patches {
            let (start, end) = ((*offset).max(from), (offset + bytes.len() as u64).min(to));
            if start < end {
                buf[(start - from) as usize..(end - from) as usize]
                    .copy_from_slice(&bytes[(start - offset) as usize..(end - offset) as usize]);
            }
        }
        self.at = to;
        Ok(n)
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

#[cfg(test)]
mod tests {
    use super::reads_promote_trigger_file;

    #[test]
    fn only_postgresql_12_to_15_read_a_promote_trigger_file() {
        for (version, reads) in [
            (&b"15\n"[..], true),
            (b"12\n", true),
            (b"16\n", false),
            (b"11\n", false),
            (b"9.6\n", false),
            (b"", false),
            (b"\xff", false),
        ] {
            assert_eq!(reads_promote_trigger_file(version), reads, "{version:?}");
        }
    }
}
