//! A replayed directory imported with relation files left out, or some of their blocks, as
//! unchanged (a background snapshot's kept replay directory, `walreceiver/snapshots.rs`):
//! those blocks are the timeline's, and a file that does not match what the timeline holds is
//! refused.

use super::*;

/// `d` as an archive without the files in `left_out`, and those as read not at all.
fn without(d: &Datadir, left_out: &[&str]) -> (Vec<u8>, Vec<PartlyRead>) {
    let parts: Vec<_> = left_out.iter().map(|path| (*path, &[][..])).collect();
    in_part(d, &parts)
}

/// `d` as an archive with only the blocks listed of each file of `parts` (none: no member),
/// and those files as read in part.
fn in_part(d: &Datadir, parts: &[(&str, &[u32])]) -> (Vec<u8>, Vec<PartlyRead>) {
    let mut kept = d.clone();
    let mut partly_read = Vec::new();
    for (path, blocks) in parts {
        let Some(Member::File(bytes)) = kept.remove(*path) else {
            panic!("{path} is not a file")
        };
        if !blocks.is_empty() {
            let member = blocks
                .iter()
                .flat_map(|b| &bytes[*b as usize * BLCKSZ..][..BLCKSZ])
                .copied()
                .collect();
            kept.insert(path.to_string(), Member::File(member));
        }
        partly_read.push(PartlyRead {
            path: path.to_string(),
            size: bytes.len() as u64,
            blocks: blocks.to_vec(),
        });
    }
    (tar_of(&kept), partly_read)
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
    let report = replayed_at_0x2000(&tl, &archive, &unread).unwrap();
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
        let unread = [PartlyRead {
            path: "base/1/1259".to_string(),
            size: unread,
            blocks: Vec::new(),
        }];
        let e = replayed_at_0x2000(&tl, &archive, &unread).unwrap_err();
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
        let unread = [PartlyRead {
            path: path.to_string(),
            size: BLCKSZ as u64,
            blocks: Vec::new(),
        }];
        let e = replayed_at_0x2000(&tl, &archive, &unread).unwrap_err();
        assert!(e.to_string().contains(expect), "{path}: {e}");
    }
    // Nothing of them stored.
    assert_eq!(tl.last_record_lsn(), Lsn(0x1000));
    assert_eq!(basebackup(&tl, Lsn(0x1000)), (Lsn(0x1000), datadir(0x1000)));
}

/// `archive` imported as a directory replayed to 0x2000, with `partly_read`.
fn replayed_at_0x2000(
    tl: &Timeline,
    archive: &[u8],
    partly_read: &[PartlyRead],
) -> Result<ImportReport, ImportError> {
    let base = Lsn(0x1000);
    import_replayed(
        tl,
        archive,
        Lsn(0x2000),
        Lsn(0x2000),
        None,
        (base, partly_read),
    )
}

/// The first cluster, then its relation 16384 grown from 3 to 5 blocks with block 1 changed.
fn grown() -> (Timeline, tempfile::TempDir, Datadir) {
    let dir = tempfile::tempdir().unwrap();
    let tl = timeline(dir.path());
    import_archive(&tl, &tar_of(&datadir(0x1000))[..], None).unwrap();
    let mut second = datadir(0x2000);
    let mut rel = blocks(1, 3);
    rel[BLCKSZ + 5] ^= 0xff;
    rel.extend(blocks(40, 2));
    second.insert("base/5/16384".into(), Member::File(rel));
    (tl, dir, second)
}

#[test]
fn relation_files_read_in_part_keep_the_blocks_left_out() {
    let (tl, _dir, second) = grown();
    let (archive, partly_read) = in_part(&second, &[("base/5/16384", &[1, 3, 4])]);
    let report = replayed_at_0x2000(&tl, &archive, &partly_read).unwrap();
    assert_eq!((report.blocks_changed, report.blocks_new), (1, 2));
    assert_eq!(
        report.blocks_unchanged,
        2 + 2 + 1 + 1,
        "16384's two left out, 1259's, 1262's, the map's"
    );
    assert_eq!(basebackup(&tl, Lsn(0x2000)), (Lsn(0x2000), second));
}

#[test]
fn a_file_read_in_part_that_is_not_as_listed_is_refused() {
    let (tl, _dir, second) = grown();
    let bad = |blocks: Vec<u32>, member: &[u32]| {
        let (archive, mut partly_read) = in_part(&second, &[("base/5/16384", member)]);
        partly_read[0].blocks = blocks;
        replayed_at_0x2000(&tl, &archive, &partly_read)
            .unwrap_err()
            .to_string()
    };
    for (blocks, member, expect) in [
        // Block 4 is new, so it must be read.
        (
            vec![1, 3],
            &[1, 3][..],
            "blocks it leaves out are not what the timeline holds",
        ),
        (
            vec![1, 3, 4],
            &[1, 3],
            "its member is 16384 bytes, not its 3 blocks read",
        ),
        (
            vec![3, 1, 4],
            &[3, 1, 4],
            "the blocks read are not in order",
        ),
        (
            vec![1, 3, 5],
            &[1, 3, 4],
            "the blocks read are not in order",
        ),
        (vec![1, 3, 4], &[], "is not in the archive"),
    ] {
        let e = bad(blocks, member);
        assert!(e.contains(expect), "{member:?}: {e}");
    }
    // Nothing of them stored.
    assert_eq!(tl.last_record_lsn(), Lsn(0x1000));
    assert_eq!(basebackup(&tl, Lsn(0x1000)), (Lsn(0x1000), datadir(0x1000)));
}

#[test]
fn files_read_in_part_are_refused_once_the_timeline_moved_on() {
    let (tl, _dir, second) = grown();
    let (archive, partly_read) = in_part(&second, &[("base/5/16384", &[1, 3, 4])]);
    // Listed at 0x1000; an import at 0x1800 came between.
    import_archive(&tl, &tar_of(&datadir(0x1800))[..], None).unwrap();
    let e = replayed_at_0x2000(&tl, &archive, &partly_read).unwrap_err();
    assert!(
        e.to_string()
            .contains("the timeline moved from 0/1000 to 0/1800 since"),
        "{e}"
    );
    assert_eq!(tl.last_record_lsn(), Lsn(0x1800));
}
