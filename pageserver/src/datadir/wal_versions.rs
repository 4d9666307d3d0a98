//! PostgreSQL WAL records as page versions, keyed as an import keys a data directory.
//!
//! Each record becomes versions at its end LSN (PostgreSQL's `EndRecPtr`: the end aligned to 8
//! bytes, [`DecodedRecord::end_rec_ptr`], what redo sets as `pd_lsn`: the state after the
//! record), in the key space of `pageserver_api::datadir`:
//!
//! | what the record holds | versions |
//! |---|---|
//! | a block reference with a full-page image | the image, restored (hole, compression), `pd_lsn` set to the end LSN as redo sets it |
//! | any other block reference | the record itself ([`Value::WalRecord`]), `will_init` as the reference says |
//! | a heap change that clears a page's all-visible bit (`XLH_*_ALL_VISIBLE_CLEARED`, `XLH_LOCK_ALL_FROZEN_CLEARED`) | the record, on the visibility map page of that heap block, which the record does not register |
//! | a block past a fork's size | the fork's new size, the fork in its database's relation directory, and a zero page (a `will_init` delta without patches: 4 bytes) for every block between the old end and it, as the file reads there |
//! | `XLOG_SMGR_CREATE` | the fork in its relation directory, size 0 if it had none |
//! | `XLOG_SMGR_TRUNCATE` | the sizes of the forks it truncates (main, and the visibility map and free space map as their redo computes them), and the record on the map page it clears the tail of |
//! | a transaction's commit or abort | its status and its subtransactions' on their `pg_xact/` pages (`wal_slru.rs`: deltas of the bytes changed); the relations it drops leave their directory, every fork with size 0 |
//! | `CLOG_ZEROPAGE`, `CLOG_TRUNCATE` | a new page of `pg_xact/` (and a new segment file in the file directory), segments removed |
//! | `XLOG_RELMAP_UPDATE` | the relation map file (`pg_filenode.map`), whole |
//! | multixact records | `pg_multixact/offsets/` and `members/` (`wal_multixact.rs`) |
//! | `XLOG_DBASE_CREATE_WAL_LOG`, `XLOG_DBASE_DROP` | the database's directory and `PG_VERSION`, and an empty relation directory; or its files gone and its relations unlisted |
//! | a record that moves a transaction id, OID or multixact counter (`wal_counters.rs`) | the cluster's counters |
//!
//! An image whose `BKPIMAGE_APPLY` is unset (written for `wal_consistency_checking`) is the page
//! as the primary held it right after the record: equal to what redo makes, up to what
//! PostgreSQL's masking ignores (hint bits, unused space), so it is stored as an image too.
//! That is full-image mode: with `wal_consistency_checking = 'all'` every change of a heap or
//! index page carries one. Its `pd_lsn` is set as that record's redo sets it: to the end LSN,
//! except on the heap page of `XLOG_HEAP2_VISIBLE`, which keeps its LSN unless hint bits are
//! WAL-logged (data checksums or `wal_log_hints`: [`WalVersions::set_hint_bits_logged`], and
//! `XLOG_PARAMETER_CHANGE` records).
//!
//! Not taken from records: the free space map pages that redo updates without a reference (the
//! map is a hint that PostgreSQL corrects itself). A database created
//! by copying its template's files (`XLOG_DBASE_CREATE_FILE_COPY`) is an error: its pages would
//! be the template's, which the record does not carry. So a page at any
//! LSN is exact where it is an image, while a data directory still comes from a snapshot plus
//! PostgreSQL's own replay.
//!
//! The sizes and relation directories a record changes are read once from the timeline (the
//! caller's `read`, at its last ingested LSN) and then kept here, so a stream of records into
//! one relation reads each only once.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytes::Bytes;
use pageserver_api::datadir::{
    counters_key, decode_rel_dir, decode_rel_size, encode_rel_dir, encode_rel_size, rel_dir_key,
    ClusterCounters, RelTag, DEFAULTTABLESPACE_OID, GLOBALTABLESPACE_OID,
};
use pageserver_api::ingest::PutRecord;
use pageserver_api::{Key, Value};
use postgres_wal::image::restore_page;
use postgres_wal::record::{
    parse_parts, BlockRef, RM_DBASE_ID, RM_HEAP_ID, RM_SMGR_ID, RM_XACT_ID, RM_XLOG_ID,
};
use postgres_wal::xact::{xact_end_details, XactEndDetails};
use postgres_wal::DecodedRecord;
use utils::Lsn;

use super::wal_files::u32_at;
pub use super::wal_files::ReadCurrent;
use super::wal_files::{FileChanges, Files, STATUS_ABORTED, STATUS_COMMITTED};
use super::wal_multixact::multixact_record;

/// Resource manager of `heap_xlog_*2` records (pruning, freezing, multi-inserts, ...).
pub const RM_HEAP2_ID: u8 = 9;

/// The main fork's number (the free space map's and the visibility map's follow).
pub const MAIN_FORKNUM: u8 = 0;
const FSM_FORKNUM: u8 = 1;
const VISIBILITYMAP_FORKNUM: u8 = 2;

/// Heap blocks one visibility map page covers: two bits each in a page less its header.
pub const HEAPBLOCKS_PER_VM_PAGE: u32 = (8192 - 24) * 4;
/// The most blocks a reference past a fork's end fills with zero pages: a relation segment
/// (1 GiB). PostgreSQL extends a relation a few blocks at a time; a record far past the end is
/// refused rather than made into millions of versions.
pub const MAX_ZERO_FILL: u32 = 131_072;
/// Heap blocks one free space map leaf page covers (`SlotsPerFSMPage`).
const FSM_SLOTS_PER_PAGE: u32 = (8192 - 24 - 4) - (8192 / 2 - 1);
/// Levels of the free space map's tree (`FSM_TREE_DEPTH`).
const FSM_TREE_DEPTH: u32 = 3;

/// Resource manager of `pg_xact/` records.
const RM_CLOG_ID: u8 = 3;
const CLOG_ZEROPAGE: u8 = 0x00;
const CLOG_TRUNCATE: u8 = 0x10;

/// Resource manager of `pg_multixact/` records.
const RM_MULTIXACT_ID: u8 = 6;
/// Resource manager of relation map records.
const RM_RELMAP_ID: u8 = 7;
const XLOG_RELMAP_UPDATE: u8 = 0x00;
const XLOG_DBASE_CREATE_FILE_COPY: u8 = 0x00;
const XLOG_DBASE_CREATE_WAL_LOG: u8 = 0x10;
const XLOG_DBASE_DROP: u8 = 0x20;

const XLOG_SMGR_CREATE: u8 = 0x10;
const XLOG_SMGR_TRUNCATE: u8 = 0x20;
const SMGR_TRUNCATE_HEAP: u32 = 0x0001;
const SMGR_TRUNCATE_VM: u32 = 0x0002;
const SMGR_TRUNCATE_FSM: u32 = 0x0004;

const XLOG_HEAP_OPMASK: u8 = 0x70;
const XLOG_HEAP_INSERT: u8 = 0x00;
const XLOG_HEAP_DELETE: u8 = 0x10;
const XLOG_HEAP_UPDATE: u8 = 0x20;
const XLOG_HEAP_HOT_UPDATE: u8 = 0x40;
const XLOG_HEAP_LOCK: u8 = 0x60;
const XLOG_HEAP2_VISIBLE: u8 = 0x40;
const XLOG_HEAP2_MULTI_INSERT: u8 = 0x50;
const XLOG_PARAMETER_CHANGE: u8 = 0x60;
const XLOG_HEAP2_LOCK_UPDATED: u8 = 0x60;
/// `XLH_INSERT_ALL_VISIBLE_CLEARED`, `XLH_DELETE_ALL_VISIBLE_CLEARED`,
/// `XLH_UPDATE_OLD_ALL_VISIBLE_CLEARED`, `XLH_LOCK_ALL_FROZEN_CLEARED`: all bit 0.
const XLH_CLEARED: u8 = 0x01;
const XLH_UPDATE_NEW_ALL_VISIBLE_CLEARED: u8 = 0x02;

/// What a record says, as versions: see the module documentation.
#[derive(Default)]
pub struct WalVersions {
    /// Data checksums are on: hint bits are WAL-logged whatever `wal_log_hints` says.
    checksums: bool,
    wal_log_hints: bool,
    /// Fork sizes known so far (`None`: the fork has no size: it does not exist).
    sizes: HashMap<RelTag, Option<u32>>,
    /// Relation directories known so far, by `(spcnode, dbnode)`.
    dirs: HashMap<(u32, u32), BTreeSet<(u32, u8)>>,
    /// `pg_xact/`, relation maps, database directories.
    files: Files,
    /// The cluster's counters, read once (this is their only writer), and what they are if
    /// the timeline has none yet (from its snapshot's `pg_control`).
    counters: Option<ClusterCounters>,
    initial_counters: Option<ClusterCounters>,
}

/// The versions of one record, before they are put in order.
struct RecordVersions {
    pages: BTreeMap<Key, Value>,
    sizes: BTreeSet<RelTag>,
    dirs: BTreeSet<(u32, u32)>,
    files: FileChanges,
    /// Blocks filled with zeros so far.
    zero_filled: u32,
    counters_changed: bool,
}

impl WalVersions {
    pub fn new() -> WalVersions {
        WalVersions::default()
    }

    /// Whether the cluster has data checksums and `wal_log_hints` (from its `pg_control`).
    pub fn set_hint_bits_logged(&mut self, checksums: bool, wal_log_hints: bool) {
        self.checksums = checksums;
        self.wal_log_hints = wal_log_hints;
    }

    /// The counters to start from when the timeline holds none (a snapshot imported before
    /// they were kept).
    pub fn set_initial_counters(&mut self, counters: ClusterCounters) {
        self.initial_counters = Some(counters);
    }

    /// Whether what it keeps between records has grown past its bound: put the versions made
    /// so far, then [`WalVersions::put_done`].
    pub fn should_put(&self) -> bool {
        self.files.cache_full()
    }

    /// Every version made so far is in the timeline: what is kept of it goes (read again when
    /// needed), so the caches hold what one batch touched at most.
    pub fn put_done(&mut self) {
        self.files.clear_cache();
        self.sizes.clear();
        self.dirs.clear();
    }

    /// `XLogHintBitIsNeeded()`.
    fn hint_bits_logged(&self) -> bool {
        self.checksums || self.wal_log_hints
    }

    /// Appends the versions `record` makes to `out`, all at its end LSN
    /// ([`DecodedRecord::end_rec_ptr`]); errors name the record's LSN.
    pub fn record(
        &mut self,
        record: &DecodedRecord,
        read: &mut ReadCurrent<'_>,
        out: &mut Vec<PutRecord>,
    ) -> Result<(), String> {
        let at = |e: String| format!("the WAL record at {}: {e}", record.start);
        let parts = parse_parts(&record.bytes).map_err(at)?;
        let mut versions = RecordVersions {
            pages: BTreeMap::new(),
            sizes: BTreeSet::new(),
            dirs: BTreeSet::new(),
            files: FileChanges::default(),
            zero_filled: 0,
            counters_changed: false,
        };
        let (rmid, info) = (record.header.rmid, record.header.rm_info());
        let main = &record.bytes[parts.main_data.clone()];
        if (rmid, info) == (RM_XLOG_ID, XLOG_PARAMETER_CHANGE) {
            // xl_parameter_change: six ints, then wal_log_hints.
            self.wal_log_hints = *main
                .get(24)
                .ok_or_else(|| at("a short parameter change".into()))?
                != 0;
        }
        let counters = match self.counters.as_mut() {
            Some(counters) => counters,
            None => {
                let stored = match read(counters_key())? {
                    Some(bytes) => ClusterCounters::decode(&bytes).map_err(|e| e.to_string())?,
                    // Not exact: what follows only raises them.
                    None => self.initial_counters.unwrap_or_default(),
                };
                self.counters.insert(stored)
            }
        };
        // A transaction's end, parsed once for its statuses and for the counters.
        let xact_end = match rmid {
            RM_XACT_ID => xact_end_details(record).map_err(at)?,
            _ => None,
        };
        versions.counters_changed =
            super::wal_counters::follow(counters, record, main, xact_end.as_ref()).map_err(at)?;
        // One copy of the record for every version that holds it.
        let whole = Bytes::copy_from_slice(&record.bytes);
        for block in &parts.blocks {
            let rel = rel_of(block);
            let value = match &block.image {
                Some(image) => {
                    let bytes = &record.bytes[block.image_range.clone()];
                    let mut page = restore_page(image, bytes)
                        .map_err(|e| at(format!("block {}: {e}", block.id)))?;
                    // Redo of a visibility record stamps the heap page (block 1) only when hint
                    // bits are logged; a restored image is always stamped.
                    let keeps_lsn = (rmid, info & XLOG_HEAP_OPMASK, block.id)
                        == (RM_HEAP2_ID, XLOG_HEAP2_VISIBLE, 1)
                        && !image.apply()
                        && !self.hint_bits_logged();
                    // Redo stamps no new page (`PageIsNew`: `pd_upper` 0), as it cannot tell it
                    // from a page of zeros.
                    let is_new = page[14..16] == [0, 0];
                    if !keeps_lsn && !is_new {
                        set_page_lsn(&mut page[..], record.end_rec_ptr());
                    }
                    Value::Image(Bytes::copy_from_slice(&page[..]))
                }
                None => Value::WalRecord {
                    will_init: block.will_init,
                    record: whole.clone(),
                },
            };
            // PostgreSQL registers a block once per record; a second reference adds nothing.
            versions
                .pages
                .entry(rel.block_key(block.block))
                .or_insert(value);
            self.grow(rel, block.block, read, &mut versions)
                .map_err(at)?;
        }
        for (rel, heap_block) in visibility_map_clears(rmid, info, main, &parts.blocks) {
            let vm = RelTag {
                forknum: VISIBILITYMAP_FORKNUM,
                ..rel
            };
            let vm_block = heap_block / HEAPBLOCKS_PER_VM_PAGE;
            versions
                .pages
                .entry(vm.block_key(vm_block))
                .or_insert_with(|| Value::WalRecord {
                    will_init: false,
                    record: whole.clone(),
                });
            self.grow(vm, vm_block, read, &mut versions).map_err(at)?;
        }
        match rmid {
            RM_SMGR_ID => self.smgr(info, main, &whole, read, &mut versions),
            RM_CLOG_ID => self.clog(info, main, read, &mut versions),
            RM_XACT_ID => self.xact_end(xact_end, read, &mut versions),
            RM_RELMAP_ID => self.relmap(info, main, read, &mut versions),
            RM_DBASE_ID => self.database(info, main, read, &mut versions),
            RM_MULTIXACT_ID => {
                multixact_record(&mut self.files, info, main, read, &mut versions.files)
            }
            _ => Ok(()),
        }
        .map_err(at)?;
        self.emit(record.end_rec_ptr(), versions, out);
        Ok(())
    }

    /// `XLOG_SMGR_CREATE` and `XLOG_SMGR_TRUNCATE`.
    fn smgr(
        &mut self,
        info: u8,
        main: &[u8],
        whole: &Bytes,
        read: &mut ReadCurrent<'_>,
        versions: &mut RecordVersions,
    ) -> Result<(), String> {
        match info {
            XLOG_SMGR_CREATE => {
                // xl_smgr_create: RelFileNode, then ForkNumber (int32).
                let rel = rel_at(main, 0, u32_at(main, 12)?)?;
                if self.size(rel, read)?.is_none() {
                    self.sizes.insert(rel, Some(0));
                    versions.sizes.insert(rel);
                }
                self.list(rel, read, versions)
            }
            XLOG_SMGR_TRUNCATE => {
                // xl_smgr_truncate: BlockNumber, RelFileNode, int flags.
                let blocks = u32_at(main, 0)?;
                let flags = u32_at(main, 16)?;
                let heap = rel_at(main, 4, u32::from(MAIN_FORKNUM))?;
                if flags & SMGR_TRUNCATE_HEAP != 0 {
                    self.shrink(heap, blocks, read, versions)?;
                }
                if flags & SMGR_TRUNCATE_FSM != 0 {
                    let fsm = RelTag {
                        forknum: FSM_FORKNUM,
                        ..heap
                    };
                    let (new_blocks, partial) = fsm_truncation(blocks);
                    self.truncate_map(fsm, new_blocks, partial, whole, read, versions)?;
                }
                if flags & SMGR_TRUNCATE_VM != 0 {
                    let vm = RelTag {
                        forknum: VISIBILITYMAP_FORKNUM,
                        ..heap
                    };
                    let partial = !blocks.is_multiple_of(HEAPBLOCKS_PER_VM_PAGE);
                    let new_blocks = blocks.div_ceil(HEAPBLOCKS_PER_VM_PAGE);
                    self.truncate_map(vm, new_blocks, partial, whole, read, versions)?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// `CLOG_ZEROPAGE` and `CLOG_TRUNCATE`: main data starts with the page number.
    fn clog(
        &mut self,
        info: u8,
        main: &[u8],
        read: &mut ReadCurrent<'_>,
        versions: &mut RecordVersions,
    ) -> Result<(), String> {
        let page = u32_at(main, 0)?;
        match info {
            CLOG_ZEROPAGE => self.files.zero_xact_page(page, read, &mut versions.files),
            CLOG_TRUNCATE => self.files.truncate_xact(page, read, &mut versions.files),
            _ => Ok(()),
        }
    }

    /// `XLOG_RELMAP_UPDATE`: the new contents of a relation map file.
    fn relmap(
        &mut self,
        info: u8,
        main: &[u8],
        read: &mut ReadCurrent<'_>,
        versions: &mut RecordVersions,
    ) -> Result<(), String> {
        if info != XLOG_RELMAP_UPDATE {
            return Ok(());
        }
        // xl_relmap_update: dbid, tsid, nbytes, then the file.
        let (dbid, tsid, len) = (u32_at(main, 0)?, u32_at(main, 4)?, u32_at(main, 8)?);
        let contents = main
            .get(12..)
            .filter(|rest| rest.len() == len as usize)
            .ok_or_else(|| {
                format!(
                    "a relation map update of {len} bytes in {} bytes",
                    main.len()
                )
            })?;
        let path = database_path(tsid, dbid)?;
        self.files.write_small_file(
            &format!("{path}/pg_filenode.map"),
            contents,
            0o600,
            read,
            &mut versions.files,
        )
    }

    /// Databases created (their directory and `PG_VERSION`, an empty relation directory) and
    /// dropped (their files, and every relation of their directory).
    fn database(
        &mut self,
        info: u8,
        main: &[u8],
        read: &mut ReadCurrent<'_>,
        versions: &mut RecordVersions,
    ) -> Result<(), String> {
        match info {
            XLOG_DBASE_CREATE_FILE_COPY => Err(
                "CREATE DATABASE with STRATEGY FILE_COPY (a copy of the template's files) is not \
                 taken into pages: create databases with the default WAL_LOG strategy"
                    .to_owned(),
            ),
            XLOG_DBASE_CREATE_WAL_LOG => {
                // xl_dbase_create_wal_log_rec: db_id, tablespace_id.
                let (dbid, tsid) = (u32_at(main, 0)?, u32_at(main, 4)?);
                let path = database_path(tsid, dbid)?;
                let version = self
                    .files
                    .read_small_file("PG_VERSION", read)?
                    .ok_or("the timeline has no PG_VERSION")?;
                self.files.add_directory(&path, read, &mut versions.files)?;
                self.files.write_small_file(
                    &format!("{path}/PG_VERSION"),
                    &version,
                    0o600,
                    read,
                    &mut versions.files,
                )?;
                self.dir(tsid, dbid, read)?;
                versions.dirs.insert((tsid, dbid));
                Ok(())
            }
            XLOG_DBASE_DROP => {
                // xl_dbase_drop_rec: db_id, ntablespaces, tablespace_ids[].
                let (dbid, count) = (u32_at(main, 0)?, u32_at(main, 4)?);
                for i in 0..count as usize {
                    let tsid = u32_at(main, 8 + 4 * i)?;
                    let path = database_path(tsid, dbid)?;
                    self.files.remove_tree(&path, read, &mut versions.files)?;
                    let rels: BTreeSet<u32> = self
                        .dir(tsid, dbid, read)?
                        .iter()
                        .map(|(rel, _)| *rel)
                        .collect();
                    for rel in rels {
                        self.unlist(tsid, dbid, rel, read, versions)?;
                    }
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// A commit or an abort: the statuses it sets, the relations it drops.
    fn xact_end(
        &mut self,
        end: Option<XactEndDetails>,
        read: &mut ReadCurrent<'_>,
        versions: &mut RecordVersions,
    ) -> Result<(), String> {
        let Some(end) = end else {
            return Ok(());
        };
        let status = if end.kind.is_commit() {
            STATUS_COMMITTED
        } else {
            STATUS_ABORTED
        };
        let xids = std::iter::once(end.xid).chain(end.subxacts.iter().copied());
        self.files
            .set_xact_status(xids, status, read, &mut versions.files)?;
        for (spcnode, dbnode, relnode) in end.dropped {
            self.unlist(spcnode, dbnode, relnode, read, versions)?;
        }
        Ok(())
    }

    /// Every fork of relation `relnode` leaves its directory, with size 0.
    fn unlist(
        &mut self,
        spcnode: u32,
        dbnode: u32,
        relnode: u32,
        read: &mut ReadCurrent<'_>,
        versions: &mut RecordVersions,
    ) -> Result<(), String> {
        let dir = self.dir(spcnode, dbnode, read)?;
        let forks: Vec<u8> = dir
            .range((relnode, 0)..=(relnode, u8::MAX))
            .map(|(_, fork)| *fork)
            .collect();
        if forks.is_empty() {
            return Ok(());
        }
        dir.retain(|(rel, _)| *rel != relnode);
        versions.dirs.insert((spcnode, dbnode));
        for forknum in forks {
            let rel = RelTag {
                spcnode,
                dbnode,
                relnode,
                forknum,
            };
            self.sizes.insert(rel, Some(0));
            versions.sizes.insert(rel);
        }
        Ok(())
    }

    /// A map fork truncated to `new_blocks`, its last page's tail cleared by redo if
    /// `partial` (only if the fork exists, as redo checks).
    fn truncate_map(
        &mut self,
        map: RelTag,
        new_blocks: u32,
        partial: bool,
        whole: &Bytes,
        read: &mut ReadCurrent<'_>,
        versions: &mut RecordVersions,
    ) -> Result<(), String> {
        let Some(size) = self.size(map, read)? else {
            return Ok(());
        };
        if partial && new_blocks > 0 && new_blocks <= size {
            versions
                .pages
                .entry(map.block_key(new_blocks - 1))
                .or_insert_with(|| Value::WalRecord {
                    will_init: false,
                    record: whole.clone(),
                });
        }
        self.shrink(map, new_blocks, read, versions)
    }

    /// `rel` holds at least `block + 1` blocks, and is listed; blocks skipped over read as
    /// zeros, as a file extended past them does.
    fn grow(
        &mut self,
        rel: RelTag,
        block: u32,
        read: &mut ReadCurrent<'_>,
        versions: &mut RecordVersions,
    ) -> Result<(), String> {
        let needed = block.checked_add(1).ok_or("block number 0xFFFFFFFF")?;
        let size = self.size(rel, read)?.unwrap_or(0);
        if needed > size {
            versions.zero_filled += block - size;
            if versions.zero_filled > MAX_ZERO_FILL {
                return Err(format!(
                    "block {block} of relation {}/{}/{} fork {} is {} blocks past its end \
                     (at most {MAX_ZERO_FILL} are filled with zeros, for all of a record's blocks)",
                    rel.spcnode,
                    rel.dbnode,
                    rel.relnode,
                    rel.forknum,
                    block - size
                ));
            }
            for gap in size..block {
                versions
                    .pages
                    .entry(rel.block_key(gap))
                    .or_insert_with(zero_page);
            }
            self.sizes.insert(rel, Some(needed));
            versions.sizes.insert(rel);
        }
        self.list(rel, read, versions)
    }

    /// `rel` holds at most `blocks` blocks.
    fn shrink(
        &mut self,
        rel: RelTag,
        blocks: u32,
        read: &mut ReadCurrent<'_>,
        versions: &mut RecordVersions,
    ) -> Result<(), String> {
        if let Some(size) = self.size(rel, read)? {
            if size > blocks {
                self.sizes.insert(rel, Some(blocks));
                versions.sizes.insert(rel);
            }
        }
        Ok(())
    }

    /// `rel` is in its database's relation directory.
    fn list(
        &mut self,
        rel: RelTag,
        read: &mut ReadCurrent<'_>,
        versions: &mut RecordVersions,
    ) -> Result<(), String> {
        if self
            .dir(rel.spcnode, rel.dbnode, read)?
            .insert((rel.relnode, rel.forknum))
        {
            versions.dirs.insert((rel.spcnode, rel.dbnode));
        }
        Ok(())
    }

    /// The relation directory of database `dbnode` in `spcnode`, read once.
    fn dir(
        &mut self,
        spcnode: u32,
        dbnode: u32,
        read: &mut ReadCurrent<'_>,
    ) -> Result<&mut BTreeSet<(u32, u8)>, String> {
        Ok(match self.dirs.entry((spcnode, dbnode)) {
            std::collections::hash_map::Entry::Occupied(known) => known.into_mut(),
            std::collections::hash_map::Entry::Vacant(unknown) => {
                let listed = match read(rel_dir_key(spcnode, dbnode))? {
                    Some(bytes) => decode_rel_dir(&bytes).map_err(|e| e.to_string())?,
                    None => Vec::new(),
                };
                unknown.insert(listed.into_iter().collect())
            }
        })
    }

    fn size(&mut self, rel: RelTag, read: &mut ReadCurrent<'_>) -> Result<Option<u32>, String> {
        if let Some(size) = self.sizes.get(&rel) {
            return Ok(*size);
        }
        let size = match read(rel.size_key())? {
            Some(bytes) => Some(decode_rel_size(&bytes).map_err(|e| e.to_string())?),
            None => None,
        };
        self.sizes.insert(rel, size);
        Ok(size)
    }

    /// The record's versions, in key order, at `lsn`.
    fn emit(&self, lsn: Lsn, versions: RecordVersions, out: &mut Vec<PutRecord>) {
        let mut all: BTreeMap<Key, Value> = versions.pages;
        for rel in versions.sizes {
            if let Some(Some(size)) = self.sizes.get(&rel) {
                all.insert(rel.size_key(), Value::Image(encode_rel_size(*size).into()));
            }
        }
        for db in versions.dirs {
            if let Some(dir) = self.dirs.get(&db) {
                let listed: Vec<(u32, u8)> = dir.iter().copied().collect();
                all.insert(
                    rel_dir_key(db.0, db.1),
                    Value::Image(encode_rel_dir(&listed).into()),
                );
            }
        }
        self.files.versions(versions.files, &mut all);
        if let Some(counters) = self.counters.filter(|_| versions.counters_changed) {
            all.insert(counters_key(), Value::Image(counters.encode().into()));
        }
        out.extend(
            all.into_iter()
                .map(|(key, value)| PutRecord { key, lsn, value }),
        );
    }
}

/// A page of zeros: a `will_init` delta with no patches.
fn zero_page() -> Value {
    Value::Delta {
        will_init: true,
        patches: Vec::new(),
    }
}

/// The directory of database `dbid` in tablespace `tsid` (`global` for the shared catalog).
fn database_path(tsid: u32, dbid: u32) -> Result<String, String> {
    match (tsid, dbid) {
        (GLOBALTABLESPACE_OID, 0) => Ok("global".to_owned()),
        (DEFAULTTABLESPACE_OID, dbid) if dbid != 0 => Ok(format!("base/{dbid}")),
        _ => Err(format!(
            "database {dbid} in tablespace {tsid}: only pg_default and pg_global are supported"
        )),
    }
}

fn rel_of(block: &BlockRef) -> RelTag {
    RelTag {
        spcnode: block.rel.spcnode,
        dbnode: block.rel.dbnode,
        relnode: block.rel.relnode,
        forknum: block.fork,
    }
}

/// Sets a page's `pd_lsn` (its first 8 bytes: the high and the low half, each little-endian).
pub fn set_page_lsn(page: &mut [u8], lsn: Lsn) {
    page[0..4].copy_from_slice(&((lsn.0 >> 32) as u32).to_le_bytes());
    page[4..8].copy_from_slice(&(lsn.0 as u32).to_le_bytes());
}

/// The `RelFileNode` at `at` of `main`, with fork `fork`.
fn rel_at(main: &[u8], at: usize, fork: u32) -> Result<RelTag, String> {
    let forknum = u8::try_from(fork)
        .ok()
        .filter(|f| *f <= 3)
        .ok_or_else(|| format!("fork number {fork}"))?;
    Ok(RelTag {
        spcnode: u32_at(main, at)?,
        dbnode: u32_at(main, at + 4)?,
        relnode: u32_at(main, at + 8)?,
        forknum,
    })
}

/// The heap blocks whose all-visible (or all-frozen) bit a heap record clears in the
/// visibility map without registering the map's page: `(heap fork, block)`.
pub fn visibility_map_clears(
    rmid: u8,
    info: u8,
    main: &[u8],
    blocks: &[BlockRef],
) -> Vec<(RelTag, u32)> {
    let flag = |at: usize| main.get(at).copied().unwrap_or(0);
    let block = |id: u8| {
        blocks
            .iter()
            .find(|b| b.id == id)
            .map(|b| (rel_of(b), b.block))
    };
    let mut cleared = Vec::new();
    let op = info & XLOG_HEAP_OPMASK;
    match (rmid, op) {
        // xl_heap_insert: offnum (2), flags.
        (RM_HEAP_ID, XLOG_HEAP_INSERT) if flag(2) & XLH_CLEARED != 0 => cleared.extend(block(0)),
        // xl_heap_delete, xl_heap_lock: xid (4), offnum (2), infobits (1), flags.
        (RM_HEAP_ID, XLOG_HEAP_DELETE | XLOG_HEAP_LOCK) if flag(7) & XLH_CLEARED != 0 => {
            cleared.extend(block(0))
        }
        // xl_heap_update: old_xmax (4), old_offnum (2), old_infobits (1), flags. The new
        // tuple's page is block 0, the old one's block 1 (or block 0 if the same page).
        (RM_HEAP_ID, XLOG_HEAP_UPDATE | XLOG_HEAP_HOT_UPDATE) => {
            if flag(7) & XLH_CLEARED != 0 {
                cleared.extend(block(1).or_else(|| block(0)));
            }
            if flag(7) & XLH_UPDATE_NEW_ALL_VISIBLE_CLEARED != 0 {
                cleared.extend(block(0));
            }
        }
        // xl_heap_multi_insert: flags first.
        (RM_HEAP2_ID, XLOG_HEAP2_MULTI_INSERT) if flag(0) & XLH_CLEARED != 0 => {
            cleared.extend(block(0))
        }
        // xl_heap_lock_updated: xmax (4), offnum (2), infobits (1), flags.
        (RM_HEAP2_ID, XLOG_HEAP2_LOCK_UPDATED) if flag(7) & XLH_CLEARED != 0 => {
            cleared.extend(block(0))
        }
        _ => {}
    }
    cleared.retain(|(rel, _)| rel.forknum == MAIN_FORKNUM);
    cleared
}

/// The free space map's size after its heap is truncated to `heap_blocks`, and whether redo
/// clears the tail of its last page (`FreeSpaceMapPrepareTruncateRel`).
fn fsm_truncation(heap_blocks: u32) -> (u32, bool) {
    let logical_page = heap_blocks / FSM_SLOTS_PER_PAGE;
    let slot = heap_blocks % FSM_SLOTS_PER_PAGE;
    let physical = fsm_leaf_physical_block(logical_page);
    if slot > 0 {
        (physical + 1, true)
    } else {
        (physical, false)
    }
}

/// The physical block of leaf page `logical` of the free space map
/// (`fsm_logical_to_physical` at the bottom level): the leaves come after the upper pages
/// that lead to them.
fn fsm_leaf_physical_block(logical: u32) -> u32 {
    let mut leaf = u64::from(logical);
    let mut pages = 0u64;
    for _ in 0..FSM_TREE_DEPTH {
        pages += leaf + 1;
        leaf /= u64::from(FSM_SLOTS_PER_PAGE);
    }
    u32::try_from(pages - 1).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests;
