//! A whole image layer file given to the reader, damaged: a valid layer is written once, with
//! images for every other key, then each input flips bytes of it ([`damage`]). Opening the
//! damaged file and reading every key of its range must give, for each read, the image that
//! was written (or, for a key without one, no image), or an error that names the file.
#![no_main]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use pageserver::page_cache::{PageCache, PageCacheConfig};
use pageserver::tenant::storage_layer::image_layer::{ImageLayer, ImageLayerWriter};
use pageserver::PAGE_SZ;
use pageserver_api::{Key, Value};
use pageserver_fuzz::{assert_names_file, damage};
use utils::{Lsn, TenantId, TimelineId};

/// Keys in the layer's range; the even ones have an image.
const KEYS: u32 = 80;
const LSN: Lsn = Lsn(0x20);
const MAX_VALUE_SIZE: usize = 1 << 20;

struct Layer {
    bytes: Vec<u8>,
    written: Vec<(Key, Bytes)>,
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
        let mut writer = ImageLayerWriter::new(
            dir.path(),
            TenantId::from_bytes([1; 16]),
            TimelineId::from_bytes([2; 16]),
            key(0)..key(KEYS),
            LSN,
        )
        .unwrap();
        let mut written = Vec::new();
        for n in (0..KEYS).step_by(2) {
            let len = (n as usize * 211) % PAGE_SZ + 1;
            let page: Bytes = (0..len).map(|i| (i as u32 ^ (n * 13)) as u8).collect();
            writer.put_image(key(n), &page).unwrap();
            written.push((key(n), page));
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
    let image = match ImageLayer::open(&path, layer.cache.clone(), MAX_VALUE_SIZE) {
        Ok(image) => image,
        Err(e) => return names_the_file(&e),
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
            Err(e) => names_the_file(&e),
        }
    }
    match image.iter() {
        Ok(all) => assert!(
            all == layer.written,
            "iter gave other images than were written"
        ),
        Err(e) => names_the_file(&e),
    }
});
