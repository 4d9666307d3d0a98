use proptest::prelude::*;

use super::*;

fn entry(path: &str, kind: EntryKind, size: u64, id: u32) -> FileEntry {
    FileEntry {
        path: path.to_string(),
        kind,
        mode: 0o600,
        mtime: 1_700_000_000,
        size,
        id,
    }
}

#[test]
fn keys_of_each_kind_sort_apart_and_blocks_stay_rel_block_keys() {
    let rel = RelTag {
        spcnode: DEFAULTTABLESPACE_OID,
        dbnode: 5,
        relnode: 16384,
        forknum: 0,
    };
    let block = rel.block_key(7);
    assert!(is_rel_block_key(&block));
    assert_eq!(block, Key::rel_block(1663, 5, 16384, 0, 7));
    // Every block of every relation sorts before every metadata key: a scan of relation
    // blocks never meets one.
    for meta in [
        rel.size_key(),
        rel_dir_key(1663, 5),
        file_chunk_key(1, 0),
        file_dir_key(),
        snapshot_list_key(),
    ] {
        assert!(!is_rel_block_key(&meta));
        assert!(Key::rel_block(u32::MAX, u32::MAX, u32::MAX, u8::MAX, u32::MAX) < meta);
    }
    assert!(rel.size_key() < rel_dir_key(0, 0));
    assert!(rel_dir_key(u32::MAX, u32::MAX) < file_chunk_key(0, 0));
    assert!(file_chunk_key(u32::MAX, u32::MAX) < file_dir_key());
    assert!(file_dir_key() < snapshot_list_key());
}

#[test]
fn relation_file_names_follow_postgres() {
    let mut rel = RelTag {
        spcnode: 1663,
        dbnode: 1,
        relnode: 1259,
        forknum: 0,
    };
    assert_eq!(rel.file_name(0), "1259");
    assert_eq!(rel.file_name(2), "1259.2");
    rel.forknum = 1;
    assert_eq!(rel.file_name(0), "1259_fsm");
    rel.forknum = 2;
    assert_eq!(rel.file_name(1), "1259_vm.1");
    rel.forknum = 3;
    assert_eq!(rel.file_name(0), "1259_init");
    for (suffix, fork) in [("", 0), ("_fsm", 1), ("_vm", 2), ("_init", 3)] {
        assert_eq!(fork_number(suffix), Some(fork));
    }
    assert_eq!(fork_number("_xyz"), None);
}

#[test]
fn the_formats_are_pinned_byte_for_byte() {
    assert_eq!(encode_rel_size(0x01020304), [1, 2, 3, 4]);
    assert_eq!(
        encode_rel_dir(&[(1, 0), (1, 2)]),
        [1, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 1, 2]
    );
    let list = SnapshotList {
        system_identifier: 7,
        snapshots: vec![
            Snapshot::imported(Lsn(0x10), SnapshotKind::Backup),
            Snapshot {
                lsn: Lsn(0x30),
                kind: SnapshotKind::Stopped,
                wal_from: Lsn(0x20),
            },
        ],
    };
    assert_eq!(
        list.encode(),
        [
            1, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0x10, 1, 0, 0, 0, 0, 0, 0,
            0, 0x30, 2, 0, 0, 0, 0, 0, 0, 0, 0x20
        ]
    );
    assert_eq!(SnapshotList::decode(&list.encode()).unwrap(), list);
    // A background snapshot's WAL starts below it, never at or above.
    let mut bad = list.encode();
    *bad.last_mut().unwrap() = 0x30;
    assert!(SnapshotList::decode(&bad).is_err());
    let dir = FileDirectory {
        next_id: 2,
        entries: vec![entry("PG_VERSION", EntryKind::File, 3, 1)],
    };
    let mut expected = vec![1, 0, 0, 0, 2, 0, 0, 0, 1, 0, 10];
    expected.extend_from_slice(b"PG_VERSION");
    expected.push(0);
    expected.extend_from_slice(&0o600u32.to_be_bytes());
    expected.extend_from_slice(&1_700_000_000u64.to_be_bytes());
    expected.extend_from_slice(&3u64.to_be_bytes());
    expected.extend_from_slice(&1u32.to_be_bytes());
    assert_eq!(dir.encode(), expected);
}

#[test]
fn decoders_refuse_what_is_not_exactly_their_format() {
    assert!(decode_rel_size(&[0, 0, 1]).is_err());
    assert!(decode_rel_dir(&[2, 0, 0, 0, 0]).is_err(), "unknown version");
    assert!(
        decode_rel_dir(&[1, 0xff, 0xff, 0xff, 0xff]).is_err(),
        "huge count"
    );
    assert!(
        decode_rel_dir(&encode_rel_dir(&[(2, 0), (1, 0)])).is_err(),
        "unsorted"
    );
    assert!(
        decode_rel_dir(&encode_rel_dir(&[(1, 0), (1, 0)])).is_err(),
        "duplicate"
    );
    let mut trailing = encode_rel_dir(&[(1, 0)]);
    trailing.push(0);
    assert!(decode_rel_dir(&trailing).is_err());

    let bad_dirs = [
        // a file whose id is not below next_id
        FileDirectory {
            next_id: 1,
            entries: vec![entry("a", EntryKind::File, 1, 1)],
        },
        // a directory with a size
        FileDirectory {
            next_id: 1,
            entries: vec![entry("a", EntryKind::Directory, 1, 0)],
        },
        // unsorted
        FileDirectory {
            next_id: 5,
            entries: vec![
                entry("b", EntryKind::File, 1, 1),
                entry("a", EntryKind::File, 1, 2),
            ],
        },
    ];
    for dir in bad_dirs {
        assert!(FileDirectory::decode(&dir.encode()).is_err(), "{dir:?}");
    }
    let unordered = SnapshotList {
        system_identifier: 1,
        snapshots: vec![
            Snapshot::imported(Lsn(5), SnapshotKind::Stopped),
            Snapshot::imported(Lsn(5), SnapshotKind::Stopped),
        ],
    };
    assert!(SnapshotList::decode(&unordered.encode()).is_err());
}

#[test]
fn a_snapshot_list_answers_the_newest_snapshot_at_or_below_an_lsn() {
    let list = SnapshotList {
        system_identifier: 1,
        snapshots: [10, 20, 30]
            .map(|lsn| Snapshot::imported(Lsn(lsn), SnapshotKind::Stopped))
            .to_vec(),
    };
    assert_eq!(list.at(Lsn(9)), None);
    assert_eq!(list.at(Lsn(10)).unwrap().lsn, Lsn(10));
    assert_eq!(list.at(Lsn(29)).unwrap().lsn, Lsn(20));
    assert_eq!(list.at(Lsn(u64::MAX)).unwrap().lsn, Lsn(30));
}

fn arb_path() -> impl Strategy<Value = String> {
    "[a-z_0-9]{1,8}(/[a-z_0-9.]{1,12}){0,3}"
}

proptest! {
    #[test]
    fn file_directories_round_trip(paths in proptest::collection::btree_set(arb_path(), 0..40),
                                   sizes in proptest::collection::vec(0u64..1 << 40, 40)) {
        let entries: Vec<FileEntry> = paths
            .iter()
            .enumerate()
            .map(|(i, p)| if i % 3 == 0 {
                entry(p, EntryKind::Directory, 0, 0)
            } else {
                entry(p, EntryKind::File, sizes[i], i as u32 + 1)
            })
            .collect();
        let dir = FileDirectory { next_id: 100, entries };
        prop_assert_eq!(FileDirectory::decode(&dir.encode()).unwrap(), dir);
    }

    #[test]
    fn decoders_never_panic_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = FileDirectory::decode(&bytes);
        let _ = SnapshotList::decode(&bytes);
        let _ = decode_rel_dir(&bytes);
        let _ = decode_rel_size(&bytes);
    }

    #[test]
    fn truncating_a_valid_value_is_always_refused(cut in 0usize..60) {
        let dir = FileDirectory {
            next_id: 3,
            entries: vec![entry("global/pg_control", EntryKind::File, 8192, 1),
                          entry("pg_wal", EntryKind::Directory, 0, 0)],
        };
        let bytes = dir.encode();
        let cut = cut.min(bytes.len() - 1);
        prop_assert!(FileDirectory::decode(&bytes[..cut]).is_err());
    }
}
