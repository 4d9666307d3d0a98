use std::collections::BTreeMap;
use std::fs::OpenOptions;

use pageserver_api::DEFAULT_MAX_VALUE_SIZE;
use proptest::prelude::*;

use super::*;
use crate::format::compression::Compression;
use crate::format::disk_btree::leaf_capacity;
use crate::io::read_cost::measure;
use crate::io::virtual_file::FileIo;
use crate::tenant::test_support::*;

const TENANT: TenantId = TenantId::from_bytes([7; 16]);
const TIMELINE: TimelineId = TimelineId::from_bytes([9; 16]);
const LSN: Lsn = Lsn(0x500);

type Model = BTreeMap<Key, Bytes>;

/// `len` bytes that differ from one image to the next and within an image.
fn image(seed: u32, len: usize) -> Bytes {
    (0..len)
        .map(|i| (seed as usize * 31 + i * 7 + i / 251) as u8)
        .collect::<Vec<u8>>()
        .into()
}

/// The key range `rel_key(0)..rel_key(keys)`.
fn range(keys: u32) -> Range<Key> {
    rel_key(0)..rel_key(keys)
}

fn write(dir: &Path, model: &Model, key_range: Range<Key>) -> WrittenLayer {
    write_with(dir, model, key_range, Compression::Off)
}

/// [`write`], the writer compressing as `compression` says.
fn write_with(
    dir: &Path,
    model: &Model,
    key_range: Range<Key>,
    compression: Compression,
) -> WrittenLayer {
    let mut writer = ImageLayerWriter::new(dir, TENANT, TIMELINE, key_range, LSN)
        .unwrap()
        .with_compression(compression)
        .unwrap();
    for (key, image) in model {
        writer.put_image(*key, image).unwrap();
    }
    let written = writer.finish().unwrap();
    assert_eq!(written.summary.entries, model.len() as u64);
    written
}

fn open(path: &Path, cache: &Arc<PageCache>) -> Result<ImageLayer, LayerFileError> {
    ImageLayer::open(path, cache.clone(), DEFAULT_MAX_VALUE_SIZE)
}

/// Every read the layer answers, against the model: the images at and above the LSN, nothing
/// below it or outside the key range, and "no page" for keys of the range without an image.
fn check_answers(
    layer: &ImageLayer,
    model: &Model,
    probes: impl IntoIterator<Item = Key>,
) -> Result<(), LayerFileError> {
    let s = *layer.summary();
    let all: Model = layer.iter()?.into_iter().collect();
    assert_eq!(&all, model, "iter");
    for key in probes {
        let in_range = (s.key_start..s.key_end).contains(&key);
        for lsn in [Lsn(s.lsn.0 - 1), s.lsn, Lsn(s.lsn.0 + 100)] {
            let got = layer.get(key, lsn)?;
            if lsn < s.lsn || !in_range {
                assert!(got.records.is_empty() && !got.complete, "{key} at {lsn}");
                continue;
            }
            let expected: Vec<_> = model
                .get(&key)
                .map(|image| (s.lsn, Value::Image(image.clone())))
                .into_iter()
                .collect();
            assert_eq!(got.records, expected, "{key} at {lsn}");
            assert!(
                got.complete,
                "{key} at {lsn}: an image layer is authoritative"
            );
        }
    }
    Ok(())
}

fn version_stored(version: &VersionRef) -> u64 {
    match version.at {
        ValueAt::Image { stored } => stored,
        other => panic!("an image layer listed {other:?}"),
    }
}

/// The keys a scan gets from the layer, `chunk` at a time.
fn scan_keys(layer: &ImageLayer, from: Key, end: Key, chunk: usize) -> Vec<Key> {
    let mut keys = Vec::new();
    let mut next = Some(from);
    while let Some(from) = next {
        let got = layer.versions_at_lsn(from, end, LSN, chunk).unwrap();
        assert!(got.versions.len() <= chunk);
        keys.extend(got.keys());
        next = got.resume;
    }
    keys
}

/// Images of every kind of length: page-sized, small, empty, just under and over a block,
/// and spanning several blocks, so that every placement case occurs.
fn mixed_images() -> Model {
    [
        PAGE_SZ,
        100,
        PAGE_SZ,
        0,
        PAGE_SZ - 1,
        5000,
        PAGE_SZ + 1,
        3 * PAGE_SZ + 17,
        40,
        PAGE_SZ,
    ]
    .into_iter()
    .enumerate()
    .map(|(i, len)| (rel_key(2 * i as u32 + 1), image(i as u32, len)))
    .collect()
}

#[test]
fn images_of_every_size_read_back_and_verify() {
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(64);
    let model = mixed_images();
    let written = write(dir.path(), &model, range(30));
    let bytes = std::fs::read(&written.path).unwrap();
    assert_eq!(written.size, bytes.len() as u64);
    // The CRC-32C computed while writing is the file's.
    assert_eq!(written.crc32c, utils::crc32c::crc32c(&bytes));
    assert_eq!(
        written.path.file_name().unwrap().to_str().unwrap(),
        format!("{}-{}__0000000000000500", rel_key(0), rel_key(30))
    );

    let layer = open(&written.path, &cache).unwrap();
    assert_eq!(layer.summary(), &written.summary);
    check_answers(&layer, &model, (0..32).map(rel_key)).unwrap();
    // Twice: the second time from the page cache.
    check_answers(&layer, &model, (0..32).map(rel_key)).unwrap();
    assert_eq!(layer.file_crc32c().unwrap(), written.crc32c);
    layer.check_identity(TENANT, TIMELINE).unwrap();

    let report = layer.verify().unwrap();
    let image_bytes: usize = model.values().map(Bytes::len).sum();
    assert_eq!(report.entries, model.len() as u64);
    assert_eq!(report.image_bytes, image_bytes as u64);
    assert_eq!(
        report.image_bytes + report.padding_bytes,
        report.value_blocks * PAGE_SZ as u64
    );
    assert_eq!((report.checksum_blocks, report.index_blocks), (1, 1));

    let mut entries = Vec::new();
    assert!(layer
        .visit_index(rel_key(0), |e| {
            entries.push(e);
            true
        })
        .unwrap());
    for entry in &entries {
        assert_eq!(&layer.read_entry(entry).unwrap(), &model[&entry.key]);
        assert!(well_placed(entry.offset, entry.len), "{entry:?}");
    }
    assert_eq!(
        entries.iter().map(|e| e.key).collect::<Vec<_>>(),
        scan_keys(&layer, Key::MIN, Key::MAX, 3)
    );
}

#[test]
fn reads_below_the_lsn_outside_the_range_or_of_an_absent_key() {
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(64);
    let model: Model = [(rel_key(5), image(5, PAGE_SZ))].into();
    let written = write(dir.path(), &model, rel_key(3)..rel_key(8));
    let layer = open(&written.path, &cache).unwrap();
    let get = |k, lsn| layer.get(rel_key(k), lsn).unwrap();

    // Below the layer's LSN: the layer knows nothing, older layers must be asked.
    let below = get(5, Lsn(LSN.0 - 1));
    assert!(below.records.is_empty() && !below.complete);
    // Outside the key range, below or at its exclusive end: the same.
    for k in [2, 8, 9] {
        let outside = get(k, LSN);
        assert!(outside.records.is_empty() && !outside.complete, "key {k}");
    }
    // In the range without an image: no page at this LSN, and nothing older matters.
    for k in [3, 4, 6, 7] {
        let absent = get(k, Lsn(LSN.0 + 10));
        assert!(absent.records.is_empty() && absent.complete, "key {k}");
    }
    let present = get(5, LSN);
    assert_eq!(
        present.records,
        vec![(LSN, Value::Image(model[&rel_key(5)].clone()))]
    );
    assert!(present.complete);

    // A scan sees the key from the layer's LSN on, and only within the range.
    let keys = |from, end, lsn| layer.versions_at_lsn(rel_key(from), rel_key(end), lsn, 10);
    let listed = keys(0, 100, LSN).unwrap();
    assert_eq!(listed.keys(), vec![rel_key(5)]);
    let version = &listed.versions[0];
    assert_eq!((version.lsn, version.will_init), (LSN, true));
    assert_eq!(
        vec![(
            LSN,
            layer
                .read_version(version.key, version_stored(version))
                .unwrap()
        )],
        present.records
    );
    assert_eq!(
        keys(0, 100, Lsn(LSN.0 - 1)).unwrap(),
        VersionChunk::default()
    );
    assert_eq!(keys(6, 100, LSN).unwrap(), VersionChunk::default());
    assert_eq!(keys(0, 5, LSN).unwrap(), VersionChunk::default());
}

#[test]
fn an_image_layer_without_images_says_no_key_has_a_page() {
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(64);
    let written = write(dir.path(), &Model::new(), range(10));
    // The summary and an empty index leaf.
    assert_eq!(written.size, 2 * PAGE_SZ as u64);
    let layer = open(&written.path, &cache).unwrap();
    check_answers(&layer, &Model::new(), (0..12).map(rel_key)).unwrap();
    let report = layer.verify().unwrap();
    assert_eq!(
        report,
        VerifyReport {
            index_blocks: 1,
            ..VerifyReport::default()
        }
    );
}

#[test]
fn page_sized_images_need_no_padding_and_a_cold_read_is_one_8k_read() {
    let dir = tempfile::tempdir().unwrap();
    // Two checksum table blocks, and an index of several leaves under a root.
    let n = CRCS_PER_BLOCK as u32 + 100;
    let model: Model = (0..n).map(|i| (rel_key(i), image(i, PAGE_SZ))).collect();
    let written = write(dir.path(), &model, range(n));
    let leaves = (n as usize).div_ceil(leaf_capacity(KEY_LEN));
    let blocks = 1 + n as usize + 2 + leaves + 1;
    assert_eq!(written.size, (blocks * PAGE_SZ) as u64);

    let cache = small_cache(blocks + 16);
    let layer = open(&written.path, &cache).unwrap();
    let report = layer.verify().unwrap();
    assert_eq!(report.padding_bytes, 0);
    assert_eq!(report.checksum_blocks, 2);
    assert_eq!(report.index_blocks, leaves as u64 + 1);

    // Warm the index (a scan reads every leaf through the cache) and both table blocks.
    assert_eq!(
        scan_keys(&layer, Key::MIN, Key::MAX, 1000).len(),
        n as usize
    );
    for k in [0, n - 1] {
        layer.get(rel_key(k), LSN).unwrap();
    }
    for k in (1..n - 1).step_by(97) {
        let (got, cost) = measure(|| layer.get(rel_key(k), LSN).unwrap());
        assert_eq!(got.records[0].1, Value::Image(model[&rel_key(k)].clone()));
        // Root and leaf, the table block, and the one value block: one read of 8 KiB.
        assert_eq!(
            cost.to_string(),
            "layers=0 idx_hit=3 idx_miss=0 val_hit=0 val_miss=1 ios=1 bytes=8192 waits=0 downloads=0",
            "key {k}"
        );
        let (_, again) = measure(|| layer.get(rel_key(k), LSN).unwrap());
        assert_eq!((again.val_hit, again.ios), (1, 0), "key {k}");
    }
}

#[test]
fn a_corrupt_value_block_is_never_cached_so_every_read_sees_the_damage() {
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(64);
    let model: Model = (0..4).map(|i| (rel_key(i), image(i, PAGE_SZ))).collect();
    let written = write(dir.path(), &model, range(4));
    // Block 3 holds key 2's image.
    let mut bytes = std::fs::read(&written.path).unwrap();
    bytes[3 * PAGE_SZ + 100] ^= 0x01;
    std::fs::write(&written.path, &bytes).unwrap();
    let layer = open(&written.path, &cache).unwrap();
    for attempt in 0..3 {
        let err = layer.get(rel_key(2), LSN).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, LayerFileError::Corrupt { .. }), "{msg}");
        assert!(
            msg.contains("value block 3: checksum mismatch"),
            "attempt {attempt}: {msg}"
        );
        assert!(msg.contains(written.path.to_str().unwrap()), "{msg}");
    }
    assert_eq!(cache.stats().file_pages.inserts, 0);
    // The other images are sound, and cached once read.
    for k in [0, 1, 3] {
        assert_eq!(layer.get(rel_key(k), LSN).unwrap().records.len(), 1);
    }
    assert_eq!(cache.stats().file_pages.inserts, 3);
    let err = layer.verify().unwrap_err();
    assert!(err.to_string().contains("value block 3"), "{err}");
}

#[test]
fn a_corrupt_checksum_table_block_is_never_cached() {
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(64);
    let model: Model = (0..4).map(|i| (rel_key(i), image(i, PAGE_SZ))).collect();
    let written = write(dir.path(), &model, range(4));
    let table = written.summary.checksums_start_blk as usize;
    let mut bytes = std::fs::read(&written.path).unwrap();
    // Key 1's value block's checksum.
    bytes[table * PAGE_SZ + 5] ^= 0x40;
    std::fs::write(&written.path, &bytes).unwrap();
    let layer = open(&written.path, &cache).unwrap();
    for k in 0..4 {
        let err = layer.get(rel_key(k), LSN).unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("checksum table block {table}")),
            "{err}"
        );
    }
    // Only the index leaf was cached, not the table block, and no value block was read.
    let stats = cache.stats();
    assert_eq!(
        (stats.index_pages.inserts, stats.file_pages.inserts),
        (1, 0)
    );
}

/// A few images of a few sizes, with padding, several table slots and a one-leaf index: a file
/// of a few blocks, small enough to damage at every byte.
fn small_model() -> Model {
    [(1, 3000), (2, 6000), (4, 0), (6, 9000), (7, 10)]
        .into_iter()
        .map(|(k, len)| (rel_key(k), image(k, len)))
        .collect()
}

#[test]
fn every_flipped_byte_is_an_error_or_harmless() {
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(64);
    let model = small_model();
    let written = write(dir.path(), &model, range(9));
    let original = std::fs::read(&written.path).unwrap();
    let file = OpenOptions::new().write(true).open(&written.path).unwrap();
    let mut harmless = 0;
    for at in 0..original.len() {
        let bit = 1u8 << (at % 8);
        file.write_all_at(&[original[at] ^ bit], at as u64).unwrap();
        // Every key of the range and beyond, at the layer's LSN (the others read nothing).
        let result = open(&written.path, &cache).and_then(|layer| {
            for k in 0..10 {
                let got = layer.get(rel_key(k), LSN)?;
                let expected = model
                    .get(&rel_key(k))
                    .map(|i| (LSN, Value::Image(i.clone())));
                assert_eq!(got.records, Vec::from_iter(expected), "byte {at}");
                assert_eq!(got.complete, k < 9, "byte {at}");
            }
            Ok(())
        });
        match result {
            Ok(()) => harmless += 1,
            Err(e) => {
                let msg = e.to_string();
                assert!(
                    matches!(e, LayerFileError::Corrupt { .. }),
                    "byte {at}: {msg}"
                );
                assert!(msg.contains(written.path.to_str().unwrap()), "{msg}");
            }
        }
        file.write_all_at(&original[at..=at], at as u64).unwrap();
    }
    // Only block 0's zero tail is read by no lookup (verify checks it).
    assert_eq!(harmless, PAGE_SZ - 116);
}

#[test]
fn every_truncation_and_extension_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(64);
    let model = small_model();
    let written = write(dir.path(), &model, range(9));
    let len = written.size;
    let f = OpenOptions::new().write(true).open(&written.path).unwrap();
    let mut cuts: Vec<u64> = (0..len).step_by(PAGE_SZ / 2).collect();
    cuts.extend([1, 116, len - 1, len + 1, len + PAGE_SZ as u64]);
    for cut in cuts {
        f.set_len(cut).unwrap();
        let err = open(&written.path, &cache)
            .and_then(|l| l.iter().map(drop))
            .expect_err("a file of another length must not read back");
        assert!(
            matches!(err, LayerFileError::Corrupt { .. }),
            "cut at {cut}: {err}"
        );
    }
}

#[test]
fn verify_checks_what_no_read_looks_at() {
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(64);
    let model = small_model();
    let written = write(dir.path(), &model, range(9));
    let s = written.summary;
    let mut bytes = std::fs::read(&written.path).unwrap();
    // Key 2's 6000 bytes do not fit after key 1's 3000 in block 1: zeros pad block 1 from
    // byte 8192 + 3000. Make one of them non-zero, with the block's checksum to match.
    let padding = PAGE_SZ + 3000 + 10;
    bytes[padding] = 0xAA;
    let block_crc = utils::crc32c::crc32c(&bytes[PAGE_SZ..2 * PAGE_SZ]);
    let table = s.checksums_start_blk as usize * PAGE_SZ;
    bytes[table..table + 4].copy_from_slice(&block_crc.to_be_bytes());
    let own = utils::crc32c::crc32c(&bytes[table..table + TABLE_CRC_OFF]);
    bytes[table + TABLE_CRC_OFF..table + PAGE_SZ].copy_from_slice(&own.to_be_bytes());
    std::fs::write(&written.path, &bytes).unwrap();

    let layer = open(&written.path, &cache).unwrap();
    check_answers(&layer, &model, (0..10).map(rel_key)).unwrap();
    let err = layer.verify().unwrap_err();
    assert!(
        err.to_string()
            .contains(&format!("byte {padding} of the values region is not zero")),
        "{err}"
    );

    // A non-zero byte after the summary's checksum.
    let written = write(dir.path(), &model, range(9));
    let mut bytes = std::fs::read(&written.path).unwrap();
    bytes[PAGE_SZ - 1] = 1;
    std::fs::write(&written.path, &bytes).unwrap();
    let layer = open(&written.path, &cache).unwrap();
    let err = layer.verify().unwrap_err();
    assert!(err.to_string().contains("byte 8191 is not zero"), "{err}");
}

#[test]
fn the_identity_check_names_what_differs() {
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(64);
    let written = write(dir.path(), &small_model(), range(9));
    let layer = open(&written.path, &cache).unwrap();
    let other = TenantId::from_bytes([1; 16]);
    let err = layer.check_identity(other, TIMELINE).unwrap_err();
    assert!(
        err.to_string().contains(&format!(
            "belongs to timeline {TIMELINE} of tenant {TENANT}"
        )),
        "{err}"
    );
    let renamed = dir
        .path()
        .join(format!("{}-{}__0000000000000501", rel_key(0), rel_key(9)));
    std::fs::rename(&written.path, &renamed).unwrap();
    let err = open(&renamed, &cache)
        .unwrap()
        .check_identity(TENANT, TIMELINE)
        .unwrap_err();
    assert!(
        err.to_string().contains("not the one its name says"),
        "{err}"
    );
}

fn dir_entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect()
}

#[test]
fn refused_writes_change_nothing_and_leave_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let new = |key_range, lsn| ImageLayerWriter::new(dir.path(), TENANT, TIMELINE, key_range, lsn);
    for (key_range, lsn) in [(rel_key(3)..rel_key(3), LSN), (range(9), Lsn::MAX)] {
        let err = new(key_range, lsn).err().unwrap();
        assert!(matches!(err, LayerFileError::Usage { .. }), "{err}");
    }
    assert!(dir_entries(dir.path()).is_empty());

    // Dropped before finish: nothing is left.
    let mut writer = new(range(9), LSN).unwrap();
    writer.put_image(rel_key(1), &image(1, 100)).unwrap();
    assert_eq!(dir_entries(dir.path()).len(), 1);
    drop(writer);
    assert!(dir_entries(dir.path()).is_empty());

    // Every refusal between the puts of `small_model`: the file is the same as without them.
    let model = small_model();
    let sound = write(dir.path(), &model, range(9));
    let expected = std::fs::read(&sound.path).unwrap();
    std::fs::remove_file(&sound.path).unwrap();
    let too_long = vec![0u8; MAX_IMAGE_LEN + 1];
    let mut writer = new(range(9), LSN).unwrap();
    for (key, image) in &model {
        let refusals: [(Key, &[u8], &str); 3] = [
            (rel_key(9), b"x", "outside the layer's key range"),
            (Key::MIN, b"x", "outside the layer's key range"),
            (
                *key,
                &too_long,
                "more than the 33554431 an image layer holds",
            ),
        ];
        for (k, bytes, why) in refusals {
            let err = writer.put_image(k, bytes).unwrap_err();
            assert!(matches!(err, LayerFileError::Usage { .. }), "{err}");
            assert!(err.to_string().contains(why), "{err}");
        }
        writer.put_image(*key, image).unwrap();
        for k in [*key, rel_key(0)] {
            let err = writer.put_image(k, b"y").unwrap_err();
            assert!(err.to_string().contains("strictly increasing"), "{err}");
        }
    }
    let again = writer.finish().unwrap();
    assert_eq!(std::fs::read(&again.path).unwrap(), expected);
    assert_eq!(again.crc32c, sound.crc32c);
    assert_eq!(dir_entries(dir.path()).len(), 1);
}

#[test]
fn placement_keeps_small_images_within_a_block() {
    let page = PAGE_SZ as u64;
    assert_eq!(placement(page, PAGE_SZ), page);
    assert_eq!(placement(page + 1, PAGE_SZ - 1), page + 1);
    assert_eq!(placement(page + 1, PAGE_SZ), 2 * page);
    assert_eq!(placement(2 * page - 1, 0), 2 * page - 1);
    assert_eq!(placement(page, 3 * PAGE_SZ), page);
    assert_eq!(placement(page + 1, PAGE_SZ + 1), 2 * page);
    assert_eq!(
        split_index_value(index_value(MAX_IMAGE_OFFSET, MAX_IMAGE_LEN)),
        (MAX_IMAGE_OFFSET, MAX_IMAGE_LEN)
    );
}

fn model_strategy() -> impl Strategy<Value = Model> {
    let len = prop_oneof![
        3 => Just(PAGE_SZ),
        2 => 0usize..300,
        2 => 0usize..=PAGE_SZ,
        1 => PAGE_SZ..3 * PAGE_SZ,
    ];
    prop::collection::btree_map(0u32..60, len, 0..40).prop_map(|sizes| {
        sizes
            .into_iter()
            .map(|(k, len)| (rel_key(k), image(k, len)))
            .collect()
    })
}

fn compression_strategy() -> impl Strategy<Value = Compression> {
    prop_oneof![Just(Compression::Off), Just(Compression::Zstd { level: 1 })]
}

/// Heap-like pages (rows of text) stored compressed in a version 2 file: they read back the
/// same, point reads say they decompressed, the file is a fraction of the plain one, and a page
/// of noise beside them is stored as it is. The same file said to be version 1 (its summary
/// rewritten, checksum and all) reads the compressed bit as part of the offset: corrupt.
#[test]
fn compressible_images_are_stored_compressed_in_a_version_2_file() {
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(64);
    let mut model = Model::new();
    for k in 0..40u32 {
        let rows: String = (0..90)
            .map(|i| format!("{k:4} | {i:6} | {:70}|", "x"))
            .collect();
        let mut page = rows.into_bytes();
        page.resize(PAGE_SZ, 0);
        model.insert(rel_key(k), Bytes::from(page));
    }
    let noise = noise(PAGE_SZ);
    model.insert(rel_key(40), Bytes::from(noise));

    let plain_dir = tempfile::tempdir().unwrap();
    let plain = write(plain_dir.path(), &model, range(41));
    let packed = write_with(
        dir.path(),
        &model,
        range(41),
        Compression::Zstd { level: 1 },
    );
    assert_eq!(plain.summary.format_version, IMAGE_FORMAT_VERSION_PLAIN);
    assert_eq!(packed.summary.format_version, IMAGE_FORMAT_VERSION);
    let layer = open(&packed.path, &cache).unwrap();
    check_answers(&layer, &model, (0..42).map(rel_key)).unwrap();
    assert!(layer.get(rel_key(3), LSN).unwrap().decompressed);
    assert!(!layer.get(rel_key(40), LSN).unwrap().decompressed);
    let report = layer.verify().unwrap();
    assert_eq!((report.entries, report.compressed), (41, 40));
    // 41 pages: 41 value blocks plain; compressed, the 40 heap pages share a few blocks.
    assert_eq!(plain.summary.value_blocks(), 41);
    assert!(packed.summary.value_blocks() <= 6, "{:?}", packed.summary);
    let mut entries = Vec::new();
    layer
        .visit_index(Key::MIN, |e| {
            entries.push(e);
            true
        })
        .unwrap();
    assert!(entries[..40].iter().all(|e| e.compressed) && !entries[40].compressed);
    assert_eq!(layer.read_entry(&entries[7]).unwrap(), model[&rel_key(7)]);
    drop(layer);

    let mut bytes = std::fs::read(&packed.path).unwrap();
    let mut summary = packed.summary;
    summary.format_version = IMAGE_FORMAT_VERSION_PLAIN;
    bytes[..PAGE_SZ].copy_from_slice(&summary.encode()[..]);
    std::fs::write(&packed.path, &bytes).unwrap();
    let layer = open(&packed.path, &small_cache(16)).unwrap();
    let err = layer.get(rel_key(3), LSN).unwrap_err();
    assert!(matches!(err, LayerFileError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("outside the values"), "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Whatever the images' sizes and keys, the layer answers every read as the model does,
    /// lists its keys in any chunk size, and passes its own verification.
    #[test]
    fn image_layer_answers_like_a_btreemap(
        model in model_strategy(),
        start in 0u32..5,
        chunk in 1usize..8,
        compression in compression_strategy(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let cache = small_cache(16);
        let key_range = rel_key(start)..rel_key(61);
        let model: Model = model.into_iter().filter(|(k, _)| key_range.contains(k)).collect();
        let written = write_with(dir.path(), &model, key_range, compression);
        let layer = open(&written.path, &cache).unwrap();
        check_answers(&layer, &model, (0..63).map(rel_key)).unwrap();
        let keys: Vec<Key> = model.keys().copied().collect();
        prop_assert_eq!(scan_keys(&layer, Key::MIN, Key::MAX, chunk), keys);
        let report = layer.verify().unwrap();
        prop_assert_eq!(report.entries, model.len() as u64);
        let plain_bytes = model.values().map(|i| i.len() as u64).sum::<u64>();
        if compression.is_off() {
            prop_assert_eq!(report.image_bytes, plain_bytes);
            prop_assert_eq!(report.compressed, 0);
        } else {
            prop_assert!(report.image_bytes <= plain_bytes);
        }
    }

    /// A flipped bit anywhere in a file of any shape: an error naming the file, or exactly the
    /// right answers. Never a panic, never a wrong page.
    #[test]
    fn a_flipped_bit_is_an_error_or_harmless(
        model in model_strategy(),
        position in any::<prop::sample::Index>(),
        bit in 0u8..8,
        compression in compression_strategy(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let cache = small_cache(16);
        let written = write_with(dir.path(), &model, range(60), compression);
        let mut bytes = std::fs::read(&written.path).unwrap();
        let at = position.index(bytes.len());
        bytes[at] ^= 1 << bit;
        std::fs::write(&written.path, &bytes).unwrap();
        let result = open(&written.path, &cache)
            .and_then(|layer| check_answers(&layer, &model, (0..61).map(rel_key)));
        if let Err(e) = result {
            let msg = e.to_string();
            prop_assert!(matches!(e, LayerFileError::Corrupt { .. }), "{}", msg);
            prop_assert!(msg.contains(written.path.to_str().unwrap()), "{}", msg);
        }
    }
}
