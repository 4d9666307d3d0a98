//! A whole image layer file given to the reader, damaged: a valid layer is written once, with
//! images for every other key, then each input flips bytes of it ([`crate::damage::damage`]).
//! Opening the damaged file and reading every key of its range must give, for each read, the
//! image that was written (or, for a key without one, no image), or an error that names the
//! file. The layer is written compressing (a version 2 file): most images are stored as
//! Zstandard frames, a third of them (noise) as they are, so damage hits both stored forms and
//! the compressed bit of the index entries. A frame's damage is caught by its block's checksum
//! before it reaches the decoder; `value_frame` gives the decoder arbitrary frames.

use std::sync::OnceLock;

use crate::damage::{assert_both_stored_forms, assert_names_damaged_file, Original};
use bytes::Bytes;
use pageserver::format::compression::Compression;
use pageserver::tenant::storage_layer::image_layer::{ImageLayer, ImageLayerWriter};
use pageserver::PAGE_SZ;
use pageserver_api::{Key, Value};
use utils::{Lsn, TenantId, TimelineId};

/// Keys in the layer's range; the even ones have an image.
const KEYS: u32 = 80;
const LSN: Lsn = Lsn(0x20);
const MAX_VALUE_SIZE: usize = 1 << 20;

struct Layer {
    original: Original,
    written: Vec<(Key, Bytes)>,
}

fn key(n: u32) -> Key {
    Key::rel_block(1663, 5, 16384, 0, n)
}

fn layer() -> &'static Layer {
    static LAYER: OnceLock<Layer> = OnceLock::new();
    LAYER.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = ImageLayerWriter::new(
            dir.path(),
            TenantId::from_bytes([1; 16]),
            TimelineId::from_bytes([2; 16]),
            key(0)..key(KEYS),
            LSN,
        )
        .unwrap()
        .with_compression(Compression::Zstd { level: 1 })
        .unwrap();
        let mut written = Vec::new();
        for n in (0..KEYS).step_by(2) {
            let len = (n as usize * 211) % PAGE_SZ + 1;
            let page: Bytes = (0..len)
                .map(|i| match n % 3 {
                    0 => ((i as u32 ^ n).wrapping_mul(2_654_435_761) >> 11) as u8,
                    _ => (i as u32 ^ (n * 13)) as u8,
                })
                .collect();
            writer.put_image(key(n), &page).unwrap();
            written.push((key(n), page));
        }
        let layer = writer.finish().unwrap();
        let original = Original::read(dir, &layer.path);
        let report = ImageLayer::open(&layer.path, original.cache.clone(), MAX_VALUE_SIZE)
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
    let image = match ImageLayer::open(&path, layer.original.cache.clone(), MAX_VALUE_SIZE) {
        Ok(image) => image,
        Err(e) => return assert_names_damaged_file(&e),
    };
    for n in 0..KEYS {
        match image.get(key(n), LSN) {
            Ok(found) => {
                let expected: Vec<(Lsn, Value)> = layer
                    .written
                    .iter()
                    .filter(|(k, _)| *k == key(n))
                    .map(|(_, page)| (LSN, Value::Image(page.clone())))
                    .collect();
                assert_eq!(found.records, expected, "key {n}: a wrong answer");
                assert!(
                    found.complete,
                    "key {n}: an image layer answers every key of its range"
                );
            }
            Err(e) => assert_names_damaged_file(&e),
        }
    }
    match image.iter() {
        Ok(all) => assert!(
            all == layer.written,
            "iter gave other images than were written"
        ),
        Err(e) => assert_names_damaged_file(&e),
    }
}
