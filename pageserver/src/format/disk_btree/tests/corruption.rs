//! B-tree corruption tests: one test per damage the reader detects, then property tests that
//! damage random blocks (with and without a valid checksum): every answer is right or an error.

use super::*;

// ---------------------------------------------------------------------------------------------
// Corruption, one check at a time
// ---------------------------------------------------------------------------------------------

/// 40 entries, 3 per leaf, 3 per parent: 14 leaves, 5 + 2 internal nodes and a root, 4 levels.
fn sample() -> (Model<8>, BtreeInfo, VecBlockSink) {
    let model: Model<8> = (0..40u64).map(|i| (key8(i * 10), i)).collect();
    let (info, blocks) = build(&model, Some((3, 3)));
    assert_eq!(info.height, 4);
    (model, info, blocks)
}

fn node(blocks: &VecBlockSink, blkno: u32) -> Node<'_, 8> {
    Node::parse(blkno, &blocks.blocks()[blkno as usize]).unwrap()
}

fn set_u16(block: &mut [u8; PAGE_SZ], off: usize, v: u16) {
    block[off..off + 2].copy_from_slice(&v.to_be_bytes());
}

/// Sets internal entry `index`'s child pointer.
fn set_child(block: &mut [u8; PAGE_SZ], index: usize, child: u32) {
    let off = HEADER_LEN + index * (8 + CHILD_LEN) + 8;
    block[off..off + 4].copy_from_slice(&child.to_be_bytes());
}

/// The leftmost path from the root: block numbers, root first.
fn leftmost_path(blocks: &VecBlockSink, root: u32) -> Vec<u32> {
    let mut path = vec![root];
    loop {
        let n = node(blocks, *path.last().unwrap());
        if n.level == 0 {
            return path;
        }
        path.push(n.child(0));
    }
}

fn corruption<const K: usize>(
    blocks: &VecBlockSink,
    root: u32,
    key: &[u8; K],
) -> (u32, Corruption) {
    let tree = DiskBtreeReader::<K, _>::new(root, blocks);
    match tree.find_at_or_below(key) {
        Err(BtreeReadError::Corrupt { blkno, reason }) => (blkno, reason),
        other => panic!("expected corruption, got {other:?}"),
    }
}

#[test]
fn detects_bad_magic_and_checksum() {
    let (_, info, mut blocks) = sample();
    let path = leftmost_path(&blocks, info.root_blk);
    let leaf = path[3];
    blocks.blocks_mut()[leaf as usize][HEADER_LEN] ^= 0x10;
    let (blkno, reason) = corruption(&blocks, info.root_blk, &key8(0));
    assert_eq!(blkno, leaf);
    assert!(matches!(reason, Corruption::Checksum { .. }), "{reason}");
    // Other subtrees are still readable.
    let tree = DiskBtreeReader::<8, _>::new(info.root_blk, &blocks);
    assert_eq!(tree.get(&key8(390)).unwrap(), Some(39));

    blocks.blocks_mut()[leaf as usize] = [0; PAGE_SZ];
    let (blkno, reason) = corruption(&blocks, info.root_blk, &key8(0));
    assert_eq!((blkno, reason), (leaf, Corruption::BadMagic { found: 0 }));
    let err = tree_err_text(&blocks, info.root_blk);
    assert!(err.contains(&format!("block {leaf} is corrupt")), "{err}");
}

fn tree_err_text(blocks: &VecBlockSink, root: u32) -> String {
    DiskBtreeReader::<8, _>::new(root, blocks)
        .get(&key8(0))
        .unwrap_err()
        .to_string()
}

#[test]
fn detects_unknown_version_and_key_length() {
    let (_, info, mut blocks) = sample();
    let (blkno, reason) = corruption::<9>(&blocks, info.root_blk, &[0; 9]);
    assert_eq!(
        (blkno, reason),
        (
            info.root_blk,
            Corruption::KeyLen {
                found: 8,
                expected: 9
            }
        )
    );
    let root = &mut blocks.blocks_mut()[info.root_blk as usize];
    root[VERSION_OFF] = 2;
    reseal(root);
    let (_, reason) = corruption(&blocks, info.root_blk, &key8(0));
    assert_eq!(reason, Corruption::UnknownVersion { found: 2 });
}

#[test]
fn detects_impossible_levels_and_counts() {
    let (_, info, blocks) = sample();
    let root = info.root_blk as usize;

    let mut b = blocks.clone();
    b.blocks_mut()[root][LEVEL_OFF] = MAX_HEIGHT as u8;
    reseal(&mut b.blocks_mut()[root]);
    let (_, reason) = corruption(&b, info.root_blk, &key8(0));
    assert_eq!(
        reason,
        Corruption::LevelTooHigh {
            level: MAX_HEIGHT as u8
        }
    );

    for count in [internal_capacity(8) + 1, usize::from(u16::MAX)] {
        let mut b = blocks.clone();
        set_u16(&mut b.blocks_mut()[root], COUNT_OFF, count as u16);
        reseal(&mut b.blocks_mut()[root]);
        let (_, reason) = corruption(&b, info.root_blk, &key8(0));
        assert_eq!(
            reason,
            Corruption::CountTooLarge {
                level: 3,
                count,
                capacity: internal_capacity(8)
            }
        );
    }

    // An empty internal root, and an empty leaf below the root.
    let mut b = blocks.clone();
    set_u16(&mut b.blocks_mut()[root], COUNT_OFF, 0);
    reseal(&mut b.blocks_mut()[root]);
    let (_, reason) = corruption(&b, info.root_blk, &key8(0));
    assert_eq!(reason, Corruption::EmptyNode { level: 3 });
    let leaf = leftmost_path(&blocks, info.root_blk)[3];
    let mut b = blocks.clone();
    set_u16(&mut b.blocks_mut()[leaf as usize], COUNT_OFF, 0);
    reseal(&mut b.blocks_mut()[leaf as usize]);
    let (blkno, reason) = corruption(&b, info.root_blk, &key8(0));
    assert_eq!((blkno, reason), (leaf, Corruption::EmptyNode { level: 0 }));
}

#[test]
fn detects_unsorted_keys() {
    let (_, info, mut blocks) = sample();
    let leaf = leftmost_path(&blocks, info.root_blk)[3];
    let block = &mut blocks.blocks_mut()[leaf as usize];
    // Swap the keys of entries 1 and 2 (entries are 16 bytes: key, value).
    let (a, b) = (HEADER_LEN + 16, HEADER_LEN + 32);
    let key1: [u8; 8] = block[a..a + 8].try_into().unwrap();
    block.copy_within(b..b + 8, a);
    block[b..b + 8].copy_from_slice(&key1);
    reseal(block);
    let (blkno, reason) = corruption(&blocks, info.root_blk, &key8(0));
    assert_eq!((blkno, reason), (leaf, Corruption::Unsorted { index: 2 }));
}

#[test]
fn detects_child_pointers_out_of_range() {
    let (_, info, blocks) = sample();
    let root = info.root_blk;
    // To itself, to a block after it, and (with a first block) below the tree.
    for (child, first_blk) in [(root, 0), (root + 1, 0), (u32::MAX, 0), (0, 1)] {
        let mut b = blocks.clone();
        set_child(&mut b.blocks_mut()[root as usize], 0, child);
        reseal(&mut b.blocks_mut()[root as usize]);
        let tree = DiskBtreeReader::<8, _>::new(root, &b).with_first_blk(first_blk);
        let err = tree.get(&key8(0)).unwrap_err();
        match err {
            BtreeReadError::Corrupt {
                blkno,
                reason:
                    Corruption::ChildOutOfRange {
                        index: 0, child: c, ..
                    },
            } => assert_eq!((blkno, c), (root, child)),
            other => panic!("{other}"),
        }
    }
    let tree = DiskBtreeReader::<8, _>::new(root, &blocks).with_first_blk(root + 1);
    assert!(matches!(
        tree.get(&key8(0)),
        Err(BtreeReadError::Corrupt {
            reason: Corruption::RootOutOfRange { .. },
            ..
        })
    ));
}

/// A pointer to a sound node that is not the one the parent's key describes.
#[test]
fn detects_misdirected_pointers() {
    let (model, info, blocks) = sample();
    let root = info.root_blk as usize;
    let path = leftmost_path(&blocks, info.root_blk);

    // Entry 0 of the root points two levels down, at a node with the very same first key.
    let mut b = blocks.clone();
    set_child(&mut b.blocks_mut()[root], 0, path[2]);
    reseal(&mut b.blocks_mut()[root]);
    let (blkno, reason) = corruption(&b, info.root_blk, &key8(0));
    assert_eq!(
        (blkno, reason),
        (
            path[2],
            Corruption::Level {
                found: 1,
                parent_level: 3,
                expected: 2
            }
        )
    );

    // The root's two children swapped: right level, wrong keys.
    let root_node = node(&blocks, info.root_blk);
    let (c0, c1) = (root_node.child(0), root_node.child(1));
    let mut b = blocks.clone();
    set_child(&mut b.blocks_mut()[root], 0, c1);
    set_child(&mut b.blocks_mut()[root], 1, c0);
    reseal(&mut b.blocks_mut()[root]);
    let (blkno, reason) = corruption(&b, info.root_blk, &key8(0));
    assert_eq!(
        (blkno, reason),
        (
            c1,
            Corruption::SeparatorMismatch {
                parent_blk: info.root_blk,
                index: 0
            }
        )
    );

    // A leaf whose last key strays into its right neighbour's range (still sorted within it).
    let leaf = path[3];
    let mut b = blocks.clone();
    let block = &mut b.blocks_mut()[leaf as usize];
    let last = HEADER_LEN + 2 * 16;
    block[last..last + 8].copy_from_slice(&key8(35));
    reseal(block);
    let (blkno, reason) = corruption(&b, info.root_blk, &key8(0));
    assert_eq!(
        (blkno, reason),
        (
            leaf,
            Corruption::KeyAboveBound {
                parent_blk: path[2]
            }
        )
    );
    // A scan of the damaged tree stops at the damage instead of going backwards in key order.
    let tree = DiskBtreeReader::<8, _>::new(info.root_blk, &b);
    let (entries, err) = scan_until_error(tree.iter_from(&key8(0)));
    assert!(entries.is_empty());
    assert!(err.is_some_and(|e| is_corrupt(&e)));
    let (entries, err) = scan_until_error(tree.iter_backward_from(&key8(1_000)));
    assert_eq!(entries[..], backward(&model, &key8(1_000))[..entries.len()]);
    assert!(err.is_some());
}

#[test]
fn truncated_or_missing_blocks_are_errors() {
    let (model, info, blocks) = sample();
    for keep in 0..blocks.blocks().len() {
        let mut b = blocks.clone();
        b.blocks_mut().truncate(keep);
        let tree = DiskBtreeReader::<8, _>::new(info.root_blk, &b);
        for probe in probes(&model, &[]) {
            assert!(matches!(
                tree.get(&probe),
                Err(BtreeReadError::Block(BlockReadError::OutOfBounds { .. }))
            ));
        }
        assert!(tree.iter_from(&key8(0)).next().unwrap().is_err());
    }
    // A hole (a block never written, read as zeroes) in the middle of the tree.
    for hole in 0..info.root_blk {
        let mut b = blocks.clone();
        b.blocks_mut()[hole as usize] = [0; PAGE_SZ];
        check_damaged(
            &b,
            info.root_blk,
            &model,
            &probes(&model, &[]),
            &HashSet::from([hole]),
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Corruption, at random
// ---------------------------------------------------------------------------------------------

/// Where to damage a tree: a block, a byte (biased to the header and the first entries, where
/// the structure is), and a non-zero XOR mask.
fn damage() -> impl Strategy<Value = (prop::sample::Index, usize, u8)> {
    (
        any::<prop::sample::Index>(),
        prop_oneof![0..HEADER_LEN, HEADER_LEN..HEADER_LEN + 200, 0..PAGE_SZ],
        1u8..=255,
    )
}

/// Applies `damage` and returns the blocks that differ from the original.
fn apply_damage(
    blocks: &mut VecBlockSink,
    damage: &[(prop::sample::Index, usize, u8)],
    forge_checksums: bool,
) -> HashSet<u32> {
    let original = blocks.clone();
    let n = blocks.blocks().len();
    for (block, byte, mask) in damage {
        blocks.blocks_mut()[block.index(n)][*byte] ^= mask;
    }
    if forge_checksums {
        for (block, _, _) in damage {
            reseal(&mut blocks.blocks_mut()[block.index(n)]);
        }
    }
    (0..n)
        .filter(|&i| blocks.blocks()[i] != original.blocks()[i])
        .map(|i| i as u32)
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random bit flips (up to three bits, which CRC-32C always detects in an 8 KiB block): an
    /// operation errs exactly when it reads a flipped block, and is right otherwise.
    #[test]
    fn flipped_bits_are_detected_never_misread(
        model in prop::collection::btree_map((0u64..5_000).prop_map(key8), any::<u64>(), 0..600),
        limits in prop_oneof![Just(Some((4usize, 3usize))), Just(Some((20, 5))), Just(None)],
        flips in prop::collection::vec((any::<prop::sample::Index>(), 0..PAGE_SZ, 0u8..8), 1..4),
    ) {
        let (info, mut blocks) = build(&model, limits);
        let damage: Vec<_> = flips.into_iter().map(|(b, byte, bit)| (b, byte, 1u8 << bit)).collect();
        let changed = apply_damage(&mut blocks, &damage, false);
        check_damaged(&blocks, info.root_blk, &model, &probes(&model, &[]), &changed);
    }

    /// Damage whose checksums are forged to match: no panic, no loop, no block read twice in a
    /// scan, keys in order, and operations that avoid the damage are right.
    #[test]
    fn forged_damage_never_panics_or_loops(
        model in prop::collection::btree_map((0u64..5_000).prop_map(key8), any::<u64>(), 0..600),
        limits in prop_oneof![Just(Some((4usize, 3usize))), Just(Some((20, 5))), Just(None)],
        damage in prop::collection::vec(damage(), 1..6),
    ) {
        let (info, mut blocks) = build(&model, limits);
        let changed = apply_damage(&mut blocks, &damage, true);
        check_forged(&blocks, info.root_blk, &model, &probes(&model, &[]), &changed);
    }

    /// Child pointers redirected to random blocks of the tree, with forged checksums: every
    /// answer is right or an error, because a redirected pointer lands on a node whose first
    /// key, level or range betrays it.
    #[test]
    fn redirected_pointers_never_give_wrong_answers(
        model in prop::collection::btree_map((0u64..5_000).prop_map(key8), any::<u64>(), 1..600),
        limits in prop_oneof![Just((2usize, 2usize)), Just((4, 3)), Just((20, 5))],
        redirects in prop::collection::vec(
            (any::<prop::sample::Index>(), any::<prop::sample::Index>(), any::<prop::sample::Index>()),
            1..4,
        ),
    ) {
        let (info, mut blocks) = build(&model, Some(limits));
        let original = blocks.clone();
        let n = blocks.blocks().len();
        let internal: Vec<u32> = (0..n as u32).filter(|&b| node(&original, b).level > 0).collect();
        prop_assume!(!internal.is_empty());
        for (parent, index, target) in &redirects {
            let parent = *parent.get(&internal);
            let count = node(&original, parent).count();
            let block = &mut blocks.blocks_mut()[parent as usize];
            set_child(block, index.index(count), target.index(n) as u32);
            reseal(block);
        }
        // Unlike `check_forged`, this can demand right answers: only the pointers changed, and
        // the one node at the right level whose first key is the parent's key is the original.
        let tree = DiskBtreeReader::<8, _>::new(info.root_blk, &blocks);
        for probe in probes(&model, &[]) {
            match tree.find_at_or_below(&probe) {
                Ok(found) => prop_assert_eq!(found, at_or_below(&model, &probe)),
                Err(e) => prop_assert!(is_corrupt(&e), "{}", e),
            }
        }
        for from in [[0u8; 8], [0xFF; 8]] {
            let (entries, err) = scan_until_error(tree.iter_from(&from));
            let expected = forward(&model, &from);
            prop_assert_eq!(&entries[..], &expected[..entries.len()]);
            if err.is_none() {
                prop_assert_eq!(entries.len(), expected.len());
            }
            let (entries, err) = scan_until_error(tree.iter_backward_from(&from));
            let expected = backward(&model, &from);
            prop_assert_eq!(&entries[..], &expected[..entries.len()]);
            if err.is_none() {
                prop_assert_eq!(entries.len(), expected.len());
            }
        }
    }
}
