//! A whole delta layer file given to the reader, damaged: a valid layer is written once, then
//! each input flips bytes of it at offsets of its choice ([`damage`]). Opening the damaged file and reading
//! every key of it must give, for each read, either the versions that were written or an error
//! that names the file: never a panic, never a changed page. (Every block carries a checksum,
//! so most damage is caught there; the target checks that none gets past as a wrong answer.)
#![no_main]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use pageserver::page_cache::{PageCache, PageCacheConfig};
use pageserver::tenant::storage_layer::delta_layer::{DeltaLayer, DeltaLayerWriter};
use pageserver::PAGE_SZ;
use pageserver_api::{Key, Value};
use pageserver_fuzz::{assert_names_file, damage};
use utils::{Lsn, TenantId, TimelineId};

/// Keys in the layer, and versions of each.
const KEYS: u32 = 40;
const VERSIONS: u64 = 3;
const MAX_VALUE_SIZE: usize = 1 << 20;

struct Layer {
    bytes: Vec<u8>,
    /// Every (key, lsn, value) written, in key and LSN order.
    written: Vec<(Key, Lsn, Value)>,
    /// Holds the damaged copies, one file name reused.
    dir: tempfile::TempDir,
    cache: Arc<PageCache>,
}

fn key(n: u32) -> Key {
    Key::rel_block(1663, 5, 16384, 0, n)
}

fn layer() -> &'static Layer {
    static LAYER: OnceLock<Layer> = OnceLock::new();
    LAYER.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = DeltaLayerWriter::new(
            dir.path(),
            TenantId::from_bytes([1; 16]),
            TimelineId::from_bytes([2; 16]),
            Lsn(0x10),
            Lsn(0x10 + VERSIONS + 1),
        )
        .unwrap();
        let mut written = Vec::new();
        for n in 0..KEYS {
            for v in 0..VERSIONS {
                let lsn = Lsn(0x10 + v);
                // Sizes from a few bytes to past a block, so values span blocks.
                let len = (n as usize * 397 + v as usize * 1031) % (PAGE_SZ + 600) + 1;
                let page: Vec<u8> = (0..len)
                    .map(|i| (i as u32 ^ (n * 7 + v as u32)) as u8)
                    .collect();
                let value = Value::Image(Bytes::from(page));
                writer.put_value(key(n), lsn, &value).unwrap();
                written.push((key(n), lsn, value));
            }
        }
        let layer = writer.finish().unwrap();
        let bytes = std::fs::read(&layer.path).unwrap();
        let config = PageCacheConfig {
            capacity_bytes: 64 * PAGE_SZ as u64,
            ..Default::default()
        };
        Layer {
            bytes,
            written,
            dir,
            cache: Arc::new(PageCache::new(config).unwrap()),
        }
    })
}

fuzz_target!(|input: &[u8]| {
    let layer = layer();
    let mut bytes = layer.bytes.clone();
    damage(&mut bytes, input);
    let path: PathBuf = layer.dir.path().join("damaged");
    std::fs::write(&path, &bytes).unwrap();
    let names_the_file = |e: &dyn std::fmt::Display| assert_names_file(e, "damaged");
    let delta = match DeltaLayer::open(&path, layer.cache.clone(), MAX_VALUE_SIZE) {
        Ok(delta) => delta,
        Err(e) => return names_the_file(&e),
    };
    for n in 0..KEYS {
        let at_lsn = Lsn(0x10 + u64::from(n) % VERSIONS);
        match delta.get(key(n), at_lsn) {
            Ok(found) => {
                // Images need no older history: the newest at or below the LSN alone.
                let expected: Vec<(Lsn, Value)> = layer
                    .written
                    .iter()
                    .filter(|(k, lsn, _)| *k == key(n) && *lsn <= at_lsn)
                    .map(|(_, lsn, value)| (*lsn, value.clone()))
                    .next_back()
                    .into_iter()
                    .collect();
                assert_eq!(
                    found.records, expected,
                    "key {n} at {at_lsn}: a wrong answer"
                );
            }
            Err(e) => names_the_file(&e),
        }
    }
    match delta.iter() {
        Ok(all) => assert!(
            all == layer.written,
            "iter gave other versions than were written"
        ),
        Err(e) => names_the_file(&e),
    }
});
