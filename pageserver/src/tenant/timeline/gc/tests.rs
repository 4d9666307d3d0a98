//! GC against the reference model: what it removes, what it keeps (history within the
//! horizon, layers a retained LSN needs), reads below the cutoff refused, and a reload after.

use super::*;
use crate::tenant::test_support::*;
use crate::tenant::timeline::test_model::*;

fn conf_gc(gc_horizon: u64) -> TimelineConf {
    TimelineConf {
        gc_horizon,
        image_creation_threshold: 2,
        ..conf()
    }
}

/// Two runs of L1s over the keys, then images at their end.
fn two_runs_and_images(tl: &Timeline, model: &mut Model) -> Lsn {
    ingest(tl, model, 3);
    tl.compact_l0(2).unwrap();
    put_all(tl, model, small_delta);
    put_all(tl, model, small_delta);
    tl.compact_l0(2).unwrap();
    tl.create_images(false).unwrap().lsn.unwrap()
}

#[test]
fn gc_removes_what_images_cover_below_the_cutoff_and_refuses_reads_there() {
    let dir = tempfile::tempdir().unwrap();
    let conf = conf_gc(0);
    let tl =
        Timeline::create(dir.path(), TENANT, TIMELINE, small_cache(256), conf.clone()).unwrap();
    let mut model = Model::new();
    let images_at = two_runs_and_images(&tl, &mut model);
    let l1s = tl.layer_counts().l1;
    let images = tl.layer_counts().images;
    // One more flush above, left as an L0: GC never goes past the L1s' end.
    put_all(&tl, &mut model, small_delta);

    let outcome = tl.gc(&[]).unwrap();
    assert_eq!(outcome.cutoff, images_at);
    assert_eq!(tl.gc_cutoff_lsn(), images_at);
    assert_eq!(outcome.layers_removed, l1s);
    let counts = tl.layer_counts();
    assert_eq!((counts.l0, counts.l1, counts.images), (1, 0, images));
    assert_eq!(tl.manifest_snapshot().gc_cutoff_lsn, images_at);
    // Nothing reads them: the files are gone, and the manifest lists what is left.
    let listed: Vec<String> = tl
        .manifest_snapshot()
        .layers
        .iter()
        .map(|l| l.name.clone())
        .collect();
    assert_eq!(layer_files(dir.path()), listed);
    let err = tl.get_page(rel_key(1), Lsn(images_at.0 - 1)).unwrap_err();
    assert!(
        err.to_string()
            .contains(&format!("below the GC cutoff {images_at}")),
        "{err}"
    );
    check_all(&tl, &model);

    // A second generation of images makes the first one removable.
    put_all(&tl, &mut model, small_delta);
    tl.compact_l0(2).unwrap();
    let newer = tl.create_images(true).unwrap().lsn.unwrap();
    let outcome = tl.gc(&[]).unwrap();
    assert_eq!(outcome.cutoff, newer);
    assert_eq!(
        outcome.layers_removed,
        images + 1,
        "the first images and the L1"
    );
    assert_eq!(tl.layer_counts().images, images);
    check_all(&tl, &model);

    drop(tl);
    let tl = Timeline::load(dir.path(), TENANT, TIMELINE, small_cache(256), conf).unwrap();
    assert_eq!(tl.gc_cutoff_lsn(), newer);
    check_all(&tl, &model);
    // Again: nothing more to remove, the cutoff stays.
    assert_eq!(tl.gc(&[]).unwrap().layers_removed, 0);
}

#[test]
fn gc_keeps_the_horizon_and_what_a_retained_lsn_needs() {
    let dir = tempfile::tempdir().unwrap();
    // The default horizon: far more than this history.
    let tl = Timeline::create(
        dir.path(),
        TENANT,
        TIMELINE,
        small_cache(256),
        conf_gc(64 << 20),
    )
    .unwrap();
    let mut model = Model::new();
    two_runs_and_images(&tl, &mut model);
    let before = layer_files(dir.path());
    let outcome = tl.gc(&[]).unwrap();
    assert_eq!((outcome.cutoff, outcome.layers_removed), (Lsn(0), 0));
    assert_eq!(layer_files(dir.path()), before);

    let dir = tempfile::tempdir().unwrap();
    let tl = Timeline::create(dir.path(), TENANT, TIMELINE, small_cache(256), conf_gc(0)).unwrap();
    let mut model = Model::new();
    let images_at = two_runs_and_images(&tl, &mut model);
    // A branch point inside the second run: reads there need both runs, which no image at
    // or below it covers.
    let first_run_end = tl
        .layer_map()
        .below_l0
        .iter()
        .map(|l| l.lsn_range().end)
        .min()
        .unwrap();
    let branch_point = Lsn(first_run_end.0 + 1);
    assert!(branch_point < images_at);
    let before = layer_files(dir.path());
    let outcome = tl.gc(&[branch_point]).unwrap();
    assert_eq!((outcome.cutoff, outcome.layers_removed), (images_at, 0));
    assert_eq!(layer_files(dir.path()), before);
    // Without it, they go.
    assert!(tl.gc(&[]).unwrap().layers_removed > 0);
    check_all(&tl, &model);
}

#[test]
fn a_reader_keeps_a_collected_layer_readable_until_it_lets_go() {
    let dir = tempfile::tempdir().unwrap();
    let tl = Timeline::create(dir.path(), TENANT, TIMELINE, small_cache(256), conf_gc(0)).unwrap();
    let mut model = Model::new();
    two_runs_and_images(&tl, &mut model);
    let old_lsn = Lsn(0x20);
    let (_, layers) = tl.scan_layers(old_lsn).unwrap();
    let before = layer_files(dir.path());
    assert!(tl.gc(&[]).unwrap().layers_removed > 0);
    // Its snapshot still reads below the new cutoff, from the files GC retired.
    for layer in &layers {
        layer.layer.get(rel_key(1), old_lsn).unwrap();
    }
    assert!(before.iter().all(|n| dir.path().join(n).exists()));
    drop(layers);
    assert!(before.iter().any(|n| !dir.path().join(n).exists()));
    check_all(&tl, &model);
}

/// A read in progress at an old LSN (a basebackup) leases it: GC's cutoff stops at it, the
/// layers it reads stay, and once the lease is dropped the next pass goes on. A lease below
/// the cutoff is refused, as a read there would be.
#[test]
fn a_leased_lsn_holds_the_cutoff_until_the_lease_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let tl = Arc::new(
        Timeline::create(dir.path(), TENANT, TIMELINE, small_cache(256), conf_gc(0)).unwrap(),
    );
    let mut model = Model::new();
    ingest(&tl, &mut model, 1);
    let early = tl.last_record_lsn();
    let lease = tl.lease_lsn(early).unwrap();
    assert_eq!(lease.lsn(), early);
    let images_at = two_runs_and_images(&tl, &mut model);
    assert!(early < images_at);

    let outcome = tl.gc(&[]).unwrap();
    assert_eq!((outcome.cutoff, outcome.layers_removed), (early, 0));
    // What the read at the leased LSN sees is all there, however long it takes.
    for k in 0..8 {
        assert_eq!(
            tl.get_page(rel_key(k), early).unwrap(),
            expected(&model, rel_key(k), early),
            "key {k}"
        );
    }
    // Two leases at one LSN: the cutoff waits for both.
    let second = tl.lease_lsn(early).unwrap();
    drop(lease);
    assert_eq!(tl.gc(&[]).unwrap().cutoff, early);
    drop(second);
    let outcome = tl.gc(&[]).unwrap();
    assert_eq!(outcome.cutoff, images_at);
    assert!(outcome.layers_removed > 0);
    match tl.lease_lsn(early) {
        Err(TimelineError::BelowGcCutoff { lsn, cutoff }) => {
            assert_eq!((lsn, cutoff), (early, images_at))
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a lease below the cutoff"),
    }
    check_all(&tl, &model);
}

/// A lease taken until a time (`POST .../lsn_lease`) holds the cutoff until then, is extended
/// by taking it again, and holds nothing once it has expired.
#[test]
fn a_lease_until_a_time_holds_the_cutoff_until_it_expires() {
    let dir = tempfile::tempdir().unwrap();
    let tl = Arc::new(
        Timeline::create(dir.path(), TENANT, TIMELINE, small_cache(256), conf_gc(0)).unwrap(),
    );
    let mut model = Model::new();
    ingest(&tl, &mut model, 1);
    let early = tl.last_record_lsn();
    let now = std::time::Instant::now();
    tl.lease_lsn_until(early, now + std::time::Duration::from_secs(3600))
        .unwrap();
    // A shorter lease of the same LSN does not shorten it.
    tl.lease_lsn_until(early, now).unwrap();
    assert_eq!(tl.timed_leases().len(), 1);
    let images_at = two_runs_and_images(&tl, &mut model);
    assert!(early < images_at);
    assert_eq!(tl.gc(&[]).unwrap().cutoff, early);

    // One that has expired holds nothing.
    std::fs::create_dir(dir.path().join("other")).unwrap();
    let other = Arc::new(
        Timeline::create(
            &dir.path().join("other"),
            TENANT,
            TIMELINE,
            small_cache(256),
            conf_gc(0),
        )
        .unwrap(),
    );
    let mut other_model = Model::new();
    ingest(&other, &mut other_model, 1);
    let early = other.last_record_lsn();
    other
        .lease_lsn_until(early, std::time::Instant::now())
        .unwrap();
    let images_at_other = two_runs_and_images(&other, &mut other_model);
    assert!(other.timed_leases().is_empty());
    assert_eq!(other.gc(&[]).unwrap().cutoff, images_at_other);
    check_all(&tl, &model);
}
