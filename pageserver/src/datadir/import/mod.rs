//! Import: a tar stream of a data directory into a timeline, as one snapshot.
//!
//! The archive is read member by member as it arrives (never buffered whole): relation
//! segments block by block, other files chunk by chunk. Each block or chunk is compared with
//! the timeline's current one and stored only if it differs or is new, so a second import of
//! the same cluster stores what changed. Everything goes through one [`Import`], which keeps
//! it invisible until its commit and drops it all on any error: a refused or interrupted import
//! stores nothing. The blocks or chunks of a member come in key order: those of a new member of
//! at least `IMPORT_RUN_MIN_BYTES`, and those an older one stores past its first
//! `IMPORT_RUN_MIN_BYTES`, are put as such ([`Import::put_in_order`]), written once, straight
//! into a layer file. Checks that need the whole archive (`pg_control`, `postmaster.pid`, the
//! cluster's identity, the snapshot's LSN) run at the end, before the commit.
//!
//! The snapshot's LSN is the `lsn` the caller gives, else, for a `pg_basebackup` archive
//! (it has a `backup_label`), the end of the WAL in its newest segment (`wal_end`), else, for
//! a stopped cluster, `pg_control`'s latest checkpoint.
//!
//! WAL segments of `pg_wal/` that PostgreSQL recycled ahead (renamed to a future name with an
//! older segment's pages, or created empty) hold no WAL: the page address in their first header
//! is not their own. They are left out, unread past that header, and counted in the report.
//!
//! # Memory
//!
//! An import holds what its archive lists, not its data: `listing.rs` keeps the paths of the
//! files and directories (each once) and the relation segments, bounded as each member arrives
//! (the entries by the file directory they make, one value of at most `max_value_size`; the
//! members by `MAX_MEMBERS`), so an archive past either is refused at that member before the
//! rest is read, and everything is dropped with the [`Importer`]. Besides that: the newest WAL
//! segment of a backup (at most [`MAX_WAL_SEGMENT_KEPT`]), one long name (at most
//! [`MAX_EXTENSION_HEADER`]), a block or chunk, and the private layer's index entry for each
//! value put through it (members under `IMPORT_RUN_MIN_BYTES`), about 55 bytes. The budget
//! this keeps to is in `docs/http-api.md` (the import's "Memory").
//!
//! Files: `member.rs` says which member types and modes are imported; `tail.rs` tells the end
//! of the archive from a cut-off one; `listing.rs` lists what the archive holds; `finish.rs`
//! checks the whole and writes the values that list it.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Read};

use bytes::Bytes;
use pageserver_api::datadir::{
    counters_key, decode_rel_dir, decode_rel_size, encode_rel_dir, encode_rel_size, file_chunk_key,
    file_dir_key, rel_dir_key, snapshot_list_key, ClusterCounters, DatadirDecodeError, EntryKind,
    FileDirectory, FileEntry, RelTag, Snapshot, SnapshotKind, SnapshotList, BLCKSZ,
    FILE_CHUNK_SIZE, RELSEG_BLOCKS,
};
use pageserver_api::{Key, Value};
use serde::Serialize;
use utils::Lsn;

use super::path::{classify, database_of_dir, normalize, DatadirPath, PathError};
use super::pg_control::{self, ControlFile, ControlFileError};
use super::wal_end::{
    is_recycled, segment_name_order, wal_end, wal_segment_start, WalEndError, PAGE_ADDR_END,
};
use crate::tenant::timeline::{Import, Timeline, TimelineError, IMPORT_RUN_MIN_BYTES};

mod finish;
mod listing;
mod member;
mod tail;

use listing::{Entry, Listing, ListingError};
use member::{member_kind, stored_mode, MemberError, MemberKind};
use tail::{TailReader, TAR_BLOCK};

/// The largest WAL segment an import keeps in memory to find a backup's end (PostgreSQL's
/// default is 16 MiB); with larger segments the caller gives the LSN.
const MAX_WAL_SEGMENT_KEPT: u64 = 64 * 1024 * 1024;

/// The largest GNU long name or pax header an import reads (paths are at most 4 KiB).
const MAX_EXTENSION_HEADER: u64 = 64 * 1024;

/// Why an import stored nothing.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The archive is not something this server imports (400).
    #[error("{0}")]
    Invalid(String),
    /// The archive contradicts the timeline: another cluster, or an LSN not above it (409).
    #[error("{0}")]
    Conflict(String),
    /// The input could not be read to its end.
    #[error("the archive could not be read: {0}")]
    Read(io::Error),
    #[error(transparent)]
    Timeline(#[from] TimelineError),
    /// The timeline holds a metadata value that does not decode.
    #[error("the timeline's stored data directory is damaged: {0}")]
    Damaged(#[from] DatadirDecodeError),
}

impl From<PathError> for ImportError {
    fn from(e: PathError) -> Self {
        ImportError::Invalid(e.to_string())
    }
}

impl From<ListingError> for ImportError {
    fn from(e: ListingError) -> Self {
        ImportError::Invalid(e.to_string())
    }
}

impl From<MemberError> for ImportError {
    fn from(e: MemberError) -> Self {
        ImportError::Invalid(e.to_string())
    }
}

impl From<ControlFileError> for ImportError {
    fn from(e: ControlFileError) -> Self {
        ImportError::Invalid(e.to_string())
    }
}

impl From<WalEndError> for ImportError {
    fn from(e: WalEndError) -> Self {
        ImportError::Invalid(e.to_string())
    }
}

/// What an import stored.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct ImportReport {
    /// The snapshot's LSN.
    pub lsn: String,
    /// `stopped` or `backup`.
    pub kind: String,
    /// Relation forks in the snapshot.
    pub relations: u64,
    pub relations_new: u64,
    pub relations_dropped: u64,
    /// Forks whose size changed (grown or truncated).
    pub relations_resized: u64,
    pub blocks_new: u64,
    pub blocks_changed: u64,
    pub blocks_unchanged: u64,
    /// Other files in the snapshot, and how many were new, changed or removed.
    pub files: u64,
    pub files_new: u64,
    pub files_changed: u64,
    pub files_removed: u64,
    pub directories: u64,
    /// Bytes of the archive read.
    pub bytes_read: u64,
    /// Bytes of versions stored (serialized, as the layers hold them).
    pub bytes_stored: u64,
    /// WAL segments of `pg_wal/` left out: segments PostgreSQL recycled ahead (renamed to a
    /// future name, or created empty), whose first page is not their own, so they hold no WAL.
    pub wal_segments_recycled: u64,
}

/// Imports the archive `input` into `timeline` as one snapshot at `lsn` (or the LSN the
/// archive says; see the module documentation).
pub fn import_archive(
    timeline: &Timeline,
    input: impl Read,
    lsn: Option<Lsn>,
) -> Result<ImportReport, ImportError> {
    import_with(timeline, input, lsn, None, None, None)
}

/// A relation segment file of a replayed directory whose archive member holds only some of its
/// blocks, the others being unchanged since the timeline's newest snapshot (see
/// [`import_replayed`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PartlyRead {
    /// Its path in the data directory.
    pub path: String,
    /// Its size there.
    pub size: u64,
    /// The blocks its member holds, in this order, numbered within the file from 0 (the
    /// member is these blocks one after the other); every other block must be one the
    /// timeline's relation holds. Empty: the archive has no member for it, and the file must
    /// be what the timeline holds of the relation.
    pub blocks: Vec<u32>,
}

/// [`import_archive`] of a directory PostgreSQL replayed to `lsn` and shut down there (a
/// background snapshot): its `pg_wal/` holds no segment, as the WAL it needs from `wal_from`
/// (its checkpoint record, or the checkpoint's redo point) on is the timeline's own (unless
/// `wal_from` is `lsn`: then it holds that WAL itself); and the cluster's counters at the
/// snapshot are given rather than taken from its `pg_control` (those page ingest followed),
/// when known. `partly_read`: relation segment files the archive holds only in part, or not
/// at all, which the caller knows unchanged since the timeline's newest snapshot but for the
/// blocks it holds (the replay wrote no others): the blocks left out are taken as stored,
/// unread, and an error says so if the timeline's relation does not have them, or if the
/// timeline is no longer at `base`, the last record LSN the caller knew it at (something
/// else was stored since, whose blocks those are not).
pub fn import_replayed(
    timeline: &Timeline,
    input: impl Read,
    lsn: Lsn,
    wal_from: Lsn,
    counters: Option<ClusterCounters>,
    (base, partly_read): (Lsn, &[PartlyRead]),
) -> Result<ImportReport, ImportError> {
    let partly_read = Some((base, partly_read));
    import_with(
        timeline,
        input,
        Some(lsn),
        Some(wal_from),
        counters,
        partly_read,
    )
}

fn import_with(
    timeline: &Timeline,
    input: impl Read,
    lsn: Option<Lsn>,
    wal_from: Option<Lsn>,
    counters: Option<ClusterCounters>,
    partly_read: Option<(Lsn, &[PartlyRead])>,
) -> Result<ImportReport, ImportError> {
    let import = timeline.begin_import()?;
    let partly_read = match partly_read {
        Some((base, files)) if !files.is_empty() && import.base_lsn() != base => {
            return Err(ImportError::Invalid(format!(
                "the timeline moved from {base} to {} since the relation files to read in part \
                 were listed",
                import.base_lsn()
            )))
        }
        Some((_, files)) => files,
        None => &[],
    };
    let mut importer = Importer::new(import, timeline.conf().max_value_size)?;
    importer.counters = counters;
    importer.wal_from = wal_from;
    importer.partly_read = partly_read.iter().map(|f| (f.path.as_str(), f)).collect();
    let mut input = TailReader::new(input);
    importer.read_archive(&mut input)?;
    importer.report.bytes_read = input.total;
    // The ones the archive has no member for.
    for file in std::mem::take(&mut importer.partly_read).into_values() {
        if !file.blocks.is_empty() {
            return Err(ImportError::Invalid(format!(
                "relation file {:?}, to be read in part, is not in the archive",
                file.path
            )));
        }
        importer.keep_unread_segment(&file.path, file.size)?;
    }
    importer.finish(lsn)
}

/// The timeline's data directory as of the import's base, and what the archive says now.
struct Importer<'t> {
    import: Import<'t>,
    old_files: FileDirectory,
    old_snapshots: Option<SnapshotList>,
    /// Every database's relation forks and their sizes at the base.
    old_rels: BTreeMap<(u32, u32), BTreeMap<(u32, u8), u32>>,
    /// Where the last member's data (with its padding) ends in the archive.
    last_member_end: u64,
    /// The archive's files, directories and relation segments so far.
    listing: Listing,
    next_id: u32,
    control: Option<ControlFile>,
    backup_label: bool,
    /// The newest WAL segment so far: its order and bytes.
    newest_wal: Option<((u64, u32), String, Vec<u8>)>,
    /// The counters to store, if not those of `pg_control`.
    counters: Option<ClusterCounters>,
    /// Where a replayed directory's WAL begins in the timeline's (see [`import_replayed`]).
    wal_from: Option<Lsn>,
    /// The relation files held in part, by path, until their member (see [`import_replayed`]).
    partly_read: BTreeMap<&'t str, &'t PartlyRead>,
    report: ImportReport,
}

impl<'t> Importer<'t> {
    /// `max_value_size`: the largest file directory the archive's entries may make.
    fn new(import: Import<'t>, max_value_size: usize) -> Result<Importer<'t>, ImportError> {
        let old_files = match import.read_current(file_dir_key())? {
            Some(bytes) => FileDirectory::decode(&bytes)?,
            None => FileDirectory {
                next_id: 1,
                entries: Vec::new(),
            },
        };
        let old_snapshots = match import.read_current(snapshot_list_key())? {
            Some(bytes) => Some(SnapshotList::decode(&bytes)?),
            None => None,
        };
        let mut old_rels = BTreeMap::new();
        for entry in &old_files.entries {
            let Some((spc, db)) = database_of_dir(&entry.path) else {
                continue;
            };
            let mut forks = BTreeMap::new();
            if let Some(bytes) = import.read_current(rel_dir_key(spc, db))? {
                for (relnode, forknum) in decode_rel_dir(&bytes)? {
                    let rel = RelTag {
                        spcnode: spc,
                        dbnode: db,
                        relnode,
                        forknum,
                    };
                    let size = match import.read_current(rel.size_key())? {
                        Some(bytes) => decode_rel_size(&bytes)?,
                        None => 0,
                    };
                    forks.insert((relnode, forknum), size);
                }
            }
            old_rels.insert((spc, db), forks);
        }
        Ok(Importer {
            next_id: old_files.next_id.max(1),
            import,
            old_files,
            old_snapshots,
            old_rels,
            last_member_end: 0,
            listing: Listing::new(max_value_size),
            control: None,
            backup_label: false,
            newest_wal: None,
            counters: None,
            wal_from: None,
            partly_read: BTreeMap::new(),
            report: ImportReport::default(),
        })
    }

    fn read_archive(&mut self, input: &mut TailReader<impl Read>) -> Result<(), ImportError> {
        let mut archive = tar::Archive::new(&mut *input);
        // Raw: GNU long names and pax headers come to us, to be read within a bound (the tar
        // reader would read them whole, whatever size the header claims).
        let entries = archive.entries().map_err(invalid_archive)?.raw(true);
        let mut long_name: Option<Vec<u8>> = None;
        for entry in entries {
            let mut entry = entry.map_err(invalid_archive)?;
            let size = entry.size();
            self.last_member_end = entry
                .raw_file_position()
                .saturating_add(size.next_multiple_of(TAR_BLOCK as u64));
            let kind = entry.header().entry_type();
            if kind.is_gnu_longname()
                || kind.is_gnu_longlink()
                || kind.is_pax_local_extensions()
                || kind.is_pax_global_extensions()
            {
                if size > MAX_EXTENSION_HEADER {
                    return Err(ImportError::Invalid(format!(
                        "an archive extension header of {size} bytes (at most \
                         {MAX_EXTENSION_HEADER})"
                    )));
                }
                if kind.is_gnu_longname() {
                    let mut name = Vec::with_capacity(size as usize);
                    entry.read_to_end(&mut name).map_err(ImportError::Read)?;
                    while name.last() == Some(&0) {
                        name.pop();
                    }
                    long_name = Some(name);
                } else if kind.is_pax_local_extensions() {
                    for extension in entry
                        .pax_extensions()
                        .map_err(invalid_archive)?
                        .into_iter()
                        .flatten()
                    {
                        let extension = extension.map_err(invalid_archive)?;
                        match extension.key() {
                            Ok("path") => long_name = Some(extension.value_bytes().to_vec()),
                            // Sizes past the header's field (files over 8 GiB): not in a data
                            // directory PostgreSQL writes.
                            Ok("size") => {
                                return Err(ImportError::Invalid(
                                    "a pax size extension: members over 8 GiB are not supported"
                                        .to_string(),
                                ))
                            }
                            _ => {}
                        }
                    }
                }
                // Link targets (refused with their member) and global headers: nothing to keep.
                continue;
            }
            let header = entry.header();
            let raw_path = long_name
                .take()
                .unwrap_or_else(|| entry.path_bytes().into_owned());
            let path = normalize(&raw_path)?;
            let mode = header.mode().map_err(invalid_archive)?;
            let mtime = header.mtime().map_err(invalid_archive)?;
            self.listing.count_member()?;
            if path == "postmaster.pid" {
                return Err(ImportError::Invalid(
                    "the archive has postmaster.pid: the cluster is running (stop it first, or \
                     import a pg_basebackup of it)"
                        .to_string(),
                ));
            }
            let member_kind = member_kind(&path, kind)?;
            let is_file = member_kind == MemberKind::File;
            match classify(&path, is_file)? {
                DatadirPath::Root => self.listing.add_root()?,
                DatadirPath::Relation { rel, segno } => {
                    // Not stored (a basebackup writes relation files 0600), but refused alike.
                    stored_mode(&path, member_kind, mode)?;
                    match self.partly_read.remove(path.as_str()) {
                        Some(file) => {
                            self.import_part_of_segment(&mut entry, file, rel, segno, size)?
                        }
                        None => {
                            self.import_relation_segment(&mut entry, &path, rel, segno, size)?
                        }
                    }
                }
                DatadirPath::Other(path) => {
                    let mode = stored_mode(&path, member_kind, mode)?;
                    if is_file {
                        self.import_file(&mut entry, path, mode, mtime, size)?
                    } else {
                        self.listing
                            .add_entry(path, Entry::directory(mode, mtime))?
                    }
                }
            }
        }
        input.check_end(self.last_member_end)
    }

    fn import_relation_segment(
        &mut self,
        data: &mut impl Read,
        path: &str,
        rel: RelTag,
        segno: u32,
        size: u64,
    ) -> Result<(), ImportError> {
        if !size.is_multiple_of(BLCKSZ as u64) || size > u64::from(RELSEG_BLOCKS) * BLCKSZ as u64 {
            return Err(ImportError::Invalid(format!(
                "relation file {path:?} is {size} bytes: not a whole number of {BLCKSZ}-byte \
                 blocks within one 1 GiB segment"
            )));
        }
        let blocks = (size / BLCKSZ as u64) as u32;
        // Checked by the path parser: segment starts fit a u32, and a segment's blocks too
        // unless it is the very last one.
        let first = segno * RELSEG_BLOCKS;
        let end = first.checked_add(blocks).ok_or_else(|| {
            ImportError::Invalid(format!("relation file {path:?} reaches past block 2^32"))
        })?;
        self.listing.add_segment(path, rel, segno, blocks)?;
        let old_size = self.old_size(&rel);
        let mut stored = run_credit(first >= old_size, size);
        let mut buf = vec![0u8; BLCKSZ];
        for blknum in first..end {
            data.read_exact(&mut buf).map_err(ImportError::Read)?;
            self.import_block(rel, blknum, old_size, &buf, &mut stored)?;
        }
        Ok(())
    }

    /// Stores block `blknum` of `rel` as `page` if it differs from the timeline's (or is past
    /// its `old_size`).
    fn import_block(
        &mut self,
        rel: RelTag,
        blknum: u32,
        old_size: u32,
        page: &[u8],
        stored: &mut u64,
    ) -> Result<(), ImportError> {
        let key = rel.block_key(blknum);
        if blknum < old_size {
            if self.import.read_current(key)?.as_deref() == Some(page) {
                self.report.blocks_unchanged += 1;
                return Ok(());
            }
            self.report.blocks_changed += 1;
        } else {
            self.report.blocks_new += 1;
        }
        let value = Value::Image(Bytes::copy_from_slice(page));
        self.put_from_member(key, &value, stored, BLCKSZ)
    }

    /// A relation segment file whose member holds only some of its blocks (see
    /// [`import_replayed`]): those are imported as any block is, and the others must be the
    /// stored relation's.
    fn import_part_of_segment(
        &mut self,
        data: &mut impl Read,
        file: &PartlyRead,
        rel: RelTag,
        segno: u32,
        member_size: u64,
    ) -> Result<(), ImportError> {
        let path = &file.path;
        let size = file.size;
        let blocks = size / BLCKSZ as u64;
        let invalid = |what: String| {
            Err(ImportError::Invalid(format!(
                "relation file {path:?} ({size} bytes), read in part: {what}"
            )))
        };
        if !size.is_multiple_of(BLCKSZ as u64) || blocks > u64::from(RELSEG_BLOCKS) {
            return invalid(format!(
                "not a whole number of {BLCKSZ}-byte blocks within one 1 GiB segment"
            ));
        }
        if member_size != file.blocks.len() as u64 * BLCKSZ as u64 {
            return invalid(format!(
                "its member is {member_size} bytes, not its {} blocks read",
                file.blocks.len()
            ));
        }
        if !file.blocks.is_sorted_by(|a, b| a < b)
            || file.blocks.last().is_some_and(|b| u64::from(*b) >= blocks)
        {
            return invalid("the blocks read are not in order within it".to_string());
        }
        let first = segno * RELSEG_BLOCKS;
        let old_size = self.old_size(&rel);
        // Every block from the first the timeline does not hold on must be read.
        let held = u64::from(old_size.saturating_sub(first)).min(blocks);
        let read_past = file
            .blocks
            .iter()
            .filter(|b| u64::from(**b) >= held)
            .count();
        if read_past as u64 != blocks - held {
            return invalid(format!(
                "blocks it leaves out are not what the timeline holds of its relation \
                 ({old_size} blocks)"
            ));
        }
        self.listing.add_segment(path, rel, segno, blocks as u32)?;
        let mut stored = 0;
        let mut buf = vec![0u8; BLCKSZ];
        for block in &file.blocks {
            let Some(blknum) = first.checked_add(*block) else {
                return invalid("it reaches past block 2^32".to_string());
            };
            data.read_exact(&mut buf).map_err(ImportError::Read)?;
            self.import_block(rel, blknum, old_size, &buf, &mut stored)?;
        }
        self.report.blocks_unchanged += blocks - file.blocks.len() as u64;
        Ok(())
    }

    /// Lists a relation segment file left out of the archive as unchanged (see
    /// [`import_replayed`]): its blocks must be the stored relation's.
    fn keep_unread_segment(&mut self, path: &str, size: u64) -> Result<(), ImportError> {
        let DatadirPath::Relation { rel, segno } = classify(path, true)? else {
            return Err(ImportError::Invalid(format!(
                "{path:?}, left out of the archive as an unchanged relation file, is not one"
            )));
        };
        let blocks = size / BLCKSZ as u64;
        let first = u64::from(segno) * u64::from(RELSEG_BLOCKS);
        let old_size = u64::from(self.old_size(&rel));
        let whole = size.is_multiple_of(BLCKSZ as u64)
            && blocks <= u64::from(RELSEG_BLOCKS)
            && first + blocks <= old_size
            && (blocks == u64::from(RELSEG_BLOCKS) || first + blocks == old_size);
        if !whole {
            return Err(ImportError::Invalid(format!(
                "relation file {path:?} ({size} bytes), left out of the archive as unchanged, \
                 is not what the timeline holds of its relation ({old_size} blocks)"
            )));
        }
        self.listing.add_segment(path, rel, segno, blocks as u32)?;
        self.report.blocks_unchanged += blocks;
        Ok(())
    }

    /// Stores a block or chunk of one member, whose keys increase: once the member has stored
    /// `IMPORT_RUN_MIN_BYTES` (counting from [`run_credit`]), in key order (straight into a
    /// run); before, in the private layer, so that a member that stores little (a small file, a
    /// few changed blocks) adds no file.
    fn put_from_member(
        &mut self,
        key: Key,
        value: &Value,
        stored: &mut u64,
        len: usize,
    ) -> Result<(), ImportError> {
        if *stored >= IMPORT_RUN_MIN_BYTES {
            self.import.put_in_order(key, value)?;
        } else {
            self.import.put(key, value)?;
        }
        *stored += len as u64;
        Ok(())
    }

    fn old_size(&self, rel: &RelTag) -> u32 {
        self.old_rels
            .get(&(rel.spcnode, rel.dbnode))
            .and_then(|forks| forks.get(&(rel.relnode, rel.forknum)))
            .copied()
            .unwrap_or(0)
    }

    fn import_file(
        &mut self,
        data: &mut impl Read,
        path: String,
        mode: u32,
        mtime: u64,
        size: u64,
    ) -> Result<(), ImportError> {
        // The first page header of a WAL segment says whether it is one PostgreSQL recycled
        // ahead: those are left out, unread (the archive skips to the next member).
        let mut head = [0u8; PAGE_ADDR_END];
        let head = match wal_segment_start(&path, size) {
            Some(start) => {
                data.read_exact(&mut head).map_err(ImportError::Read)?;
                if is_recycled(start, &head) {
                    self.listing.add_left_out(path)?;
                    self.report.wal_segments_recycled += 1;
                    return Ok(());
                }
                &head[..]
            }
            None => &[][..],
        };
        let mut data = head.chain(data);
        let old = self
            .old_files
            .get(&path)
            .filter(|e| e.kind == EntryKind::File)
            .cloned();
        let id = match &old {
            Some(old) => old.id,
            None => {
                let id = self.next_id;
                self.next_id = id.checked_add(1).ok_or_else(|| {
                    ImportError::Invalid("more files than the file directory can number".into())
                })?;
                id
            }
        };
        let chunks = size.div_ceil(FILE_CHUNK_SIZE as u64);
        if chunks > u64::from(u32::MAX) {
            return Err(ImportError::Invalid(format!(
                "file {path:?} is {size} bytes, too large to store"
            )));
        }
        let keep_control = path == pg_control::PG_CONTROL_PATH;
        let wal_order = path
            .strip_prefix("pg_wal/")
            .and_then(segment_name_order)
            .filter(|order| {
                size <= MAX_WAL_SEGMENT_KEPT
                    && self.newest_wal.as_ref().is_none_or(|(o, _, _)| order > o)
            });
        let wal_path = wal_order.map(|_| path.clone());
        if path == "backup_label" {
            self.backup_label = true;
        }
        // Listed before its data is read: a member twice is refused before it stores anything.
        self.listing
            .add_entry(path, Entry::file(mode, mtime, size, id))?;
        // Only one WAL segment is ever kept: the previous newest goes before this one is read
        // (memory stays at one segment, allocated once at its size).
        let mut kept = Vec::new();
        if wal_order.is_some() {
            self.newest_wal = None;
            kept.reserve_exact(size as usize);
        } else if keep_control {
            if size != pg_control::PG_CONTROL_FILE_SIZE as u64 {
                return Err(ControlFileError::Size(size.try_into().unwrap_or(usize::MAX)).into());
            }
            kept.reserve_exact(size as usize);
        }
        let old_chunks = old.as_ref().map_or(0, FileEntry::chunks);
        let mut changed = old
            .as_ref()
            .is_none_or(|o| o.size != size || o.mode != mode);
        let mut left = size;
        let mut stored = run_credit(old.is_none(), size);
        let mut buf = vec![0u8; FILE_CHUNK_SIZE];
        for chunk in 0..chunks as u32 {
            let n = left.min(FILE_CHUNK_SIZE as u64) as usize;
            left -= n as u64;
            data.read_exact(&mut buf[..n]).map_err(ImportError::Read)?;
            if keep_control || wal_order.is_some() {
                kept.extend_from_slice(&buf[..n]);
            }
            let key = file_chunk_key(id, chunk);
            if u64::from(chunk) < old_chunks
                && self.import.read_current(key)?.as_deref() == Some(&buf[..n])
            {
                continue;
            }
            changed = true;
            let value = Value::Image(Bytes::copy_from_slice(&buf[..n]));
            self.put_from_member(key, &value, &mut stored, n)?;
        }
        match old {
            None => self.report.files_new += 1,
            Some(_) if changed => self.report.files_changed += 1,
            Some(_) => {}
        }
        if keep_control {
            self.control = Some(pg_control::parse(&kept)?);
        }
        if let Some((order, path)) = wal_order.zip(wal_path) {
            self.newest_wal = Some((order, path, kept));
        }
        Ok(())
    }
}

/// Where a member's count of stored bytes starts: a new member of `size` at least
/// `IMPORT_RUN_MIN_BYTES` stores all of it, so it goes into a run from its first value; any
/// other starts from zero and goes there once it has stored that much.
fn run_credit(new: bool, size: u64) -> u64 {
    if new && size >= IMPORT_RUN_MIN_BYTES {
        IMPORT_RUN_MIN_BYTES
    } else {
        0
    }
}

fn invalid_archive(e: io::Error) -> ImportError {
    ImportError::Invalid(format!("the body is not a valid tar archive: {e}"))
}
