use std::fs::OpenOptions;
use std::sync::atomic::AtomicU64;

use proptest::prelude::*;

use super::*;
use crate::format::blob_io::BlockCursor;
use crate::io::virtual_file::testing::FailingWrites;
use crate::tenant::test_support::*;

fn blob(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i.wrapping_mul(131) ^ j) as u8).collect()
}

#[test]
fn write_read_back_and_prewarm() {
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(64);
    let mut file = EphemeralFile::create(dir.path(), cache.clone()).unwrap();
    let mut offsets = Vec::new();
    for i in 0..100 {
        offsets.push(file.write_blob(&blob(i, 300)).unwrap());
    }
    // 100 blobs of 4 + 300 bytes: 3 full blocks written and pre-warmed, the rest in the tail.
    assert_eq!(file.len(), 100 * 304);
    let stats = cache.stats().file_pages;
    assert_eq!(stats.inserts, 3);
    assert_eq!(
        std::fs::metadata(file.path()).unwrap().len(),
        3 * PAGE_SZ as u64
    );

    let cursor = BlockCursor::new(&file);
    for (i, offset) in offsets.iter().enumerate() {
        assert_eq!(cursor.read_blob(*offset).unwrap(), blob(i, 300));
    }
    let stats = cache.stats().file_pages;
    assert_eq!(stats.misses, 0, "every flushed block was pre-warmed");
    assert!(stats.hits > 0);
}

#[test]
fn tail_is_served_from_memory_and_zeroed_after_flush() {
    let dir = tempfile::tempdir().unwrap();
    let mut file = EphemeralFile::create(dir.path(), small_cache(8)).unwrap();
    file.write_blob(&[0xEE; PAGE_SZ - 4]).unwrap(); // 4-byte header: exactly one block
    assert!(matches!(file.read_blk(1).unwrap(), BlockLease::Tail(_)));
    assert!(file.read_blk(1).unwrap().iter().all(|&b| b == 0));
    assert!(matches!(file.read_blk(0).unwrap(), BlockLease::Cached(_)));
    assert!(matches!(
        file.read_blk(2),
        Err(BlockReadError::OutOfBounds { blkno: 2, .. })
    ));
}

#[test]
fn blocks_are_read_from_disk_after_the_cache_forgets_them() {
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(8);
    let mut file = EphemeralFile::create(dir.path(), cache.clone()).unwrap();
    let offsets: Vec<_> = (0..50)
        .map(|i| file.write_blob(&blob(i, 1000)).unwrap())
        .collect();
    cache.drop_unpinned();
    let cursor = BlockCursor::new(&file);
    for (i, offset) in offsets.iter().enumerate() {
        assert_eq!(cursor.read_blob(*offset).unwrap(), blob(i, 1000));
    }
    assert!(cache.stats().file_pages.misses > 0);
}

#[test]
fn failed_prewarm_is_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(4);
    let other = FileId::next();
    // Pin every slot of the cache.
    let pinned: Vec<_> = (0..4)
        .map(|b| {
            cache
                .read_file_page(other, b, Arrival::ReadThrough, |_| Ok::<_, ()>(()))
                .unwrap()
        })
        .collect();
    let mut file = EphemeralFile::create(dir.path(), cache.clone()).unwrap();
    let offsets: Vec<_> = (0..40)
        .map(|i| file.write_blob(&blob(i, 500)).unwrap())
        .collect();
    assert!(cache.stats().inserts_refused > 0);
    let cursor = BlockCursor::new(&file);
    for (i, offset) in offsets.iter().enumerate() {
        assert_eq!(cursor.read_blob(*offset).unwrap(), blob(i, 500));
    }
    drop(pinned);
}

#[test]
fn write_error_names_file_and_block_and_breaks_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ephemeral-faulty");
    let inner = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    let faulty = FailingWrites {
        inner,
        fail_from: 2,
        calls: Arc::new(AtomicU64::new(0)),
    };
    let mut file = EphemeralFile::from_parts(
        FileId::next(),
        path.clone(),
        Box::new(faulty),
        small_cache(16),
    );
    let mut written = Vec::new();
    let err = loop {
        let i = written.len();
        match file.write_blob(&blob(i, 1000)) {
            Ok(offset) => written.push((offset, blob(i, 1000))),
            Err(e) => break e,
        }
    };
    let msg = err.to_string();
    assert!(
        matches!(err, EphemeralWriteError::Io { blkno: 2, .. }),
        "{msg}"
    );
    assert!(
        msg.contains("ephemeral-faulty") && msg.contains("block 2"),
        "{msg}"
    );

    let refused = file.write_blob(b"x").unwrap_err();
    assert!(matches!(refused, EphemeralWriteError::Broken { .. }));
    assert!(refused.to_string().contains("ephemeral-faulty"));

    // Everything acknowledged before the failure still reads back unchanged.
    let cursor = BlockCursor::new(&file);
    for (offset, expected) in &written {
        assert_eq!(&cursor.read_blob(*offset).unwrap(), expected);
    }
}

#[test]
fn too_large_blob_is_refused_without_breaking_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut file = EphemeralFile::create(dir.path(), small_cache(8)).unwrap();
    // A slice longer than the format allows, without allocating it: a zero-sized element type
    // cannot be used here, so check the header path directly.
    assert!(BlobHeader::new(crate::format::blob_io::MAX_BLOB_LEN + 1).is_err());
    let off = file.write_blob(b"still fine").unwrap();
    assert_eq!(
        BlockCursor::new(&file).read_blob(off).unwrap(),
        b"still fine"
    );
}

#[test]
fn removed_on_drop_and_leftovers_cleaned() {
    let dir = tempfile::tempdir().unwrap();
    let file = EphemeralFile::create(dir.path(), small_cache(8)).unwrap();
    let path = file.path().to_owned();
    assert!(path.exists());
    drop(file);
    assert!(!path.exists());

    std::fs::write(dir.path().join("ephemeral-17"), b"left by a crash").unwrap();
    std::fs::write(dir.path().join("ephemeral-18"), b"").unwrap();
    std::fs::write(dir.path().join("metadata"), b"keep me").unwrap();
    assert_eq!(remove_leftovers(dir.path()).unwrap(), 2);
    assert!(dir.path().join("metadata").exists());
    assert!(!dir.path().join("ephemeral-17").exists());
}

#[derive(Debug, Clone)]
enum Op {
    Write(usize),
    Read(usize),
    DropCache,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => prop_oneof![
            0usize..140,
            Just(127usize),
            Just(128usize),
            0usize..3 * PAGE_SZ,
        ].prop_map(Op::Write),
        3 => any::<usize>().prop_map(Op::Read),
        1 => Just(Op::DropCache),
    ]
}

proptest! {
    /// Interleaved writes and reads, with a small cache that evicts, against a Vec of what was
    /// written. Sizes cover both header forms, blobs spanning blocks, and headers straddling a
    /// block edge.
    #[test]
    fn interleaved_writes_and_reads_match_a_model(ops in prop::collection::vec(op(), 1..120)) {
        let dir = tempfile::tempdir().unwrap();
        let cache = small_cache(6);
        let mut file = EphemeralFile::create(dir.path(), cache.clone()).unwrap();
        let mut model: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut expected_len = 0u64;
        for op in ops {
            match op {
                Op::Write(len) => {
                    let data = blob(model.len(), len);
                    let offset = file.write_blob(&data).unwrap();
                    prop_assert_eq!(offset, expected_len);
                    expected_len += (BlobHeader::new(len).unwrap().encoded_len() + len) as u64;
                    model.push((offset, data));
                }
                Op::Read(pick) if !model.is_empty() => {
                    let (offset, data) = &model[pick % model.len()];
                    prop_assert_eq!(&BlockCursor::new(&file).read_blob(*offset).unwrap(), data);
                }
                Op::Read(_) => {}
                Op::DropCache => {
                    cache.drop_unpinned();
                }
            }
            prop_assert_eq!(file.len(), expected_len);
        }
        let cursor = BlockCursor::new(&file);
        for (offset, data) in &model {
            prop_assert_eq!(&cursor.read_blob(*offset).unwrap(), data);
        }
    }
}
