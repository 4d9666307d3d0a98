//! Commit statuses as SLRU pages: the bits PostgreSQL's `TransactionIdSetStatusBit` sets, the
//! files the directory gains and loses, and what each record costs.

use super::*;
use pageserver_api::reconstruct_page;

/// A directory with `pg_xact/` and its first segment of `pages` pages (id 7), and the pages.
fn timeline(pages: u32) -> HashMap<Key, Bytes> {
    let dir = FileDirectory {
        next_id: 8,
        entries: vec![
            FileEntry {
                path: "pg_xact".into(),
                kind: EntryKind::Directory,
                mode: 0o700,
                mtime: 1234,
                size: 0,
                id: 0,
            },
            FileEntry {
                path: "pg_xact/0000".into(),
                kind: EntryKind::File,
                mode: 0o600,
                mtime: 1234,
                size: u64::from(pages) * FILE_CHUNK_SIZE as u64,
                id: 7,
            },
        ],
    };
    let mut stored = HashMap::from([(file_dir_key(), Bytes::from(dir.encode()))]);
    for page in 0..pages {
        stored.insert(
            file_chunk_key(7, page),
            Bytes::from(vec![0u8; FILE_CHUNK_SIZE]),
        );
    }
    stored
}

/// One record's changes made with `change`, as versions.
fn record(
    status: &mut Files,
    stored: &HashMap<Key, Bytes>,
    change: impl FnOnce(&mut Files, &mut ReadCurrent<'_>, &mut FileChanges),
) -> BTreeMap<Key, Value> {
    let mut read = |key: Key| Ok(stored.get(&key).cloned());
    let mut changes = FileChanges::default();
    change(status, &mut read, &mut changes);
    let mut out = BTreeMap::new();
    status.versions(changes, &mut out);
    out
}

/// A page after `value` over `base`.
fn apply(base: &Bytes, value: &Value) -> Vec<u8> {
    let records = [(2u64, value.clone()), (1, Value::Image(base.clone()))];
    reconstruct_page(&records, 1 << 20)
        .unwrap()
        .unwrap()
        .to_vec()
}

fn status_of(page: &[u8], xid: u32) -> u8 {
    let in_page = xid % XACTS_PER_PAGE;
    (page[(in_page / 4) as usize] >> ((in_page % 4) * 2)) & 0x03
}

#[test]
fn a_commit_writes_the_bits_of_its_transaction_and_subtransactions() {
    let stored = timeline(1);
    let mut status = Files::default();
    let out = record(&mut status, &stored, |s, read, changes| {
        s.set_xact_status([1000, 1001, 1003], STATUS_COMMITTED, read, changes)
            .unwrap();
    });
    let key = file_chunk_key(7, 0);
    assert_eq!(out.len(), 1, "{out:?}");
    let Value::Delta {
        will_init: false,
        patches,
    } = &out[&key]
    else {
        panic!("{out:?}");
    };
    // 1000 and 1001 share a byte, 1003 is in the next: one run of two bytes.
    assert_eq!(patches.len(), 1);
    assert_eq!(patches[0].data.len(), 1);
    let page = apply(&stored[&key], &out[&key]);
    for (xid, expected) in [(999, 0), (1000, 1), (1001, 1), (1002, 0), (1003, 1)] {
        assert_eq!(status_of(&page, xid), expected, "xid {xid}");
    }

    // An abort next to them changes its own bits only, on the page as the commit left it.
    let out = record(&mut status, &stored, |s, read, changes| {
        s.set_xact_status([1002], STATUS_ABORTED, read, changes)
            .unwrap();
    });
    let page = apply(&Bytes::from(page), &out[&key]);
    for (xid, expected) in [(1000, 1), (1001, 1), (1002, 2), (1003, 1)] {
        assert_eq!(status_of(&page, xid), expected, "xid {xid}");
    }
}

#[test]
fn a_new_page_and_a_new_segment_enter_the_file_directory() {
    let stored = timeline(1);
    let mut status = Files::default();
    // Page 1 of segment 0: the file grows.
    let out = record(&mut status, &stored, |s, read, changes| {
        s.zero_xact_page(1, read, changes).unwrap();
    });
    assert_eq!(
        out[&file_chunk_key(7, 1)],
        Value::Delta {
            will_init: true,
            patches: vec![]
        }
    );
    let Value::Image(dir) = &out[&file_dir_key()] else {
        panic!("{out:?}");
    };
    let dir = FileDirectory::decode(dir).unwrap();
    assert_eq!(
        dir.get("pg_xact/0000").unwrap().size,
        2 * FILE_CHUNK_SIZE as u64
    );

    // Page 32: segment 0001, a new file with the next id.
    let out = record(&mut status, &stored, |s, read, changes| {
        s.zero_xact_page(32, read, changes).unwrap();
        s.set_xact_status([32 * XACTS_PER_PAGE + 5], STATUS_COMMITTED, read, changes)
            .unwrap();
    });
    let Value::Image(dir) = &out[&file_dir_key()] else {
        panic!("{out:?}");
    };
    let dir = FileDirectory::decode(dir).unwrap();
    let segment = dir.get("pg_xact/0001").unwrap();
    assert_eq!((segment.id, segment.size, segment.mode), (8, 8192, 0o600));
    assert_eq!(dir.next_id, 9);
    let Value::Delta {
        will_init: true,
        patches,
    } = &out[&file_chunk_key(8, 0)]
    else {
        panic!("{out:?}");
    };
    assert_eq!(patches.len(), 1, "the commit's byte, on the new page");

    // A status on a page that exists already changes no directory.
    let out = record(&mut status, &stored, |s, read, changes| {
        s.set_xact_status([7], STATUS_COMMITTED, read, changes)
            .unwrap();
    });
    assert!(!out.contains_key(&file_dir_key()));
}

#[test]
fn truncation_removes_the_segments_wholly_before_the_page() {
    let mut stored = timeline(1);
    let mut status = Files::default();
    for page in [32, 64] {
        let out = record(&mut status, &stored, |s, read, changes| {
            s.zero_xact_page(page, read, changes).unwrap();
        });
        stored.insert(
            file_dir_key(),
            match &out[&file_dir_key()] {
                Value::Image(dir) => dir.clone(),
                other => panic!("{other:?}"),
            },
        );
    }
    // Page 40 is in segment 0001: segment 0000 goes, 0001 and 0002 stay.
    let out = record(&mut status, &stored, |s, read, changes| {
        s.truncate_xact(40, read, changes).unwrap();
    });
    let Value::Image(dir) = &out[&file_dir_key()] else {
        panic!("{out:?}");
    };
    let dir = FileDirectory::decode(dir).unwrap();
    let segments: Vec<&str> = dir
        .entries
        .iter()
        .map(|e| e.path.as_str())
        .filter(|p| p.starts_with("pg_xact/"))
        .collect();
    assert_eq!(segments, ["pg_xact/0001", "pg_xact/0002"]);
    assert!(dir.get("pg_xact").is_some(), "the directory itself stays");
}

#[test]
fn no_page_with_a_change_waiting_to_be_put_leaves_the_cache() {
    let stored = timeline(1);
    let mut files = Files::default();
    // Two transactions in one byte of page 0, with pages enough between them to pass the
    // cache's bound: the second change is made over the first, not over the stored page.
    record(&mut files, &stored, |s, read, changes| {
        s.set_xact_status([1000], STATUS_COMMITTED, read, changes)
            .unwrap();
    });
    for page in 1..=(CACHED_PAGES as u32 + 5) {
        record(&mut files, &stored, |s, read, changes| {
            s.zero_xact_page(page, read, changes).unwrap();
        });
    }
    assert!(files.cache_full());
    let out = record(&mut files, &stored, |s, read, changes| {
        s.set_xact_status([1001], STATUS_COMMITTED, read, changes)
            .unwrap();
    });
    let page = apply(&stored[&file_chunk_key(7, 0)], &out[&file_chunk_key(7, 0)]);
    assert_eq!((status_of(&page, 1000), status_of(&page, 1001)), (1, 1));
    // Once what it made is put, the cache starts again.
    files.clear_cache();
    assert!(!files.cache_full());
}

#[test]
fn truncation_after_wraparound_compares_pages_as_postgres_does() {
    // Segment 0FFF holds the last transaction ids before the wrap, 0000 the first after it.
    let mut dir = FileDirectory::decode(&timeline(1)[&file_dir_key()]).unwrap();
    dir.entries.push(FileEntry {
        path: "pg_xact/0FFF".into(),
        kind: EntryKind::File,
        mode: 0o600,
        mtime: 0,
        size: 8192,
        id: 8,
    });
    dir.next_id = 9;
    let stored = HashMap::from([(file_dir_key(), Bytes::from(dir.encode()))]);
    let out = record(&mut Files::default(), &stored, |s, read, changes| {
        s.truncate_xact(16, read, changes).unwrap();
    });
    let Value::Image(dir) = &out[&file_dir_key()] else {
        panic!("{out:?}");
    };
    let dir = FileDirectory::decode(dir).unwrap();
    assert!(dir.get("pg_xact/0FFF").is_none(), "before the wrap: older");
    assert!(
        dir.get("pg_xact/0000").is_some(),
        "after the wrap, the cutoff's own segment"
    );
    // A page past the last one is refused.
    let mut read = |key: Key| Ok(stored.get(&key).cloned());
    let err = Files::default()
        .zero_xact_page(MAX_PAGE + 1, &mut read, &mut FileChanges::default())
        .unwrap_err();
    assert!(err.contains("the last is"), "{err}");
}
