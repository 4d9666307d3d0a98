//! The datadir floor against a real timeline: synthetic data directories (a real
//! `pg_control` layout with its CRC, relation segments, files, directories) go in as tar
//! archives and come back out, compared member by member with what went in.

use std::collections::BTreeMap;
use std::io::Read;

use bytes::Bytes;
use pageserver_api::datadir::{RelTag, SnapshotKind, BLCKSZ};
use pageserver_api::{Key, Value};
use utils::id::{TenantId, TimelineId};
use utils::Lsn;

use super::path::{classify, normalize, DatadirPath, PathError};
use super::*;
use crate::tenant::test_support::small_cache;
use crate::tenant::timeline::{PutRecord, Timeline, TimelineConf, TimelineError};

mod members;
mod unread;
mod wal;

/// One member of a synthetic data directory.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Member {
    Dir,
    File(Vec<u8>),
}

type Datadir = BTreeMap<String, Member>;

const SYSID: u64 = 0x6a5b_4c3d_2e1f_0011;

/// A `pg_control` of format 1300 with a valid CRC.
fn pg_control(sysid: u64, state: u32, checkpoint: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; 8192];
    bytes[0..8].copy_from_slice(&sysid.to_le_bytes());
    bytes[8..12].copy_from_slice(&1300u32.to_le_bytes());
    bytes[12..16].copy_from_slice(&202209061u32.to_le_bytes());
    bytes[16..20].copy_from_slice(&state.to_le_bytes());
    bytes[32..40].copy_from_slice(&checkpoint.to_le_bytes());
    bytes[40..48].copy_from_slice(&checkpoint.to_le_bytes());
    bytes[48..52].copy_from_slice(&1u32.to_le_bytes());
    let crc = utils::crc32c::crc32c(&bytes[..288]);
    bytes[288..292].copy_from_slice(&crc.to_le_bytes());
    bytes
}

fn blocks(fill: u8, count: usize) -> Vec<u8> {
    (0..count * BLCKSZ)
        .map(|i| {
            fill.wrapping_add((i / BLCKSZ) as u8)
                .wrapping_add(i as u8 / 61)
        })
        .collect()
}

/// A small cluster, cleanly stopped at `checkpoint`.
fn datadir(checkpoint: u64) -> Datadir {
    let mut d = Datadir::new();
    for dir in [
        "base",
        "base/1",
        "base/5",
        "global",
        "pg_wal",
        "pg_xact",
        "pg_tblspc",
    ] {
        d.insert(dir.into(), Member::Dir);
    }
    let file = |bytes: &[u8]| Member::File(bytes.to_vec());
    d.insert("PG_VERSION".into(), file(b"15\n"));
    d.insert(
        "postgresql.conf".into(),
        file(&(0..20_000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>()),
    );
    d.insert("pg_xact/0000".into(), file(&blocks(9, 1)));
    d.insert("base/5/PG_VERSION".into(), file(b"15\n"));
    d.insert("base/5/pg_filenode.map".into(), file(&[7; 512]));
    d.insert(
        "global/pg_control".into(),
        file(&pg_control(SYSID, 1, checkpoint)),
    );
    d.insert("base/5/16384".into(), file(&blocks(1, 3)));
    d.insert("base/5/16384_fsm".into(), file(&blocks(2, 1)));
    d.insert("base/5/16385".into(), file(&[]));
    d.insert("base/1/1259".into(), file(&blocks(3, 2)));
    d.insert("global/1262".into(), file(&blocks(4, 1)));
    d
}

fn tar_of(d: &Datadir) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, member) in d {
        let mut header = tar::Header::new_ustar();
        header.set_mtime(1_700_000_000);
        match member {
            Member::Dir => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_mode(0o700);
                header.set_size(0);
                builder
                    .append_data(&mut header, format!("./{path}/"), std::io::empty())
                    .unwrap();
            }
            Member::File(bytes) => {
                header.set_mode(0o600);
                header.set_size(bytes.len() as u64);
                builder
                    .append_data(&mut header, format!("./{path}"), &bytes[..])
                    .unwrap();
            }
        }
    }
    builder.into_inner().unwrap()
}

fn untar(bytes: &[u8]) -> Datadir {
    let mut d = Datadir::new();
    let mut archive = tar::Archive::new(bytes);
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = String::from_utf8(entry.path_bytes().into_owned()).unwrap();
        let path = path.trim_end_matches('/').to_string();
        let mode = entry.header().mode().unwrap();
        if entry.header().entry_type().is_dir() {
            assert_eq!(mode, 0o700, "{path}");
            d.insert(path, Member::Dir);
        } else {
            assert_eq!(mode, 0o600, "{path}");
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes).unwrap();
            d.insert(path, Member::File(bytes));
        }
    }
    d
}

fn timeline(dir: &std::path::Path) -> Timeline {
    Timeline::create(
        dir,
        TenantId::from_bytes([1; 16]),
        TimelineId::from_bytes([2; 16]),
        small_cache(256),
        TimelineConf::default(),
    )
    .unwrap()
}

fn basebackup(tl: &Timeline, lsn: Lsn) -> (Lsn, Datadir) {
    let snapshot = snapshot_at(tl, lsn).unwrap();
    let mut out = Vec::new();
    write_basebackup(tl, snapshot, Restore::Snapshot, &mut out).unwrap();
    (snapshot.lsn, untar(&out))
}

#[test]
fn a_directory_comes_back_member_for_member() {
    let dir = tempfile::tempdir().unwrap();
    let tl = timeline(dir.path());
    let original = datadir(0x1000);
    let report = import_archive(&tl, &tar_of(&original)[..], None).unwrap();
    assert_eq!(report.lsn, "0/1000");
    assert_eq!(report.kind, "stopped");
    assert_eq!(report.relations, 5);
    assert_eq!(report.relations_new, 5);
    assert_eq!(report.blocks_new, 7);
    assert_eq!((report.blocks_changed, report.blocks_unchanged), (0, 0));
    assert_eq!(report.files, 6);
    assert_eq!(report.files_new, 6);
    assert_eq!(report.directories, 7);
    assert_eq!(tl.last_record_lsn(), Lsn(0x1000));
    // Durable when the answer comes.
    assert_eq!(tl.disk_consistent_lsn(), Lsn(0x1000));
    let (at, restored) = basebackup(&tl, Lsn(0x1000));
    assert_eq!(at, Lsn(0x1000));
    assert_eq!(restored, original);
    // The blocks are what GetPage@LSN serves.
    let rel = RelTag {
        spcnode: 1663,
        dbnode: 5,
        relnode: 16384,
        forknum: 0,
    };
    let page = tl.get_page(rel.block_key(2), Lsn(0x1000)).unwrap().unwrap();
    assert_eq!(&page[..], &blocks(1, 3)[2 * BLCKSZ..]);
}

#[test]
fn a_second_import_stores_what_changed_and_each_lsn_reads_its_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let tl = timeline(dir.path());
    let first = datadir(0x1000);
    let report1 = import_archive(&tl, &tar_of(&first)[..], None).unwrap();

    let mut second = datadir(0x2000);
    let mut rel = blocks(1, 4); // a block more
    rel[BLCKSZ + 5] ^= 0xff; // and block 1 changed
    second.insert("base/5/16384".into(), Member::File(rel));
    second.insert("base/1/1259".into(), Member::File(blocks(3, 1))); // truncated
    second.remove("base/5/16384_fsm"); // dropped
    let Member::File(conf) = second.get_mut("postgresql.conf").unwrap() else {
        unreachable!()
    };
    conf[10_000] ^= 1;
    second.remove("pg_xact/0000");
    second.insert("pg_xact/0001".into(), Member::File(vec![1, 2, 3]));
    let report = import_archive(&tl, &tar_of(&second)[..], None).unwrap();
    assert_eq!(report.blocks_new, 1);
    assert_eq!(report.blocks_changed, 1);
    assert_eq!(report.blocks_unchanged, 2 + 1 + 1);
    assert_eq!(report.relations_dropped, 1);
    assert_eq!(report.relations_resized, 2);
    assert_eq!(report.relations_new, 0);
    assert_eq!(
        (report.files_new, report.files_changed, report.files_removed),
        (1, 2, 1), // pg_control changed too
    );
    // Two blocks, two chunks, metadata: a fraction of the first import.
    assert!(
        report.bytes_stored < report1.bytes_stored / 2,
        "{} of {}",
        report.bytes_stored,
        report1.bytes_stored
    );

    assert_eq!(basebackup(&tl, Lsn(0x2000)), (Lsn(0x2000), second.clone()));
    assert_eq!(basebackup(&tl, Lsn(0x1000)), (Lsn(0x1000), first.clone()));
    assert_eq!(basebackup(&tl, Lsn(0x1fff)), (Lsn(0x1000), first.clone()));
    assert!(matches!(
        snapshot_at(&tl, Lsn(0xfff)),
        Err(BasebackupError::NoSnapshot(_))
    ));

    // Identical again: only the snapshot list and pg_control's chunks change.
    let third = datadir(0x3000);
    let report = import_archive(&tl, &tar_of(&third)[..], None).unwrap();
    assert_eq!(
        report.blocks_changed + report.blocks_new,
        3,
        "16384's old blocks"
    );
    assert_eq!(basebackup(&tl, Lsn(0x3000)).1, third);
    // Survives a restart: everything is in layer files.
    drop(tl);
    let tl = Timeline::load(
        dir.path(),
        TenantId::from_bytes([1; 16]),
        TimelineId::from_bytes([2; 16]),
        small_cache(64),
        TimelineConf::default(),
    )
    .unwrap();
    assert_eq!(basebackup(&tl, Lsn(0x3000)).1, third);
    assert_eq!(basebackup(&tl, Lsn(0x2500)).1, second);
}

#[test]
fn large_members_are_written_straight_into_layers_and_come_back() {
    use crate::tenant::timeline::IMPORT_RUN_MIN_BYTES;
    let dir = tempfile::tempdir().unwrap();
    let tl = timeline(dir.path());
    let large = (IMPORT_RUN_MIN_BYTES as usize).div_ceil(BLCKSZ) + 2;
    let mut first = datadir(0x1000);
    // In the archive's (path) order the relation numbers go 16390, 20000, then down to 9000:
    // two runs; the large file's chunks come later, and their keys above every block's
    // continue the second.
    for (n, path) in ["base/5/16390", "base/5/20000", "base/5/9000"]
        .into_iter()
        .enumerate()
    {
        first.insert(path.into(), Member::File(blocks(20 + n as u8, large)));
    }
    first.insert(
        "pg_xact/0001".into(),
        Member::File(blocks(40, large)[..large * BLCKSZ - 100].to_vec()),
    );
    let layers_before = tl.layer_counts().l0;
    let report = import_archive(&tl, &tar_of(&first)[..], None).unwrap();
    assert_eq!(report.blocks_new as usize, 7 + 3 * large);
    assert_eq!(
        tl.layer_counts().l0 - layers_before,
        3,
        "two runs and the rest"
    );
    assert_eq!(tl.l0_depth(), 1);
    assert_eq!(basebackup(&tl, Lsn(0x1000)), (Lsn(0x1000), first.clone()));

    // The same cluster later: a block of two large relations and a chunk of the large file.
    let mut second = first.clone();
    second.insert(
        "global/pg_control".into(),
        Member::File(pg_control(SYSID, 1, 0x2000)),
    );
    for (path, at) in [
        ("base/5/9000", 3 * BLCKSZ + 1),
        ("base/5/20000", (large - 1) * BLCKSZ),
        ("pg_xact/0001", 17),
    ] {
        let Member::File(bytes) = second.get_mut(path).unwrap() else {
            unreachable!()
        };
        bytes[at] ^= 0x5a;
    }
    let l0_before = tl.layer_counts().l0;
    let report = import_archive(&tl, &tar_of(&second)[..], None).unwrap();
    assert_eq!((report.blocks_changed, report.blocks_new), (2, 0));
    assert_eq!(
        tl.layer_counts().l0 - l0_before,
        1,
        "a few changed values of large members open no run"
    );
    assert_eq!(report.files_changed, 2, "pg_xact/0001 and pg_control");
    assert!(
        report.bytes_stored < 8 * BLCKSZ as u64,
        "{}",
        report.bytes_stored
    );
    assert_eq!(tl.l0_depth(), 2);
    assert_eq!(basebackup(&tl, Lsn(0x2000)).1, second);
    assert_eq!(basebackup(&tl, Lsn(0x1fff)).1, first);
    // Compacted together, the two groups read the same.
    assert!(tl.compact_l0(2).unwrap().inputs > 0);
    assert_eq!(tl.layer_counts().l0, 0);
    assert_eq!(basebackup(&tl, Lsn(0x2000)).1, second);
    assert_eq!(basebackup(&tl, Lsn(0x1000)).1, first);
}

/// A refused import stores nothing: the timeline's tip and snapshots are as before.
fn assert_refused(tl: &Timeline, archive: &[u8], lsn: Option<Lsn>, expect: &str) -> ImportError {
    let before = tl.last_record_lsn();
    let error = import_archive(tl, archive, lsn).unwrap_err();
    assert!(
        error.to_string().contains(expect),
        "expected {expect:?} in {error}"
    );
    assert_eq!(tl.last_record_lsn(), before);
    assert_eq!(basebackup(tl, before).1, datadir(0x1000));
    error
}

#[test]
fn refused_archives_store_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let tl = timeline(dir.path());
    import_archive(&tl, &tar_of(&datadir(0x1000))[..], None).unwrap();

    let with = |path: &str, member: Member| {
        let mut d = datadir(0x2000);
        d.insert(path.into(), member);
        tar_of(&d)
    };
    let running = with("postmaster.pid", Member::File(b"1234\n".to_vec()));
    assert_refused(&tl, &running, None, "postmaster.pid");
    let other = with(
        "global/pg_control",
        Member::File(pg_control(SYSID + 1, 1, 0x2000)),
    );
    let e = assert_refused(&tl, &other, None, "another cluster");
    assert!(matches!(e, ImportError::Conflict(_)));
    let crashed = with(
        "global/pg_control",
        Member::File(pg_control(SYSID, 6, 0x2000)),
    );
    assert_refused(&tl, &crashed, None, "in production");
    let mut damaged = pg_control(SYSID, 1, 0x2000);
    damaged[100] ^= 1;
    assert_refused(
        &tl,
        &with("global/pg_control", Member::File(damaged)),
        None,
        "CRC",
    );
    let same = tar_of(&datadir(0x1000));
    let e = assert_refused(&tl, &same, None, "not above");
    assert!(matches!(e, ImportError::Conflict(_)));
    assert_refused(
        &tl,
        &tar_of(&datadir(0x2000)),
        Some(Lsn(0x800)),
        "not above",
    );
    let torn_rel = with("base/5/16386", Member::File(vec![0; 100]));
    assert_refused(&tl, &torn_rel, None, "whole number");
    let mut no_control = datadir(0x2000);
    no_control.remove("global/pg_control");
    assert_refused(&tl, &tar_of(&no_control), None, "no global/pg_control");
    let tablespace = with("pg_tblspc/16400/PG_15", Member::Dir);
    assert_refused(&tl, &tablespace, None, "tablespaces");

    // Cut short anywhere, including exactly between two members.
    let whole = tar_of(&datadir(0x2000));
    for cut in [0, 100, 512, 513, 4096, whole.len() / 2, whole.len() - 1024] {
        assert_refused(&tl, &whole[..cut], None, "");
    }
    assert_refused(&tl, &whole[..512 * 4], None, "cut short");
    // Cut right after a member whose data ends in zeros: the last block read is zeros, yet
    // no end-of-archive marker came.
    let mut zeros_last = datadir(0x2000);
    zeros_last.insert("zz_zeros".into(), Member::File(vec![0; 1024]));
    let zeros_last = tar_of(&zeros_last);
    assert_refused(
        &tl,
        &zeros_last[..zeros_last.len() - 1024],
        None,
        "cut short",
    );
    // A relation with a segment missing or short before its last one.
    let mut gap = datadir(0x2000);
    gap.insert("base/5/16384.1".into(), Member::File(blocks(5, 1)));
    assert_refused(&tl, &tar_of(&gap), None, "segment is missing or short");
    assert_refused(&tl, &[], None, "empty");
    assert_refused(&tl, &b"not a tar archive at all"[..], None, "");
    assert_refused(&tl, &vec![0x41; 4096][..], None, "tar");

    // A member twice, a link, a path that leaves the directory.
    let mut twice = whole[..whole.len() - 1024].to_vec();
    twice.extend_from_slice(&tar_of(&BTreeMap::from([(
        "PG_VERSION".to_string(),
        Member::File(b"16\n".to_vec()),
    )])));
    assert_refused(&tl, &twice, None, "appears twice");
    for (entry_type, path) in [
        (tar::EntryType::Symlink, "pg_wal"),
        (tar::EntryType::Regular, "../etc/passwd"),
        (tar::EntryType::Fifo, "pipe"),
    ] {
        let mut builder = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(entry_type);
        header.set_size(0);
        header.set_mode(0o600);
        if entry_type == tar::EntryType::Symlink {
            header.set_link_name("/elsewhere").unwrap();
        }
        // `append_data` refuses `..`; the raw header does not.
        header.as_gnu_mut().unwrap().name[..path.len()].copy_from_slice(path.as_bytes());
        header.set_cksum();
        builder.append(&header, std::io::empty()).unwrap();
        let mut archive = builder.into_inner().unwrap();
        archive.extend_from_slice(&[0; 1024]);
        assert_refused(&tl, &archive, None, path.trim_start_matches("../"));
    }

    // After all that, a good import still goes through.
    import_archive(&tl, &tar_of(&datadir(0x2000))[..], None).unwrap();
}

#[test]
fn long_names_come_back_and_oversized_extension_headers_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let tl = timeline(dir.path());
    let mut long = datadir(0x1000);
    let name = format!("pg_logical/{}", "m".repeat(180));
    long.insert("pg_logical".into(), Member::Dir);
    long.insert(name.clone(), Member::File(b"mapping".to_vec()));
    import_archive(&tl, &tar_of(&long)[..], None).unwrap();
    assert_eq!(basebackup(&tl, Lsn(0x1000)).1, long);

    // A GNU long-name member claiming a megabyte: refused before it is read.
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::GNULongName);
    header.set_size(1 << 20);
    header.as_gnu_mut().unwrap().name[..13].copy_from_slice(b"././@LongLink");
    header.set_cksum();
    let mut archive = header.as_bytes().to_vec();
    archive.extend_from_slice(&vec![b'a'; 1 << 20]);
    archive.extend_from_slice(&tar_of(&datadir(0x2000)));
    let error = import_archive(&tl, &archive[..], None).unwrap_err();
    assert!(error.to_string().contains("extension header"), "{error}");
    assert_eq!(tl.last_record_lsn(), Lsn(0x1000));
}

#[test]
fn an_empty_segment_left_by_a_truncation_adds_no_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let tl = timeline(dir.path());
    let mut truncated = datadir(0x1000);
    truncated.insert("base/5/16384.1".into(), Member::File(Vec::new()));
    let report = import_archive(&tl, &tar_of(&truncated)[..], None).unwrap();
    assert_eq!(report.blocks_new, 7);
    // The fork is its 3 blocks; the empty segment file is not reproduced.
    truncated.remove("base/5/16384.1");
    assert_eq!(basebackup(&tl, Lsn(0x1000)).1, truncated);
}

#[test]
fn writes_wait_for_an_import_and_an_abandoned_one_leaves_no_trace() {
    let dir = tempfile::tempdir().unwrap();
    let tl = timeline(dir.path());
    let import = tl.begin_import().unwrap();
    assert!(matches!(
        tl.put(
            Key::rel_block(1663, 5, 1, 0, 0),
            Lsn(0x10),
            &Value::Image(Bytes::from_static(&[1; 8]))
        ),
        Err(TimelineError::ImportInProgress)
    ));
    assert!(matches!(
        tl.begin_import(),
        Err(TimelineError::ImportInProgress)
    ));
    drop(import);
    tl.put(
        Key::rel_block(1663, 5, 1, 0, 0),
        Lsn(0x10),
        &Value::Image(Bytes::from_static(&[1; 8])),
    )
    .unwrap();
    let ephemeral = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .contains("ephemeral")
        })
        .count();
    assert_eq!(ephemeral, 1, "the open layer's only; the import's is gone");
}

/// An import of `archive` into an empty timeline is refused, mentioning `expect`.
fn assert_refused_at(tl: &Timeline, archive: &[u8], expect: &str) {
    let error = import_archive(tl, archive, None).unwrap_err();
    assert!(
        error.to_string().contains(expect),
        "expected {expect:?} in {error}"
    );
    assert_eq!(tl.last_record_lsn(), Lsn(0));
}

/// A backup: a running cluster's pg_control and a backup_label, without its WAL; and a WAL
/// segment for it (segment 1 of 1 MiB segments, from 0/100000) whose last record ends at the
/// LSN returned.
fn backup_and_its_wal() -> (Datadir, Vec<u8>, Lsn) {
    let mut backup = datadir(0x1000);
    backup.insert(
        "global/pg_control".into(),
        Member::File(pg_control(SYSID, 6, 0x0100_0028)),
    );
    backup.insert(
        "backup_label".into(),
        Member::File(b"START WAL LOCATION: 0/1000028\n".to_vec()),
    );
    let (segment, end) = wal::segment(0x0010_0000, &[100, 9000, 30]);
    (backup, segment, end)
}

#[test]
fn a_backup_is_stored_at_the_end_of_its_wal() {
    let dir = tempfile::tempdir().unwrap();
    let tl = timeline(dir.path());
    let (mut backup, segment, end) = backup_and_its_wal();
    // Its only segment file named as another segment (recycled ahead): left out, so the
    // backup has no WAL to end at, and is refused rather than misdated.
    let mut recycled = backup.clone();
    recycled.insert(
        "pg_wal/000000010000000000000002".into(),
        Member::File(segment.clone()),
    );
    assert_refused_at(
        &tl,
        &tar_of(&recycled),
        "no WAL segment of at most 64 MiB in pg_wal/ to find its end in (take it with \
         pg_basebackup -X fetch, or give lsn=); 1 segments there are recycled ones",
    );
    backup.insert(
        "pg_wal/000000010000000000000001".into(),
        Member::File(segment),
    );
    let report = import_archive(&tl, &tar_of(&backup)[..], None).unwrap();
    assert_eq!(report.kind, SnapshotKind::Backup.to_string());
    assert_eq!(report.lsn, end.to_string());
    assert_eq!(basebackup(&tl, end).1, backup);
}

#[test]
fn recycled_wal_segments_are_left_out() {
    let dir = tempfile::tempdir().unwrap();
    let tl = timeline(dir.path());
    let (mut backup, segment, end) = backup_and_its_wal();
    backup.insert(
        "pg_wal/000000010000000000000001".into(),
        Member::File(segment.clone()),
    );
    // Segment 2 holds the pages of segment 1 (renamed ahead), segment 3 zeros (created
    // ahead): neither holds WAL of its own, and the newest segment with WAL says the end.
    let segment_2 = "pg_wal/000000010000000000000002";
    let mut archive = backup.clone();
    archive.insert(segment_2.into(), Member::File(segment.clone()));
    archive.insert(
        "pg_wal/000000010000000000000003".into(),
        Member::File(vec![0; 1 << 20]),
    );
    // A member of a left-out segment's path, before or after it, is refused as any member
    // twice is.
    let (own_2, _) = wal::segment(0x0020_0000, &[100]);
    for (first, second) in [(&segment, &own_2), (&own_2, &segment)] {
        let mut twice = tar_of(&BTreeMap::from([(
            segment_2.to_string(),
            Member::File(first.clone()),
        )]));
        twice.truncate(twice.len() - 1024);
        let mut rest = archive.clone();
        rest.insert(segment_2.into(), Member::File(second.clone()));
        twice.extend_from_slice(&tar_of(&rest));
        assert_refused_at(&tl, &twice, "appears twice");
    }
    let whole = tar_of(&archive);
    let report = import_archive(&tl, &whole[..], None).unwrap();
    assert_eq!(report.wal_segments_recycled, 2);
    assert_eq!(report.lsn, end.to_string());
    assert_eq!(basebackup(&tl, end).1, backup);
}

#[test]
fn paths_are_classified_as_postgres_names_them() {
    assert_eq!(normalize(b"./base/5/16384").unwrap(), "base/5/16384");
    assert_eq!(normalize(b"./").unwrap(), "");
    assert_eq!(normalize(b"pg_wal/").unwrap(), "pg_wal");
    for bad in [&b"/etc/passwd"[..], b"a/../b", b"a//b", b"../x"] {
        assert!(
            matches!(normalize(bad), Err(PathError::Escapes(_))),
            "{bad:?}"
        );
    }
    assert!(matches!(normalize(b"\xff"), Err(PathError::NotUtf8(_))));
    let rel = |path: &str| match classify(path, true).unwrap() {
        DatadirPath::Relation { rel, segno } => Some((rel, segno)),
        _ => None,
    };
    let (tag, seg) = rel("base/5/16384_vm.3").unwrap();
    assert_eq!(
        (tag.spcnode, tag.dbnode, tag.relnode, tag.forknum, seg),
        (1663, 5, 16384, 2, 3)
    );
    let (tag, _) = rel("global/1262").unwrap();
    assert_eq!((tag.spcnode, tag.dbnode), (1664, 0));
    // Kept as files, so their names come back as they were.
    for other in [
        "base/5/PG_VERSION",
        "base/5/pg_filenode.map",
        "base/5/016384",
        "base/5/16384.0",
        "base/5/16384_xyz",
        "base/05/16384",
        "global/pg_control",
        "pg_xact/0000",
        "base/5/16384.99999",
        "base/5/sub/16384",
    ] {
        assert_eq!(rel(other), None, "{other}");
    }
    assert!(matches!(
        classify("base/5/16384", false).unwrap(),
        DatadirPath::Other(_)
    ));
    assert!(matches!(
        classify("pg_tblspc/16400", true),
        Err(PathError::Tablespace(_))
    ));
    assert!(matches!(
        classify("pg_tblspc", false).unwrap(),
        DatadirPath::Other(_)
    ));
}

/// An import's values stay out of the page cache while it streams in (no reader sees them
/// before the commit, whose flush reads them back bypassing the cache): another timeline's hot
/// pages, in a cache far smaller than the import, are all still there after it.
#[test]
fn an_import_leaves_readers_pages_in_the_page_cache() {
    use crate::io::read_cost::measure;
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(64);
    let (hot_dir, import_dir) = (dir.path().join("hot"), dir.path().join("import"));
    std::fs::create_dir(&hot_dir).unwrap();
    std::fs::create_dir(&import_dir).unwrap();
    let tenant = TenantId::from_bytes([1; 16]);
    let hot = Timeline::create(
        &hot_dir,
        tenant,
        TimelineId::from_bytes([3; 16]),
        cache.clone(),
        TimelineConf::default(),
    )
    .unwrap();
    let rel = RelTag {
        spcnode: 1663,
        dbnode: 7,
        relnode: 1,
        forknum: 0,
    };
    let keys: Vec<Key> = (0..16).map(|b| rel.block_key(b)).collect();
    let batch: Vec<PutRecord> = keys
        .iter()
        .enumerate()
        .map(|(i, key)| PutRecord {
            key: *key,
            lsn: Lsn(0x10),
            value: Value::Image(Bytes::from(vec![i as u8; BLCKSZ])),
        })
        .collect();
    hot.put_batch(&batch).unwrap();
    hot.checkpoint().unwrap();
    let read_all = || {
        for key in &keys {
            hot.get_page(*key, Lsn(0x10)).unwrap().unwrap();
        }
    };
    read_all();
    let ((), warm) = measure(read_all);
    assert_eq!(
        warm.idx_miss + warm.val_miss,
        0,
        "the hot set fits: {warm:?}"
    );

    let tl = Timeline::create(
        &import_dir,
        tenant,
        TimelineId::from_bytes([4; 16]),
        cache,
        TimelineConf::default(),
    )
    .unwrap();
    let mut big = datadir(0x1000);
    // Eight times the cache.
    big.insert("base/5/16386".into(), Member::File(blocks(5, 512)));
    let report = import_archive(&tl, &tar_of(&big)[..], None).unwrap();
    assert_eq!(report.blocks_new, 7 + 512);
    let ((), after) = measure(read_all);
    assert_eq!(after.idx_miss + after.val_miss, 0, "{after:?}");
}
