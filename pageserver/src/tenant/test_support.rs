//! Helpers shared by the tests of the tenant modules.

use std::sync::Arc;

use pageserver_api::Key;

use crate::page_cache::{PageCache, PageCacheConfig};
use crate::PAGE_SZ;

/// A page cache of `pages` pages with default settings otherwise.
pub(crate) fn small_cache(pages: usize) -> Arc<PageCache> {
    Arc::new(
        PageCache::new(PageCacheConfig {
            capacity_bytes: (pages * PAGE_SZ) as u64,
            ..Default::default()
        })
        .expect("a valid test cache size"),
    )
}

/// Block `n` of one Postgres relation.
/// `len` bytes of a xorshift generator: what no compressor shrinks.
pub(crate) fn noise(len: usize) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub(crate) fn rel_key(n: u32) -> Key {
    Key::rel_block(1663, 5, 16384, 0, n)
}

/// The manifest entry of an image layer a test wrote by hand (one image creation's only file).
pub(crate) fn image_entry(
    written: &crate::tenant::storage_layer::image_layer::WrittenLayer,
) -> crate::tenant::timeline::layer_set::manifest::LayerFileEntry {
    crate::tenant::timeline::layer_set::manifest::LayerFileEntry {
        name: written.summary.file_name(),
        size: written.size,
        crc32c: written.crc32c,
        level: crate::tenant::timeline::layer_set::manifest::LayerLevel::Image,
        group_size: 1,
    }
}
