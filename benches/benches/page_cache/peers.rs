//! The caches under test, ours and the peers (moka, quick_cache, `Mutex<lru::LruCache>`), behind
//! one trait for file pages and one for materialized page versions.

use std::convert::Infallible;
use std::num::NonZeroUsize;
use std::ops::Deref;
use std::sync::{Arc, Mutex, MutexGuard};

use lru::LruCache;
use pageserver::page_cache::{
    Arrival, FileId, MaterializedPageKey, PageCache, PageCacheConfig, PageLease, ReadThroughError,
};
use pageserver::PAGE_SZ;
use utils::Lsn;

use crate::workloads::{file_stamp, fill, stamp, Page, MAT_VERSIONS};

/// A fresh heap page for a peer: one allocation and one 8 KiB copy.
#[inline]
fn heap_page(src: &Page) -> Arc<Page> {
    Arc::<[u8]>::from(&src[..])
        .try_into()
        .expect("a page-sized slice")
}

/// A fresh heap page filled as if read from disk.
#[inline]
fn heap_page_filled(template: &Page, stamp_value: (u64, u64)) -> Arc<Page> {
    let mut page = heap_page(template);
    stamp(
        Arc::get_mut(&mut page).expect("just allocated, not shared"),
        stamp_value,
    );
    page
}

// ---------------------------------------------------------------------------------------------
// The caches under test: file pages.

/// What a read-through returned.
pub(crate) enum Fetch<H> {
    Hit(H),
    /// Missed and inserted; here is the freshly cached page.
    Miss(H),
    /// Missed and the cache refused the insert (ours: every slot it met was pinned). The caller
    /// reads into a buffer of its own.
    Uncached,
}

pub(crate) trait FileCache: Sync + Sized {
    const NAME: &'static str;
    /// A reference that keeps one page readable.
    type Handle<'a>: Deref<Target = Page>
    where
        Self: 'a;

    fn with_capacity(pages: usize) -> Self;
    fn lookup(&self, key: u32) -> Option<Self::Handle<'_>>;
    /// Lookup; on a miss, read the page (`fill` from `template`) into the cache.
    fn read_through(&self, key: u32, arrival: Arrival, template: &Page) -> Fetch<Self::Handle<'_>>;
    /// Inserts a copy of `src` without keeping a reference. False if the cache refused it.
    fn insert(&self, key: u32, arrival: Arrival, src: &Page) -> bool;
    /// Inserts a copy of `src` and returns a reference to the cached page.
    fn insert_hold(&self, key: u32, arrival: Arrival, src: &Page) -> Option<Self::Handle<'_>>;
    /// Lets the cache finish deferred work (moka's maintenance) after populating it.
    fn settle(&self) {}
    /// Extra facts for the hit-ratio line.
    fn report(&self) -> String {
        String::new()
    }
}

/// Ours: one `PageCache`, all file pages under one `FileId`.
pub(crate) struct Ours {
    pub(crate) cache: PageCache,
    file: FileId,
}

fn describe_ours(cache: &PageCache) -> String {
    let s = cache.stats();
    format!(
        " [ours: file_evictions={} mat_evictions={} refused={} duplicate={} pinned_now={}]",
        s.file_pages.evictions,
        s.materialized_pages.evictions,
        s.inserts_refused,
        s.inserts_duplicate,
        s.pinned_pages
    )
}

impl FileCache for Ours {
    const NAME: &'static str = "ours";
    type Handle<'a> = PageLease<'a>;

    fn with_capacity(pages: usize) -> Self {
        let cache = PageCache::new(PageCacheConfig {
            capacity_bytes: (pages * PAGE_SZ) as u64,
            ..Default::default()
        })
        .expect("valid page cache size");
        Ours {
            cache,
            file: FileId::next(),
        }
    }

    #[inline]
    fn lookup(&self, key: u32) -> Option<PageLease<'_>> {
        self.cache.get_file_page(self.file, key)
    }

    #[inline]
    fn read_through(&self, key: u32, arrival: Arrival, template: &Page) -> Fetch<PageLease<'_>> {
        let mut filled = false;
        let got = self.cache.read_file_page(self.file, key, arrival, |frame| {
            filled = true;
            fill(frame, template, file_stamp(key));
            Ok::<(), Infallible>(())
        });
        match got {
            Ok(lease) if filled => Fetch::Miss(lease),
            Ok(lease) => Fetch::Hit(lease),
            Err(ReadThroughError::NoFreeSlot(_)) => Fetch::Uncached,
            Err(ReadThroughError::Fill(never)) => match never {},
        }
    }

    #[inline]
    fn insert(&self, key: u32, arrival: Arrival, src: &Page) -> bool {
        self.cache
            .insert_file_page(self.file, key, src, arrival)
            .is_ok()
    }

    #[inline]
    fn insert_hold(&self, key: u32, arrival: Arrival, src: &Page) -> Option<PageLease<'_>> {
        // File pages are immutable: if the block is already cached this returns that copy
        // instead of replacing it (the peers replace, as RocksDB's Insert does).
        self.cache
            .read_file_page(self.file, key, arrival, |frame| {
                frame.copy_from_slice(src);
                Ok::<(), Infallible>(())
            })
            .ok()
    }

    fn report(&self) -> String {
        describe_ours(&self.cache)
    }
}

pub(crate) struct MokaFiles(moka::sync::Cache<u64, Arc<Page>>);

impl FileCache for MokaFiles {
    const NAME: &'static str = "moka";
    type Handle<'a> = Arc<Page>;

    fn with_capacity(pages: usize) -> Self {
        MokaFiles(
            moka::sync::Cache::builder()
                .max_capacity(pages as u64)
                .build(),
        )
    }

    #[inline]
    fn lookup(&self, key: u32) -> Option<Arc<Page>> {
        self.0.get(&u64::from(key))
    }

    #[inline]
    fn read_through(&self, key: u32, _: Arrival, template: &Page) -> Fetch<Arc<Page>> {
        if let Some(page) = self.0.get(&u64::from(key)) {
            return Fetch::Hit(page);
        }
        let page = heap_page_filled(template, file_stamp(key));
        self.0.insert(u64::from(key), Arc::clone(&page));
        Fetch::Miss(page)
    }

    #[inline]
    fn insert(&self, key: u32, _: Arrival, src: &Page) -> bool {
        self.0.insert(u64::from(key), heap_page(src));
        true
    }

    #[inline]
    fn insert_hold(&self, key: u32, _: Arrival, src: &Page) -> Option<Arc<Page>> {
        let page = heap_page(src);
        self.0.insert(u64::from(key), Arc::clone(&page));
        Some(page)
    }

    fn settle(&self) {
        self.0.run_pending_tasks();
    }

    fn report(&self) -> String {
        self.0.run_pending_tasks();
        format!(" [moka: entries={}]", self.0.entry_count())
    }
}

pub(crate) struct QuickFiles(quick_cache::sync::Cache<u64, Arc<Page>>);

impl FileCache for QuickFiles {
    const NAME: &'static str = "quick_cache";
    type Handle<'a> = Arc<Page>;

    fn with_capacity(pages: usize) -> Self {
        QuickFiles(quick_cache::sync::Cache::new(pages))
    }

    #[inline]
    fn lookup(&self, key: u32) -> Option<Arc<Page>> {
        self.0.get(&u64::from(key))
    }

    #[inline]
    fn read_through(&self, key: u32, _: Arrival, template: &Page) -> Fetch<Arc<Page>> {
        if let Some(page) = self.0.get(&u64::from(key)) {
            return Fetch::Hit(page);
        }
        let page = heap_page_filled(template, file_stamp(key));
        self.0.insert(u64::from(key), Arc::clone(&page));
        Fetch::Miss(page)
    }

    #[inline]
    fn insert(&self, key: u32, _: Arrival, src: &Page) -> bool {
        self.0.insert(u64::from(key), heap_page(src));
        true
    }

    #[inline]
    fn insert_hold(&self, key: u32, _: Arrival, src: &Page) -> Option<Arc<Page>> {
        let page = heap_page(src);
        self.0.insert(u64::from(key), Arc::clone(&page));
        Some(page)
    }

    fn report(&self) -> String {
        format!(" [quick_cache: entries={}]", self.0.len())
    }
}

pub(crate) struct LruFiles(Mutex<LruCache<u64, Arc<Page>>>);

impl LruFiles {
    #[inline]
    fn locked(&self) -> MutexGuard<'_, LruCache<u64, Arc<Page>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Inserts and drops whatever was replaced or evicted after the lock is released.
    #[inline]
    fn put(&self, key: u32, page: Arc<Page>) {
        let displaced = self.locked().push(u64::from(key), page);
        drop(displaced);
    }
}

impl FileCache for LruFiles {
    const NAME: &'static str = "mutex_lru";
    type Handle<'a> = Arc<Page>;

    fn with_capacity(pages: usize) -> Self {
        let cap = NonZeroUsize::new(pages).expect("non-zero capacity");
        LruFiles(Mutex::new(LruCache::new(cap)))
    }

    #[inline]
    fn lookup(&self, key: u32) -> Option<Arc<Page>> {
        self.locked().get(&u64::from(key)).cloned()
    }

    #[inline]
    fn read_through(&self, key: u32, _: Arrival, template: &Page) -> Fetch<Arc<Page>> {
        if let Some(page) = self.lookup(key) {
            return Fetch::Hit(page);
        }
        let page = heap_page_filled(template, file_stamp(key));
        self.put(key, Arc::clone(&page));
        Fetch::Miss(page)
    }

    #[inline]
    fn insert(&self, key: u32, _: Arrival, src: &Page) -> bool {
        self.put(key, heap_page(src));
        true
    }

    #[inline]
    fn insert_hold(&self, key: u32, _: Arrival, src: &Page) -> Option<Arc<Page>> {
        let page = heap_page(src);
        self.put(key, Arc::clone(&page));
        Some(page)
    }

    fn report(&self) -> String {
        format!(" [mutex_lru: entries={}]", self.locked().len())
    }
}

// ---------------------------------------------------------------------------------------------
// The caches under test: materialized page versions.

/// A peer's value: the cached versions of one page key, ascending by LSN, at most
/// [`MAT_VERSIONS`]. Replaced as a whole (read-copy-replace) when a version is added.
type Versions = Vec<(Lsn, Arc<Page>)>;

pub(crate) trait VersionCache: Sync + Sized {
    const NAME: &'static str;
    type Handle<'a>: Deref<Target = Page>
    where
        Self: 'a;

    fn with_capacity(pages: usize) -> Self;
    /// The newest cached version of `key` at or below `lsn`.
    fn lookup(&self, key: &MaterializedPageKey, lsn: Lsn) -> Option<(Lsn, Self::Handle<'_>)>;
    /// Caches version `lsn` of `key`. False if the cache refused it.
    fn memorize(&self, key: &MaterializedPageKey, lsn: Lsn, page: &Page) -> bool;
    fn settle(&self) {}
    fn report(&self) -> String {
        String::new()
    }
}

impl VersionCache for Ours {
    const NAME: &'static str = "ours";
    type Handle<'a> = PageLease<'a>;

    fn with_capacity(pages: usize) -> Self {
        <Ours as FileCache>::with_capacity(pages)
    }

    #[inline]
    fn lookup(&self, key: &MaterializedPageKey, lsn: Lsn) -> Option<(Lsn, PageLease<'_>)> {
        self.cache.lookup_materialized(key, lsn)
    }

    #[inline]
    fn memorize(&self, key: &MaterializedPageKey, lsn: Lsn, page: &Page) -> bool {
        self.cache.memorize_materialized(key, lsn, page).is_ok()
    }

    fn report(&self) -> String {
        describe_ours(&self.cache)
    }
}

/// The newest version at or below `lsn` in an ascending list.
#[inline]
fn newest_at_or_below(versions: &Versions, lsn: Lsn) -> Option<(Lsn, Arc<Page>)> {
    let below = versions.partition_point(|(l, _)| *l <= lsn);
    let (found, page) = versions.get(below.checked_sub(1)?)?;
    Some((*found, Arc::clone(page)))
}

/// `current` plus version `lsn`, or None if `lsn` is already there. Drops the oldest version
/// beyond [`MAT_VERSIONS`], as ours does.
#[inline]
fn with_version(current: Option<&Versions>, lsn: Lsn, page: &Page) -> Option<Versions> {
    let mut next = Vec::with_capacity(MAT_VERSIONS + 1);
    if let Some(current) = current {
        next.extend(current.iter().cloned());
    }
    let pos = match next.binary_search_by_key(&lsn, |(l, _)| *l) {
        Ok(_) => return None,
        Err(pos) => pos,
    };
    next.insert(pos, (lsn, heap_page(page)));
    if next.len() > MAT_VERSIONS {
        next.remove(0);
    }
    Some(next)
}

fn versions_weight(versions: &Versions) -> u32 {
    versions.len() as u32
}

pub(crate) struct MokaVersions(moka::sync::Cache<MaterializedPageKey, Arc<Versions>>);

impl VersionCache for MokaVersions {
    const NAME: &'static str = "moka";
    type Handle<'a> = Arc<Page>;

    fn with_capacity(pages: usize) -> Self {
        MokaVersions(
            moka::sync::Cache::builder()
                .max_capacity(pages as u64)
                .weigher(|_: &MaterializedPageKey, v: &Arc<Versions>| versions_weight(v))
                .build(),
        )
    }

    #[inline]
    fn lookup(&self, key: &MaterializedPageKey, lsn: Lsn) -> Option<(Lsn, Arc<Page>)> {
        let versions = self.0.get(key)?;
        newest_at_or_below(&versions, lsn)
    }

    #[inline]
    fn memorize(&self, key: &MaterializedPageKey, lsn: Lsn, page: &Page) -> bool {
        let current = self.0.get(key);
        if let Some(next) = with_version(current.as_deref(), lsn, page) {
            self.0.insert(*key, Arc::new(next));
        }
        true
    }

    fn settle(&self) {
        self.0.run_pending_tasks();
    }

    fn report(&self) -> String {
        self.0.run_pending_tasks();
        format!(
            " [moka: keys={} versions={}]",
            self.0.entry_count(),
            self.0.weighted_size()
        )
    }
}

#[derive(Clone)]
struct VersionWeighter;

impl quick_cache::Weighter<MaterializedPageKey, Arc<Versions>> for VersionWeighter {
    fn weight(&self, _: &MaterializedPageKey, v: &Arc<Versions>) -> u64 {
        u64::from(versions_weight(v))
    }
}

pub(crate) struct QuickVersions(
    quick_cache::sync::Cache<MaterializedPageKey, Arc<Versions>, VersionWeighter>,
);

impl VersionCache for QuickVersions {
    const NAME: &'static str = "quick_cache";
    type Handle<'a> = Arc<Page>;

    fn with_capacity(pages: usize) -> Self {
        QuickVersions(quick_cache::sync::Cache::with_weighter(
            pages,
            pages as u64,
            VersionWeighter,
        ))
    }

    #[inline]
    fn lookup(&self, key: &MaterializedPageKey, lsn: Lsn) -> Option<(Lsn, Arc<Page>)> {
        let versions = self.0.get(key)?;
        newest_at_or_below(&versions, lsn)
    }

    #[inline]
    fn memorize(&self, key: &MaterializedPageKey, lsn: Lsn, page: &Page) -> bool {
        let current = self.0.peek(key);
        if let Some(next) = with_version(current.as_deref(), lsn, page) {
            self.0.insert(*key, Arc::new(next));
        }
        true
    }

    fn report(&self) -> String {
        format!(
            " [quick_cache: keys={} versions={}]",
            self.0.len(),
            self.0.weight()
        )
    }
}

/// An LRU of page keys bounded by the total number of versions it holds.
struct WeightedLru {
    map: LruCache<MaterializedPageKey, Arc<Versions>>,
    weight: usize,
    capacity: usize,
}

pub(crate) struct LruVersions(Mutex<WeightedLru>);

impl LruVersions {
    #[inline]
    fn locked(&self) -> MutexGuard<'_, WeightedLru> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl VersionCache for LruVersions {
    const NAME: &'static str = "mutex_lru";
    type Handle<'a> = Arc<Page>;

    fn with_capacity(pages: usize) -> Self {
        LruVersions(Mutex::new(WeightedLru {
            map: LruCache::unbounded(),
            weight: 0,
            capacity: pages,
        }))
    }

    #[inline]
    fn lookup(&self, key: &MaterializedPageKey, lsn: Lsn) -> Option<(Lsn, Arc<Page>)> {
        let versions = self.locked().map.get(key).cloned()?;
        newest_at_or_below(&versions, lsn)
    }

    #[inline]
    fn memorize(&self, key: &MaterializedPageKey, lsn: Lsn, page: &Page) -> bool {
        let current = self.locked().map.peek(key).cloned();
        let Some(next) = with_version(current.as_deref(), lsn, page) else {
            return true;
        };
        let added = next.len();
        let mut evicted = Vec::new();
        {
            let mut lru = self.locked();
            let lru = &mut *lru;
            if let Some((_, old)) = lru.map.push(*key, Arc::new(next)) {
                lru.weight -= old.len();
                evicted.push(old);
            }
            lru.weight += added;
            while lru.weight > lru.capacity {
                let Some((_, old)) = lru.map.pop_lru() else {
                    break;
                };
                lru.weight -= old.len();
                evicted.push(old);
            }
        }
        // Freed after the lock is released.
        drop(evicted);
        drop(current);
        true
    }

    fn report(&self) -> String {
        let lru = self.locked();
        format!(
            " [mutex_lru: keys={} versions={}]",
            lru.map.len(),
            lru.weight
        )
    }
}
