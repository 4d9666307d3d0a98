//! Members an import refuses as they arrive: past what its memory may hold, a path that would be
//! both a file and a directory, a member with setuid, setgid or sticky bits; and what a
//! basebackup gives back of modes.

use pageserver_api::datadir::{
    file_dir_key, snapshot_list_key, FileDirectory, Snapshot, SnapshotList,
};

use super::*;

fn timeline_with_max_value_size(dir: &std::path::Path, max_value_size: usize) -> Timeline {
    Timeline::create(
        dir,
        TenantId::from_bytes([1; 16]),
        TimelineId::from_bytes([2; 16]),
        small_cache(256),
        TimelineConf {
            max_value_size,
            ..TimelineConf::default()
        },
    )
    .unwrap()
}

/// `archive` without its end-of-archive marker, then `more`.
fn followed_by(archive: &[u8], more: &[u8]) -> Vec<u8> {
    let mut joined = archive[..archive.len() - 1024].to_vec();
    joined.extend_from_slice(more);
    joined
}

#[test]
fn entries_are_refused_at_the_member_that_passes_the_file_directory_limit() {
    // A cluster whose file directory is a little over 8 KiB.
    let mut cluster = datadir(0x1000);
    cluster.insert("pg_logical".into(), Member::Dir);
    for i in 0..30 {
        let name = format!("pg_logical/{i:02}-{}", "m".repeat(250));
        cluster.insert(name, Member::File(b"mapping".to_vec()));
    }
    let archive = tar_of(&cluster);
    let scratch = tempfile::tempdir().unwrap();
    let tl = timeline(scratch.path());
    import_archive(&tl, &archive[..], None).unwrap();
    let len = tl
        .get_page(file_dir_key(), Lsn(0x1000))
        .unwrap()
        .unwrap()
        .len();
    assert!(len > 8192, "{len}");

    // A limit of exactly its size takes it.
    let exact = tempfile::tempdir().unwrap();
    let tl = timeline_with_max_value_size(exact.path(), len);
    import_archive(&tl, &archive[..], None).unwrap();
    assert_eq!(basebackup(&tl, Lsn(0x1000)).1, cluster);

    // One byte less refuses it at the member that passes it, before reading on: what follows
    // that member here is not even tar.
    let short = tempfile::tempdir().unwrap();
    let tl = timeline_with_max_value_size(short.path(), len - 1);
    let garbage = followed_by(&archive, &[0x41; 4096]);
    let error = import_archive(&tl, &garbage[..], None).unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains(&format!(
            "do not fit the file directory, one value of at most max_value_size ({} bytes)",
            len - 1
        )),
        "{text}"
    );
    assert!(matches!(error, ImportError::Invalid(_)));
    assert_eq!(tl.last_record_lsn(), Lsn(0));
}

#[test]
fn no_path_is_both_a_file_and_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let tl = timeline(dir.path());
    import_archive(&tl, &tar_of(&datadir(0x1000))[..], None).unwrap();
    let one = |path: &str, member: Member| tar_of(&Datadir::from([(path.to_string(), member)]));
    let file = || Member::File(b"x".to_vec());
    let cluster = tar_of(&datadir(0x2000));

    let inside_a_file = followed_by(
        &followed_by(&cluster, &one("extra", file())),
        &one("extra/inner", file()),
    );
    assert_refused(
        &tl,
        &inside_a_file,
        None,
        "archive member \"extra/inner\" is inside \"extra\", which is a file",
    );
    let file_over_directory = followed_by(
        &followed_by(&cluster, &one("extra/inner", file())),
        &one("extra", file()),
    );
    assert_refused(
        &tl,
        &file_over_directory,
        None,
        "archive member \"extra\" is a file, but members before it are inside it",
    );
    // A relation segment is a file too.
    let inside_a_segment = followed_by(&cluster, &one("base/5/16384/inner", file()));
    assert_refused(
        &tl,
        &inside_a_segment,
        None,
        "is inside \"base/5/16384\", which is a file",
    );
    let segment_as_directory = followed_by(&cluster, &one("base/5/16384", Member::Dir));
    assert_refused(
        &tl,
        &segment_as_directory,
        None,
        "archive member \"base/5/16384\" appears twice",
    );
    // A directory the archive names after what is inside it is not twice.
    let named_later = followed_by(
        &followed_by(&cluster, &one("extra/inner", file())),
        &one("extra", Member::Dir),
    );
    import_archive(&tl, &named_later[..], None).unwrap();
}

/// The archive of `d` with the modes of some members changed.
fn tar_with_modes(d: &Datadir, modes: &[(&str, u32)]) -> Vec<u8> {
    let mut archive = tar::Archive::new(std::io::Cursor::new(tar_of(d)));
    let mut builder = tar::Builder::new(Vec::new());
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let mut header = entry.header().clone();
        let path = String::from_utf8(entry.path_bytes().into_owned()).unwrap();
        let path = path.trim_start_matches("./").trim_end_matches('/');
        if let Some((_, mode)) = modes.iter().find(|(p, _)| *p == path) {
            header.set_mode(*mode);
            header.set_cksum();
        }
        let mut data = Vec::new();
        entry.read_to_end(&mut data).unwrap();
        builder.append(&header, &data[..]).unwrap();
    }
    builder.into_inner().unwrap()
}

#[test]
fn setuid_setgid_and_sticky_bits_are_refused_but_a_directorys_setgid_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let tl = timeline(dir.path());
    import_archive(&tl, &tar_of(&datadir(0x1000))[..], None).unwrap();

    let mut with_extra = datadir(0x2000);
    with_extra.insert("pg_stat".into(), Member::Dir);
    for (path, mode, bit) in [
        ("PG_VERSION", 0o4755, "setuid"),
        ("postgresql.conf", 0o2640, "setgid"),
        ("pg_xact/0000", 0o1600, "sticky"),
        ("base/5/16384", 0o4600, "setuid"),
        ("pg_stat", 0o4700, "setuid"),
        ("pg_stat", 0o1700, "sticky"),
        ("base/5", 0o3700, "sticky"),
    ] {
        let archive = tar_with_modes(&with_extra, &[(path, mode)]);
        assert_refused(
            &tl,
            &archive,
            None,
            &format!("archive member {path:?} has the {bit} bit (mode 0{mode:o})"),
        );
    }

    // Every directory setgid, as in a cluster created under a setgid directory: taken, and
    // given back without the bit (`untar` checks each mode).
    let setgid = with_extra
        .iter()
        .filter(|(_, m)| **m == Member::Dir)
        .map(|(path, _)| (path.as_str(), 0o2700))
        .collect::<Vec<_>>();
    assert!(setgid.len() > 5);
    import_archive(&tl, &tar_with_modes(&with_extra, &setgid)[..], None).unwrap();
    assert_eq!(basebackup(&tl, Lsn(0x2000)).1, with_extra);
}

#[test]
fn a_basebackup_gives_back_permission_bits_only() {
    // A snapshot whose file directory holds special bits, as one stored before imports refused
    // them could: its basebackup has none.
    let dir = tempfile::tempdir().unwrap();
    let tl = timeline(dir.path());
    import_archive(&tl, &tar_of(&datadir(0x1000))[..], None).unwrap();
    let read = |key| tl.get_page(key, Lsn(0x1000)).unwrap().unwrap();
    let mut files = FileDirectory::decode(&read(file_dir_key())).unwrap();
    let mut snapshots = SnapshotList::decode(&read(snapshot_list_key())).unwrap();
    for entry in &mut files.entries {
        entry.mode |= 0o7000;
    }
    snapshots
        .snapshots
        .push(Snapshot::imported(Lsn(0x2000), SnapshotKind::Stopped));
    let mut import = tl.begin_import().unwrap();
    let image = |bytes: Vec<u8>| Value::Image(Bytes::from(bytes));
    import.put(file_dir_key(), &image(files.encode())).unwrap();
    import
        .put(snapshot_list_key(), &image(snapshots.encode()))
        .unwrap();
    import.commit(Lsn(0x2000)).unwrap();

    let mut out = Vec::new();
    let snapshot = snapshot_at(&tl, Lsn(0x2000)).unwrap();
    write_basebackup(&tl, snapshot, Restore::Snapshot, &mut out).unwrap();
    let mut archive = tar::Archive::new(&out[..]);
    let mut members = 0;
    for entry in archive.entries().unwrap() {
        let mode = entry.unwrap().header().mode().unwrap();
        assert_eq!(mode & 0o7000, 0, "mode {mode:o}");
        members += 1;
    }
    assert!(members > 10);
    assert_eq!(basebackup(&tl, Lsn(0x2000)).1, datadir(0x1000));
}
