//! `remote`: remote storage against plain file copies and against ingest without it, in one run,
//! through the library (a real `TenantManager`, real files, the local directory backend with
//! fsync). It prints a table; it has no criterion groups because each case is one long run
//! (seconds), not a loop of short ones.
//!
//! * **attach**: a tenant of `ATTACH_LAYERS` L1 layers (one compaction of two 128 MiB L0s at a
//!   small `compaction_target_size`) is detached from one manager and attached to another with
//!   an empty work directory. *Ready* is the attach call plus the first GetPage (which downloads
//!   the one layer it needs); *hydrated* is until the prefetch made every layer resident.
//!   Baseline, same run: a plain copy of the same objects into an empty directory, each file
//!   fsynced and the directory fsynced at the end (as every download is), one file at a time
//!   (as the prefetch goes).
//! * **ingest**: `INGEST_BYTES` of 8 KiB images, LSNs advancing by the bytes ingested, with
//!   the default settings but `checkpoint_distance` of `CHECKPOINT_DISTANCE`, compaction and
//!   image creation running; without remote storage (the baseline), with it uploading by hard
//!   link (`hard_links = true`) and copying (the default), each on a fresh work directory. With remote storage, `disk_consistent_lsn - remote_consistent_lsn` is
//!   sampled after every batch: its maximum is the upload lag.
//! * **download**: one L1 layer of about 256 MiB is evicted, then one GetPage that needs it
//!   downloads it. Baseline: a plain copy of the same object (with fsync). Then it is evicted
//!   again and eight threads read at once: the downloads they report add up to one.
//!
//! `cargo bench -p benches --bench remote` (about a minute and 1.5 GiB of temporary disk).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use benches::uncompressed;
use bytes::Bytes;
use pageserver::io::read_cost::measure;
use pageserver::page_cache::{PageCache, PageCacheConfig};
use pageserver::tenant::mgr::TenantManager;
use pageserver::tenant::remote_timeline_client::RemoteContext;
use pageserver::tenant::tasks::eviction;
use pageserver::tenant::timeline::{PutRecord, Timeline, TimelineConf};
use pageserver::PAGE_SZ;
use pageserver_api::{Key, Value};
use remote_storage::{RemoteStorage, RemoteStorageConfig};
use utils::{Generation, Lsn};

const MIB: u64 = 1 << 20;
const ATTACH_LAYERS: u64 = 1000;
const INGEST_BYTES: u64 = 2048 * MIB;
const CHECKPOINT_DISTANCE: u64 = 64 * MIB;
const DOWNLOAD_LAYER: u64 = 256 * MIB;
const BATCH: usize = 64;
const DOWNLOAD_ROUNDS: usize = 5;

fn key(n: u64) -> Key {
    Key::rel_block(1663, 5, 16384, 0, n as u32)
}

fn cache() -> Arc<PageCache> {
    Arc::new(
        PageCache::new(PageCacheConfig {
            capacity_bytes: 64 * MIB,
            ..PageCacheConfig::default()
        })
        .unwrap(),
    )
}

fn manager(workdir: &Path, remote: Option<&Path>, conf: TimelineConf) -> TenantManager {
    let remote = remote.map(RemoteStorageConfig::local_dir);
    manager_with_queue(workdir, remote, conf, 1 << 30)
}

/// A manager whose flushes wait while more than `queue` bytes wait for upload.
fn manager_with_queue(
    workdir: &Path,
    remote: Option<RemoteStorageConfig>,
    conf: TimelineConf,
    queue: u64,
) -> TenantManager {
    let context = remote.map(|config| {
        let storage = RemoteStorage::new(&config).unwrap();
        Arc::new(RemoteContext::new(storage, queue, 0).unwrap())
    });
    TenantManager::load_with_remote(workdir, cache(), conf, context)
        .unwrap()
        .0
}

/// Ingests `count` 8 KiB images of keys `first..first + count` (cycling over `keys`), one
/// batch at a time, LSNs advancing by 8 KiB a page from `lsn`; `each_batch` runs after each.
fn ingest(timeline: &Timeline, lsn: &mut u64, count: u64, keys: u64, mut each_batch: impl FnMut()) {
    let page = Bytes::from(vec![0x5a; PAGE_SZ]);
    let mut n = 0;
    while n < count {
        let batch: Vec<PutRecord> = (0..BATCH as u64)
            .take_while(|i| n + i < count)
            .map(|i| {
                *lsn += PAGE_SZ as u64;
                PutRecord {
                    key: key((n + i) % keys),
                    lsn: Lsn(*lsn),
                    value: Value::Image(page.clone()),
                }
            })
            .collect();
        n += batch.len() as u64;
        timeline.put_batch(&batch).unwrap();
        each_batch();
    }
}

/// Copies every file under `from` to `to` (flat), each fsynced, then the directory: what a
/// download of each does to the disk. Returns the bytes copied.
fn plain_copy(files: &[PathBuf], to: &Path) -> u64 {
    std::fs::create_dir_all(to).unwrap();
    let mut bytes = 0;
    for (i, file) in files.iter().enumerate() {
        let dest = to.join(format!("{i}"));
        bytes += std::fs::copy(file, &dest).unwrap();
        std::fs::File::open(&dest).unwrap().sync_all().unwrap();
    }
    std::fs::File::open(to).unwrap().sync_all().unwrap();
    bytes
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_owned()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                found.push(path);
            }
        }
    }
    found
}

fn mib_s(bytes: u64, took: Duration) -> f64 {
    bytes as f64 / MIB as f64 / took.as_secs_f64()
}

fn attach(root: &Path) {
    let remote = root.join("remote");
    let layer_size = 256 * 1024;
    let conf = TimelineConf {
        compaction_threshold: 0,
        compaction_target_size: layer_size,
        checkpoint_distance: 1 << 40,
        ..uncompressed()
    };
    let pages = ATTACH_LAYERS * layer_size / PAGE_SZ as u64;
    let first = manager(&root.join("first"), Some(&remote), conf.clone());
    let tenant = first.create_tenant(None).unwrap();
    let timeline = tenant.create_timeline(None).unwrap();
    let mut lsn = 0;
    for _ in 0..2 {
        ingest(&timeline, &mut lsn, pages / 2, pages, || {});
        timeline.checkpoint().unwrap();
    }
    timeline.compact_l0(2).unwrap();
    let layers = timeline.layer_counts();
    let (tenant_id, timeline_id) = (tenant.id(), timeline.timeline_id());
    first.detach_tenant(tenant_id).unwrap();
    first.shutdown().unwrap();
    let objects: Vec<PathBuf> = files_under(&remote)
        .into_iter()
        .filter(|p| !p.to_string_lossy().contains("index_part"))
        .collect();

    let copy_all = |to: &Path| {
        let started = Instant::now();
        let copied = plain_copy(&objects, to);
        let took = started.elapsed();
        std::fs::remove_dir_all(to).unwrap();
        (copied, took)
    };
    let (copied, copy_before) = copy_all(&root.join("copy"));

    let second = manager(&root.join("second"), Some(&remote), conf);
    let started = Instant::now();
    let moved = second
        .attach_tenant(tenant_id, Generation::new(2).unwrap())
        .unwrap();
    let attached = started.elapsed();
    let timeline = moved.get_timeline(timeline_id).unwrap();
    let (page, cost) = measure(|| timeline.get_page(key(pages / 4), Lsn(lsn)));
    assert!(page.unwrap().is_some());
    let ready = started.elapsed();
    let total: u64 = timeline
        .layers()
        .iter()
        .filter_map(|l| l.file_name.as_ref().map(|_| l.size_bytes))
        .sum();
    while timeline.resident_layer_bytes() < total {
        std::thread::sleep(Duration::from_millis(5));
    }
    let hydrated = started.elapsed();
    // A second copy after the attach: the baseline is the mean of the one before and this.
    let (_, copy_after) = copy_all(&root.join("copy2"));
    let copy_took = (copy_before + copy_after) / 2;
    println!(
        "attach: {} L1 layers, {} MiB; attach call {:.0} ms, ready (first GetPage, {} download) {:.0} ms; hydrated in {:.2} s = {:.0} MiB/s; plain copy with fsync {:.2} s = {:.0} MiB/s (mean of one before and one after); hydration at {:.0} % of the copy",
        layers.l1,
        total / MIB,
        attached.as_secs_f64() * 1e3,
        cost.downloads,
        ready.as_secs_f64() * 1e3,
        hydrated.as_secs_f64(),
        mib_s(total, hydrated),
        copy_took.as_secs_f64(),
        mib_s(copied, copy_took),
        100.0 * copy_took.as_secs_f64() / hydrated.as_secs_f64(),
    );
    second.shutdown().unwrap();
}

fn ingest_with_and_without_uploads(root: &Path) {
    let conf = TimelineConf {
        checkpoint_distance: CHECKPOINT_DISTANCE,
        ..uncompressed()
    };
    let pages = INGEST_BYTES / PAGE_SZ as u64;
    let keys = 128 * MIB / PAGE_SZ as u64;
    // (name, remote storage: None, or whether uploads may hard-link, upload_queue_max_bytes)
    let cases = [
        ("without uploads", None, 0),
        (
            "with uploads by hard link (hard_links = true), upload_queue_max_bytes 2 x checkpoint_distance (the default's ratio)",
            Some(true),
            2 * CHECKPOINT_DISTANCE,
        ),
        (
            "with uploads copied (the default), same bound",
            Some(false),
            2 * CHECKPOINT_DISTANCE,
        ),
        (
            "with uploads copied, upload_queue_max_bytes 1 GiB",
            Some(false),
            1 << 30,
        ),
    ];
    // Two rounds, the cases alternating, so a disk that slows as it fills weighs on each alike.
    let mut results: Vec<(&str, f64, u64)> = Vec::new();
    for (name, remote, queue) in cases.iter().chain(cases.iter()).copied() {
        let dir = root.join(format!("run{}", results.len()));
        let remote = remote.map(|hard_links| RemoteStorageConfig::LocalFs {
            local_path: dir.join("remote"),
            hard_links,
        });
        let mgr = manager_with_queue(&dir.join("work"), remote, conf.clone(), queue);
        let timeline = mgr
            .create_tenant(None)
            .unwrap()
            .create_timeline(None)
            .unwrap();
        let mut lsn = 0;
        let mut max_lag = 0u64;
        let started = Instant::now();
        ingest(&timeline, &mut lsn, pages, keys, || {
            if let Some(remote) = timeline.remote_consistent_lsn() {
                let lag = timeline.disk_consistent_lsn().0.saturating_sub(remote.0);
                max_lag = max_lag.max(lag);
            }
        });
        let took = started.elapsed();
        results.push((name, mib_s(INGEST_BYTES, took), max_lag));
        mgr.shutdown().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
    // The mean of the two rounds of each case, and the larger lag.
    let results: Vec<(&str, f64, u64)> = (0..cases.len())
        .map(|i| {
            let (a, b) = (results[i], results[i + cases.len()]);
            (a.0, (a.1 + b.1) / 2.0, a.2.max(b.2))
        })
        .collect();
    let off = results[0].1;
    println!(
        "ingest: {} MiB, checkpoint_distance {} MiB, two rounds each; without uploads {off:.0} MiB/s",
        INGEST_BYTES / MIB,
        CHECKPOINT_DISTANCE / MIB,
    );
    for (name, on, lag) in &results[1..] {
        println!(
            "ingest {name}: {on:.0} MiB/s = {:.0} % of without; the most remote_consistent_lsn trailed disk_consistent_lsn: {:.0} MiB = {:.2} x checkpoint_distance",
            100.0 * on / off,
            *lag as f64 / MIB as f64,
            *lag as f64 / CHECKPOINT_DISTANCE as f64,
        );
    }
}

fn download(root: &Path) {
    let remote = root.join("remote");
    let conf = TimelineConf {
        compaction_threshold: 0,
        compaction_target_size: 1 << 40,
        checkpoint_distance: 1 << 40,
        ..uncompressed()
    };
    let mgr = manager(&root.join("work"), Some(&remote), conf);
    let tenant = mgr.create_tenant(None).unwrap();
    let timeline = tenant.create_timeline(None).unwrap();
    let pages = DOWNLOAD_LAYER / PAGE_SZ as u64;
    let mut lsn = 0;
    for _ in 0..2 {
        ingest(&timeline, &mut lsn, pages / 2, pages, || {});
        timeline.checkpoint().unwrap();
    }
    timeline.compact_l0(2).unwrap();
    let client = tenant.remote_client(timeline.timeline_id()).unwrap();
    assert!(client.wait_settled(Duration::from_secs(120)));
    let layer = timeline
        .layers()
        .into_iter()
        .find(|l| l.file_name.is_some())
        .unwrap();
    let object = files_under(&remote)
        .into_iter()
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(layer.file_name.as_deref().unwrap())
        })
        .unwrap();
    // Rounds alternating a copy and a download; the medians are compared.
    let (mut copies, mut downloads) = (Vec::new(), Vec::new());
    for round in 0..DOWNLOAD_ROUNDS {
        let to = root.join(format!("copy{round}"));
        let copy_started = Instant::now();
        plain_copy(std::slice::from_ref(&object), &to);
        copies.push(copy_started.elapsed());
        std::fs::remove_dir_all(&to).unwrap();

        assert!(eviction::run_pass(std::slice::from_ref(&timeline), 1).layers_evicted == 1);
        let started = Instant::now();
        let (page, cost) = measure(|| timeline.get_page(key(7 + round as u64), Lsn(lsn)));
        downloads.push(started.elapsed());
        assert!(page.unwrap().is_some() && cost.downloads == 1);
    }
    copies.sort();
    downloads.sort();
    let (copy_took, took) = (copies[DOWNLOAD_ROUNDS / 2], downloads[DOWNLOAD_ROUNDS / 2]);

    assert!(eviction::run_pass(std::slice::from_ref(&timeline), 1).layers_evicted == 1);
    let downloads: u32 = std::thread::scope(|s| {
        let readers: Vec<_> = (0..8)
            .map(|i| {
                let timeline = &timeline;
                s.spawn(move || {
                    measure(|| timeline.get_page(key(i * 100), Lsn(lsn)))
                        .1
                        .downloads
                })
            })
            .collect();
        readers.into_iter().map(|r| r.join().unwrap()).sum()
    });
    println!(
        "download: a {} MiB layer, medians of {DOWNLOAD_ROUNDS} rounds; GetPage that downloads it {:.2} s = {:.0} MiB/s; plain copy with fsync {:.2} s = {:.0} MiB/s; {:.2}x the copy; 8 concurrent readers of the evicted layer: {downloads} download",
        layer.size_bytes / MIB,
        took.as_secs_f64(),
        mib_s(layer.size_bytes, took),
        copy_took.as_secs_f64(),
        mib_s(layer.size_bytes, copy_took),
        took.as_secs_f64() / copy_took.as_secs_f64(),
    );
    mgr.shutdown().unwrap();
}

fn main() {
    // `cargo bench` passes `--bench`; a filter picks cases by name.
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let run = |name: &str| filter.as_deref().is_none_or(|f| name.contains(f));
    let root =
        tempfile::tempdir_in(std::env::var_os("BENCH_DIR").unwrap_or_else(|| ".".into())).unwrap();
    if run("attach") {
        attach(&root.path().join("attach"));
    }
    if run("download") {
        download(&root.path().join("download"));
    }
    if run("ingest") {
        ingest_with_and_without_uploads(&root.path().join("ingest"));
    }
}
