//! What the fuzz targets share: damaged copies of a valid file, as an input says, and the rule
//! for the errors that damage may cause.

use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use pageserver::page_cache::{PageCache, PageCacheConfig};
use pageserver::PAGE_SZ;

/// The name of every damaged copy: an error about one must contain it.
pub const DAMAGED: &str = "damaged";

/// A valid file made once per fuzzing process, and what reading damaged copies of it needs.
pub struct Original {
    pub bytes: Vec<u8>,
    /// Holds the original and the damaged copy (one name, rewritten for each input).
    dir: tempfile::TempDir,
    /// A small page cache for the readers: every damaged copy is a new file to it.
    pub cache: Arc<PageCache>,
}

impl Original {
    /// The file at `path`, which lies in `dir`.
    pub fn read(dir: tempfile::TempDir, path: &Path) -> Original {
        let config = PageCacheConfig {
            capacity_bytes: 64 * PAGE_SZ as u64,
            ..Default::default()
        };
        Original {
            bytes: std::fs::read(path).unwrap(),
            dir,
            cache: Arc::new(PageCache::new(config).unwrap()),
        }
    }

    /// Writes a copy damaged as `input` says ([`damage`]) and returns its path.
    pub fn damaged_copy(&self, input: &[u8]) -> PathBuf {
        let mut bytes = self.bytes.clone();
        damage(&mut bytes, input);
        let path = self.dir.path().join(DAMAGED);
        std::fs::write(&path, &bytes).unwrap();
        path
    }
}

/// Applies `input` to `bytes` as damage: each 4 bytes of it are a 24-bit offset (taken modulo
/// the length) and a byte to XOR there.
pub fn damage(bytes: &mut [u8], input: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    for flip in input.chunks_exact(4) {
        let at = u32::from_le_bytes([flip[0], flip[1], flip[2], 0]) as usize % bytes.len();
        bytes[at] ^= flip[3];
    }
}

/// Fails the run unless `error` names the damaged copy: an error about damage must say which
/// file is damaged.
pub fn assert_names_damaged_file(error: &dyn Display) {
    let msg = error.to_string();
    assert!(
        msg.contains(DAMAGED),
        "an error that does not name the damaged file: {msg}"
    );
}

/// The tar archive of a small, cleanly stopped PostgreSQL 15 cluster: the directories and files
/// an import expects, a `pg_control` with a valid checksum, relation segments of a few blocks,
/// a free space map fork, an empty relation, and a file of several chunks.
pub fn small_cluster_archive() -> Vec<u8> {
    const BLCKSZ: usize = 8192;
    let blocks = |fill: u8, count: usize| -> Vec<u8> {
        (0..count * BLCKSZ)
            .map(|i| fill.wrapping_add((i / BLCKSZ) as u8) ^ (i as u8 / 61))
            .collect()
    };
    let mut control = vec![0u8; BLCKSZ];
    let checkpoint: u64 = 0x1000;
    control[0..8].copy_from_slice(&0x6a5b_4c3d_2e1f_0011u64.to_le_bytes());
    control[8..12].copy_from_slice(&1300u32.to_le_bytes());
    control[12..16].copy_from_slice(&202_209_061u32.to_le_bytes());
    // State 1: shut down.
    control[16..20].copy_from_slice(&1u32.to_le_bytes());
    control[32..40].copy_from_slice(&checkpoint.to_le_bytes());
    control[40..48].copy_from_slice(&checkpoint.to_le_bytes());
    control[48..52].copy_from_slice(&1u32.to_le_bytes());
    let crc = crc32c::crc32c(&control[..288]);
    control[288..292].copy_from_slice(&crc.to_le_bytes());

    let dirs = [
        "base",
        "base/1",
        "base/5",
        "global",
        "pg_wal",
        "pg_xact",
        "pg_tblspc",
    ];
    let files: Vec<(&str, Vec<u8>)> = vec![
        ("PG_VERSION", b"15\n".to_vec()),
        (
            "postgresql.conf",
            (0..20_000u32).map(|i| (i % 251) as u8).collect(),
        ),
        ("pg_xact/0000", blocks(9, 1)),
        ("base/5/PG_VERSION", b"15\n".to_vec()),
        ("base/5/pg_filenode.map", vec![7; 512]),
        ("global/pg_control", control),
        ("base/5/16384", blocks(1, 3)),
        ("base/5/16384_fsm", blocks(2, 1)),
        ("base/5/16385", Vec::new()),
        ("base/1/1259", blocks(3, 2)),
        ("global/1262", blocks(4, 1)),
    ];
    let mut builder = tar::Builder::new(Vec::new());
    for dir in dirs {
        let mut header = tar::Header::new_ustar();
        header.set_mtime(1_700_000_000);
        header.set_entry_type(tar::EntryType::Directory);
        header.set_mode(0o700);
        header.set_size(0);
        builder
            .append_data(&mut header, format!("./{dir}/"), std::io::empty())
            .unwrap();
    }
    for (path, bytes) in files {
        let mut header = tar::Header::new_ustar();
        header.set_mtime(1_700_000_000);
        header.set_mode(0o600);
        header.set_size(bytes.len() as u64);
        builder
            .append_data(&mut header, format!("./{path}"), &bytes[..])
            .unwrap();
    }
    builder.into_inner().unwrap()
}
