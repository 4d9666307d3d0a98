//! `global/pg_control`: the fields of PostgreSQL's control file an import needs.
//!
//! The file is 8192 bytes, of which the start is `ControlFileData` in the machine's byte order
//! (little-endian here), ending with a CRC-32C of everything before it. Only the layout of
//! `pg_control_version` 1300 (PostgreSQL 13 to 16; the one Debian's PostgreSQL 15 writes) is
//! read: another version is refused by name rather than misread.
//!
//! ```text
//! offset  field
//!    0    u64  system_identifier
//!    8    u32  pg_control_version (1300)
//!   12    u32  catalog_version_no
//!   16    u32  state (1 shut down, 2 shut down in recovery, 6 in production, ...)
//!   24    i64  time
//!   32    u64  checkPoint (the latest checkpoint record's LSN)
//!   40    CheckPoint checkPointCopy (88 bytes, as the checkpoint record holds it; below)
//!  136    u64  minRecoveryPoint (a standby's replay position when it stopped)
//!  144    u32  minRecoveryPointTLI
//!  152    u64  backupStartPoint, 160 u64 backupEndPoint, 168 bool backupEndRequired
//!  176    bool wal_log_hints
//!  192    i32  max_prepared_xacts (the primary's max_prepared_transactions)
//!  200    bool track_commit_timestamp
//!  252    u32  data_checksum_version (0: no checksums)
//!  288    u32  crc (CRC-32C of bytes 0..288)
//!
//! CheckPoint (88 bytes; also the main data of a checkpoint record):
//!    0    u64  redo             8  u32 ThisTimeLineID    12  u32 PrevTimeLineID
//!   16    bool fullPageWrites  24  u64 nextXid (epoch << 32 | xid)
//!   32    u32  nextOid         36  u32 nextMulti         40  u32 nextMultiOffset
//!   44    u32  oldestXid       48  u32 oldestXidDB       52  u32 oldestMulti
//!   56    u32  oldestMultiDB   64  i64 time              72  u32 oldestCommitTsXid
//!   76    u32  newestCommitTsXid                         80  u32 oldestActiveXid
//! ```
//!
//! [`shut_down_at`] writes the control file of a cluster shut down at a checkpoint of our
//! making: the restore of a timeline at an LSN where every page is materialized.

use pageserver_api::datadir::ClusterCounters;
use utils::Lsn;

/// The control file format this reader knows.
pub const PG_CONTROL_VERSION: u32 = 1300;
/// Where the CRC sits in format 1300.
const CRC_OFFSET: usize = 288;
/// The size of the file PostgreSQL writes.
pub const PG_CONTROL_FILE_SIZE: usize = 8192;
/// Where the file is in a data directory.
pub const PG_CONTROL_PATH: &str = "global/pg_control";

/// `DBState` values that mean the cluster stopped cleanly.
const DB_SHUTDOWNED: u32 = 1;
const DB_SHUTDOWNED_IN_RECOVERY: u32 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControlFile {
    pub system_identifier: u64,
    pub state: u32,
    pub checkpoint: Lsn,
    pub min_recovery_point: Lsn,
    pub wal_log_hints: bool,
    /// The primary's `max_prepared_transactions`: a replay of its WAL needs as many.
    pub max_prepared_xacts: u32,
    pub track_commit_timestamp: bool,
    pub data_checksum_version: u32,
    /// `checkPointCopy`: the latest checkpoint record's contents.
    pub checkpoint_copy: Checkpoint,
}

/// The size of `CheckPoint`.
pub const CHECKPOINT_LEN: usize = 88;
const CHECKPOINT_COPY_OFFSET: usize = 40;

/// PostgreSQL's `CheckPoint`: a checkpoint record's main data, and `pg_control`'s copy of the
/// latest one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checkpoint {
    pub redo: Lsn,
    pub tli: u32,
    pub prev_tli: u32,
    pub full_page_writes: bool,
    pub next_xid: u64,
    pub next_oid: u32,
    pub next_multi: u32,
    pub next_multi_offset: u32,
    pub oldest_xid: u32,
    pub oldest_xid_db: u32,
    pub oldest_multi: u32,
    pub oldest_multi_db: u32,
    pub time: i64,
    pub oldest_commit_ts_xid: u32,
    pub newest_commit_ts_xid: u32,
    pub oldest_active_xid: u32,
}

impl Checkpoint {
    /// Parses the first [`CHECKPOINT_LEN`] bytes of `b`; `None` if it is shorter.
    pub fn parse(b: &[u8]) -> Option<Checkpoint> {
        let b = b.get(..CHECKPOINT_LEN)?;
        let u32_at = |off: usize| u32::from_le_bytes(b[off..off + 4].try_into().unwrap());
        let u64_at = |off: usize| u64::from_le_bytes(b[off..off + 8].try_into().unwrap());
        Some(Checkpoint {
            redo: Lsn(u64_at(0)),
            tli: u32_at(8),
            prev_tli: u32_at(12),
            full_page_writes: b[16] != 0,
            next_xid: u64_at(24),
            next_oid: u32_at(32),
            next_multi: u32_at(36),
            next_multi_offset: u32_at(40),
            oldest_xid: u32_at(44),
            oldest_xid_db: u32_at(48),
            oldest_multi: u32_at(52),
            oldest_multi_db: u32_at(56),
            time: u64_at(64) as i64,
            oldest_commit_ts_xid: u32_at(72),
            newest_commit_ts_xid: u32_at(76),
            oldest_active_xid: u32_at(80),
        })
    }

    pub fn encode(&self) -> [u8; CHECKPOINT_LEN] {
        let mut b = [0u8; CHECKPOINT_LEN];
        let mut put = |off: usize, bytes: &[u8]| b[off..off + bytes.len()].copy_from_slice(bytes);
        put(0, &self.redo.0.to_le_bytes());
        put(8, &self.tli.to_le_bytes());
        put(12, &self.prev_tli.to_le_bytes());
        put(16, &[u8::from(self.full_page_writes)]);
        put(24, &self.next_xid.to_le_bytes());
        put(32, &self.next_oid.to_le_bytes());
        put(36, &self.next_multi.to_le_bytes());
        put(40, &self.next_multi_offset.to_le_bytes());
        put(44, &self.oldest_xid.to_le_bytes());
        put(48, &self.oldest_xid_db.to_le_bytes());
        put(52, &self.oldest_multi.to_le_bytes());
        put(56, &self.oldest_multi_db.to_le_bytes());
        put(64, &self.time.to_le_bytes());
        put(72, &self.oldest_commit_ts_xid.to_le_bytes());
        put(76, &self.newest_commit_ts_xid.to_le_bytes());
        put(80, &self.oldest_active_xid.to_le_bytes());
        b
    }

    /// Its counters; `exact` when they are a shutdown checkpoint's.
    pub fn counters(&self, exact: bool) -> ClusterCounters {
        ClusterCounters {
            exact,
            next_xid: self.next_xid,
            next_oid: self.next_oid,
            next_multi: self.next_multi,
            next_multi_offset: self.next_multi_offset,
            oldest_xid: self.oldest_xid,
            oldest_xid_db: self.oldest_xid_db,
            oldest_multi: self.oldest_multi,
            oldest_multi_db: self.oldest_multi_db,
        }
    }

    /// The shutdown checkpoint at `at` (its redo point too) of a cluster on timeline `tli`,
    /// come from `prev_tli`, with `counters` and nothing running; the rest as in `self`.
    pub fn shutdown_at(
        &self,
        at: Lsn,
        tli: u32,
        prev_tli: u32,
        counters: &ClusterCounters,
        time: i64,
    ) -> Checkpoint {
        Checkpoint {
            redo: at,
            tli,
            prev_tli,
            full_page_writes: true,
            time,
            // A shutdown checkpoint's, as `CreateCheckPoint` writes it: none.
            oldest_active_xid: 0,
            ..self.with_counters(counters)
        }
    }

    /// The online checkpoint at `redo` (its record's place too) with `counters` and
    /// `oldest_active_xid` (no running transaction older: PostgreSQL clears `pg_subtrans`
    /// from it); the rest as in `self`, which is older. In a cluster that
    /// `tracks_commit_timestamps`, the newest transaction with a commit timestamp is taken to
    /// be the one before the next: what the WAL since moved it to is not followed, and a
    /// lookup reads one that never committed as having none.
    pub fn online_at(
        &self,
        redo: Lsn,
        counters: &ClusterCounters,
        oldest_active_xid: u32,
        tracks_commit_timestamps: bool,
    ) -> Checkpoint {
        let mut checkpoint = Checkpoint {
            redo,
            oldest_active_xid,
            ..self.with_counters(counters)
        };
        if tracks_commit_timestamps && checkpoint.oldest_commit_ts_xid != 0 {
            // Transaction ids below 3 are special: none of them, at a wraparound.
            let newest = (counters.next_xid as u32).wrapping_sub(1);
            if newest >= 3 {
                checkpoint.newest_commit_ts_xid = newest;
            }
        }
        checkpoint
    }

    /// This checkpoint with `counters` in place of its own.
    pub fn with_counters(&self, counters: &ClusterCounters) -> Checkpoint {
        Checkpoint {
            next_xid: counters.next_xid,
            next_oid: counters.next_oid,
            next_multi: counters.next_multi,
            next_multi_offset: counters.next_multi_offset,
            oldest_xid: counters.oldest_xid,
            oldest_xid_db: counters.oldest_xid_db,
            oldest_multi: counters.oldest_multi,
            oldest_multi_db: counters.oldest_multi_db,
            ..*self
        }
    }
}

/// The control file `original` (checked by [`parse`]) rewritten for a cluster shut down
/// cleanly at the checkpoint record at `at` holding `checkpoint`: no recovery to finish, no
/// backup to end, and no data checksums (page images from the WAL carry stale ones).
pub fn shut_down_at(original: &[u8], at: Lsn, checkpoint: &Checkpoint) -> Vec<u8> {
    let mut b = original.to_vec();
    let mut put = |off: usize, bytes: &[u8]| b[off..off + bytes.len()].copy_from_slice(bytes);
    put(16, &DB_SHUTDOWNED.to_le_bytes());
    put(24, &checkpoint.time.to_le_bytes());
    put(32, &at.0.to_le_bytes());
    put(CHECKPOINT_COPY_OFFSET, &checkpoint.encode());
    // minRecoveryPoint and its timeline, backupStartPoint, backupEndPoint, backupEndRequired.
    put(136, &[0; 33]);
    // data_checksum_version: the pages' checksums are not made again.
    put(252, &[0; 4]);
    with_crc(b)
}

/// The control file `original` (checked by [`parse`]) naming the checkpoint record at `at`,
/// holding `checkpoint`, as its latest, and consistent once recovery reaches
/// `min_recovery_point`; nothing else changed.
pub fn with_checkpoint_at(
    original: &[u8],
    at: Lsn,
    checkpoint: &Checkpoint,
    min_recovery_point: Lsn,
) -> Vec<u8> {
    let mut b = original.to_vec();
    let mut put = |off: usize, bytes: &[u8]| b[off..off + bytes.len()].copy_from_slice(bytes);
    put(32, &at.0.to_le_bytes());
    put(CHECKPOINT_COPY_OFFSET, &checkpoint.encode());
    put(136, &min_recovery_point.0.to_le_bytes());
    with_crc(b)
}

/// `b` with its CRC made again.
fn with_crc(mut b: Vec<u8>) -> Vec<u8> {
    let crc = utils::crc32c::crc32c(&b[..CRC_OFFSET]);
    b[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
    b
}

/// The control file `original` (checked by [`parse`]) with `checkpoint` as its copy of the
/// latest checkpoint record, and nothing else changed.
pub fn with_checkpoint_copy(original: &[u8], checkpoint: &Checkpoint) -> Vec<u8> {
    let mut b = original.to_vec();
    b[CHECKPOINT_COPY_OFFSET..CHECKPOINT_COPY_OFFSET + CHECKPOINT_LEN]
        .copy_from_slice(&checkpoint.encode());
    with_crc(b)
}

impl ControlFile {
    /// Whether a standby shut it down in recovery.
    pub fn is_shut_down_in_recovery(&self) -> bool {
        self.state == DB_SHUTDOWNED_IN_RECOVERY
    }

    /// Whether the cluster was shut down cleanly (it starts without recovery).
    pub fn is_shut_down(&self) -> bool {
        matches!(self.state, DB_SHUTDOWNED | DB_SHUTDOWNED_IN_RECOVERY)
    }

    /// The LSN a cleanly stopped cluster's data is at: its last checkpoint, or for a standby
    /// stopped in recovery where its replay got to (its last restartpoint can be older).
    pub fn stopped_at(&self) -> Lsn {
        if self.state == DB_SHUTDOWNED_IN_RECOVERY {
            self.checkpoint.max(self.min_recovery_point)
        } else {
            self.checkpoint
        }
    }

    /// Whether a primary shut it down: its checkpoint's counters are exact at its LSN.
    pub fn is_primary_shutdown(&self) -> bool {
        self.state == DB_SHUTDOWNED
    }

    /// The state's name, as `pg_controldata` prints it.
    pub fn state_name(&self) -> &'static str {
        match self.state {
            0 => "starting up",
            1 => "shut down",
            2 => "shut down in recovery",
            3 => "shutting down",
            4 => "in crash recovery",
            5 => "in archive recovery",
            6 => "in production",
            _ => "unknown",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlFileError {
    #[error("global/pg_control is {0} bytes, expected {PG_CONTROL_FILE_SIZE}")]
    Size(usize),
    #[error(
        "global/pg_control has format version {0}; only {PG_CONTROL_VERSION} (PostgreSQL 13 to 16) is supported"
    )]
    Version(u32),
    #[error("global/pg_control fails its CRC check (stored {stored:08x}, computed {computed:08x}): the file is damaged")]
    Crc { stored: u32, computed: u32 },
}

/// Parses and checks a control file.
pub fn parse(bytes: &[u8]) -> Result<ControlFile, ControlFileError> {
    if bytes.len() != PG_CONTROL_FILE_SIZE {
        return Err(ControlFileError::Size(bytes.len()));
    }
    let u32_at = |off: usize| u32::from_le_bytes(bytes[off..off + 4].try_into().unwrap());
    let u64_at = |off: usize| u64::from_le_bytes(bytes[off..off + 8].try_into().unwrap());
    let version = u32_at(8);
    if version != PG_CONTROL_VERSION {
        return Err(ControlFileError::Version(version));
    }
    let stored = u32_at(CRC_OFFSET);
    let computed = utils::crc32c::crc32c(&bytes[..CRC_OFFSET]);
    if stored != computed {
        return Err(ControlFileError::Crc { stored, computed });
    }
    Ok(ControlFile {
        system_identifier: u64_at(0),
        state: u32_at(16),
        checkpoint: Lsn(u64_at(32)),
        min_recovery_point: Lsn(u64_at(136)),
        wal_log_hints: bytes[176] != 0,
        max_prepared_xacts: u32_at(192),
        track_commit_timestamp: bytes[200] != 0,
        data_checksum_version: u32_at(252),
        checkpoint_copy: Checkpoint::parse(&bytes[CHECKPOINT_COPY_OFFSET..])
            .expect("the file is 8192 bytes"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A control file of a running cluster, mid-backup, with checksums: every field
    /// `shut_down_at` changes is set to something else first.
    fn running() -> Vec<u8> {
        let mut b = vec![0u8; PG_CONTROL_FILE_SIZE];
        b[0..8].copy_from_slice(&42u64.to_le_bytes());
        b[8..12].copy_from_slice(&PG_CONTROL_VERSION.to_le_bytes());
        b[16..20].copy_from_slice(&6u32.to_le_bytes());
        b[136..144].copy_from_slice(&0x5000u64.to_le_bytes());
        b[152..160].copy_from_slice(&0x4000u64.to_le_bytes());
        b[168] = 1;
        b[172..176].copy_from_slice(&1u32.to_le_bytes()); // wal_level: kept
        b[252..256].copy_from_slice(&1u32.to_le_bytes());
        let crc = utils::crc32c::crc32c(&b[..CRC_OFFSET]);
        b[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    fn checkpoint(next_xid: u64) -> Checkpoint {
        Checkpoint {
            redo: Lsn(0x1000),
            tli: 1,
            prev_tli: 1,
            full_page_writes: false,
            next_xid,
            next_oid: 24_576,
            next_multi: 3,
            next_multi_offset: 9,
            oldest_xid: 716,
            oldest_xid_db: 1,
            oldest_multi: 1,
            oldest_multi_db: 1,
            time: 1_700_000_000,
            oldest_commit_ts_xid: 0,
            newest_commit_ts_xid: 0,
            oldest_active_xid: 700,
        }
    }

    #[test]
    fn a_shutdown_of_our_making_reads_back_as_a_clean_stop_at_its_checkpoint() {
        let original = running();
        let before = parse(&original).unwrap();
        assert!(!before.is_shut_down());
        let counters = ClusterCounters {
            exact: true,
            next_xid: (1 << 32) | 900,
            ..checkpoint(0).counters(true)
        };
        let at = Lsn(0x0300_0028);
        let made = checkpoint(5).shutdown_at(at, 3, 2, &counters, 1_800_000_000);
        let bytes = shut_down_at(&original, at, &made);
        let after = parse(&bytes).expect("a valid CRC");
        assert!(after.is_primary_shutdown());
        assert_eq!(after.checkpoint, at);
        assert_eq!(after.stopped_at(), at);
        assert_eq!(after.min_recovery_point, Lsn(0));
        assert_eq!(after.data_checksum_version, 0);
        assert_eq!(after.system_identifier, 42);
        let copy = after.checkpoint_copy;
        assert_eq!((copy.redo, copy.tli, copy.prev_tli), (at, 3, 2));
        assert_eq!(copy.counters(true), counters);
        assert_eq!(
            copy.oldest_active_xid, 0,
            "a shutdown checkpoint names none"
        );
        assert!(copy.full_page_writes);
        assert_eq!(bytes[152..169], [0; 17], "no backup to end");
        assert_eq!(bytes[172..176], original[172..176], "the rest is kept");
        assert_eq!(bytes[CRC_OFFSET + 4..], original[CRC_OFFSET + 4..]);
    }

    proptest! {
        #[test]
        fn a_checkpoint_round_trips(xid: u64, oid: u32, multi: u32, time: i64, tli: u32) {
            let c = Checkpoint { next_oid: oid, next_multi: multi, time, tli, ..checkpoint(xid) };
            prop_assert_eq!(Checkpoint::parse(&c.encode()), Some(c));
            prop_assert_eq!(Checkpoint::parse(&c.encode()[..CHECKPOINT_LEN - 1]), None);
        }
    }
}
