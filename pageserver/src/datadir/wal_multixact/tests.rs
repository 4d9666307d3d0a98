//! Multixacts on their SLRU pages as PostgreSQL's `RecordNewMultiXact` writes them, and the
//! segments a truncation removes.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use pageserver_api::datadir::{file_chunk_key, file_dir_key, EntryKind, FileDirectory, FileEntry};
use pageserver_api::{reconstruct_page, Key, Value};

use super::*;

fn words(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// The timeline's values after `main` of `info`, over `stored`.
fn apply(files: &mut Files, stored: &mut HashMap<Key, Bytes>, info: u8, main: &[u8]) {
    let snapshot = stored.clone();
    let mut read = |key: Key| Ok(snapshot.get(&key).cloned());
    let mut changes = FileChanges::default();
    multixact_record(files, info, main, &mut read, &mut changes).unwrap();
    let mut out = BTreeMap::new();
    files.versions(changes, &mut out);
    for (key, value) in out {
        let records = match stored.get(&key) {
            Some(old) => vec![(2u64, value), (1, Value::Image(old.clone()))],
            None => vec![(2u64, value)],
        };
        let page = reconstruct_page(&records, 1 << 20).unwrap().unwrap();
        stored.insert(key, page);
    }
    files.clear_cache();
}

fn entry(dir: &HashMap<Key, Bytes>, path: &str) -> Option<FileEntry> {
    FileDirectory::decode(&dir[&file_dir_key()])
        .unwrap()
        .get(path)
        .cloned()
}

#[test]
fn a_multixact_lands_on_its_offset_and_member_pages() {
    let dir = FileDirectory {
        next_id: 1,
        entries: vec![FileEntry {
            path: "pg_multixact/offsets".into(),
            kind: EntryKind::Directory,
            mode: 0o700,
            mtime: 5,
            size: 0,
            id: 0,
        }],
    };
    let mut stored = HashMap::from([(file_dir_key(), Bytes::from(dir.encode()))]);
    let mut files = Files::default();
    apply(
        &mut files,
        &mut stored,
        XLOG_MULTIXACT_ZERO_OFF_PAGE,
        &words(&[0]),
    );
    apply(
        &mut files,
        &mut stored,
        XLOG_MULTIXACT_ZERO_MEM_PAGE,
        &words(&[0]),
    );
    // Multixact 7 at member offset 5: members 5 (group 1, slot 1) and 6 (slot 2).
    let main = words(&[7, 5, 2, 1000, 1, 1001, 5]);
    apply(&mut files, &mut stored, XLOG_MULTIXACT_CREATE_ID, &main);

    let offsets = entry(&stored, "pg_multixact/offsets/0000").unwrap();
    assert_eq!((offsets.size, offsets.mtime), (8192, 5));
    let page = &stored[&file_chunk_key(offsets.id, 0)];
    assert_eq!(&page[28..32], &5u32.to_le_bytes());
    assert_eq!(
        &page[32..36],
        &7u32.to_le_bytes(),
        "the next one starts where it ends"
    );
    let members = entry(&stored, "pg_multixact/members/0000").unwrap();
    let page = &stored[&file_chunk_key(members.id, 0)];
    // Group 1 starts at byte 20: flags, then four xids.
    assert_eq!(&page[20..24], &[0, 1, 5, 0]);
    assert_eq!(&page[28..32], &1000u32.to_le_bytes());
    assert_eq!(&page[32..36], &1001u32.to_le_bytes());

    // Members past a page's end: member 1636 is the first of page 1, a new page of the file.
    apply(
        &mut files,
        &mut stored,
        XLOG_MULTIXACT_CREATE_ID,
        &words(&[8, 1636, 1, 2000, 2]),
    );
    let members = entry(&stored, "pg_multixact/members/0000").unwrap();
    assert_eq!(members.size, 2 * 8192);
    assert_eq!(
        &stored[&file_chunk_key(members.id, 1)][4..8],
        &2000u32.to_le_bytes()
    );
}

#[test]
fn truncation_removes_the_segments_before_the_new_oldest() {
    let mut stored = HashMap::from([(
        file_dir_key(),
        Bytes::from(FileDirectory::default().encode()),
    )]);
    let mut files = Files::default();
    // Offsets segments 0 and 1 (pages 0 and 32), members segments 0 to 2.
    for page in [0, 32] {
        apply(
            &mut files,
            &mut stored,
            XLOG_MULTIXACT_ZERO_OFF_PAGE,
            &words(&[page]),
        );
    }
    for page in [0, 32, 64] {
        apply(
            &mut files,
            &mut stored,
            XLOG_MULTIXACT_ZERO_MEM_PAGE,
            &words(&[page]),
        );
    }
    // The new oldest multixact is on offsets page 33 (segment 1), its members on page 70
    // (segment 2).
    let new_oldest = 33 * OFFSETS_PER_PAGE + 1;
    let new_oldest_member = 70 * MEMBERS_PER_PAGE;
    let main = words(&[5, 1, new_oldest, 0, new_oldest_member]);
    apply(&mut files, &mut stored, XLOG_MULTIXACT_TRUNCATE_ID, &main);
    for (path, kept) in [
        ("pg_multixact/offsets/0000", false),
        ("pg_multixact/offsets/0001", true),
        ("pg_multixact/members/0000", false),
        ("pg_multixact/members/0001", false),
        ("pg_multixact/members/0002", true),
    ] {
        assert_eq!(entry(&stored, path).is_some(), kept, "{path}");
    }
}

#[test]
fn damaged_records_are_refused() {
    let stored = HashMap::from([(
        file_dir_key(),
        Bytes::from(FileDirectory::default().encode()),
    )]);
    let mut read = |key: Key| Ok(stored.get(&key).cloned());
    for (info, main) in [
        (XLOG_MULTIXACT_CREATE_ID, words(&[7, 5, 3, 1000, 1])),
        (XLOG_MULTIXACT_CREATE_ID, words(&[7, 5, u32::MAX])),
        (XLOG_MULTIXACT_ZERO_MEM_PAGE, words(&[u32::MAX])),
        (XLOG_MULTIXACT_TRUNCATE_ID, words(&[1, 2])),
    ] {
        let err = multixact_record(
            &mut Files::default(),
            info,
            &main,
            &mut read,
            &mut FileChanges::default(),
        )
        .unwrap_err();
        assert!(!err.is_empty());
    }
}
