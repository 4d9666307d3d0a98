use std::time::Duration;

use bytes::Bytes;
use pageserver_api::{Key, Value};
use utils::Lsn;

use super::*;
use crate::tenant::test_support::*;
use crate::tenant::timeline::scan::ScanCursor;
use crate::tenant::timeline::Timeline;
use crate::tenant::timeline::TimelineError;
use crate::PAGE_SZ;

fn image(fill: u8) -> Value {
    Value::Image(Bytes::from(vec![fill; PAGE_SZ]))
}

fn load(workdir: &Path, conf: TimelineConf) -> TenantManager {
    let (mgr, _) = TenantManager::load(workdir, small_cache(128), conf).unwrap();
    mgr
}

/// A timeline in a new tenant.
fn new_timeline(mgr: &TenantManager) -> Arc<Timeline> {
    mgr.create_tenant(None)
        .unwrap()
        .create_timeline(None)
        .unwrap()
}

/// Polls `done` until it holds, failing after ten seconds.
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn tenants_and_timelines_live_in_the_documented_layout_and_survive_restart() {
    let workdir = tempfile::tempdir().unwrap();
    let mgr = load(workdir.path(), TimelineConf::default());
    let tenant = mgr.create_tenant(None).unwrap();
    let timeline = tenant.create_timeline(None).unwrap();
    let (tenant_id, timeline_id) = (tenant.id(), timeline.timeline_id());
    let dir = workdir
        .path()
        .join(format!("tenants/{tenant_id}/timelines/{timeline_id}"));
    assert_eq!(timeline.dir(), dir);
    assert!(dir.join("metadata").is_file());

    timeline.put(rel_key(1), Lsn(10), &image(7)).unwrap();
    mgr.shutdown().unwrap();
    assert_eq!(timeline.disk_consistent_lsn(), Lsn(10));
    assert!(matches!(
        mgr.create_tenant(None),
        Err(TenantError::ShuttingDown)
    ));
    drop((timeline, tenant, mgr));

    let (mgr, report) =
        TenantManager::load(workdir.path(), small_cache(128), TimelineConf::default()).unwrap();
    assert_eq!(
        report,
        LoadReport {
            tenants: 1,
            broken_tenants: 0,
            timelines: 1,
            delta_layers: 1,
        }
    );
    let timeline = mgr.get_timeline(tenant_id, timeline_id).unwrap();
    assert_eq!(timeline.last_record_lsn(), Lsn(10));
    let page = timeline.get_page(rel_key(1), Lsn(10)).unwrap().unwrap();
    assert_eq!(page[0], 7);
}

#[test]
fn ids_can_be_chosen_and_are_not_reused_while_they_exist() {
    let workdir = tempfile::tempdir().unwrap();
    let mgr = load(workdir.path(), TimelineConf::default());
    let tenant_id: TenantId = "0123456789abcdef0123456789abcdef".parse().unwrap();
    let timeline_id: TimelineId = "fedcba9876543210fedcba9876543210".parse().unwrap();
    let tenant = mgr.create_tenant(Some(tenant_id)).unwrap();
    assert!(matches!(
        mgr.create_tenant(Some(tenant_id)),
        Err(TenantError::TenantExists(id)) if id == tenant_id
    ));
    tenant.create_timeline(Some(timeline_id)).unwrap();
    assert!(matches!(
        tenant.create_timeline(Some(timeline_id)),
        Err(TenantError::TimelineExists { .. })
    ));
    let other: TenantId = "00000000000000000000000000000001".parse().unwrap();
    assert!(matches!(
        mgr.get_tenant(other),
        Err(TenantError::TenantNotFound(id)) if id == other
    ));
    assert!(matches!(
        mgr.get_timeline(tenant_id, TimelineId::from_bytes([9; 16])),
        Err(TenantError::TimelineNotFound { .. })
    ));
    assert_eq!(mgr.list_tenants().len(), 1);
    assert_eq!(tenant.list_timelines().len(), 1);
}

#[test]
fn deletion_removes_the_data_and_the_id_can_be_created_again() {
    let workdir = tempfile::tempdir().unwrap();
    let mgr = load(workdir.path(), TimelineConf::default());
    let tenant = mgr.create_tenant(None).unwrap();
    let timeline = tenant.create_timeline(None).unwrap();
    timeline.put(rel_key(1), Lsn(10), &image(1)).unwrap();
    timeline.checkpoint().unwrap();
    let timeline_id = timeline.timeline_id();
    let dir = timeline.dir().to_owned();

    tenant.delete_timeline(timeline_id).unwrap();
    assert!(!dir.exists());
    assert!(matches!(
        timeline.put(rel_key(1), Lsn(11), &image(1)),
        Err(TimelineError::ShuttingDown)
    ));
    assert!(matches!(
        tenant.get_timeline(timeline_id),
        Err(TenantError::TimelineNotFound { .. })
    ));
    let again = tenant.create_timeline(Some(timeline_id)).unwrap();
    assert_eq!(again.disk_consistent_lsn(), Lsn::INVALID);
    assert_eq!(again.get_page(rel_key(1), Lsn::INVALID).unwrap(), None);

    let tenant_dir = workdir
        .path()
        .join(TENANTS_DIR)
        .join(tenant.id().to_string());
    mgr.delete_tenant(tenant.id()).unwrap();
    assert!(!tenant_dir.exists());
    assert!(mgr.list_tenants().is_empty());
    assert!(matches!(
        mgr.delete_tenant(tenant.id()),
        Err(TenantError::TenantNotFound(_))
    ));
}

#[test]
fn a_deleted_tenant_held_by_a_request_takes_no_timelines() {
    let workdir = tempfile::tempdir().unwrap();
    let mgr = load(workdir.path(), TimelineConf::default());
    // A request that looked the tenant up before its deletion still holds it.
    let tenant = mgr.create_tenant(None).unwrap();
    let timeline = tenant.create_timeline(None).unwrap();
    mgr.delete_tenant(tenant.id()).unwrap();
    assert!(matches!(
        tenant.create_timeline(None),
        Err(TenantError::TenantNotFound(id)) if id == tenant.id()
    ));
    assert!(matches!(
        tenant.delete_timeline(timeline.timeline_id()),
        Err(TenantError::TimelineNotFound { .. })
    ));
    assert!(!workdir
        .path()
        .join(TENANTS_DIR)
        .join(tenant.id().to_string())
        .exists());
    assert!(std::fs::read_dir(workdir.path().join(TENANTS_DIR))
        .unwrap()
        .next()
        .is_none());
}

#[test]
fn an_id_being_deleted_cannot_be_created() {
    let workdir = tempfile::tempdir().unwrap();
    let mgr = load(workdir.path(), TimelineConf::default());
    let tenant = mgr.create_tenant(None).unwrap();
    let timeline = tenant.create_timeline(None).unwrap();
    let timeline_id = timeline.timeline_id();
    // Deletions in progress, as they stand between taking the id out of the map and removing
    // its directory.
    lock(&tenant.dirs)
        .removing
        .insert(timeline_id, timeline.clone());
    tenant.timelines.write().unwrap().remove(&timeline_id);
    assert!(matches!(
        tenant.create_timeline(Some(timeline_id)),
        Err(TenantError::TimelineBeingDeleted { .. })
    ));
    lock(&mgr.tenant_dirs).insert(tenant.id());
    mgr.tenants.write().unwrap().remove(&tenant.id());
    assert!(matches!(
        mgr.create_tenant(Some(tenant.id())),
        Err(TenantError::TenantBeingDeleted(id)) if id == tenant.id()
    ));
}

#[test]
fn startup_removes_leftovers_of_interrupted_creates_and_deletes_and_keeps_strangers() {
    let workdir = tempfile::tempdir().unwrap();
    let (tenant_id, timeline_id) = {
        let mgr = load(workdir.path(), TimelineConf::default());
        let tenant = mgr.create_tenant(None).unwrap();
        let timeline = tenant.create_timeline(None).unwrap();
        (tenant.id(), timeline.timeline_id())
    };
    let tenants = workdir.path().join(TENANTS_DIR);
    let timelines = tenants.join(tenant_id.to_string()).join(TIMELINES_DIR);
    let leftovers = [
        tenants.join("0123456789abcdef0123456789abcdef.___temp"),
        tenants.join("1123456789abcdef0123456789abcdef.___deleted"),
        timelines.join("2123456789abcdef0123456789abcdef.___temp"),
        timelines.join("3123456789abcdef0123456789abcdef.___deleted"),
    ];
    for dir in &leftovers {
        std::fs::create_dir_all(dir.join(TIMELINES_DIR)).unwrap();
        std::fs::write(dir.join("metadata"), b"half written").unwrap();
    }
    std::fs::write(tenants.join("README"), b"an operator's note").unwrap();

    let (mgr, report) =
        TenantManager::load(workdir.path(), small_cache(128), TimelineConf::default()).unwrap();
    assert_eq!((report.tenants, report.timelines), (1, 1));
    for dir in &leftovers {
        assert!(!dir.exists(), "{} survived startup", dir.display());
    }
    assert!(tenants.join("README").exists(), "not ours to delete");
    mgr.get_timeline(tenant_id, timeline_id).unwrap();
}

#[test]
fn a_timeline_that_fails_to_load_breaks_only_its_tenant() {
    let workdir = tempfile::tempdir().unwrap();
    let (bad, good, layer) = {
        let mgr = load(workdir.path(), TimelineConf::default());
        let mut ids = Vec::new();
        for _ in 0..2 {
            let tenant = mgr.create_tenant(None).unwrap();
            let timeline = tenant.create_timeline(None).unwrap();
            timeline.put(rel_key(1), Lsn(10), &image(1)).unwrap();
            timeline.checkpoint().unwrap();
            ids.push((tenant.id(), timeline.dir().to_owned()));
        }
        let layer = std::fs::read_dir(&ids[0].1)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.file_name().unwrap() != "metadata")
            .unwrap();
        (ids[0].0, ids[1].0, layer)
    };
    let mut bytes = std::fs::read(&layer).unwrap();
    bytes.truncate(100);
    std::fs::write(&layer, bytes).unwrap();

    let (mgr, report) =
        TenantManager::load(workdir.path(), small_cache(128), TimelineConf::default()).unwrap();
    assert_eq!((report.tenants, report.broken_tenants), (2, 1));
    let broken = mgr.get_tenant(bad).unwrap();
    let TenantState::Broken { reason } = broken.state() else {
        panic!("tenant {bad} should be broken");
    };
    let layer_name = layer.file_name().unwrap().to_str().unwrap();
    assert!(reason.contains(layer_name), "{reason}");
    let Err(err) = broken.create_timeline(None) else {
        panic!("a broken tenant must refuse new timelines");
    };
    assert!(matches!(err, TenantError::TenantBroken { .. }), "{err}");
    assert!(
        layer.exists(),
        "a broken tenant's files are evidence, not garbage"
    );

    let healthy = mgr.get_tenant(good).unwrap();
    assert_eq!(healthy.state(), &TenantState::Active);
    let timeline = &healthy.list_timelines()[0];
    assert_eq!(
        timeline.get_page(rel_key(1), Lsn(10)).unwrap().unwrap()[0],
        1
    );
}

#[test]
fn the_flush_loop_flushes_by_checkpoint_timeout() {
    let workdir = tempfile::tempdir().unwrap();
    let conf = TimelineConf {
        checkpoint_timeout: Duration::from_millis(50),
        ..TimelineConf::default()
    };
    let mgr = load(workdir.path(), conf);
    let timeline = new_timeline(&mgr);
    timeline.put(rel_key(1), Lsn(10), &image(1)).unwrap();
    eventually("the open layer is flushed by age", || {
        timeline.disk_consistent_lsn() == Lsn(10)
    });
    assert_eq!(timeline.layer_counts().deltas, 1);
    assert_eq!(timeline.layer_counts().open_values, 0);
}

#[test]
fn the_flush_loop_flushes_by_checkpoint_distance_while_ingest_continues() {
    let workdir = tempfile::tempdir().unwrap();
    let conf = TimelineConf {
        checkpoint_distance: 4 * PAGE_SZ as u64,
        // Never by age in this test, and no inline flushes: only the loop writes layers.
        checkpoint_timeout: Duration::from_secs(3600),
        max_frozen_layers: usize::MAX,
        // Every flushed layer stays an L0, to be counted.
        compaction_threshold: 0,
        ..TimelineConf::default()
    };
    let mgr = load(workdir.path(), conf);
    let timeline = new_timeline(&mgr);
    for lsn in 1..=40u64 {
        timeline
            .put(rel_key(lsn as u32 % 7), Lsn(lsn), &image(lsn as u8))
            .unwrap();
    }
    eventually("the loop flushed the frozen layers", || {
        timeline.layer_counts().frozen == 0
    });
    // Layers freeze at their fourth page: forty pages make ten layers, all flushed.
    assert_eq!(timeline.disk_consistent_lsn(), Lsn(40));
    assert_eq!(timeline.layer_counts().deltas, 10);
    for k in 0..7u32 {
        let newest = (1..=40u64).rev().find(|l| *l as u32 % 7 == k).unwrap();
        let page = timeline.get_page(rel_key(k), Lsn(40)).unwrap().unwrap();
        assert_eq!(page[0], newest as u8);
    }
}

#[test]
fn the_compaction_loop_merges_l0s_as_flushes_add_them() {
    let workdir = tempfile::tempdir().unwrap();
    let conf = TimelineConf {
        checkpoint_distance: 4 * PAGE_SZ as u64,
        checkpoint_timeout: Duration::from_secs(3600),
        compaction_threshold: 3,
        l0_slowdown_threshold: 5,
        l0_stop_threshold: 6,
        ..TimelineConf::default()
    };
    let mgr = load(workdir.path(), conf);
    let timeline = new_timeline(&mgr);
    let mut most_l0 = 0;
    for lsn in 1..=200u64 {
        timeline
            .put(rel_key(lsn as u32 % 7), Lsn(lsn), &image(lsn as u8))
            .unwrap();
        most_l0 = most_l0.max(timeline.layer_counts().l0);
    }
    // The bound: l0_stop_threshold + max_frozen_layers.
    assert!(most_l0 <= 6 + 2, "{most_l0} L0 layers at once");
    eventually("the loop compacted below the threshold", || {
        let counts = timeline.layer_counts();
        counts.frozen == 0 && counts.l0 < 3 && counts.l1 > 0
    });
    for k in 0..7u32 {
        let newest = (1..=200u64).rev().find(|l| *l as u32 % 7 == k).unwrap();
        let page = timeline.get_page(rel_key(k), Lsn(200)).unwrap().unwrap();
        assert_eq!(page[0], newest as u8);
    }
}

fn delta(offset: u32, byte: u8) -> Value {
    Value::Delta {
        will_init: false,
        patches: vec![pageserver_api::Patch::new(offset, vec![byte])],
    }
}

#[test]
fn a_branch_reads_its_ancestor_below_its_lsn_and_its_own_history_above_it() {
    let workdir = tempfile::tempdir().unwrap();
    let conf = TimelineConf {
        gc_horizon: 0,
        ..TimelineConf::default()
    };
    let mgr = load(workdir.path(), conf.clone());
    let tenant = mgr.create_tenant(None).unwrap();
    let main = tenant.create_timeline(None).unwrap();
    // rel_key(3) gets the same history as rel_key(1), and is read only after GC below: no
    // page of it is memorized in the cache.
    let record = |key, lsn, value: Value| crate::tenant::timeline::PutRecord {
        key,
        lsn: Lsn(lsn),
        value,
    };
    main.put_batch(&[
        record(rel_key(1), 0x10, image(1)),
        record(rel_key(3), 0x10, image(1)),
        record(rel_key(1), 0x20, delta(0, 2)),
        record(rel_key(3), 0x20, delta(0, 2)),
    ])
    .unwrap();
    main.put(rel_key(2), Lsn(0x30), &image(3)).unwrap();

    // At 0x20, before rel_key(2) exists and after the delta.
    let branch = tenant
        .create_branch(None, main.timeline_id(), Some(Lsn(0x20)))
        .unwrap();
    assert_eq!(branch.last_record_lsn(), Lsn(0x20));
    assert_eq!(
        main.disk_consistent_lsn(),
        Lsn(0x30),
        "the ancestor made durable first"
    );
    let expected_at_20 = {
        let mut page = vec![1u8; PAGE_SZ];
        page[0] = 2;
        page
    };
    assert_eq!(
        &branch.get_page(rel_key(1), Lsn(0x20)).unwrap().unwrap()[..],
        &expected_at_20[..]
    );
    assert_eq!(
        &branch.get_page(rel_key(1), Lsn(0x10)).unwrap().unwrap()[..],
        &[1u8; PAGE_SZ][..]
    );
    assert_eq!(
        branch.get_page(rel_key(2), Lsn(0x20)).unwrap(),
        None,
        "after the branch point"
    );

    // The branch's own deltas apply on top of the ancestor's page; the ancestor never sees them.
    branch.put(rel_key(1), Lsn(0x40), &delta(1, 9)).unwrap();
    let mut expected_at_40 = expected_at_20.clone();
    expected_at_40[1] = 9;
    assert_eq!(
        &branch.get_page(rel_key(1), Lsn(0x40)).unwrap().unwrap()[..],
        &expected_at_40[..]
    );
    assert_eq!(
        &main.get_page(rel_key(1), Lsn(0x30)).unwrap().unwrap()[..],
        &expected_at_20[..]
    );
    assert_eq!(branch.get_page(rel_key(2), Lsn(0x40)).unwrap(), None);

    // A timeline with branches is not deleted; a branch of a branch works too.
    let nested = tenant
        .create_branch(None, branch.timeline_id(), None)
        .unwrap();
    assert_eq!(
        &nested.get_page(rel_key(1), Lsn(0x40)).unwrap().unwrap()[..],
        &expected_at_40[..]
    );
    assert!(matches!(
        tenant.delete_timeline(main.timeline_id()),
        Err(TenantError::TimelineHasBranches { .. })
    ));
    assert!(matches!(
        tenant.create_branch(None, main.timeline_id(), Some(Lsn(0x31))),
        Err(TenantError::InvalidBranch { .. })
    ));
    // A scan of a branch sees the ancestor's keys as of the branch point, and its own.
    let mut cursor = ScanCursor::new(Key::MIN, Key::MAX, Lsn(0x40));
    let page = branch.scan_page(&mut cursor, 10).unwrap();
    let keys: Vec<Key> = page.entries.iter().map(|(k, _)| *k).collect();
    assert_eq!(keys, [rel_key(1), rel_key(3)]);
    assert_eq!(&page.entries[0].1[..], &expected_at_40[..]);

    // After a restart the links are back, whatever order the timelines load in.
    let ids = (
        tenant.id(),
        main.timeline_id(),
        branch.timeline_id(),
        nested.timeline_id(),
    );
    mgr.shutdown().unwrap();
    drop((main, branch, nested, tenant, mgr));
    let mgr = load(workdir.path(), conf);
    let tenant = mgr.get_tenant(ids.0).unwrap();
    let (main, branch, nested) = (
        tenant.get_timeline(ids.1).unwrap(),
        tenant.get_timeline(ids.2).unwrap(),
        tenant.get_timeline(ids.3).unwrap(),
    );
    assert_eq!(branch.ancestor().unwrap().1, Lsn(0x20));
    assert_eq!(
        &nested.get_page(rel_key(1), Lsn(0x40)).unwrap().unwrap()[..],
        &expected_at_40[..]
    );
    // GC of the ancestor keeps what the branch point needs, even past its cutoff.
    // (Two runs of L1s, the newer covered by images: the older one, with the branch point's
    // versions, is what GC would remove.)
    for lsn in [0x50, 0x60] {
        main.put(rel_key(1), Lsn(lsn), &image(5)).unwrap();
        main.checkpoint().unwrap();
        main.compact_l0(1).unwrap();
    }
    main.create_images(true).unwrap();
    let outcome = main.gc(&[]).unwrap();
    assert!(main.gc_cutoff_lsn() > Lsn(0x20), "{}", main.gc_cutoff_lsn());
    // (Without the branch point retained, GC removes the older L1 and the read below finds
    // nothing.)
    assert!(
        main.get_page(rel_key(3), Lsn(0x20)).is_err(),
        "below the cutoff: {outcome:?}"
    );
    assert_eq!(
        &branch.get_page(rel_key(3), Lsn(0x20)).unwrap().unwrap()[..],
        &expected_at_20[..]
    );
    // Deleting the branches, then the ancestor, works.
    tenant.delete_timeline(ids.3).unwrap();
    tenant.delete_timeline(ids.2).unwrap();
    assert!(main.branch_points().is_empty());
    tenant.delete_timeline(ids.1).unwrap();
}

/// Branching is constant time because nothing of the ancestor is copied: a branch of a timeline
/// with many layer files starts with the same files, of the same sizes, as a branch of a
/// timeline with one page, and with no layer of its own.
#[test]
fn a_branch_copies_nothing_of_its_ancestor() {
    let workdir = tempfile::tempdir().unwrap();
    // Pages stored as they are, so that the big timeline's files are big.
    let conf = TimelineConf {
        layer_compression: crate::format::compression::Compression::Off,
        ..TimelineConf::default()
    };
    let mgr = load(workdir.path(), conf);
    let tenant = mgr.create_tenant(None).unwrap();
    let small = tenant.create_timeline(None).unwrap();
    small.put(rel_key(1), Lsn(0x10), &image(1)).unwrap();
    let big = tenant.create_timeline(None).unwrap();
    for round in 1..=8u8 {
        let records: Vec<_> = (0..64)
            .map(|k| crate::tenant::timeline::PutRecord {
                key: rel_key(k),
                lsn: Lsn(u64::from(round) * 0x10),
                value: image(round),
            })
            .collect();
        big.put_batch(&records).unwrap();
        big.checkpoint().unwrap();
    }
    let big_layer_bytes: u64 = big.layers().iter().map(|l| l.size_bytes).sum();
    assert!(
        big_layer_bytes >= 8 * 64 * PAGE_SZ as u64,
        "{big_layer_bytes}"
    );
    // Every file under a timeline's directory, with its size.
    let files = |timeline: &Timeline| -> Vec<(String, u64)> {
        let mut files: Vec<(String, u64)> = std::fs::read_dir(timeline.dir())
            .unwrap()
            .map(|entry| {
                let entry = entry.unwrap();
                let name = entry.file_name().to_string_lossy().into_owned();
                (name, entry.metadata().unwrap().len())
            })
            .collect();
        files.sort();
        files
    };

    let of_small = tenant
        .create_branch(None, small.timeline_id(), None)
        .unwrap();
    let of_big = tenant.create_branch(None, big.timeline_id(), None).unwrap();
    assert_eq!(files(&of_big), files(&of_small));
    assert_eq!(
        of_big.layers(),
        Vec::new(),
        "a new branch has no layer of its own"
    );
    let branch_bytes: u64 = files(&of_big).iter().map(|(_, len)| len).sum();
    assert!(
        branch_bytes < PAGE_SZ as u64,
        "a branch wrote {branch_bytes} bytes: {:?}",
        files(&of_big)
    );
    // And it reads its ancestor's pages.
    assert_eq!(
        &of_big.get_page(rel_key(5), Lsn(0x80)).unwrap().unwrap()[..],
        &[8u8; PAGE_SZ][..]
    );
}

/// A branch whose ancestor's history ends below its branch point (an ancestor restored from an
/// older copy) would be answered at its branch point from whatever the ancestor ingests next:
/// the tenant loads as broken instead, naming both and the LSNs.
#[test]
fn a_branch_past_its_ancestors_history_breaks_the_tenant() {
    use crate::tenant::timeline::Ancestry;
    let workdir = tempfile::tempdir().unwrap();
    let (tenant_id, main_id, branch_dir) = {
        let mgr = load(workdir.path(), TimelineConf::default());
        let tenant = mgr.create_tenant(None).unwrap();
        let main = tenant.create_timeline(None).unwrap();
        main.put(rel_key(1), Lsn(0x10), &image(1)).unwrap();
        let branch = tenant
            .create_branch(None, main.timeline_id(), Some(Lsn(0x10)))
            .unwrap();
        let ids = (tenant.id(), main.timeline_id(), branch.dir().to_owned());
        mgr.shutdown().unwrap();
        ids
    };
    // The ancestor file as if the branch started above what the ancestor holds.
    std::fs::remove_file(branch_dir.join(crate::tenant::timeline::ANCESTOR_FILE)).unwrap();
    Ancestry {
        timeline_id: main_id,
        lsn: Lsn(0x30),
    }
    .write(&branch_dir)
    .unwrap();
    let (mgr, report) =
        TenantManager::load(workdir.path(), small_cache(128), TimelineConf::default()).unwrap();
    assert_eq!(report.broken_tenants, 1);
    let TenantState::Broken { reason } = mgr.get_tenant(tenant_id).unwrap().state().clone() else {
        panic!("the tenant should be broken");
    };
    assert!(
        reason.contains("below the branch point 0/30") && reason.contains("0/10"),
        "{reason}"
    );
}
