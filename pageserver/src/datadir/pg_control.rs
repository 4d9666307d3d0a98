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
//!  136    u64  minRecoveryPoint (a standby's replay position when it stopped)
//!  176    bool wal_log_hints
//!  252    u32  data_checksum_version (0: no checksums)
//!  288    u32  crc (CRC-32C of bytes 0..288)
//! ```

use utils::Lsn;

/// The control file format this reader knows.
pub const PG_CONTROL_VERSION: u32 = 1300;
/// Where the CRC sits in format 1300.
const CRC_OFFSET: usize = 288;
/// The size of the file PostgreSQL writes.
pub const PG_CONTROL_FILE_SIZE: usize = 8192;

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
    pub data_checksum_version: u32,
}

impl ControlFile {
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
    let computed = crc32c::crc32c(&bytes[..CRC_OFFSET]);
    if stored != computed {
        return Err(ControlFileError::Crc { stored, computed });
    }
    Ok(ControlFile {
        system_identifier: u64_at(0),
        state: u32_at(16),
        checkpoint: Lsn(u64_at(32)),
        min_recovery_point: Lsn(u64_at(136)),
        wal_log_hints: bytes[176] != 0,
        data_checksum_version: u32_at(252),
    })
}
