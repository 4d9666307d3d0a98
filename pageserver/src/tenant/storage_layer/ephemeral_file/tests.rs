use std::fs::OpenOptions;
use std::sync::atomic::AtomicU64;

use proptest::prelude::*;

use super::*;
use crate::format::blob_io::BlockCursor;
use crate::io::virtual_file::testing::{hold_write_at, FailingWrites};
use crate::tenant::test_support::*;

fn blob(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i.wrapping_mul(131) ^ j) as u8).collect()
}

#[test]
fn write_read_back_and_prewarm() {
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(64);
    let file = EphemeralFile::create(dir.path(), cache.clone()).unwrap();
    let mut offsets = Vec::new();
    for i in 0..300 {
        offsets.push(file.write_blob(&blob(i, 300)).unwrap());
    }
    // 300 blobs of 4 + 300 bytes: 11 full blocks, the first 8 written together and pre-warmed,
    // 3 sealed in memory; the rest in the tail.
    assert_eq!(file.len(), 300 * 304);
    let stats = cache.stats().file_pages;
    assert_eq!(stats.inserts, WRITE_STEP_BLOCKS as u64);
    assert_eq!(
        std::fs::metadata(file.path()).unwrap().len(),
        (WRITE_STEP_BLOCKS * PAGE_SZ) as u64
    );

    let cursor = BlockCursor::new(&file);
    for (i, offset) in offsets.iter().enumerate() {
        assert_eq!(cursor.read_blob(*offset).unwrap(), blob(i, 300));
    }
    let stats = cache.stats().file_pages;
    assert_eq!(stats.misses, 0, "every written block was pre-warmed");
    assert!(stats.hits > 0);
}

#[test]
fn sealed_blocks_and_the_tail_are_served_from_memory_until_written() {
    let dir = tempfile::tempdir().unwrap();
    let file = EphemeralFile::create(dir.path(), small_cache(16)).unwrap();
    let whole_block = [0xEE; PAGE_SZ - 4]; // with its 4-byte header, exactly one block
    file.write_blob(&whole_block).unwrap();
    assert!(matches!(file.read_blk(0).unwrap(), BlockLease::Shared(_)));
    assert!(matches!(file.read_blk(1).unwrap(), BlockLease::Locked(_)));
    assert!(file.read_blk(1).unwrap().iter().all(|&b| b == 0));
    assert!(matches!(
        file.read_blk(2),
        Err(BlockReadError::OutOfBounds { blkno: 2, .. })
    ));
    assert_eq!(std::fs::metadata(file.path()).unwrap().len(), 0);
    // The run's last block fills it: all of it is written with one call, then cached.
    for _ in 1..WRITE_STEP_BLOCKS {
        file.write_blob(&whole_block).unwrap();
    }
    for blkno in 0..WRITE_STEP_BLOCKS as u32 {
        let block = file.read_blk(blkno).unwrap();
        assert!(matches!(block, BlockLease::Cached(_)), "{blkno}: {block:?}");
    }
    assert!(matches!(
        file.read_blk(WRITE_STEP_BLOCKS as u32).unwrap(),
        BlockLease::Locked(_)
    ));
    assert_eq!(
        std::fs::metadata(file.path()).unwrap().len(),
        (WRITE_STEP_BLOCKS * PAGE_SZ) as u64
    );
    // The next tail reuses a written block's memory, zeroed.
    file.write_blob(&whole_block).unwrap();
    let tail = file.read_blk(WRITE_STEP_BLOCKS as u32 + 1).unwrap();
    assert!(matches!(tail, BlockLease::Locked(_)));
    assert!(tail.iter().all(|&b| b == 0));
}

#[test]
fn blocks_are_read_from_disk_after_the_cache_forgets_them() {
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(8);
    let file = EphemeralFile::create(dir.path(), cache.clone()).unwrap();
    // 18 blocks: two runs written.
    let offsets: Vec<_> = (0..150)
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
    let file = EphemeralFile::create(dir.path(), cache.clone()).unwrap();
    // 12 blocks: one run written, its pre-warm refused.
    let offsets: Vec<_> = (0..200)
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
    // The first run's eight blocks are written; the second run's third block fails.
    let faulty = FailingWrites {
        inner,
        fail_from: WRITE_STEP_BLOCKS as u64 + 2,
        calls: Arc::new(AtomicU64::new(0)),
    };
    let file = EphemeralFile::from_parts(
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
        matches!(
            err,
            EphemeralWriteError::Io {
                blkno: 8,
                blocks: 8,
                ..
            }
        ),
        "{msg}"
    );
    assert!(
        msg.contains("ephemeral-faulty") && msg.contains("blocks 8 to 15"),
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
    let file = EphemeralFile::create(dir.path(), small_cache(8)).unwrap();
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
        let file = EphemeralFile::create(dir.path(), cache.clone()).unwrap();
        let mut model: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut expected_len = 0u64;
        for op in ops {
            match op {
                Op::Write(len) => {
                    let data = blob(model.len(), len);
                    // Odd lengths go in three pieces, one of them empty.
                    let offset = if len % 2 == 1 {
                        let (first, rest) = data.split_at(len / 3);
                        file.write_blob_parts(&[first, &[], rest]).unwrap()
                    } else {
                        file.write_blob(&data).unwrap()
                    };
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

#[test]
fn is_send_and_sync() {
    fn shared_between_threads<T: Send + Sync>() {}
    shared_between_threads::<EphemeralFile>();
}

/// How long a test waits for something that should happen at once before it fails.
const DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

#[test]
fn reads_do_not_wait_for_a_block_write() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ephemeral-held");
    let inner = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    // The second run (blocks 8 to 15) is the held write.
    let step = WRITE_STEP_BLOCKS as u64;
    let (held, hold) = hold_write_at(inner, block_offset(step as u32));
    let cache = small_cache(16);
    let file = EphemeralFile::from_parts(FileId::next(), path, Box::new(held), cache.clone());
    // Blocks 0 to 14 full (the first run written), block 15 partly filled.
    let mut written = Vec::new();
    while file.len() < (2 * step - 1) * PAGE_SZ as u64 + 3000 {
        let data = blob(written.len(), 1000);
        written.push((file.write_blob(&data).unwrap(), data));
    }
    let last_of_run = 2 * step - 1;
    let (in_block_0, _) = written[0].clone();
    let (in_last_of_run, _) = *written
        .iter()
        .find(|(offset, _)| *offset >= last_of_run * PAGE_SZ as u64)
        .unwrap();
    // Block 0 is read from disk below, not from the pre-warmed page.
    cache.drop_unpinned();

    // From block 15 into block 16: its write fills block 15, which fills the run, whose write
    // is held.
    let spanning = blob(99, PAGE_SZ);
    let spanning_at = file.len();
    std::thread::scope(|s| {
        // Moved in here: a failing assertion drops it, which releases the writer.
        let hold = hold;
        let file = &file;
        let writer = s.spawn(|| file.write_blob(&spanning));
        hold.wait_until_reached();
        // The whole blob is readable before its block is written.
        assert_eq!(file.len(), spanning_at + 4 + PAGE_SZ as u64);

        let (done_tx, done_rx) = std::sync::mpsc::channel();
        s.spawn(move || {
            let cursor = BlockCursor::new(file);
            let read = |offset| cursor.read_blob(offset).unwrap();
            let leases = [step - 1, step, last_of_run, last_of_run + 1]
                .into_iter()
                .map(|blkno| format!("{:?}", file.read_blk(blkno as u32).unwrap()))
                .collect::<Vec<_>>();
            let _ = done_tx.send((
                read(in_last_of_run),
                read(in_block_0),
                read(spanning_at),
                leases,
            ));
        });
        let (sealed, earlier, across_to_tail, leases) = done_rx
            .recv_timeout(DEADLINE)
            .expect("the reads finished while the block write was held");
        assert!(!writer.is_finished(), "the block write is still held");
        let expected = |offset| &written.iter().find(|(o, _)| *o == offset).unwrap().1;
        assert_eq!(&sealed, expected(in_last_of_run));
        assert_eq!(&earlier, expected(in_block_0));
        assert_eq!(across_to_tail, spanning);
        // Block 7 was written (read from disk into the cache); the run's blocks are shared
        // copies; block 16 is the tail.
        assert_eq!(
            leases,
            [
                "BlockLease::Cached",
                "BlockLease::Shared",
                "BlockLease::Shared",
                "BlockLease::Locked"
            ]
        );

        hold.release();
        assert_eq!(writer.join().unwrap().unwrap(), spanning_at);
    });

    // Written and pre-warmed: the run's blocks now come from the page cache.
    for blkno in step..2 * step {
        let block = file.read_blk(blkno as u32).unwrap();
        assert!(matches!(block, BlockLease::Cached(_)), "{blkno}: {block:?}");
    }
    cache.drop_unpinned();
    let cursor = BlockCursor::new(&file);
    for (offset, data) in &written {
        assert_eq!(&cursor.read_blob(*offset).unwrap(), data);
    }
    assert_eq!(cursor.read_blob(spanning_at).unwrap(), spanning);
}

#[test]
fn concurrent_readers_see_every_acknowledged_blob() {
    // One writer appends blobs of every size class; readers read back random acknowledged
    // ones while it writes, with a cache small enough that most blocks come from disk.
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(4);
    let file = EphemeralFile::create(dir.path(), cache.clone()).unwrap();
    let acknowledged: std::sync::RwLock<Vec<(u64, usize, usize)>> = Default::default();
    let done = std::sync::atomic::AtomicBool::new(false);
    let checks = AtomicU64::new(0);
    std::thread::scope(|s| {
        for seed in 0..2 {
            let (file, acknowledged, done, checks) = (&file, &acknowledged, &done, &checks);
            s.spawn(move || {
                let mut rng = fastrand::Rng::with_seed(seed);
                let cursor = BlockCursor::new(file);
                while !done.load(std::sync::atomic::Ordering::Acquire) {
                    let pick = {
                        let acknowledged = acknowledged.read().unwrap();
                        if acknowledged.is_empty() {
                            continue;
                        }
                        acknowledged[rng.usize(..acknowledged.len())]
                    };
                    let (offset, i, len) = pick;
                    assert_eq!(cursor.read_blob(offset).unwrap(), blob(i, len), "blob {i}");
                    checks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
        let mut rng = fastrand::Rng::with_seed(7);
        for i in 0..1500 {
            let len = match rng.u8(..4) {
                0 => rng.usize(..128),
                1 => rng.usize(128..PAGE_SZ),
                2 => rng.usize(..3 * PAGE_SZ),
                _ => PAGE_SZ - 4,
            };
            let offset = file.write_blob(&blob(i, len)).unwrap();
            acknowledged.write().unwrap().push((offset, i, len));
            if i % 100 == 0 {
                cache.drop_unpinned();
            }
        }
        done.store(true, std::sync::atomic::Ordering::Release);
    });
    assert!(checks.into_inner() > 0);
}

#[test]
fn concurrent_writers_never_interleave_their_blobs() {
    // Two writers append blobs of every size class at once: blobs that fit the tail take only
    // its lock, blobs that seal a block claim the tail. Every acknowledged blob reads back
    // whole, and no two overlap.
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(4);
    let file = EphemeralFile::create(dir.path(), cache).unwrap();
    // Both start together, so that they overlap even on a busy machine.
    let start = std::sync::Barrier::new(2);
    let written: Vec<Vec<(u64, usize, usize)>> = std::thread::scope(|s| {
        let writers: Vec<_> = (0..2usize)
            .map(|w| {
                let (file, start) = (&file, &start);
                s.spawn(move || {
                    start.wait();
                    let mut rng = fastrand::Rng::with_seed(w as u64);
                    (0..1500)
                        .map(|n| {
                            let i = w * 100_000 + n;
                            let len = match rng.u8(..4) {
                                0 | 1 => rng.usize(..128),
                                2 => rng.usize(128..PAGE_SZ),
                                _ => rng.usize(..3 * PAGE_SZ),
                            };
                            (file.write_blob(&blob(i, len)).unwrap(), i, len)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        writers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let mut all: Vec<_> = written.into_iter().flatten().collect();
    all.sort_unstable();
    let cursor = BlockCursor::new(&file);
    let mut end = 0;
    for &(offset, i, len) in &all {
        assert!(
            offset >= end,
            "blob {i} at {offset} overlaps the one before, ending at {end}"
        );
        assert_eq!(cursor.read_blob(offset).unwrap(), blob(i, len), "blob {i}");
        end = offset + (BlobHeader::new(len).unwrap().as_bytes().len() + len) as u64;
    }
    assert_eq!(end, file.len());
}
