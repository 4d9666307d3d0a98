//! The tar import of a PostgreSQL data directory (`pageserver::datadir::import_archive`), fed
//! archives that are either the input itself or a small valid cluster's archive damaged as the
//! input says (first byte odd: the rest of the input flips bytes of it, `pageserver_fuzz::damage`;
//! even: the rest is the archive). Each input is imported into a new, empty timeline.
//!
//! Checks, besides "no panic, no hang": a refused import stores nothing (the timeline stays
//! empty), and an accepted one can be read back as a basebackup at its LSN.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use pageserver::datadir::{import_archive, snapshot_at, write_basebackup};
use pageserver::page_cache::{PageCache, PageCacheConfig};
use pageserver::tenant::timeline::{Timeline, TimelineConf};
use pageserver::PAGE_SZ;
use pageserver_fuzz::{damage, small_cluster_archive};
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

fuzz_target!(|input: &[u8]| {
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
            write_basebackup(&timeline, snapshot, &mut out).expect("a basebackup of the import");
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
});
