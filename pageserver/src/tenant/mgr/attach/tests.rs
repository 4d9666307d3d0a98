//! Attach, detach, on-demand downloads and eviction, through the tenant manager against a real
//! directory store: every answer after a move is the answer before it.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use pageserver_api::Value;
use remote_storage::{RemoteStorage, RemoteStorageConfig};
use utils::{Generation, Lsn, TenantId};

use crate::io::read_cost::measure;
use crate::tenant::mgr::{TenantError, TenantManager};
use crate::tenant::remote_timeline_client::RemoteContext;
use crate::tenant::tasks::eviction;
use crate::tenant::test_support::*;
use crate::tenant::timeline::{PutRecord, Timeline, TimelineConf};
use crate::PAGE_SZ;

const KEYS: u32 = 24;
const LSNS: [u64; 4] = [0x10, 0x20, 0x30, 0x40];

fn load(workdir: &Path, remote: &Path, budget: u64) -> TenantManager {
    let storage = RemoteStorage::new(&RemoteStorageConfig::local_dir(remote.to_owned())).unwrap();
    let context = Arc::new(RemoteContext::new(storage, 1 << 30, budget).unwrap());
    let conf = TimelineConf {
        compaction_threshold: 0,
        // Several L1 and image layers of the tests' pages, stored as they are (compressed,
        // a page of one repeated byte takes a few bytes, and one layer holds them all).
        compaction_target_size: 64 * 1024,
        layer_compression: crate::format::compression::Compression::Off,
        ..TimelineConf::default()
    };
    TenantManager::load_with_remote(workdir, small_cache(512), conf, Some(context))
        .unwrap()
        .0
}

fn page(key: u32, lsn: u64) -> Bytes {
    Bytes::from(vec![(key as u64 * 7 + lsn) as u8; PAGE_SZ])
}

/// A timeline with L1 and image layers below and an L0 on top: four versions of every key.
fn populate(timeline: &Timeline) {
    for (i, lsn) in LSNS.into_iter().enumerate() {
        let batch: Vec<PutRecord> = (0..KEYS)
            .map(|k| PutRecord {
                key: rel_key(k),
                lsn: Lsn(lsn),
                value: Value::Image(page(k, lsn)),
            })
            .collect();
        timeline.put_batch(&batch).unwrap();
        timeline.checkpoint().unwrap();
        if i == 2 {
            timeline.compact_l0(2).unwrap();
            timeline.create_images(true).unwrap();
        }
    }
}

fn check_every_page(timeline: &Timeline) {
    for k in 0..KEYS {
        for lsn in LSNS {
            assert_eq!(
                timeline.get_page(rel_key(k), Lsn(lsn)).unwrap(),
                Some(page(k, lsn)),
                "key {k} at {lsn:#x}"
            );
        }
    }
}

fn settle(mgr: &TenantManager, tenant: TenantId) {
    let tenant = mgr.get_tenant(tenant).unwrap();
    for timeline in tenant.list_timelines() {
        let client = tenant.remote_client(timeline.timeline_id()).unwrap();
        assert!(
            client.wait_settled(Duration::from_secs(20)),
            "{:?}",
            client.last_error()
        );
    }
}

/// A server in `<dir>/a` storing into `<dir>/remote`, with one tenant and one timeline
/// [populated](populate).
fn populated_server(
    dir: &Path,
) -> (
    TenantManager,
    Arc<crate::tenant::mgr::Tenant>,
    Arc<Timeline>,
) {
    let mgr = load(&dir.join("a"), &dir.join("remote"), 0);
    let tenant = mgr.create_tenant(None).unwrap();
    let timeline = tenant.create_timeline(None).unwrap();
    populate(&timeline);
    (mgr, tenant, timeline)
}

#[test]
fn a_tenant_moves_to_an_empty_disk_and_serves_the_same_pages() {
    let dir = tempfile::tempdir().unwrap();
    let remote = dir.path().join("remote");
    let (first, tenant, timeline) = populated_server(dir.path());
    let counts = timeline.layer_counts();
    assert!(
        counts.l1 > 0 && counts.images > 0 && counts.l0 == 1,
        "{counts:?}"
    );
    let (tenant_id, timeline_id) = (tenant.id(), timeline.timeline_id());
    first.detach_tenant(tenant_id).unwrap();
    assert!(!dir.path().join(format!("a/tenants/{tenant_id}")).exists());
    assert!(matches!(
        first.get_tenant(tenant_id),
        Err(TenantError::TenantNotFound(_))
    ));

    // A second server with an empty disk attaches it at generation 2.
    let second = load(&dir.path().join("b"), &remote, 0);
    let one = Generation::FIRST;
    assert!(matches!(
        second.attach_tenant(tenant_id, one),
        Err(TenantError::GenerationNotNewer { .. })
    ));
    let moved = second
        .attach_tenant(tenant_id, Generation::new(2).unwrap())
        .unwrap();
    assert_eq!(moved.generation().get(), 2);
    let timeline = moved.get_timeline(timeline_id).unwrap();
    assert_eq!(timeline.disk_consistent_lsn(), Lsn(0x40));
    assert_eq!(timeline.layer_counts(), counts);
    check_every_page(&timeline);
    settle(&second, tenant_id);
    // The new generation's index is the newest; the old one is swept.
    let indexes: Vec<String> =
        std::fs::read_dir(remote.join(format!("tenants/{tenant_id}/timelines/{timeline_id}")))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with("index_part.json-"))
            .collect();
    assert_eq!(indexes, vec!["index_part.json-00000002".to_owned()]);
    assert!(matches!(
        second.attach_tenant(tenant_id, Generation::new(3).unwrap()),
        Err(TenantError::TenantExists(_))
    ));
    second.shutdown().unwrap();
    first.shutdown().unwrap();
}

#[test]
fn evicted_layers_download_once_for_concurrent_readers() {
    let dir = tempfile::tempdir().unwrap();
    let (mgr, tenant, timeline) = populated_server(dir.path());
    settle(&mgr, tenant.id());
    let resident = timeline.resident_layer_bytes();

    // A budget of one byte evicts every layer the store holds but the L0.
    let outcome = eviction::run_pass(std::slice::from_ref(&timeline), 1);
    assert!(outcome.layers_evicted > 0, "{outcome:?}");
    let evicted = timeline
        .layers()
        .into_iter()
        .filter(|l| !l.resident)
        .count();
    assert_eq!(evicted, outcome.layers_evicted);
    assert_eq!(
        timeline.resident_layer_bytes(),
        resident - outcome.bytes_evicted
    );

    // Eight readers of one page at the image's LSN: one download between them.
    let downloads: u32 = std::thread::scope(|s| {
        let readers: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(|| {
                    let (got, cost) = measure(|| timeline.get_page(rel_key(3), Lsn(0x30)));
                    assert_eq!(got.unwrap(), Some(page(3, 0x30)));
                    cost.downloads
                })
            })
            .collect();
        readers.into_iter().map(|r| r.join().unwrap()).sum()
    });
    assert_eq!(downloads, 1);
    check_every_page(&timeline);
    mgr.shutdown().unwrap();
}

#[test]
fn a_damaged_or_missing_local_layer_comes_back_from_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let remote = dir.path().join("remote");
    let workdir = dir.path().join("a");
    let (mgr, tenant, timeline) = populated_server(dir.path());
    settle(&mgr, tenant.id());
    let (tenant_id, timeline_id) = (tenant.id(), timeline.timeline_id());
    let manifest = timeline.manifest_snapshot();
    let tl_dir = timeline.dir().to_owned();
    mgr.shutdown().unwrap();
    drop((timeline, tenant, mgr));

    // Truncate one layer, remove another (an image), damage the L0.
    let [first, second, ..] = &manifest.layers[..] else {
        panic!("layers")
    };
    let l0 = manifest
        .layers
        .iter()
        .find(|l| l.level == crate::tenant::timeline::layer_set::manifest::LayerLevel::L0)
        .unwrap();
    let truncated = std::fs::OpenOptions::new()
        .write(true)
        .open(tl_dir.join(&first.name))
        .unwrap();
    truncated.set_len(first.size / 2).unwrap();
    std::fs::remove_file(tl_dir.join(&second.name)).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(tl_dir.join(&l0.name))
        .unwrap()
        .set_len(PAGE_SZ as u64)
        .unwrap();

    let mgr = load(&workdir, &remote, 0);
    let timeline = mgr.get_timeline(tenant_id, timeline_id).unwrap();
    // Downloaded again at the start: the damaged files; left for a read: the missing one.
    for entry in [first, l0] {
        assert_eq!(
            std::fs::metadata(tl_dir.join(&entry.name)).unwrap().len(),
            entry.size
        );
    }
    if second.level != crate::tenant::timeline::layer_set::manifest::LayerLevel::L0 {
        assert!(!tl_dir.join(&second.name).exists());
    }
    check_every_page(&timeline);
    mgr.shutdown().unwrap();
}

/// An index that lost a layer (any one: an L0 in the middle or on top, an L1, an image) leaves
/// the attached tenant broken, named by the gap, instead of serving reads that walk past the
/// hole (older versions as if they were the newest, or no page where there is one).
#[test]
fn an_index_that_lost_a_layer_attaches_broken() {
    let dir = tempfile::tempdir().unwrap();
    let remote = dir.path().join("remote");
    let (first, tenant, timeline) = populated_server(dir.path());
    let on_top: Vec<PutRecord> = (0..KEYS)
        .map(|k| PutRecord {
            key: rel_key(k),
            lsn: Lsn(0x50),
            value: Value::Image(page(k, 0x50)),
        })
        .collect();
    timeline.put_batch(&on_top).unwrap();
    timeline.checkpoint().unwrap();
    let (tenant_id, timeline_id) = (tenant.id(), timeline.timeline_id());
    let counts = timeline.layer_counts();
    assert!(
        counts.l0 == 2 && counts.l1 > 0 && counts.images > 0,
        "{counts:?}"
    );
    first.detach_tenant(tenant_id).unwrap();
    first.shutdown().unwrap();

    let prefix = remote.join(format!("tenants/{tenant_id}/timelines/{timeline_id}"));
    let index = |generation: u32| prefix.join(format!("index_part.json-{generation:08x}"));
    let whole: serde_json::Value =
        serde_json::from_slice(&std::fs::read(index(1)).unwrap()).unwrap();
    let names: Vec<String> = whole["layers"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert_eq!(names.len(), counts.l0 + counts.l1 + counts.images);
    for (i, lost) in names.iter().enumerate() {
        // The newest index, of a generation above every other, lists every layer but one.
        let generation = 2 * i as u32 + 2;
        let mut damaged = whole.clone();
        damaged["generation"] = generation.into();
        damaged["layers"].as_object_mut().unwrap().remove(lost);
        std::fs::write(index(generation), serde_json::to_vec(&damaged).unwrap()).unwrap();

        let second = load(&dir.path().join(format!("b{i}")), &remote, 0);
        let attached = second.attach_tenant(tenant_id, Generation::new(generation + 1).unwrap());
        let Err(TenantError::AttachedBroken { reason, .. }) = attached else {
            panic!("without {lost}: {:?}", attached.map(|t| t.state().clone()));
        };
        assert!(
            reason.contains(&timeline_id.to_string()) && reason.contains("a layer is missing"),
            "without {lost}: {reason}"
        );
        let tenant = second.get_tenant(tenant_id).unwrap();
        assert!(matches!(
            tenant.state(),
            crate::tenant::mgr::TenantState::Broken { .. }
        ));
        assert!(tenant.get_timeline(timeline_id).is_err());
        second.shutdown().unwrap();
        // Nothing acted on the index: the lost layer's object is still in the store (the
        // upload queue's sweep deletes every object the durable index does not list).
        assert!(
            prefix.join(format!("{lost}-00000001")).exists(),
            "without {lost}: its object was deleted"
        );
    }

    // The whole index, newest again, attaches and serves every page.
    let generation = 2 * names.len() as u32 + 2;
    let mut newest = whole.clone();
    newest["generation"] = generation.into();
    std::fs::write(index(generation), serde_json::to_vec(&newest).unwrap()).unwrap();
    let third = load(&dir.path().join("c"), &remote, 0);
    let tenant = third
        .attach_tenant(tenant_id, Generation::new(generation + 1).unwrap())
        .unwrap();
    check_every_page(&tenant.get_timeline(timeline_id).unwrap());
    third.shutdown().unwrap();
}
