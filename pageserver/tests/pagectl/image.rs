//! `pagectl layer ...` on an image layer written with `ImageLayerWriter`: the same commands as
//! for a delta layer, the kind told by the file's name or, under another name, its magic.

use pageserver::tenant::storage_layer::image_layer::ImageLayerWriter;

use super::*;

const IMAGE_LSN: Lsn = Lsn(0x1800);

/// The fixture's images: an 8 KiB page, a 100-byte one, and another 8 KiB page, which does not
/// fit in the rest of the second block and so starts the third (8092 bytes of padding).
fn fixture_images() -> Vec<(Key, Bytes)> {
    vec![
        (key(1), page(0xAB, PAGE_SZ)),
        (key(3), page(0x5A, 100)),
        (key(4), page(0x11, PAGE_SZ)),
    ]
}

fn image_fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let mut writer =
        ImageLayerWriter::new(dir.path(), TENANT, TIMELINE, key(1)..key(10), IMAGE_LSN).unwrap();
    for (k, image) in fixture_images() {
        writer.put_image(k, &image).unwrap();
    }
    let written = writer.finish().unwrap();
    assert_eq!(written.summary.values_end, 4 * PAGE_SZ as u64);
    Fixture {
        dir,
        layer: written.path,
    }
}

fn image_name() -> String {
    format!("{}-{}__0000000000001800", k1(), key(10))
}

fn expected_image_index() -> Vec<String> {
    vec![
        format!("{} 0/1800 offset=8192 len=8192", k1()),
        format!("{} 0/1800 offset=16384 len=100", key(3)),
        format!("{} 0/1800 offset=24576 len=8192", key(4)),
    ]
}

fn expected_images() -> Vec<String> {
    vec![
        format!("{} 0/1800 image len=8192 crc={}", k1(), crc(0xAB, PAGE_SZ)),
        format!("{} 0/1800 image len=100 crc={}", key(3), crc(0x5A, 100)),
        format!(
            "{} 0/1800 image len=8192 crc={}",
            key(4),
            crc(0x11, PAGE_SZ)
        ),
    ]
}

fn image_verify_line(path: &Path, manifest: &str) -> String {
    format!(
        "{}: ok: lsn=0/1800 entries=3 image_bytes=16484 compressed=0 padding_bytes=8092 value_blocks=3 \
         checksum_blocks=1 index_blocks=1 manifest: {manifest}",
        path.display()
    )
}

#[test]
fn image_summary_prints_every_field() {
    let f = image_fixture();
    assert_eq!(f.layer.file_name().unwrap().to_str().unwrap(), image_name());
    let expected = [
        format!("file:              {}", f.layer.display()),
        "magic:             0x494d474c (IMGL)".to_owned(),
        "format version:    1".to_owned(),
        format!("tenant:            {TENANT}"),
        format!("timeline:          {TIMELINE}"),
        format!("key start:         {}", k1()),
        format!("key end:           {} (exclusive)", key(10)),
        "lsn:               0/1800".to_owned(),
        "checksums start:   block 4 (byte 32768, 1 blocks)".to_owned(),
        "index start:       block 5 (byte 40960)".to_owned(),
        "index root:        block 0 (file block 5)".to_owned(),
        "entries:           3".to_owned(),
        "values end:        byte 32768 (3 value blocks)".to_owned(),
        "file size:         49152 bytes (6 blocks)".to_owned(),
        format!("implied file name: {}", image_name()),
        "file name:         matches".to_owned(),
    ];
    assert_eq!(lines(layer_cmd("summary", &f.layer, &[])), expected);

    // Under a name that is not a layer's, the magic says it is an image layer.
    let copy = f.dir.path().join("copied-image");
    std::fs::copy(&f.layer, &copy).unwrap();
    let out = lines(layer_cmd("summary", &copy, &[]));
    assert_eq!(out[1], expected[1]);
    assert_eq!(
        out.last().unwrap(),
        "file name:         does NOT match the file's name"
    );
}

#[test]
fn image_index_and_values_list_every_image() {
    let f = image_fixture();
    let index = expected_image_index();
    let images = expected_images();
    assert_eq!(lines(layer_cmd("index", &f.layer, &[])), index);
    assert_eq!(
        lines(layer_cmd("index", &f.layer, &["--limit", "2"])),
        index[..2]
    );
    let k3 = key(3).to_string();
    assert_eq!(
        lines(layer_cmd("index", &f.layer, &["--key", &k3])),
        index[1..2]
    );
    assert!(lines(layer_cmd("index", &f.layer, &["--key", &k2()])).is_empty());

    assert_eq!(lines(layer_cmd("values", &f.layer, &[])), images);
    assert_eq!(
        lines(layer_cmd("values", &f.layer, &["--key", &k3])),
        images[1..2]
    );
    // Every image is at the layer's LSN: at or above it all are listed, below it none.
    assert_eq!(
        lines(layer_cmd("values", &f.layer, &["--lsn", "0/1800"])),
        images
    );
    assert!(lines(layer_cmd("values", &f.layer, &["--lsn", "0/17FF"])).is_empty());

    // The raw bytes are the page as stored.
    let out = lines(layer_cmd(
        "values",
        &f.layer,
        &["--key", &k3, "--raw", "--raw-bytes", "16"],
    ));
    assert_eq!(
        out,
        [
            images[1].clone(),
            format!("    00000000 {}  |{}|", " 5a".repeat(16), "Z".repeat(16)),
            "    ... 84 more bytes (--raw-bytes shows more)".to_owned(),
        ]
    );
}

#[test]
fn image_get_returns_the_image_or_says_there_is_none() {
    let f = image_fixture();
    let get = |k: Key, lsn: &str| {
        let k = k.to_string();
        lines(layer_cmd("get", &f.layer, &["--key", &k, "--lsn", lsn]))
    };
    let images = expected_images();
    for lsn in ["0/1800", "0/FFFFFF"] {
        assert_eq!(
            get(key(3), lsn),
            [
                images[1].clone(),
                "1 version, complete: the oldest version listed needs no older history".to_owned()
            ]
        );
    }
    // In the key range without an image: the key had no page, and the read stops here.
    assert_eq!(
        get(key(2), "0/1800"),
        ["0 versions, complete: the key had no page at the layer's LSN, older layers are not read"]
    );
    // Below the layer's LSN, or outside its keys: older layers answer.
    let incomplete = ["0 versions, incomplete: older layers are read too"];
    assert_eq!(get(key(3), "0/17FF"), incomplete);
    assert_eq!(get(key(10), "0/1800"), incomplete);
}

#[test]
fn image_verify_checks_the_file_and_the_manifest_beside_it() {
    let f = image_fixture();
    assert_eq!(
        lines(layer_cmd("verify", &f.layer, &[])),
        [image_verify_line(&f.layer, "none beside it")]
    );

    let bytes = std::fs::read(&f.layer).unwrap();
    let mut manifest = Manifest::empty(TENANT, TIMELINE);
    manifest.disk_consistent_lsn = IMAGE_LSN;
    manifest.add_layer(LayerFileEntry {
        name: image_name(),
        size: bytes.len() as u64,
        crc32c: utils::crc32c::crc32c(&bytes),
        level: LayerLevel::Image,
        group_size: 1,
    });
    manifest.store(f.dir.path()).unwrap();
    assert_eq!(
        lines(layer_cmd("verify", &f.layer, &[])),
        [image_verify_line(
            &f.layer,
            "listed as image, size and crc32c match"
        )]
    );

    // A manifest whose disk_consistent_lsn is below the image's LSN: the page server refuses it.
    manifest.disk_consistent_lsn = Lsn(IMAGE_LSN.0 - 1);
    manifest.store(f.dir.path()).unwrap();
    let err = error_of(layer_cmd("verify", &f.layer, &[]), &f.layer);
    assert!(
        err.contains("beyond the manifest's disk_consistent_lsn"),
        "{err}"
    );
    manifest.disk_consistent_lsn = IMAGE_LSN;

    // A delta layer's bytes under the image's listed name and size: refused as not an image.
    let delta = fixture();
    let delta_bytes = std::fs::read(&delta.layer).unwrap();
    std::fs::write(&f.layer, &delta_bytes).unwrap();
    manifest.add_layer(LayerFileEntry {
        name: image_name(),
        size: delta_bytes.len() as u64,
        crc32c: utils::crc32c::crc32c(&delta_bytes),
        level: LayerLevel::Image,
        group_size: 1,
    });
    manifest.store(f.dir.path()).unwrap();
    let err = error_of(layer_cmd("verify", &f.layer, &[]), &f.layer);
    assert!(
        err.contains("image layer") && err.contains("bad magic"),
        "{err}"
    );
}

#[test]
fn image_verify_fails_on_a_corrupted_image_layer() {
    let f = image_fixture();
    let good = std::fs::read(&f.layer).unwrap();
    let bad = same_name_elsewhere(&f, "flipped");
    let write_flipped = |pos: usize| {
        let mut b = good.clone();
        b[pos] ^= 0x10;
        std::fs::write(&bad, &b).unwrap();
    };

    // A byte of the second image: the index still lists it, reading it fails.
    write_flipped(2 * PAGE_SZ + 10);
    assert_eq!(lines(layer_cmd("index", &bad, &[])), expected_image_index());
    let err = error_of(layer_cmd("verify", &bad, &[]), &bad);
    assert!(
        err.contains("image layer") && err.contains("value block 2: checksum mismatch"),
        "{err}"
    );
    let k3 = key(3).to_string();
    let err = error_of(
        layer_cmd("get", &bad, &["--key", &k3, "--lsn", "0/1800"]),
        &bad,
    );
    assert!(err.contains("checksum mismatch"), "{err}");

    // The padding after it, the checksum table and the index: all covered.
    for (pos, what) in [
        (2 * PAGE_SZ + 500, "checksum mismatch"),
        (4 * PAGE_SZ + 2, "checksum table block 4"),
        (5 * PAGE_SZ + 40, "B-tree block 0"),
    ] {
        write_flipped(pos);
        let err = error_of(layer_cmd("verify", &bad, &[]), &bad);
        assert!(err.contains(what), "byte {pos}: {err}");
    }

    // One bit flipped every 97 bytes through the whole file: verify reports every one.
    for pos in (0..good.len()).step_by(97) {
        let mut b = good.clone();
        b[pos] ^= 1 << (pos % 8);
        std::fs::write(&bad, &b).unwrap();
        error_of(layer_cmd("verify", &bad, &[]), &bad);
    }

    // Cut short.
    std::fs::write(&bad, &good[..good.len() - 1]).unwrap();
    for sub in ["summary", "index", "values", "get", "verify"] {
        let extra: &[&str] = if sub == "get" {
            &["--key", &k3, "--lsn", "0/1800"]
        } else {
            &[]
        };
        let err = error_of(layer_cmd(sub, &bad, extra), &bad);
        assert!(
            err.contains("image layer") && err.contains("corrupt"),
            "{sub}: {err}"
        );
    }
}
