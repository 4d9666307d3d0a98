//! The tar import of a PostgreSQL data directory (`pageserver::datadir::import_archive`), fed
//! archives that are either the input itself or a small valid cluster's archive damaged as the
//! input says (first byte odd: the rest of the input flips bytes of it, [`crate::damage::damage`];
//! even: the rest is the archive). Each input is imported into a new, empty timeline.
//!
//! Checks, besides "no panic, no hang": a refused import stores nothing (the timeline stays
//! empty), and an accepted one can be read back as a basebackup at its LSN.

use std::sync::{Arc, OnceLock};

use crate::damage::damage;
use pageserver::datadir::{import_archive, snapshot_at, write_basebackup, Restore};
use pageserver::page_cache::{PageCache, PageCacheConfig};
use pageserver::tenant::timeline::{Timeline, TimelineConf};
use pageserver::PAGE_SZ;
use utils::{Lsn, TenantId, TimelineId};

fn cache() -> Arc<PageCache> {
    static CACHE: OnceLock<Arc<PageCache>> = OnceLock::new();
    CACHE
        .get_or_init(|| {
            let config = PageCacheConfig {
                capacity_bytes: 256 * PAGE_SZ as u64,
                ..Default::default()
            };
            Arc::new(PageCache::new(config).unwrap())
        })
        .clone()
}

fn archive() -> &'static [u8] {
    static ARCHIVE: OnceLock<Vec<u8>> = OnceLock::new();
    ARCHIVE.get_or_init(small_cluster_archive)
}

/// Checks one input; panics where the decoder breaks its contract.
pub fn check(input: &[u8]) {
    let Some((&mode, rest)) = input.split_first() else {
        return;
    };
    let bytes = if mode & 1 == 1 {
        let mut bytes = archive().to_vec();
        damage(&mut bytes, rest);
        bytes
    } else {
        rest.to_vec()
    };
    let dir = tempfile::tempdir().unwrap();
    let timeline = Timeline::create(
        dir.path(),
        TenantId::from_bytes([1; 16]),
        TimelineId::from_bytes([2; 16]),
        cache(),
        TimelineConf::default(),
    )
    .unwrap();
    match import_archive(&timeline, &bytes[..], None) {
        Ok(report) => {
            let lsn = timeline.last_record_lsn();
            assert!(
                lsn > Lsn(0),
                "an accepted import stored nothing: {report:?}"
            );
            let snapshot = snapshot_at(&timeline, lsn).expect("the imported snapshot");
            let mut out = Vec::new();
            write_basebackup(&timeline, snapshot, Restore::Snapshot, &mut out)
                .expect("a basebackup of the import");
        }
        Err(_) => {
            assert_eq!(
                timeline.last_record_lsn(),
                Lsn(0),
                "a refused import stored something"
            );
            assert!(timeline.layers().is_empty(), "a refused import left layers");
        }
    }
}

/// The tar archive of a small, cleanly stopped PostgreSQL 15 cluster: the directories and files
/// an import expects, a `pg_control` with a valid checksum, relation segments of a few blocks,
/// a free space map fork, an empty relation, and a file of several chunks.
fn small_cluster_archive() -> Vec<u8> {
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
    let crc = utils::crc32c::crc32c(&control[..288]);
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
