//! Image creation: which pieces the triggers pick, that images keep every answer and end
//! reads, and that a failed or uncommitted creation leaves the layer set as it was.

use super::*;
use crate::tenant::test_support::*;
use crate::tenant::timeline::test_model::*;

fn conf_images(threshold: usize) -> TimelineConf {
    TimelineConf {
        image_creation_threshold: threshold,
        ..conf()
    }
}

/// The image layers' key ranges, in key order: they must tile the whole key space.
fn assert_images_tile(tl: &Timeline, lsn: Lsn) {
    let mut ranges: Vec<Range<Key>> = tl
        .layer_map()
        .below_l0
        .iter()
        .filter(|l| matches!(l, Layer::Image(_)) && l.lsn_range().start == lsn)
        .map(|l| l.key_range())
        .collect();
    ranges.sort_by_key(|r| r.start);
    assert_eq!(ranges.first().map(|r| r.start), Some(Key::MIN));
    assert_eq!(ranges.last().map(|r| r.end), Some(Key::MAX));
    for w in ranges.windows(2) {
        assert_eq!(w[0].end, w[1].start, "{ranges:?}");
    }
}

#[test]
fn images_keep_every_answer_and_end_the_walk() {
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(256);
    let conf = conf_images(2);
    let tl = Timeline::create(dir.path(), TENANT, TIMELINE, cache.clone(), conf.clone()).unwrap();
    let mut model = Model::new();
    ingest(&tl, &mut model, 4);
    assert_eq!(tl.compact_l0(2).unwrap().inputs, 4);
    // One run of L1s over the keys: below the threshold of 2.
    let first = tl.create_images(false).unwrap();
    assert_eq!((first.pieces, first.layers_written), (1, 0), "{first:?}");

    ingest(&tl, &mut model, 3);
    tl.compact_l0(2).unwrap();
    let l1_end = tl.layer_map().l1_end().unwrap();
    let made = tl.create_images(false).unwrap();
    assert_eq!(made.lsn, Some(Lsn(l1_end.0 - 1)));
    assert_eq!(made.pieces_imaged, 1);
    // 40 pages of 8 KiB cut at 64 KiB.
    assert!(made.layers_written >= 4, "{made:?}");
    assert_eq!(made.images, u64::from(KEYS));
    assert_images_tile(&tl, Lsn(l1_end.0 - 1));
    let listed_images = tl
        .manifest_snapshot()
        .layers
        .iter()
        .filter(|l| l.level == LayerLevel::Image)
        .count();
    assert_eq!(listed_images, made.layers_written);
    check_all(&tl, &model);

    // A read at the latest LSN visits its image and nothing else.
    cache.drop_unpinned();
    let (_, cost) = crate::io::read_cost::measure(|| tl.get_page(rel_key(3), tl.last_record_lsn()));
    assert_eq!(cost.layers, 1, "{cost}");
    // Nothing above the images: nothing to do.
    assert_eq!(tl.create_images(false).unwrap().layers_written, 0);

    // One more run above them: neither trigger fires (small deltas); forced, each piece
    // gets images of its own range at the new LSN.
    put_all(&tl, &mut model, small_delta);
    put_all(&tl, &mut model, small_delta);
    tl.compact_l0(2).unwrap();
    assert_eq!(tl.create_images(false).unwrap().layers_written, 0);
    let forced = tl.create_images(true).unwrap();
    assert_eq!(forced.pieces_imaged, made.layers_written);
    assert_images_tile(&tl, forced.lsn.unwrap());
    check_all(&tl, &model);

    let images = tl.layer_counts().images;
    drop(tl);
    let tl = Timeline::load(dir.path(), TENANT, TIMELINE, small_cache(256), conf).unwrap();
    assert_eq!(tl.layer_counts().images, images);
    check_all(&tl, &model);
}

#[test]
fn the_size_trigger_images_a_piece_whose_history_outweighs_its_image() {
    let dir = tempfile::tempdir().unwrap();
    let conf = TimelineConf {
        image_creation_threshold: 100,
        image_creation_delta_percent: 50,
        ..conf()
    };
    let tl = Timeline::create(dir.path(), TENANT, TIMELINE, small_cache(256), conf).unwrap();
    let mut model = Model::new();
    ingest(&tl, &mut model, 2);
    tl.compact_l0(2).unwrap();
    let base = tl.create_images(true).unwrap();
    assert!(base.layers_written > 0);
    // Small deltas: far from half of the images' size.
    put_all(&tl, &mut model, small_delta);
    put_all(&tl, &mut model, small_delta);
    tl.compact_l0(2).unwrap();
    assert_eq!(tl.create_images(false).unwrap().layers_written, 0);
    // A new image of every key: as many bytes as the images, in every piece.
    for flush in 0..2u8 {
        put_all(&tl, &mut model, |_| {
            Value::Image(Bytes::from(vec![flush; PAGE_SZ]))
        });
    }
    tl.compact_l0(2).unwrap();
    let made = tl.create_images(false).unwrap();
    assert_eq!(made.pieces_imaged, base.layers_written, "{made:?}");
    check_all(&tl, &model);
}

#[test]
fn a_failed_image_creation_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let tl = Timeline::create(dir.path(), TENANT, TIMELINE, small_cache(256), conf()).unwrap();
    let mut model = Model::new();
    ingest(&tl, &mut model, 3);
    tl.compact_l0(2).unwrap();
    let before = layer_files(dir.path());
    let manifest = tl.manifest_snapshot();
    // An L1 damaged on disk: the read stops with its error, images written so far are
    // removed.
    let victim = dir.path().join(&before[before.len() / 2]);
    let mut bytes = std::fs::read(&victim).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xFF;
    std::fs::write(&victim, &bytes).unwrap();
    tl.create_images(true).unwrap_err();
    assert_eq!(layer_files(dir.path()), before);
    assert_eq!(tl.manifest_snapshot(), manifest);
    assert_eq!(tl.layer_counts().images, 0);
}

#[test]
fn load_removes_images_no_manifest_lists_at_the_l1_end() {
    let dir = tempfile::tempdir().unwrap();
    let tl = Timeline::create(dir.path(), TENANT, TIMELINE, small_cache(256), conf()).unwrap();
    let mut model = Model::new();
    ingest(&tl, &mut model, 3);
    tl.compact_l0(2).unwrap();
    let l1_end = tl.layer_map().l1_end().unwrap();
    drop(tl);
    // What an image creation that crashed before its manifest leaves: a whole image layer at
    // the L1s' last LSN, and one elsewhere, which is not ours to judge.
    let write = |lsn: Lsn| {
        let mut w =
            ImageLayerWriter::new(dir.path(), TENANT, TIMELINE, Key::MIN..Key::MAX, lsn).unwrap();
        w.put_image(rel_key(1), &[7u8; PAGE_SZ]).unwrap();
        w.finish().unwrap().path
    };
    let uncommitted = write(Lsn(l1_end.0 - 1));
    let stray = write(Lsn(l1_end.0 - 2));
    let tl = Timeline::load(dir.path(), TENANT, TIMELINE, small_cache(256), conf()).unwrap();
    assert!(!uncommitted.exists());
    assert!(stray.exists());
    assert_eq!(tl.layer_counts().images, 0);
    check_all(&tl, &model);
}
