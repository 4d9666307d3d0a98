//! `scan_branch`: a paged scan of a branch against the same scan of its parent, over the same
//! data, in the same run. The parent's scan is the baseline; what counts is the ratio.
//!
//! The data has the shape of an imported cluster and of a branch made at one of its snapshots:
//!
//! * **Parent.** Import 1 at `FIRST`: `RELS` relations of `BLOCKS_PER_REL` 8 KiB images each,
//!   each put in key order (an import run per relation), and `SMALL_REL_BLOCKS` blocks of a small
//!   relation put out of order (the import's private layer): an L0 group of `RELS + 1` layers.
//!   Import 2 at `SECOND` (the snapshot the branch starts at): a new image of one block in
//!   `PARENT_CHANGE_EVERY`. The two are compacted into L1 layers. Import 3 at `THIRD`, above the
//!   branch point, changes other blocks: an L0 group the branch must skip.
//! * **Branch `latest`**, made at `SECOND`: two imports of its own, a few changes each (one
//!   block in `BRANCH_CHANGE_EVERY`, then in `BRANCH_CHANGE_EVERY_2`, and a new relation of
//!   `BRANCH_REL_BLOCKS` blocks), left as two L0 groups, as after two snapshots of a cluster
//!   restored from the branch.
//! * **Branch `imaged`**, made at `SECOND` too: the same imports, then L0 compaction and
//!   forced image creation, so its image layers answer for every key, the parent's included.
//!
//! Every scan reads the whole key space, `PAGE_LIMIT` (1000) entries a page, as the regression
//! test's `scan_all` does, through [`CursorCache::page`]: the path of `GET .../keys` below its
//! JSON, each page continuing with the text of the previous page's `next_page_token`, encoded,
//! decoded and checked as the handler does. Cases:
//!
//! * `parent@second`: the parent at the branch point, the **baseline**;
//! * `branch@second`: the branch at its branch point: the same keys and pages, all from the
//!   parent's layers, through the branch;
//! * `branch@latest`: the branch with its own changes, at its newest LSN;
//! * `imaged@latest`: the imaged branch at its newest LSN.
//!
//! `scan_branch/whole/<case>` times one whole scan per iteration (throughput: pages);
//! `scan_branch/page/<case>` times one page per iteration, cycling through the scan's pages
//! in order, every page timed (throughput: keys).
//!
//! What `GET .../keys` adds to a page: `scan_branch/body/direct` writes the JSON body of one
//! full page of the scan (1000 entries of 8 KiB) as the handler does
//! (`http::routes::scan::body`); `scan_branch/body/serde_json`, its baseline, builds the same
//! body as a `serde_json::Value` and serializes it, as the handler used to. Both bodies are
//! checked equal first.
//!
//! Before criterion runs, a table pass reads each case's whole scan `TABLE_SCANS` times,
//! interleaving the cases so that a busy machine weighs on all of them alike, and prints: the
//! pages and keys of a scan, the median whole-scan time, pages/s, the ratio to the baseline,
//! the median time of the first, second and last pages and of the slowest, the cursor cache's
//! hits, drops and misses per scan, and the read cost (layers visited and index blocks per
//! key). The pass checks every scan: `branch@second` returns exactly what `parent@second`
//! does, and every case's entries equal the page a point read gives for a sample of keys.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use benches::uncompressed;
use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pageserver::http::routes::scan::body::scan_page_body;
use pageserver::http::routes::scan::token;
use pageserver::io::read_cost::{self, ReadCost};
use pageserver::page_cache::{PageCache, PageCacheConfig};
use pageserver::tenant::timeline::layer_set::manifest::Manifest;
use pageserver::tenant::timeline::scan::cursor_cache::{
    CursorCache, CursorCacheConfig, CursorCacheStats, ScanFrom, ScanRequest,
};
use pageserver::tenant::timeline::{Ancestry, Timeline, TimelineConf};
use pageserver::PAGE_SZ;
use pageserver_api::{Key, Value};
use serde_json::json;
use utils::{Lsn, TenantId, TimelineId};

const TENANT: TenantId = TenantId::from_bytes([1; 16]);
const PARENT: TimelineId = TimelineId::from_bytes([2; 16]);
const BRANCH: TimelineId = TimelineId::from_bytes([3; 16]);
const IMAGED: TimelineId = TimelineId::from_bytes([4; 16]);

/// Relations of the first import, each put in key order.
const RELS: u32 = 4;
const BLOCKS_PER_REL: u32 = 6000;
/// A relation put out of key order, through the import's private layer.
const SMALL_REL_BLOCKS: u32 = 200;
/// The branch's own new relation.
const BRANCH_REL_BLOCKS: u32 = 500;
const PARENT_CHANGE_EVERY: u32 = 20;
const BRANCH_CHANGE_EVERY: u32 = 50;
const BRANCH_CHANGE_EVERY_2: u32 = 100;

const FIRST: Lsn = Lsn(0x0100_0000);
const SECOND: Lsn = Lsn(0x0200_0000);
const THIRD: Lsn = Lsn(0x0300_0000);
const BRANCH_FIRST: Lsn = Lsn(0x0210_0000);
const BRANCH_SECOND: Lsn = Lsn(0x0220_0000);

/// Entries a scan page holds: the regression test's `limit=1000`, the API's largest.
const PAGE_LIMIT: usize = 1000;
/// Whole scans per case in the table pass.
const TABLE_SCANS: usize = 5;

fn rel_key(rel: u32, block: u32) -> Key {
    Key::rel_block(1663, 5, 16384 + rel, 0, block)
}

/// The small relation's keys come after the large ones'.
const SMALL_REL: u32 = RELS;
/// The branch's new relation comes after every relation of the parent.
const BRANCH_REL: u32 = RELS + 1;

/// An 8 KiB page telling which import wrote it and for which block.
fn page(rel: u32, block: u32, version: u8) -> Value {
    let mut bytes = vec![version; PAGE_SZ];
    bytes[..4].copy_from_slice(&rel.to_be_bytes());
    bytes[4..8].copy_from_slice(&block.to_be_bytes());
    Value::Image(Bytes::from(bytes))
}

/// Imports `(rel, block)` keys at `lsn`, as an archive lists a cluster's files: each large
/// relation's blocks in key order, the relations themselves not (last first, so each one
/// starts a run of its own), and the small relation's blocks out of order.
fn import(timeline: &Timeline, lsn: Lsn, keys: &[(u32, u32)], version: u8) {
    let mut import = timeline.begin_import().expect("begin import");
    let mut large: Vec<(u32, u32)> = keys
        .iter()
        .copied()
        .filter(|(rel, _)| *rel != SMALL_REL)
        .collect();
    large.sort_by_key(|&(rel, block)| (std::cmp::Reverse(rel), block));
    for (rel, block) in large {
        import
            .put_in_order(rel_key(rel, block), &page(rel, block, version))
            .expect("put in order");
    }
    for &(rel, block) in keys.iter().filter(|(rel, _)| *rel == SMALL_REL).rev() {
        import
            .put(rel_key(rel, block), &page(rel, block, version))
            .expect("put");
    }
    import.commit(lsn).expect("commit import");
}

/// The parent's relations' blocks with `block % every == offset`.
fn parent_blocks(every: u32, offset: u32) -> Vec<(u32, u32)> {
    let large = (0..RELS).flat_map(|rel| (0..BLOCKS_PER_REL).map(move |b| (rel, b)));
    let small = (0..SMALL_REL_BLOCKS).map(|b| (SMALL_REL, b));
    large
        .chain(small)
        .filter(|(_, b)| b % every == offset)
        .collect()
}

/// No background work runs in a benchmark, and no freeze by size or age happens: the layers
/// are the ones the build makes.
fn conf() -> TimelineConf {
    TimelineConf {
        compaction_threshold: 0,
        image_creation_threshold: 0,
        checkpoint_distance: u64::MAX,
        checkpoint_timeout: Duration::from_secs(3600),
        ..uncompressed()
    }
}

/// A branch of `parent` at `lsn`, linked as the tenant links one.
fn branch_of(
    parent: &Arc<Timeline>,
    id: TimelineId,
    lsn: Lsn,
    cache: Arc<PageCache>,
) -> (tempfile::TempDir, Arc<Timeline>) {
    parent.reserve_branch_point(lsn).expect("branch point");
    let dir = tempfile::tempdir().expect("temp dir");
    Manifest::starting_at(TENANT, id, lsn)
        .store(dir.path())
        .expect("branch metadata");
    Ancestry {
        timeline_id: parent.timeline_id(),
        lsn,
    }
    .write(dir.path())
    .expect("ancestor file");
    let branch = Timeline::load(dir.path(), TENANT, id, cache, conf()).expect("load branch");
    branch
        .set_ancestor(parent.clone(), lsn)
        .expect("set ancestor");
    (dir, Arc::new(branch))
}

/// The branch's own two imports (see the module documentation).
fn branch_work(branch: &Timeline) {
    let mut first = parent_blocks(BRANCH_CHANGE_EVERY, 11);
    first.extend((0..BRANCH_REL_BLOCKS).map(|b| (BRANCH_REL, b)));
    import(branch, BRANCH_FIRST, &first, 0xB1);
    import(
        branch,
        BRANCH_SECOND,
        &parent_blocks(BRANCH_CHANGE_EVERY_2, 13),
        0xB2,
    );
}

struct Fixture {
    _dirs: Vec<tempfile::TempDir>,
    parent: Arc<Timeline>,
    branch: Arc<Timeline>,
    imaged: Arc<Timeline>,
}

impl Fixture {
    fn build() -> Fixture {
        let started = Instant::now();
        // The server's default page cache, with the materialized pages scans neither read nor
        // fill; what a scan reads passes through it as in the server.
        let cache = Arc::new(PageCache::new(PageCacheConfig::default()).expect("page cache"));
        let parent_dir = tempfile::tempdir().expect("temp dir");
        let parent = Timeline::create(parent_dir.path(), TENANT, PARENT, cache.clone(), conf())
            .expect("create parent");
        let parent = Arc::new(parent);
        import(&parent, FIRST, &parent_blocks(1, 0), 1);
        import(&parent, SECOND, &parent_blocks(PARENT_CHANGE_EVERY, 3), 2);
        let compacted = parent.compact_l0(2).expect("compact parent");
        assert!(compacted.inputs > RELS as usize, "{compacted:?}");
        import(&parent, THIRD, &parent_blocks(PARENT_CHANGE_EVERY, 7), 3);

        let (branch_dir, branch) = branch_of(&parent, BRANCH, SECOND, cache.clone());
        branch_work(&branch);
        let (imaged_dir, imaged) = branch_of(&parent, IMAGED, SECOND, cache);
        branch_work(&imaged);
        imaged.compact_l0(2).expect("compact imaged branch");
        let images = imaged.create_images(true).expect("images on the branch");
        assert!(
            images.images > u64::from(RELS * BLOCKS_PER_REL),
            "{images:?}"
        );
        let fixture = Fixture {
            _dirs: vec![parent_dir, branch_dir, imaged_dir],
            parent,
            branch,
            imaged,
        };
        for (name, tl) in [
            ("parent", &fixture.parent),
            ("branch", &fixture.branch),
            ("imaged", &fixture.imaged),
        ] {
            let c = tl.layer_counts();
            println!(
                "{name}: {} L0, {} L1, {} image layers",
                c.l0, c.l1, c.images
            );
        }
        println!("built in {:.1} s", started.elapsed().as_secs_f64());
        fixture
    }
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Case {
    ParentAtSecond,
    BranchAtSecond,
    BranchLatest,
    ImagedLatest,
}

impl Case {
    const ALL: [Case; 4] = [
        Case::ParentAtSecond,
        Case::BranchAtSecond,
        Case::BranchLatest,
        Case::ImagedLatest,
    ];

    fn name(self) -> &'static str {
        match self {
            Case::ParentAtSecond => "parent@second",
            Case::BranchAtSecond => "branch@second",
            Case::BranchLatest => "branch@latest",
            Case::ImagedLatest => "imaged@latest",
        }
    }

    fn timeline(self, f: &Fixture) -> &Timeline {
        match self {
            Case::ParentAtSecond => &f.parent,
            Case::BranchAtSecond | Case::BranchLatest => &f.branch,
            Case::ImagedLatest => &f.imaged,
        }
    }

    fn lsn(self) -> Lsn {
        match self {
            Case::ParentAtSecond | Case::BranchAtSecond => SECOND,
            Case::BranchLatest | Case::ImagedLatest => BRANCH_SECOND,
        }
    }
}

/// A scan in progress, page by page, as a client of `GET .../keys` runs it.
struct Scan<'a> {
    cache: &'a CursorCache,
    timeline: &'a Timeline,
    lsn: Lsn,
    /// The previous page's `next_page_token`; `None` before the first page.
    token: Option<String>,
    done: bool,
}

impl<'a> Scan<'a> {
    fn new(cache: &'a CursorCache, timeline: &'a Timeline, lsn: Lsn) -> Scan<'a> {
        Scan {
            cache,
            timeline,
            lsn,
            token: None,
            done: false,
        }
    }

    /// The next page's entries; after the last page, `done` is set.
    fn page(&mut self) -> Vec<(Key, Bytes)> {
        let from = match &self.token {
            None => ScanFrom::Start(Key::MIN),
            Some(text) => {
                let position = token::decode(text).expect("a token the server issued");
                token::check_request(
                    &position,
                    self.timeline.tenant_id(),
                    self.timeline.timeline_id(),
                    Some(self.lsn),
                    Key::MIN,
                    Key::MAX,
                )
                .expect("the token continues this scan");
                ScanFrom::After(position)
            }
        };
        let result = self
            .cache
            .page(
                self.timeline,
                ScanRequest {
                    lsn: self.lsn,
                    end: Key::MAX,
                    from,
                    limit: PAGE_LIMIT,
                },
            )
            .expect("scan page");
        self.token = result.next.as_ref().map(token::encode);
        self.done = self.token.is_none();
        result.entries
    }
}

fn cursor_cache() -> CursorCache {
    // The server's defaults (`scan_cursor_cache_size`, `scan_cursor_idle_timeout`).
    CursorCache::new(CursorCacheConfig {
        capacity_bytes: 16 << 20,
        idle_timeout: Duration::from_secs(60),
    })
}

/// One whole scan of `case`, timed page by page: (entries, each page's time, read cost).
fn whole_scan(
    f: &Fixture,
    cache: &CursorCache,
    case: Case,
) -> (Vec<(Key, Bytes)>, Vec<Duration>, ReadCost) {
    let mut scan = Scan::new(cache, case.timeline(f), case.lsn());
    let mut entries = Vec::new();
    let mut times = Vec::new();
    let mut cost = ReadCost::default();
    while !scan.done {
        let start = Instant::now();
        let (page, page_cost) = read_cost::measure(|| scan.page());
        times.push(start.elapsed());
        cost.layers += page_cost.layers;
        cost.idx_hit += page_cost.idx_hit;
        cost.idx_miss += page_cost.idx_miss;
        cost.ios += page_cost.ios;
        entries.extend(page);
    }
    (entries, times, cost)
}

/// Checks a whole scan: keys in order, and a sample of entries against point reads.
fn check_scan(f: &Fixture, case: Case, entries: &[(Key, Bytes)]) {
    assert!(
        entries.windows(2).all(|w| w[0].0 < w[1].0),
        "{}: keys out of order",
        case.name()
    );
    let tl = case.timeline(f);
    for (key, bytes) in entries.iter().step_by(97) {
        let point = tl.get_page(*key, case.lsn()).expect("get_page");
        assert_eq!(point.as_ref(), Some(bytes), "{}: key {key}", case.name());
    }
    let expected = (RELS * BLOCKS_PER_REL + SMALL_REL_BLOCKS) as usize
        + if case.lsn() > SECOND {
            BRANCH_REL_BLOCKS as usize
        } else {
            0
        };
    assert_eq!(entries.len(), expected, "{}: keys", case.name());
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn stats_delta(after: CursorCacheStats, before: CursorCacheStats) -> (u64, u64, u64) {
    (
        after.hits - before.hits,
        after.drops - before.drops,
        after.misses - before.misses,
    )
}

/// The table pass: see the module documentation.
fn table(f: &Fixture) -> String {
    let cache = cursor_cache();
    // Per case: whole-scan seconds, per-page seconds by page number, cache outcomes, cost.
    let mut whole: BTreeMap<Case, Vec<f64>> = BTreeMap::new();
    let mut by_page: BTreeMap<Case, Vec<Vec<f64>>> = BTreeMap::new();
    let mut outcomes: BTreeMap<Case, (u64, u64, u64)> = BTreeMap::new();
    let mut costs: BTreeMap<Case, (ReadCost, usize)> = BTreeMap::new();
    let mut baseline_entries = None;
    for round in 0..TABLE_SCANS {
        for case in Case::ALL {
            let before = cache.stats();
            let (entries, times, cost) = whole_scan(f, &cache, case);
            let (hits, drops, misses) = stats_delta(cache.stats(), before);
            if round == 0 {
                check_scan(f, case, &entries);
                match case {
                    Case::ParentAtSecond => baseline_entries = Some(entries.clone()),
                    Case::BranchAtSecond => assert!(
                        baseline_entries.as_ref() == Some(&entries),
                        "the branch at its branch point scans as its parent there"
                    ),
                    _ => {}
                }
                outcomes.insert(case, (hits, drops, misses));
                costs.insert(case, (cost, entries.len()));
            }
            whole
                .entry(case)
                .or_default()
                .push(times.iter().map(Duration::as_secs_f64).sum());
            let pages = by_page
                .entry(case)
                .or_insert_with(|| vec![Vec::new(); times.len()]);
            for (i, t) in times.iter().enumerate() {
                pages[i].push(t.as_secs_f64());
            }
        }
    }
    let mut out = format!(
        "scan_branch: whole scans of {PAGE_LIMIT}-entry pages through the cursor cache, median \
         of {TABLE_SCANS} per case (cases interleaved); page times are medians in ms\n"
    );
    out.push_str(&format!(
        "{:<15}{:>6}{:>7}{:>10}{:>9}{:>10}{:>8}{:>8}{:>8}{:>8}{:>16}{:>9}{:>9}\n",
        "case",
        "pages",
        "keys",
        "scan ms",
        "pages/s",
        "÷ parent",
        "first",
        "second",
        "last",
        "max",
        "hit/drop/miss",
        "lyr/key",
        "idx/key"
    ));
    let parent_ms = median(whole[&Case::ParentAtSecond].clone()) * 1e3;
    for case in Case::ALL {
        let ms = median(whole[&case].clone()) * 1e3;
        let pages: Vec<f64> = by_page[&case]
            .iter()
            .map(|t| median(t.clone()) * 1e3)
            .collect();
        let (hits, drops, misses) = outcomes[&case];
        let (cost, keys) = costs[&case];
        out.push_str(&format!(
            "{:<15}{:>6}{:>7}{:>10.1}{:>9.1}{:>10.2}{:>8.1}{:>8.1}{:>8.1}{:>8.1}{:>16}{:>9.2}{:>9.3}\n",
            case.name(),
            pages.len(),
            keys,
            ms,
            pages.len() as f64 / ms * 1e3,
            ms / parent_ms,
            pages[0],
            pages.get(1).copied().unwrap_or(f64::NAN),
            pages[pages.len() - 1],
            pages.iter().copied().fold(0.0, f64::max),
            format!("{hits}/{drops}/{misses}"),
            f64::from(cost.layers) / keys as f64,
            f64::from(cost.idx_hit + cost.idx_miss) / keys as f64,
        ));
    }
    out
}

fn scan_branch(c: &mut Criterion) {
    let f = Fixture::build();
    let table = table(&f);
    println!("\n{table}");
    let cache = cursor_cache();
    let mut group = c.benchmark_group("scan_branch");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(10));
    for case in Case::ALL {
        let pages = whole_scan(&f, &cache, case).1.len();
        group.throughput(Throughput::Elements(pages as u64));
        group.bench_function(format!("whole/{}", case.name()), |b| {
            b.iter(|| black_box(whole_scan(&f, &cache, case)))
        });
    }
    group.throughput(Throughput::Elements(PAGE_LIMIT as u64));
    for case in Case::ALL {
        let mut scan = Scan::new(&cache, case.timeline(&f), case.lsn());
        group.bench_function(format!("page/{}", case.name()), |b| {
            b.iter_custom(|iters| {
                let mut timed = Duration::ZERO;
                for _ in 0..iters {
                    if scan.done {
                        scan = Scan::new(&cache, case.timeline(&f), case.lsn());
                    }
                    let start = Instant::now();
                    let page = scan.page();
                    timed += start.elapsed();
                    black_box(page);
                }
                timed
            })
        });
    }
    group.throughput(Throughput::Elements(PAGE_LIMIT as u64));
    let mut scan = Scan::new(&cache, &f.parent, SECOND);
    let page = scan.page();
    assert_eq!(page.len(), PAGE_LIMIT);
    let token = scan.token.clone();
    let direct = || scan_page_body(&page, token.as_deref());
    let via_serde = || {
        let entries: Vec<serde_json::Value> = page
            .iter()
            .map(|(key, page)| json!({ "key": key.to_string(), "page": BASE64.encode(page) }))
            .collect();
        serde_json::to_vec(&json!({ "entries": entries, "next_page_token": token })).expect("json")
    };
    assert!(direct() == via_serde(), "the bodies differ");
    group.bench_function("body/direct", |b| b.iter(|| black_box(direct())));
    group.bench_function("body/serde_json", |b| b.iter(|| black_box(via_serde())));
    group.finish();
    // Printed again where it is seen, after criterion's report.
    println!("\n{table}");
}

criterion_group!(benches, scan_branch);
criterion_main!(benches);
