//! Failpoints armed from a test, in builds with the `testing` feature (`scripts/test-all` tests
//! with it). A failpoint is armed for the whole process: armed in the library's own test
//! binary, it would also fail whichever of the tests running beside it reaches it meanwhile, so
//! the tests that arm one are in this binary of their own.
#![cfg(feature = "testing")]

use pageserver::failpoints;
use pageserver::tenant::storage_layer::image_layer::ImageLayerWriter;
use pageserver_api::Key;
use utils::{Lsn, TenantId, TimelineId};

#[test]
fn a_failed_image_layer_commit_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let key = |n| Key::rel_block(1663, 5, 16384, 0, n);
    failpoints::configure("image-layer-before-rename", "return").unwrap();
    let mut writer = ImageLayerWriter::new(
        dir.path(),
        TenantId::from_bytes([7; 16]),
        TimelineId::from_bytes([9; 16]),
        key(0)..key(9),
        Lsn(0x500),
    )
    .unwrap();
    writer.put_image(key(1), &[7; 10]).unwrap();
    let err = writer.finish().unwrap_err();
    failpoints::configure("image-layer-before-rename", "off").unwrap();
    assert!(
        err.to_string()
            .contains("failpoint image-layer-before-rename"),
        "{err}"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "the failed commit left {left:?}");
}

/// A commit says whether its file had taken its final name when it failed: the manifest's
/// store tells "not stored" from "may or may not be stored" by it.
#[test]
fn a_failed_commit_says_whether_the_file_was_renamed() {
    use pageserver::io::crashsafe::StagedFile;
    let dir = tempfile::tempdir().unwrap();
    for (failpoint, renamed) in [
        ("staged-test-before-rename", false),
        ("staged-test-after-rename", true),
    ] {
        failpoints::configure(failpoint, "return").unwrap();
        let staged = StagedFile::create(dir.path(), "f.___temp", "staged-test").unwrap();
        let err = staged.commit("f").unwrap_err();
        failpoints::configure(failpoint, "off").unwrap();
        assert_eq!(err.renamed, renamed, "{failpoint}: {err}");
        assert_eq!(dir.path().join("f").exists(), renamed, "{failpoint}");
        assert!(!dir.path().join("f.___temp").exists(), "{failpoint}");
    }
}
