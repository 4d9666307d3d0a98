//! The table of open files against real files: descriptors taken and reopened, pinned durable
//! files, the bound, and many threads at once.

use std::path::PathBuf;
use std::sync::Arc;

use super::open_files::OpenFiles;
use super::*;

/// `n` files of 4 KiB, file `i` filled with byte `i`.
fn files(dir: &Path, n: usize) -> Vec<PathBuf> {
    (0..n)
        .map(|i| {
            let path = dir.join(format!("f{i}"));
            std::fs::write(&path, vec![i as u8; 4096]).unwrap();
            path
        })
        .collect()
}

fn read_byte(file: &VirtualFile, offset: u64) -> u8 {
    let mut b = [0u8; 1];
    file.read_exact_at(&mut b, offset).unwrap();
    b[0]
}

#[test]
fn more_files_than_descriptors_all_read_right() {
    let dir = tempfile::tempdir().unwrap();
    let table = Arc::new(OpenFiles::new(2));
    let paths = files(dir.path(), 10);
    let opened: Vec<VirtualFile> = paths
        .iter()
        .map(|p| VirtualFile::open_in(&table, p).unwrap())
        .collect();
    for round in 0..3 {
        for (i, f) in opened.iter().enumerate() {
            assert_eq!(read_byte(f, 100 * round), i as u8);
            assert!(descriptors_under(dir.path()) <= 2);
        }
    }
    drop(opened);
    assert_eq!(
        descriptors_under(dir.path()),
        0,
        "a dropped file closes its descriptor"
    );
}

#[test]
fn a_taken_descriptor_is_reopened_by_path_and_a_durable_one_never_is() {
    let dir = tempfile::tempdir().unwrap();
    let table = Arc::new(OpenFiles::new(2));
    let paths = files(dir.path(), 3);
    let durable = VirtualFile::create_in(&table, &dir.path().join("layer.___temp"), true).unwrap();
    durable.write_all_at(b"durable", 0).unwrap();
    // Gone by name: only its open descriptor still reaches it.
    std::fs::remove_file(durable.path()).unwrap();

    let plain = VirtualFile::open_in(&table, &paths[0]).unwrap();
    assert_eq!(read_byte(&plain, 0), 0);
    // Another file takes the one free slot: `plain` loses its descriptor, `durable` keeps its.
    let other = VirtualFile::open_in(&table, &paths[1]).unwrap();
    assert_eq!(read_byte(&other, 0), 1);
    durable.write_all_at(b"more", 7).unwrap();
    durable.sync_all().unwrap();
    let mut back = [0u8; 11];
    durable.read_exact_at(&mut back, 0).unwrap();
    assert_eq!(&back, b"durablemore");
    // `plain` reopens by path on its next use: with the path gone, that fails by name.
    std::fs::remove_file(&paths[0]).unwrap();
    let err = plain.read_exact_at(&mut [0u8; 1], 0).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::NotFound);
}

#[test]
fn at_most_half_the_slots_are_pinned_and_reads_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let table = Arc::new(OpenFiles::new(4));
    let durable = |name: &str| VirtualFile::create_in(&table, &dir.path().join(name), true);
    let first = durable("w0").unwrap();
    let _second = durable("w1").unwrap();
    // A third file written for durability waits for a pin...
    let waiter = std::thread::spawn({
        let table = table.clone();
        let path = dir.path().join("w2");
        move || VirtualFile::create_in(&table, &path, true).map(|_| ())
    });
    // ...while reads of any number of files go on in the slots left.
    let paths = files(dir.path(), 6);
    for _ in 0..3 {
        for (i, p) in paths.iter().enumerate() {
            assert_eq!(
                read_byte(&VirtualFile::open_in(&table, p).unwrap(), 0),
                i as u8
            );
        }
    }
    assert!(!waiter.is_finished());
    drop(first);
    waiter.join().unwrap().unwrap();
}

#[test]
fn a_table_of_one_pinned_slot_refuses_other_files_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let table = Arc::new(OpenFiles::new(1));
    let pinned = VirtualFile::create_in(&table, &dir.path().join("w"), true).unwrap();
    let paths = files(dir.path(), 1);
    let err = VirtualFile::open_in(&table, &paths[0]).unwrap_err();
    assert!(err.to_string().contains("no file descriptor free"), "{err}");
    drop(pinned);
    let f = VirtualFile::open_in(&table, &paths[0]).unwrap();
    assert_eq!(read_byte(&f, 0), 0);
}

/// Descriptors of this process open on files under `dir`: what the table holds for a test,
/// whatever other tests open meanwhile.
fn descriptors_under(dir: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.starts_with(dir))
        .count()
}

#[test]
fn a_created_file_reopens_for_writing_without_truncation() {
    let dir = tempfile::tempdir().unwrap();
    let table = Arc::new(OpenFiles::new(1));
    let scratch = VirtualFile::create_in(&table, &dir.path().join("ephemeral-1"), false).unwrap();
    scratch.write_all_at(&[5u8; 100], 0).unwrap();
    let paths = files(dir.path(), 1);
    let reader = VirtualFile::open_in(&table, &paths[0]).unwrap();
    assert_eq!(read_byte(&reader, 0), 0);
    // Reopened read-write: earlier bytes are kept, later writes land.
    scratch.write_all_at(&[6u8; 100], 100).unwrap();
    let mut all = [0u8; 200];
    scratch.read_exact_at(&mut all, 0).unwrap();
    assert!(all[..100].iter().all(|b| *b == 5) && all[100..].iter().all(|b| *b == 6));
    // Creating a file that exists is refused.
    assert!(VirtualFile::create_in(&table, &paths[0], false).is_err());
}

#[test]
fn many_threads_over_few_descriptors_read_right() {
    let dir = tempfile::tempdir().unwrap();
    let table = Arc::new(OpenFiles::new(3));
    let paths = files(dir.path(), 20);
    let opened: Arc<Vec<VirtualFile>> = Arc::new(
        paths
            .iter()
            .map(|p| VirtualFile::open_in(&table, p).unwrap())
            .collect(),
    );
    let (done, finished) = std::sync::mpsc::channel();
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let opened = opened.clone();
            let done = done.clone();
            std::thread::spawn(move || {
                let mut x = t * 7919 + 1;
                for _ in 0..2000 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let i = (x >> 33) as usize % opened.len();
                    assert_eq!(read_byte(&opened[i], (x >> 20) % 4096), i as u8);
                }
                done.send(()).unwrap();
            })
        })
        .collect();
    // A deadlock between threads that take each other's slots fails the test rather than hang
    // it (a panicking thread drops its sender, which ends the wait too).
    drop(done);
    for _ in 0..threads.len() {
        finished
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("every reader finishes: none may wait forever for a slot");
    }
    for t in threads {
        t.join().unwrap();
    }
    assert!(descriptors_under(dir.path()) <= 3);
    // Threads that missed on the same file at once each opened a descriptor; the one left
    // unclaimed was closed then, so dropping the files closes everything.
    drop(Arc::try_unwrap(opened).unwrap());
    assert_eq!(descriptors_under(dir.path()), 0);
}

/// Starting writeback is a hint: on any range (past the end too) it leaves the file as written,
/// and where the system can do it, it says so.
#[test]
fn start_writeback_leaves_the_file_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    let data: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(&path, &data).unwrap();
    let file = VirtualFile::open_in(&Arc::new(OpenFiles::new(2)), &path).unwrap();
    let started = file.start_writeback(0, 1 << 19).unwrap();
    file.start_writeback(1 << 19, 1 << 30).unwrap();
    if cfg!(target_os = "linux") {
        assert!(
            started,
            "sync_file_range is supported on the test's file system"
        );
    }
    file.sync_all().unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), data);
}

#[test]
fn vectored_writes_land_like_the_same_bytes_written_in_one_piece() {
    let dir = tempfile::tempdir().unwrap();
    // Buffers of uneven sizes, empty ones among them (first and last too), and more of them
    // than one system call takes.
    let sizes: Vec<usize> = (0..150).map(|i| [0, 1, 8192, 4095, 0, 17][i % 6]).collect();
    let bufs: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| vec![i as u8; n])
        .collect();
    let slices: Vec<&[u8]> = bufs.iter().map(Vec::as_slice).collect();
    let expected: Vec<u8> = bufs.concat();
    let table = Arc::new(OpenFiles::new(4));
    let path = dir.path().join("vectored");
    let file = VirtualFile::create_in(&table, &path, false).unwrap();
    file.write_all_vectored_at(&slices, 100).unwrap();
    let mut read = vec![0u8; expected.len()];
    file.read_exact_at(&mut read, 100).unwrap();
    assert!(read == expected, "the bytes read back differ");
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        100 + expected.len() as u64
    );
    // Nothing to write at all.
    file.write_all_vectored_at(&[&[], &[]], 0).unwrap();
    file.write_all_vectored_at(&[], 0).unwrap();
}
