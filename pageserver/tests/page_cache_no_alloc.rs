//! The page cache allocates its page memory once: inserting, evicting, hitting and reading
//! through must not touch the heap. Checked with a counting global allocator, which is why this
//! test is a binary of its own. Only the test thread's allocations count: the test harness's
//! own threads may allocate at any time, and are not the page cache.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use pageserver::page_cache::{Arrival, FileId, PageCache, PageCacheConfig};
use pageserver::PAGE_SZ;

struct CountingAlloc;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Set on the test thread for the measured region.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

fn count() {
    // `try_with`: an allocation while the thread's locals are torn down is not counted.
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        System.realloc(ptr, layout, new_size)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

#[test]
fn file_page_operations_do_not_allocate() {
    let cache = PageCache::new(PageCacheConfig {
        capacity_bytes: 256 * PAGE_SZ as u64,
        ..Default::default()
    })
    .unwrap();
    let file = FileId::next();
    let page = Box::new([0x5Au8; PAGE_SZ]);
    // Touch the per-thread counter stripe once, outside the measured region.
    let _ = cache.get_file_page(file, u32::MAX);

    let before = ALLOCATIONS.load(Ordering::Relaxed);
    COUNTING.with(|c| c.set(true));
    let mut hits = 0u64;
    for blk in 0..10_000u32 {
        // Far more inserts than slots: every one after the first 256 evicts.
        cache
            .insert_file_page(file, blk, &page, Arrival::PreWarm)
            .unwrap();
        if let Some(lease) = cache.get_file_page(file, blk.saturating_sub(3)) {
            hits += u64::from(lease[0]);
        }
        let lease = cache
            .read_file_page(file, blk + 1_000_000, Arrival::ReadThrough, |frame| {
                frame[0] = 1;
                Ok::<_, ()>(())
            })
            .unwrap();
        hits += u64::from(lease[0]);
    }
    COUNTING.with(|c| c.set(false));
    let allocations = ALLOCATIONS.load(Ordering::Relaxed) - before;
    assert!(hits > 0);
    assert_eq!(
        allocations, 0,
        "page cache operations allocated {allocations} times"
    );
}
