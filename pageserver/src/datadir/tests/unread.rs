//! A replayed directory imported with relation files left out as unchanged (a background
//! snapshot's kept replay directory, `walreceiver/snapshots.rs`): their blocks are the
//! timeline's, and one that does not match what the timeline holds is refused.

use super::*;

/// `d` as an archive without the files in `left_out`, and those with their sizes.
fn without(d: &Datadir, left_out: &[&str]) -> (Vec<u8>, Vec<(String, u64)>) {
    let mut kept = d.clone();
    let mut unread = Vec::new();
    for path in left_out {
        let Some(Member::File(bytes)) = kept.remove(*path) else {
            panic!("{path} is not a file")
        };
        unread.push((path.to_string(), bytes.len() as u64));
    }
    (tar_of(&kept), unread)
}

#[test]
fn relation_files_left_out_as_unchanged_keep_their_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let tl = timeline(dir.path());
    import_archive(&tl, &tar_of(&datadir(0x1000))[..], None).unwrap();
    let mut second = datadir(0x2000);
    let mut rel = blocks(1, 3);
    rel[5] ^= 0xff;
    second.insert("base/5/16384".into(), Member::File(rel));
    let (archive, unread) = without(&second, &["base/1/1259", "global/1262", "base/5/16385"]);
    let report =
        import_replayed(&tl, &archive[..], Lsn(0x2000), Lsn(0x2000), None, &unread).unwrap();
    assert_eq!((report.blocks_changed, report.blocks_new), (1, 0));
    assert_eq!(
        report.blocks_unchanged,
        2 + 2 + 1 + 1,
        "16384's, 1259's, 1262's, the map's"
    );
    assert_eq!((report.relations, report.relations_dropped), (5, 0));
    assert_eq!(basebackup(&tl, Lsn(0x2000)), (Lsn(0x2000), second));
}

#[test]
fn a_file_left_out_that_the_timeline_does_not_hold_so_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let tl = timeline(dir.path());
    import_archive(&tl, &tar_of(&datadir(0x1000))[..], None).unwrap();
    let second = datadir(0x2000);
    let (archive, _) = without(&second, &["base/1/1259"]);
    for (unread, expect) in [
        // A block more than the timeline's relation has, or one fewer.
        (
            (3 * BLCKSZ) as u64,
            "is not what the timeline holds of its relation (2 blocks)",
        ),
        (
            BLCKSZ as u64,
            "is not what the timeline holds of its relation (2 blocks)",
        ),
        // Not a whole number of blocks.
        (100, "is not what the timeline holds"),
    ] {
        let unread = [("base/1/1259".to_string(), unread)];
        let e = import_replayed(&tl, &archive[..], Lsn(0x2000), Lsn(0x2000), None, &unread)
            .unwrap_err();
        assert!(e.to_string().contains(expect), "{e}");
    }
    // A relation the timeline does not have, and a path that is no relation's.
    let (archive, _) = without(&second, &["base/5/16384", "PG_VERSION"]);
    for (path, expect) in [
        (
            "base/5/16390",
            "is not what the timeline holds of its relation (0 blocks)",
        ),
        ("PG_VERSION", "is not one"),
    ] {
        let unread = [(path.to_string(), BLCKSZ as u64)];
        let e = import_replayed(&tl, &archive[..], Lsn(0x2000), Lsn(0x2000), None, &unread)
            .unwrap_err();
        assert!(e.to_string().contains(expect), "{path}: {e}");
    }
    // Nothing of them stored.
    assert_eq!(tl.last_record_lsn(), Lsn(0x1000));
    assert_eq!(basebackup(&tl, Lsn(0x1000)), (Lsn(0x1000), datadir(0x1000)));
}
