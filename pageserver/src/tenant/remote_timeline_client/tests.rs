//! The upload queue against a real directory store, through the tenant manager: layers and
//! the index land in the documented layout, in order, with the generation in every name;
//! compaction's retired layers are deleted once an index without them is durable; a restart
//! resumes from the remote index; a stale generation deletes nothing of a newer one.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use pageserver_api::Value;
use remote_storage::{RemoteStorage, RemoteStorageConfig};
use utils::{Generation, Lsn};

use super::index::{classify_object, IndexPart, RemoteObject};
use super::RemoteContext;
use crate::tenant::mgr::TenantManager;
use crate::tenant::test_support::*;
use crate::tenant::timeline::{PutRecord, TimelineConf};
use crate::PAGE_SZ;

fn context(remote: &Path, failures: u32) -> Arc<RemoteContext> {
    let storage = RemoteStorage::new(&RemoteStorageConfig::local_dir(remote.to_owned()))
        .unwrap()
        .with_injected_failures(failures)
        .with_retry_policy(remote_storage::RetryPolicy {
            initial: Duration::from_millis(1),
            max_backoff: Duration::from_millis(5),
            timeout: Duration::from_secs(10),
        });
    Arc::new(RemoteContext::new(storage, 1 << 30, 0).unwrap())
}

/// The tenants of `workdir`, uploading to the directory `remote`.
fn load(
    workdir: &Path,
    remote: &Path,
    failures: u32,
) -> (TenantManager, crate::tenant::mgr::LoadReport) {
    TenantManager::load_with_remote(
        workdir,
        small_cache(256),
        conf(),
        Some(context(remote, failures)),
    )
    .unwrap()
}

fn conf() -> TimelineConf {
    TimelineConf {
        compaction_threshold: 0,
        ..TimelineConf::default()
    }
}

fn put_images(timeline: &crate::tenant::timeline::Timeline, lsn: u64, keys: u32) {
    let batch: Vec<PutRecord> = (0..keys)
        .map(|k| PutRecord {
            key: rel_key(k),
            lsn: Lsn(lsn),
            value: Value::Image(Bytes::from(vec![(lsn % 251) as u8; PAGE_SZ])),
        })
        .collect();
    timeline.put_batch(&batch).unwrap();
}

/// Every object under the remote directory, relative to it.
fn objects(remote: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut dirs = vec![remote.to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                found.push(path.strip_prefix(remote).unwrap().display().to_string());
            }
        }
    }
    found.sort();
    found
}

fn newest_index(remote: &Path) -> IndexPart {
    let index = objects(remote)
        .into_iter()
        .filter(|o| o.contains("index_part.json-"))
        .max()
        .expect("an index");
    IndexPart::parse(&std::fs::read(remote.join(index)).unwrap()).unwrap()
}

#[test]
fn layers_then_index_then_deletions_in_the_documented_layout() {
    let dir = tempfile::tempdir().unwrap();
    let (workdir, remote) = (dir.path().join("work"), dir.path().join("remote"));
    let (mgr, _) = load(&workdir, &remote, 2);
    let tenant = mgr.create_tenant(None).unwrap();
    let timeline = tenant.create_timeline(None).unwrap();
    let client = tenant.remote_client(timeline.timeline_id()).unwrap();
    for lsn in [0x10, 0x20, 0x30] {
        put_images(&timeline, lsn, 8);
        timeline.checkpoint().unwrap();
    }
    assert!(
        client.wait_settled(Duration::from_secs(20)),
        "{:?}",
        client.last_error()
    );
    assert_eq!(timeline.remote_consistent_lsn(), Some(Lsn(0x30)));
    let prefix = format!(
        "tenants/{}/timelines/{}/",
        tenant.id(),
        timeline.timeline_id()
    );
    let index = newest_index(&remote);
    assert_eq!(index.generation, Generation::FIRST);
    assert_eq!(index.disk_consistent_lsn, Lsn(0x30));
    let manifest = timeline.manifest_snapshot();
    assert_eq!(index.to_manifest().layers, manifest.layers);
    // Exactly the index and its layers, each named with its generation, each a byte copy.
    let mut expected: Vec<String> = manifest
        .layers
        .iter()
        .map(|l| format!("{prefix}{}-00000001", l.name))
        .collect();
    expected.push(format!("{prefix}index_part.json-00000001"));
    expected.sort();
    assert_eq!(objects(&remote), expected);
    for l in &manifest.layers {
        let local = std::fs::read(timeline.dir().join(&l.name)).unwrap();
        let copy = std::fs::read(remote.join(format!("{prefix}{}-00000001", l.name))).unwrap();
        assert!(local == copy, "{}", l.name);
        assert_eq!(utils::crc32c::crc32c(&copy), l.crc32c);
    }

    // Compaction retires the three L0s: their objects go once the new index is durable.
    timeline.compact_l0(2).unwrap();
    assert!(
        client.wait_settled(Duration::from_secs(20)),
        "{:?}",
        client.last_error()
    );
    let index = newest_index(&remote);
    assert!(index
        .layers
        .values()
        .all(|l| l.level != crate::tenant::timeline::layer_set::manifest::LayerLevel::L0));
    let remote_layers = objects(&remote)
        .into_iter()
        .filter(|o| !o.contains("index_part"))
        .count();
    assert_eq!(remote_layers, index.layers.len());
    mgr.shutdown().unwrap();
}

#[test]
fn a_restart_resumes_uploads_from_the_remote_index() {
    let dir = tempfile::tempdir().unwrap();
    let (workdir, remote) = (dir.path().join("work"), dir.path().join("remote"));
    let (tenant_id, timeline_id) = {
        // No remote storage in the first run: the layers exist only locally.
        let (mgr, _) = TenantManager::load(&workdir, small_cache(256), conf()).unwrap();
        let timeline = mgr
            .create_tenant(None)
            .unwrap()
            .create_timeline(None)
            .unwrap();
        put_images(&timeline, 0x10, 4);
        timeline.checkpoint().unwrap();
        mgr.shutdown().unwrap();
        (timeline.tenant_id(), timeline.timeline_id())
    };
    let (mgr, _) = load(&workdir, &remote, 0);
    let tenant = mgr.get_tenant(tenant_id).unwrap();
    let timeline = tenant.get_timeline(timeline_id).unwrap();
    let client = tenant.remote_client(timeline_id).unwrap();
    assert!(client.wait_settled(Duration::from_secs(20)));
    assert_eq!(timeline.remote_consistent_lsn(), Some(Lsn(0x10)));
    put_images(&timeline, 0x20, 4);
    // Shutdown drains the queue.
    mgr.shutdown().unwrap();
    assert_eq!(newest_index(&remote).disk_consistent_lsn, Lsn(0x20));

    // A start finds remote_consistent_lsn in the index before uploading anything.
    let (mgr, _) = load(&workdir, &remote, 0);
    let timeline = mgr.get_timeline(tenant_id, timeline_id).unwrap();
    assert_eq!(timeline.remote_consistent_lsn(), Some(Lsn(0x20)));
    mgr.shutdown().unwrap();
}

#[test]
fn a_local_disk_behind_the_remote_index_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (workdir, remote) = (dir.path().join("work"), dir.path().join("remote"));
    let backup = dir.path().join("backup");
    let (tenant_id, timeline_id) = {
        let (mgr, _) = load(&workdir, &remote, 0);
        let timeline = mgr
            .create_tenant(None)
            .unwrap()
            .create_timeline(None)
            .unwrap();
        put_images(&timeline, 0x10, 4);
        timeline.checkpoint().unwrap();
        let ids = (timeline.tenant_id(), timeline.timeline_id());
        // An old copy of the work directory...
        copy_dir(&workdir, &backup);
        put_images(&timeline, 0x20, 4);
        mgr.shutdown().unwrap();
        ids
    };
    // ...brought back: it would take the store back to 0/10, so the tenant is refused.
    let (mgr, report) = load(&backup, &remote, 0);
    assert_eq!(report.broken_tenants, 1);
    let e = mgr
        .get_timeline(tenant_id, timeline_id)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("ahead of the local disk"), "{e}");
    assert_eq!(newest_index(&remote).disk_consistent_lsn, Lsn(0x20));
}

#[test]
fn object_names_classify_back() {
    assert_eq!(
        classify_object("index_part.json-00000003"),
        RemoteObject::Index(Generation::new(3).unwrap())
    );
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else if entry.file_name() != "pageserver.pid" {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn a_stale_generation_deletes_nothing_a_newer_one_lists() {
    let dir = tempfile::tempdir().unwrap();
    let remote = dir.path().join("remote");
    let (old_dir, new_dir) = (dir.path().join("old"), dir.path().join("new"));
    let (old, _) = load(&old_dir, &remote, 0);
    let tenant = old.create_tenant(None).unwrap();
    let timeline = tenant.create_timeline(None).unwrap();
    for lsn in [0x10, 0x20] {
        put_images(&timeline, lsn, 4);
        timeline.checkpoint().unwrap();
    }
    let old_client = tenant.remote_client(timeline.timeline_id()).unwrap();
    assert!(old_client.wait_settled(Duration::from_secs(20)));

    // The same tenant, attached elsewhere at generation 2 (here: a copy of the disk).
    copy_dir(&old_dir, &new_dir);
    std::fs::write(
        new_dir.join(format!("tenants/{}/generation", tenant.id())),
        "00000002\n",
    )
    .unwrap();
    let (new, _) = load(&new_dir, &remote, 0);
    let new_tenant = new.get_tenant(tenant.id()).unwrap();
    assert_eq!(new_tenant.generation(), Generation::new(2).unwrap());
    let new_client = new_tenant.remote_client(timeline.timeline_id()).unwrap();
    assert!(new_client.wait_settled(Duration::from_secs(20)));
    let newest = newest_index(&remote);
    assert_eq!(newest.generation.get(), 2);
    // It lists generation 1's objects: nothing was uploaded again.
    assert!(newest
        .layers
        .values()
        .all(|l| l.generation == Generation::FIRST));

    // The stale attachment compacts: its next deletion finds generation 2's index and stops.
    timeline.compact_l0(2).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !old_client.is_fenced() {
        assert!(std::time::Instant::now() < deadline, "never fenced");
        std::thread::sleep(Duration::from_millis(5));
    }
    let after = objects(&remote);
    let prefix = format!(
        "tenants/{}/timelines/{}/",
        tenant.id(),
        timeline.timeline_id()
    );
    for (name, layer) in &newest.layers {
        let key = format!("{prefix}{name}-{}", layer.generation);
        assert!(
            after.contains(&key),
            "generation 2's index lists {key}, deleted by the stale one"
        );
    }
    old.shutdown().unwrap();
    new.shutdown().unwrap();
}

/// A branch's index waits for its ancestor's: while the ancestor's history in the store ends
/// below the branch point, the branch has no index there (an attach would find nothing of it,
/// rather than a branch whose base is missing); once the ancestor's index reaches the branch
/// point, the branch's follows.
#[test]
fn a_branch_index_waits_for_the_ancestor_to_reach_the_branch_point() {
    use super::RemoteTimelineClient;
    use crate::tenant::timeline::layer_set::manifest::Manifest;
    use crate::tenant::timeline::{Ancestry, RemoteCopy};
    use utils::{TenantId, TimelineId};

    let (local, remote) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let context = context(remote.path(), 0);
    let tenant = TenantId::from_bytes([7; 16]);
    let (main_id, branch_id) = (
        TimelineId::from_bytes([1; 16]),
        TimelineId::from_bytes([2; 16]),
    );
    let (main_dir, branch_dir) = (local.path().join("main"), local.path().join("branch"));
    std::fs::create_dir(&main_dir).unwrap();
    std::fs::create_dir(&branch_dir).unwrap();
    Ancestry {
        timeline_id: main_id,
        lsn: Lsn(0x20),
    }
    .write(&branch_dir)
    .unwrap();
    let start = |id, dir: &Path| {
        RemoteTimelineClient::start(context.clone(), tenant, id, Generation::FIRST, dir)
            .unwrap()
            .0
    };
    let (main, branch) = (start(main_id, &main_dir), start(branch_id, &branch_dir));
    branch.follow_ancestor(main.clone());
    let manifest = |id, lsn| {
        let mut manifest = Manifest::empty(tenant, id);
        manifest.disk_consistent_lsn = Lsn(lsn);
        manifest
    };
    let index_of = |id: TimelineId| {
        let prefix = format!("tenants/{tenant}/timelines/{id}/index_part.json-");
        objects(remote.path())
            .into_iter()
            .any(|o| o.starts_with(&prefix))
    };
    let wait_for = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !done() {
            assert!(std::time::Instant::now() < deadline, "never: {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    };

    // The ancestor's store holds history up to 0x10 only.
    main.manifest_committed(&manifest(main_id, 0x10));
    wait_for("the ancestor's index at 0x10", &|| {
        main.remote_consistent_lsn() == Lsn(0x10)
    });
    branch.manifest_committed(&manifest(branch_id, 0x30));
    wait_for("the branch's index held back", &|| {
        branch.index_uploads_held_for_ancestor() > 0
    });
    assert!(!index_of(branch_id), "{:?}", objects(remote.path()));
    assert_eq!(branch.remote_consistent_lsn(), Lsn(0));

    // The ancestor reaches the branch point: the branch's index follows.
    main.manifest_committed(&manifest(main_id, 0x20));
    wait_for("the branch's index", &|| {
        branch.remote_consistent_lsn() == Lsn(0x30)
    });
    assert!(index_of(branch_id));
    assert!(main.remote_consistent_lsn() >= Lsn(0x20));
    branch.stop(true);
    main.stop(true);
}

/// A directory store whose operations give up after 50 ms of retries.
fn failing_fast(remote: &Path) -> RemoteStorage {
    RemoteStorage::new(&RemoteStorageConfig::local_dir(remote.to_owned()))
        .unwrap()
        .with_retry_policy(remote_storage::RetryPolicy {
            initial: Duration::from_millis(1),
            max_backoff: Duration::from_millis(5),
            timeout: Duration::from_millis(50),
        })
}

/// Takes the store at `remote` away: a file where its directory was fails every operation.
/// Returns where the directory went.
fn take_away(remote: &Path) -> std::path::PathBuf {
    let away = remote.with_extension("away");
    std::fs::rename(remote, &away).unwrap();
    std::fs::write(remote, b"not a directory").unwrap();
    away
}

/// Undoes [`take_away`].
fn bring_back(remote: &Path, away: &Path) {
    std::fs::remove_file(remote).unwrap();
    std::fs::rename(away, remote).unwrap();
}

/// A new timeline in `workdir` uploading through `context`, with layers of 16 pages and
/// `max_frozen_layers`; the manager, which must outlive the timeline, comes back too.
fn small_layers(
    workdir: &Path,
    context: Arc<RemoteContext>,
    max_frozen_layers: usize,
) -> (
    TenantManager,
    Arc<crate::tenant::timeline::Timeline>,
    Arc<super::RemoteTimelineClient>,
) {
    let conf = TimelineConf {
        max_frozen_layers,
        checkpoint_distance: 16 * PAGE_SZ as u64,
        ..conf()
    };
    let (mgr, _) =
        TenantManager::load_with_remote(workdir, small_cache(256), conf, Some(context)).unwrap();
    let tenant = mgr.create_tenant(None).unwrap();
    let timeline = tenant.create_timeline(None).unwrap();
    let client = tenant.remote_client(timeline.timeline_id()).unwrap();
    (mgr, timeline, client)
}

#[test]
fn a_store_that_takes_nothing_fails_flushes_and_batches_after_the_wait() {
    let dir = tempfile::tempdir().unwrap();
    let (workdir, remote) = (dir.path().join("work"), dir.path().join("remote"));
    let storage = failing_fast(&remote);
    let wait = Duration::from_millis(300);
    let context = Arc::new(
        RemoteContext::new(storage, 1, 0)
            .unwrap()
            .with_upload_room_timeout(wait),
    );
    // Layers of 16 pages: the 8-page puts below fill none.
    let (_mgr, timeline, client) = small_layers(&workdir, context, 1);
    assert!(client.wait_settled(Duration::from_secs(20)));

    // The store goes down: a file where its directory was fails every operation.
    let away = take_away(&remote);
    // The first layer goes into the queue, which is then over its bound of one byte.
    put_images(&timeline, 0x10, 8);
    timeline.checkpoint().unwrap();
    put_images(&timeline, 0x20, 8);
    let started = std::time::Instant::now();
    let e = timeline.checkpoint().unwrap_err();
    let waited = started.elapsed();
    assert!(
        matches!(
            e,
            crate::tenant::timeline::TimelineError::UploadQueueFull { .. }
        ),
        "{e}"
    );
    assert!(waited >= wait && waited < wait * 10, "{waited:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("over upload_queue_max_bytes 1") && msg.contains("the last upload error"),
        "{msg}"
    );
    // The frozen layers are at their bound. A batch that leaves the open layer short of
    // checkpoint_distance freezes and flushes nothing: it is stored.
    let batch = |lsn, pages: u32| -> Vec<PutRecord> {
        (0..pages)
            .map(|k| PutRecord {
                key: rel_key(k),
                lsn: Lsn(lsn),
                value: Value::Image(Bytes::from(vec![3u8; PAGE_SZ])),
            })
            .collect()
    };
    timeline.put_batch(&batch(0x30, 1)).unwrap();
    // A batch that would fill it could have to flush: it is refused the same way, and stores
    // nothing.
    let last = timeline.last_record_lsn();
    assert_eq!(last, Lsn(0x30));
    let e = timeline.put_batch(&batch(0x40, 16)).unwrap_err();
    assert!(
        matches!(
            e,
            crate::tenant::timeline::TimelineError::UploadQueueFull { .. }
        ),
        "{e}"
    );
    assert_eq!(timeline.last_record_lsn(), last);

    // The store is back: the queue drains, and the same batch goes through.
    bring_back(&remote, &away);
    assert!(
        client.wait_settled(Duration::from_secs(20)),
        "{:?}",
        client.last_error()
    );
    timeline.checkpoint().unwrap();
    timeline.put_batch(&batch(0x40, 16)).unwrap();
    timeline.checkpoint().unwrap();
    assert!(
        client.wait_settled(Duration::from_secs(20)),
        "{:?}",
        client.last_error()
    );
    assert_eq!(timeline.remote_consistent_lsn(), Some(Lsn(0x40)));
    timeline.shutdown(false).unwrap();
}

#[test]
fn an_upload_queue_over_its_bound_paces_batches_before_the_frozen_layers_reach_theirs() {
    use crate::tenant::timeline::RemoteCopy;
    let dir = tempfile::tempdir().unwrap();
    let (workdir, remote) = (dir.path().join("work"), dir.path().join("remote"));
    let storage = failing_fast(&remote);
    // Any layer waiting for upload puts the queue over its bound of one byte.
    let context = Arc::new(RemoteContext::new(storage, 1, 0).unwrap());
    // Layers of 16 pages, two may wait frozen: no batch below reaches that bound.
    let (_mgr, timeline, client) = small_layers(&workdir, context, 2);
    let one_page = |lsn| {
        vec![PutRecord {
            key: rel_key(0),
            lsn: Lsn(lsn),
            value: Value::Image(Bytes::from(vec![7u8; PAGE_SZ])),
        }]
    };
    // A layer uploads: the rate is timed, and the queue is empty again. Nothing is held.
    put_images(&timeline, 0x10, 8);
    timeline.checkpoint().unwrap();
    assert!(client.wait_settled(Duration::from_secs(20)));
    assert_eq!(client.upload_backlog(), Duration::ZERO);
    assert_eq!(
        timeline.put_batch_paced(&one_page(0x18)).unwrap(),
        Duration::ZERO
    );

    // The store goes away with a layer in the queue: the queue is over its bound, and how long
    // it needs to drain at the timed rate is spread over the batches stored meanwhile, though
    // no layer is frozen.
    let away = take_away(&remote);
    put_images(&timeline, 0x20, 8);
    timeline.checkpoint().unwrap();
    assert_eq!(timeline.layer_counts().frozen, 0);
    let backlog = client.upload_backlog();
    assert!(backlog > Duration::ZERO);
    let held = timeline.put_batch_paced(&one_page(0x28)).unwrap();
    // The page's part of the room left: two free frozen slots and the open layer's, 32 to 48
    // pages (the page and its framing: a little more than one).
    assert!(
        held >= backlog / 48 && held <= backlog / 30,
        "{held:?} of {backlog:?}"
    );
    // Plain put_batch (the WAL receiver's) is not held.
    timeline.put_batch(&one_page(0x29)).unwrap();

    // The store is back: the queue drains, and batches go unheld again.
    bring_back(&remote, &away);
    assert!(
        client.wait_settled(Duration::from_secs(20)),
        "{:?}",
        client.last_error()
    );
    assert_eq!(client.upload_backlog(), Duration::ZERO);
    assert_eq!(
        timeline.put_batch_paced(&one_page(0x30)).unwrap(),
        Duration::ZERO
    );
    timeline.shutdown(false).unwrap();
}
