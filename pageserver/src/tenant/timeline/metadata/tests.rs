use proptest::prelude::*;

use super::*;

const TENANT: TenantId = TenantId::from_bytes([7; 16]);
const TIMELINE: TimelineId = TimelineId::from_bytes([9; 16]);

fn manifest(layers: usize) -> TimelineMetadata {
    let mut m = TimelineMetadata::empty(TENANT, TIMELINE);
    m.disk_consistent_lsn = Lsn(0x016B_5A50);
    for i in 0..layers {
        m.add_layer(LayerFileEntry {
            name: format!("{i:036X}-{:036X}__{:016X}-{:016X}", i + 1, 1, 0x20),
            size: 8192 * (i as u64 + 3),
            crc32c: 0xDEAD_0000 + i as u32,
        });
    }
    m
}

fn expect_corrupt(dir: &Path, bytes: &[u8], what: &str) {
    std::fs::write(dir.join(METADATA_FILE), bytes).unwrap();
    match TimelineMetadata::load(dir) {
        Err(err @ MetadataError::Corrupt { .. }) => {
            assert!(err.to_string().contains(METADATA_FILE), "{what}: {err}")
        }
        other => panic!("{what}: expected a corruption error, got {other:?}"),
    }
}

#[test]
fn round_trip_and_every_bit_flip_and_truncation_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let m = manifest(3);
    m.store(dir.path()).unwrap();
    assert_eq!(
        TimelineMetadata::load(dir.path()).unwrap(),
        StoredMetadata::Manifest(m)
    );
    assert!(!dir.path().join(METADATA_TEMP).exists());

    let good = std::fs::read(dir.path().join(METADATA_FILE)).unwrap();
    for byte in 0..good.len() {
        for bit in 0..8 {
            let mut bad = good.clone();
            bad[byte] ^= 1 << bit;
            expect_corrupt(dir.path(), &bad, &format!("bit {bit} of byte {byte}"));
        }
    }
    for len in 0..good.len() {
        expect_corrupt(dir.path(), &good[..len], &format!("truncated to {len}"));
    }
    let mut longer = good.clone();
    longer.push(0);
    expect_corrupt(dir.path(), &longer, "one byte appended");
}

#[test]
fn format_1_files_still_load_as_legacy() {
    let dir = tempfile::tempdir().unwrap();
    store_legacy(dir.path(), Lsn(0x42));
    assert_eq!(
        TimelineMetadata::load(dir.path()).unwrap(),
        StoredMetadata::Legacy {
            disk_consistent_lsn: Lsn(0x42)
        }
    );
    let good = std::fs::read(dir.path().join(METADATA_FILE)).unwrap();
    for byte in 0..good.len() {
        let mut bad = good.clone();
        bad[byte] ^= 0x10;
        expect_corrupt(dir.path(), &bad, &format!("byte {byte}"));
    }
}

/// Re-seals `body` (everything but the checksum) with a valid checksum, so that the field
/// checks behind the checksum are what is tested.
fn sealed(mut body: Vec<u8>) -> Vec<u8> {
    let crc = crc32c::crc32c(&body);
    body.extend_from_slice(&crc.to_be_bytes());
    body
}

#[test]
fn forged_entries_with_valid_checksums_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let two = manifest(2);
    let good = two.encode().unwrap();
    let body = good[..good.len() - CRC_LEN].to_vec();
    let name_at = off::LAYERS + 2;

    let mut huge_count = body.clone();
    huge_count[off::LAYER_COUNT..off::LAYER_COUNT + 4].copy_from_slice(&u32::MAX.to_be_bytes());
    expect_corrupt(dir.path(), &sealed(huge_count), "a count past the file");

    let mut fewer = body.clone();
    fewer[off::LAYER_COUNT..off::LAYER_COUNT + 4].copy_from_slice(&1u32.to_be_bytes());
    expect_corrupt(dir.path(), &sealed(fewer), "bytes after the last entry");

    for (forged, what) in [(b'/', "a slash"), (b' ', "a space"), (0x80, "not ASCII")] {
        let mut bad = body.clone();
        bad[name_at + 3] = forged;
        expect_corrupt(dir.path(), &sealed(bad), what);
    }

    let mut name_len_past_end = body.clone();
    name_len_past_end[off::LAYERS..off::LAYERS + 2].copy_from_slice(&u16::MAX.to_be_bytes());
    expect_corrupt(
        dir.path(),
        &sealed(name_len_past_end),
        "a name past the end",
    );

    // The two entries swapped: out of order.
    let first_len = 2 + two.layers[0].name.len() + 12;
    let mut swapped = body[..off::LAYERS].to_vec();
    swapped.extend_from_slice(&body[off::LAYERS + first_len..]);
    swapped.extend_from_slice(&body[off::LAYERS..off::LAYERS + first_len]);
    assert_eq!(swapped.len(), body.len());
    expect_corrupt(dir.path(), &sealed(swapped), "entries out of order");

    let mut dot_dot = manifest(0).encode().unwrap();
    dot_dot.truncate(dot_dot.len() - CRC_LEN);
    dot_dot[off::LAYER_COUNT..off::LAYER_COUNT + 4].copy_from_slice(&1u32.to_be_bytes());
    dot_dot.extend_from_slice(&2u16.to_be_bytes());
    dot_dot.extend_from_slice(b"..");
    dot_dot.extend_from_slice(&[0; 12]);
    expect_corrupt(dir.path(), &sealed(dot_dot), "a name that climbs");
}

#[test]
fn names_that_are_not_plain_file_names_cannot_be_stored() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["", "a/b", "..", METADATA_FILE, "sp ace"] {
        let mut m = manifest(0);
        m.layers.push(LayerFileEntry {
            name: name.to_owned(),
            size: 1,
            crc32c: 1,
        });
        let err = m.store(dir.path()).unwrap_err();
        assert!(
            matches!(err, MetadataError::BadLayerName { .. }),
            "{name:?}: {err}"
        );
    }
    assert!(!dir.path().join(METADATA_FILE).exists());
}

#[test]
fn add_layer_keeps_the_list_sorted_and_replaces_by_name() {
    let mut m = manifest(0);
    for name in ["c", "a", "b"] {
        m.add_layer(LayerFileEntry {
            name: name.to_owned(),
            size: 1,
            crc32c: 0,
        });
    }
    m.add_layer(LayerFileEntry {
        name: "b".to_owned(),
        size: 2,
        crc32c: 0,
    });
    let names: Vec<&str> = m.layers.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    assert_eq!(m.layer("b").unwrap().size, 2);
    assert!(m.layer("d").is_none());
}

proptest! {
    #[test]
    fn any_manifest_round_trips(
        lsn: u64,
        entries in proptest::collection::btree_map("[0-9A-Za-z_.-]{3,80}", (any::<u64>(), any::<u32>()), 0..40),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut m = TimelineMetadata::empty(TENANT, TIMELINE);
        m.disk_consistent_lsn = Lsn(lsn);
        for (name, (size, crc32c)) in entries {
            if check_layer_name(&name).is_ok() {
                m.add_layer(LayerFileEntry { name, size, crc32c });
            }
        }
        m.store(dir.path()).unwrap();
        prop_assert_eq!(TimelineMetadata::load(dir.path()).unwrap(), StoredMetadata::Manifest(m));
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = TimelineMetadata::decode(&bytes);
    }
}
