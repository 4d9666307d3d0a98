//! A whole delta layer file given to the reader, damaged: a valid layer is written once, then
//! each input flips bytes of it at offsets of its choice ([`crate::damage::damage`]). Opening
//! the damaged file and reading every key of it must give, for each read, either the versions
//! that were written or an error that names the file: never a panic, never a changed page. (Every block carries a checksum,
//! so most damage is caught there; the target checks that none gets past as a wrong answer.)
//! The layer is written compressing (a version 2 file): most values are stored as Zstandard
//! frames, a third of them (noise) as they are, so damage hits both stored forms. A frame's
//! damage is caught by its value's CRC before it reaches the decoder; `value_frame` gives the
//! decoder arbitrary frames.

use std::sync::OnceLock;

use crate::damage::{assert_both_stored_forms, assert_names_damaged_file, Original};
use bytes::Bytes;
use pageserver::format::compression::Compression;
use pageserver::tenant::storage_layer::delta_layer::{DeltaLayer, DeltaLayerWriter};
use pageserver::PAGE_SZ;
use pageserver_api::{Key, Value};
use utils::{Lsn, TenantId, TimelineId};

/// Keys in the layer, and versions of each.
const KEYS: u32 = 40;
const VERSIONS: u64 = 3;
const MAX_VALUE_SIZE: usize = 1 << 20;

struct Layer {
    original: Original,
    /// Every (key, lsn, value) written, in key and LSN order.
    written: Vec<(Key, Lsn, Value)>,
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
        .unwrap()
        .with_compression(Compression::Zstd { level: 1 })
        .unwrap();
        let mut written = Vec::new();
        for n in 0..KEYS {
            for v in 0..VERSIONS {
                let lsn = Lsn(0x10 + v);
                // Sizes from a few bytes to past a block, so values span blocks.
                let len = (n as usize * 397 + v as usize * 1031) % (PAGE_SZ + 600) + 1;
                let page: Vec<u8> = (0..len)
                    .map(|i| match n % 3 {
                        0 => ((i as u32 ^ n).wrapping_mul(2_654_435_761) >> 11) as u8,
                        _ => (i as u32 ^ (n * 7 + v as u32)) as u8,
                    })
                    .collect();
                let value = Value::Image(Bytes::from(page));
                writer.put_value(key(n), lsn, &value).unwrap();
                written.push((key(n), lsn, value));
            }
        }
        let layer = writer.finish().unwrap();
        let original = Original::read(dir, &layer.path);
        let report = DeltaLayer::open(&layer.path, original.cache.clone(), MAX_VALUE_SIZE)
            .and_then(|l| l.verify())
            .unwrap();
        assert_both_stored_forms(report.compressed, report.entries);
        Layer { original, written }
    })
}

/// Checks one input; panics where the decoder breaks its contract.
pub fn check(input: &[u8]) {
    let layer = layer();
    let path = layer.original.damaged_copy(input);
    let delta = match DeltaLayer::open(&path, layer.original.cache.clone(), MAX_VALUE_SIZE) {
        Ok(delta) => delta,
        Err(e) => return assert_names_damaged_file(&e),
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
            Err(e) => assert_names_damaged_file(&e),
        }
    }
    match delta.iter() {
        Ok(all) => assert!(
            all == layer.written,
            "iter gave other versions than were written"
        ),
        Err(e) => assert_names_damaged_file(&e),
    }
}
