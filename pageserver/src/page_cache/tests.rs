//! Page cache tests: single-threaded behaviour, a `BTreeMap` model for materialized lookups, and
//! many-thread stress (with forced hash collisions) that checks every lease sees its own bytes.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use pageserver_api::Key;
use utils::{Lsn, TenantId, TimelineId};

use super::*;

fn cache(pages: usize) -> PageCache {
    cache_with(pages, None)
}

fn cache_with(pages: usize, degenerate_hash_bits: Option<u32>) -> PageCache {
    PageCache::new(PageCacheConfig {
        capacity_bytes: (pages * PAGE_SZ) as u64,
        degenerate_hash_bits,
        ..PageCacheConfig::default()
    })
    .unwrap()
}

/// A page whose every byte is derived from its identity, so a lease can prove it holds the
/// right page and not a neighbour's.
fn page_of(a: u64, b: u64) -> Box<[u8; PAGE_SZ]> {
    let mut page = Box::new([0u8; PAGE_SZ]);
    let seed = mix(a ^ mix(b));
    for (i, chunk) in page.chunks_exact_mut(8).enumerate() {
        chunk.copy_from_slice(&mix(seed ^ i as u64).to_le_bytes());
    }
    page
}

/// Reads block `blk` of `file` through the cache, filling a miss with its stamped page.
fn read_stamped(
    cache: &PageCache,
    file: FileId,
    blk: u32,
) -> Result<PageLease<'_>, ReadThroughError<()>> {
    cache.read_file_page(file, blk, Arrival::ReadThrough, |f| {
        f.copy_from_slice(&page_of(file.get(), blk.into())[..]);
        Ok(())
    })
}

fn assert_page(lease: &[u8; PAGE_SZ], a: u64, b: u64) {
    assert!(
        lease[..] == page_of(a, b)[..],
        "lease for ({a}, {b}) holds another page's bytes"
    );
}

/// xorshift64*: small, seeded, reproducible.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn seed() -> u64 {
    let seed = std::env::var("PAGE_CACHE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_1234_abcd_0001);
    eprintln!("PAGE_CACHE_TEST_SEED={seed}");
    seed
}

#[test]
fn config_rejects_sizes_out_of_range() {
    let too_small = PageCache::new(PageCacheConfig {
        capacity_bytes: PAGE_SZ as u64,
        ..Default::default()
    });
    let err = too_small.err().unwrap().to_string();
    assert!(err.contains("too small"), "{err}");
    let too_large = PageCache::new(PageCacheConfig {
        capacity_bytes: u64::MAX,
        ..Default::default()
    });
    assert!(matches!(
        too_large,
        Err(PageCacheConfigError::TooLarge { .. })
    ));
}

#[test]
fn insert_then_get_and_read_through() {
    let cache = cache(16);
    let file = FileId::next();
    assert!(cache.get_file_page(file, 0).is_none());
    cache
        .insert_file_page(file, 0, &page_of(file.get(), 0), Arrival::PreWarm)
        .unwrap();
    assert_page(&cache.get_file_page(file, 0).unwrap(), file.get(), 0);

    let mut fills = 0;
    for _ in 0..3 {
        let lease = cache
            .read_file_page(file, 1, Arrival::ReadThrough, |frame| {
                fills += 1;
                frame.copy_from_slice(&page_of(file.get(), 1)[..]);
                Ok::<_, ()>(())
            })
            .unwrap();
        assert_page(&lease, file.get(), 1);
    }
    assert_eq!(fills, 1, "only the first read goes to the file");

    let stats = cache.stats();
    assert_eq!(stats.file_pages.inserts, 2);
    assert_eq!(stats.file_pages.hits, 3);
    assert_eq!(stats.file_pages.misses, 2);
    assert_eq!(stats.file_pages.accesses, 5);
    assert_eq!(stats.file_pages.bytes_resident, 2 * PAGE_SZ as u64);
    assert_eq!(stats.pinned_pages, 0);
}

#[test]
fn failed_fill_caches_nothing() {
    let cache = cache(8);
    let file = FileId::next();
    let err = cache
        .read_file_page(file, 3, Arrival::ReadThrough, |_| Err("disk on fire"))
        .unwrap_err();
    assert!(matches!(err, ReadThroughError::Fill("disk on fire")));
    assert!(cache.get_file_page(file, 3).is_none());
    assert_eq!(cache.stats().file_pages.bytes_resident, 0);
    // The slot went back to Empty and is usable again.
    for blk in 0..8 {
        cache
            .insert_file_page(
                file,
                blk,
                &page_of(file.get(), blk.into()),
                Arrival::PreWarm,
            )
            .unwrap();
    }
    for blk in 0..8 {
        assert_page(
            &cache.get_file_page(file, blk).unwrap(),
            file.get(),
            blk.into(),
        );
    }
}

#[test]
fn duplicate_insert_keeps_one_copy() {
    let cache = cache(8);
    let file = FileId::next();
    let page = page_of(file.get(), 0);
    cache
        .insert_file_page(file, 0, &page, Arrival::PreWarm)
        .unwrap();
    cache
        .insert_file_page(file, 0, &page, Arrival::PreWarm)
        .unwrap();
    let stats = cache.stats();
    assert_eq!(stats.file_pages.inserts, 1);
    assert_eq!(stats.inserts_duplicate, 1);
    assert_eq!(stats.file_pages.bytes_resident, PAGE_SZ as u64);
}

#[test]
fn pinned_pages_survive_any_number_of_inserts() {
    let cache = cache(16);
    let file = FileId::next();
    for blk in 0..16 {
        cache
            .insert_file_page(file, blk, &page_of(file.get(), blk.into()), Arrival::Scan)
            .unwrap();
    }
    let pinned: Vec<_> = (0..12)
        .map(|blk| cache.get_file_page(file, blk).unwrap())
        .collect();
    let other = FileId::next();
    for blk in 0..1000 {
        // Some inserts may be refused when the few unpinned slots are busy; that's allowed.
        let _ = cache.insert_file_page(
            other,
            blk,
            &page_of(other.get(), blk.into()),
            Arrival::ReadThrough,
        );
    }
    for (blk, lease) in pinned.iter().enumerate() {
        assert_page(lease, file.get(), blk as u64);
        assert!(cache.get_file_page(file, blk as u32).is_some());
    }
    assert_eq!(cache.stats().pinned_pages, 12);
}

#[test]
fn full_of_pinned_pages_refuses_insert_with_bounded_effort() {
    let cache = cache(32);
    let file = FileId::next();
    let leases: Vec<_> = (0..32)
        .map(|blk| read_stamped(&cache, file, blk).unwrap())
        .collect();
    let err = cache
        .insert_file_page(file, 99, &page_of(0, 0), Arrival::PreWarm)
        .unwrap_err();
    let InsertError::AllPinned { pinned_seen } = err else {
        panic!("expected AllPinned, got {err:?}");
    };
    assert!(
        pinned_seen <= PageCacheConfig::default().eviction_effort_cap,
        "gave up after {pinned_seen} pinned slots"
    );
    let mut called = false;
    let refused = cache.read_file_page(file, 100, Arrival::ReadThrough, |_| {
        called = true;
        Ok::<_, ()>(())
    });
    assert!(matches!(refused, Err(ReadThroughError::NoFreeSlot(_))));
    assert!(!called, "fill must not run when there is no slot to fill");
    assert_eq!(cache.stats().inserts_refused, 2);
    drop(leases);
    cache
        .insert_file_page(file, 99, &page_of(file.get(), 99), Arrival::PreWarm)
        .expect("unpinned pages are evictable again");
}

#[test]
fn drop_unpinned_keeps_pinned_and_counts_per_kind() {
    let cache = cache(32);
    let file = FileId::next();
    for blk in 0..10 {
        cache
            .insert_file_page(
                file,
                blk,
                &page_of(file.get(), blk.into()),
                Arrival::PreWarm,
            )
            .unwrap();
    }
    let key = mat_key(1);
    for lsn in 1..=3 {
        cache
            .memorize_materialized(&key, Lsn(lsn), &page_of(1, lsn))
            .unwrap();
    }
    let held = cache.get_file_page(file, 4).unwrap();
    let dropped = cache.drop_unpinned();
    assert_eq!(
        dropped,
        DroppedPages {
            file_pages: 9,
            index_pages: 0,
            materialized_pages: 3
        }
    );
    assert_page(&held, file.get(), 4);
    assert!(cache.get_file_page(file, 4).is_some());
    assert!(cache.get_file_page(file, 5).is_none());
    assert!(cache.lookup_materialized(&key, Lsn(10)).is_none());
    assert_eq!(
        cache.directory.len(),
        0,
        "the directory forgets dropped versions"
    );
    let stats = cache.stats();
    assert_eq!(stats.file_pages.bytes_resident, PAGE_SZ as u64);
    assert_eq!(stats.materialized_pages.bytes_resident, 0);
    assert_eq!(stats.file_pages.evictions, 9);
    assert_eq!(stats.materialized_pages.evictions, 3);
}

#[test]
fn prewarmed_blocks_survive_until_read_back() {
    // An ephemeral file's stream: every new block is pre-warmed, and readers ask for blocks
    // written a little while ago. None of those reads may miss.
    let pages = 256;
    let cache = cache(pages);
    let file = FileId::next();
    let mut rng = Rng(seed());
    for blk in 0..(20 * pages as u32) {
        cache
            .insert_file_page(
                file,
                blk,
                &page_of(file.get(), blk.into()),
                Arrival::PreWarm,
            )
            .unwrap();
        let back = rng.below((pages / 4) as u64) as u32;
        if let Some(read) = blk.checked_sub(back) {
            let lease = cache.get_file_page(file, read).unwrap_or_else(|| {
                panic!("block {read} evicted {back} inserts after its pre-warm")
            });
            assert_page(&lease, file.get(), read.into());
        }
    }
}

#[test]
fn a_scan_does_not_push_out_the_hot_set() {
    // Plain LRU fails this: between two rounds a hot page is reused after 92 other pages, more
    // than the cache holds, so LRU would evict the whole hot set every round. The scan
    // pages enter cold and are the ones evicted instead.
    let pages = 64;
    let cache = cache(pages);
    let hot = FileId::next();
    let scan = FileId::next();
    let read_hot = |blk: u32| {
        read_stamped(&cache, hot, blk).unwrap();
    };
    for blk in 0..16 {
        read_hot(blk);
    }
    let mut scanned = 0u32;
    for _round in 0..50 {
        let before = cache.stats().file_pages.misses;
        for blk in (0..16).chain(0..16) {
            read_hot(blk);
        }
        assert_eq!(
            cache.stats().file_pages.misses,
            before,
            "a hot page was evicted"
        );
        for _ in 0..60 {
            let blk = scanned;
            scanned += 1;
            cache
                .read_file_page(scan, blk, Arrival::Scan, |f| {
                    f.copy_from_slice(&page_of(scan.get(), blk.into())[..]);
                    Ok::<_, ()>(())
                })
                .unwrap();
        }
    }
}

fn mat_key(n: u32) -> MaterializedPageKey {
    MaterializedPageKey {
        tenant_id: TenantId::from_bytes([1; 16]),
        timeline_id: TimelineId::from_bytes([2; 16]),
        key: Key::rel_block(1663, 5, 1000, 0, n),
    }
}

/// Random memorize/lookup sequences checked against a BTreeMap of what was memorized.
/// With a big cache nothing is evicted and the answer must be exact; with a tiny one the
/// answer may be older or missing, but never newer than asked or another page's bytes.
fn materialized_model_run(pages: usize, versions: usize, exact: bool, seed: u64) {
    let cache = PageCache::new(PageCacheConfig {
        capacity_bytes: (pages * PAGE_SZ) as u64,
        materialized_versions_per_key: versions,
        ..Default::default()
    })
    .unwrap();
    let mut model: BTreeMap<u32, BTreeMap<u64, ()>> = BTreeMap::new();
    let mut rng = Rng(seed);
    for _ in 0..5000 {
        let k = rng.below(20) as u32;
        let key = mat_key(k);
        if rng.below(3) == 0 {
            // Memorize versions in random LSN order.
            let lsn = 1 + rng.below(50) * 10;
            cache
                .memorize_materialized(&key, Lsn(lsn), &page_of(k.into(), lsn))
                .unwrap();
            let versions_of_key = model.entry(k).or_default();
            versions_of_key.insert(lsn, ());
            while versions_of_key.len() > versions {
                let oldest = *versions_of_key.keys().next().unwrap();
                versions_of_key.remove(&oldest);
            }
        } else {
            let at = rng.below(520);
            let expected = model
                .get(&k)
                .and_then(|v| v.range(..=at).next_back().map(|(l, _)| *l));
            match cache.lookup_materialized(&key, Lsn(at)) {
                Some((found, lease)) => {
                    assert!(found.0 <= at, "found {found} above requested {at}");
                    assert_page(&lease, k.into(), found.0);
                    if exact {
                        assert_eq!(Some(found.0), expected);
                    }
                }
                None => {
                    if exact {
                        assert_eq!(expected, None, "lookup of key {k} at {at} missed");
                    }
                }
            }
        }
    }
    if !exact {
        assert!(
            cache.directory.len() <= pages,
            "the directory outgrew the cache"
        );
    }
}

#[test]
fn materialized_newest_at_or_below_matches_model() {
    let seed = seed();
    // Big enough that nothing is evicted: 20 keys x 4 versions.
    materialized_model_run(1024, 4, true, seed);
}

#[test]
fn materialized_under_eviction_is_never_wrong() {
    materialized_model_run(8, 4, false, seed());
}

#[test]
fn materialized_can_be_switched_off() {
    let cache = PageCache::new(PageCacheConfig {
        capacity_bytes: 16 * PAGE_SZ as u64,
        materialized_versions_per_key: 0,
        ..Default::default()
    })
    .unwrap();
    let key = mat_key(1);
    cache
        .memorize_materialized(&key, Lsn(5), &page_of(1, 5))
        .unwrap();
    assert!(cache.lookup_materialized(&key, Lsn(5)).is_none());
    assert_eq!(cache.stats().materialized_pages.inserts, 0);
}

/// Many more threads than cores on a small cache, with a mix of hits, read-through misses,
/// pre-warm inserts, materialized pages, pinned leases held across operations, and an
/// occasional drop of everything. Every lease must hold its own key's bytes.
fn stress(pages: usize, degenerate_hash_bits: Option<u32>, threads: usize, ops: usize) {
    let cache = Arc::new(cache_with(pages, degenerate_hash_bits));
    let file = FileId::next();
    let base_seed = seed();
    let stop = Arc::new(AtomicBool::new(false));
    let dropper = {
        let (cache, stop) = (cache.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut drops = 0u64;
            while !stop.load(Ordering::Relaxed) {
                cache.drop_unpinned();
                drops += 1;
                std::thread::yield_now();
            }
            drops
        })
    };
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let cache = cache.clone();
            std::thread::spawn(move || {
                let mut rng = Rng(base_seed ^ mix(t as u64 + 1));
                let mut held: VecDeque<(u64, u64, PageLease<'_>)> = VecDeque::new();
                let keys = (pages * 3) as u64;
                for _ in 0..ops {
                    let blk = rng.below(keys) as u32;
                    match rng.below(10) {
                        0..=5 => {
                            let read = read_stamped(&cache, file, blk);
                            match read {
                                Ok(lease) => {
                                    assert_page(&lease, file.get(), blk.into());
                                    if held.len() < pages / (2 * threads) {
                                        held.push_back((file.get(), blk.into(), lease));
                                    }
                                }
                                Err(ReadThroughError::NoFreeSlot(_)) => {}
                                Err(ReadThroughError::Fill(())) => unreachable!(),
                            }
                        }
                        6 => {
                            let _ = cache.insert_file_page(
                                file,
                                blk,
                                &page_of(file.get(), blk.into()),
                                Arrival::PreWarm,
                            );
                        }
                        7 => {
                            let k = blk % 50;
                            let lsn = 1 + rng.below(8);
                            let _ = cache.memorize_materialized(
                                &mat_key(k),
                                Lsn(lsn),
                                &page_of(u64::from(k) + 1_000_000, lsn),
                            );
                        }
                        8 => {
                            let k = blk % 50;
                            let at = rng.below(10);
                            if let Some((found, lease)) =
                                cache.lookup_materialized(&mat_key(k), Lsn(at))
                            {
                                assert!(found.0 <= at);
                                assert_page(&lease, u64::from(k) + 1_000_000, found.0);
                            }
                        }
                        _ => {
                            if let Some((a, b, lease)) = held.pop_front() {
                                assert_page(&lease, a, b);
                            }
                        }
                    }
                }
                for (a, b, lease) in held {
                    assert_page(&lease, a, b);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker panicked");
    }
    stop.store(true, Ordering::Relaxed);
    assert!(dropper.join().unwrap() > 0);
    let stats = cache.stats();
    assert_eq!(stats.pinned_pages, 0, "every lease was dropped");
    // Everything unpinned can be dropped, and then nothing is resident.
    cache.drop_unpinned();
    let stats_after = cache.stats();
    assert_eq!(stats_after.file_pages.bytes_resident, 0);
    assert_eq!(stats_after.materialized_pages.bytes_resident, 0);
    assert_eq!(cache.index.total_displacements(), 0, "index left garbage");
    assert!(stats.file_pages.hits > 0 && stats.file_pages.evictions > 0);
}

#[test]
fn stress_many_threads_small_cache() {
    stress(64, None, 16, 20_000);
}

#[test]
fn stress_forced_hash_collisions() {
    // Two hash bits: every key shares one of four probe sequences and tags.
    stress(64, Some(2), 16, 10_000);
}

#[test]
fn stress_single_hash_value() {
    stress(32, Some(0), 8, 5_000);
}

#[test]
fn misses_stay_short_after_heavy_churn() {
    // Displacement counters, not tombstones: after many times the capacity in inserts and
    // evictions, a miss still stops within a few entries instead of scanning the table.
    let cache = cache(1024);
    let file = FileId::next();
    for blk in 0..100_000u32 {
        let _ = cache.insert_file_page(file, blk, &page_of(0, 0), Arrival::Scan);
    }
    let other = FileId::next();
    let probes: Vec<u64> = (0..10_000u32)
        .map(|blk| cache.index.miss_probe_len(cache.hash(file_key(other, blk))))
        .collect();
    let max = *probes.iter().max().unwrap();
    let mean = probes.iter().sum::<u64>() as f64 / probes.len() as f64;
    assert!(
        max <= 40,
        "longest miss probed {max} of {} entries",
        cache.index.entry_count()
    );
    assert!(mean < 4.0, "misses probe {mean:.2} entries on average");
}

#[test]
fn a_page_hit_on_probation_outlives_one_hit_pages() {
    let cache = cache(64);
    let file = FileId::next();
    let read = |blk: u32| {
        read_stamped(&cache, file, blk).map(drop).unwrap();
    };
    read(0);
    read(0); // the repeat read that earns the page its place
    for blk in 1..=640 {
        read(blk); // one-hit pages, ten times the cache
    }
    assert!(
        cache.get_file_page(file, 0).is_some(),
        "a re-read page was evicted by one-hit pages"
    );
    assert!(
        cache.get_file_page(file, 1).is_none(),
        "the oldest one-hit page should be long gone"
    );
}

#[test]
fn a_panicking_fill_does_not_lose_its_slot() {
    let cache = cache(4);
    let file = FileId::next();
    for blk in 0..8 {
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = cache.read_file_page(file, blk, Arrival::ReadThrough, |_| -> Result<(), ()> {
                panic!("fill failed hard")
            });
        }));
        assert!(panicked.is_err());
    }
    // Every slot is still usable.
    for blk in 0..4 {
        cache
            .insert_file_page(
                file,
                100 + blk,
                &page_of(file.get(), 100 + u64::from(blk)),
                Arrival::PreWarm,
            )
            .expect("a slot was lost to a panicking fill");
    }
}

#[test]
fn stats_stay_consistent_while_pages_are_evicted_as_they_arrive() {
    // Pre-warm inserts racing with drops of everything: the resident count must never wrap.
    let cache = Arc::new(cache(16));
    let stop = Arc::new(AtomicBool::new(false));
    let dropper = {
        let (cache, stop) = (cache.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                cache.drop_unpinned();
            }
        })
    };
    let file = FileId::next();
    let page = page_of(0, 0);
    for blk in 0..20_000u32 {
        let _ = cache.insert_file_page(file, blk, &page, Arrival::PreWarm);
        if blk % 16 == 0 {
            let stats = cache.stats();
            assert!(
                stats.file_pages.bytes_resident <= stats.capacity_bytes,
                "{stats:?}"
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    dropper.join().unwrap();
}

#[test]
fn a_prewarmed_block_is_not_the_next_victim() {
    // Pages 1..8 were hit, page 0 was not, and the clock hand has not moved yet. Taking page
    // 0's slot from probation would put the pre-warmed block right under the hand, to be
    // evicted by the very next insert.
    let pages = 40;
    let cache = cache(pages);
    let file = FileId::next();
    for blk in 0..pages as u32 {
        read_stamped(&cache, file, blk).map(drop).unwrap();
    }
    for blk in 1..8 {
        drop(cache.get_file_page(file, blk).unwrap());
    }
    let prewarmed = FileId::next();
    for blk in 0..2 {
        cache
            .insert_file_page(
                prewarmed,
                blk,
                &page_of(prewarmed.get(), blk.into()),
                Arrival::PreWarm,
            )
            .unwrap();
    }
    assert!(
        cache.get_file_page(prewarmed, 0).is_some(),
        "pre-warmed block 0 was evicted by the next pre-warm"
    );
}

#[test]
fn a_repeated_blind_insert_is_not_a_hit() {
    let cache = cache(8);
    let file = FileId::next();
    let page = page_of(1, 1);
    cache
        .insert_file_page(file, 0, &page, Arrival::Scan)
        .unwrap();
    for _ in 0..5 {
        cache
            .insert_file_page(file, 0, &page, Arrival::Scan)
            .unwrap();
    }
    // The only page lives in the first fresh slot. Still at countdown 0, a check that never
    // cools takes it (which leaves this cache unusable; the test ends here).
    assert!(
        matches!(
            cache.slots[0].sweep(false),
            Sweep::Claimed { previous: Some(_) }
        ),
        "re-inserting raised the page's countdown"
    );
}

fn cache_with_index_share(pages: usize, index_share: f64) -> PageCache {
    PageCache::new(PageCacheConfig {
        capacity_bytes: (pages * PAGE_SZ) as u64,
        index_share,
        ..PageCacheConfig::default()
    })
    .unwrap()
}

/// Reads `blocks` of `file` once each, then `flood` one-hit blocks of another file, and says
/// which of `blocks` are still cached.
fn survivors_of_a_flood(cache: &PageCache, file: FileId, blocks: u32, flood: u32) -> Vec<u32> {
    for blk in 0..blocks {
        read_stamped(cache, file, blk).unwrap();
    }
    let values = FileId::next();
    for blk in 0..flood {
        read_stamped(cache, values, blk).unwrap();
    }
    (0..blocks)
        .filter(|&blk| cache.peek_file_page(file, blk).is_some())
        .collect()
}

#[test]
fn index_blocks_read_once_outlive_a_flood_of_value_blocks() {
    let index = FileId::next().index_blocks();
    let cache = cache_with_index_share(64, 0.25);
    let survivors = survivors_of_a_flood(&cache, index, 8, 1000);
    assert_eq!(survivors, (0..8).collect::<Vec<_>>());
    let stats = cache.stats();
    assert_eq!(
        stats.index_pages.inserts, 8,
        "index blocks are their own kind"
    );
    assert_eq!(stats.index_pages.bytes_resident, 8 * PAGE_SZ as u64);
    assert_eq!(stats.file_pages.inserts, 1000);

    // The same blocks read as value blocks, or as index blocks with no share, are gone.
    for (file, share) in [(FileId::next(), 0.25), (FileId::next().index_blocks(), 0.0)] {
        let cache = cache_with_index_share(64, share);
        assert!(survivors_of_a_flood(&cache, file, 8, 1000).is_empty());
    }
}

#[test]
fn index_blocks_beyond_their_share_compete_like_value_blocks() {
    // A share of 4 pages of 64: the first four index blocks start warm, the rest on probation.
    let index = FileId::next().index_blocks();
    let cache = cache_with_index_share(64, 4.0 / 64.0);
    let survivors = survivors_of_a_flood(&cache, index, 12, 1000);
    assert_eq!(survivors, vec![0, 1, 2, 3]);
    assert_eq!(cache.stats().index_pages.bytes_resident, 4 * PAGE_SZ as u64);
    let dropped = cache.drop_unpinned();
    assert_eq!((dropped.index_pages, dropped.file_pages), (4, 60));
}

#[test]
fn an_index_share_outside_zero_to_one_is_refused() {
    for share in [-0.1, 1.5, f64::NAN] {
        let err = PageCache::new(PageCacheConfig {
            index_share: share,
            ..PageCacheConfig::default()
        })
        .err()
        .unwrap_or_else(|| panic!("share {share} accepted"));
        assert!(err.to_string().contains("index share"), "{err}");
    }
}

mod read_through;
