//! Loading against the manifest: every way a directory can disagree with it.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use pageserver_api::Value;

use super::*;
use crate::format::compression::Compression;
use crate::tenant::test_support::*;
use crate::tenant::timeline::layer_set::manifest::store_legacy;
use crate::tenant::timeline::PutRecord;
use crate::PAGE_SZ;

const TENANT: TenantId = TenantId::from_bytes([1; 16]);
const TIMELINE: TimelineId = TimelineId::from_bytes([2; 16]);

fn image(fill: u8) -> Value {
    Value::Image(Bytes::from(vec![fill; PAGE_SZ]))
}

/// A timeline of three delta layers, written at LSNs 0x10, 0x20 and 0x30, each holding a new
/// image of keys 0..4 and the third also key 9; returns the layer paths, oldest first.
fn three_layers(dir: &Path, tenant: TenantId) -> Vec<PathBuf> {
    let tl = Timeline::create(
        dir,
        tenant,
        TIMELINE,
        small_cache(64),
        TimelineConf {
            // Pages stored as they are: the third layer's fifth page makes it longer than the
            // others (compressed, all three would fit one block of values).
            layer_compression: Compression::Off,
            ..TimelineConf::default()
        },
    )
    .unwrap();
    for (n, lsn) in [0x10u64, 0x20, 0x30].into_iter().enumerate() {
        let mut batch: Vec<PutRecord> = (0..4)
            .map(|k| PutRecord {
                key: rel_key(k),
                lsn: Lsn(lsn),
                value: image(n as u8 * 16 + k as u8),
            })
            .collect();
        if n == 2 {
            batch.push(PutRecord {
                key: rel_key(9),
                lsn: Lsn(lsn),
                value: image(0x99),
            });
        }
        tl.put_batch(&batch).unwrap();
        tl.checkpoint().unwrap();
    }
    let mut paths: Vec<PathBuf> = tl
        .layers()
        .iter()
        .rev()
        .map(|l| dir.join(l.file_name.as_ref().unwrap()))
        .collect();
    paths.dedup();
    assert_eq!(paths.len(), 3);
    paths
}

fn load(dir: &Path) -> Result<Timeline, TimelineError> {
    Timeline::load(
        dir,
        TENANT,
        TIMELINE,
        small_cache(64),
        TimelineConf::default(),
    )
}

fn load_err(dir: &Path) -> String {
    match load(dir) {
        Ok(_) => panic!("the load must be refused"),
        Err(e) => e.to_string(),
    }
}

fn file_name(path: &Path) -> &str {
    path.file_name().unwrap().to_str().unwrap()
}

#[test]
fn a_missing_layer_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let layers = three_layers(dir.path(), TENANT);
    std::fs::remove_file(&layers[1]).unwrap();
    let err = load_err(dir.path());
    assert!(err.contains(file_name(&layers[1])), "{err}");
    assert!(err.contains("missing"), "{err}");
}

#[test]
fn another_layers_bytes_under_a_listed_name_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let layers = three_layers(dir.path(), TENANT);
    // Same size (the first two hold the same keys), other ranges.
    std::fs::copy(&layers[0], &layers[1]).unwrap();
    let err = load_err(dir.path());
    assert!(err.contains(file_name(&layers[1])), "{err}");
    assert!(err.contains("not the one its name says"), "{err}");
    // Of another size.
    std::fs::copy(&layers[2], &layers[1]).unwrap();
    let err = load_err(dir.path());
    assert!(err.contains("the manifest lists"), "{err}");
}

#[test]
fn another_tenants_layer_of_the_same_ranges_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let layers = three_layers(dir.path(), TENANT);
    let other_dir = tempfile::tempdir().unwrap();
    let other = TenantId::from_bytes([3; 16]);
    let theirs = three_layers(other_dir.path(), other);
    assert_eq!(file_name(&theirs[1]), file_name(&layers[1]));
    std::fs::copy(&theirs[1], &layers[1]).unwrap();
    let err = load_err(dir.path());
    assert!(err.contains(&format!("of tenant {other}")), "{err}");
}

#[test]
fn a_block_appended_or_cut_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let layers = three_layers(dir.path(), TENANT);
    let good = std::fs::read(&layers[2]).unwrap();
    let mut longer = good.clone();
    longer.extend_from_slice(&[0; PAGE_SZ]);
    std::fs::write(&layers[2], &longer).unwrap();
    let err = load_err(dir.path());
    assert!(err.contains(file_name(&layers[2])), "{err}");
    std::fs::write(&layers[2], &good[..good.len() - PAGE_SZ]).unwrap();
    let err = load_err(dir.path());
    assert!(err.contains(file_name(&layers[2])), "{err}");
    std::fs::write(&layers[2], &good).unwrap();
    load(dir.path()).unwrap();
}

#[test]
fn the_manifest_of_another_timeline_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    three_layers(dir.path(), TENANT);
    let err = match Timeline::load(
        dir.path(),
        TENANT,
        TimelineId::from_bytes([7; 16]),
        small_cache(8),
        TimelineConf::default(),
    ) {
        Ok(_) => panic!("loaded another timeline's manifest"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("it is the manifest of timeline"), "{err}");
}

#[test]
fn unlisted_layers_go_and_stray_files_stay() {
    let dir = tempfile::tempdir().unwrap();
    let layers = three_layers(dir.path(), TENANT);
    // A layer written by a flush that crashed before its manifest: the manifest of two layers.
    let tl = load(dir.path()).unwrap();
    let mut manifest = tl.manifest_snapshot();
    drop(tl);
    manifest.layers.retain(|l| l.name != file_name(&layers[2]));
    manifest.disk_consistent_lsn = Lsn(0x20);
    manifest.store(dir.path()).unwrap();
    let stray = dir.path().join("notes.txt");
    std::fs::write(&stray, b"an operator's notes").unwrap();
    std::fs::create_dir(dir.path().join("a-directory")).unwrap();
    // An unlisted layer of versions at or below disk_consistent_lsn is no crashed flush's.
    let restored = dir.path().join(format!(
        "{}-{}__0000000000000001-0000000000000011",
        rel_key(0),
        rel_key(9)
    ));
    std::fs::copy(&layers[0], &restored).unwrap();

    // A load that is refused deletes nothing.
    let first = std::fs::read(&layers[0]).unwrap();
    std::fs::remove_file(&layers[0]).unwrap();
    load_err(dir.path());
    assert!(layers[2].exists() && restored.exists());
    std::fs::write(&layers[0], first).unwrap();

    let tl = load(dir.path()).unwrap();
    assert_eq!(tl.layer_counts().deltas, 2);
    assert!(!layers[2].exists(), "the crashed flush's layer is removed");
    assert!(
        restored.exists(),
        "an unlisted layer of older versions is left alone"
    );
    assert!(stray.exists() && dir.path().join("a-directory").is_dir());
    assert_eq!(tl.get_page(rel_key(9), Lsn(0x20)).unwrap(), None);
    assert_eq!(
        tl.get_page(rel_key(1), Lsn(0x20)).unwrap().unwrap()[0],
        16 + 1
    );
}

#[test]
fn a_listed_layer_beyond_disk_consistent_lsn_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let layers = three_layers(dir.path(), TENANT);
    let mut manifest = load(dir.path()).unwrap().manifest_snapshot();
    manifest.disk_consistent_lsn = Lsn(0x20);
    manifest.store(dir.path()).unwrap();
    let err = load_err(dir.path());
    assert!(err.contains(file_name(&layers[2])), "{err}");
    assert!(err.contains("beyond disk_consistent_lsn 0/20"), "{err}");
}

/// A manifest that lost a layer's entry (the middle flush) is refused before anything is
/// opened or removed: read as it is, the layer below would answer for the lost LSNs.
#[test]
fn a_manifest_that_lost_a_layer_is_refused_with_the_gap() {
    let dir = tempfile::tempdir().unwrap();
    let layers = three_layers(dir.path(), TENANT);
    let whole = load(dir.path()).unwrap().manifest_snapshot();
    let mut manifest = whole.clone();
    assert!(manifest.retire_layer(file_name(&layers[1])));
    manifest.retired.clear();
    manifest.store(dir.path()).unwrap();
    let err = load_err(dir.path());
    assert!(
        err.contains("no layer holds LSNs 0/11..0/21") && err.contains("a layer is missing"),
        "{err}"
    );
    assert!(
        layers.iter().all(|l| l.exists()),
        "a refused load removes nothing"
    );
    // Listed again, it loads.
    whole.store(dir.path()).unwrap();
    load(dir.path()).unwrap();
}

#[test]
fn format_1_metadata_is_upgraded_to_a_manifest_of_the_same_layers() {
    let dir = tempfile::tempdir().unwrap();
    let layers = three_layers(dir.path(), TENANT);
    let mut expected = load(dir.path()).unwrap().manifest_snapshot();
    // Format 1 kept no list: the history it claims is not checked for holes, and no group is
    // known.
    expected.contiguous_from = expected.disk_consistent_lsn;
    for layer in &mut expected.layers {
        layer.group_size = 0;
    }
    // As an older server left it: format 1 metadata, plus a layer of an unfinished flush
    // (beyond disk_consistent_lsn) and a stray file.
    store_legacy(dir.path(), Lsn(0x30));
    let beyond = dir.path().join(format!(
        "{}-{}__0000000000000031-0000000000000041",
        rel_key(0),
        rel_key(1)
    ));
    std::fs::copy(&layers[0], &beyond).unwrap();
    std::fs::write(dir.path().join("README"), b"x").unwrap();

    let tl = load(dir.path()).unwrap();
    assert_eq!(tl.manifest_snapshot(), expected);
    assert!(!beyond.exists());
    assert_eq!(
        Manifest::load(dir.path()).unwrap(),
        StoredMetadata::Manifest(expected)
    );
    assert_eq!(
        tl.get_page(rel_key(9), Lsn(0x30)).unwrap().unwrap()[0],
        0x99
    );

    // A misnamed layer in a format 1 directory is refused too.
    drop(tl);
    store_legacy(dir.path(), Lsn(0x30));
    std::fs::copy(&layers[0], &layers[1]).unwrap();
    let err = load_err(dir.path());
    assert!(err.contains(file_name(&layers[1])), "{err}");
}

#[test]
fn the_manifest_is_the_commit_point_of_a_flush() {
    let dir = tempfile::tempdir().unwrap();
    let tl = Timeline::create(
        dir.path(),
        TENANT,
        TIMELINE,
        small_cache(16),
        TimelineConf::default(),
    )
    .unwrap();
    tl.put(rel_key(1), Lsn(0x10), &image(1)).unwrap();
    tl.checkpoint().unwrap();
    let manifest = tl.manifest_snapshot();
    assert_eq!(manifest.disk_consistent_lsn, Lsn(0x10));
    let [entry] = &manifest.layers[..] else {
        panic!("one layer: {manifest:?}");
    };
    let bytes = std::fs::read(dir.path().join(&entry.name)).unwrap();
    assert_eq!(entry.size, bytes.len() as u64);
    assert_eq!(entry.crc32c, utils::crc32c::crc32c(&bytes));
    assert_eq!(
        Manifest::load(dir.path()).unwrap(),
        StoredMetadata::Manifest(manifest)
    );
}

/// Two layers replaced by an image of every key, as a committed GC leaves them: the manifest
/// lists the image, names the two as retired and has its cutoff at the image. Load removes the
/// retired files, stores a manifest without them, and reads come from the image and the L0
/// above it.
#[test]
fn retired_files_are_removed_at_load_and_an_image_layer_serves_reads() {
    use crate::tenant::storage_layer::image_layer::ImageLayerWriter;
    use crate::tenant::timeline::layer_set::manifest::StoredMetadata;
    let dir = tempfile::tempdir().unwrap();
    let layers = three_layers(dir.path(), TENANT);
    let mut writer = ImageLayerWriter::new(
        dir.path(),
        TENANT,
        TIMELINE,
        pageserver_api::Key::MIN..pageserver_api::Key::MAX,
        Lsn(0x20),
    )
    .unwrap();
    for k in 0..4u8 {
        writer
            .put_image(rel_key(k.into()), &[16 + k; PAGE_SZ])
            .unwrap();
    }
    let written = writer.finish().unwrap();
    let StoredMetadata::Manifest(mut manifest) = Manifest::load(dir.path()).unwrap() else {
        panic!("a manifest");
    };
    for old in &layers[..2] {
        assert!(manifest.retire_layer(file_name(old)));
    }
    manifest.add_layer(image_entry(&written));
    manifest.gc_cutoff_lsn = Lsn(0x20);
    manifest.store(dir.path()).unwrap();

    let tl = load(dir.path()).unwrap();
    for old in &layers[..2] {
        assert!(!old.exists(), "{} is retired", old.display());
    }
    let StoredMetadata::Manifest(stored) = Manifest::load(dir.path()).unwrap() else {
        panic!("a manifest");
    };
    assert!(stored.retired.is_empty());
    let counts = tl.layer_counts();
    assert_eq!((counts.l0, counts.l1, counts.images), (1, 0, 1));
    // At 0x30 from the L0 (keys 0..4 and 9); at 0x20 from the image; key 9 had no page then.
    for k in 0..4u8 {
        let at_30 = tl.get_page(rel_key(k.into()), Lsn(0x30)).unwrap().unwrap();
        assert_eq!(at_30[0], 32 + k);
        let at_20 = tl.get_page(rel_key(k.into()), Lsn(0x20)).unwrap().unwrap();
        assert_eq!(at_20[0], 16 + k);
    }
    assert_eq!(tl.get_page(rel_key(9), Lsn(0x20)).unwrap(), None);
    assert_eq!(
        tl.get_page(rel_key(9), Lsn(0x30)).unwrap().unwrap()[0],
        0x99
    );
    // A key in the image's range without a page: the image says so, and the walk stops there.
    let (page, cost) = crate::io::read_cost::measure(|| tl.get_page(rel_key(7), Lsn(0x30)));
    assert_eq!(page.unwrap(), None);
    assert_eq!(cost.layers, 2, "the L0, then the image: {cost}");
}

#[test]
fn a_compaction_output_is_told_apart_over_import_groups_and_gaps() {
    let r = |a: u64, b: u64| Lsn(a)..Lsn(b);
    // Flushes tiling [1, 0x21), then an import's group of three at 0x100 (its range starts
    // above the flushes' end), then a flush.
    let l0 = [
        r(1, 0x11),
        r(0x11, 0x21),
        r(0x100, 0x101),
        r(0x100, 0x101),
        r(0x100, 0x101),
        r(0x101, 0x150),
    ];
    for (range, uncommitted) in [
        (r(1, 0x21), true),
        (r(1, 0x101), true),
        (r(0x11, 0x150), true),
        (r(0x100, 0x150), true),
        // One range alone: a flush's or an import's own file, never a compaction's.
        (r(0x100, 0x101), false),
        (r(1, 0x11), false),
        // Not from one L0's start to another's end.
        (r(2, 0x21), false),
        (r(1, 0x20), false),
        (r(1, 0x100), false),
        (r(0x150, 0x200), false),
    ] {
        assert_eq!(
            is_uncommitted_compaction(&l0, &range),
            uncommitted,
            "{range:?}"
        );
    }
}
