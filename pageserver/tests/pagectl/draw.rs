//! `pagectl draw` on a timeline directory written with the crate's own writers: L0s, an L1 run
//! of two layers, an image at the top of that run, and a retired L0 whose file is still there.
//! The SVG must be well-formed XML (checked by the small parser below: no XML crate is a
//! dependency), with one rectangle per listed layer in its level's colour, to scale on both
//! axes, and nothing drawn for the retired file. Manifests of names alone (`draw` reads nothing
//! else) check the breaks in the key axis and the logarithmic LSN axis.

use std::collections::HashMap;
use std::ops::Range;

use pageserver::tenant::storage_layer::image_layer::ImageLayerWriter;

use super::*;

const L0_COLOUR: &str = "#e8912d";
const L1_COLOUR: &str = "#3b75c4";
const IMAGE_COLOUR: &str = "#2e9e48";

/// One element of the document: its name and attributes.
#[derive(Debug)]
struct Element {
    name: String,
    attrs: HashMap<String, String>,
}

impl Element {
    fn attr(&self, name: &str) -> &str {
        self.attrs.get(name).map_or("", String::as_str)
    }

    fn num(&self, name: &str) -> f64 {
        self.attr(name).parse().unwrap()
    }
}

/// Checks that character data or an attribute value holds no markup and only the predefined
/// entities and character references.
fn check_text(text: &str) {
    assert!(!text.contains('<'), "markup in text: {text:?}");
    let mut rest = text;
    while let Some(at) = rest.find('&') {
        rest = &rest[at + 1..];
        let end = rest
            .find(';')
            .unwrap_or_else(|| panic!("bare & in {text:?}"));
        let entity = &rest[..end];
        let ok = ["amp", "lt", "gt", "quot", "apos"].contains(&entity)
            || entity
                .strip_prefix('#')
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        assert!(ok, "unknown entity &{entity}; in {text:?}");
        rest = &rest[end + 1..];
    }
}

fn check_name(name: &str) {
    assert!(
        !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b':'),
        "bad name {name:?}"
    );
}

/// Parses `name="value" ...`, each name once.
fn parse_attrs(mut s: &str) -> HashMap<String, String> {
    let mut attrs = HashMap::new();
    loop {
        s = s.trim_start();
        if s.is_empty() {
            return attrs;
        }
        let (name, rest) = s.split_once("=\"").expect("an attribute is name=\"value\"");
        check_name(name);
        let (value, rest) = rest
            .split_once('"')
            .expect("an attribute value ends with \"");
        check_text(value);
        assert!(
            attrs.insert(name.to_owned(), value.to_owned()).is_none(),
            "attribute {name} twice"
        );
        assert!(
            rest.is_empty() || rest.starts_with(' '),
            "attributes run together: {rest:?}"
        );
        s = rest;
    }
}

/// Checks that `doc` is a well-formed XML document of the kind pagectl writes (an XML
/// declaration, then one root element; no comments, CDATA or doctype), and returns its
/// elements in document order.
fn parse_xml(doc: &str) -> Vec<Element> {
    let rest = doc
        .strip_prefix("<?xml version=\"1.0\" encoding=\"UTF-8\"?>")
        .expect("an XML declaration");
    let mut rest = rest.trim_start();
    let mut elements = Vec::new();
    let mut open: Vec<String> = Vec::new();
    let mut root_closed = false;
    while let Some(lt) = rest.find('<') {
        let text = &rest[..lt];
        check_text(text);
        assert!(
            !open.is_empty() || text.trim().is_empty(),
            "text outside the root: {text:?}"
        );
        let gt = rest[lt..].find('>').expect("a tag ends with >") + lt;
        let tag = &rest[lt + 1..gt];
        rest = &rest[gt + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(open.pop().as_deref(), Some(name), "mismatched end tag");
            root_closed = open.is_empty();
            continue;
        }
        assert!(!root_closed, "a second root element <{tag}>");
        let (body, empty) = match tag.strip_suffix('/') {
            Some(body) => (body, true),
            None => (tag, false),
        };
        let (name, attrs) = body.split_once(' ').unwrap_or((body, ""));
        check_name(name);
        elements.push(Element {
            name: name.to_owned(),
            attrs: parse_attrs(attrs),
        });
        if empty {
            root_closed = open.is_empty();
        } else {
            open.push(name.to_owned());
        }
    }
    assert!(rest.trim().is_empty(), "text after the root: {rest:?}");
    assert!(
        root_closed && open.is_empty(),
        "unclosed elements: {open:?}"
    );
    elements
}

#[test]
fn the_xml_checker_refuses_what_is_not_well_formed() {
    let head = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
    assert_eq!(
        parse_xml(&format!("{head}<a x=\"1\"><b/>t&amp;</a>\n")).len(),
        2
    );
    for bad in [
        "<a><b></a></b>",
        "<a>",
        "<a x=\"1\" x=\"2\"/>",
        "<a>&nbsp;</a>",
        "<a>x & y</a>",
        "<a/><b/>",
        "<a x=1/>",
    ] {
        let doc = format!("{head}{bad}");
        assert!(
            std::panic::catch_unwind(|| parse_xml(&doc)).is_err(),
            "{bad} passed"
        );
    }
}

struct Timeline {
    dir: tempfile::TempDir,
    names: HashMap<&'static str, String>,
}

/// A delta layer of versions of `keys` at LSNs in `lsns`: one image of each key at the start.
fn write_delta(dir: &Path, lsns: Range<u64>, keys: Range<u32>) -> (String, LayerFileEntry) {
    let mut w =
        DeltaLayerWriter::new(dir, TENANT, TIMELINE, Lsn(lsns.start), Lsn(lsns.end)).unwrap();
    for k in keys {
        w.put_value(key(k), Lsn(lsns.start), &Value::Image(page(k as u8, 64)))
            .unwrap();
    }
    let written = w.finish().unwrap();
    let name = written.summary.file_name();
    let entry = LayerFileEntry {
        name: name.clone(),
        size: written.size,
        crc32c: written.crc32c,
        level: LayerLevel::L0,
        group_size: 1,
    };
    (name, entry)
}

/// The L1 run 0x10..0x30 of keys 1..5 and 5..9, an image of keys 1..9 at 0x2F, two L0s above
/// (0x30..0x40 of keys 1..9, 0x40..0x50 of keys 2..4), and a retired L0 0x10..0x20.
fn timeline() -> Timeline {
    let dir = tempfile::tempdir().unwrap();
    let mut manifest = Manifest::empty(TENANT, TIMELINE);
    manifest.disk_consistent_lsn = Lsn(0x4F);
    let mut names = HashMap::new();
    for (label, lsns, keys, level) in [
        ("l1a", 0x10..0x30, 1..5, LayerLevel::L1),
        ("l1b", 0x10..0x30, 5..9, LayerLevel::L1),
        ("l0a", 0x30..0x40, 1..9, LayerLevel::L0),
        ("l0b", 0x40..0x50, 2..4, LayerLevel::L0),
        ("retired", 0x10..0x20, 1..9, LayerLevel::L0),
    ] {
        let (name, entry) = write_delta(dir.path(), lsns, keys);
        manifest.add_layer(LayerFileEntry { level, ..entry });
        names.insert(label, name);
    }
    let mut w =
        ImageLayerWriter::new(dir.path(), TENANT, TIMELINE, key(1)..key(9), Lsn(0x2F)).unwrap();
    for k in 1..9 {
        w.put_image(key(k), &[k as u8; PAGE_SZ]).unwrap();
    }
    let written = w.finish().unwrap();
    let name = written.summary.file_name();
    manifest.add_layer(LayerFileEntry {
        name: name.clone(),
        size: written.size,
        crc32c: written.crc32c,
        level: LayerLevel::Image,
        group_size: 1,
    });
    names.insert("image", name);
    assert!(manifest.retire_layer(&names["retired"]));
    manifest.store(dir.path()).unwrap();
    Timeline { dir, names }
}

fn draw(args: &[&OsStr]) -> Output {
    let mut all = vec![OsStr::new("draw")];
    all.extend_from_slice(args);
    pagectl(all)
}

/// The layer rectangle whose tooltip names `name`.
fn layer_rect<'a>(svg: &str, elements: &'a [Element], name: &str) -> &'a Element {
    let rects: Vec<&Element> = elements
        .iter()
        .filter(|e| e.name == "rect" && e.attr("class").starts_with("layer "))
        .collect();
    // Rectangles and their tooltips come in the same order.
    let titles: Vec<&str> = svg
        .split("<title>")
        .skip(1)
        .map(|t| t.split("</title>").next().unwrap())
        .collect();
    assert_eq!(rects.len(), titles.len());
    let at = titles
        .iter()
        .position(|t| t.contains(name))
        .unwrap_or_else(|| panic!("{name} is not drawn"));
    rects[at]
}

#[test]
fn draw_renders_every_listed_layer_by_level_and_not_the_retired() {
    let t = timeline();
    let svg = stdout_of(draw(&[t.dir.path().as_os_str()]));
    let elements = parse_xml(&svg);
    assert_eq!(elements[0].name, "svg");
    assert_eq!(elements[0].attr("xmlns"), "http://www.w3.org/2000/svg");

    // One rectangle per listed layer and three in the legend: nothing else is a rect (no gaps
    // here: every step between boundaries is a few keys).
    let rects: Vec<&Element> = elements.iter().filter(|e| e.name == "rect").collect();
    assert_eq!(rects.len(), 5 + 3, "{svg}");
    let of_class = |class: &str| rects.iter().filter(|r| r.attr("class") == class).count();
    assert_eq!(of_class("layer l0"), 2);
    assert_eq!(of_class("layer l1"), 2);
    assert_eq!(of_class("layer image"), 1);
    for (level, colour) in [
        ("l0", L0_COLOUR),
        ("l1", L1_COLOUR),
        ("image", IMAGE_COLOUR),
    ] {
        assert_eq!(of_class(&format!("legend {level}")), 1);
        for r in rects.iter().filter(|r| r.attr("class").ends_with(level)) {
            assert_eq!(r.attr("fill"), colour, "{r:?}");
        }
    }
    for label in ["l1a", "l1b", "l0a", "l0b", "image"] {
        assert!(svg.contains(&t.names[label]), "{label} is not drawn");
    }
    assert!(
        !svg.contains(&t.names["retired"]),
        "the retired layer is drawn"
    );

    // Title, legend and axis labels.
    assert!(
        svg.contains(&format!(
            "tenant {TENANT} timeline {TIMELINE}: 5 layers: 2 L0, 2 L1, 1 image"
        )),
        "{svg}"
    );
    assert!(svg.contains("(1 retired files, not drawn)"), "{svg}");
    for label in ["L0 delta (2)", "L1 delta (2)", "image (1)"] {
        assert!(svg.contains(label), "legend {label}");
    }
    for label in [
        ">0/10<",
        ">0/2F<",
        ">0/50<",
        &format!(">{}<", k1()),
        &format!(">{}<", key(9)),
    ] {
        assert!(svg.contains(label), "axis label {label}");
    }
    assert!(svg.contains(">key, linear: 8 keys across<"), "{svg}");
    assert!(svg.contains(">LSN, linear from 0/10 to 0/50<"), "{svg}");

    // Geometry, to scale: keys 1..9 across, LSNs 0x10..0x50 up. The L1 run is the lower half
    // (0x20 of 0x40 LSNs), each L1 half the width (4 of 8 keys); the L0s a quarter of the height
    // each; the second L0's keys 2..4 a quarter of the width, an eighth in.
    let l1a = layer_rect(&svg, &elements, &t.names["l1a"]);
    let l1b = layer_rect(&svg, &elements, &t.names["l1b"]);
    let l0a = layer_rect(&svg, &elements, &t.names["l0a"]);
    let l0b = layer_rect(&svg, &elements, &t.names["l0b"]);
    let image = layer_rect(&svg, &elements, &t.names["image"]);
    let bottom = |r: &Element| r.num("y") + r.num("height");
    let right = |r: &Element| r.num("x") + r.num("width");
    let close = |a: f64, b: f64| (a - b).abs() <= 0.15;
    let (left, width) = (l1a.num("x"), right(l1b) - l1a.num("x"));
    let (lsn_top, height) = (l0b.num("y"), bottom(l1a) - l0b.num("y"));
    assert!(width > 1000.0 && height > 600.0, "{width} {height}");
    assert_eq!(l1a.num("y"), l1b.num("y"));
    assert!(close(l1a.num("height"), height / 2.0), "{l1a:?}");
    assert!(close(l0a.num("height"), height / 4.0), "{l0a:?}");
    assert!(close(l0b.num("height"), height / 4.0), "{l0b:?}");
    assert!(close(bottom(l0a), l1a.num("y")) && close(bottom(l0b), l0a.num("y")));
    assert!(close(l1a.num("width"), width / 2.0) && close(right(l1a), l1b.num("x")));
    assert!(close(l0a.num("x"), left) && close(l0a.num("width"), width));
    assert!(close(l0b.num("x"), left + width / 8.0), "{l0b:?}");
    assert!(close(l0b.num("width"), width / 4.0), "{l0b:?}");
    // The image: a visible bar across keys 1..9, centred on 0x2F, one LSN below the run's top.
    assert!(image.num("height") >= 8.0, "{image:?}");
    let centre = image.num("y") + image.num("height") / 2.0;
    assert!(
        close(centre, l1a.num("y") + height / 64.0),
        "{image:?} {l1a:?}"
    );
    assert!(close(image.num("x"), left) && close(right(image), left + width));
    assert!(lsn_top >= 90.0, "{lsn_top}");
}

/// A manifest listing layers by name alone (no files: `draw` reads only the manifest).
fn manifest_of(layers: &[(String, LayerLevel)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut manifest = Manifest::empty(TENANT, TIMELINE);
    for (name, level) in layers {
        manifest.add_layer(LayerFileEntry {
            name: name.clone(),
            size: 8192,
            crc32c: 0,
            level: *level,
            group_size: 1,
        });
    }
    manifest.store(dir.path()).unwrap();
    dir
}

fn delta_name(keys: Range<Key>, lsns: Range<u64>) -> String {
    format!(
        "{}-{}__{:016X}-{:016X}",
        keys.start, keys.end, lsns.start, lsns.end
    )
}

fn image_name(keys: Range<Key>, lsn: u64) -> String {
    format!("{}-{}__{lsn:016X}", keys.start, keys.end)
}

#[test]
fn draw_cuts_far_apart_keys_short_and_marks_the_breaks() {
    // Two relations 2^42 keys apart, 24 blocks each, an L1 of each and an L0 across both; an
    // image over the whole key space, as the first and last image pieces are.
    let other = |b| Key::rel_block(1663, 5, 16390, 0, b);
    let l1a = delta_name(key(0)..key(24), 0x1..0x100);
    let l1b = delta_name(other(0)..other(24), 0x1..0x100);
    let l0 = delta_name(key(12)..other(12), 0x100..0x200);
    let whole = image_name(Key::MIN..Key::MAX, 0xFF);
    let dir = manifest_of(&[
        (l1a.clone(), LayerLevel::L1),
        (l1b.clone(), LayerLevel::L1),
        (l0.clone(), LayerLevel::L0),
        (whole.clone(), LayerLevel::Image),
    ]);
    let svg = stdout_of(draw(&[dir.path().as_os_str()]));
    let elements = parse_xml(&svg);
    // Three gaps: below the first relation, between them, above the second.
    let gaps = elements.iter().filter(|e| e.attr("class") == "gap").count();
    let breaks = elements
        .iter()
        .filter(|e| e.attr("class") == "break")
        .count();
    assert_eq!((gaps, breaks), (3, 6), "{svg}");
    assert!(svg.contains("key, linear over 48 keys; 3 gaps"), "{svg}");
    // Both relations' L1s are as wide as each other (24 keys on one scale), and together they
    // take all but the gaps' 3 x 16 px of the image's width.
    let (a, b) = (
        layer_rect(&svg, &elements, &l1a),
        layer_rect(&svg, &elements, &l1b),
    );
    let w = layer_rect(&svg, &elements, &whole);
    assert!(
        (a.num("width") - b.num("width")).abs() < 0.15,
        "{a:?} {b:?}"
    );
    let shown = a.num("width") + b.num("width") + 3.0 * 16.0;
    assert!((shown - w.num("width")).abs() < 0.3, "{shown} {w:?}");
    // The L0 from the middle of one to the middle of the other: half of each, and the gap.
    let l0 = layer_rect(&svg, &elements, &l0);
    let expected = a.num("width") / 2.0 + 16.0 + b.num("width") / 2.0;
    assert!((l0.num("width") - expected).abs() < 0.3, "{l0:?}");
    // The labels name the keys the layers hold first, before the key space's ends.
    assert!(svg.contains(&format!(">{}<", key(0))), "{svg}");
    assert!(svg.contains(&format!(">{}<", other(24))), "{svg}");
}

#[test]
fn draw_uses_a_log_scale_when_the_thinnest_delta_would_vanish() {
    // An import-sized L0 over 256 MiB of LSNs, then a flush of 0x20 LSNs on top.
    let big = delta_name(key(0)..key(100), 0x100..0x1000_0100);
    let small = delta_name(key(0)..key(10), 0x1000_0100..0x1000_0120);
    let dir = manifest_of(&[(big, LayerLevel::L0), (small.clone(), LayerLevel::L0)]);
    let svg = stdout_of(draw(&[dir.path().as_os_str()]));
    let elements = parse_xml(&svg);
    assert!(
        svg.contains(">LSN, log scale of the distance below 0/10000120 (ticks 16x apart)<"),
        "{svg}"
    );
    let small = layer_rect(&svg, &elements, &small);
    assert!(small.num("height") >= 20.0, "{small:?}");
    // Ticks 16, 256, 4096, ... LSNs below the top, labelled with their LSNs.
    for tick in [">0/10000110<", ">0/10000020<", ">0/FFFF120<"] {
        assert!(svg.contains(tick), "tick {tick}: {svg}");
    }
}

#[test]
fn draw_writes_to_a_file_and_reads_a_metadata_file_too() {
    let t = timeline();
    let to = t.dir.path().join("layers.svg");
    let out = draw(&[
        t.dir.path().join("metadata").as_os_str(),
        OsStr::new("-o"),
        to.as_os_str(),
    ]);
    assert!(stdout_of(out).is_empty());
    let written = std::fs::read_to_string(&to).unwrap();
    assert_eq!(written, stdout_of(draw(&[t.dir.path().as_os_str()])));
    parse_xml(&written);
}

#[test]
fn draw_of_an_empty_timeline_is_an_empty_plot() {
    let dir = tempfile::tempdir().unwrap();
    Manifest::empty(TENANT, TIMELINE).store(dir.path()).unwrap();
    let svg = stdout_of(draw(&[dir.path().as_os_str()]));
    let elements = parse_xml(&svg);
    let layers = elements
        .iter()
        .filter(|e| e.attr("class").starts_with("layer"))
        .count();
    assert_eq!(layers, 0);
    assert!(svg.contains("0 layers: 0 L0, 0 L1, 0 image"), "{svg}");
    assert!(svg.contains(">no layers<"), "{svg}");
}

#[test]
fn draw_refuses_what_is_not_a_manifest() {
    let t = timeline();
    let metadata = t.dir.path().join("metadata");
    // A bit flipped in the manifest, a missing directory, a layer file given instead.
    let mut bytes = std::fs::read(&metadata).unwrap();
    bytes[70] ^= 1;
    std::fs::write(&metadata, &bytes).unwrap();
    let err = error_of(draw(&[t.dir.path().as_os_str()]), &metadata);
    assert!(err.contains("corrupt"), "{err}");
    let missing = t.dir.path().join("gone");
    error_of(draw(&[missing.as_os_str()]), &missing);
    let layer = t.dir.path().join(&t.names["l0a"]);
    let err = error_of(draw(&[layer.as_os_str()]), &layer);
    assert!(err.contains("not a timeline directory"), "{err}");
    // An output file that cannot be written.
    bytes[70] ^= 1;
    std::fs::write(&metadata, &bytes).unwrap();
    let to = t.dir.path().join("no-such-dir").join("layers.svg");
    let err = error_of(
        draw(&[t.dir.path().as_os_str(), OsStr::new("-o"), to.as_os_str()]),
        &to,
    );
    assert!(err.contains("cannot write the picture"), "{err}");
}

/// With `--contents`, a delta layer holding PostgreSQL WAL records is hatched and its tooltip
/// says how many; the WAL the timeline stores is a band beside the LSN axis, with its range.
#[test]
fn draw_contents_hatches_wal_records_and_shows_the_stored_wal() {
    use pageserver::walreceiver::wal_store::WAL_DIR;
    use postgres_wal::synthetic::WalBuilder;

    let dir = tempfile::tempdir().unwrap();
    let mut manifest = Manifest::empty(TENANT, TIMELINE);
    manifest.disk_consistent_lsn = Lsn(0x1_0000_004F);
    let (plain, entry) = write_delta(dir.path(), 0x1_0000_0010..0x1_0000_0030, 1..5);
    manifest.add_layer(entry);
    let mut w = DeltaLayerWriter::new(
        dir.path(),
        TENANT,
        TIMELINE,
        Lsn(0x1_0000_0030),
        Lsn(0x1_0000_0050),
    )
    .unwrap();
    w.put_value(key(1), Lsn(0x1_0000_0030), &Value::Image(page(1, 64)))
        .unwrap();
    let record = Value::WalRecord {
        will_init: false,
        record: bytes::Bytes::from_static(&[0u8; 30]),
    };
    w.put_value(key(1), Lsn(0x1_0000_0040), &record).unwrap();
    let written = w.finish().unwrap();
    let with_wal = written.summary.file_name();
    manifest.add_layer(LayerFileEntry {
        name: with_wal.clone(),
        size: written.size,
        crc32c: written.crc32c,
        level: LayerLevel::L0,
        group_size: 1,
    });
    manifest.store(dir.path()).unwrap();
    // One segment of WAL (1 MiB segments), its records from 1/0.
    let segment = 1u32 << 20;
    let mut wal = WalBuilder::new(Lsn(0x1_0000_0000), segment);
    let end = wal.main_data_record(postgres_wal::record::RM_HEAP_ID, 0, 1, &[7u8; 100]);
    std::fs::create_dir(dir.path().join(WAL_DIR)).unwrap();
    std::fs::write(
        dir.path().join(WAL_DIR).join("000000010000000100000000"),
        wal.segment_file(),
    )
    .unwrap();
    assert!(end.0 > 0x1_0000_0000);

    let plain_svg = stdout_of(draw(&[dir.path().as_os_str()]));
    assert!(!plain_svg.contains("class=\"wal-records\""), "{plain_svg}");
    let svg = stdout_of(draw(&[dir.path().as_os_str(), OsStr::new("--contents")]));
    let elements = parse_xml(&svg);
    let hatched: Vec<&Element> = elements
        .iter()
        .filter(|e| e.name == "rect" && e.attr("class") == "wal-records")
        .collect();
    assert_eq!(hatched.len(), 1, "{svg}");
    let rect = layer_rect(&svg, &elements, &with_wal);
    assert_eq!(hatched[0].num("x"), rect.num("x"));
    assert_eq!(hatched[0].num("y"), rect.num("y"));
    assert!(
        svg.contains("1 of 2 values are PostgreSQL WAL records"),
        "{svg}"
    );
    assert!(
        svg.contains("0 of 4 values are PostgreSQL WAL records"),
        "{plain}"
    );
    // The band of the stored WAL, and its range in words.
    assert!(elements
        .iter()
        .any(|e| e.name == "rect" && e.attr("class") == "wal"));
    assert!(svg.contains("WAL stored 1/0.."), "{svg}");
}

/// With `--contents`, the snapshots of the newest snapshot list in the layers are dashed lines
/// at their LSNs, labelled with their kind and where a restore from them replays from; an older
/// list in an older layer is not what is drawn, and without `--contents` nothing is read.
#[test]
fn draw_contents_shows_the_snapshots_the_newest_list_names() {
    use pageserver_api::datadir::{snapshot_list_key, Snapshot, SnapshotKind, SnapshotList};

    let imported = Snapshot::imported(Lsn(0x10), SnapshotKind::Backup);
    let background = Snapshot {
        lsn: Lsn(0x40),
        kind: SnapshotKind::Stopped,
        wal_from: Lsn(0x38),
    };
    let list = |snapshots: Vec<Snapshot>| {
        Value::Image(bytes::Bytes::from(
            SnapshotList {
                system_identifier: 7,
                snapshots,
            }
            .encode(),
        ))
    };
    let dir = tempfile::tempdir().unwrap();
    let mut manifest = Manifest::empty(TENANT, TIMELINE);
    manifest.disk_consistent_lsn = Lsn(0x4F);
    for (lsns, at, snapshots, level) in [
        (0x10..0x30, 0x10, vec![imported], LayerLevel::L1),
        (0x30..0x50, 0x40, vec![imported, background], LayerLevel::L0),
    ] {
        let mut w =
            DeltaLayerWriter::new(dir.path(), TENANT, TIMELINE, Lsn(lsns.start), Lsn(lsns.end))
                .unwrap();
        w.put_value(key(1), Lsn(lsns.start), &Value::Image(page(1, 64)))
            .unwrap();
        w.put_value(snapshot_list_key(), Lsn(at), &list(snapshots))
            .unwrap();
        let written = w.finish().unwrap();
        manifest.add_layer(LayerFileEntry {
            name: written.summary.file_name(),
            size: written.size,
            crc32c: written.crc32c,
            level,
            group_size: 1,
        });
    }
    manifest.store(dir.path()).unwrap();

    let plain = stdout_of(draw(&[dir.path().as_os_str()]));
    assert!(!plain.contains("class=\"snapshot"), "{plain}");
    let svg = stdout_of(draw(&[dir.path().as_os_str(), OsStr::new("--contents")]));
    let elements = parse_xml(&svg);
    let lines: Vec<&Element> = elements
        .iter()
        .filter(|e| e.name == "line" && e.attr("class") == "snapshot")
        .collect();
    assert_eq!(lines.len(), 2, "{svg}");
    // LSNs go up: the newer snapshot's line is higher, both across the plot.
    assert!(lines[1].num("y1") < lines[0].num("y1"), "{svg}");
    for l in &lines {
        assert_eq!(l.num("y1"), l.num("y2"));
        assert!(l.num("x2") - l.num("x1") > 1000.0, "{svg}");
    }
    assert!(svg.contains(">snapshot (backup) at 0/10</text>"), "{svg}");
    assert!(
        svg.contains(">snapshot (stopped) at 0/40, restores replay from 0/38</text>"),
        "{svg}"
    );
    assert!(svg.contains("snapshot (2 of 2 listed)"), "{svg}");
}
