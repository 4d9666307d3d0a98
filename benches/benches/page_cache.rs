//! Our page cache against moka, quick_cache and a `Mutex<lru::LruCache>`, side by side in one run.
//!
//! Every benchmark id is `page_cache/{scenario}/{peer}` with peer one of `ours`, `moka`,
//! `quick_cache` and `mutex_lru`. The ids are a public contract: keep them stable.
//!
//! Scenarios (all caches hold [`CAPACITY`] pages of 8 KiB):
//!
//! * `hit_path`: 4096 resident pages, uniform lookups, every one a hit.
//! * `hit_path_2threads`: the same, with two threads splitting the ops (wall time).
//! * `cache_bench_mix`: the operation mix of RocksDB's `cache_bench` over 4x capacity keys.
//! * `scan_pollution`: zipf(0.8) reads of a hot set while 30% of the traffic is a one-pass scan.
//! * `prewarm_read`: blocks written into the cache are read back shortly after, next to hot reads.
//!   One step is three ops (insert, read-back, hot read) and throughput counts all three.
//! * `materialized`: "newest version at or below LSN" lookups of reconstructed pages: zipf(0.8)
//!   over 50,000 page keys with 1 to 4 versions each; a miss, or a hit on an older version than
//!   the one asked for, memorizes the needed version.
//!
//! Fairness: every peer holds the same bytes (real 8 KiB pages), keyed the same way. An insert
//! into ours copies the page into its arena; an insert into a peer allocates a fresh
//! `Arc<[u8; 8192]>` and copies the page into it, which is what a read into a heap page costs.
//! Op streams are generated up front from a printed seed, so generation is never timed, and all
//! peers replay the very same stream.
//!
//! Before the timed runs, one untimed pass per (scenario, peer) on a fresh cache prints hit
//! ratios and checks every page returned (wrong answers must be 0).
//!
//! Set `PAGE_CACHE_BENCH_SEED` (decimal or 0x-hex) to replay another stream, and
//! `PAGE_CACHE_BENCH_SKIP_RATIOS=1` to skip the hit-ratio passes.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::hint::black_box;
use std::num::NonZeroUsize;
use std::ops::Deref;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::Throughput;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion};
use lru::LruCache;
use pageserver::page_cache::{
    Arrival, FileId, MaterializedPageKey, PageCache, PageCacheConfig, PageLease, ReadThroughError,
};
use pageserver::PAGE_SZ;
use pageserver_api::Key;
use utils::{Lsn, TenantId, TimelineId};

type Page = [u8; PAGE_SZ];

/// Pages every cache holds.
const CAPACITY: usize = 8192;
/// Resident / hot keys for hit_path, scan_pollution and prewarm_read.
const HOT_KEYS: u32 = 4096;
/// cache_bench_mix key space: 4x capacity.
const MIX_KEYS: u32 = 4 * CAPACITY as u32;
/// Handles held at once in cache_bench_mix: a quarter of the capacity.
const MIX_HELD: usize = CAPACITY / 4;
/// prewarm_read reads back a block written between 1 and this many inserts earlier.
const PREWARM_MAX_DISTANCE: u32 = (CAPACITY / 16) as u32;
/// Block numbers handed to never-seen blocks (scan and pre-warm) start here, far from the others.
const FRESH_BASE: u32 = 1 << 24;
/// Zipf exponent of the hot reads.
const ZIPF_S: f64 = 0.8;

/// materialized: page keys, versions per key at most, and the "latest" request LSN.
const MAT_KEYS: usize = 50_000;
const MAT_VERSIONS: usize = 4;
const MAT_TIP: Lsn = Lsn(0x0000_7FFF_0000_0000);

/// Length of every op stream; also the number of ops in each untimed hit-ratio pass. The timed
/// runs cycle through it. A multiple of BATCH.
const STREAM_OPS: usize = 1 << 21;
/// Ops replayed (untimed) after populating a cache and before counting or timing.
const WARM_OPS: usize = 1 << 18;
/// Steps per criterion iteration.
const BATCH: usize = 1024;

const DEFAULT_SEED: u64 = 0x7A6E_C0DE_5EED_2024;

// ---------------------------------------------------------------------------------------------
// Deterministic randomness: splitmix64 (no `rand` dependency).

struct SplitMix(u64);

impl SplitMix {
    fn new(seed: u64) -> Self {
        SplitMix(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (multiply-high range reduction).
    fn below(&mut self, n: u64) -> u64 {
        scale(self.next_u64(), n)
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Maps a full-range 64-bit value onto `0..n`, keeping its order.
fn scale(raw: u64, n: u64) -> u64 {
    ((u128::from(raw) * u128::from(n)) >> 64) as u64
}

/// Zipf over ranks `0..n` by inverse CDF (binary search over a precomputed table).
struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: usize, s: f64) -> Self {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (1..=n)
            .map(|rank| {
                acc += (rank as f64).powf(-s);
                acc
            })
            .collect();
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }

    fn sample(&self, rng: &mut SplitMix) -> u32 {
        let u = rng.unit();
        let rank = self.cdf.partition_point(|&c| c <= u);
        rank.min(self.cdf.len() - 1) as u32
    }
}

fn seed_from_env() -> u64 {
    let Ok(text) = std::env::var("PAGE_CACHE_BENCH_SEED") else {
        return DEFAULT_SEED;
    };
    let text = text.trim();
    let parsed = match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.unwrap_or_else(|e| panic!("PAGE_CACHE_BENCH_SEED={text:?}: {e}"))
}

// ---------------------------------------------------------------------------------------------
// Page contents. Every page is a copy of one random template with a stamp in its first and last
// 8 bytes that says which page it is, so a returned page can be checked.

fn file_stamp(key: u32) -> (u64, u64) {
    let s = 0xF11E_0000_0000_0000 | u64::from(key);
    (s, !s)
}

fn mat_stamp(page: u32, lsn: Lsn) -> (u64, u64) {
    (0x3A7E_0000_0000_0000 | u64::from(page), lsn.0)
}

fn stamp(page: &mut Page, (head, tail): (u64, u64)) {
    page[..8].copy_from_slice(&head.to_le_bytes());
    page[PAGE_SZ - 8..].copy_from_slice(&tail.to_le_bytes());
}

fn stamp_of(page: &Page) -> (u64, u64) {
    let head = u64::from_le_bytes(page[..8].try_into().expect("8 bytes"));
    let tail = u64::from_le_bytes(page[PAGE_SZ - 8..].try_into().expect("8 bytes"));
    (head, tail)
}

/// "Reads the page from disk": copies the template into `dst` and stamps it.
#[inline]
fn fill(dst: &mut Page, template: &Page, stamp_value: (u64, u64)) {
    dst.copy_from_slice(template);
    stamp(dst, stamp_value);
}

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

/// The byte a lookup reads, spread over the page so that the access is real.
#[inline]
fn probe_offset(key: u32) -> usize {
    (key as usize).wrapping_mul(64 + 8) & (PAGE_SZ - 1)
}

// ---------------------------------------------------------------------------------------------
// The caches under test: file pages.

/// What a read-through returned.
enum Fetch<H> {
    Hit(H),
    /// Missed and inserted; here is the freshly cached page.
    Miss(H),
    /// Missed and the cache refused the insert (ours: every slot it met was pinned). The caller
    /// reads into a buffer of its own.
    Uncached,
}

trait FileCache: Sync + Sized {
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
struct Ours {
    cache: PageCache,
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

struct MokaFiles(moka::sync::Cache<u64, Arc<Page>>);

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

struct QuickFiles(quick_cache::sync::Cache<u64, Arc<Page>>);

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

struct LruFiles(Mutex<LruCache<u64, Arc<Page>>>);

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

trait VersionCache: Sync + Sized {
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

struct MokaVersions(moka::sync::Cache<MaterializedPageKey, Arc<Versions>>);

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

struct QuickVersions(quick_cache::sync::Cache<MaterializedPageKey, Arc<Versions>, VersionWeighter>);

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

struct LruVersions(Mutex<WeightedLru>);

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

// ---------------------------------------------------------------------------------------------
// Workloads.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FileScenario {
    HitPath,
    HitPath2Threads,
    CacheBenchMix,
    ScanPollution,
    PrewarmRead,
}

impl FileScenario {
    const ALL: [FileScenario; 5] = [
        FileScenario::HitPath,
        FileScenario::HitPath2Threads,
        FileScenario::CacheBenchMix,
        FileScenario::ScanPollution,
        FileScenario::PrewarmRead,
    ];

    fn name(self) -> &'static str {
        match self {
            FileScenario::HitPath => "hit_path",
            FileScenario::HitPath2Threads => "hit_path_2threads",
            FileScenario::CacheBenchMix => "cache_bench_mix",
            FileScenario::ScanPollution => "scan_pollution",
            FileScenario::PrewarmRead => "prewarm_read",
        }
    }

    /// Cache operations per op-stream entry (prewarm_read: insert, read-back, hot read).
    fn ops_per_step(self) -> u64 {
        match self {
            FileScenario::PrewarmRead => 3,
            _ => 1,
        }
    }

    fn held(self) -> usize {
        match self {
            FileScenario::CacheBenchMix => MIX_HELD,
            _ => 0,
        }
    }
}

// cache_bench_mix op kinds, in the top bits of an op; the key is in the low bits.
const MIX_KIND_SHIFT: u32 = 28;
const MIX_KEY_MASK: u32 = (1 << MIX_KIND_SHIFT) - 1;
const MIX_LOOKUP_INSERT: u32 = 0;
const MIX_INSERT_HOLD: u32 = 1;
const MIX_BLIND_INSERT: u32 = 2;
const MIX_LOOKUP: u32 = 3;
const MIX_ERASE_AS_LOOKUP: u32 = 4;

/// scan_pollution: the op that reads the next block of the scan.
const SCAN_NEXT: u32 = u32::MAX;

/// One materialized request: page `page` at `request`; `needed` is the version that answers it
/// exactly (the newest version of the page at or below `request`).
#[derive(Clone, Copy)]
struct MatOp {
    page: u32,
    request: Lsn,
    needed: Lsn,
}

struct Workloads {
    template: Box<Page>,
    hit_path: Vec<u32>,
    mix: Vec<u32>,
    scan: Vec<u32>,
    /// Low 16 bits: read-back distance; high 16 bits: hot key.
    prewarm: Vec<u32>,
    mat_keys: Vec<MaterializedPageKey>,
    /// Every page's versions, ascending.
    mat_versions: Vec<Vec<Lsn>>,
    mat_ops: Vec<MatOp>,
}

impl Workloads {
    fn generate(seed: u64) -> Self {
        // One independent generator per stream, so a stream does not change when another does.
        let mut seeds = SplitMix::new(seed);
        let mut rng = || SplitMix::new(seeds.next_u64());

        let mut r = rng();
        let mut template = Box::new([0u8; PAGE_SZ]);
        for chunk in template.chunks_exact_mut(8) {
            chunk.copy_from_slice(&r.next_u64().to_le_bytes());
        }

        let mut r = rng();
        let hit_path = (0..STREAM_OPS)
            .map(|_| r.below(u64::from(HOT_KEYS)) as u32)
            .collect();

        // cache_bench: the key is the smallest of 6 uniform draws, mapped onto the key space,
        // so low keys are much hotter than high ones.
        let mut r = rng();
        let mix = (0..STREAM_OPS)
            .map(|_| {
                let raw = (0..6).map(|_| r.next_u64()).min().expect("six draws");
                let key = scale(raw, u64::from(MIX_KEYS)) as u32;
                let kind = match r.below(100) {
                    0..=81 => MIX_LOOKUP_INSERT, // 82%
                    82..=83 => MIX_INSERT_HOLD,  // 2%
                    84..=88 => MIX_BLIND_INSERT, // 5%
                    89..=98 => MIX_LOOKUP,       // 10%
                    _ => MIX_ERASE_AS_LOOKUP,    // 1%
                };
                (kind << MIX_KIND_SHIFT) | key
            })
            .collect();

        let hot = Zipf::new(HOT_KEYS as usize, ZIPF_S);
        let mut r = rng();
        let scan = (0..STREAM_OPS)
            .map(|_| {
                if r.below(100) < 70 {
                    hot.sample(&mut r)
                } else {
                    SCAN_NEXT
                }
            })
            .collect();

        let mut r = rng();
        let prewarm = (0..STREAM_OPS)
            .map(|_| {
                let distance = 1 + r.below(u64::from(PREWARM_MAX_DISTANCE)) as u32;
                (hot.sample(&mut r) << 16) | distance
            })
            .collect();

        let mat_keys: Vec<MaterializedPageKey> = (0..MAT_KEYS as u32)
            .map(|p| MaterializedPageKey {
                tenant_id: TenantId::from_bytes([0x7E; 16]),
                timeline_id: TimelineId::from_bytes([0x71; 16]),
                key: Key::rel_block(1663, 13_000, 16_384 + p / 10_000, 0, p % 10_000),
            })
            .collect();
        let mut r = rng();
        let mat_versions: Vec<Vec<Lsn>> = (0..MAT_KEYS)
            .map(|_| {
                let count = 1 + r.below(MAT_VERSIONS as u64) as usize;
                let mut lsn = 0x0100_0000 + r.below(1 << 20) * 8;
                (0..count)
                    .map(|_| {
                        lsn += (1 + r.below(4096)) * 8;
                        Lsn(lsn)
                    })
                    .collect()
            })
            .collect();
        let pages = Zipf::new(MAT_KEYS, ZIPF_S);
        let mut r = rng();
        let mat_ops = (0..STREAM_OPS)
            .map(|_| {
                let page = pages.sample(&mut r);
                let versions = &mat_versions[page as usize];
                let newest = *versions.last().expect("at least one version");
                if r.below(100) < 80 || versions.len() == 1 {
                    // At the latest LSN (a single-version page has no older LSN to ask for).
                    MatOp {
                        page,
                        request: MAT_TIP,
                        needed: newest,
                    }
                } else {
                    // A random LSN from the first version up to just below the newest.
                    let first = versions[0].0;
                    let request = Lsn(first + r.below(newest.0 - first));
                    let below = versions.partition_point(|l| *l <= request);
                    MatOp {
                        page,
                        request,
                        needed: versions[below - 1],
                    }
                }
            })
            .collect();

        Workloads {
            template,
            hit_path,
            mix,
            scan,
            prewarm,
            mat_keys,
            mat_versions,
            mat_ops,
        }
    }

    fn file_ops(&self, scenario: FileScenario) -> &[u32] {
        match scenario {
            FileScenario::HitPath | FileScenario::HitPath2Threads => &self.hit_path,
            FileScenario::CacheBenchMix => &self.mix,
            FileScenario::ScanPollution => &self.scan,
            FileScenario::PrewarmRead => &self.prewarm,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Replaying op streams against a file page cache.

#[derive(Clone, Copy, Default)]
struct Tally {
    hits: u64,
    lookups: u64,
}

impl Tally {
    #[inline]
    fn record(&mut self, hit: bool) {
        self.lookups += 1;
        self.hits += u64::from(hit);
    }

    fn add(&mut self, other: Tally) {
        self.hits += other.hits;
        self.lookups += other.lookups;
    }

    fn percent(&self) -> String {
        if self.lookups == 0 {
            return "n/a".to_string();
        }
        format!("{:.2}%", 100.0 * self.hits as f64 / self.lookups as f64)
    }
}

/// One thread's replay state against one cache: held handles, counters and the position in the
/// op stream.
struct FileDriver<'c, C: FileCache> {
    cache: &'c C,
    template: &'c Page,
    /// The page a writer inserts from (its own buffer).
    scratch: Box<Page>,
    held: VecDeque<C::Handle<'c>>,
    hold_limit: usize,
    /// The next never-seen block (scan and pre-warm).
    fresh: u32,
    cursor: usize,
    verify: bool,
    wrong: u64,
    refused: u64,
    sink: u64,
    /// The headline lookups: every lookup (hit_path, mix) or the hot reads (scan, prewarm).
    main: Tally,
    /// Scan lookups (scan_pollution) or read-backs of pre-warmed blocks (prewarm_read).
    side: Tally,
}

impl<'c, C: FileCache> FileDriver<'c, C> {
    fn new(cache: &'c C, template: &'c Page, hold_limit: usize, verify: bool) -> Self {
        FileDriver {
            cache,
            template,
            scratch: Box::new(*template),
            held: VecDeque::with_capacity(hold_limit + 1),
            hold_limit,
            fresh: FRESH_BASE,
            cursor: 0,
            verify,
            wrong: 0,
            refused: 0,
            sink: 0,
            main: Tally::default(),
            side: Tally::default(),
        }
    }

    fn reset_counts(&mut self) {
        self.main = Tally::default();
        self.side = Tally::default();
        self.wrong = 0;
        self.refused = 0;
    }

    /// Reads one byte of a returned page; in verifying passes, checks the page is `key`'s.
    #[inline]
    fn touch(&mut self, key: u32, page: &Page) {
        self.sink = self.sink.wrapping_add(u64::from(page[probe_offset(key)]));
        if self.verify && stamp_of(page) != file_stamp(key) {
            self.wrong += 1;
        }
    }

    #[inline]
    fn hold(&mut self, handle: C::Handle<'c>) {
        if self.hold_limit == 0 {
            return;
        }
        if self.held.len() >= self.hold_limit {
            self.held.pop_front();
        }
        self.held.push_back(handle);
    }

    /// Read-through; returns whether it hit, and the page handle if it is cached.
    #[inline]
    fn read(&mut self, key: u32, arrival: Arrival) -> (bool, Option<C::Handle<'c>>) {
        let cache = self.cache;
        match cache.read_through(key, arrival, self.template) {
            Fetch::Hit(h) => {
                self.touch(key, &h);
                (true, Some(h))
            }
            Fetch::Miss(h) => {
                self.touch(key, &h);
                (false, Some(h))
            }
            Fetch::Uncached => {
                // The caller reads the page into a buffer of its own.
                self.refused += 1;
                fill(&mut self.scratch, self.template, file_stamp(key));
                (false, None)
            }
        }
    }

    /// Lookup only; returns the handle on a hit.
    #[inline]
    fn lookup(&mut self, key: u32) -> Option<C::Handle<'c>> {
        let cache = self.cache;
        let found = cache.lookup(key);
        if let Some(h) = &found {
            self.touch(key, h);
        }
        self.main.record(found.is_some());
        found
    }

    /// Prepares the writer's page for `key` in the scratch buffer.
    #[inline]
    fn write_scratch(&mut self, key: u32) {
        stamp(&mut self.scratch, file_stamp(key));
    }

    #[inline]
    fn step_hit(&mut self, key: u32) {
        // Every op a lookup; the lease or Arc is dropped right away.
        let _ = self.lookup(key);
    }

    #[inline]
    fn step_mix(&mut self, op: u32) {
        let key = op & MIX_KEY_MASK;
        let cache = self.cache;
        match op >> MIX_KIND_SHIFT {
            MIX_LOOKUP_INSERT => {
                let (hit, handle) = self.read(key, Arrival::ReadThrough);
                self.main.record(hit);
                if let Some(h) = handle {
                    self.hold(h);
                }
            }
            MIX_INSERT_HOLD => {
                self.write_scratch(key);
                match cache.insert_hold(key, Arrival::ReadThrough, &self.scratch) {
                    Some(h) => self.hold(h),
                    None => self.refused += 1,
                }
            }
            MIX_BLIND_INSERT => {
                self.write_scratch(key);
                if !cache.insert(key, Arrival::ReadThrough, &self.scratch) {
                    self.refused += 1;
                }
            }
            MIX_LOOKUP => {
                if let Some(h) = self.lookup(key) {
                    self.hold(h);
                }
            }
            _ => {
                // cache_bench's 1% erase: ours has no erase (a cached file page is never wrong,
                // it just ages out), so every peer does a plain lookup here instead, not held.
                let _ = self.lookup(key);
            }
        }
    }

    #[inline]
    fn step_scan(&mut self, op: u32) {
        if op == SCAN_NEXT {
            let key = self.fresh;
            self.fresh = self.fresh.wrapping_add(1);
            // Ours is told this page comes from a scan; the peers cannot be.
            let (hit, _) = self.read(key, Arrival::Scan);
            self.side.record(hit);
        } else {
            let (hit, _) = self.read(op, Arrival::ReadThrough);
            self.main.record(hit);
        }
    }

    /// Writes the next fresh block into the cache, as an ephemeral file's tail being written out.
    #[inline]
    fn prewarm_next(&mut self) -> u32 {
        let key = self.fresh;
        self.fresh = self.fresh.wrapping_add(1);
        self.write_scratch(key);
        if !self.cache.insert(key, Arrival::PreWarm, &self.scratch) {
            self.refused += 1;
        }
        key
    }

    #[inline]
    fn step_prewarm(&mut self, op: u32) {
        let written = self.prewarm_next();
        let back = written - (op & 0xFFFF);
        let (hit, _) = self.read(back, Arrival::ReadThrough);
        self.side.record(hit);
        let (hit, _) = self.read(op >> 16, Arrival::ReadThrough);
        self.main.record(hit);
    }

    fn run(&mut self, scenario: FileScenario, ops: &[u32]) {
        match scenario {
            FileScenario::HitPath | FileScenario::HitPath2Threads => {
                ops.iter().for_each(|&op| self.step_hit(op))
            }
            FileScenario::CacheBenchMix => ops.iter().for_each(|&op| self.step_mix(op)),
            FileScenario::ScanPollution => ops.iter().for_each(|&op| self.step_scan(op)),
            FileScenario::PrewarmRead => ops.iter().for_each(|&op| self.step_prewarm(op)),
        }
    }

    /// Replays the next `steps` ops from the cursor, wrapping around the stream.
    #[inline]
    fn run_next(&mut self, scenario: FileScenario, ops: &[u32], steps: usize) {
        let mut left = steps;
        while left > 0 {
            let n = left.min(ops.len() - self.cursor);
            self.run(scenario, &ops[self.cursor..self.cursor + n]);
            self.cursor = (self.cursor + n) % ops.len();
            left -= n;
        }
    }

    /// Fills a fresh cache for `scenario`, then replays the warm-up ops; counters start at 0.
    fn populate(&mut self, scenario: FileScenario, ops: &[u32]) {
        match scenario {
            FileScenario::HitPath | FileScenario::HitPath2Threads => {
                for key in 0..HOT_KEYS {
                    self.read(key, Arrival::ReadThrough);
                }
            }
            FileScenario::CacheBenchMix => {
                for key in 0..MIX_KEYS {
                    self.read(key, Arrival::ReadThrough);
                }
            }
            FileScenario::ScanPollution => {
                for key in 0..HOT_KEYS {
                    self.read(key, Arrival::ReadThrough);
                }
            }
            FileScenario::PrewarmRead => {
                for key in 0..HOT_KEYS {
                    self.read(key, Arrival::ReadThrough);
                }
                for _ in 0..PREWARM_MAX_DISTANCE {
                    self.prewarm_next();
                }
            }
        }
        if !matches!(
            scenario,
            FileScenario::HitPath | FileScenario::HitPath2Threads
        ) {
            self.run(scenario, &ops[..WARM_OPS]);
        }
        self.cache.settle();
        self.reset_counts();
    }
}

fn file_ratio_line(scenario: FileScenario, main: Tally, side: Tally, held: usize) -> String {
    match scenario {
        FileScenario::HitPath | FileScenario::HitPath2Threads => {
            format!("hit_ratio={}", main.percent())
        }
        FileScenario::CacheBenchMix => {
            format!("hit_ratio={} held={held}", main.percent())
        }
        FileScenario::ScanPollution => {
            let mut all = main;
            all.add(side);
            format!(
                "hit_ratio_hot={} hit_ratio_all={} hit_ratio_scan={}",
                main.percent(),
                all.percent(),
                side.percent()
            )
        }
        FileScenario::PrewarmRead => format!(
            "hit_ratio_prewarm={} hit_ratio_hot={}",
            side.percent(),
            main.percent()
        ),
    }
}

/// The untimed pass: a fresh cache, the whole op stream, counted and verified.
fn file_ratio_pass<C: FileCache>(w: &Workloads, scenario: FileScenario) {
    let cache = C::with_capacity(CAPACITY);
    let ops = w.file_ops(scenario);
    let started = Instant::now();
    let (main, side, wrong, refused, held) = if scenario == FileScenario::HitPath2Threads {
        let mut d = FileDriver::new(&cache, &w.template, 0, true);
        d.populate(scenario, ops);
        drop(d);
        let halves: Vec<_> = std::thread::scope(|s| {
            let workers: Vec<_> = ops
                .chunks(ops.len() / 2)
                .map(|half| {
                    let cache = &cache;
                    s.spawn(move || {
                        let mut d = FileDriver::new(cache, &w.template, 0, true);
                        d.run(scenario, half);
                        black_box(d.sink);
                        (d.main, d.wrong, d.refused)
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|t| t.join().expect("worker thread"))
                .collect()
        });
        let mut main = Tally::default();
        let (mut wrong, mut refused) = (0, 0);
        for (m, w, r) in halves {
            main.add(m);
            wrong += w;
            refused += r;
        }
        (main, Tally::default(), wrong, refused, 0)
    } else {
        let mut d = FileDriver::new(&cache, &w.template, scenario.held(), true);
        d.populate(scenario, ops);
        d.run(scenario, ops);
        black_box(d.sink);
        (d.main, d.side, d.wrong, d.refused, d.held.len())
    };
    println!(
        "page_cache/{}/{} {} wrong={wrong} refused={refused} ops={} pass_ms={}{}",
        scenario.name(),
        C::NAME,
        file_ratio_line(scenario, main, side, held),
        ops.len(),
        started.elapsed().as_millis(),
        cache.report()
    );
    assert_eq!(
        wrong,
        0,
        "{}/{} returned pages of other keys",
        scenario.name(),
        C::NAME
    );
}

/// The timed runs: a fresh, populated cache reused across all iterations. The cache is
/// populated on the first call of the benchmark closure, so ids that a command-line filter
/// leaves out cost nothing.
fn file_timed<C: FileCache>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    w: &Workloads,
    scenario: FileScenario,
) {
    let cache = C::with_capacity(CAPACITY);
    let ops = w.file_ops(scenario);
    group.throughput(Throughput::Elements(BATCH as u64 * scenario.ops_per_step()));
    let id = BenchmarkId::new(scenario.name(), C::NAME);
    if scenario == FileScenario::HitPath2Threads {
        let mut populated = false;
        // Each thread keeps its own place in its own half of the stream.
        let half = ops.len() / 2;
        let mut cursors = [0usize, 0usize];
        group.bench_function(id, |b| {
            if !populated {
                FileDriver::new(&cache, &w.template, 0, false).populate(scenario, ops);
                populated = true;
            }
            b.iter_custom(|iters| {
                let steps = iters as usize * BATCH / 2;
                let started = Instant::now();
                std::thread::scope(|s| {
                    for (t, cursor) in cursors.iter_mut().enumerate() {
                        let mine = &ops[t * half..(t + 1) * half];
                        let cache = &cache;
                        s.spawn(move || {
                            let mut d = FileDriver::new(cache, &w.template, 0, false);
                            d.cursor = *cursor;
                            d.run_next(scenario, mine, steps);
                            *cursor = d.cursor;
                            black_box(d.sink);
                        });
                    }
                });
                started.elapsed()
            })
        });
    } else {
        let mut driver = None;
        group.bench_function(id, |b| {
            let driver = driver.get_or_insert_with(|| {
                let mut d = FileDriver::new(&cache, &w.template, scenario.held(), false);
                d.populate(scenario, ops);
                d
            });
            b.iter_custom(|iters| {
                let started = Instant::now();
                for _ in 0..iters {
                    driver.run_next(scenario, ops, BATCH);
                }
                started.elapsed()
            })
        });
        if let Some(d) = driver {
            black_box(d.sink);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Replaying materialized requests.

struct VersionDriver<'c, V: VersionCache> {
    cache: &'c V,
    w: &'c Workloads,
    scratch: Box<Page>,
    cursor: usize,
    verify: bool,
    wrong: u64,
    refused: u64,
    sink: u64,
    /// Hits on exactly the needed version.
    exact: Tally,
    /// Hits on any usable version (an older one is a base image: records must be replayed).
    usable: Tally,
}

impl<'c, V: VersionCache> VersionDriver<'c, V> {
    fn new(cache: &'c V, w: &'c Workloads, verify: bool) -> Self {
        VersionDriver {
            cache,
            w,
            scratch: w.template.clone(),
            cursor: 0,
            verify,
            wrong: 0,
            refused: 0,
            sink: 0,
            exact: Tally::default(),
            usable: Tally::default(),
        }
    }

    fn reset_counts(&mut self) {
        self.exact = Tally::default();
        self.usable = Tally::default();
        self.wrong = 0;
        self.refused = 0;
    }

    /// Checks an answer: at or below the request, a real version of that page, and the bytes
    /// of that (page, version).
    fn check(&self, op: &MatOp, lsn: Lsn, page: &Page) -> bool {
        lsn <= op.request
            && self.w.mat_versions[op.page as usize].contains(&lsn)
            && stamp_of(page) == mat_stamp(op.page, lsn)
    }

    #[inline]
    fn step(&mut self, op: &MatOp) {
        let cache = self.cache;
        let key = &self.w.mat_keys[op.page as usize];
        let found = cache.lookup(key, op.request);
        let exact = match &found {
            Some((lsn, page)) => {
                self.sink = self
                    .sink
                    .wrapping_add(u64::from(page[probe_offset(op.page)]));
                if self.verify && !self.check(op, *lsn, page) {
                    self.wrong += 1;
                }
                *lsn == op.needed
            }
            None => false,
        };
        self.usable.record(found.is_some());
        self.exact.record(exact);
        drop(found);
        if !exact {
            // Reconstruct the needed version (from the base image, if any) and remember it.
            fill(
                &mut self.scratch,
                &self.w.template,
                mat_stamp(op.page, op.needed),
            );
            if !cache.memorize(key, op.needed, &self.scratch) {
                self.refused += 1;
            }
        }
    }

    fn run(&mut self, ops: &[MatOp]) {
        ops.iter().for_each(|op| self.step(op));
    }

    #[inline]
    fn run_next(&mut self, steps: usize) {
        let w = self.w;
        let ops = &w.mat_ops;
        let mut left = steps;
        while left > 0 {
            let n = left.min(ops.len() - self.cursor);
            self.run(&ops[self.cursor..self.cursor + n]);
            self.cursor = (self.cursor + n) % ops.len();
            left -= n;
        }
    }

    fn populate(&mut self) {
        let w = self.w;
        self.run(&w.mat_ops[..WARM_OPS]);
        self.cache.settle();
        self.reset_counts();
    }
}

fn version_ratio_pass<V: VersionCache>(w: &Workloads) {
    let cache = V::with_capacity(CAPACITY);
    let started = Instant::now();
    let mut d = VersionDriver::new(&cache, w, true);
    d.populate();
    d.run(&w.mat_ops);
    black_box(d.sink);
    println!(
        "page_cache/materialized/{} hit_ratio_exact={} hit_ratio_any={} wrong={} refused={} ops={} pass_ms={}{}",
        V::NAME,
        d.exact.percent(),
        d.usable.percent(),
        d.wrong,
        d.refused,
        w.mat_ops.len(),
        started.elapsed().as_millis(),
        cache.report()
    );
    assert_eq!(d.wrong, 0, "materialized/{} gave wrong versions", V::NAME);
}

fn version_timed<V: VersionCache>(group: &mut BenchmarkGroup<'_, WallTime>, w: &Workloads) {
    let cache = V::with_capacity(CAPACITY);
    let mut driver = None;
    group.throughput(Throughput::Elements(BATCH as u64));
    group.bench_function(BenchmarkId::new("materialized", V::NAME), |b| {
        let driver = driver.get_or_insert_with(|| {
            let mut d = VersionDriver::new(&cache, w, false);
            d.populate();
            d
        });
        b.iter_custom(|iters| {
            let started = Instant::now();
            for _ in 0..iters {
                driver.run_next(BATCH);
            }
            started.elapsed()
        })
    });
    if let Some(d) = driver {
        black_box(d.sink);
    }
}

// ---------------------------------------------------------------------------------------------

/// Calls `run::<Peer>(args)` for ours and each peer, in the order the ids are reported.
/// `Files` picks the file page implementations, `Versions` the materialized ones.
macro_rules! for_each_peer {
    (@ours $kind:ident) => { Ours };
    (@moka Files) => { MokaFiles };
    (@moka Versions) => { MokaVersions };
    (@quick Files) => { QuickFiles };
    (@quick Versions) => { QuickVersions };
    (@lru Files) => { LruFiles };
    (@lru Versions) => { LruVersions };
    ($run:ident :: <$kind:ident> ( $($arg:expr),* )) => {{
        $run::<for_each_peer!(@ours $kind)>($($arg),*);
        $run::<for_each_peer!(@moka $kind)>($($arg),*);
        $run::<for_each_peer!(@quick $kind)>($($arg),*);
        $run::<for_each_peer!(@lru $kind)>($($arg),*);
    }};
}

fn page_cache(c: &mut Criterion) {
    let seed = seed_from_env();
    println!("page_cache: seed={seed:#x} (set PAGE_CACHE_BENCH_SEED to change)");
    let w = Workloads::generate(seed);

    let probe = <Ours as FileCache>::with_capacity(CAPACITY);
    println!(
        "page_cache: ours metadata bytes per page = {} ({} bytes for {} pages)",
        probe.cache.metadata_bytes() / CAPACITY,
        probe.cache.metadata_bytes(),
        CAPACITY
    );
    drop(probe);

    // Hit ratios first, on fresh caches, untimed. `--list` only wants the names, and
    // PAGE_CACHE_BENCH_SKIP_RATIOS=1 skips them (e.g. when profiling one id).
    let listing = std::env::args().any(|a| a == "--list");
    let skip = std::env::var_os("PAGE_CACHE_BENCH_SKIP_RATIOS").is_some_and(|v| v == "1");
    if !listing && !skip {
        for scenario in FileScenario::ALL {
            for_each_peer!(file_ratio_pass::<Files>(&w, scenario));
        }
        for_each_peer!(version_ratio_pass::<Versions>(&w));
    }

    let mut group = c.benchmark_group("page_cache");
    for scenario in FileScenario::ALL {
        for_each_peer!(file_timed::<Files>(&mut group, &w, scenario));
    }
    for_each_peer!(version_timed::<Versions>(&mut group, &w));
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1))
        .sample_size(20);
    targets = page_cache
}
criterion_main!(benches);
