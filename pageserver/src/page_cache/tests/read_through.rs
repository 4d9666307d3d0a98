//! Page cache tests of the read-through path (`read_through.rs`): concurrent misses of one
//! block share one read; a failed read, or a claim dropped before its page landed, leaves each
//! waiter to read for itself.

use super::*;

/// Polls `done` until it holds; panics after ten seconds.
fn poll_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::yield_now();
    }
}

#[test]
fn concurrent_misses_of_one_block_share_one_read() {
    const READERS: u64 = 4;
    let cache = cache(16);
    let file = FileId::next();
    let fills = AtomicU64::new(0);
    let fetched: Vec<Fetched> = std::thread::scope(|s| {
        let readers: Vec<_> = (0..READERS)
            .map(|_| {
                s.spawn(|| {
                    let (lease, fetched) = cache
                        .read_file_page_traced(file, 3, Arrival::ReadThrough, |frame| {
                            fills.fetch_add(1, Ordering::Relaxed);
                            // Hold the read until every other reader is waiting for it.
                            poll_until("the other readers to wait", || {
                                cache.stats().miss_waits == READERS - 1
                            });
                            frame.copy_from_slice(&page_of(file.get(), 3)[..]);
                            Ok::<(), ()>(())
                        })
                        .unwrap();
                    assert_page(&lease, file.get(), 3);
                    fetched
                })
            })
            .collect();
        readers.into_iter().map(|r| r.join().unwrap()).collect()
    });
    assert_eq!(fills.load(Ordering::Relaxed), 1, "one read for all");
    let count = |kind| fetched.iter().filter(|&&f| f == kind).count() as u64;
    assert_eq!(
        (count(Fetched::Filled), count(Fetched::Waited)),
        (1, READERS - 1)
    );
    let stats = cache.stats();
    assert_eq!(
        (stats.file_pages.inserts, stats.miss_waits),
        (1, READERS - 1)
    );
}

#[test]
fn a_failed_shared_read_leaves_each_waiter_to_read_for_itself() {
    let cache = cache(16);
    let file = FileId::next();
    let reading = AtomicBool::new(false);
    std::thread::scope(|s| {
        let leader = s.spawn(|| {
            let failed = cache.read_file_page(file, 0, Arrival::ReadThrough, |_| {
                reading.store(true, Ordering::Relaxed);
                poll_until("the follower to wait", || cache.stats().miss_waits == 1);
                Err("disk on fire")
            });
            assert!(matches!(
                failed,
                Err(ReadThroughError::Fill("disk on fire"))
            ));
        });
        poll_until("the leader's read", || reading.load(Ordering::Relaxed));
        let (lease, fetched) = cache
            .read_file_page_traced(file, 0, Arrival::ReadThrough, |frame| {
                frame.copy_from_slice(&page_of(file.get(), 0)[..]);
                Ok::<(), &str>(())
            })
            .unwrap();
        assert_eq!(fetched, Fetched::Filled);
        assert_page(&lease, file.get(), 0);
        leader.join().unwrap();
    });
}

#[test]
fn a_claim_dropped_unlanded_wakes_its_waiters_empty_handed() {
    let cache = cache(16);
    let file = FileId::next();
    let BlockRead::Claimed(claim) = cache.begin_file_read(file, 7) else {
        panic!("an empty cache has nothing to wait for");
    };
    let BlockRead::InFlight(flight) = cache.begin_file_read(file, 7) else {
        panic!("the block is claimed");
    };
    std::thread::scope(|s| {
        let waiter = s.spawn(move || flight.wait().is_none());
        poll_until("the waiter", || cache.stats().miss_waits == 1);
        drop(claim);
        assert!(waiter.join().unwrap(), "nothing landed");
    });
    // The flight is over: the next reader claims the block afresh.
    assert!(matches!(
        cache.begin_file_read(file, 7),
        BlockRead::Claimed(_)
    ));
}
