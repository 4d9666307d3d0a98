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
pub(crate) fn rel_key(n: u32) -> Key {
    Key::rel_block(1663, 5, 16384, 0, n)
}
