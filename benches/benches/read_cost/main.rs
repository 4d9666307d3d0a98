//! `read_cost`: what one point read from a delta layer costs, block by block, at four cache
//! states, each against the same reads with the page cache emptied before every read.
//!
//! The timeline: one delta layer file holding an 8 KiB image for each even key number below
//! `KEYS`, so the odd numbers between them are keys the layer's range covers but that it does not
//! hold. Materialized pages are off, so every read walks the layer's B-tree and reads its value.
//! The page cache (64 MiB) holds the whole layer (about 8 MiB) many times over: nothing is ever
//! evicted, a block is missing only because the benchmark dropped it. The kernel's cache holds
//! the file throughout, so a miss costs our read path and a `pread`, not the disk.
//!
//! * `read_cost/cold_point`: the page cache is emptied, then a present key is read: the
//!   B-tree's root and leaf, and the value's blocks.
//! * `read_cost/index_hot_point`: the page cache is emptied and then two absent keys just above
//!   the target are read, which caches the index nodes the target's read needs (the leaf with
//!   its entry and the leaf with the entry after it, which says where its value ends) and no
//!   value block; then the target is read. The read does exactly one I/O, of the value's blocks.
//! * `read_cost/fully_hot`: every block of the layer is cached; no I/O at all.
//! * `read_cost/missing_key`: an absent key with the index cached: a B-tree probe that finds no
//!   entry and touches no value block.
//!
//! Baselines, same run: `read_cost/<case>/no_cache` is the same sequence of reads with the page
//! cache emptied before each (as if there were no cache), so `<case>` ÷ `<case>/no_cache` is
//! what the cache saves for that access pattern; for `cold_point` it is the same work twice and
//! the ratio shows the noise. `read_cost/pread_baseline` is one 8 KiB `pread` into a new buffer
//! from the layer file, the floor for any read that misses our cache.
//!
//! `read_cost/pread_16k_vs_8k/{8KiB,16KiB}` weigh a question of the file format. An 8 KiB image
//! is stored as 8201 bytes (a 4-byte length header, the value's kind byte, the page, a 4-byte
//! CRC-32C), so it spans two blocks (three, when it starts in a block's last 8 bytes) and a cold
//! value read is 16 KiB; with the length, kind and checksum in the index and images
//! block-aligned it would be 8 KiB. Both read block-aligned ranges into a reused buffer, so only
//! the kernel's part differs.
//!
//! `read_cost/scan_page/*` are paged scans over a second timeline of nine layers: the same
//! layer at the bottom (an 8 KiB image of every even key number at `LSN`), and above it eight
//! delta layers, layer `i` at `LSN + i` holding a 32-byte delta of every fourth of those keys, so
//! every key has two deltas over its image and a point read of it visits all nine layers
//! (compaction is off: they stay L0s). A scan reads the whole key range at the newest LSN,
//! `SCAN_LIMIT` keys a page, with every block cached (as `fully_hot`). The scan has `SCAN_PAGES`
//! pages; the cases cycle over pages 1 to the last, in order, and time one page each:
//!
//! * `read_cost/scan_page/resumed`: `Timeline::scan_page` with the cursor the previous page
//!   left, compacted as the cursor cache compacts what it keeps. One scan runs from the start;
//!   its first page (which has no previous page to resume from) is read untimed whenever the
//!   cycle begins again. Its streams read ever larger chunks, so most pages take their versions
//!   from the buffer and a few go back to the index for a chunk several pages long: the timed
//!   pages carry that refill work, amortized as a long scan amortizes it.
//! * `read_cost/scan_page/reseeked`: the same pages, each read with a cursor built from nothing
//!   but the key before it (`ScanCursor::after`), as when a token's cursor was evicted: every
//!   page descends each layer's index for its first chunk. Building that cursor is not timed;
//!   it allocates nothing and the descents happen inside `scan_page`.
//! * `read_cost/scan_page/point_reads`: the same pages' keys read one by one with
//!   `Timeline::get_page`: what the scan is compared with, per key.
//!
//! The timed span is the page's reads alone; dropping the page and checking it are outside it.
//! `<case>/no_cache` empties the page cache before each page, as for point reads.
//!
//! Before criterion runs, every case is read `TABLE_READS` times under [`read_cost::measure`]
//! for a table printed after criterion's report: the average blocks and I/O per read, and the
//! median wall time of one read. This pass also asserts what each case claims: the index-hot
//! read misses no index block and does one I/O (checked for every target key), the fully hot
//! read and the missing key do no I/O, and the missing key touches no value block. The scan
//! cases are read `TABLE_PAGES` pages each for a second table, per page and per key; that pass
//! checks every page's keys and bytes (each page against its image with its deltas applied),
//! that the hot pages do no I/O, that every page but the last is full, and that over the same
//! pages the resumed scan asks for no more index blocks than the reseeked one (per page it can
//! ask for more: a page that refills a long chunk reads more leaves than one page's descent).
//! Under the table, the two goal ratios of the hot medians: reseeked ÷ resumed and point reads ÷
//! resumed.

use std::hint::black_box;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

mod scan;
use benches::uncompressed;
use pageserver::io::read_cost::{self, ReadCost};
use pageserver::page_cache::{PageCache, PageCacheConfig};
use pageserver::tenant::timeline::{PutRecord, Timeline};
use pageserver::PAGE_SZ;
use pageserver_api::{Key, Value};
use utils::{Lsn, TenantId, TimelineId};

/// Key numbers `0..KEYS`; the layer holds the even ones.
const KEYS: u32 = 2000;
const LSN: Lsn = Lsn(0x1000);
/// Reads per row of the printed table.
const TABLE_READS: usize = 200;

fn key(n: u32) -> Key {
    Key::rel_block(1663, 5, 16384, 0, n)
}

fn image(n: u32) -> Bytes {
    Bytes::from(vec![n as u8; PAGE_SZ])
}

/// Key numbers in an order that defeats prefetch-friendly sequential access.
fn shuffled(mut numbers: Vec<u32>) -> Vec<u32> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for i in (1..numbers.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        numbers.swap(i, (state % (i as u64 + 1)) as usize);
    }
    numbers
}

struct Layer {
    _dir: tempfile::TempDir,
    cache: Arc<PageCache>,
    timeline: Timeline,
    file: PathBuf,
}

impl Layer {
    fn build() -> Layer {
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
            TimelineId::from_bytes([2; 16]),
            cache.clone(),
            uncompressed(),
        )
        .expect("create timeline");
        let batch: Vec<PutRecord> = (0..KEYS)
            .step_by(2)
            .map(|n| PutRecord {
                key: key(n),
                lsn: LSN,
                value: Value::Image(image(n)),
            })
            .collect();
        timeline.put_batch(&batch).expect("put");
        timeline.checkpoint().expect("checkpoint");
        assert_eq!(timeline.layer_counts().deltas, 1);
        let file = layer_file(dir.path());
        Layer {
            _dir: dir,
            cache,
            timeline,
            file,
        }
    }

    /// Reads key number `n` and checks the answer against what was put.
    fn read(&self, n: u32) -> Option<Bytes> {
        let page = self.timeline.get_page(key(n), LSN).expect("get_page");
        if n.is_multiple_of(2) {
            let page = page.as_ref().expect("an even key has a page");
            assert_eq!((page.len(), page[0]), (PAGE_SZ, n as u8));
        } else {
            assert!(page.is_none(), "odd key {n} has no page");
        }
        page
    }

    fn read_all(&self, numbers: impl IntoIterator<Item = u32>) {
        for n in numbers {
            self.read(n);
        }
    }
}

fn layer_file(dir: &Path) -> PathBuf {
    std::fs::read_dir(dir)
        .expect("timeline dir")
        .map(|e| e.expect("dir entry").path())
        .find(|p| p.file_name().is_some_and(|n| n != "metadata"))
        .expect("a layer file")
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Case {
    ColdPoint,
    IndexHotPoint,
    FullyHot,
    MissingKey,
}

impl Case {
    const ALL: [Case; 4] = [
        Case::ColdPoint,
        Case::IndexHotPoint,
        Case::FullyHot,
        Case::MissingKey,
    ];

    fn name(self) -> &'static str {
        match self {
            Case::ColdPoint => "cold_point",
            Case::IndexHotPoint => "index_hot_point",
            Case::FullyHot => "fully_hot",
            Case::MissingKey => "missing_key",
        }
    }

    /// The key numbers this case reads, in the order it cycles through them.
    fn targets(self) -> Vec<u32> {
        shuffled(match self {
            Case::ColdPoint | Case::FullyHot => (0..KEYS).step_by(2).collect(),
            // The warming reads two absent keys above the target, which must lie inside the
            // layer's key range for it to look at its index: the top two present keys have no
            // such neighbours.
            Case::IndexHotPoint => (0..KEYS - 4).step_by(2).collect(),
            Case::MissingKey => (1..KEYS - 1).step_by(2).collect(),
        })
    }

    /// Brings the cache to the state this case's reads start from, once before a run of them.
    fn before_run(self, layer: &Layer) {
        match self {
            Case::FullyHot => layer.read_all((0..KEYS).step_by(2)),
            Case::MissingKey => layer.read_all((1..KEYS - 1).step_by(2)),
            Case::ColdPoint | Case::IndexHotPoint => {}
        }
    }

    /// Untimed, before each read of `n`.
    fn before_read(self, layer: &Layer, n: u32, no_cache: bool) {
        if no_cache || self == Case::ColdPoint {
            layer.cache.drop_unpinned();
        } else if self == Case::IndexHotPoint {
            layer.cache.drop_unpinned();
            // Absent keys reach the leaves without reading a value, so no value block the
            // target needs can be cached by accident. `n + 1` lands in the leaf holding `n`'s
            // entry, `n + 3` in the leaf holding the entry of `n + 2`, where `n`'s value ends;
            // the two leaves differ when `n` is the last entry of its leaf.
            layer.read(n + 1);
            layer.read(n + 3);
        }
    }
}

/// Sums of the costs of a run of reads, and their wall times.
#[derive(Default)]
struct Tally {
    reads: u32,
    cost: ReadCost,
    micros: Vec<f64>,
}

impl Tally {
    fn add(&mut self, cost: ReadCost, elapsed: Duration) {
        self.reads += 1;
        self.cost.idx_hit += cost.idx_hit;
        self.cost.idx_miss += cost.idx_miss;
        self.cost.val_hit += cost.val_hit;
        self.cost.val_miss += cost.val_miss;
        self.cost.ios += cost.ios;
        self.cost.bytes += cost.bytes;
        self.micros.push(elapsed.as_secs_f64() * 1e6);
    }

    fn median_micros(&mut self) -> f64 {
        self.micros.sort_by(f64::total_cmp);
        self.micros[self.micros.len() / 2]
    }

    fn per_read(&self, count: u32) -> f64 {
        f64::from(count) / f64::from(self.reads)
    }
}

/// `TABLE_READS` reads of `case` under [`read_cost::measure`], checking what the case claims of
/// every read.
fn tally(layer: &Layer, case: Case, no_cache: bool) -> Tally {
    case.before_run(layer);
    let mut tally = Tally::default();
    for n in case.targets().into_iter().cycle().take(TABLE_READS) {
        case.before_read(layer, n, no_cache);
        let start = Instant::now();
        let (_, cost) = read_cost::measure(|| layer.read(n));
        let elapsed = start.elapsed();
        if !no_cache {
            check_claim(case, n, cost);
        }
        tally.add(cost, elapsed);
    }
    tally
}

fn check_claim(case: Case, n: u32, cost: ReadCost) {
    match case {
        Case::ColdPoint => {}
        Case::IndexHotPoint => assert!(
            cost.idx_miss == 0 && cost.ios == 1,
            "index-hot read of key {n} missed the index or did more than one I/O: {cost}"
        ),
        Case::FullyHot => assert_eq!(cost.ios, 0, "fully hot read of key {n}: {cost}"),
        Case::MissingKey => assert!(
            cost.val_hit + cost.val_miss == 0 && cost.ios == 0,
            "absent key {n} touched a value block or did I/O: {cost}"
        ),
    }
}

/// The table rows only sample the keys; the index-hot claim depends on where a key's entry
/// sits in its leaf, so it is checked for every target.
fn check_every_index_hot_target(layer: &Layer) {
    for n in Case::IndexHotPoint.targets() {
        Case::IndexHotPoint.before_read(layer, n, false);
        let (_, cost) = read_cost::measure(|| layer.read(n));
        check_claim(Case::IndexHotPoint, n, cost);
    }
}

/// Median wall time of `TABLE_READS` block-aligned `pread`s of `len` bytes, in µs.
fn pread_median_micros(file: &std::fs::File, len: usize) -> f64 {
    let mut buf = vec![0u8; len];
    let mut reads = PreadOffsets::new(file, len);
    let mut micros: Vec<f64> = (0..TABLE_READS)
        .map(|_| {
            let offset = reads.next_offset();
            let start = Instant::now();
            file.read_exact_at(&mut buf, offset).expect("pread");
            black_box(&buf);
            start.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    micros.sort_by(f64::total_cmp);
    micros[micros.len() / 2]
}

/// Block-aligned offsets spread over the file, each with `len` bytes of file after it.
struct PreadOffsets {
    blocks: u64,
    blkno: u64,
}

impl PreadOffsets {
    fn new(file: &std::fs::File, len: usize) -> PreadOffsets {
        let size = file.metadata().expect("stat").len();
        PreadOffsets {
            blocks: (size - len as u64) / PAGE_SZ as u64 + 1,
            blkno: 0,
        }
    }

    fn next_offset(&mut self) -> u64 {
        // A prime stride keeps consecutive reads apart without favouring any block.
        self.blkno = (self.blkno + 7919) % self.blocks;
        self.blkno * PAGE_SZ as u64
    }
}

/// Runs every case under [`read_cost::measure`] and renders the table described in the module
/// documentation.
/// The block and I/O columns of a table row: averages per read (or page) of `t`.
fn cost_columns(t: &Tally) -> String {
    format!(
        "{:>9.2}{:>10.1}{:>9.2}{:>9.2}{:>8.2}{:>9.2}",
        t.per_read(t.cost.ios),
        t.cost.bytes as f64 / f64::from(t.reads) / 1024.0,
        t.per_read(t.cost.idx_hit),
        t.per_read(t.cost.idx_miss),
        t.per_read(t.cost.val_hit),
        t.per_read(t.cost.val_miss),
    )
}

fn table(layer: &Layer, scans: &scan::ScanTimeline) -> String {
    check_every_index_hot_target(layer);
    let mut out = String::new();
    let mut line = |text: String| {
        out.push_str(&text);
        out.push('\n');
    };
    line(format!(
        "read_cost: averages per read over {TABLE_READS} reads; µs/read is the median wall time \
         of one read (get_page under read_cost::measure)"
    ));
    line(format!(
        "{:<26}{:>9}{:>10}{:>9}{:>9}{:>8}{:>9}{:>9}{:>12}",
        "case",
        "ios/read",
        "KiB/read",
        "idx_hit",
        "idx_miss",
        "val_hit",
        "val_miss",
        "µs/read",
        "vs no_cache"
    ));
    let row = |name: &str, t: &mut Tally, ratio: Option<f64>| {
        format!(
            "{:<26}{}{:>9.2}{:>12}",
            name,
            cost_columns(t),
            t.median_micros(),
            ratio.map_or_else(|| "-".to_string(), |r| format!("{r:.2}")),
        )
    };
    for case in Case::ALL {
        let mut cached = tally(layer, case, false);
        let mut uncached = tally(layer, case, true);
        let ratio = cached.median_micros() / uncached.median_micros();
        line(row(case.name(), &mut cached, Some(ratio)));
        line(row(
            &format!("{}/no_cache", case.name()),
            &mut uncached,
            None,
        ));
    }
    line(String::new());
    for text in scan::table(scans) {
        line(text);
    }
    line(String::new());
    let file = std::fs::File::open(&layer.file).expect("open layer");
    let p8 = pread_median_micros(&file, PAGE_SZ);
    let p16 = pread_median_micros(&file, 2 * PAGE_SZ);
    line(format!(
        "pread 8 KiB: {p8:.2} µs, pread 16 KiB: {p16:.2} µs (median), 16 KiB ÷ 8 KiB = {:.2}",
        p16 / p8
    ));
    out
}

fn read_cost(c: &mut Criterion) {
    let layer = Layer::build();
    let scans = scan::ScanTimeline::build();
    // Measured first, so a case that does not do what it claims fails before any timing; printed
    // last, where it is seen after criterion's report.
    let table = table(&layer, &scans);

    let mut group = c.benchmark_group("read_cost");
    group
        .throughput(Throughput::Elements(1))
        .sample_size(50)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));

    for case in Case::ALL {
        for no_cache in [false, true] {
            let name = if no_cache {
                format!("{}/no_cache", case.name())
            } else {
                case.name().to_string()
            };
            case.before_run(&layer);
            let targets = case.targets();
            let mut next = targets.iter().copied().cycle();
            // Cases that change the cache before a read must time each read on its own; the
            // others leave it as it is and are timed in batches.
            let size = if no_cache || matches!(case, Case::ColdPoint | Case::IndexHotPoint) {
                BatchSize::PerIteration
            } else {
                BatchSize::SmallInput
            };
            group.bench_function(name, |b| {
                b.iter_batched(
                    || {
                        let n = next.next().expect("cycle");
                        case.before_read(&layer, n, no_cache);
                        n
                    },
                    |n| layer.read(n),
                    size,
                )
            });
        }
    }

    let file = std::fs::File::open(&layer.file).expect("open layer");
    let mut offsets = PreadOffsets::new(&file, PAGE_SZ);
    group.bench_function("pread_baseline", |b| {
        b.iter(|| {
            let mut buf = vec![0u8; PAGE_SZ];
            file.read_exact_at(&mut buf, offsets.next_offset())
                .expect("pread");
            Bytes::from(buf)
        })
    });
    for (name, len) in [("8KiB", PAGE_SZ), ("16KiB", 2 * PAGE_SZ)] {
        let mut offsets = PreadOffsets::new(&file, len);
        let mut buf = vec![0u8; len];
        group.bench_function(format!("pread_16k_vs_8k/{name}"), |b| {
            b.iter(|| {
                file.read_exact_at(&mut buf, offsets.next_offset())
                    .expect("pread");
                black_box(&buf);
            })
        });
    }
    scan::bench(&mut group, &scans);
    group.finish();
    println!("\n{table}");
}

criterion_group!(benches, read_cost);
criterion_main!(benches);
