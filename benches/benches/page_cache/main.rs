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

mod drivers;
mod peers;
mod workloads;

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};

use drivers::{file_ratio_pass, file_timed, version_ratio_pass, version_timed};
use peers::{
    FileCache, LruFiles, LruVersions, MokaFiles, MokaVersions, Ours, QuickFiles, QuickVersions,
};
use workloads::{seed_from_env, FileScenario, Workloads, CAPACITY};

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
