//! Records built byte by byte as PostgreSQL lays them out, and the versions they become.

use super::*;
use postgres_wal::record::{BKPIMAGE_APPLY, RM_XACT_ID};
use postgres_wal::synthetic::WalBuilder;
use postgres_wal::WalDecoder;

const SEG: u32 = 1 << 24;
const REL: (u32, u32, u32) = (1663, 5, 16384);

fn heap(fork: u8) -> RelTag {
    RelTag {
        spcnode: REL.0,
        dbnode: REL.1,
        relnode: REL.2,
        forknum: fork,
    }
}

/// A block reference's header (and, after every header, what `tail` holds: its image and
/// data), for `REL`.
struct Block {
    id: u8,
    fork: u8,
    block: u32,
    will_init: bool,
    /// An uncompressed image without a hole, and its bimg_info.
    image: Option<(Vec<u8>, u8)>,
    data: Vec<u8>,
}

fn parts(blocks: &[Block], main: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in blocks {
        let mut flags = b.fork;
        if b.image.is_some() {
            flags |= 0x10;
        }
        if !b.data.is_empty() {
            flags |= 0x20;
        }
        if b.will_init {
            flags |= 0x40;
        }
        out.extend_from_slice(&[b.id, flags]);
        out.extend_from_slice(&(b.data.len() as u16).to_le_bytes());
        if let Some((page, info)) = &b.image {
            out.extend_from_slice(&(page.len() as u16).to_le_bytes());
            out.extend_from_slice(&0u16.to_le_bytes());
            out.push(*info);
        }
        for v in [REL.0, REL.1, REL.2, b.block] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    if main.len() >= 256 {
        out.push(254);
        out.extend_from_slice(&(main.len() as u32).to_le_bytes());
    } else if !main.is_empty() {
        out.extend_from_slice(&[255, main.len() as u8]);
    }
    for b in blocks {
        if let Some((page, _)) = &b.image {
            out.extend_from_slice(page);
        }
        out.extend_from_slice(&b.data);
    }
    out.extend_from_slice(main);
    out
}

fn decoded(rmid: u8, info: u8, parts: &[u8]) -> DecodedRecord {
    let mut wal = WalBuilder::new(Lsn(SEG as u64), SEG);
    wal.record(rmid, info, 7, parts);
    let mut decoder = WalDecoder::new(Lsn(SEG as u64), SEG);
    decoder.feed(wal.bytes());
    decoder.next_record().unwrap().unwrap()
}

/// A heap insert into block `block` of `REL`'s main fork, without an image.
fn heap_insert(block: u32, will_init: bool) -> DecodedRecord {
    let block = Block {
        id: 0,
        fork: 0,
        block,
        will_init,
        image: None,
        data: vec![1, 2, 3],
    };
    decoded(RM_HEAP_ID, 0x00, &parts(&[block], &[1, 0, 0]))
}

/// An `XLOG_FPI` record with `page` as block 0 of `REL`, uncompressed, with `bimg_info`.
fn full_page_image(page: &[u8], bimg_info: u8) -> DecodedRecord {
    let block = Block {
        id: 0,
        fork: 0,
        block: 0,
        will_init: false,
        image: Some((page.to_vec(), bimg_info)),
        data: vec![],
    };
    decoded(0, 0xB0, &parts(&[block], &[]))
}

/// A timeline's file directory with `pg_xact/0000` (id 1), one page of zeros.
fn with_xact_page() -> HashMap<Key, Bytes> {
    use pageserver_api::datadir::{
        file_chunk_key, file_dir_key, EntryKind, FileDirectory, FileEntry,
    };
    let dir = FileDirectory {
        next_id: 2,
        entries: vec![FileEntry {
            path: "pg_xact/0000".into(),
            kind: EntryKind::File,
            mode: 0o600,
            mtime: 0,
            size: 8192,
            id: 1,
        }],
    };
    HashMap::from([
        (file_dir_key(), Bytes::from(dir.encode())),
        (file_chunk_key(1, 0), Bytes::from(vec![0u8; 8192])),
    ])
}

/// Why `record` makes no versions over a timeline holding `stored`.
fn error_of(record: &DecodedRecord, stored: &HashMap<Key, Bytes>) -> String {
    WalVersions::new()
        .record(
            record,
            &mut |k| Ok(stored.get(&k).cloned()),
            &mut Vec::new(),
        )
        .unwrap_err()
}

/// The versions of `record` over a timeline holding `stored`, and the keys read.
fn versions(
    ingest: &mut WalVersions,
    record: &DecodedRecord,
    stored: &HashMap<Key, Bytes>,
) -> (Vec<PutRecord>, Vec<Key>) {
    let mut reads = Vec::new();
    let mut out = Vec::new();
    ingest
        .record(
            record,
            &mut |key| {
                reads.push(key);
                Ok(stored.get(&key).cloned())
            },
            &mut out,
        )
        .unwrap();
    assert!(out.iter().all(|v| v.lsn == record.end_rec_ptr()));
    // The cluster's counters (moved by every record with a transaction id) are
    // `wal_counters.rs`'s; what is counted here is the rest.
    let out = out
        .into_iter()
        .filter(|v| v.key != counters_key())
        .collect();
    let reads = reads.into_iter().filter(|k| *k != counters_key()).collect();
    (out, reads)
}

fn value_of(out: &[PutRecord], key: Key) -> Option<&Value> {
    out.iter().find(|v| v.key == key).map(|v| &v.value)
}

#[test]
fn a_block_without_an_image_is_the_record_and_grows_its_fork() {
    let record = heap_insert(5, false);
    let mut ingest = WalVersions::new();
    let stored = HashMap::from([(heap(0).size_key(), Bytes::from(encode_rel_size(3)))]);
    let (out, reads) = versions(&mut ingest, &record, &stored);
    assert_eq!(
        value_of(&out, heap(0).block_key(5)),
        Some(&Value::WalRecord {
            will_init: false,
            record: Bytes::from(record.bytes.clone())
        })
    );
    assert_eq!(
        value_of(&out, heap(0).size_key()),
        Some(&Value::Image(encode_rel_size(6).into()))
    );
    assert_eq!(
        value_of(&out, rel_dir_key(REL.0, REL.1)),
        Some(&Value::Image(encode_rel_dir(&[(REL.2, 0)]).into()))
    );
    // Blocks 3 and 4, skipped over, read as zeros.
    for block in [3, 4] {
        assert_eq!(
            value_of(&out, heap(0).block_key(block)),
            Some(&zero_page()),
            "{block}"
        );
    }
    assert_eq!(out.len(), 5);
    assert_eq!(reads.len(), 2, "the size and the directory: {reads:?}");

    // The same record again: nothing new to size or list, and nothing read again.
    let (out, reads) = versions(&mut ingest, &record, &stored);
    assert_eq!(out.len(), 1);
    assert!(reads.is_empty());
}

#[test]
fn an_image_becomes_the_page_with_its_lsn_set_whether_or_not_redo_applies_it() {
    for info in [BKPIMAGE_APPLY, 0] {
        let mut page = vec![0xAB; 8192];
        page[..8].copy_from_slice(&[9; 8]);
        let record = full_page_image(&page, info);
        let (out, _) = versions(&mut WalVersions::new(), &record, &HashMap::new());
        let Some(Value::Image(stored)) = value_of(&out, heap(0).block_key(0)) else {
            panic!("no image: {out:?}");
        };
        set_page_lsn(&mut page, record.end_rec_ptr());
        assert_eq!(&stored[..], &page[..]);
        let lsn = record.end_rec_ptr().0;
        assert_eq!(lsn % 8, 0);
        assert_eq!(&stored[..4], &((lsn >> 32) as u32).to_le_bytes());
        assert_eq!(&stored[4..8], &(lsn as u32).to_le_bytes());
        // A fork with no size before: it has one now.
        assert_eq!(
            value_of(&out, heap(0).size_key()),
            Some(&Value::Image(encode_rel_size(1).into()))
        );
    }
}

#[test]
fn an_image_of_a_new_page_keeps_its_lsn_as_redo_leaves_it() {
    // pd_upper 0: PageIsNew, which redo restores without stamping.
    let page = vec![0u8; 8192];
    let record = full_page_image(&page, BKPIMAGE_APPLY);
    let (out, _) = versions(&mut WalVersions::new(), &record, &HashMap::new());
    assert_eq!(
        value_of(&out, heap(0).block_key(0)),
        Some(&Value::Image(page.into()))
    );
}

#[test]
fn heap_changes_that_clear_all_visible_touch_the_map_page() {
    // (rmid, info, main data, heap block refs, the heap blocks whose map page changes)
    let insert_cleared = [0u8, 0, 1];
    let delete_cleared = [0, 0, 0, 0, 0, 0, 0, 1];
    let update_both = [0, 0, 0, 0, 0, 0, 0, 3];
    let update_old = [0, 0, 0, 0, 0, 0, 0, 1];
    let not_cleared = [0, 0, 0, 0, 0, 0, 0, 0];
    type Case<'a> = (u8, u8, &'a [u8], &'a [u32], &'a [u32]);
    let cases: [Case; 7] = [
        (RM_HEAP_ID, 0x00, &insert_cleared, &[40_000], &[40_000]),
        (RM_HEAP_ID, 0x10, &delete_cleared, &[7], &[7]),
        (RM_HEAP_ID, 0x20, &update_both, &[70_000, 3], &[3, 70_000]),
        (RM_HEAP_ID, 0x40, &update_old, &[9], &[9]),
        (RM_HEAP_ID, 0x60, &delete_cleared, &[8], &[8]),
        (RM_HEAP2_ID, 0x50, &[1, 0, 0], &[11], &[11]),
        (RM_HEAP_ID, 0x10, &not_cleared, &[7], &[]),
    ];
    for (rmid, info, main, heap_blocks, cleared) in cases {
        let blocks: Vec<Block> = heap_blocks
            .iter()
            .enumerate()
            .map(|(id, block)| Block {
                id: id as u8,
                fork: 0,
                block: *block,
                will_init: false,
                image: None,
                data: vec![1],
            })
            .collect();
        let record = decoded(rmid, info, &parts(&blocks, main));
        let (out, _) = versions(&mut WalVersions::new(), &record, &HashMap::new());
        let map_pages: BTreeSet<u32> = out
            .iter()
            .filter(|v| v.key == heap(2).block_key(v.key.field6) && v.value.is_wal_record())
            .map(|v| v.key.field6)
            .collect();
        let expected: BTreeSet<u32> = cleared.iter().map(|b| b / HEAPBLOCKS_PER_VM_PAGE).collect();
        assert_eq!(map_pages, expected, "rmid {rmid} info {info:#x}");
        if let Some(last) = expected.last() {
            assert_eq!(
                value_of(&out, heap(2).size_key()),
                Some(&Value::Image(encode_rel_size(last + 1).into()))
            );
        }
    }
}

fn smgr_truncate(blocks: u32, flags: u32) -> DecodedRecord {
    let mut main = Vec::new();
    for v in [blocks, REL.0, REL.1, REL.2, flags] {
        main.extend_from_slice(&v.to_le_bytes());
    }
    decoded(RM_SMGR_ID, XLOG_SMGR_TRUNCATE, &parts(&[], &main))
}

#[test]
fn truncation_shrinks_the_forks_as_redo_does() {
    let stored = HashMap::from([
        (heap(0).size_key(), Bytes::from(encode_rel_size(100_000))),
        (heap(1).size_key(), Bytes::from(encode_rel_size(40))),
        (heap(2).size_key(), Bytes::from(encode_rel_size(4))),
    ]);
    let record = smgr_truncate(
        40_000,
        SMGR_TRUNCATE_HEAP | SMGR_TRUNCATE_VM | SMGR_TRUNCATE_FSM,
    );
    let (out, _) = versions(&mut WalVersions::new(), &record, &stored);
    let size = |rel: RelTag| match value_of(&out, rel.size_key()) {
        Some(Value::Image(b)) => decode_rel_size(b).unwrap(),
        other => panic!("{other:?}"),
    };
    assert_eq!(size(heap(0)), 40_000);
    // 40,000 heap blocks need two map pages, the second one partly: its tail is cleared.
    assert_eq!(size(heap(2)), 2);
    assert!(value_of(&out, heap(2).block_key(1)).is_some_and(Value::is_wal_record));
    // Leaf 9 (blocks from 36,621) is the 12th page: root, one middle page, ten leaves.
    assert_eq!(size(heap(1)), 12);
    assert!(value_of(&out, heap(1).block_key(11)).is_some_and(Value::is_wal_record));

    // Truncating at a map page's boundary clears nothing; forks that do not exist stay so.
    let stored = HashMap::from([(heap(0).size_key(), Bytes::from(encode_rel_size(100_000)))]);
    let record = smgr_truncate(HEAPBLOCKS_PER_VM_PAGE, 7);
    let (out, _) = versions(&mut WalVersions::new(), &record, &stored);
    assert_eq!(out.len(), 1, "{out:?}");
}

#[test]
fn free_space_map_pages_are_laid_out_as_postgres_lays_them() {
    // Root, the first middle page, then the leaves: leaf 0 is block 2.
    assert_eq!(fsm_leaf_physical_block(0), 2);
    assert_eq!(fsm_leaf_physical_block(1), 3);
    // After FSM_SLOTS_PER_PAGE leaves, another middle page comes first.
    assert_eq!(
        fsm_leaf_physical_block(FSM_SLOTS_PER_PAGE),
        FSM_SLOTS_PER_PAGE + 3
    );
    assert_eq!(fsm_truncation(0), (2, false));
    assert_eq!(fsm_truncation(1), (3, true));
}

#[test]
fn creation_lists_the_fork_with_size_zero_once() {
    let mut main = Vec::new();
    for v in [REL.0, REL.1, REL.2, 2] {
        main.extend_from_slice(&v.to_le_bytes());
    }
    let record = decoded(RM_SMGR_ID, XLOG_SMGR_CREATE, &parts(&[], &main));
    let stored = HashMap::from([(
        rel_dir_key(REL.0, REL.1),
        Bytes::from(encode_rel_dir(&[(REL.2, 0)])),
    )]);
    let mut ingest = WalVersions::new();
    let (out, _) = versions(&mut ingest, &record, &stored);
    assert_eq!(
        value_of(&out, heap(2).size_key()),
        Some(&Value::Image(encode_rel_size(0).into()))
    );
    assert_eq!(
        value_of(&out, rel_dir_key(REL.0, REL.1)),
        Some(&Value::Image(
            encode_rel_dir(&[(REL.2, 0), (REL.2, 2)]).into()
        ))
    );
    let (out, _) = versions(&mut ingest, &record, &stored);
    assert!(out.is_empty(), "{out:?}");
}

#[test]
fn a_block_far_past_the_end_is_refused() {
    let record = heap_insert(MAX_ZERO_FILL + 10, true);
    let stored = HashMap::from([(heap(0).size_key(), Bytes::from(encode_rel_size(9)))]);
    let err = error_of(&record, &stored);
    assert!(err.contains("blocks past its end"), "{err}");
    // One block fewer past it is filled.
    let mut out = Vec::new();
    let stored = HashMap::from([(heap(0).size_key(), Bytes::from(encode_rel_size(10)))]);
    WalVersions::new()
        .record(&record, &mut |k| Ok(stored.get(&k).cloned()), &mut out)
        .unwrap();
    out.retain(|v| v.key != counters_key());
    assert_eq!(out.len(), MAX_ZERO_FILL as usize + 3);
}

#[test]
fn damaged_records_are_errors_that_name_the_lsn() {
    // A truncation whose main data stops short, and a fork number out of range.
    let short = decoded(RM_SMGR_ID, XLOG_SMGR_TRUNCATE, &parts(&[], &[1, 2, 3]));
    let mut fork = Vec::new();
    for v in [REL.0, REL.1, REL.2, 9] {
        fork.extend_from_slice(&v.to_le_bytes());
    }
    let bad_fork = decoded(RM_SMGR_ID, XLOG_SMGR_CREATE, &parts(&[], &fork));
    for record in [short, bad_fork] {
        let err = WalVersions::new()
            .record(&record, &mut |_| Ok(None), &mut Vec::new())
            .unwrap_err();
        assert!(err.contains(&record.start.to_string()), "{err}");
    }
    // A stored size that is not one.
    let record = heap_insert(1, true);
    let err = WalVersions::new()
        .record(
            &record,
            &mut |k| Ok((k != counters_key()).then(|| Bytes::from_static(b"x"))),
            &mut Vec::new(),
        )
        .unwrap_err();
    assert!(err.contains("relation size"), "{err}");
}

#[test]
fn a_commit_sets_statuses_and_drops_its_relations() {
    use pageserver_api::datadir::file_chunk_key;
    // time, xinfo (subtransactions, relations), 2 subtransactions, 1 relation dropped.
    let mut main = 0i64.to_le_bytes().to_vec();
    main.extend_from_slice(&((1u32 << 1) | (1 << 2)).to_le_bytes());
    for v in [2u32, 1001, 1002, 1, REL.0, REL.1, REL.2] {
        main.extend_from_slice(&v.to_le_bytes());
    }
    let mut wal = WalBuilder::new(Lsn(SEG as u64), SEG);
    wal.record(
        RM_XACT_ID,
        0x80,
        1000,
        &postgres_wal::synthetic::main_data_parts(&main),
    );
    let mut decoder = WalDecoder::new(Lsn(SEG as u64), SEG);
    decoder.feed(wal.bytes());
    let record = decoder.next_record().unwrap().unwrap();

    let mut stored = with_xact_page();
    stored.extend([
        (
            rel_dir_key(REL.0, REL.1),
            Bytes::from(encode_rel_dir(&[(REL.2, 0), (REL.2, 2), (REL.2 + 1, 0)])),
        ),
        (heap(0).size_key(), Bytes::from(encode_rel_size(9))),
    ]);
    let (out, _) = versions(&mut WalVersions::new(), &record, &stored);
    // 1000..=1002 committed: bits 01 for each, in byte 250 (xids 1000 to 1003).
    let Some(Value::Delta { patches, .. }) = value_of(&out, file_chunk_key(1, 0)) else {
        panic!("{out:?}");
    };
    assert_eq!(patches.len(), 1);
    assert_eq!(
        (patches[0].offset, &patches[0].data[..]),
        (250, &[0b0001_0101][..])
    );
    // Both forks of the dropped relation leave the directory, with size 0; the other stays.
    assert_eq!(
        value_of(&out, rel_dir_key(REL.0, REL.1)),
        Some(&Value::Image(encode_rel_dir(&[(REL.2 + 1, 0)]).into()))
    );
    for fork in [0, 2] {
        assert_eq!(
            value_of(&out, heap(fork).size_key()),
            Some(&Value::Image(encode_rel_size(0).into())),
            "fork {fork}"
        );
    }
}

#[test]
fn databases_and_relation_maps_come_and_go_in_the_file_directory() {
    use pageserver_api::datadir::{
        file_chunk_key, file_dir_key, EntryKind, FileDirectory, FileEntry,
    };
    let entry = |path: &str, kind, id| FileEntry {
        path: path.into(),
        kind,
        mode: 0o700,
        mtime: 9,
        size: if id == 0 { 0 } else { 3 },
        id,
    };
    let dir = FileDirectory {
        next_id: 2,
        entries: vec![
            entry("PG_VERSION", EntryKind::File, 1),
            entry("base", EntryKind::Directory, 0),
        ],
    };
    let mut stored = HashMap::from([
        (file_dir_key(), Bytes::from(dir.encode())),
        (file_chunk_key(1, 0), Bytes::from_static(b"15\n")),
    ]);
    let mut ingest = WalVersions::new();
    let apply =
        |ingest: &mut WalVersions, stored: &mut HashMap<Key, Bytes>, rmid, info, main: Vec<u8>| {
            let record = decoded(rmid, info, &parts(&[], &main));
            let (out, _) = versions(ingest, &record, stored);
            for v in &out {
                if let Value::Image(bytes) = &v.value {
                    stored.insert(v.key, bytes.clone());
                }
            }
            out
        };
    let words = |v: &[u32]| v.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>();
    // CREATE DATABASE 16400 (WAL_LOG): its directory, PG_VERSION, an empty relation directory.
    let out = apply(
        &mut ingest,
        &mut stored,
        RM_DBASE_ID,
        0x10,
        words(&[16400, 1663]),
    );
    assert_eq!(
        value_of(&out, rel_dir_key(1663, 16400)),
        Some(&Value::Image(encode_rel_dir(&[]).into()))
    );
    let dir = FileDirectory::decode(&stored[&file_dir_key()]).unwrap();
    assert_eq!(dir.get("base/16400").unwrap().kind, EntryKind::Directory);
    let version = dir.get("base/16400/PG_VERSION").unwrap();
    assert_eq!(&stored[&file_chunk_key(version.id, 0)][..], b"15\n");
    // Its relation map, 512 bytes, whole.
    let mut main = words(&[16400, 1663, 512]);
    main.extend_from_slice(&[7u8; 512]);
    apply(&mut ingest, &mut stored, RM_RELMAP_ID, 0, main);
    let dir = FileDirectory::decode(&stored[&file_dir_key()]).unwrap();
    let map = dir.get("base/16400/pg_filenode.map").unwrap();
    assert_eq!(
        (map.size, &stored[&file_chunk_key(map.id, 0)][..]),
        (512, &[7u8; 512][..])
    );
    // DROP DATABASE: everything under it goes.
    apply(
        &mut ingest,
        &mut stored,
        RM_DBASE_ID,
        0x20,
        words(&[16400, 1, 1663]),
    );
    let dir = FileDirectory::decode(&stored[&file_dir_key()]).unwrap();
    assert!(
        dir.entries
            .iter()
            .all(|e| !e.path.starts_with("base/16400")),
        "{dir:?}"
    );
    assert!(dir.get("base").is_some());
    // A copy of a template's files is refused by name; a map of another tablespace too.
    for (rmid, info, main) in [
        (4, 0x00, words(&[16401, 1663, 1, 1663])),
        (7, 0, words(&[5, 1700, 0])),
    ] {
        let record = decoded(rmid, info, &parts(&[], &main));
        let err = error_of(&record, &stored);
        assert!(
            err.contains("FILE_COPY") || err.contains("tablespace 1700"),
            "{err}"
        );
    }
}

mod damaged {
    use super::*;
    use proptest::prelude::*;

    /// A timeline with `pg_xact/0000` and one relation, for records to land on.
    fn stored() -> HashMap<Key, Bytes> {
        let mut stored = with_xact_page();
        stored.extend([
            (heap(0).size_key(), Bytes::from(encode_rel_size(100))),
            (heap(2).size_key(), Bytes::from(encode_rel_size(2))),
        ]);
        stored
    }

    proptest! {
        /// Whatever a record that passes the decoder's checks holds (a primary's bytes are
        /// untrusted), its versions are made or refused with the record's LSN named: never a
        /// panic. The resource managers page ingest reads, with any info and main data, with
        /// or without a block reference (any fork, block, image bytes).
        #[test]
        fn any_record_is_versions_or_an_error_naming_its_lsn(
            rmid in prop::sample::select(vec![0u8, 1, 2, 3, 9, 10, 11]),
            info in any::<u8>(),
            main in proptest::collection::vec(any::<u8>(), 0..80),
            block in proptest::option::of((0u8..4, 0u32..300, any::<bool>(), any::<bool>())),
            image in proptest::collection::vec(any::<u8>(), 1..200),
        ) {
            let blocks: Vec<Block> = block
                .into_iter()
                .map(|(fork, block, will_init, with_image)| Block {
                    id: 0,
                    fork,
                    block,
                    will_init,
                    image: with_image.then(|| (image.clone(), BKPIMAGE_APPLY)),
                    data: vec![],
                })
                .collect();
            let record = decoded(rmid, info & 0xF0, &parts(&blocks, &main));
            let stored = stored();
            let mut out = Vec::new();
            let result = WalVersions::new().record(
                &record,
                &mut |key| Ok(stored.get(&key).cloned()),
                &mut out,
            );
            match result {
                Ok(()) => prop_assert!(out.iter().all(|v| v.lsn == record.end_rec_ptr())),
                Err(e) => prop_assert!(e.contains(&record.start.to_string()), "{}", e),
            }
        }
    }
}

#[test]
fn the_cluster_counters_are_read_once_and_stored_when_a_record_moves_them() {
    let stored = HashMap::from([(
        counters_key(),
        Bytes::from(
            ClusterCounters {
                exact: true,
                next_xid: 5,
                ..Default::default()
            }
            .encode(),
        ),
    )]);
    let mut ingest = WalVersions::new();
    let mut reads = 0;
    let mut out = Vec::new();
    // The record's transaction id is 7.
    let record = heap_insert(0, true);
    for _ in 0..2 {
        ingest
            .record(
                &record,
                &mut |k| {
                    reads += usize::from(k == counters_key());
                    Ok(stored.get(&k).cloned())
                },
                &mut out,
            )
            .unwrap();
    }
    assert_eq!(reads, 1);
    let counters: Vec<_> = out.iter().filter(|v| v.key == counters_key()).collect();
    assert_eq!(counters.len(), 1, "the second record moves nothing");
    let Value::Image(bytes) = &counters[0].value else {
        panic!("{counters:?}")
    };
    let c = ClusterCounters::decode(bytes).unwrap();
    assert_eq!((c.next_xid, c.exact), (8, true));
}
