//! Timeline metadata: the one durable fact a timeline needs besides its layer files,
//! `disk_consistent_lsn` (every version at or below it is in fsynced layer files).
//!
//! ```text
//! offset size field
//!      0    4 magic                 0x544C4D44 ("TLMD")
//!      4    2 format version        1
//!      6    2 reserved              0
//!      8    8 disk_consistent_lsn
//!     16    4 CRC-32C of bytes 0..16
//! ```
//!
//! Written atomically: a temporary file is written and fsynced, renamed over `metadata`, and the
//! directory fsynced. A reader sees the old value or the new one, never a mix; a failed check is
//! a corruption error naming the file.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use utils::Lsn;

pub const METADATA_FILE: &str = "metadata";
const METADATA_TEMP: &str = "metadata.___temp";
const MAGIC: u32 = 0x544C_4D44;
const VERSION: u16 = 1;
const LEN: usize = 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimelineMetadata {
    pub disk_consistent_lsn: Lsn,
}

#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    #[error("timeline metadata {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("timeline metadata {} is corrupt: {reason}", path.display())]
    Corrupt { path: PathBuf, reason: String },
}

impl TimelineMetadata {
    fn encode(&self) -> [u8; LEN] {
        let mut b = [0u8; LEN];
        b[0..4].copy_from_slice(&MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&VERSION.to_be_bytes());
        b[8..16].copy_from_slice(&self.disk_consistent_lsn.0.to_be_bytes());
        let crc = crc32c::crc32c(&b[..16]);
        b[16..20].copy_from_slice(&crc.to_be_bytes());
        b
    }

    fn decode(b: &[u8]) -> Result<TimelineMetadata, String> {
        if b.len() != LEN {
            return Err(format!("{} bytes, expected {LEN}", b.len()));
        }
        let magic = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        if magic != MAGIC {
            return Err(format!("bad magic {magic:#010x}"));
        }
        let version = u16::from_be_bytes([b[4], b[5]]);
        if version != VERSION {
            return Err(format!("unsupported format version {version}"));
        }
        let stored = u32::from_be_bytes([b[16], b[17], b[18], b[19]]);
        if crc32c::crc32c(&b[..16]) != stored {
            return Err("checksum mismatch".to_owned());
        }
        let mut lsn = [0u8; 8];
        lsn.copy_from_slice(&b[8..16]);
        Ok(TimelineMetadata {
            disk_consistent_lsn: Lsn(u64::from_be_bytes(lsn)),
        })
    }

    /// Reads `<dir>/metadata`.
    pub fn load(dir: &Path) -> Result<TimelineMetadata, MetadataError> {
        let path = dir.join(METADATA_FILE);
        let bytes = std::fs::read(&path).map_err(|source| MetadataError::Io {
            path: path.clone(),
            source,
        })?;
        Self::decode(&bytes).map_err(|reason| MetadataError::Corrupt { path, reason })
    }

    /// Replaces `<dir>/metadata` atomically and durably.
    pub fn store(&self, dir: &Path) -> Result<(), MetadataError> {
        let temp = dir.join(METADATA_TEMP);
        let io_err = |path: &Path| {
            let path = path.to_owned();
            move |source| MetadataError::Io { path, source }
        };
        let mut file = File::create(&temp).map_err(io_err(&temp))?;
        file.write_all(&self.encode()).map_err(io_err(&temp))?;
        file.sync_all().map_err(io_err(&temp))?;
        let path = dir.join(METADATA_FILE);
        std::fs::rename(&temp, &path).map_err(io_err(&path))?;
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err(dir))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_every_corruption_is_caught() {
        let dir = tempfile::tempdir().unwrap();
        let m = TimelineMetadata {
            disk_consistent_lsn: Lsn(0x016B_5A50),
        };
        m.store(dir.path()).unwrap();
        assert_eq!(TimelineMetadata::load(dir.path()).unwrap(), m);
        assert!(!dir.path().join(METADATA_TEMP).exists());

        let good = std::fs::read(dir.path().join(METADATA_FILE)).unwrap();
        for byte in 0..LEN {
            for bit in 0..8 {
                let mut bad = good.clone();
                bad[byte] ^= 1 << bit;
                std::fs::write(dir.path().join(METADATA_FILE), &bad).unwrap();
                let err = TimelineMetadata::load(dir.path()).unwrap_err();
                assert!(
                    matches!(err, MetadataError::Corrupt { .. }),
                    "byte {byte}: {err}"
                );
                assert!(err.to_string().contains(METADATA_FILE));
            }
        }
        std::fs::write(dir.path().join(METADATA_FILE), &good[..10]).unwrap();
        assert!(TimelineMetadata::load(dir.path()).is_err());
    }
}
