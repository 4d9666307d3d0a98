//! The scan cases of `read_cost`: paged scans over a timeline of nine layers, resumed,
//! re-seeked, and against point reads of the same keys (see the crate documentation).

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkGroup, Throughput};
use pageserver::io::read_cost;
use pageserver::page_cache::{PageCache, PageCacheConfig};
use pageserver::tenant::timeline::scan::{ScanCursor, ScanPage};
use pageserver::tenant::timeline::{PutRecord, Timeline, TimelineConf};
use pageserver::PAGE_SZ;
use pageserver_api::value::Patch;
use pageserver_api::Value;
use utils::{Lsn, TenantId, TimelineId};

use super::{cost_columns, image, key, uncompressed, Tally, KEYS, LSN};

/// Keys per scan page.
pub const SCAN_LIMIT: usize = 100;
/// Pages in a scan of the whole timeline (the even key numbers below `KEYS`).
const SCAN_PAGES: u32 = KEYS / 2 / SCAN_LIMIT as u32;
/// Pages per scan row of the printed table: every timed page of the cycle, ten times.
pub const TABLE_PAGES: u32 = 10 * (SCAN_PAGES - 1);
/// Delta layers above the base layer.
pub const DELTA_LAYERS: u64 = 8;
/// Each delta layer holds a delta of one key in this many.
const DELTA_EVERY: u32 = 4;
/// The scans read at the newest LSN.
const SCAN_LSN: Lsn = Lsn(LSN.0 + DELTA_LAYERS);

/// Whether delta layer `layer` (1 to `DELTA_LAYERS`) holds a delta of key number `n`.
fn has_delta(layer: u64, n: u32) -> bool {
    (n / 2 + layer as u32).is_multiple_of(DELTA_EVERY)
}

/// The delta layer `layer` holds for its keys: 32 bytes at an offset of its own.
fn delta(layer: u64) -> Value {
    Value::Delta {
        will_init: false,
        patches: vec![Patch::new(64 * layer as u32, vec![layer as u8; 32])],
    }
}

/// Key number `n`'s page at `SCAN_LSN`: its image with each of its deltas applied.
fn expected_page(n: u32) -> Vec<u8> {
    let mut page = image(n).to_vec();
    for layer in (1..=DELTA_LAYERS).filter(|l| has_delta(*l, n)) {
        let at = 64 * layer as usize;
        page[at..at + 32].fill(layer as u8);
    }
    page
}

/// The scans' timeline: the point cases' layer (an 8 KiB image of every even key number at
/// `LSN`) and above it `DELTA_LAYERS` delta layers, layer `i` at `LSN + i` holding a 32-byte
/// delta of every fourth of those keys, so each key has two deltas over its image and a point
/// read visits all nine layers. Compaction is off: the nine stay L0s, as when it lags.
pub struct ScanTimeline {
    _dir: tempfile::TempDir,
    pub cache: Arc<PageCache>,
    timeline: Timeline,
}

impl ScanTimeline {
    pub fn build() -> ScanTimeline {
        let cache = Arc::new(
            PageCache::new(PageCacheConfig {
                capacity_bytes: 64 << 20,
                materialized_versions_per_key: 0,
                ..PageCacheConfig::default()
            })
            .expect("page cache"),
        );
        let dir = tempfile::tempdir().expect("temp dir");
        let timeline = Timeline::create(
            dir.path(),
            TenantId::from_bytes([1; 16]),
            TimelineId::from_bytes([3; 16]),
            cache.clone(),
            TimelineConf {
                compaction_threshold: 0,
                ..uncompressed()
            },
        )
        .expect("create timeline");
        let base: Vec<PutRecord> = (0..KEYS)
            .step_by(2)
            .map(|n| PutRecord {
                key: key(n),
                lsn: LSN,
                value: Value::Image(image(n)),
            })
            .collect();
        timeline.put_batch(&base).expect("put");
        timeline.checkpoint().expect("checkpoint");
        for layer in 1..=DELTA_LAYERS {
            let batch: Vec<PutRecord> = (0..KEYS)
                .step_by(2)
                .filter(|n| has_delta(layer, *n))
                .map(|n| PutRecord {
                    key: key(n),
                    lsn: Lsn(LSN.0 + layer),
                    value: delta(layer),
                })
                .collect();
            timeline.put_batch(&batch).expect("put");
            timeline.checkpoint().expect("checkpoint");
        }
        assert_eq!(timeline.layer_counts().deltas as u64, 1 + DELTA_LAYERS);
        ScanTimeline {
            _dir: dir,
            cache,
            timeline,
        }
    }

    /// Reads every key, so that every block a scan or a point read needs is cached.
    pub fn warm(&self) {
        for n in (0..KEYS).step_by(2) {
            self.timeline.get_page(key(n), SCAN_LSN).expect("get_page");
        }
    }

    /// Page `page` of the scan in `mode`, with `cursor` (unused by point reads).
    fn read_page(&self, mode: ScanMode, page: u32, cursor: &mut ScanCursor) -> ScanPage {
        match mode {
            ScanMode::PointReads => {
                let first = 2 * SCAN_LIMIT as u32 * page;
                let entries = (0..SCAN_LIMIT as u32)
                    .map(|i| key(first + 2 * i))
                    .filter_map(|k| {
                        let found = self.timeline.get_page(k, SCAN_LSN).expect("get_page");
                        found.map(|page| (k, page))
                    })
                    .collect();
                ScanPage {
                    entries,
                    more: page + 1 < SCAN_PAGES,
                    resumed: false,
                }
            }
            _ => self
                .timeline
                .scan_page(cursor, SCAN_LIMIT)
                .expect("scan_page"),
        }
    }
}

/// The key number page `page` of the scan starts after.
fn last_before_page(page: u32) -> u32 {
    2 * SCAN_LIMIT as u32 * page - 2
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ScanMode {
    Resumed,
    Reseeked,
    /// The page's keys read one by one with `get_page`: what a scan saves.
    PointReads,
}

impl ScanMode {
    pub const ALL: [ScanMode; 3] = [ScanMode::Resumed, ScanMode::Reseeked, ScanMode::PointReads];

    pub fn name(self) -> &'static str {
        match self {
            ScanMode::Resumed => "scan_page/resumed",
            ScanMode::Reseeked => "scan_page/reseeked",
            ScanMode::PointReads => "scan_page/point_reads",
        }
    }
}

/// Where a scan case is in its cycle over pages `1..SCAN_PAGES`, and the cursor it keeps.
struct Pages {
    mode: ScanMode,
    cursor: Option<ScanCursor>,
    next: u32,
}

impl Pages {
    fn new(mode: ScanMode) -> Pages {
        Pages {
            mode,
            cursor: None,
            next: 1,
        }
    }

    /// Untimed, before each page: the page's number and the cursor it is to be read with.
    fn prepare(&mut self, tl: &ScanTimeline, no_cache: bool) -> (u32, &mut ScanCursor) {
        let page = self.next;
        self.next = page % (SCAN_PAGES - 1) + 1;
        let end = key(KEYS);
        let cursor = match (self.mode, self.cursor.take()) {
            (ScanMode::Resumed, Some(mut cursor)) if page > 1 => {
                cursor.compact();
                self.cursor.insert(cursor)
            }
            (ScanMode::Resumed, _) => {
                let mut cursor = ScanCursor::new(key(0), end, SCAN_LSN);
                let first = tl.read_page(ScanMode::Resumed, 0, &mut cursor);
                check_page(ScanMode::Resumed, 0, &first);
                cursor.compact();
                self.cursor.insert(cursor)
            }
            (ScanMode::Reseeked | ScanMode::PointReads, _) => self.cursor.insert(
                ScanCursor::after(key(last_before_page(page)), end, SCAN_LSN),
            ),
        };
        assert_eq!(cursor.last(), Some(key(last_before_page(page))));
        if no_cache {
            tl.cache.drop_unpinned();
        }
        (page, cursor)
    }
}

/// Checks page `page` of the scan against what was put, byte for byte.
fn check_page(mode: ScanMode, page: u32, found: &ScanPage) {
    let first = 2 * SCAN_LIMIT as u32 * page;
    assert!(
        found.entries.len() == SCAN_LIMIT || !found.more,
        "page {page} is short ({} entries) but more follow",
        found.entries.len()
    );
    assert_eq!(found.more, page + 1 < SCAN_PAGES, "page {page}: more");
    assert_eq!(
        found.resumed,
        mode == ScanMode::Resumed && page > 0,
        "page {page}: resumed"
    );
    for (i, (k, bytes)) in found.entries.iter().enumerate() {
        let n = first + 2 * i as u32;
        assert_eq!(*k, key(n), "page {page}, entry {i}");
        assert_eq!(bytes.len(), PAGE_SZ, "key {n}");
        assert!(bytes[..] == expected_page(n)[..], "key {n}: wrong bytes");
    }
}

/// `TABLE_PAGES` pages of `mode` under [`read_cost::measure`], with the entries they returned,
/// checking every page and, hot, that it did no I/O.
fn scan_tally(tl: &ScanTimeline, mode: ScanMode, no_cache: bool) -> (Tally, usize) {
    tl.warm();
    let mut pages = Pages::new(mode);
    let mut tally = Tally::default();
    let mut entries = 0;
    for _ in 0..TABLE_PAGES {
        let (page, cursor) = pages.prepare(tl, no_cache);
        let start = Instant::now();
        let (found, cost) = read_cost::measure(|| tl.read_page(mode, page, cursor));
        let elapsed = start.elapsed();
        check_page(mode, page, &found);
        if !no_cache {
            assert_eq!(cost.ios, 0, "hot {} page {page}: {cost}", mode.name());
        }
        entries += found.entries.len();
        tally.add(cost, elapsed);
    }
    (tally, entries)
}

/// The scan table's lines (see the crate documentation), and the goal ratios under it.
pub fn table(tl: &ScanTimeline) -> Vec<String> {
    let mut out = vec![format!(
        "read_cost scans: {} layers; averages per page over {TABLE_PAGES} pages of {SCAN_LIMIT} \
         keys; µs/page is the median wall time of one page (under read_cost::measure), µs/key \
         that divided by the keys a page returned",
        1 + DELTA_LAYERS
    )];
    out.push(format!(
        "{:<34}{:>9}{:>10}{:>9}{:>9}{:>8}{:>9}{:>9}{:>8}{:>12}",
        "case",
        "ios/page",
        "KiB/page",
        "idx_hit",
        "idx_miss",
        "val_hit",
        "val_miss",
        "µs/page",
        "µs/key",
        "vs no_cache"
    ));
    let scan_row = |name: &str, t: &mut Tally, entries: usize, ratio: Option<f64>| {
        let micros = t.median_micros();
        format!(
            "{:<34}{}{:>9.1}{:>8.2}{:>12}",
            name,
            cost_columns(t),
            micros,
            micros * f64::from(t.reads) / entries as f64,
            ratio.map_or_else(|| "-".to_string(), |r| format!("{r:.2}")),
        )
    };
    let mut hot_index_blocks = Vec::new();
    let mut hot_micros = Vec::new();
    for mode in ScanMode::ALL {
        let (mut cached, entries) = scan_tally(tl, mode, false);
        let (mut uncached, uncached_entries) = scan_tally(tl, mode, true);
        hot_index_blocks.push(cached.cost.idx_hit + cached.cost.idx_miss);
        hot_micros.push(cached.median_micros());
        let ratio = cached.median_micros() / uncached.median_micros();
        out.push(scan_row(mode.name(), &mut cached, entries, Some(ratio)));
        out.push(scan_row(
            &format!("{}/no_cache", mode.name()),
            &mut uncached,
            uncached_entries,
            None,
        ));
    }
    assert!(
        hot_index_blocks[0] <= hot_index_blocks[1],
        "the resumed scan asked for more index blocks than the reseeked one: {hot_index_blocks:?}"
    );
    out.push(format!(
        "hot medians: reseeked ÷ resumed = {:.2} (goal >= 2), point reads ÷ resumed = {:.2} \
         (goal >= 3)",
        hot_micros[1] / hot_micros[0],
        hot_micros[2] / hot_micros[0],
    ));
    out
}

/// The criterion cases: one page per iteration, its preparation untimed.
pub fn bench(group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>, tl: &ScanTimeline) {
    // A page returns `SCAN_LIMIT` keys, so criterion's rate is keys per second.
    group.throughput(Throughput::Elements(SCAN_LIMIT as u64));
    for mode in ScanMode::ALL {
        for no_cache in [false, true] {
            let name = if no_cache {
                format!("{}/no_cache", mode.name())
            } else {
                mode.name().to_string()
            };
            tl.warm();
            let mut pages = Pages::new(mode);
            // Timed by hand so that the resumed cursor can carry over from one page to the next
            // while its preparation, and dropping each page, stay outside the timed span.
            group.bench_function(name, |b| {
                b.iter_custom(|iters| {
                    let mut timed = Duration::ZERO;
                    for _ in 0..iters {
                        let (page, cursor) = pages.prepare(tl, no_cache);
                        let start = Instant::now();
                        let found = tl.read_page(mode, page, cursor);
                        timed += start.elapsed();
                        black_box(found);
                    }
                    timed
                })
            });
        }
    }
}
