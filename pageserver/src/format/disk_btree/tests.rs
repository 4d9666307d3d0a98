//! B-tree tests: a `BTreeMap` model for every read operation on trees of 1 to 13 levels, block
//! read counts, the builder's errors and memory, the byte layout, one test per corruption the
//! reader detects, and property tests that corrupt random blocks (with and without a valid
//! checksum) and check that every answer is either right or an error.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashSet};
use std::io;

use proptest::prelude::*;

use super::iterator::Direction;
use super::reader::Node;
use super::*;
use crate::format::block_io::{BlockLease, BlockReadError, BlockReader, FileBlockReader};
use crate::page_cache::{FileId, PageCache, PageCacheConfig};

/// A delta layer key: an 18-byte page key (a page number in its last four bytes) ++ LSN.
fn key26(page: u32, lsn: u64) -> [u8; 26] {
    let mut key = [0u8; 26];
    key[0] = 0x01;
    key[14..18].copy_from_slice(&page.to_be_bytes());
    key[18..26].copy_from_slice(&lsn.to_be_bytes());
    key
}

fn key8(n: u64) -> [u8; 8] {
    n.to_be_bytes()
}

/// The next key in byte order, if any.
fn succ<const K: usize>(key: &[u8; K]) -> Option<[u8; K]> {
    let mut out = *key;
    for byte in out.iter_mut().rev() {
        let (v, carry) = byte.overflowing_add(1);
        *byte = v;
        if !carry {
            return Some(out);
        }
    }
    None
}

/// The previous key in byte order, if any.
fn pred<const K: usize>(key: &[u8; K]) -> Option<[u8; K]> {
    let mut out = *key;
    for byte in out.iter_mut().rev() {
        let (v, borrow) = byte.overflowing_sub(1);
        *byte = v;
        if !borrow {
            return Some(out);
        }
    }
    None
}

/// Records the blocks read through it.
struct Recording<'r, R: ?Sized> {
    inner: &'r R,
    log: RefCell<Vec<u32>>,
}

impl<'r, R: BlockReader + ?Sized> Recording<'r, R> {
    fn new(inner: &'r R) -> Self {
        Recording {
            inner,
            log: RefCell::new(Vec::new()),
        }
    }

    /// The blocks read since the last call.
    fn take(&self) -> Vec<u32> {
        std::mem::take(&mut *self.log.borrow_mut())
    }
}

impl<R: BlockReader + ?Sized> BlockReader for Recording<'_, R> {
    fn read_blk(&self, blkno: u32) -> Result<BlockLease<'_>, BlockReadError> {
        self.log.borrow_mut().push(blkno);
        self.inner.read_blk(blkno)
    }
}

/// Numbers blocks and forgets them, for building very large or very tall trees.
#[derive(Default)]
struct NullSink {
    written: u32,
}

impl BlockSink for NullSink {
    fn write_block(&mut self, _block: &[u8; PAGE_SZ]) -> io::Result<u32> {
        self.written += 1;
        Ok(self.written - 1)
    }
}

type Model<const K: usize> = BTreeMap<[u8; K], u64>;

fn build<const K: usize>(
    model: &Model<K>,
    limits: Option<(usize, usize)>,
) -> (BtreeInfo, VecBlockSink) {
    let mut builder = DiskBtreeBuilder::<K, _>::new(VecBlockSink::new());
    if let Some((leaf, internal)) = limits {
        builder = builder.with_node_limits(leaf, internal);
    }
    for (key, value) in model {
        builder.append(key, *value).unwrap();
    }
    builder.finish().unwrap()
}

/// The height of a tree of `n` entries packed `leaf` per leaf and `internal` per parent.
fn packed_height(n: usize, leaf: usize, internal: usize) -> u8 {
    let mut nodes = n.div_ceil(leaf).max(1);
    let mut height = 1;
    while nodes > 1 {
        nodes = nodes.div_ceil(internal);
        height += 1;
    }
    height
}

/// The smallest and largest keys, a key outside each end, and each of up to ~150 of the
/// model's keys with its neighbours (present or absent), plus `extra`.
fn probes<const K: usize>(model: &Model<K>, extra: &[[u8; K]]) -> Vec<[u8; K]> {
    let mut probes = vec![[0u8; K], [0xFF; K]];
    let stride = (model.len() / 150).max(1);
    for key in model.keys().step_by(stride) {
        probes.push(*key);
        probes.extend(pred(key));
        probes.extend(succ(key));
    }
    if let Some((last, _)) = model.last_key_value() {
        probes.push(*last);
        probes.extend(succ(last));
    }
    probes.extend_from_slice(extra);
    probes
}

fn at_or_below<const K: usize>(model: &Model<K>, key: &[u8; K]) -> Option<([u8; K], u64)> {
    model
        .range::<[u8; K], _>(..=key)
        .next_back()
        .map(|(k, v)| (*k, *v))
}

fn forward<const K: usize>(model: &Model<K>, from: &[u8; K]) -> Vec<([u8; K], u64)> {
    model
        .range::<[u8; K], _>(from..)
        .map(|(k, v)| (*k, *v))
        .collect()
}

fn backward<const K: usize>(model: &Model<K>, from: &[u8; K]) -> Vec<([u8; K], u64)> {
    model
        .range::<[u8; K], _>(..=from)
        .rev()
        .map(|(k, v)| (*k, *v))
        .collect()
}

/// Every read operation on a sound tree agrees with the model.
fn check_against_model<const K: usize, R: BlockReader + ?Sized>(
    reader: &R,
    root: u32,
    model: &Model<K>,
    probes: &[[u8; K]],
) {
    let tree = DiskBtreeReader::<K, R>::new(root, reader);
    for probe in probes {
        assert_eq!(tree.get(probe).unwrap(), model.get(probe).copied());
        assert_eq!(
            tree.find_at_or_below(probe).unwrap(),
            at_or_below(model, probe),
        );
    }
    // Scans are O(entries): a handful of starting points.
    for probe in probes.iter().step_by(probes.len() / 6 + 1) {
        let fwd: Vec<_> = tree.iter_from(probe).map(Result::unwrap).collect();
        assert_eq!(fwd, forward(model, probe));
        let back: Vec<_> = tree.iter_backward_from(probe).map(Result::unwrap).collect();
        assert_eq!(back, backward(model, probe));

        let mut visited = Vec::new();
        let complete = tree
            .visit_from(probe, |k, v| {
                visited.push((*k, v));
                true
            })
            .unwrap();
        assert!(complete);
        assert_eq!(visited, fwd);
        let mut visited = Vec::new();
        let complete = tree
            .visit_backward_from(probe, |k, v| {
                visited.push((*k, v));
                true
            })
            .unwrap();
        assert!(complete);
        assert_eq!(visited, back);

        // A visitor that stops after three entries sees exactly three, and says it stopped.
        let mut seen = 0;
        let complete = tree
            .visit_from(probe, |_, _| {
                seen += 1;
                seen < 3
            })
            .unwrap();
        assert_eq!(complete, fwd.len() < 3);
        assert_eq!(seen, fwd.len().min(3));
    }
}

/// Entries yielded before the first error, and whether an error ended the scan.
fn scan_until_error<const K: usize, R: BlockReader + ?Sized>(
    iter: DiskBtreeIter<'_, K, R>,
) -> (Vec<([u8; K], u64)>, Option<BtreeReadError>) {
    let mut entries = Vec::new();
    for entry in iter {
        match entry {
            Ok(e) => entries.push(e),
            Err(e) => return (entries, Some(e)),
        }
    }
    (entries, None)
}

fn is_corrupt(e: &BtreeReadError) -> bool {
    matches!(e, BtreeReadError::Corrupt { .. })
}

/// On a tree whose `changed` blocks were damaged without fixing their checksums: an operation
/// fails if and only if it read a changed block, and otherwise its answer is the model's; a
/// failed scan yielded a correct prefix first.
fn check_damaged<const K: usize>(
    blocks: &VecBlockSink,
    root: u32,
    model: &Model<K>,
    probes: &[[u8; K]],
    changed: &HashSet<u32>,
) {
    let rec = Recording::new(blocks);
    let tree = DiskBtreeReader::<K, _>::new(root, &rec);
    let touched = |read: Vec<u32>| read.iter().any(|b| changed.contains(b));
    for probe in probes {
        rec.take();
        match tree.get(probe) {
            Ok(v) => assert_eq!(v, model.get(probe).copied()),
            Err(e) => assert!(is_corrupt(&e), "{e}"),
        }
        let got_ok = rec.take();
        rec.take();
        let found = tree.find_at_or_below(probe);
        let read = rec.take();
        assert_eq!(got_ok, read, "get and find_at_or_below read the same path");
        let touched = touched(read);
        match found {
            Ok(found) => {
                assert!(!touched, "read a damaged block without noticing");
                assert_eq!(found, at_or_below(model, probe));
            }
            Err(e) => {
                assert!(touched, "error without a damaged block: {e}");
                assert!(is_corrupt(&e), "{e}");
            }
        }
    }
    for probe in probes.iter().step_by(probes.len() / 4 + 1) {
        for dir in [Direction::Forward, Direction::Backward] {
            rec.take();
            let (iter, expected) = match dir {
                Direction::Forward => (tree.iter_from(probe), forward(model, probe)),
                Direction::Backward => (tree.iter_backward_from(probe), backward(model, probe)),
            };
            let (entries, err) = scan_until_error(iter);
            let touched = touched(rec.take());
            match err {
                None => {
                    assert!(!touched, "scanned a damaged block without noticing");
                    assert_eq!(entries, expected);
                }
                Some(e) => {
                    assert!(touched, "error without a damaged block: {e}");
                    assert!(is_corrupt(&e), "{e}");
                    assert_eq!(entries[..], expected[..entries.len()]);
                }
            }
        }
    }
}

/// On a tree with blocks rewritten *and re-checksummed*, answers can be wrong (that is what the
/// checksum is for), but nothing may panic or loop: a point lookup reads at most MAX_HEIGHT
/// blocks, a scan reads no block twice and yields strictly monotonic keys, and operations that
/// did not read a changed block still agree with the model.
fn check_forged<const K: usize>(
    blocks: &VecBlockSink,
    root: u32,
    model: &Model<K>,
    probes: &[[u8; K]],
    changed: &HashSet<u32>,
) {
    let rec = Recording::new(blocks);
    let tree = DiskBtreeReader::<K, _>::new(root, &rec);
    let clean = |read: &[u32]| !read.iter().any(|b| changed.contains(b));
    for probe in probes {
        rec.take();
        let found = tree.find_at_or_below(probe);
        let read = rec.take();
        assert!(read.len() <= MAX_HEIGHT);
        if clean(&read) {
            let expected = at_or_below(model, probe);
            assert_eq!(found.unwrap(), expected);
        }
        let _ = tree.get(probe);
        assert!(rec.take().len() <= MAX_HEIGHT);
    }
    for probe in probes.iter().step_by(probes.len() / 4 + 1) {
        for dir in [Direction::Forward, Direction::Backward] {
            rec.take();
            let (iter, expected) = match dir {
                Direction::Forward => (tree.iter_from(probe), forward(model, probe)),
                Direction::Backward => (tree.iter_backward_from(probe), backward(model, probe)),
            };
            let (entries, err) = scan_until_error(iter);
            let read = rec.take();
            // Only the last read may repeat a block: a node is checked after it is read, and
            // the first failed check ends the scan.
            let accepted = &read[..read.len().saturating_sub(1)];
            let unique: HashSet<_> = accepted.iter().collect();
            assert_eq!(
                unique.len(),
                accepted.len(),
                "a scan accepted a block twice"
            );
            for pair in entries.windows(2) {
                match dir {
                    Direction::Forward => assert!(pair[0].0 < pair[1].0),
                    Direction::Backward => assert!(pair[0].0 > pair[1].0),
                }
            }
            if clean(&read) {
                assert!(err.is_none());
                assert_eq!(entries, expected);
            }
        }
    }
}

/// Rewrites a block's checksum to match its contents.
fn reseal(block: &mut [u8; PAGE_SZ]) {
    let checksum = node_checksum(block);
    block[CHECKSUM_OFF..CHECKSUM_OFF + 4].copy_from_slice(&checksum.to_be_bytes());
}

fn model26() -> impl Strategy<Value = Model<26>> {
    // Few pages with many LSNs each, like a delta layer, so neighbouring probes share pages.
    prop::collection::btree_map(
        (0u32..40, 0u64..5_000).prop_map(|(page, lsn)| key26(page, lsn)),
        any::<u64>(),
        0..3_000,
    )
}

fn model8() -> impl Strategy<Value = Model<8>> {
    prop::collection::btree_map((0u64..20_000).prop_map(key8), any::<u64>(), 0..3_000)
}

/// The format's capacities, or small ones for trees of 3 to 13 levels.
fn limits() -> impl Strategy<Value = Option<(usize, usize)>> {
    prop_oneof![Just(None), (1usize..8, 2usize..6).prop_map(Some)]
}

// ---------------------------------------------------------------------------------------------
// Sound trees
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn reads_match_a_btreemap_26(
        model in model26(),
        limits in limits(),
        extra in prop::collection::vec((0u32..42, any::<u64>()).prop_map(|(p, l)| key26(p, l)), 0..20),
    ) {
        let (info, blocks) = build(&model, limits);
        let (leaf, internal) = limits.unwrap_or((leaf_capacity(26), internal_capacity(26)));
        prop_assert_eq!(info.height, packed_height(model.len(), leaf, internal));
        prop_assert_eq!(info.entries, model.len() as u64);
        prop_assert_eq!(info.root_blk as usize, blocks.blocks().len() - 1);
        check_against_model(&blocks, info.root_blk, &model, &probes(&model, &extra));
    }

    #[test]
    fn reads_match_a_btreemap_8(
        model in model8(),
        limits in limits(),
        extra in prop::collection::vec(any::<u64>().prop_map(key8), 0..20),
    ) {
        let (info, blocks) = build(&model, limits);
        let (leaf, internal) = limits.unwrap_or((leaf_capacity(8), internal_capacity(8)));
        prop_assert_eq!(info.height, packed_height(model.len(), leaf, internal));
        check_against_model(&blocks, info.root_blk, &model, &probes(&model, &extra));
    }

    /// A point lookup reads one block per level, and a full scan reads every block once.
    #[test]
    fn lookups_read_one_block_per_level(model in model8(), limits in limits()) {
        let (info, blocks) = build(&model, limits);
        let rec = Recording::new(&blocks);
        let tree = DiskBtreeReader::<8, _>::new(info.root_blk, &rec);
        let min = model.first_key_value().map(|(k, _)| *k);
        for probe in probes(&model, &[]) {
            rec.take();
            tree.get(&probe).unwrap();
            let read = rec.take();
            // The root first, and each step to a smaller block. A key below the whole tree is
            // below the root's first key: no need to go further.
            let expected = if min.is_some_and(|min| probe >= min) { info.height } else { 1 };
            prop_assert_eq!(read.len(), usize::from(expected));
            prop_assert_eq!(read[0], info.root_blk);
            prop_assert!(read.windows(2).all(|w| w[0] > w[1]));
        }
        rec.take();
        prop_assert_eq!(tree.iter_from(&[0; 8]).count(), model.len());
        let mut read = rec.take();
        read.sort_unstable();
        let all: Vec<u32> = (0..blocks.blocks().len() as u32).collect();
        prop_assert_eq!(read, all);
    }
}

#[test]
fn empty_tree_is_one_empty_leaf() {
    let (info, blocks) = build::<26>(&Model::new(), None);
    assert_eq!(
        info,
        BtreeInfo {
            root_blk: 0,
            height: 1,
            entries: 0
        }
    );
    assert_eq!(blocks.blocks().len(), 1);
    let tree = DiskBtreeReader::<26, _>::new(0, &blocks);
    for probe in [[0u8; 26], [0xFF; 26], key26(3, 3)] {
        assert_eq!(tree.get(&probe).unwrap(), None);
        assert_eq!(tree.find_at_or_below(&probe).unwrap(), None);
        assert_eq!(tree.iter_from(&probe).count(), 0);
        assert_eq!(tree.iter_backward_from(&probe).count(), 0);
        assert!(tree
            .visit_from(&probe, |_, _| panic!("no entries"))
            .unwrap());
    }
}

/// Entry counts around every boundary where a level is added or a node fills.
#[test]
fn trees_at_fill_boundaries() {
    let (leaf, internal) = (3, 2);
    for n in 0..=40u64 {
        let model: Model<8> = (0..n).map(|i| (key8(i * 2 + 1), i)).collect();
        let (info, blocks) = build(&model, Some((leaf, internal)));
        assert_eq!(
            info.height,
            packed_height(model.len(), leaf, internal),
            "n = {n}"
        );
        check_against_model(&blocks, info.root_blk, &model, &probes(&model, &[]));
    }
    let (leaf, internal) = (leaf_capacity(26), internal_capacity(26));
    for n in [leaf - 1, leaf, leaf + 1, 2 * leaf, 2 * leaf + 1] {
        let model: Model<26> = (0..n as u64).map(|i| (key26(7, i), i)).collect();
        let (info, blocks) = build(&model, None);
        assert_eq!(info.height, packed_height(n, leaf, internal), "n = {n}");
        assert_eq!(
            blocks.blocks().len(),
            n.div_ceil(leaf) + usize::from(n > leaf)
        );
        check_against_model(&blocks, info.root_blk, &model, &probes(&model, &[]));
    }
}

/// Three levels at the format's real fan-out (more than 240 × 272 entries of 26 bytes).
#[test]
fn three_levels_at_full_fanout() {
    let n = leaf_capacity(26) * internal_capacity(26) + 1_000;
    let model: Model<26> = (0..n as u64)
        .map(|i| (key26((i / 100) as u32, i % 100 * 16), i * 3))
        .collect();
    let (info, blocks) = build(&model, None);
    assert_eq!(info.height, 3);
    check_against_model(&blocks, info.root_blk, &model, &probes(&model, &[]));
}

proptest! {
    #[test]
    fn key_less_is_byte_order(
        (a, b) in (1usize..40).prop_flat_map(|len| {
            let key = prop::collection::vec(prop_oneof![Just(0u8), Just(1), Just(0xFF), any::<u8>()], len);
            (key.clone(), key)
        }),
    ) {
        prop_assert_eq!(key_less(&a, &b), a < b);
        prop_assert_eq!(key_less(&b, &a), b < a);
        prop_assert!(!key_less(&a, &a));
    }
}

#[test]
fn fanout_for_delta_layer_keys() {
    assert_eq!(leaf_capacity(26), 240);
    assert_eq!(internal_capacity(26), 272);
    assert_eq!(leaf_capacity(8), 511);
    assert_eq!(internal_capacity(8), 681);
    assert_eq!(MAX_KEY_LEN, 4082);
    assert_eq!(leaf_capacity(MAX_KEY_LEN), 2);
}

/// The newest version of a page at or below an LSN, and its older versions, newest first.
#[test]
fn page_versions_at_or_below_an_lsn() {
    let mut model = Model::new();
    for page in [1u32, 2, 3] {
        for lsn in (10..=200u64).step_by(10) {
            model.insert(key26(page, lsn), u64::from(page) * 1_000 + lsn);
        }
    }
    let (info, blocks) = build(&model, Some((4, 3)));
    let tree = DiskBtreeReader::<26, _>::new(info.root_blk, &blocks);
    let page_of = |key: &[u8; 26]| key[..18].to_vec();

    let (found, value) = tree.find_at_or_below(&key26(2, 55)).unwrap().unwrap();
    assert_eq!((found, value), (key26(2, 50), 2_050));
    // Below page 2's oldest version the entry found belongs to page 1: the caller's check.
    let (found, _) = tree.find_at_or_below(&key26(2, 5)).unwrap().unwrap();
    assert_ne!(page_of(&found), page_of(&key26(2, 0)));

    let mut lsns = Vec::new();
    let complete = tree
        .visit_backward_from(&key26(2, 55), |key, _| {
            if page_of(key) != page_of(&key26(2, 0)) {
                return false;
            }
            lsns.push(u64::from_be_bytes(key[18..].try_into().unwrap()));
            true
        })
        .unwrap();
    assert!(!complete);
    assert_eq!(lsns, [50, 40, 30, 20, 10]);
}

#[test]
fn reads_through_the_page_cache_from_a_file() {
    let model: Model<26> = (0..2_000u64)
        .map(|i| (key26((i % 37) as u32, i), i))
        .collect();
    let (info, blocks) = build(&model, None);
    let mut bytes: Vec<u8> = blocks.blocks().iter().flatten().copied().collect();

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("index");
    std::fs::write(&path, &bytes).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let cache = PageCache::new(PageCacheConfig {
        capacity_bytes: (8 * PAGE_SZ) as u64,
        ..Default::default()
    })
    .unwrap();
    let reader = FileBlockReader::new(&file, FileId::next(), &path, &cache);
    check_against_model(&reader, info.root_blk, &model, &probes(&model, &[]));

    // A file cut short in the middle of its last block (the root) cannot be read.
    bytes.truncate(bytes.len() - PAGE_SZ / 2);
    let path = dir.path().join("truncated");
    std::fs::write(&path, &bytes).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let reader = FileBlockReader::new(&file, FileId::next(), &path, &cache);
    let tree = DiskBtreeReader::<26, _>::new(info.root_blk, &reader);
    let err = tree.get(&key26(1, 1)).unwrap_err();
    assert!(matches!(err, BtreeReadError::Block(_)), "{err}");
    assert!(err.to_string().contains("truncated"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// Building
// ---------------------------------------------------------------------------------------------

#[test]
fn builder_refuses_keys_out_of_order_and_carries_on() {
    let mut builder = DiskBtreeBuilder::<8, _>::new(VecBlockSink::new());
    builder.append(&key8(10), 1).unwrap();
    builder.append(&key8(20), 2).unwrap();
    assert!(matches!(
        builder.append(&key8(20), 3),
        Err(BtreeBuildError::DuplicateKey { index: 2 })
    ));
    assert!(matches!(
        builder.append(&key8(15), 3),
        Err(BtreeBuildError::KeyOutOfOrder { index: 2 })
    ));
    assert!(matches!(
        builder.append(&key8(0), 3),
        Err(BtreeBuildError::KeyOutOfOrder { index: 2 })
    ));
    builder.append(&key8(30), 3).unwrap();
    assert_eq!(builder.entries(), 3);
    let (info, blocks) = builder.finish().unwrap();
    let model: Model<8> = [(key8(10), 1), (key8(20), 2), (key8(30), 3)].into();
    check_against_model(&blocks, info.root_blk, &model, &probes(&model, &[]));
}

/// Fails the `n`th write and every one after.
struct FailingSink {
    inner: VecBlockSink,
    fail_at: usize,
}

impl BlockSink for FailingSink {
    fn write_block(&mut self, block: &[u8; PAGE_SZ]) -> io::Result<u32> {
        if self.inner.blocks().len() >= self.fail_at {
            return Err(io::Error::other("disk on fire"));
        }
        self.inner.write_block(block)
    }
}

#[test]
fn a_failed_write_poisons_the_builder() {
    let sink = FailingSink {
        inner: VecBlockSink::new(),
        fail_at: 1,
    };
    let mut builder = DiskBtreeBuilder::<8, _>::new(sink).with_node_limits(2, 2);
    // The first leaf is written when key 3 arrives; the second, when key 5 does, fails.
    for i in 1..=4 {
        builder.append(&key8(i), i).unwrap();
    }
    let err = builder.append(&key8(5), 5).unwrap_err();
    assert!(matches!(err, BtreeBuildError::Write(_)), "{err}");
    assert!(err.to_string().contains("disk on fire"), "{err}");
    assert!(matches!(
        builder.append(&key8(6), 6),
        Err(BtreeBuildError::Poisoned)
    ));
    assert!(matches!(builder.finish(), Err(BtreeBuildError::Poisoned)));

    // A failure in `finish` itself is reported too.
    let sink = FailingSink {
        inner: VecBlockSink::new(),
        fail_at: 0,
    };
    let mut builder = DiskBtreeBuilder::<8, _>::new(sink);
    builder.append(&key8(1), 1).unwrap();
    assert!(matches!(builder.finish(), Err(BtreeBuildError::Write(_))));
}

/// Returns the same block number twice.
struct StuckSink;

impl BlockSink for StuckSink {
    fn write_block(&mut self, _block: &[u8; PAGE_SZ]) -> io::Result<u32> {
        Ok(7)
    }
}

#[test]
fn a_sink_that_does_not_number_blocks_upwards_is_refused() {
    let mut builder = DiskBtreeBuilder::<8, _>::new(StuckSink).with_node_limits(1, 2);
    // Leaf 1 is written (as block 7) when key 2 arrives, leaf 2 (as block 7 again) at key 3.
    builder.append(&key8(1), 1).unwrap();
    builder.append(&key8(2), 2).unwrap();
    let err = builder.append(&key8(3), 3).unwrap_err();
    assert!(
        matches!(
            err,
            BtreeBuildError::SinkOrder {
                previous: 7,
                got: 7
            }
        ),
        "{err}"
    );
    assert!(matches!(builder.finish(), Err(BtreeBuildError::Poisoned)));
}

/// Memory stays at one open node per level, however many entries.
#[test]
fn builder_keeps_one_open_node_per_level() {
    let mut builder = DiskBtreeBuilder::<26, _>::new(NullSink::default());
    for i in 0..200_000u64 {
        builder.append(&key26((i >> 12) as u32, i), i).unwrap();
        // 200 000 entries need 834 leaves and 4 level-1 nodes: three levels.
        assert!(builder.levels.len() <= 3);
    }
    let (info, sink) = builder.finish().unwrap();
    assert_eq!(info.height, 3);
    assert_eq!(info.root_blk + 1, sink.written);
    assert_eq!(sink.written, 834 + 4 + 1);
}

#[test]
fn builder_refuses_a_tree_taller_than_max_height() {
    // One entry per leaf and two children per parent: 2^15 entries fill exactly MAX_HEIGHT
    // levels, and one more needs another.
    let tall = |n: u64| {
        let mut builder = DiskBtreeBuilder::<8, _>::new(NullSink::default()).with_node_limits(1, 2);
        for i in 0..n {
            builder.append(&key8(i), i)?;
        }
        builder.finish().map(|(info, _)| info)
    };
    let info = tall(1 << 15).unwrap();
    assert_eq!(usize::from(info.height), MAX_HEIGHT);
    let err = tall((1 << 15) + 1).unwrap_err();
    assert!(matches!(err, BtreeBuildError::TooTall), "{err}");

    let mut builder = DiskBtreeBuilder::<8, _>::new(NullSink::default()).with_node_limits(1, 2);
    let mut i = 0;
    let err = loop {
        if let Err(e) = builder.append(&key8(i), i) {
            break e;
        }
        i += 1;
    };
    assert!(matches!(err, BtreeBuildError::TooTall), "{err}");
    assert!(i >= 1 << 15);
    assert!(matches!(
        builder.append(&key8(i + 1), 0),
        Err(BtreeBuildError::Poisoned)
    ));
    assert!(matches!(builder.finish(), Err(BtreeBuildError::Poisoned)));
}

/// The builder works through a borrowed sink, which the caller keeps.
#[test]
fn builds_into_a_borrowed_sink() {
    let mut sink = VecBlockSink::new();
    // Blocks before the tree, as a delta layer has its blobs there.
    sink.blocks_mut().resize(3, [0xAB; PAGE_SZ]);
    let model: Model<8> = (0..1_000u64).map(|i| (key8(i * 7), i)).collect();
    let mut builder = DiskBtreeBuilder::<8, _>::new(&mut sink).with_node_limits(5, 4);
    for (k, v) in &model {
        builder.append(k, *v).unwrap();
    }
    let (info, _) = builder.finish().unwrap();
    check_against_model(&sink, info.root_blk, &model, &probes(&model, &[]));
    let tree = DiskBtreeReader::<8, _>::new(info.root_blk, &sink).with_first_blk(3);
    assert_eq!(tree.get(&key8(7)).unwrap(), Some(1));
}

/// The byte layout documented in the module docs.
#[test]
fn node_layout_is_as_documented() {
    let mut builder = DiskBtreeBuilder::<2, _>::new(VecBlockSink::new());
    builder.append(&[0x01, 0x02], 5).unwrap();
    builder
        .append(&[0x03, 0x04], 0x0102_0304_0506_0708)
        .unwrap();
    let (info, blocks) = builder.finish().unwrap();
    assert_eq!(info.height, 1);
    let block = &blocks.blocks()[0];
    assert_eq!(
        block[..8],
        [0xB7, 0xEE, 0x01, 0x00, 0x00, 0x02, 0x00, 0x02],
        "magic, version, level, count, key_len"
    );
    let crc = utils::crc32c::crc32c_append(utils::crc32c::crc32c(&block[..8]), &block[12..]);
    assert_eq!(u32::from_be_bytes(block[8..12].try_into().unwrap()), crc);
    assert_eq!(
        block[12..32],
        [
            0x01, 0x02, 0, 0, 0, 0, 0, 0, 0, 5, //
            0x03, 0x04, 1, 2, 3, 4, 5, 6, 7, 8,
        ]
    );
    assert!(block[32..].iter().all(|&b| b == 0));

    // An internal node: key ++ u32 child, level 1.
    let mut builder = DiskBtreeBuilder::<2, _>::new(VecBlockSink::new()).with_node_limits(1, 2);
    builder.append(&[0x01, 0x02], 5).unwrap();
    builder.append(&[0x03, 0x04], 6).unwrap();
    let (info, blocks) = builder.finish().unwrap();
    assert_eq!((info.root_blk, info.height), (2, 2));
    let root = &blocks.blocks()[2];
    assert_eq!(root[..8], [0xB7, 0xEE, 0x01, 0x01, 0x00, 0x02, 0x00, 0x02]);
    assert_eq!(
        root[12..24],
        [0x01, 0x02, 0, 0, 0, 0, 0x03, 0x04, 0, 0, 0, 1]
    );
    assert!(root[24..].iter().all(|&b| b == 0));
}

mod corruption;
