//! `pagectl` end to end: a real delta layer written with `DeltaLayerWriter`, inspected by the
//! real binary, with the output checked line by line; then truncated, bit-flipped, missing and
//! misnamed inputs, which must give exit code 1 and a one-line error naming the file, never a
//! panic. Image layers are in `pagectl/image.rs`, `pagectl draw` in `pagectl/draw.rs`. The
//! commands that talk to a server run against a real one (`pagectl/server.rs`): `import` and
//! `basebackup` in `pagectl/datadir.rs`, `getpage` in `pagectl/getpage.rs`.

use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use bytes::Bytes;
use pageserver::tenant::storage_layer::delta_layer::DeltaLayerWriter;
use pageserver::tenant::timeline::layer_set::manifest::{LayerFileEntry, LayerLevel, Manifest};
use pageserver::PAGE_SZ;
use pageserver_api::value::Patch;
use pageserver_api::{Key, Value};
use utils::{Lsn, TenantId, TimelineId};

#[path = "pagectl/datadir.rs"]
mod datadir;
#[path = "pagectl/draw.rs"]
mod draw;
#[path = "pagectl/getpage.rs"]
mod getpage;
#[path = "pagectl/image.rs"]
mod image;
#[path = "pagectl/server.rs"]
mod server;

const TENANT: TenantId = TenantId::from_bytes([0x11; 16]);
const TIMELINE: TimelineId = TimelineId::from_bytes([0x22; 16]);
const LSN_START: Lsn = Lsn(0x1000);
const LSN_END: Lsn = Lsn(0x2000);

/// Where the fixture's values end and its index begins (see `fixture_values`).
const VALUES_END: u64 = 24812;
const INDEX_START_BLK: u64 = 4;

fn key(n: u32) -> Key {
    Key::rel_block(1663, 5, 16384, 0, n)
}

fn k1() -> String {
    key(1).to_string()
}

fn k2() -> String {
    key(2).to_string()
}

fn k7() -> String {
    key(7).to_string()
}

fn delta(will_init: bool, patches: &[(u32, &[u8])]) -> Value {
    Value::Delta {
        will_init,
        patches: patches
            .iter()
            .map(|(offset, data)| Patch::new(*offset, Bytes::copy_from_slice(data)))
            .collect(),
    }
}

fn page(fill: u8, len: usize) -> Bytes {
    Bytes::from(vec![fill; len])
}

/// The fixture's versions in (key, lsn) order: images of both blob header sizes, deltas with
/// and without `will_init`.
fn fixture_values() -> Vec<(Key, Lsn, Value)> {
    vec![
        (key(1), Lsn(0x1000), Value::Image(page(0xAB, PAGE_SZ))),
        (
            key(1),
            Lsn(0x1010),
            delta(false, &[(0, b"hello"), (4096, &[1, 2, 3, 4])]),
        ),
        (key(1), Lsn(0x1020), delta(false, &[(16, &[9; 8])])),
        (
            key(2),
            Lsn(0x1008),
            delta(true, &[(0, b"ABCDEFGHIJKLMNOP")]),
        ),
        (key(2), Lsn(0x1030), delta(false, &[(100, b"xyz")])),
        (key(7), Lsn(0x1018), Value::Image(page(0, PAGE_SZ))),
        (key(7), Lsn(0x1040), Value::Image(page(0x5A, 100))),
    ]
}

struct Fixture {
    dir: tempfile::TempDir,
    layer: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let mut writer =
        DeltaLayerWriter::new(dir.path(), TENANT, TIMELINE, LSN_START, LSN_END).unwrap();
    for (k, lsn, value) in fixture_values() {
        writer.put_value(k, lsn, &value).unwrap();
    }
    let written = writer.finish().unwrap();
    assert_eq!(written.summary.values_end, VALUES_END);
    Fixture {
        dir,
        layer: written.path,
    }
}

fn pagectl<S: AsRef<OsStr>>(args: impl IntoIterator<Item = S>) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pagectl"))
        .args(args)
        .output()
        .expect("pagectl runs")
}

fn layer_cmd(sub: &str, file: &Path, extra: &[&str]) -> Output {
    let mut args: Vec<&OsStr> = vec!["layer".as_ref(), sub.as_ref(), file.as_os_str()];
    args.extend(extra.iter().map(|a| OsStr::new(*a)));
    pagectl(args)
}

/// Asserts success with nothing on stderr; returns stdout.
fn stdout_of(out: Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "pagectl failed: {stderr}");
    assert!(stderr.is_empty(), "unexpected stderr: {stderr}");
    String::from_utf8(out.stdout).unwrap()
}

fn lines(out: Output) -> Vec<String> {
    stdout_of(out).lines().map(str::to_owned).collect()
}

/// Asserts exit code 1 and a one-line error that names `file`; returns that line.
fn error_of(out: Output, file: &Path) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "pagectl panicked: {stderr}");
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line expected: {stderr}");
    assert!(
        stderr.starts_with("pagectl: "),
        "unexpected message: {stderr}"
    );
    assert!(
        stderr.contains(&file.display().to_string()),
        "{stderr} does not name {}",
        file.display()
    );
    stderr
}

fn index_line(k: &str, lsn: &str, offset: u64, will_init: bool, len: u64) -> String {
    format!("{k} {lsn} offset={offset} will_init={will_init} len={len}")
}

/// The index of the fixture, as `layer index` prints it. The offsets follow from the blob
/// format: a 4-byte header for blobs of 128 bytes or more, else 1 byte; each blob is the
/// serialized value and a 4-byte checksum.
fn expected_index() -> Vec<String> {
    vec![
        index_line(&k1(), "0/1000", 8192, true, 8193),
        index_line(&k1(), "0/1010", 16393, false, 29),
        index_line(&k1(), "0/1020", 16427, false, 20),
        index_line(&k2(), "0/1008", 16452, true, 28),
        index_line(&k2(), "0/1030", 16485, false, 15),
        index_line(&k7(), "0/1018", 16505, true, 8193),
        index_line(&k7(), "0/1040", 24706, true, 101),
    ]
}

fn crc(fill: u8, len: usize) -> String {
    format!("{:#010x}", utils::crc32c::crc32c(&vec![fill; len]))
}

fn expected_values() -> Vec<String> {
    vec![
        format!("{} 0/1000 image len=8192 crc={}", k1(), crc(0xAB, PAGE_SZ)),
        format!(
            "{} 0/1010 delta will_init=false patches=[(0,5),(4096,4)]",
            k1()
        ),
        format!("{} 0/1020 delta will_init=false patches=[(16,8)]", k1()),
        format!("{} 0/1008 delta will_init=true patches=[(0,16)]", k2()),
        format!("{} 0/1030 delta will_init=false patches=[(100,3)]", k2()),
        format!("{} 0/1018 image len=8192 crc={}", k7(), crc(0, PAGE_SZ)),
        format!("{} 0/1040 image len=100 crc={}", k7(), crc(0x5A, 100)),
    ]
}

#[test]
fn keys_print_as_36_hex_digits() {
    assert_eq!(k1(), "000000067f00000005000040000000000001");
}

#[test]
fn summary_prints_every_field() {
    let f = fixture();
    let name = f.layer.file_name().unwrap().to_str().unwrap().to_owned();
    let expected_name = format!("{}-{}__0000000000001000-0000000000002000", k1(), key(8));
    assert_eq!(name, expected_name);
    let expected = [
        format!("file:              {}", f.layer.display()),
        "magic:             0x44454c54 (DELT)".to_owned(),
        "format version:    1".to_owned(),
        format!("tenant:            {TENANT}"),
        format!("timeline:          {TIMELINE}"),
        format!("key start:         {}", k1()),
        format!("key end:           {} (exclusive)", key(8)),
        "lsn start:         0/1000".to_owned(),
        "lsn end:           0/2000 (exclusive)".to_owned(),
        format!(
            "index start:       block {INDEX_START_BLK} (byte {})",
            INDEX_START_BLK * PAGE_SZ as u64
        ),
        format!("index root:        block 0 (file block {INDEX_START_BLK})"),
        "entries:           7".to_owned(),
        format!("values end:        byte {VALUES_END}"),
        "file size:         40960 bytes (5 blocks)".to_owned(),
        format!("implied file name: {expected_name}"),
        "file name:         matches".to_owned(),
    ];
    assert_eq!(lines(layer_cmd("summary", &f.layer, &[])), expected);

    // The same file under another name still opens; the mismatch is reported.
    let copy = f.dir.path().join("copied-layer");
    std::fs::copy(&f.layer, &copy).unwrap();
    let out = lines(layer_cmd("summary", &copy, &[]));
    assert_eq!(
        out.last().unwrap(),
        "file name:         does NOT match the file's name"
    );
}

#[test]
fn index_lists_entries_in_order() {
    let f = fixture();
    let all = expected_index();
    assert_eq!(lines(layer_cmd("index", &f.layer, &[])), all);
    assert_eq!(
        lines(layer_cmd("index", &f.layer, &["--limit", "3"])),
        all[..3]
    );
    assert!(lines(layer_cmd("index", &f.layer, &["--limit", "0"])).is_empty());
    assert_eq!(
        lines(layer_cmd("index", &f.layer, &["--key", &k2()])),
        all[3..5]
    );
    assert_eq!(
        lines(layer_cmd(
            "index",
            &f.layer,
            &["--key", &k2(), "--limit", "1"]
        )),
        all[3..4]
    );
    // The last key: its last value ends where the values do.
    assert_eq!(
        lines(layer_cmd("index", &f.layer, &["--key", &k7()])),
        all[5..]
    );
    // A key the layer does not hold, inside and outside its range.
    for absent in [key(3), key(100), Key::MIN] {
        let k = absent.to_string();
        assert!(lines(layer_cmd("index", &f.layer, &["--key", &k])).is_empty());
    }
}

#[test]
fn values_are_decoded_and_filtered() {
    let f = fixture();
    let all = expected_values();
    assert_eq!(lines(layer_cmd("values", &f.layer, &[])), all);
    assert_eq!(
        lines(layer_cmd("values", &f.layer, &["--key", &k1()])),
        all[..3]
    );
    assert_eq!(
        lines(layer_cmd(
            "values",
            &f.layer,
            &["--key", &k1(), "--lsn", "0/1010"]
        )),
        all[..2]
    );
    // --lsn keeps versions at or below it, of every key; decimal LSNs are accepted.
    let at_or_below_1018 = vec![
        all[0].clone(),
        all[1].clone(),
        all[3].clone(),
        all[5].clone(),
    ];
    assert_eq!(
        lines(layer_cmd("values", &f.layer, &["--lsn", "0/1018"])),
        at_or_below_1018
    );
    assert_eq!(
        lines(layer_cmd("values", &f.layer, &["--lsn", "4120"])),
        at_or_below_1018
    );
    assert_eq!(
        lines(layer_cmd(
            "values",
            &f.layer,
            &["--lsn", "0/1018", "--limit", "3"]
        )),
        at_or_below_1018[..3]
    );
    assert_eq!(
        lines(layer_cmd(
            "values",
            &f.layer,
            &["--key", &k7(), "--limit", "1"]
        )),
        all[5..6]
    );
}

#[test]
fn raw_dumps_the_stored_bytes_bounded() {
    let f = fixture();
    let out = lines(layer_cmd(
        "values",
        &f.layer,
        &["--key", &k2(), "--limit", "1", "--raw"],
    ));
    let expected = [
        format!("{} 0/1008 delta will_init=true patches=[(0,16)]", k2()),
        "    00000000  01 01 00 01 00 00 00 00 00 00 00 10 41 42 43 44  |............ABCD|"
            .to_owned(),
        "    00000010  45 46 47 48 49 4a 4b 4c 4d 4e 4f 50              |EFGHIJKLMNOP|".to_owned(),
    ];
    assert_eq!(out, expected);

    let out = lines(layer_cmd(
        "values",
        &f.layer,
        &["--key", &k1(), "--limit", "1", "--raw", "--raw-bytes", "20"],
    ));
    let expected = [
        expected_values()[0].clone(),
        format!(
            "    00000000  00{}  |.{}|",
            " ab".repeat(15),
            ".".repeat(15)
        ),
        format!("    00000010 {}{}  |....|", " ab".repeat(4), " ".repeat(36)),
        "    ... 8173 more bytes (--raw-bytes shows more)".to_owned(),
    ];
    assert_eq!(out, expected);

    // The default bound: 256 bytes, 16 lines, for an 8 KiB image.
    let out = lines(layer_cmd(
        "values",
        &f.layer,
        &["--key", &k7(), "--limit", "1", "--raw"],
    ));
    assert_eq!(out.len(), 1 + 16 + 1, "{out:#?}");
}

#[test]
fn get_lists_what_a_read_takes_newest_first() {
    let f = fixture();
    let all = expected_values();
    let get = |k: &str, lsn: &str| lines(layer_cmd("get", &f.layer, &["--key", k, "--lsn", lsn]));
    let complete = "complete: the oldest version listed needs no older history";
    assert_eq!(
        get(&k1(), "0/1FFF"),
        [
            all[2].clone(),
            all[1].clone(),
            all[0].clone(),
            format!("3 versions, {complete}")
        ]
    );
    assert_eq!(
        get(&k1(), "0/1015"),
        [
            all[1].clone(),
            all[0].clone(),
            format!("2 versions, {complete}")
        ]
    );
    // Below the layer's LSN range, and a key it does not hold.
    assert_eq!(
        get(&k1(), "0/FFF"),
        ["0 versions, incomplete: older layers are read too"]
    );
    assert_eq!(
        get(&key(3).to_string(), "0/1FFF"),
        ["0 versions, incomplete: older layers are read too"]
    );
}

#[test]
fn verify_accepts_a_sound_layer() {
    let f = fixture();
    assert_eq!(
        lines(layer_cmd("verify", &f.layer, &[])),
        [format!(
            "{}: ok: entries=7 images=3 deltas=4 wal_records=0 value_bytes=16579 compressed=0 index_blocks=1 manifest: none beside it",
            f.layer.display()
        )]
    );
}

/// A manifest beside the layer, as in a timeline directory: `verify` checks the file against
/// it as the page server does at startup, and its CRC-32C too.
#[test]
fn verify_checks_a_layer_against_the_manifest_beside_it() {
    let f = fixture();
    let name = f.layer.file_name().unwrap().to_str().unwrap().to_owned();
    let bytes = std::fs::read(&f.layer).unwrap();
    let entry = LayerFileEntry {
        name: name.clone(),
        size: bytes.len() as u64,
        crc32c: utils::crc32c::crc32c(&bytes),
        level: LayerLevel::L0,
        group_size: 1,
    };
    let mut manifest = Manifest::empty(TENANT, TIMELINE);
    manifest.disk_consistent_lsn = Lsn(LSN_END.0 - 1);
    manifest.add_layer(entry.clone());
    manifest.store(f.dir.path()).unwrap();
    assert_eq!(
        lines(layer_cmd("verify", &f.layer, &[])),
        [format!(
            "{}: ok: entries=7 images=3 deltas=4 wal_records=0 value_bytes=16579 compressed=0 index_blocks=1 manifest: listed as L0, size and crc32c match",
            f.layer.display()
        )]
    );

    // One byte of a value changed: every structure still checks out, the file's CRC does not.
    let mut flipped = bytes.clone();
    flipped[PAGE_SZ + 100] ^= 1;
    std::fs::write(&f.layer, &flipped).unwrap();
    let err = error_of(layer_cmd("verify", &f.layer, &[]), &f.layer);
    assert!(err.contains("CRC-32C"), "{err}");

    // Another tenant's layer of the same ranges and values under this name.
    std::fs::remove_file(&f.layer).unwrap();
    let other = TenantId::from_bytes([0x33; 16]);
    let mut writer =
        DeltaLayerWriter::new(f.dir.path(), other, TIMELINE, LSN_START, LSN_END).unwrap();
    for (k, lsn, value) in fixture_values() {
        writer.put_value(k, lsn, &value).unwrap();
    }
    assert_eq!(writer.finish().unwrap().path, f.layer);
    let err = error_of(layer_cmd("verify", &f.layer, &[]), &f.layer);
    assert!(
        err.contains(&format!("belongs to timeline {TIMELINE} of tenant {other}")),
        "{err}"
    );

    // A layer the manifest does not list, and a listed one renamed.
    std::fs::write(&f.layer, &bytes).unwrap();
    let unlisted = f.dir.path().join(format!(
        "{}-{}__0000000000000001-0000000000000002",
        k1(),
        k2()
    ));
    std::fs::copy(&f.layer, &unlisted).unwrap();
    let err = error_of(layer_cmd("verify", &unlisted, &[]), &unlisted);
    assert!(err.contains("the manifest does not list it"), "{err}");
    manifest.add_layer(LayerFileEntry {
        name: unlisted.file_name().unwrap().to_str().unwrap().to_owned(),
        ..entry
    });
    manifest.store(f.dir.path()).unwrap();
    let err = error_of(layer_cmd("verify", &unlisted, &[]), &unlisted);
    assert!(err.contains("not the one its name says"), "{err}");
}

#[test]
fn max_value_size_is_the_page_servers_limit() {
    let f = fixture();
    // The 8 KiB images are longer than a 4 KiB limit allows: corrupt, as the server would say.
    let out = pagectl([
        OsStr::new("--max-value-size"),
        OsStr::new("4096"),
        OsStr::new("layer"),
        OsStr::new("values"),
        f.layer.as_os_str(),
    ]);
    let err = error_of(out, &f.layer);
    assert!(err.contains("corrupt"), "{err}");
    // The index alone reads no values.
    let out = layer_cmd("index", &f.layer, &["--max-value-size", "4096"]);
    assert_eq!(stdout_of(out).lines().count(), 7);
}

/// Where a damaged copy of the fixture's layer goes: a directory of its own, under the layer's
/// name (the name is part of what `verify` checks).
fn same_name_elsewhere(f: &Fixture, dir: &str) -> PathBuf {
    let dir = f.dir.path().join(dir);
    std::fs::create_dir(&dir).unwrap();
    dir.join(f.layer.file_name().unwrap())
}

#[test]
fn truncated_layers_are_reported() {
    let f = fixture();
    let good = std::fs::read(&f.layer).unwrap();
    // Under its layer name, so that pagectl knows it for a delta layer however short it is.
    let bad = same_name_elsewhere(&f, "truncated");
    for len in [
        0,
        100,
        PAGE_SZ,
        30_000,
        good.len() - PAGE_SZ,
        good.len() - 1,
    ] {
        std::fs::write(&bad, &good[..len]).unwrap();
        for sub in ["summary", "index", "values", "verify"] {
            let err = error_of(layer_cmd(sub, &bad, &[]), &bad);
            assert!(err.contains("corrupt"), "{sub} of {len} bytes: {err}");
        }
    }
    // Under another name, a file too short for a magic is not a layer at all.
    let unnamed = f.dir.path().join("short");
    std::fs::write(&unnamed, &good[..3]).unwrap();
    for sub in ["summary", "index", "values", "verify"] {
        let err = error_of(layer_cmd(sub, &unnamed, &[]), &unnamed);
        assert!(err.contains("not a layer file"), "{sub}: {err}");
    }
    // With a delta layer's magic, it is a corrupt one.
    std::fs::write(&unnamed, &good[..100]).unwrap();
    let err = error_of(layer_cmd("summary", &unnamed, &[]), &unnamed);
    assert!(
        err.contains("delta layer") && err.contains("corrupt"),
        "{err}"
    );
}

/// Flips one bit in the summary, a value and the index node, and checks which commands see it.
#[test]
fn bit_flips_are_reported_by_the_commands_that_read_them() {
    let f = fixture();
    let good = std::fs::read(&f.layer).unwrap();
    let bad = same_name_elsewhere(&f, "flipped");
    let flip = |pos: usize| {
        let mut b = good.clone();
        b[pos] ^= 0x04;
        std::fs::write(&bad, &b).unwrap();
    };
    let index_node = usize::try_from(INDEX_START_BLK).unwrap() * PAGE_SZ;

    // The summary (here the LSN start): every command opens the file and refuses it.
    flip(80);
    for sub in ["summary", "index", "values", "verify"] {
        let err = error_of(layer_cmd(sub, &bad, &[]), &bad);
        assert!(err.contains("summary checksum mismatch"), "{sub}: {err}");
    }

    // A byte of the first image: the index is intact, reading the value is not.
    flip(PAGE_SZ + 1000);
    assert_eq!(lines(layer_cmd("index", &bad, &[])), expected_index());
    for sub in ["values", "verify"] {
        let err = error_of(layer_cmd(sub, &bad, &[]), &bad);
        assert!(err.contains("checksum mismatch"), "{sub}: {err}");
    }
    // Another key's values still read.
    assert_eq!(
        lines(layer_cmd("values", &bad, &["--key", &k2()])),
        expected_values()[3..5]
    );

    // The index node's entries.
    flip(index_node + 40);
    for sub in ["index", "values", "verify"] {
        let err = error_of(layer_cmd(sub, &bad, &[]), &bad);
        assert!(err.contains("B-tree block 0"), "{sub}: {err}");
    }
    assert!(layer_cmd("summary", &bad, &[]).status.success());
}

/// One bit flipped every 61 bytes through the whole file: `verify` reports every flip except
/// in the zero padding between the last value and the index, which nothing covers; no command
/// ever panics (`index` and `values` are run at every fourth position, to keep the test quick).
#[test]
fn verify_sees_a_flip_anywhere_that_is_covered() {
    let f = fixture();
    let good = std::fs::read(&f.layer).unwrap();
    let bad = same_name_elsewhere(&f, "flipped");
    let uncovered =
        usize::try_from(VALUES_END).unwrap()..usize::try_from(INDEX_START_BLK).unwrap() * PAGE_SZ;
    for (n, pos) in (0..good.len()).step_by(61).enumerate() {
        let mut b = good.clone();
        b[pos] ^= 1 << (pos % 8);
        std::fs::write(&bad, &b).unwrap();
        let out = layer_cmd("verify", &bad, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "byte {pos}: {stderr}");
        if !uncovered.contains(&pos) {
            assert_eq!(out.status.code(), Some(1), "flip at byte {pos} not seen");
            error_of(out, &bad);
        }
        if n % 4 != 0 {
            continue;
        }
        for sub in ["index", "values"] {
            let out = layer_cmd(sub, &bad, &[]);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!stderr.contains("panicked"), "{sub}, byte {pos}: {stderr}");
            assert!(
                matches!(out.status.code(), Some(0 | 1)),
                "{sub}, byte {pos}"
            );
        }
    }
}

/// Bytes after the index root: not the file the summary describes. Every command refuses it,
/// as the page server does, rather than only `verify`.
#[test]
fn a_block_appended_is_refused_by_every_command() {
    let f = fixture();
    let mut bytes = std::fs::read(&f.layer).unwrap();
    bytes.extend_from_slice(&[0; PAGE_SZ]);
    std::fs::write(&f.layer, &bytes).unwrap();
    for sub in ["summary", "index", "values", "verify"] {
        let err = error_of(layer_cmd(sub, &f.layer, &[]), &f.layer);
        assert!(
            err.contains(
                "file is 49152 bytes, but the index root at block 4 ends it at byte 40960"
            ),
            "{sub}: {err}"
        );
    }
}

#[test]
fn missing_files_directories_and_non_layers_are_reported() {
    let f = fixture();
    let missing = f.dir.path().join("no-such-layer");
    for sub in ["summary", "index", "values", "verify"] {
        let err = error_of(layer_cmd(sub, &missing, &[]), &missing);
        assert!(err.contains("No such file"), "{err}");
    }
    let err = error_of(layer_cmd("summary", f.dir.path(), &[]), f.dir.path());
    assert!(err.contains("is a directory"), "{err}");

    // A metadata file is not a layer.
    Manifest::empty(TENANT, TIMELINE)
        .store(f.dir.path())
        .unwrap();
    let metadata = f.dir.path().join("metadata");
    let err = error_of(layer_cmd("summary", &metadata, &[]), &metadata);
    assert!(
        err.contains("not a layer file") && err.contains("starts with 0x544c4d44"),
        "{err}"
    );
}

#[test]
fn metadata_is_read_from_a_timeline_dir_or_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("metadata");
    // No metadata yet.
    error_of(
        pagectl([OsStr::new("metadata"), dir.path().as_os_str()]),
        &file,
    );

    let mut manifest = Manifest::empty(TENANT, TIMELINE);
    manifest.disk_consistent_lsn = Lsn(0x016B_5A50);
    manifest.add_layer(LayerFileEntry {
        name: format!("{}-{}__0000000000001000-0000000000002000", k1(), k2()),
        size: 40960,
        crc32c: 0x1234_5678,
        level: LayerLevel::L0,
        group_size: 1,
    });
    manifest.store(dir.path()).unwrap();
    let expected = [
        format!("file:                {}", file.display()),
        "format:              4".to_owned(),
        format!("tenant:              {TENANT}"),
        format!("timeline:            {TIMELINE}"),
        "disk_consistent_lsn: 0/16B5A50".to_owned(),
        "gc_cutoff_lsn:       0/0".to_owned(),
        "contiguous_from:     0/0".to_owned(),
        // The one layer leaves the LSNs below 0/1000 and above 0/2000 to no layer.
        "history:             incomplete: no layer holds LSNs 0/1..0/1000 (below: the start of \
         the timeline's history; above: \"000000067f00000005000040000000000001-\
         000000067f00000005000040000000000002__0000000000001000-0000000000002000\"), and it \
         ends above the GC cutoff 0/0: a layer is missing"
            .to_owned(),
        "layers:              1".to_owned(),
        format!(
            "layer {}-{}__0000000000001000-0000000000002000 level=L0 size=40960 crc32c=0x12345678 group=1",
            k1(),
            k2()
        ),
        "retired:             0".to_owned(),
    ];
    for path in [dir.path(), &file] {
        let out = pagectl([OsStr::new("metadata"), path.as_os_str()]);
        assert_eq!(lines(out), expected);
    }

    // Corrupt, missing, and a file with another name.
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[9] ^= 1;
    std::fs::write(&file, &bytes).unwrap();
    let err = error_of(
        pagectl([OsStr::new("metadata"), dir.path().as_os_str()]),
        &file,
    );
    assert!(err.contains("corrupt"), "{err}");
    let missing = dir.path().join("gone");
    error_of(
        pagectl([OsStr::new("metadata"), missing.as_os_str()]),
        &missing,
    );
    let other = dir.path().join("metadata.bak");
    std::fs::write(&other, &bytes).unwrap();
    let err = error_of(pagectl([OsStr::new("metadata"), other.as_os_str()]), &other);
    assert!(err.contains("not a timeline directory"), "{err}");
}

#[test]
fn usage_errors_exit_with_2() {
    let f = fixture();
    let file = f.layer.to_str().unwrap();
    for args in [
        vec!["layer", "index", file, "--key", "not-a-key"],
        vec!["layer", "values", file, "--lsn", "0/1/2"],
        vec!["layer", "get", file, "--lsn", "0/1000"],
        vec!["layer", "index", file, "--limit", "-1"],
        vec!["layer", "values", file, "--raw-bytes", "10"],
        vec!["layer", "frobnicate", file],
        vec!["layer"],
        vec![],
    ] {
        let out = pagectl(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

/// A reader that stops early (`pagectl ... | head`) ends pagectl quietly.
#[test]
fn a_closed_pipe_is_not_an_error() {
    let f = fixture();
    let mut child = Command::new(env!("CARGO_BIN_EXE_pagectl"))
        .args([OsStr::new("layer"), OsStr::new("values")])
        .arg(&f.layer)
        .args(["--raw", "--raw-bytes", "100000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Far more output than a pipe buffers: read a little, then hang up.
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 100];
    stdout.read_exact(&mut first).unwrap();
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
}
