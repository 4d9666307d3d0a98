use std::time::Instant;

use pageserver_api::Value;

use super::*;
use crate::tenant::test_support::*;
use crate::tenant::timeline::{PutRecord, TimelineConf};

const TENANT: TenantId = TenantId::from_bytes([5; 16]);
const TIMELINE: TimelineId = TimelineId::from_bytes([6; 16]);

/// A timeline with keys 0..`keys`, each an image of its own number, in a delta layer and the
/// open layer.
fn timeline_with_keys(keys: u32) -> (tempfile::TempDir, Timeline) {
    let dir = tempfile::tempdir().unwrap();
    let tl = Timeline::create(
        dir.path(),
        TENANT,
        TIMELINE,
        small_cache(64),
        TimelineConf::default(),
    )
    .unwrap();
    let image = |k: u32| Value::Image(Bytes::from(k.to_be_bytes().to_vec()));
    let batch = |lsn, range: std::ops::Range<u32>| -> Vec<PutRecord> {
        range
            .map(|k| PutRecord {
                key: rel_key(k),
                lsn: Lsn(lsn),
                value: image(k),
            })
            .collect()
    };
    tl.put_batch(&batch(10, 0..keys / 2)).unwrap();
    tl.checkpoint().unwrap();
    tl.put_batch(&batch(20, keys / 2..keys)).unwrap();
    (dir, tl)
}

fn config(capacity_bytes: u64, idle_timeout: Duration) -> CursorCacheConfig {
    CursorCacheConfig {
        capacity_bytes,
        idle_timeout,
    }
}

/// Pages through the whole key space at `lsn`, calling `between` before each page after the
/// first; returns the keys' numbers and the number of pages.
fn page_through(
    cache: &CursorCache,
    tl: &Timeline,
    lsn: Lsn,
    limit: usize,
    mut between: impl FnMut(usize),
) -> (Vec<u32>, usize) {
    let mut from = ScanFrom::Start(Key::MIN);
    let mut keys = Vec::new();
    for page in 0.. {
        if page > 0 {
            between(page);
        }
        let request = ScanRequest {
            lsn,
            end: Key::MAX,
            from,
            limit,
        };
        let result = cache.page(tl, request).unwrap();
        assert!(result.entries.len() <= limit);
        for (key, page) in &result.entries {
            assert_eq!(page[..], key.field6.to_be_bytes());
            keys.push(key.field6);
        }
        match result.next {
            Some(position) => from = ScanFrom::After(position),
            None => return (keys, page + 1),
        }
    }
    unreachable!()
}

#[test]
fn a_scan_of_p_pages_hits_p_minus_one_times() {
    let (_dir, tl) = timeline_with_keys(50);
    let cache = CursorCache::new(config(1 << 20, Duration::from_secs(600)));
    let (keys, pages) = page_through(&cache, &tl, Lsn(20), 7, |_| {});
    assert_eq!(keys, (0..50).collect::<Vec<_>>());
    assert_eq!(pages, 8);
    let stats = cache.stats();
    assert_eq!(
        (
            stats.lookups,
            stats.hits,
            stats.misses,
            stats.drops,
            stats.inserts
        ),
        (7, 7, 0, 0, 7)
    );
    // Every cursor was taken back out; the last page kept none.
    assert_eq!((stats.cursors, stats.bytes), (0, 0));
    // Below the second half's LSN only the first half exists.
    let (keys, _) = page_through(&cache, &tl, Lsn(19), 7, |_| {});
    assert_eq!(keys, (0..25).collect::<Vec<_>>());
}

#[test]
fn a_layer_change_between_pages_drops_the_cursor_and_the_answer_stays() {
    let (_dir, tl) = timeline_with_keys(50);
    let cache = CursorCache::new(config(1 << 20, Duration::from_secs(600)));
    let (keys, pages) = page_through(&cache, &tl, Lsn(20), 10, |page| {
        if page == 2 {
            tl.checkpoint().unwrap();
        }
    });
    assert_eq!(keys, (0..50).collect::<Vec<_>>());
    let stats = cache.stats();
    assert_eq!(
        (stats.hits, stats.misses, stats.drops),
        (pages as u64 - 1, 0, 1)
    );
}

/// Calls `stats` until `done` says yes, for at most ten seconds.
fn wait_for_stats(
    cache: &CursorCache,
    done: impl Fn(&CursorCacheStats) -> bool,
) -> CursorCacheStats {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stats = cache.stats();
        if done(&stats) {
            return stats;
        }
        assert!(Instant::now() < deadline, "not reached: {stats:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn an_idle_cursor_expires_and_its_position_still_works() {
    let (_dir, tl) = timeline_with_keys(30);
    let cache = CursorCache::new(config(1 << 20, Duration::from_millis(30)));
    let (keys, pages) = page_through(&cache, &tl, Lsn(20), 10, |_| {
        let before = cache.stats().evictions_expired;
        wait_for_stats(&cache, |s| s.evictions_expired > before && s.cursors == 0);
    });
    assert_eq!(keys, (0..30).collect::<Vec<_>>());
    let stats = cache.stats();
    let expired = pages as u64 - 1;
    assert_eq!(
        (
            stats.lookups,
            stats.hits,
            stats.misses,
            stats.evictions_expired
        ),
        (expired, 0, expired, expired)
    );
}

#[test]
fn a_lookup_that_finds_an_expired_cursor_counts_a_miss() {
    // moka evicts lazily: past its idle time, a cursor may still be there to remove. The lookup
    // must not use it, and it counts as expired once.
    let (_dir, tl) = timeline_with_keys(30);
    let idle = Duration::from_millis(30);
    let cache = CursorCache::new(config(1 << 20, idle));
    let (keys, _) = page_through(&cache, &tl, Lsn(20), 20, |_| {
        let stored = Instant::now();
        while stored.elapsed() <= idle * 2 {
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    assert_eq!(keys, (0..30).collect::<Vec<_>>());
    let stats = cache.stats();
    assert_eq!(
        (
            stats.lookups,
            stats.hits,
            stats.misses,
            stats.evictions_expired
        ),
        (1, 0, 1, 1)
    );
}

#[test]
fn cursors_past_the_size_bound_are_evicted_oldest_first() {
    let (_dir, tl) = timeline_with_keys(40);
    let mut probe = ScanCursor::new(Key::MIN, Key::MAX, Lsn(20));
    tl.scan_page(&mut probe, 5).unwrap();
    probe.compact();
    let weight = (probe.approximate_bytes() + ENTRY_OVERHEAD) as u64;
    // Room for two cursors of that weight, not three.
    let cache = CursorCache::new(config(weight * 2 + weight / 2, Duration::from_secs(600)));
    let first_page = |cache: &CursorCache| {
        let request = ScanRequest {
            lsn: Lsn(20),
            end: Key::MAX,
            from: ScanFrom::Start(Key::MIN),
            limit: 5,
        };
        cache.page(&tl, request).unwrap().next.unwrap()
    };
    let positions: Vec<ScanPosition> = (0..3).map(|_| first_page(&cache)).collect();
    let stats = wait_for_stats(&cache, |s| s.evictions_size == 1);
    assert_eq!(stats.cursors, 2);
    assert!(stats.bytes <= stats.capacity_bytes);
    // The oldest went; the two newest resume.
    for (i, position) in positions.iter().enumerate() {
        let request = ScanRequest {
            lsn: Lsn(20),
            end: Key::MAX,
            from: ScanFrom::After(*position),
            limit: 5,
        };
        let result = cache.page(&tl, request).unwrap();
        let keys: Vec<u32> = result.entries.iter().map(|(k, _)| k.field6).collect();
        assert_eq!(keys, (5..10).collect::<Vec<_>>(), "scan {i}");
    }
    let stats = cache.stats();
    assert_eq!((stats.lookups, stats.hits, stats.misses), (3, 2, 1));
}

#[test]
fn a_position_naming_a_cursor_of_another_scan_drops_it() {
    // Only a forged position can name a cursor of another scan: its cursor id with another scan's
    // fields. The cursor is not used, and the page is still right.
    let (_dir, tl) = timeline_with_keys(30);
    let cache = CursorCache::new(config(1 << 20, Duration::from_secs(600)));
    let request = ScanRequest {
        lsn: Lsn(20),
        end: Key::MAX,
        from: ScanFrom::Start(Key::MIN),
        limit: 5,
    };
    let genuine = cache.page(&tl, request).unwrap().next.unwrap();
    let forged = ScanPosition {
        last: rel_key(10),
        ..genuine
    };
    let result = cache
        .page(
            &tl,
            ScanRequest {
                from: ScanFrom::After(forged),
                ..request
            },
        )
        .unwrap();
    let keys: Vec<u32> = result.entries.iter().map(|(k, _)| k.field6).collect();
    assert_eq!(keys, (11..16).collect::<Vec<_>>());
    let stats = cache.stats();
    assert_eq!((stats.hits, stats.drops), (1, 1));
}
