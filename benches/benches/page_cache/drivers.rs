//! Replaying op streams against the caches: the untimed hit-ratio passes and the timed runs.

use std::collections::VecDeque;
use std::hint::black_box;
use std::time::Instant;

use criterion::measurement::WallTime;
use criterion::Throughput;
use criterion::{BenchmarkGroup, BenchmarkId};
use pageserver::page_cache::Arrival;
use pageserver::PAGE_SZ;
use utils::Lsn;

use crate::peers::{Fetch, FileCache, VersionCache};
use crate::workloads::{
    file_stamp, fill, mat_stamp, stamp, stamp_of, FileScenario, MatOp, Page, Workloads, BATCH,
    CAPACITY, FRESH_BASE, HOT_KEYS, MIX_BLIND_INSERT, MIX_INSERT_HOLD, MIX_KEYS, MIX_KEY_MASK,
    MIX_KIND_SHIFT, MIX_LOOKUP, MIX_LOOKUP_INSERT, PREWARM_MAX_DISTANCE, SCAN_NEXT, WARM_OPS,
};

/// The byte a lookup reads, spread over the page so that the access is real.
#[inline]
fn probe_offset(key: u32) -> usize {
    (key as usize).wrapping_mul(64 + 8) & (PAGE_SZ - 1)
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
pub(crate) fn file_ratio_pass<C: FileCache>(w: &Workloads, scenario: FileScenario) {
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
pub(crate) fn file_timed<C: FileCache>(
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

pub(crate) fn version_ratio_pass<V: VersionCache>(w: &Workloads) {
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

pub(crate) fn version_timed<V: VersionCache>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    w: &Workloads,
) {
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
