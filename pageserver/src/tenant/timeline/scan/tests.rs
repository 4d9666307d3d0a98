use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pageserver_api::value::Patch;
use pageserver_api::{reconstruct_page, Value, DEFAULT_MAX_VALUE_SIZE};
use proptest::prelude::*;
use utils::TenantId;

use super::*;
use crate::io::read_cost::measure;
use crate::page_cache::PageCache;
use crate::tenant::storage_layer::VersionRef;
use crate::tenant::test_support::*;
use crate::tenant::timeline::{PutRecord, TimelineConf};

const TENANT: TenantId = TenantId::from_bytes([3; 16]);
const TIMELINE: TimelineId = TimelineId::from_bytes([4; 16]);

type Model = BTreeMap<(Key, Lsn), Value>;

/// Key numbers the model tests use: enough that a layer often holds more keys than a stream's
/// smallest chunk ([`MIN_CHUNK_KEYS`]), so chunk boundaries fall inside pages.
const KEYS: u32 = 120;

/// Layers change only when a test says so: no freeze by size or age, no flush by backlog.
fn manual_conf() -> TimelineConf {
    TimelineConf {
        checkpoint_distance: u64::MAX,
        checkpoint_timeout: Duration::from_secs(3600),
        max_frozen_layers: 1000,
        ..TimelineConf::default()
    }
}

fn fresh_timeline(cache_pages: usize) -> (tempfile::TempDir, Arc<PageCache>, Timeline) {
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(cache_pages);
    let tl = Timeline::create(dir.path(), TENANT, TIMELINE, cache.clone(), manual_conf()).unwrap();
    (dir, cache, tl)
}

/// Freezes the open layer without flushing it.
fn freeze(tl: &Timeline) {
    tl.freeze_if_due(Instant::now() + Duration::from_secs(7200))
        .unwrap();
}

fn put(tl: &Timeline, model: &mut Model, batch: Vec<PutRecord>) {
    tl.put_batch(&batch).unwrap();
    for r in batch {
        model.insert((r.key, r.lsn), r.value);
    }
}

/// The reference answer of a point read.
fn expected_page(model: &Model, key: Key, lsn: Lsn) -> Option<Bytes> {
    let mut records = Vec::new();
    for ((_, v_lsn), v) in model.range((key, Lsn(0))..=(key, lsn)).rev() {
        records.push((*v_lsn, v.clone()));
        if v.will_init() {
            break;
        }
    }
    reconstruct_page(&records, DEFAULT_MAX_VALUE_SIZE).unwrap()
}

/// The reference answer of a whole scan: every key in `[start, end)` that has a page at `lsn`.
fn expected_scan(model: &Model, start: Key, end: Key, lsn: Lsn) -> Vec<(Key, Bytes)> {
    let mut keys: Vec<Key> = model
        .keys()
        .map(|(k, _)| *k)
        .filter(|k| start <= *k && *k < end)
        .collect();
    keys.dedup();
    keys.into_iter()
        .filter_map(|k| expected_page(model, k, lsn).map(|page| (k, page)))
        .collect()
}

/// Every page of the key space at `lsn`, in pages of `limit`.
fn whole_scan(tl: &Timeline, lsn: Lsn, limit: usize) -> Vec<(Key, Bytes)> {
    let mut cursor = ScanCursor::new(Key::MIN, Key::MAX, lsn);
    let mut got = Vec::new();
    loop {
        let page = tl.scan_page(&mut cursor, limit).unwrap();
        got.extend(page.entries);
        if !page.more {
            return got;
        }
    }
}

/// How a test pages through a scan.
#[derive(Debug, Clone, Copy)]
enum Paging {
    /// One cursor kept from page to page, as the cursor cache keeps it.
    Cached,
    /// A new cursor from the last key for every page, as after every cursor is evicted.
    Reseek,
    /// The cursor is kept, but lost once, before page `n`.
    EvictedBefore(usize),
}

/// What happens between two pages of a scan.
#[derive(Debug, Clone)]
enum Between {
    Nothing,
    /// Ingest goes on, above the scan's LSN.
    Put(Vec<(u32, u8)>),
    Freeze,
    Flush,
    Checkpoint,
}

/// What paging through a scan gave.
struct Paged {
    entries: Vec<(Key, Bytes)>,
    pages: usize,
    /// Pages that resumed their cursor as it was.
    resumed: usize,
}

/// Pages through `[start, end)` at `lsn`, doing `between[i]` after page `i`.
fn page_through(
    tl: &Timeline,
    model: &mut Model,
    next_lsn: &mut u64,
    (start, end, lsn, limit): (Key, Key, Lsn, usize),
    paging: Paging,
    between: &[Between],
) -> Result<Paged, TestCaseError> {
    let mut cursor = ScanCursor::new(start, end, lsn);
    let mut paged = Paged {
        entries: Vec::new(),
        pages: 0,
        resumed: 0,
    };
    for page_no in 0.. {
        let lost = match paging {
            Paging::Cached => false,
            Paging::Reseek => page_no > 0,
            Paging::EvictedBefore(n) => page_no == n,
        };
        if lost {
            let last = cursor.last().expect("a page that left keys took one");
            cursor = ScanCursor::after(last, end, lsn);
        }
        let page = tl.scan_page(&mut cursor, limit).unwrap();
        prop_assert!(page.entries.len() <= limit);
        if page.more {
            prop_assert_eq!(
                page.entries.len(),
                limit,
                "a page short of its limit is the last"
            );
        }
        paged.pages += 1;
        paged.resumed += usize::from(page.resumed);
        paged.entries.extend(page.entries);
        if !page.more {
            break;
        }
        match between.get(page_no).unwrap_or(&Between::Nothing) {
            Between::Nothing => {}
            Between::Put(keys) => {
                let mut seen = std::collections::HashSet::new();
                let batch = keys
                    .iter()
                    .filter(|(k, _)| seen.insert(*k))
                    .map(|(k, fill)| PutRecord {
                        key: rel_key(*k),
                        lsn: Lsn(*next_lsn),
                        value: Value::Image(Bytes::from(vec![*fill; 40])),
                    })
                    .collect();
                put(tl, model, batch);
                *next_lsn += 1;
            }
            Between::Freeze => freeze(tl),
            Between::Flush => tl.flush_frozen().unwrap(),
            Between::Checkpoint => tl.checkpoint().unwrap(),
        }
    }
    Ok(paged)
}

#[derive(Debug, Clone)]
enum BuildOp {
    /// Versions of these keys at one LSN: (key, image fill or delta byte, will_init for deltas).
    Put(Vec<(u32, bool, u8, bool)>),
    Freeze,
    Flush,
    Checkpoint,
}

fn build_op() -> impl Strategy<Value = BuildOp> {
    prop_oneof![
        8 => prop::collection::vec((0u32..KEYS, any::<bool>(), any::<u8>(), prop::bool::weighted(0.2)), 1..24)
            .prop_map(BuildOp::Put),
        1 => Just(BuildOp::Freeze),
        1 => Just(BuildOp::Flush),
        1 => Just(BuildOp::Checkpoint),
    ]
}

fn between() -> impl Strategy<Value = Between> {
    prop_oneof![
        6 => Just(Between::Nothing),
        1 => prop::collection::vec((0u32..KEYS + 2, any::<u8>()), 1..4).prop_map(Between::Put),
        1 => Just(Between::Freeze),
        1 => Just(Between::Flush),
        1 => Just(Between::Checkpoint),
    ]
}

#[derive(Debug, Clone)]
struct ScanCase {
    /// Key numbers of the range; `None` for the whole key space.
    range: Option<(u32, u32)>,
    /// How far below the last LSN the scan reads (down to 0, before any version).
    lsn_back: u64,
    limit: usize,
    paging: Paging,
    between: Vec<Between>,
}

fn scan_case() -> impl Strategy<Value = ScanCase> {
    let paging = prop_oneof![
        Just(Paging::Cached),
        Just(Paging::Reseek),
        (1usize..6).prop_map(Paging::EvictedBefore),
    ];
    (
        prop::option::weighted(0.85, (0u32..KEYS + 4, 0u32..KEYS + 4)),
        prop_oneof![Just(0u64), 0u64..80],
        1usize..12,
        paging,
        prop::collection::vec(between(), 0..12),
    )
        .prop_map(|(range, lsn_back, limit, paging, between)| ScanCase {
            range: range.map(|(a, b)| (a.min(b), a.max(b))),
            lsn_back,
            limit,
            paging,
            between,
        })
}

/// Applies `build` to `tl` and `model`, a version at each LSN from `next_lsn` on.
fn apply_build(tl: &Timeline, model: &mut Model, next_lsn: &mut u64, build: Vec<BuildOp>) {
    for op in build {
        match op {
            BuildOp::Put(versions) => {
                let mut seen = std::collections::HashSet::new();
                let batch = versions
                    .into_iter()
                    .filter(|(k, ..)| seen.insert(*k))
                    .map(|(k, image, byte, will_init)| PutRecord {
                        key: rel_key(k),
                        lsn: Lsn(*next_lsn),
                        value: if image {
                            Value::Image(Bytes::from(vec![byte; 24 + (k as usize % 5) * 7]))
                        } else {
                            Value::Delta {
                                will_init,
                                patches: vec![Patch::new(u32::from(byte) % 30, vec![byte; 3])],
                            }
                        },
                    })
                    .collect();
                put(tl, model, batch);
                *next_lsn += 1;
            }
            BuildOp::Freeze => freeze(tl),
            BuildOp::Flush => tl.flush_frozen().unwrap(),
            BuildOp::Checkpoint => tl.checkpoint().unwrap(),
        }
    }
}

fn run(build: Vec<BuildOp>, scans: Vec<ScanCase>) -> Result<(), TestCaseError> {
    let (_dir, _cache, tl) = fresh_timeline(64);
    let mut model = Model::new();
    let mut next_lsn = 1u64;
    apply_build(&tl, &mut model, &mut next_lsn, build);
    check_scans(&tl, &mut model, &mut next_lsn, scans)
}

/// Runs `scans` on `tl`, each checked against `model`.
fn check_scans(
    tl: &Timeline,
    model: &mut Model,
    next_lsn: &mut u64,
    scans: Vec<ScanCase>,
) -> Result<(), TestCaseError> {
    for case in scans {
        let (start, end) = match case.range {
            Some((a, b)) => (rel_key(a), rel_key(b)),
            None => (Key::MIN, Key::MAX),
        };
        let lsn = Lsn(tl.last_record_lsn().0.saturating_sub(case.lsn_back));
        let want = expected_scan(model, start, end, lsn);
        let paged = page_through(
            tl,
            model,
            next_lsn,
            (start, end, lsn, case.limit),
            case.paging,
            &case.between,
        )?;
        let got = &paged.entries;
        let keys = |entries: &[(Key, Bytes)]| entries.iter().map(|(k, _)| *k).collect::<Vec<_>>();
        prop_assert_eq!(
            keys(got),
            keys(&want),
            "keys of [{}, {}) at {} by {:?}",
            start,
            end,
            lsn,
            case.paging
        );
        prop_assert_eq!(got, &want);
        let undisturbed = case
            .between
            .iter()
            .take(paged.pages - 1)
            .all(|b| matches!(b, Between::Nothing));
        match case.paging {
            // Every page after the first resumed its cursor as it was.
            Paging::Cached if undisturbed => prop_assert_eq!(paged.resumed, paged.pages - 1),
            Paging::Reseek => prop_assert_eq!(paged.resumed, 0),
            _ => {}
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Random versions over open, frozen and delta layers, then scans of random ranges at random
    /// LSNs with random page sizes, paged with a kept cursor, with a new cursor every page, or
    /// with the cursor lost once; between pages ingest goes on and layers freeze and flush.
    /// Every scan gives exactly the model's keys and pages.
    #[test]
    fn paged_scans_match_a_btreemap_model(
        build in prop::collection::vec(build_op(), 1..50),
        scans in prop::collection::vec(scan_case(), 1..6),
    ) {
        run(build, scans)?;
    }
}

#[test]
fn empty_ranges_and_timelines_give_one_empty_last_page() {
    let (_dir, _cache, tl) = fresh_timeline(16);
    let mut cursor = ScanCursor::new(Key::MIN, Key::MAX, Lsn(0));
    let page = tl.scan_page(&mut cursor, 10).unwrap();
    assert!(page.entries.is_empty() && !page.more);

    let mut model = Model::new();
    put(
        &tl,
        &mut model,
        vec![PutRecord {
            key: rel_key(5),
            lsn: Lsn(10),
            value: Value::Image(Bytes::from_static(b"five")),
        }],
    );
    for (start, end, lsn) in [
        (rel_key(5), rel_key(5), Lsn(10)),
        (rel_key(6), Key::MAX, Lsn(10)),
        (Key::MIN, rel_key(5), Lsn(10)),
        (Key::MIN, Key::MAX, Lsn(9)),
    ] {
        let mut cursor = ScanCursor::new(start, end, lsn);
        let page = tl.scan_page(&mut cursor, 10).unwrap();
        assert!(
            page.entries.is_empty() && !page.more,
            "{start}..{end} at {lsn}"
        );
    }
    // The one key, on a page that says it is the last.
    let mut cursor = ScanCursor::new(Key::MIN, Key::MAX, Lsn(10));
    let page = tl.scan_page(&mut cursor, 1).unwrap();
    assert_eq!(
        page.entries,
        vec![(rel_key(5), Bytes::from_static(b"five"))]
    );
    assert!(!page.more);
    // Beyond what was ingested: refused, as a point read is.
    let mut cursor = ScanCursor::new(Key::MIN, Key::MAX, Lsn(11));
    assert!(matches!(
        tl.scan_page(&mut cursor, 1),
        Err(TimelineError::LsnNotYetIngested { .. })
    ));
}

#[test]
fn keys_with_more_versions_than_a_leaf_are_passed_over_by_seeking() {
    // Key 1 has 700 versions (about three leaves), keys 0 and 2 one each, in one delta layer;
    // a scan at every interesting LSN finds exactly the keys that exist there.
    let (_dir, _cache, tl) = fresh_timeline(64);
    let mut model = Model::new();
    let image = |fill: u8| Value::Image(Bytes::from(vec![fill; 16]));
    put(
        &tl,
        &mut model,
        vec![PutRecord {
            key: rel_key(0),
            lsn: Lsn(1000),
            value: image(0),
        }],
    );
    for i in 0..700u64 {
        put(
            &tl,
            &mut model,
            vec![PutRecord {
                key: rel_key(1),
                lsn: Lsn(1001 + i),
                value: image(i as u8),
            }],
        );
    }
    put(
        &tl,
        &mut model,
        vec![PutRecord {
            key: rel_key(2),
            lsn: Lsn(900 + 1000),
            value: image(2),
        }],
    );
    tl.checkpoint().unwrap();
    for lsn in [999, 1000, 1001, 1500, 1700, 1899, 1900] {
        for limit in [1, 2, 5] {
            let mut cursor = ScanCursor::new(Key::MIN, Key::MAX, Lsn(lsn));
            let mut got = Vec::new();
            loop {
                let page = tl.scan_page(&mut cursor, limit).unwrap();
                got.extend(page.entries);
                if !page.more {
                    break;
                }
            }
            assert_eq!(
                got,
                expected_scan(&model, Key::MIN, Key::MAX, Lsn(lsn)),
                "at {lsn}"
            );
        }
    }
}

#[test]
fn a_resumed_page_reads_fewer_index_blocks_than_a_reseeked_one() {
    // Three delta layers of interleaved keys: a re-seek descends each layer's index again; a
    // resumed cursor finds its next keys in its buffers.
    let (_dir, _cache, tl) = fresh_timeline(256);
    let mut model = Model::new();
    for layer in 0..3u32 {
        let batch = (0..60u32)
            .filter(|k| k % 3 == layer)
            .map(|k| PutRecord {
                key: rel_key(k),
                lsn: Lsn(10 + u64::from(layer)),
                value: Value::Image(Bytes::from(vec![k as u8; 100])),
            })
            .collect();
        put(&tl, &mut model, batch);
        tl.checkpoint().unwrap();
    }
    let at = tl.last_record_lsn();
    let mut cursor = ScanCursor::new(Key::MIN, Key::MAX, at);
    // Warm every block the scan reads, then take the first page.
    for _ in 0..2 {
        cursor = ScanCursor::new(Key::MIN, Key::MAX, at);
        tl.scan_page(&mut cursor, 10).unwrap();
    }
    let last = cursor.last().unwrap();
    let (resumed, resumed_cost) = measure(|| tl.scan_page(&mut cursor, 10).unwrap());
    let mut reseeking = ScanCursor::after(last, Key::MAX, at);
    let (reseeked, reseeked_cost) = measure(|| tl.scan_page(&mut reseeking, 10).unwrap());
    assert!(resumed.resumed && !reseeked.resumed);
    assert_eq!(resumed.entries, reseeked.entries);
    assert_eq!(
        resumed.entries,
        &expected_scan(&model, last.next(), Key::MAX, at)[..10]
    );
    // Both read each page the same way; only the re-seek descends the three indexes (one leaf
    // each) for its keys.
    assert_eq!(resumed_cost.idx_miss + reseeked_cost.idx_miss, 0);
    assert_eq!(reseeked_cost.idx_hit, resumed_cost.idx_hit + 3);
    assert_eq!(reseeked_cost.val_hit, resumed_cost.val_hit);
}

/// Keys `0..keys`, each a one-byte image at LSN 10, in the open layer.
fn one_byte_images_at_10(tl: &Timeline, keys: u32) {
    let batch = (0..keys)
        .map(|k| PutRecord {
            key: rel_key(k),
            lsn: Lsn(10),
            value: Value::Image(Bytes::from_static(b"x")),
        })
        .collect();
    put(tl, &mut Model::new(), batch);
}

#[test]
fn a_cursor_weighs_what_it_buffers_and_compacts() {
    let (_dir, _cache, tl) = fresh_timeline(64);
    one_byte_images_at_10(&tl, 500u32);
    let mut cursor = ScanCursor::new(Key::MIN, Key::MAX, Lsn(10));
    let empty = cursor.approximate_bytes();
    tl.scan_page(&mut cursor, 100).unwrap();
    // One stream (the open layer) with a chunk of 101 versions, of which one is left.
    let loaded = cursor.approximate_bytes();
    assert!(
        loaded >= empty + 101 * size_of::<VersionRef>(),
        "{loaded} {empty}"
    );
    cursor.compact();
    let compacted = cursor.approximate_bytes();
    assert!(
        compacted < empty + size_of::<VersionRef>() + 128,
        "{compacted} {empty}"
    );
    // Still resumes, from the one buffered key on.
    let page = tl.scan_page(&mut cursor, 100).unwrap();
    assert!(page.resumed);
    assert_eq!(page.entries.first().map(|(k, _)| *k), Some(rel_key(100)));
}

#[test]
fn chunks_grow_like_read_ahead_up_to_their_bound() {
    // One layer (the open one) of 3000 keys, pages of 10: the first chunk is a page's worth,
    // later ones double up to MAX_CHUNK_KEYS, so the layer's key map is passed over about a
    // dozen times for 300 pages rather than once a page.
    let (_dir, _cache, tl) = fresh_timeline(64);
    one_byte_images_at_10(&tl, 3000u32);
    let mut cursor = ScanCursor::new(Key::MIN, Key::MAX, Lsn(10));
    let base = cursor.approximate_bytes();
    let mut chunks = Vec::new();
    let mut keys = 0;
    loop {
        let page = tl.scan_page(&mut cursor, 10).unwrap();
        keys += page.entries.len();
        let buffered = (cursor.approximate_bytes() - base) / size_of::<VersionRef>();
        if chunks.last() != Some(&buffered) {
            chunks.push(buffered);
        }
        if !page.more {
            break;
        }
    }
    assert_eq!(keys, 3000);
    // What the cursor holds besides its chunk is the same throughout, so the chunks grow by
    // the steps between these sizes: 16, 32, ... 1024, then stay.
    let steps: Vec<usize> = chunks.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(steps[..6], [16, 32, 64, 128, 256, 512], "{chunks:?}");
    assert_eq!(chunks.len(), 7, "{chunks:?}");
}

/// An image layer answers for every key of its range at its LSN: a key it holds no image of
/// has no page there, whatever older layers hold. A scan across it, the delta layers below and
/// above it and the open layer gives exactly what point reads give, at every LSN.
#[test]
fn a_scan_across_an_image_layer_matches_point_reads() {
    use crate::tenant::storage_layer::image_layer::ImageLayerWriter;
    use crate::tenant::timeline::layer_set::manifest::{Manifest, StoredMetadata};
    let dir = tempfile::tempdir().unwrap();
    let delta = |will_init, byte: u8| Value::Delta {
        will_init,
        patches: vec![Patch::new(u32::from(byte), vec![byte; 2])],
    };
    let image = |fill: u8| Value::Image(Bytes::from(vec![fill; 64]));
    {
        let tl =
            Timeline::create(dir.path(), TENANT, TIMELINE, small_cache(64), manual_conf()).unwrap();
        let batches: [(u64, Vec<(u32, Value)>); 3] = [
            (0x08, (0..12).map(|k| (k, image(k as u8))).collect()),
            (0x18, vec![(2, delta(false, 1)), (6, delta(false, 2))]),
            (0x20, vec![(11, delta(false, 3))]),
        ];
        for (lsn, versions) in batches {
            let batch: Vec<PutRecord> = versions
                .into_iter()
                .map(|(k, value)| PutRecord {
                    key: rel_key(k),
                    lsn: Lsn(lsn),
                    value,
                })
                .collect();
            tl.put_batch(&batch).unwrap();
            tl.checkpoint().unwrap();
            if lsn == 0x18 {
                // The first two into one L1, which an image layer at its end can shadow.
                assert_eq!(tl.compact_l0(2).unwrap().inputs, 2);
            }
        }
    }
    // Keys 0..4 have an image at 0x18, where the L1 ends; keys 4..10 are in its range without
    // one. Reads walk it after the L0 above and before the L1. Image layers cover the key
    // space (the history check), so an empty one at LSN 0 covers every key: no key has a page
    // before the timeline's first LSN.
    let nothing_yet =
        ImageLayerWriter::new(dir.path(), TENANT, TIMELINE, Key::MIN..Key::MAX, Lsn(0))
            .unwrap()
            .finish()
            .unwrap();
    let mut writer = ImageLayerWriter::new(
        dir.path(),
        TENANT,
        TIMELINE,
        rel_key(0)..rel_key(10),
        Lsn(0x18),
    )
    .unwrap();
    for k in 0..4u8 {
        writer
            .put_image(rel_key(k.into()), &[0x40 + k; 64])
            .unwrap();
    }
    let written = writer.finish().unwrap();
    let StoredMetadata::Manifest(mut manifest) = Manifest::load(dir.path()).unwrap() else {
        panic!("a manifest");
    };
    for written in [written, nothing_yet] {
        manifest.add_layer(image_entry(&written));
    }
    manifest.store(dir.path()).unwrap();
    let tl = Timeline::load(dir.path(), TENANT, TIMELINE, small_cache(64), manual_conf()).unwrap();
    assert_eq!(tl.layer_counts().images, 2);
    let later: Vec<PutRecord> = [(1, delta(false, 4)), (5, image(0x55)), (7, delta(true, 5))]
        .into_iter()
        .map(|(k, value)| PutRecord {
            key: rel_key(k),
            lsn: Lsn(0x30),
            value,
        })
        .collect();
    tl.put_batch(&later).unwrap();

    for lsn in [0x08, 0x17, 0x18, 0x20, 0x30].map(Lsn) {
        let point: Vec<(Key, Bytes)> = (0..14)
            .filter_map(|k| {
                let page = tl.get_page(rel_key(k), lsn).unwrap()?;
                Some((rel_key(k), page))
            })
            .collect();
        for limit in [1, 3, 100] {
            let got = whole_scan(&tl, lsn, limit);
            assert_eq!(got, point, "at {lsn}, pages of {limit}");
        }
        let present = |k: u32| point.iter().any(|(key, _)| *key == rel_key(k));
        if lsn >= Lsn(0x18) {
            // In the image's range without an image: no page, though an older layer holds one.
            assert!(!present(4) && !present(8), "at {lsn}");
            assert!(present(11), "outside the image's range, at {lsn}");
        } else {
            assert!(present(4) && present(8), "at {lsn}");
        }
    }
}

mod branches;
