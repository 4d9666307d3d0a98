use proptest::prelude::*;

use super::*;

const TENANT: TenantId = TenantId::from_bytes([7; 16]);
const TIMELINE: TimelineId = TimelineId::from_bytes([9; 16]);

/// The name of a delta layer (or, with `image`, an image layer) of keys `i..i+1`.
fn layer_name(i: u32, image: bool) -> String {
    use crate::tenant::storage_layer::layer_name::{DeltaLayerName, ImageLayerName};
    use pageserver_api::Key;
    let key_range = Key::rel_block(1663, 5, 16384, 0, i)..Key::rel_block(1663, 5, 16384, 0, i + 1);
    if image {
        LayerName::Image(ImageLayerName {
            key_range,
            lsn: Lsn(0x20),
        })
    } else {
        LayerName::Delta(DeltaLayerName {
            key_range,
            lsn_range: Lsn(1)..Lsn(0x20),
        })
    }
    .to_string()
}

/// A manifest of `layers` layers of every level, one retired file and a GC cutoff.
fn manifest(layers: usize) -> Manifest {
    let mut m = Manifest::empty(TENANT, TIMELINE);
    m.disk_consistent_lsn = Lsn(0x016B_5A50);
    m.gc_cutoff_lsn = Lsn(0x0100_0000);
    for i in 0..layers as u32 {
        let level = [LayerLevel::L0, LayerLevel::L1, LayerLevel::Image][i as usize % 3];
        m.add_layer(LayerFileEntry {
            name: layer_name(i, level == LayerLevel::Image),
            size: 8192 * (u64::from(i) + 3),
            crc32c: 0xDEAD_0000 + i,
            level,
            group_size: 1,
        });
    }
    if layers > 0 {
        m.retired.push(layer_name(1000, false));
    }
    m
}

fn expect_corrupt(dir: &Path, bytes: &[u8], what: &str) {
    std::fs::write(dir.join(METADATA_FILE), bytes).unwrap();
    match Manifest::load(dir) {
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
        Manifest::load(dir.path()).unwrap(),
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
        Manifest::load(dir.path()).unwrap(),
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
    let crc = utils::crc32c::crc32c(&body);
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
    let entry_len = |l: &LayerFileEntry| 2 + l.name.len() + 17;
    let (first_len, second_len) = (entry_len(&two.layers[0]), entry_len(&two.layers[1]));
    let entries_end = off::LAYERS + first_len + second_len;
    let mut swapped = body[..off::LAYERS].to_vec();
    swapped.extend_from_slice(&body[off::LAYERS + first_len..entries_end]);
    swapped.extend_from_slice(&body[off::LAYERS..off::LAYERS + first_len]);
    swapped.extend_from_slice(&body[entries_end..]);
    assert_eq!(swapped.len(), body.len());
    expect_corrupt(dir.path(), &sealed(swapped), "entries out of order");

    // The first entry (an L0 delta) claims to be an image, or a level that does not exist.
    let level_at = off::LAYERS + first_len - 5;
    for (code, what) in [(2u8, "a delta listed as an image"), (7, "an unknown level")] {
        let mut bad = body.clone();
        bad[level_at] = code;
        expect_corrupt(dir.path(), &sealed(bad), what);
    }

    // The retired file is also listed as a layer.
    let mut retired_is_layer = two.clone();
    retired_is_layer.retired = vec![two.layers[0].name.clone()];
    assert!(matches!(
        retired_is_layer.encode(),
        Err(MetadataError::BadLayerName { .. })
    ));
    let mut forged = body[..entries_end].to_vec();
    forged.extend_from_slice(&1u32.to_be_bytes());
    forged.extend_from_slice(&body[off::LAYERS..off::LAYERS + 2 + two.layers[0].name.len()]);
    expect_corrupt(
        dir.path(),
        &sealed(forged),
        "a retired file that is a layer",
    );

    let mut dot_dot = manifest(0).encode().unwrap();
    dot_dot.truncate(dot_dot.len() - CRC_LEN - 4);
    dot_dot[off::LAYER_COUNT..off::LAYER_COUNT + 4].copy_from_slice(&1u32.to_be_bytes());
    dot_dot.extend_from_slice(&2u16.to_be_bytes());
    dot_dot.extend_from_slice(b"..");
    dot_dot.extend_from_slice(&[0; 17]);
    dot_dot.extend_from_slice(&0u32.to_be_bytes());
    expect_corrupt(dir.path(), &sealed(dot_dot), "a name that climbs");
}

#[test]
fn format_2_files_load_with_every_layer_an_l0() {
    let dir = tempfile::tempdir().unwrap();
    let names = [layer_name(1, false), layer_name(2, false)];
    let mut b = Vec::new();
    b.extend_from_slice(&MAGIC.to_be_bytes());
    b.extend_from_slice(&VERSION_2.to_be_bytes());
    b.extend_from_slice(&[0, 0]);
    b.extend_from_slice(TENANT.as_bytes());
    b.extend_from_slice(TIMELINE.as_bytes());
    b.extend_from_slice(&0x42u64.to_be_bytes());
    b.extend_from_slice(&2u32.to_be_bytes());
    for name in &names {
        b.extend_from_slice(&(name.len() as u16).to_be_bytes());
        b.extend_from_slice(name.as_bytes());
        b.extend_from_slice(&8192u64.to_be_bytes());
        b.extend_from_slice(&7u32.to_be_bytes());
    }
    std::fs::write(dir.path().join(METADATA_FILE), sealed(b)).unwrap();
    let StoredMetadata::Manifest(m) = Manifest::load(dir.path()).unwrap() else {
        panic!("a format 2 manifest");
    };
    assert_eq!(m.disk_consistent_lsn, Lsn(0x42));
    assert_eq!(m.gc_cutoff_lsn, Lsn(0));
    assert!(m.retired.is_empty());
    assert_eq!(m.layers.len(), 2);
    assert!(m
        .layers
        .iter()
        .all(|l| l.level == LayerLevel::L0 && l.size == 8192));
}

#[test]
fn format_3_files_load_with_their_history_unchecked_below_disk_consistent_lsn() {
    let dir = tempfile::tempdir().unwrap();
    let names = [layer_name(1, false), layer_name(2, true)];
    let mut b = Vec::new();
    b.extend_from_slice(&MAGIC.to_be_bytes());
    b.extend_from_slice(&VERSION_3.to_be_bytes());
    b.extend_from_slice(&[0, 0]);
    b.extend_from_slice(TENANT.as_bytes());
    b.extend_from_slice(TIMELINE.as_bytes());
    b.extend_from_slice(&0x42u64.to_be_bytes());
    b.extend_from_slice(&0x10u64.to_be_bytes());
    b.extend_from_slice(&2u32.to_be_bytes());
    for (name, level) in names.iter().zip([1u8, 2]) {
        b.extend_from_slice(&(name.len() as u16).to_be_bytes());
        b.extend_from_slice(name.as_bytes());
        b.extend_from_slice(&8192u64.to_be_bytes());
        b.extend_from_slice(&7u32.to_be_bytes());
        b.push(level);
    }
    b.extend_from_slice(&0u32.to_be_bytes());
    std::fs::write(dir.path().join(METADATA_FILE), sealed(b)).unwrap();
    let StoredMetadata::Manifest(m) = Manifest::load(dir.path()).unwrap() else {
        panic!("a format 3 manifest");
    };
    assert_eq!(
        (m.disk_consistent_lsn, m.gc_cutoff_lsn, m.contiguous_from),
        (Lsn(0x42), Lsn(0x10), Lsn(0x42))
    );
    assert_eq!(
        m.layers
            .iter()
            .map(|l| (l.level, l.group_size))
            .collect::<Vec<_>>(),
        [(LayerLevel::L1, 0), (LayerLevel::Image, 0)]
    );
    // Stored again, it is format 4 with the same contents.
    m.store(dir.path()).unwrap();
    let again = std::fs::read(dir.path().join(METADATA_FILE)).unwrap();
    assert_eq!(u16::from_be_bytes([again[4], again[5]]), VERSION);
    assert_eq!(
        Manifest::load(dir.path()).unwrap(),
        StoredMetadata::Manifest(m)
    );
}

#[test]
fn retiring_a_layer_moves_it_to_the_retired_files() {
    let mut m = manifest(3);
    let name = m.layers[0].name.clone();
    assert!(m.retire_layer(&name));
    assert!(!m.retire_layer(&name));
    assert!(m.layer(&name).is_none());
    assert!(m.retired.contains(&name));
    let dir = tempfile::tempdir().unwrap();
    m.store(dir.path()).unwrap();
    assert_eq!(
        Manifest::load(dir.path()).unwrap(),
        StoredMetadata::Manifest(m.clone())
    );
    // Listed again (a layer of that name written anew): no longer retired.
    let entry = LayerFileEntry {
        name: name.clone(),
        size: 1,
        crc32c: 2,
        level: LayerLevel::L0,
        group_size: 1,
    };
    m.add_layer(entry);
    assert!(!m.retired.contains(&name));
}

#[test]
fn names_that_are_not_plain_file_names_cannot_be_stored() {
    let dir = tempfile::tempdir().unwrap();
    let image = layer_name(3, true);
    for name in ["", "a/b", "..", METADATA_FILE, "sp ace", "x__y", &image] {
        let mut m = manifest(0);
        // An image name is a fine name, but not of an L1 delta.
        m.layers.push(LayerFileEntry {
            name: name.to_owned(),
            size: 1,
            crc32c: 1,
            level: LayerLevel::L1,
            group_size: 1,
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
            level: LayerLevel::L0,
            group_size: 1,
        });
    }
    m.add_layer(LayerFileEntry {
        name: "b".to_owned(),
        size: 2,
        crc32c: 0,
        level: LayerLevel::L0,
        group_size: 1,
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
        gc_cutoff: u64,
        entries in proptest::collection::btree_map(0u32..10_000, (any::<u64>(), any::<u32>(), 0u8..4), 0..40),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut m = Manifest::empty(TENANT, TIMELINE);
        m.disk_consistent_lsn = Lsn(lsn);
        m.gc_cutoff_lsn = Lsn(gc_cutoff);
        for (i, (size, crc32c, level)) in entries {
            // Level 3 stands for a retired file.
            match LayerLevel::from_code(level) {
                Some(level) => m.add_layer(LayerFileEntry {
                    name: layer_name(i, level == LayerLevel::Image),
                    size,
                    crc32c,
                    level,
                    group_size: 1,
                }),
                None => m.retired.push(layer_name(i, false)),
            }
        }
        m.store(dir.path()).unwrap();
        prop_assert_eq!(Manifest::load(dir.path()).unwrap(), StoredMetadata::Manifest(m));
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = Manifest::decode(&bytes);
    }
}
