use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::path::PathBuf;

use bytes::Bytes;
use pageserver_api::value::Patch;
use pageserver_api::DEFAULT_MAX_VALUE_SIZE;
use proptest::prelude::*;

use super::*;
use crate::io::crashsafe::TEMP_SUFFIX;
use crate::tenant::storage_layer::inmemory_layer::InMemoryLayer;
use crate::tenant::storage_layer::Layer;
use crate::tenant::test_support::*;

const TENANT: TenantId = TenantId::from_bytes([7; 16]);
const TIMELINE: TimelineId = TimelineId::from_bytes([9; 16]);

type Model = BTreeMap<(Key, Lsn), Value>;

fn value_strategy() -> impl Strategy<Value = Value> {
    prop_oneof![
        (any::<u8>(), prop_oneof![Just(PAGE_SZ), 0usize..20_000])
            .prop_map(|(fill, len)| Value::Image(Bytes::from(vec![fill; len]))),
        // Bytes that do not compress: a compressing writer stores them as they are.
        prop::collection::vec(any::<u8>(), 0..600).prop_map(|b| Value::Image(Bytes::from(b))),
        (
            prop::bool::weighted(0.2),
            0u32..9000,
            prop::collection::vec(any::<u8>(), 0..200)
        )
            .prop_map(|(will_init, offset, data)| Value::Delta {
                will_init,
                patches: vec![Patch::new(offset, data)],
            }),
    ]
}

/// Versions of up to 12 keys at increasing LSNs from 100.
fn model_strategy() -> impl Strategy<Value = Model> {
    prop::collection::vec((0u32..12, value_strategy()), 1..80).prop_map(|puts| {
        puts.into_iter()
            .enumerate()
            .map(|(i, (k, v))| ((rel_key(k), Lsn(100 + 2 * i as u64)), v))
            .collect()
    })
}

fn compression_strategy() -> impl Strategy<Value = Compression> {
    prop_oneof![Just(Compression::Off), Just(Compression::Zstd { level: 1 })]
}

/// Writes the model through an InMemoryLayer into a delta layer; returns both.
fn write(dir: &Path, cache: &Arc<PageCache>, model: &Model) -> (InMemoryLayer, PathBuf) {
    write_with(dir, cache, model, Compression::Off)
}

/// [`write`], with the flush's writer compressing as `compression` says.
fn write_with(
    dir: &Path,
    cache: &Arc<PageCache>,
    model: &Model,
    compression: Compression,
) -> (InMemoryLayer, PathBuf) {
    let layer =
        InMemoryLayer::create(dir, cache.clone(), Lsn(100), DEFAULT_MAX_VALUE_SIZE).unwrap();
    // Puts must come in LSN order, not key order.
    let mut by_lsn: Vec<_> = model.iter().collect();
    by_lsn.sort_by_key(|((_, lsn), _)| *lsn);
    for ((k, lsn), v) in by_lsn {
        layer.put(*k, *lsn, v).unwrap();
    }
    let end = Lsn(layer.last_lsn().0 + 1);
    layer.freeze(end).unwrap();
    let written = layer
        .write_to_disk(dir, TENANT, TIMELINE, compression)
        .unwrap()
        .expect("non-empty layer");
    assert_eq!(written.summary.entries, model.len() as u64);
    let path = written.path;
    (layer, path)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Flushing an in-memory layer keeps every version, and the delta layer answers every
    /// (key, lsn) lookup exactly as the in-memory layer did.
    #[test]
    fn delta_layer_answers_like_the_in_memory_layer(
        model in model_strategy(),
        probes in prop::collection::vec((0u32..13, 90u64..300), 40),
        compression in compression_strategy(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let cache = small_cache(64);
        let (mem, path) = write_with(dir.path(), &cache, &model, compression);
        let disk = DeltaLayer::open(&path, cache.clone(), DEFAULT_MAX_VALUE_SIZE).unwrap();
        let all = disk.iter().unwrap();
        let expected: Vec<_> = model.iter().map(|((k, l), v)| (*k, *l, v.clone())).collect();
        prop_assert_eq!(all, expected.clone());
        // What compaction merges, through the `Layer` interface, from either kind.
        let mem = Layer::InMemory(Arc::new(mem));
        let disk = Layer::Delta(Arc::new(disk));
        for layer in [&mem, &disk] {
            let streamed: Vec<_> = layer.versions().unwrap().collect::<Result<_, _>>().unwrap();
            prop_assert!(streamed == expected);
        }
        for (k, at) in probes {
            let from_disk = disk.get(rel_key(k), Lsn(at)).unwrap();
            let from_mem = mem.get(rel_key(k), Lsn(at)).unwrap();
            prop_assert_eq!(&from_disk.records, &from_mem.records);
            prop_assert_eq!(from_disk.complete, from_mem.complete);
        }
    }

    /// Any single flipped bit anywhere in the file: opening and reading either fail with a
    /// corruption error naming the file, or give exactly the right answers. Never a panic,
    /// never a wrong page.
    #[test]
    fn a_flipped_bit_is_an_error_or_harmless(
        model in model_strategy(),
        position in any::<prop::sample::Index>(),
        bit in 0u8..8,
        compression in compression_strategy(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let cache = small_cache(64);
        let (mem, path) = write_with(dir.path(), &cache, &model, compression);
        let mut bytes = std::fs::read(&path).unwrap();
        let at = position.index(bytes.len());
        bytes[at] ^= 1 << bit;
        std::fs::write(&path, &bytes).unwrap();

        let expected: Vec<_> = model.iter().map(|((k, l), v)| (*k, *l, v.clone())).collect();
        let is_reported = |e: &LayerFileError| {
            matches!(e, LayerFileError::Corrupt { .. })
                && e.to_string().contains(path.file_name().unwrap().to_str().unwrap())
        };
        let disk = match DeltaLayer::open(&path, cache.clone(), DEFAULT_MAX_VALUE_SIZE) {
            Ok(disk) => disk,
            Err(e) => {
                prop_assert!(is_reported(&e), "{e}");
                return Ok(());
            }
        };
        // Every point read, twice: a value is read from the file the first time its blocks are
        // needed and where it lies in the cache after that, and neither may give a wrong answer
        // or an unreported error.
        for pass in 0..2 {
            for ((k, lsn), _) in model.iter() {
                match disk.get(*k, *lsn) {
                    Ok(got) => prop_assert_eq!(
                        got.records,
                        mem.get(*k, *lsn).unwrap().records,
                        "flip at byte {} changed an answer (pass {})", at, pass
                    ),
                    Err(e) => prop_assert!(is_reported(&e), "{e}"),
                }
            }
        }
        match disk.iter() {
            Ok(all) => prop_assert_eq!(all, expected, "flip at byte {} changed an answer", at),
            Err(e) => prop_assert!(is_reported(&e), "{e}"),
        }
    }
}

/// A damaged value is the same error read from the file and read again from the page cache,
/// and its neighbours in the same block read right.
#[test]
fn a_damaged_value_is_the_same_error_from_the_file_and_from_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(64);
    let model = small_images();
    let (_, path) = write(dir.path(), &cache, &model);
    // Each value: a 1-byte length header, the kind byte, 100 bytes, a 4-byte CRC-32C.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[PAGE_SZ + 3 * 106 + 2 + 50] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();
    let layer = DeltaLayer::open(&path, cache.clone(), DEFAULT_MAX_VALUE_SIZE).unwrap();
    let cold = layer.get(rel_key(3), Lsn(200)).unwrap_err().to_string();
    assert!(cold.contains("checksum mismatch"), "{cold}");
    let inserts = cache.stats().file_pages.inserts;
    for _ in 0..2 {
        let hot = layer.get(rel_key(3), Lsn(200)).unwrap_err().to_string();
        assert_eq!(hot, cold);
    }
    assert_eq!(
        cache.stats().file_pages.inserts,
        inserts,
        "read from the cache"
    );
    for key in [2, 4] {
        let records = layer.get(rel_key(key), Lsn(200)).unwrap().records;
        assert_eq!(
            records,
            vec![(
                Lsn(100 + u64::from(key)),
                model[&(rel_key(key), Lsn(100 + u64::from(key)))].clone()
            )]
        );
    }
}

/// Pages that compress (a heap page's rows) are stored compressed in a version 2 file, read back
/// the same, and take a fraction of the plain file's bytes; a value too short or random to
/// gain is stored as it is beside them.
#[test]
fn a_compressing_writer_stores_compressible_values_compressed() {
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(64);
    let mut model = Model::new();
    for k in 0..40u32 {
        let mut page = vec![0u8; PAGE_SZ];
        for (i, row) in page[64..].chunks_mut(97).enumerate() {
            let text = format!("{k:4} | {i:6} | {}", "x".repeat(90));
            row.copy_from_slice(&text.as_bytes()[..row.len()]);
        }
        model.insert(
            (rel_key(k), Lsn(100 + u64::from(k))),
            Value::Image(Bytes::from(page)),
        );
    }
    let noise = noise(PAGE_SZ);
    model.insert((rel_key(40), Lsn(200)), Value::Image(Bytes::from(noise)));
    model.insert(
        (rel_key(41), Lsn(201)),
        Value::Delta {
            will_init: false,
            patches: vec![Patch::new(8, vec![1, 2, 3])],
        },
    );

    let (_, plain) = write(dir.path(), &cache, &model);
    let plain_dir = tempfile::tempdir().unwrap();
    std::fs::rename(&plain, plain_dir.path().join("plain")).unwrap();
    let (_, packed) = write_with(dir.path(), &cache, &model, Compression::Zstd { level: 1 });
    let plain = DeltaLayer::open(
        &plain_dir.path().join("plain"),
        cache.clone(),
        DEFAULT_MAX_VALUE_SIZE,
    )
    .unwrap();
    let packed = DeltaLayer::open(&packed, cache.clone(), DEFAULT_MAX_VALUE_SIZE).unwrap();
    assert_eq!(plain.summary().format_version, DELTA_FORMAT_VERSION_PLAIN);
    assert_eq!(packed.summary().format_version, DELTA_FORMAT_VERSION);
    let expected: Vec<_> = model
        .iter()
        .map(|((k, l), v)| (*k, *l, v.clone()))
        .collect();
    assert_eq!(packed.iter().unwrap(), expected);
    assert_eq!(plain.iter().unwrap(), expected);
    for ((k, lsn), v) in &model {
        assert_eq!(
            packed.get(*k, *lsn).unwrap().records,
            vec![(*lsn, v.clone())]
        );
    }
    // 42 values of which 41 are pages: plain, more than 41 pages of values; compressed, the 40
    // heap pages take less than a quarter of theirs (the noise page stays whole).
    assert!(plain.summary().values_end > 41 * PAGE_SZ as u64);
    assert!(
        packed.summary().values_end < 12 * PAGE_SZ as u64,
        "values end at byte {}",
        packed.summary().values_end
    );
    let report = packed.verify().unwrap();
    assert_eq!((report.entries, report.compressed), (42, 40));
}

/// A version 1 file has no compressed values: one that holds a compressed value (a version 2
/// file whose summary was rewritten to say version 1, CRC and all) is corrupt, and says so.
#[test]
fn a_compressed_value_in_a_version_1_file_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(64);
    let model: Model = [(
        (rel_key(1), Lsn(100)),
        Value::Image(Bytes::from(vec![5u8; PAGE_SZ])),
    )]
    .into();
    let (_, path) = write_with(dir.path(), &cache, &model, Compression::Zstd { level: 1 });
    // A reader whose value limit is below the page's refuses the frame's content size.
    let small = DeltaLayer::open(&path, cache.clone(), 4096).unwrap();
    let err = small.iter().unwrap_err().to_string();
    assert!(err.contains("more than the"), "{err}");
    drop(small);

    let mut bytes = std::fs::read(&path).unwrap();
    let mut summary =
        Summary::decode(bytes[..PAGE_SZ].try_into().unwrap(), bytes.len() as u64).unwrap();
    summary.format_version = DELTA_FORMAT_VERSION_PLAIN;
    bytes[..PAGE_SZ].copy_from_slice(&summary.encode()[..]);
    std::fs::write(&path, &bytes).unwrap();
    let layer = DeltaLayer::open(&path, cache.clone(), DEFAULT_MAX_VALUE_SIZE).unwrap();
    let err = layer.get(rel_key(1), Lsn(100)).unwrap_err().to_string();
    assert!(err.contains("is compressed, in a version 1 file"), "{err}");
}

#[test]
fn truncated_file_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(64);
    let model: Model = (0..50)
        .map(|i| {
            (
                (rel_key(i % 5), Lsn(100 + u64::from(i))),
                Value::Image(Bytes::from(vec![i as u8; PAGE_SZ])),
            )
        })
        .collect();
    let (_, path) = write(dir.path(), &cache, &model);
    let len = std::fs::metadata(&path).unwrap().len();
    for cut in [0, 100, PAGE_SZ as u64, len / 2, len - 1] {
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(cut).unwrap();
        let result = DeltaLayer::open(&path, cache.clone(), DEFAULT_MAX_VALUE_SIZE)
            .and_then(|l| l.iter().map(drop));
        let err = result.expect_err("a truncated layer must not read back");
        assert!(
            matches!(err, LayerFileError::Corrupt { .. }),
            "cut at {cut}: {err}"
        );
    }
}

#[test]
fn creation_is_atomic_and_names_encode_the_ranges() {
    let dir = tempfile::tempdir().unwrap();
    let temp_files = || {
        std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_str()
                    .unwrap()
                    .ends_with(TEMP_SUFFIX)
            })
            .count()
    };
    // Dropped before finish: nothing is left.
    let mut writer = DeltaLayerWriter::new(dir.path(), TENANT, TIMELINE, Lsn(10), Lsn(20)).unwrap();
    writer
        .put_value(rel_key(1), Lsn(10), &Value::Image(Bytes::from_static(b"x")))
        .unwrap();
    assert_eq!(temp_files(), 1);
    drop(writer);
    assert_eq!(temp_files(), 0);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);

    // Out-of-order and out-of-range puts are refused.
    let mut writer = DeltaLayerWriter::new(dir.path(), TENANT, TIMELINE, Lsn(10), Lsn(20)).unwrap();
    let v = Value::Image(Bytes::from_static(b"v"));
    writer.put_value(rel_key(2), Lsn(11), &v).unwrap();
    assert!(writer.put_value(rel_key(1), Lsn(12), &v).is_err());
    assert!(writer.put_value(rel_key(3), Lsn(20), &v).is_err());
    writer.put_value(rel_key(3), Lsn(19), &v).unwrap();
    let WrittenLayer {
        path,
        summary,
        size,
        crc32c,
    } = writer.finish().unwrap();
    assert_eq!(temp_files(), 0);
    assert_eq!(size, std::fs::metadata(&path).unwrap().len());
    // The CRC-32C computed while writing is the file's.
    assert_eq!(
        crc32c,
        utils::crc32c::crc32c(&std::fs::read(&path).unwrap())
    );
    assert_eq!(
        path.file_name().unwrap().to_str().unwrap(),
        format!(
            "{}-{}__000000000000000A-0000000000000014",
            rel_key(2),
            rel_key(4)
        )
    );
    assert_eq!(
        (summary.key_start, summary.key_end),
        (rel_key(2), rel_key(4))
    );
    let layer = DeltaLayer::open(&path, small_cache(64), DEFAULT_MAX_VALUE_SIZE).unwrap();
    assert_eq!(layer.summary(), &summary);
    // Outside the key range or below the LSN range: nothing, without reading the index.
    assert!(layer.get(rel_key(1), Lsn(15)).unwrap().records.is_empty());
    assert!(layer.get(rel_key(2), Lsn(9)).unwrap().records.is_empty());
    assert_eq!(layer.get(rel_key(3), Lsn(19)).unwrap().records.len(), 1);
}

/// Twenty small images, one per key: a layer whose index is a single leaf.
fn small_images() -> Model {
    (0..20)
        .map(|i| {
            (
                (rel_key(i), Lsn(100 + u64::from(i))),
                Value::Image(Bytes::from(vec![i as u8; 100])),
            )
        })
        .collect()
}

#[test]
fn a_corrupt_index_block_is_never_cached_so_every_read_sees_the_damage() {
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(64);
    let model = small_images();
    let (_, path) = write(dir.path(), &cache, &model);
    let layer = DeltaLayer::open(&path, cache.clone(), DEFAULT_MAX_VALUE_SIZE).unwrap();
    // The index is one leaf, its root: damage a key byte in it (covered by the checksum only,
    // so once trusted, it would silently misdirect lookups).
    let root = u64::from(layer.summary().index_start_blk + layer.summary().index_root_blk);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[(root * PAGE_SZ as u64) as usize + 20] ^= 0x10;
    std::fs::write(&path, &bytes).unwrap();
    let layer = DeltaLayer::open(&path, cache.clone(), DEFAULT_MAX_VALUE_SIZE).unwrap();
    for attempt in 0..2 {
        let err = layer.get(rel_key(3), Lsn(200)).unwrap_err();
        assert!(
            err.to_string().contains("checksum"),
            "attempt {attempt}: {err}"
        );
    }
    assert_eq!(cache.stats().index_pages.inserts, 0);
}

#[test]
fn an_index_block_is_read_once_then_hit() {
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(64);
    let model = small_images();
    let (_, path) = write(dir.path(), &cache, &model);
    let layer = DeltaLayer::open(&path, cache.clone(), DEFAULT_MAX_VALUE_SIZE).unwrap();
    for ((key, lsn), value) in &model {
        let records = layer.get(*key, *lsn).unwrap().records;
        assert_eq!(records, vec![(*lsn, value.clone())]);
    }
    let index = cache.stats().index_pages;
    assert_eq!((index.inserts, index.misses), (1, 1), "read once, then hit");
    assert!(index.hits >= 19, "{index:?}");
}

/// A layer of several writeback steps (`layer_file::WRITEBACK_STEP`): writeback started as it
/// is written changes nothing in it. Every value reads back, the whole file verifies, and the
/// CRC-32C computed while writing is the file's.
#[test]
fn a_layer_larger_than_a_writeback_step_reads_back_whole() {
    use crate::tenant::storage_layer::layer_file::WRITEBACK_STEP;
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(64);
    let keys = (3 * WRITEBACK_STEP / PAGE_SZ as u64) as u32;
    let model: Model = (0..keys)
        .map(|i| {
            let page: Vec<u8> = (0..PAGE_SZ).map(|b| (i as usize * 31 + b) as u8).collect();
            (
                (rel_key(i), Lsn(100 + u64::from(i))),
                Value::Image(page.into()),
            )
        })
        .collect();
    let mut writer = DeltaLayerWriter::new(
        dir.path(),
        TENANT,
        TIMELINE,
        Lsn(100),
        Lsn(100 + 1 + u64::from(keys)),
    )
    .unwrap();
    for ((key, lsn), value) in &model {
        writer.put_value(*key, *lsn, value).unwrap();
    }
    let written = writer.finish().unwrap();
    let bytes = std::fs::read(&written.path).unwrap();
    assert!(bytes.len() as u64 > 3 * WRITEBACK_STEP);
    assert_eq!(written.size, bytes.len() as u64);
    assert_eq!(written.crc32c, utils::crc32c::crc32c(&bytes));
    let layer = DeltaLayer::open(&written.path, cache, DEFAULT_MAX_VALUE_SIZE).unwrap();
    layer.verify().unwrap();
    for ((key, lsn), value) in &model {
        let found = layer.get(*key, *lsn).unwrap();
        assert_eq!(found.records, vec![(*lsn, value.clone())]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// An undated writer dated at L makes the very file a writer of the range [L, L+1) makes
    /// from the same versions: the same name and the same bytes.
    #[test]
    fn an_undated_layer_is_the_dated_one(
        values in prop::collection::btree_map(0u32..5000, value_strategy(), 1..60),
        lsn in 1u64..u64::MAX / 2,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let lsn = Lsn(lsn);
        let mut dated =
            DeltaLayerWriter::new(dir.path(), TENANT, TIMELINE, lsn, Lsn(lsn.0 + 1)).unwrap();
        let mut undated = DeltaLayerWriter::new_undated(dir.path(), TENANT, TIMELINE).unwrap();
        for (k, v) in &values {
            dated.put_value(rel_key(*k), lsn, v).unwrap();
            undated.put_undated(rel_key(*k), v).unwrap();
        }
        let dated = dated.finish().unwrap();
        let dated_bytes = std::fs::read(&dated.path).unwrap();
        std::fs::remove_file(&dated.path).unwrap();
        let undated = undated.finish_at(lsn, lsn).unwrap();
        prop_assert_eq!(&undated.path, &dated.path);
        prop_assert_eq!(std::fs::read(&undated.path).unwrap(), dated_bytes);
        prop_assert_eq!(undated.crc32c, dated.crc32c);
    }
}

#[test]
fn an_undated_writer_refuses_keys_out_of_order_and_the_dated_calls() {
    let dir = tempfile::tempdir().unwrap();
    let image = Value::Image(Bytes::from(vec![3u8; PAGE_SZ]));
    let mut undated = DeltaLayerWriter::new_undated(dir.path(), TENANT, TIMELINE).unwrap();
    undated.put_undated(rel_key(5), &image).unwrap();
    let written = undated.values_bytes();
    for k in [5, 4] {
        let e = undated.put_undated(rel_key(k), &image).unwrap_err();
        assert!(e.to_string().contains("does not follow"), "{e}");
    }
    let e = undated.put_value(rel_key(6), Lsn(0), &image).unwrap_err();
    assert!(e.to_string().contains("undated"), "{e}");
    assert_eq!(
        undated.values_bytes(),
        written,
        "a refused value writes nothing"
    );
    let e = undated.finish().unwrap_err();
    assert!(e.to_string().contains("finish_at"), "{e}");

    let mut dated = DeltaLayerWriter::new(dir.path(), TENANT, TIMELINE, Lsn(1), Lsn(9)).unwrap();
    let e = dated.put_undated(rel_key(1), &image).unwrap_err();
    assert!(e.to_string().contains("dated"), "{e}");
    dated.put_value(rel_key(1), Lsn(2), &image).unwrap();
    let e = dated.finish_at(Lsn(2), Lsn(2)).unwrap_err();
    assert!(e.to_string().contains("not undated"), "{e}");
    // Every writer above was dropped or failed: no file is left.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
