//! Batches of pages (`Timeline::get_pages`): reads without I/O when everything is cached, and
//! reads ahead in few I/Os when it is not.

use super::*;
use crate::io::cached_only::try_cached;
use crate::io::read_cost::measure;

#[test]
fn hot_reads_need_no_io_and_cold_ones_are_refused_whole() {
    let (_dir, cache, tl) = fresh_timeline(64);
    tl.put_batch(&[rec(1, 10, &image(1)), rec(2, 10, &image(2))])
        .unwrap();
    tl.checkpoint().unwrap();
    cache.drop_unpinned();
    tl.put(rel_key(1), Lsn(20), &image(3)).unwrap();

    // The open layer's page was just written (its blocks are in memory or cached as they were
    // written); the layer file's are not cached.
    let open = try_cached(|| tl.get_page(rel_key(1), Lsn(20))).expect("no I/O needed");
    assert_eq!(open.unwrap().unwrap()[0], 3);
    assert!(try_cached(|| tl.get_page(rel_key(2), Lsn(10))).is_none());
    let batch = [(rel_key(1), Lsn(20)), (rel_key(2), Lsn(10))];
    assert!(try_cached(|| tl.get_pages(&batch)).is_none());

    // Once read (and so cached), the same reads need no I/O and answer the same.
    let pages = tl.get_pages(&batch).unwrap();
    assert_eq!(pages[1].as_ref().unwrap()[0], 2);
    let hot = try_cached(|| tl.get_pages(&batch)).expect("no I/O needed");
    assert_eq!(hot.unwrap(), pages);
}

#[test]
fn a_cold_batch_of_neighbouring_pages_reads_its_values_in_one_run() {
    let (_dir, cache, tl) = fresh_plain_timeline(256);
    let images: Vec<PutRecord> = (0..64).map(|k| rec(k, 10, &image(k as u8))).collect();
    tl.put_batch(&images).unwrap();
    tl.checkpoint().unwrap();
    let batch: Vec<(Key, Lsn)> = (16..48).map(|k| (rel_key(k), Lsn(10))).collect();

    // One page at a time: a read per value (each spans two blocks, one shared with the next).
    cache.drop_unpinned();
    let (_, one_by_one) = measure(|| {
        for (key, lsn) in &batch {
            tl.get_page(*key, *lsn).unwrap().unwrap();
        }
    });
    assert!(one_by_one.ios >= 32, "{one_by_one}");

    // As a batch: the index, then every value block of the batch in one read.
    cache.drop_unpinned();
    let (pages, batched) = measure(|| tl.get_pages(&batch));
    let pages = pages.unwrap();
    for ((key, _), page) in batch.iter().zip(&pages) {
        let k = u8::try_from(key.field6).unwrap();
        assert_eq!(page.as_deref(), Some(&[k; PAGE_SZ][..]));
    }
    // Measured: 33 reads one by one (the index leaf, then 32 values), 2 as a batch.
    assert_eq!(batched.ios, batched.idx_miss + 1, "{batched}");
    assert_eq!(
        batched.val_miss, one_by_one.val_miss,
        "the same blocks, in one read"
    );
    assert_eq!(
        batched.bytes,
        u64::from(batched.val_miss + batched.idx_miss) * PAGE_SZ as u64
    );

    // Keys far apart are read one by one, as before: nothing between them is read ahead.
    cache.drop_unpinned();
    let sparse = [(rel_key(0), Lsn(10)), (rel_key(63), Lsn(10))];
    let (pages, sparse_cost) = measure(|| tl.get_pages(&sparse));
    assert_eq!(pages.unwrap()[1].as_deref(), Some(&[63u8; PAGE_SZ][..]));
    assert_eq!(sparse_cost.ios, sparse_cost.idx_miss + 2, "{sparse_cost}");
    assert!(sparse_cost.val_miss <= 4, "{sparse_cost}");
}

#[test]
fn a_cold_batch_reads_an_image_layer_in_one_run_of_checked_blocks() {
    let (_dir, cache, tl) = fresh_plain_timeline(256);
    for round in 0..2u8 {
        let images: Vec<PutRecord> = (0..64)
            .map(|k| rec(k, 10 + u64::from(round), &image(k as u8 ^ round)))
            .collect();
        tl.put_batch(&images).unwrap();
        tl.checkpoint().unwrap();
    }
    tl.compact_l0(2).unwrap();
    tl.create_images(true).unwrap();
    assert!(tl.layer_counts().images > 0);
    let at = tl.last_record_lsn();
    let batch: Vec<(Key, Lsn)> = (16..48).map(|k| (rel_key(k), at)).collect();

    cache.drop_unpinned();
    let (_, one_by_one) = measure(|| {
        for (key, lsn) in &batch {
            tl.get_page(*key, *lsn).unwrap().unwrap();
        }
    });
    cache.drop_unpinned();
    let (pages, batched) = measure(|| tl.get_pages(&batch));
    for ((key, _), page) in batch.iter().zip(pages.unwrap()) {
        let k = u8::try_from(key.field6).unwrap() ^ 1;
        assert_eq!(page.as_deref(), Some(&[k; PAGE_SZ][..]));
    }
    // Measured: 34 reads one by one, 3 as a batch (the index leaf and the checksum table
    // block, then every image in one read).
    assert!(one_by_one.ios >= 32, "{one_by_one}");
    assert_eq!(batched.ios, batched.idx_miss + 1, "{batched}");

    // A value block that no longer matches its checksum is not cached by the read ahead: the
    // read of its page reports it, and no page of the batch is answered from it.
    let file = tl
        .layers()
        .into_iter()
        .find(|l| l.kind == LayerKind::Image)
        .and_then(|l| l.file_name)
        .unwrap();
    let path = tl.dir().join(file);
    let mut bytes = std::fs::read(&path).unwrap();
    let block_of_key_20 = 1 + 20;
    bytes[block_of_key_20 * PAGE_SZ + 100] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    cache.drop_unpinned();
    let error = tl.get_pages(&batch).unwrap_err().to_string();
    assert!(
        error.contains("value block 21: checksum mismatch"),
        "{error}"
    );
}
