//! Scans of branches: the branch's own layers merged with its ancestor's at the branch LSN,
//! checked against a model of the branch (the ancestor's versions up to the branch LSN and the
//! branch's own), across layer changes on either timeline and images made on the branch.

use super::*;
use crate::tenant::timeline::ancestry::Ancestry;
use crate::tenant::timeline::layer_set::manifest::Manifest;

const BRANCH: TimelineId = TimelineId::from_bytes([5; 16]);
const NESTED: TimelineId = TimelineId::from_bytes([6; 16]);

/// A branch of `ancestor` at `lsn` in a directory of its own, linked as the tenant links one.
fn branch_of(
    ancestor: &Arc<Timeline>,
    id: TimelineId,
    lsn: Lsn,
    cache: Arc<PageCache>,
) -> (tempfile::TempDir, Arc<Timeline>) {
    // As the tenant checks: a branch starts at an LSN its ancestor has.
    assert!(Lsn(1) <= lsn && lsn <= ancestor.last_record_lsn());
    ancestor.reserve_branch_point(lsn).unwrap();
    let dir = tempfile::tempdir().unwrap();
    Manifest::starting_at(TENANT, id, lsn)
        .store(dir.path())
        .unwrap();
    Ancestry {
        timeline_id: ancestor.timeline_id(),
        lsn,
    }
    .write(dir.path())
    .unwrap();
    let tl = Timeline::load(dir.path(), TENANT, id, cache, manual_conf()).unwrap();
    tl.set_ancestor(ancestor.clone(), lsn).unwrap();
    assert_eq!(tl.last_record_lsn(), lsn);
    (dir, Arc::new(tl))
}

/// The branch's model: the ancestor's versions at or below `lsn`.
fn model_below(model: &Model, lsn: Lsn) -> Model {
    model
        .iter()
        .filter(|((_, v), _)| *v <= lsn)
        .map(|(k, v)| (*k, v.clone()))
        .collect()
}

/// Every key's point read on `tl` at `lsn`, for the keys the scans use.
fn point_reads(tl: &Timeline, lsn: Lsn) -> Vec<(Key, Bytes)> {
    (0..KEYS + 4)
        .filter_map(|k| Some((rel_key(k), tl.get_page(rel_key(k), lsn).unwrap()?)))
        .collect()
}

/// Images of `keys`, each filled with `fill`, at one LSN.
fn images_of(keys: std::ops::Range<u32>, fill: u8) -> BuildOp {
    BuildOp::Put(keys.map(|k| (k, true, fill, false)).collect())
}

/// What the branch does once it exists: its own versions, and layer changes on it.
#[derive(Debug, Clone)]
enum BranchOp {
    Build(BuildOp),
    /// L0 compaction, then forced image creation: images of the branch's pages, its
    /// ancestor's included.
    CompactAndImage,
}

fn branch_op() -> impl Strategy<Value = BranchOp> {
    prop_oneof![
        6 => build_op().prop_map(BranchOp::Build),
        1 => Just(BranchOp::CompactAndImage),
    ]
}

fn run_branch(
    before: Vec<BuildOp>,
    branch_at_back: u64,
    after: Vec<BuildOp>,
    on_branch: Vec<BranchOp>,
    scans: Vec<ScanCase>,
) -> Result<(), TestCaseError> {
    let (_dir, cache, ancestor) = fresh_timeline(64);
    let ancestor = Arc::new(ancestor);
    let mut model = Model::new();
    let mut next_lsn = 1u64;
    apply_build(&ancestor, &mut model, &mut next_lsn, before);
    if next_lsn == 1 {
        // A branch starts above LSN 0.
        apply_build(
            &ancestor,
            &mut model,
            &mut next_lsn,
            vec![images_of(0..1, 0)],
        );
    }
    let branch_lsn = Lsn(next_lsn.saturating_sub(1 + branch_at_back).max(1));
    let (_branch_dir, branch) = branch_of(&ancestor, BRANCH, branch_lsn, cache);
    let mut branch_model = model_below(&model, branch_lsn);
    // The ancestor goes on; the branch never sees it.
    apply_build(&ancestor, &mut model, &mut next_lsn, after);
    let mut branch_next = branch_lsn.0 + 1;
    for op in on_branch {
        match op {
            BranchOp::Build(op) => {
                apply_build(&branch, &mut branch_model, &mut branch_next, vec![op]);
            }
            BranchOp::CompactAndImage => {
                branch.checkpoint().unwrap();
                branch.compact_l0(2).unwrap();
                branch.create_images(true).unwrap();
            }
        }
    }
    check_scans(&branch, &mut branch_model, &mut branch_next, scans)?;
    // And the ancestor's scans still see only its own history.
    let lsn = ancestor.last_record_lsn();
    prop_assert_eq!(
        whole_scan(&ancestor, lsn, 7),
        expected_scan(&model, Key::MIN, Key::MAX, lsn)
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// A branch at a random LSN of a random ancestor, random history on both afterwards
    /// (images on the branch among it), then random paged scans of the branch at LSNs on
    /// either side of the branch point: every scan gives exactly the branch model's pages.
    #[test]
    fn paged_scans_of_a_branch_match_a_btreemap_model(
        before in prop::collection::vec(build_op(), 1..30),
        branch_at_back in 0u64..8,
        after in prop::collection::vec(build_op(), 0..10),
        on_branch in prop::collection::vec(branch_op(), 0..30),
        scans in prop::collection::vec(scan_case(), 1..5),
    ) {
        run_branch(before, branch_at_back, after, on_branch, scans)?;
    }
}

/// A cursor on a branch is built on the ancestor's layer set too: a flush on the ancestor
/// re-seeks it (its streams name the ancestor's layers by place), and the answer is the same.
#[test]
fn an_ancestor_layer_change_reseeks_a_branch_cursor() {
    let (_dir, cache, ancestor) = fresh_timeline(64);
    let ancestor = Arc::new(ancestor);
    let mut model = Model::new();
    let mut next_lsn = 1;
    apply_build(
        &ancestor,
        &mut model,
        &mut next_lsn,
        vec![
            images_of(0..20, 1),
            BuildOp::Checkpoint,
            images_of(10..30, 2),
        ],
    );
    let (_branch_dir, branch) = branch_of(&ancestor, BRANCH, Lsn(2), cache);
    branch
        .put(rel_key(5), Lsn(3), &Value::Image(Bytes::from(vec![9; 24])))
        .unwrap();
    let want = point_reads(&branch, Lsn(3));
    assert_eq!(want.len(), 30);

    let mut cursor = ScanCursor::new(Key::MIN, Key::MAX, Lsn(3));
    let mut got = branch.scan_page(&mut cursor, 4).unwrap().entries;
    let page = branch.scan_page(&mut cursor, 4).unwrap();
    assert!(page.resumed);
    got.extend(page.entries);
    // The ancestor's open layer, which the branch's streams read, is flushed away.
    ancestor.checkpoint().unwrap();
    let page = branch.scan_page(&mut cursor, 4).unwrap();
    assert!(!page.resumed, "the ancestor's layer set changed");
    got.extend(page.entries);
    loop {
        let page = branch.scan_page(&mut cursor, 4).unwrap();
        got.extend(page.entries);
        if !page.more {
            break;
        }
    }
    assert_eq!(got, want);
}

/// A branch of a branch scans through both ancestors, each at its own branch LSN; images on
/// the middle timeline answer for their keys, so the oldest one is not read for them.
#[test]
fn a_nested_branch_scans_through_both_ancestors() {
    let (_dir, cache, root) = fresh_timeline(64);
    let root = Arc::new(root);
    let mut model = Model::new();
    let mut next_lsn = 1;
    apply_build(
        &root,
        &mut model,
        &mut next_lsn,
        vec![images_of(0..40, 1), BuildOp::Checkpoint],
    );
    let (_middle_dir, middle) = branch_of(&root, BRANCH, Lsn(1), cache.clone());
    // Above the middle's branch point: the middle and the nested branch never see it.
    apply_build(&root, &mut model, &mut next_lsn, vec![images_of(0..40, 7)]);
    let mut middle_model = model_below(&model, Lsn(1));
    let mut middle_next = 2;
    apply_build(
        &middle,
        &mut middle_model,
        &mut middle_next,
        vec![
            images_of(10..15, 2),
            BuildOp::Checkpoint,
            images_of(15..20, 3),
            BuildOp::Checkpoint,
        ],
    );
    assert_eq!(middle.compact_l0(2).unwrap().inputs, 2);
    let imaged = middle.create_images(true).unwrap();
    assert_eq!(imaged.lsn, Some(Lsn(3)));
    assert_eq!(imaged.images, 40, "the ancestor's pages are imaged too");
    let (_nested_dir, nested) = branch_of(&middle, NESTED, Lsn(3), cache);
    let mut nested_model = model_below(&middle_model, Lsn(3));
    let mut nested_next = 4;
    apply_build(
        &nested,
        &mut nested_model,
        &mut nested_next,
        vec![images_of(30..45, 3)],
    );
    for lsn in [Lsn(1), Lsn(2), Lsn(3), Lsn(4)] {
        let want = expected_scan(&nested_model, Key::MIN, Key::MAX, lsn);
        assert_eq!(point_reads(&nested, lsn), want, "point reads at {lsn}");
        let (got, cost) = measure(|| whole_scan(&nested, lsn, 5));
        assert_eq!(got, want, "scan at {lsn}");
        if lsn >= Lsn(3) {
            // The middle's image layer (at 3) answers for all 40 keys: the root's layers are
            // never visited for them.
            assert!(
                cost.layers <= 2 * want.len() as u32,
                "{cost:?} for {} keys",
                want.len()
            );
        }
    }
}
