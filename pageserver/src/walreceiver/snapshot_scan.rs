//! The stored WAL from a snapshot decoded up to where the next one goes: the record the next
//! snapshot ends with (page ingest stops before it), where the one after it starts (the
//! replay stops there), the cluster's counters, and how many prepared transactions the
//! primary allowed on the way (`snapshots.rs`).
//!
//! The counters are followed record by record as redo moves them (`wal_counters::follow`),
//! from where the snapshot's are what PostgreSQL's would be after replaying to it: the
//! snapshot's LSN, or (for a backup, or a directory not shut down by a primary, whose
//! counters are those of the checkpoint it starts from) that checkpoint's redo point. A
//! restore from the next snapshot starts right at it with these counters, replaying none of
//! the WAL that would have moved them.
//!
//! It also lists what of the relations' files the replay may write ([`Touched`]): the main-fork
//! blocks block references name, and every fork of a relation named otherwise. The import
//! reads only those of the replayed directory (`snapshot_reads.rs`).
//!
//! Memory: a chunk of WAL, one record (whole for the records whose main data moves the
//! counters, as page ingest keeps them; the header alone for others past that), a set of
//! relations (at most the cluster's) and at most [`MAX_NAMED_BLOCKS`] block numbers.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use pageserver_api::datadir::ClusterCounters;
use postgres_wal::edit::next_record_start;
use postgres_wal::page::LONG_HEADER_LEN;
use postgres_wal::record::{
    parse_parts, RecordParts, RM_DBASE_ID, RM_SMGR_ID, RM_XACT_ID, RM_XLOG_ID,
    XLOG_CHECKPOINT_ONLINE, XLOG_CHECKPOINT_SHUTDOWN, XLOG_PARAMETER_CHANGE, XLOG_SWITCH,
};
use postgres_wal::xact::xact_end_details;
use postgres_wal::{DecodedRecord, WalDecoder, XLOG_BLCKSZ};
use utils::Lsn;

use super::page_ingest::{MAX_RECORD_LEN, MAX_XACT_RECORD_LEN};
use super::wal_reader::WalReader;
use crate::datadir::wal_counters::follow;
use crate::datadir::wal_versions::MAIN_FORKNUM;

/// WAL decoded per step (the thread looks at its stop flag between steps).
const SCAN_CHUNK: u64 = 4 << 20;

/// The resource managers whose records' main data moves the counters: XLOG, transactions,
/// `pg_xact`, multixacts, standby.
const COUNTER_RMGRS: [u8; 5] = [0, 1, 3, 6, 8];
const RM_STANDBY_ID: u8 = 8;
const RM_TBLSPC_ID: u8 = 5;
const XLOG_RUNNING_XACTS: u8 = 0x10;

/// Where the next snapshot goes: at the end of the first record starting at or past where
/// page ingest is held, which page ingest stops before.
#[derive(Debug)]
pub(super) struct Target {
    /// The snapshot's LSN: the end of that record (aligned, as PostgreSQL's `EndRecPtr`).
    pub end: Lsn,
    /// Where that record starts.
    pub last_start: Lsn,
    /// The end of the record before it, where page ingest stops (or the snapshot before).
    pub ingest_to: Lsn,
    /// Where the record after it starts (or will): the replay stops before it.
    pub next: Lsn,
    /// The counters at `end`.
    pub counters: ClusterCounters,
    /// A transaction id no transaction running at `end` is older than (a checkpoint's
    /// `oldestActiveXid`).
    pub oldest_active_xid: u32,
    /// The most prepared transactions the primary allowed in the WAL before it (its
    /// parameter-change records): the replay needs as many slots.
    pub max_prepared_xacts: u32,
    /// What the WAL from the snapshot to `end` names of the relations' files.
    pub touched: Touched,
    /// That snapshot's LSN.
    pub scanned_from: Lsn,
}

/// What the WAL after a snapshot names of the relations' files, so what the replay may write
/// there: per relation (tablespace, database, relfilenode), the main-fork blocks its block
/// references name; every fork of a relation a record names in another fork (the visibility
/// map and free space map pages redo changes without a reference are forks of the relation
/// whose heap block a record names) or in an smgr record (a fork created, a relation
/// truncated) is written anywhere. Everything is, after a record too long to read its block
/// references, or a database or tablespace record.
///
/// Memory: the relations (at most the cluster's) and at most [`MAX_NAMED_BLOCKS`] block
/// numbers; past those, the relations they were of are taken as written anywhere.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Touched {
    pub all: bool,
    /// Every relation named, in any fork or an smgr record.
    pub relations: BTreeSet<(u32, u32, u32)>,
    /// The main-fork blocks named, of the relations not in `anywhere`.
    main_blocks: BTreeMap<(u32, u32, u32), BTreeSet<u32>>,
    /// The relations whose main fork may be written anywhere.
    anywhere: BTreeSet<(u32, u32, u32)>,
    blocks: usize,
}

/// The most main-fork block numbers a [`Touched`] keeps (about 8 MiB of them; 8 GiB of pages,
/// past what the default `snapshot_wal_distance` of WAL names).
pub(super) const MAX_NAMED_BLOCKS: usize = 1 << 20;

/// What the WAL names of one relation fork (see [`Touched`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Named<'a> {
    /// Nothing: the replay writes none of its blocks.
    Nothing,
    /// These blocks of it only (the relation's numbers); those past its size before too.
    Blocks(&'a BTreeSet<u32>),
    /// It may be written anywhere.
    Anywhere,
}

const NO_BLOCKS: &BTreeSet<u32> = &BTreeSet::new();

impl Touched {
    /// What the WAL names of fork `fork` of relation (`spc`, `db`, `rel`).
    pub fn named(&self, spc: u32, db: u32, rel: u32, fork: u8) -> Named<'_> {
        let r = (spc, db, rel);
        if self.all || (self.relations.contains(&r) && fork != MAIN_FORKNUM) {
            return Named::Anywhere;
        }
        if !self.relations.contains(&r) {
            return Named::Nothing;
        }
        if self.anywhere.contains(&r) {
            return Named::Anywhere;
        }
        Named::Blocks(self.main_blocks.get(&r).unwrap_or(NO_BLOCKS))
    }

    fn note(&mut self, record: &DecodedRecord, parts: Option<&RecordParts>) {
        let Some(parts) = parts else {
            self.all = true;
            return;
        };
        // A database or tablespace created or dropped: a database's files copied from its
        // template at a path an earlier one's had (its OID used again) would otherwise be
        // taken for those.
        if [RM_DBASE_ID, RM_TBLSPC_ID].contains(&record.header.rmid) {
            self.all = true;
            return;
        }
        for block in &parts.blocks {
            let r = (block.rel.spcnode, block.rel.dbnode, block.rel.relnode);
            self.relations.insert(r);
            let named_already = || {
                self.main_blocks
                    .get(&r)
                    .is_some_and(|b| b.contains(&block.block))
            };
            if block.fork == MAIN_FORKNUM && !self.anywhere.contains(&r) && !named_already() {
                if self.blocks >= MAX_NAMED_BLOCKS {
                    self.all_blocks_anywhere();
                    self.anywhere.insert(r);
                } else if self.main_blocks.entry(r).or_default().insert(block.block) {
                    self.blocks += 1;
                }
            }
        }
        if record.header.rmid == RM_SMGR_ID {
            // xl_smgr_create: the RelFileNode first; xl_smgr_truncate: after the block
            // number. An smgr record of another layout: every relation.
            let main = &record.bytes[parts.main_data.clone()];
            let at = match record.header.rm_info() {
                XLOG_SMGR_CREATE => 0,
                XLOG_SMGR_TRUNCATE => 4,
                _ => {
                    self.all = true;
                    return;
                }
            };
            match main.get(at..at + 12) {
                Some(node) => {
                    let u32_at =
                        |i: usize| u32::from_le_bytes(node[i..i + 4].try_into().expect("4 bytes"));
                    let r = (u32_at(0), u32_at(4), u32_at(8));
                    self.relations.insert(r);
                    self.anywhere.insert(r);
                    if let Some(blocks) = self.main_blocks.remove(&r) {
                        self.blocks -= blocks.len();
                    }
                }
                None => self.all = true,
            }
        }
    }

    /// Past [`MAX_NAMED_BLOCKS`]: every relation with blocks named is taken as written
    /// anywhere, and their block numbers go.
    fn all_blocks_anywhere(&mut self) {
        self.anywhere.extend(self.main_blocks.keys().copied());
        self.main_blocks.clear();
        self.blocks = 0;
    }
}

const XLOG_SMGR_CREATE: u8 = 0x10;
const XLOG_SMGR_TRUNCATE: u8 = 0x20;

/// A decoding of the stored WAL from a snapshot on.
pub(super) struct Scan {
    /// The snapshot it started from.
    pub snapshot: Lsn,
    segment_size: u32,
    decoder: WalDecoder,
    reader: WalReader,
    fed: Lsn,
    /// Records ending at or before this are skipped: the counters are those there.
    counters_from: Lsn,
    counters: ClusterCounters,
    /// No transaction running is older: the newest running-transactions record's or online
    /// checkpoint's, or the next id after a shutdown checkpoint.
    oldest_active_xid: u32,
    /// The end of the last record decoded.
    last_end: Lsn,
    max_prepared_xacts: u32,
    touched: Touched,
}

impl Scan {
    /// A scan for the snapshot after the one at `snapshot`, whose counters are `counters`
    /// as at `counters_from`, and no transaction running there older than
    /// `oldest_active_xid`.
    pub fn new(
        snapshot: Lsn,
        counters_from: Lsn,
        counters: ClusterCounters,
        oldest_active_xid: u32,
        segment_size: u32,
    ) -> Scan {
        // From the WAL page `counters_from` is on, whose header says where its first record
        // starts; from the page before if it is a page's start (after an `XLOG_SWITCH` ending
        // there, the pages after are padding without headers), as page ingest does.
        let mut start = Lsn(counters_from.0 - counters_from.0 % XLOG_BLCKSZ as u64);
        if start == counters_from && !start.0.is_multiple_of(u64::from(segment_size)) {
            start = Lsn(start.0 - XLOG_BLCKSZ as u64);
        }
        Scan {
            snapshot,
            segment_size,
            decoder: WalDecoder::new(start, segment_size)
                .keeping_records_up_to(MAX_RECORD_LEN)
                .keeping_records_of(RM_XACT_ID, MAX_XACT_RECORD_LEN),
            reader: WalReader::new(segment_size),
            fed: start,
            counters_from,
            counters,
            oldest_active_xid,
            last_end: snapshot,
            max_prepared_xacts: 0,
            touched: Touched::default(),
        }
    }

    /// Decodes up to [`SCAN_CHUNK`] more of the WAL stored up to `flushed`: the target, once
    /// a record starting at or past `from` (past the snapshot) is there.
    pub fn step(
        &mut self,
        timeline_dir: &Path,
        flushed: Lsn,
        from: Lsn,
    ) -> Result<Option<Target>, String> {
        let bytes = self
            .reader
            .read(timeline_dir, self.fed, flushed, SCAN_CHUNK)?;
        self.decoder.feed(&bytes);
        self.fed = Lsn(self.fed.0 + bytes.len() as u64);
        while let Some(record) = self.decoder.next_record().map_err(|e| e.to_string())? {
            let end = record.end_rec_ptr();
            if end <= self.counters_from {
                continue;
            }
            let whole = record.bytes.len() == record.header.tot_len as usize;
            let parts = whole
                .then(|| parse_parts(&record.bytes))
                .transpose()
                .map_err(|e| format!("the record at {}: {e}", record.start))?;
            self.follow(&record, parts.as_ref())?;
            if end > self.snapshot {
                self.touched.note(&record, parts.as_ref());
            }
            if record.start >= from && end > self.snapshot {
                return Ok(Some(Target {
                    end,
                    last_start: record.start,
                    ingest_to: self.last_end.max(self.snapshot),
                    next: self.after(&record),
                    counters: self.counters,
                    oldest_active_xid: self.oldest_active_xid,
                    max_prepared_xacts: self.max_prepared_xacts,
                    touched: std::mem::take(&mut self.touched),
                    scanned_from: self.snapshot,
                }));
            }
            self.last_end = end;
        }
        Ok(None)
    }

    /// Where the record after `record` starts: past the rest of the segment after a switch.
    fn after(&self, record: &DecodedRecord) -> Lsn {
        let is_switch = record.header.rmid == RM_XLOG_ID && record.header.rm_info() == XLOG_SWITCH;
        if is_switch {
            let segment = u64::from(self.segment_size);
            Lsn(record.end.0.next_multiple_of(segment) + LONG_HEADER_LEN as u64)
        } else {
            next_record_start(record.end, self.segment_size)
        }
    }

    /// Follows the counters through `record` (`parts`: its parts, when it is whole).
    fn follow(
        &mut self,
        record: &DecodedRecord,
        parts: Option<&RecordParts>,
    ) -> Result<(), String> {
        let at = |e: String| format!("the record at {}: {e}", record.start);
        let main = if let Some(parts) = parts {
            &record.bytes[parts.main_data.clone()]
        } else if COUNTER_RMGRS.contains(&record.header.rmid) {
            return Err(at(format!(
                "{} bytes, longer than is read",
                record.header.tot_len
            )));
        } else {
            // Only its transaction id moves the counters.
            &[][..]
        };
        if record.header.rmid == RM_XLOG_ID && record.header.rm_info() == XLOG_PARAMETER_CHANGE {
            // xl_parameter_change: four `int`s, max_prepared_xacts the fourth.
            let slots = main
                .get(12..16)
                .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
                .ok_or_else(|| at("a parameter change too short".to_owned()))?;
            self.max_prepared_xacts = self.max_prepared_xacts.max(slots);
        }
        let xact_end = match record.header.rmid {
            RM_XACT_ID => xact_end_details(record)?,
            _ => None,
        };
        follow(&mut self.counters, record, main, xact_end.as_ref()).map_err(at)?;
        let info = record.header.rm_info();
        let u32_at = |off: usize| {
            main.get(off..off + 4)
                .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
                .ok_or_else(|| at(format!("{} bytes of main data", main.len())))
        };
        match (record.header.rmid, info) {
            // xl_running_xacts: xcnt, subxcnt, subxid_overflow (padded to 4), nextXid,
            // oldestRunningXid.
            (RM_STANDBY_ID, XLOG_RUNNING_XACTS) => self.oldest_active_xid = u32_at(16)?,
            (RM_XLOG_ID, XLOG_CHECKPOINT_ONLINE) => {
                // CheckPoint's oldestActiveXid, its last field but the padding.
                self.oldest_active_xid = u32_at(80)?;
            }
            (RM_XLOG_ID, XLOG_CHECKPOINT_SHUTDOWN) => {
                self.oldest_active_xid = self.counters.next_xid as u32;
            }
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use postgres_wal::record::{BlockRef, RelFileNode};
    use postgres_wal::synthetic::WalBuilder;

    const SEGMENT: u32 = 1 << 20;

    use crate::datadir::wal_counters::sample_counters as counters;

    /// A timeline directory storing `wal` (from a segment's start), and the WAL's records.
    fn stored(wal: &WalBuilder) -> (tempfile::TempDir, Vec<DecodedRecord>) {
        let dir = tempfile::tempdir().unwrap();
        let wal_dir = dir.path().join(super::super::wal_store::WAL_DIR);
        std::fs::create_dir_all(&wal_dir).unwrap();
        for (i, chunk) in wal.bytes().chunks(SEGMENT as usize).enumerate() {
            let start = Lsn(wal.start().0 + i as u64 * u64::from(SEGMENT));
            let name = postgres_wal::SegmentName::of(1, start, SEGMENT).file_name(SEGMENT);
            let mut bytes = chunk.to_vec();
            bytes.resize(SEGMENT as usize, 0);
            std::fs::write(wal_dir.join(name), bytes).unwrap();
        }
        let mut decoder = WalDecoder::new(wal.start(), SEGMENT);
        decoder.feed(wal.bytes());
        let records = std::iter::from_fn(|| decoder.next_record().unwrap()).collect();
        (dir, records)
    }

    fn scan_to(dir: &Path, snapshot: Lsn, flushed: Lsn, from: Lsn) -> Option<Target> {
        let mut scan = Scan::new(snapshot, snapshot, counters(), 990, SEGMENT);
        for _ in 0..8 {
            if let Some(target) = scan.step(dir, flushed, from).unwrap() {
                return Some(target);
            }
        }
        None
    }

    #[test]
    fn the_target_is_the_first_record_starting_at_or_past_the_limit_with_the_counters_there() {
        let mut wal = WalBuilder::new(Lsn(u64::from(SEGMENT)), SEGMENT);
        for xid in 1001..1040 {
            wal.main_data_record(RM_XLOG_ID, 0x30, xid, &[7; 300]);
        }
        let (dir, records) = stored(&wal);
        let snapshot = records[3].end_rec_ptr();
        let flushed = wal.end();
        for i in [5, 20, records.len() - 1] {
            // The limit anywhere in the record before, or at its own start.
            for from in [records[i - 1].start.0 + 1, records[i].start.0] {
                let target = scan_to(dir.path(), snapshot, flushed, Lsn(from)).unwrap();
                assert_eq!(target.last_start, records[i].start);
                assert_eq!(target.end, records[i].end_rec_ptr());
                assert_eq!(target.ingest_to, records[i - 1].end_rec_ptr());
                assert_eq!(target.next, next_record_start(records[i].end, SEGMENT));
                // Followed from the snapshot through the target's record (its xid).
                assert_eq!(target.counters.next_xid, 1001 + i as u64 + 1);
            }
        }
        // Not there yet: the WAL past the limit is not flushed.
        let from = Lsn(records.last().unwrap().end.0 + 1);
        assert!(scan_to(dir.path(), snapshot, flushed, from).is_none());
    }

    /// A record's parts: a reference to block `block` of fork `fork` of `rel`, no data or
    /// image.
    fn block_ref_parts(rel: (u32, u32, u32), fork: u8, block: u32) -> Vec<u8> {
        let mut parts = vec![0u8, fork, 0, 0];
        for n in [rel.0, rel.1, rel.2, block] {
            parts.extend_from_slice(&n.to_le_bytes());
        }
        parts
    }

    #[test]
    fn the_blocks_named_after_the_snapshot_are_listed() {
        let mut wal = WalBuilder::new(Lsn(u64::from(SEGMENT)), SEGMENT);
        wal.record(10, 0, 1001, &block_ref_parts((1663, 5, 100), 0, 1));
        wal.record(10, 0, 1002, &block_ref_parts((1663, 5, 200), 0, 7));
        wal.record(10, 0, 1002, &block_ref_parts((1663, 5, 200), 0, 3));
        wal.record(10, 0, 1002, &block_ref_parts((1663, 5, 200), 0, 7));
        // Its free space map: that fork anywhere, the main fork's blocks still listed.
        wal.record(10, 0, 1002, &block_ref_parts((1663, 5, 200), 1, 0));
        wal.record(10, 0, 1002, &block_ref_parts((1663, 5, 300), 0, 2));
        // xl_smgr_truncate: blkno, the relation, flags.
        let mut truncate = 7u32.to_le_bytes().to_vec();
        for n in [1663u32, 5, 300, 1] {
            truncate.extend_from_slice(&n.to_le_bytes());
        }
        wal.main_data_record(RM_SMGR_ID, XLOG_SMGR_TRUNCATE, 0, &truncate);
        let from = wal.main_data_record(RM_XLOG_ID, 0x30, 1003, &[7; 300]);
        let (dir, records) = stored(&wal);
        let snapshot = records[0].end_rec_ptr();
        let target = scan_to(dir.path(), snapshot, wal.end(), from).unwrap();
        let touched = &target.touched;
        assert!(!touched.all);
        assert_eq!(
            touched.relations.iter().copied().collect::<Vec<_>>(),
            [(1663, 5, 200), (1663, 5, 300)],
            "not the one before the snapshot"
        );
        assert_eq!(touched.named(1663, 5, 100, 0), Named::Nothing);
        assert_eq!(
            touched.named(1663, 5, 200, 0),
            Named::Blocks(&BTreeSet::from([3, 7]))
        );
        for fork in [1, 2] {
            assert_eq!(touched.named(1663, 5, 200, fork), Named::Anywhere);
        }
        // Truncated: anywhere, also where a block was named.
        assert_eq!(touched.named(1663, 5, 300, 0), Named::Anywhere);
    }

    #[test]
    fn after_a_database_record_every_file_is_written_anywhere() {
        let mut wal = WalBuilder::new(Lsn(u64::from(SEGMENT)), SEGMENT);
        wal.record(10, 0, 1001, &block_ref_parts((1663, 5, 100), 0, 1));
        wal.main_data_record(RM_DBASE_ID, 0x00, 1002, &[0; 16]);
        let from = wal.main_data_record(RM_XLOG_ID, 0x30, 1003, &[7; 300]);
        let (dir, records) = stored(&wal);
        let target = scan_to(dir.path(), records[0].start, wal.end(), from).unwrap();
        assert!(target.touched.all);
        assert_eq!(target.touched.named(1663, 7, 1, 0), Named::Anywhere);
    }

    #[test]
    fn past_the_most_blocks_kept_the_relations_named_are_written_anywhere() {
        let mut touched = Touched::default();
        let rel = RelFileNode {
            spcnode: 1663,
            dbnode: 5,
            relnode: 100,
        };
        let mut record = WalBuilder::new(Lsn(u64::from(SEGMENT)), SEGMENT);
        record.record(10, 0, 1001, &block_ref_parts((1663, 5, 100), 0, 0));
        let (_dir, records) = stored(&record);
        let mut parts = parse_parts(&records[0].bytes).unwrap();
        let block = parts.blocks[0].clone();
        // Records of 1,024 references each, alternately to two relations, one block past.
        for first in (0..=MAX_NAMED_BLOCKS as u32).step_by(1024) {
            parts.blocks = (first..first + 1024)
                .map(|n| BlockRef {
                    rel: RelFileNode {
                        relnode: 100 + n % 2,
                        ..rel
                    },
                    block: n,
                    ..block.clone()
                })
                .collect();
            touched.note(&records[0], Some(&parts));
        }
        assert!(touched.blocks <= MAX_NAMED_BLOCKS);
        assert_eq!(touched.named(1663, 5, 100, 0), Named::Anywhere);
        assert_eq!(touched.named(1663, 5, 101, 0), Named::Anywhere);
        assert_eq!(touched.named(1663, 5, 102, 0), Named::Nothing);
    }

    #[test]
    fn after_a_switch_the_next_record_starts_in_the_next_segment() {
        let mut wal = WalBuilder::new(Lsn(u64::from(SEGMENT)), SEGMENT);
        wal.main_data_record(RM_XLOG_ID, 0x30, 1001, &[7; 300]);
        let switch = wal.switch();
        wal.main_data_record(RM_XLOG_ID, 0x30, 1002, &[7; 300]);
        let (dir, records) = stored(&wal);
        let target = scan_to(dir.path(), Lsn(u64::from(SEGMENT) + 40), wal.end(), switch).unwrap();
        assert_eq!(target.last_start, switch);
        assert_eq!(target.next, records[2].start);
        assert_eq!(target.next, Lsn(2 * u64::from(SEGMENT) + 40));
        assert_eq!(target.ingest_to, records[0].end_rec_ptr());
    }

    #[test]
    fn the_oldest_running_transaction_is_the_last_running_transactions_records() {
        let mut wal = WalBuilder::new(Lsn(u64::from(SEGMENT)), SEGMENT);
        wal.main_data_record(RM_XLOG_ID, 0x30, 1001, &[7; 300]);
        let from = wal.main_data_record(RM_XLOG_ID, 0x30, 1002, &[7; 300]);
        let (dir, records) = stored(&wal);
        let snapshot = records[0].start;
        let target = scan_to(dir.path(), snapshot, wal.end(), from).unwrap();
        // None seen: the snapshot's.
        assert_eq!(target.oldest_active_xid, 990);

        let mut wal = WalBuilder::new(Lsn(u64::from(SEGMENT)), SEGMENT);
        wal.main_data_record(RM_XLOG_ID, 0x30, 1001, &[7; 300]);
        // xcnt, subxcnt, subxid_overflow, nextXid, oldestRunningXid, latestCompletedXid.
        let mut running = Vec::new();
        for field in [0u32, 0, 0, 1010, 995, 1009] {
            running.extend_from_slice(&field.to_le_bytes());
        }
        wal.main_data_record(RM_STANDBY_ID, XLOG_RUNNING_XACTS, 0, &running);
        let from = wal.main_data_record(RM_XLOG_ID, 0x30, 1002, &[7; 300]);
        let (dir, records) = stored(&wal);
        let target = scan_to(dir.path(), records[0].start, wal.end(), from).unwrap();
        assert_eq!(target.oldest_active_xid, 995);
        assert_eq!(target.counters.next_xid, 1010);
    }
}
