//! `pagectl draw`: the layers a timeline's manifest lists, as an SVG picture.
//!
//! Keys run across (x), LSNs up (y), one rectangle per layer: L0 and L1 delta layers as the
//! rectangle of their key and LSN ranges, image layers as a bar at their one LSN across their
//! key range, drawn over the deltas. Only the manifest is read; every range comes from a
//! layer's name, so a timeline of many thousands of layers draws in a moment. Retired files
//! are not part of the layer set and are not drawn.
//!
//! Both axes are to scale (`draw/axis.rs`): a layer is as wide as the keys it spans and as tall
//! as its LSNs, so the picture says how big each layer's share of the history is. Where one
//! scale cannot show everything, the axes say so: stretches of the key space between far-apart
//! boundaries (two relations, the key space's ends) are cut short and marked as breaks, and the
//! LSN axis is logarithmic when the thinnest delta layer would otherwise vanish. An image layer
//! spans one LSN: it is a bar [`IMAGE_BAR`] pixels tall centred on its LSN, and its LSN is
//! labelled on the axis.
//!
//! `--contents` reads the delta layers on the local disk through and hatches those that hold
//! PostgreSQL WAL records; the WAL the timeline stores (`wal/`) is a band beside the LSN axis;
//! the snapshots the timeline lists are dashed lines across the plot at their LSNs
//! (`draw/snapshots.rs`).

use std::collections::BTreeSet;
use std::fmt::Display;
use std::ops::Range;

use pageserver::tenant::storage_layer::LayerName;
use pageserver::tenant::timeline::layer_set::manifest::LayerLevel;

use super::*;

mod axis;
mod snapshots;
use axis::{key_distance, KeyAxis, LsnAxis, GAP_RATIO, GAP_WIDTH};
use snapshots::{snapshot_lines, stored_snapshots};

const WIDTH: f64 = 1200.0;
const HEIGHT: f64 = 800.0;
/// Room for the LSN labels, the key labels and captions, and the title and legend.
const LEFT: f64 = 140.0;
const RIGHT: f64 = 30.0;
const TOP: f64 = 90.0;
const BOTTOM: f64 = 70.0;
/// An image layer spans one LSN: it is a bar this tall, so it can be seen.
const IMAGE_BAR: f64 = 10.0;
/// The least width or height of a delta layer's rectangle.
const MIN_SIZE: f64 = 2.0;
/// The least distance between two LSN labels.
const LSN_LABEL_SPACING: f64 = 13.0;
/// The width of a key's label (36 digits of 11-pixel monospace), and the least gap between two.
const KEY_LABEL_WIDTH: f64 = 240.0;
const LABEL_GAP: f64 = 12.0;
const FONT: &str = "font-family=\"monospace\" font-size=\"11\"";
/// The width of one entry of the legend.
const LEGEND_STEP: f64 = 160.0;

/// Each level's colour, in the order the legend lists them.
const LEVELS: [(LayerLevel, &str, &str); 3] = [
    (LayerLevel::L0, "#e8912d", "L0 delta"),
    (LayerLevel::L1, "#3b75c4", "L1 delta"),
    (LayerLevel::Image, "#2e9e48", "image"),
];

fn colour(level: LayerLevel) -> &'static str {
    LEVELS
        .iter()
        .find(|(l, ..)| *l == level)
        .map_or("#888888", |(_, c, _)| c)
}

/// The CSS class of a level, `l0`, `l1` or `image`.
fn class(level: LayerLevel) -> &'static str {
    match level {
        LayerLevel::L0 => "l0",
        LayerLevel::L1 => "l1",
        LayerLevel::Image => "image",
    }
}

/// One layer to draw.
struct Drawn<'a> {
    name: &'a str,
    level: LayerLevel,
    keys: Range<Key>,
    /// An image layer's is its LSN to the next.
    lsns: Range<Lsn>,
    /// With `--contents`, a delta layer's PostgreSQL WAL records and values in all.
    wal_records: Option<(u64, u64)>,
}

/// The rectangle of the plot the layers are drawn in, and its two axes.
struct Plot {
    keys: KeyAxis,
    lsns: LsnAxis,
}

impl Plot {
    fn width() -> f64 {
        WIDTH - LEFT - RIGHT
    }

    fn height() -> f64 {
        HEIGHT - TOP - BOTTOM
    }

    /// The axes for `layers`. The LSNs are mapped inside half an image bar from the plot's top
    /// and bottom, so a bar at either end stays inside it.
    fn new(layers: &[Drawn<'_>]) -> Plot {
        let mut keys = BTreeSet::new();
        for l in layers {
            keys.insert(l.keys.start);
            keys.insert(l.keys.end);
        }
        let lo = layers.iter().map(|l| l.lsns.start).min().unwrap_or(Lsn(0));
        let hi = layers.iter().map(|l| l.lsns.end).max().unwrap_or(Lsn(1));
        let deltas: Vec<(Lsn, Lsn)> = layers
            .iter()
            .filter(|l| l.level != LayerLevel::Image)
            .map(|l| (l.lsns.start, l.lsns.end))
            .collect();
        let pad = IMAGE_BAR / 2.0;
        Plot {
            keys: KeyAxis::new(&keys, LEFT, LEFT + Self::width()),
            lsns: LsnAxis::new(lo, hi, &deltas, TOP + pad, TOP + Self::height() - pad),
        }
    }
}

/// Escapes text for an SVG attribute or element (layer names are any printable ASCII).
fn esc(s: impl Display) -> String {
    let s = s.to_string();
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

pub(super) fn draw(
    path: &Path,
    output: Option<&Path>,
    contents: bool,
    out: &mut impl Write,
) -> Result<(), Error> {
    let dir = timeline_dir(path)?;
    let file = dir.join(METADATA_FILE);
    let manifest = match Manifest::load(dir)? {
        StoredMetadata::Manifest(m) => m,
        StoredMetadata::Legacy { .. } => {
            return Err(Error::Path {
                path: file,
                message: "format 1 metadata lists no layers (the page server replaces it with a \
                          manifest when it loads the timeline)"
                    .to_owned(),
            })
        }
    };
    let mut layers = Vec::with_capacity(manifest.layers.len());
    for entry in &manifest.layers {
        // Loading the manifest checked that every name is a layer's of its level; a name that
        // is not is reported all the same, never drawn somewhere arbitrary.
        let name: LayerName = entry.name.parse().map_err(|e| Error::Path {
            path: file.clone(),
            message: format!("{e}"),
        })?;
        let on_disk = dir.join(&entry.name);
        let wal_records = if contents && entry.level != LayerLevel::Image && on_disk.exists() {
            match layer::open_layer(&on_disk, DEFAULT_MAX_VALUE_SIZE)? {
                layer::LayerFile::Delta(l) => {
                    let r = l.verify()?;
                    Some((r.wal_records, r.entries))
                }
                layer::LayerFile::Image(_) => None,
            }
        } else {
            None
        };
        layers.push(Drawn {
            name: &entry.name,
            level: entry.level,
            keys: name.key_range().clone(),
            lsns: name.lsn_range(),
            wal_records,
        });
    }
    let wal = stored_wal(dir)?;
    let snapshots = if contents {
        Some(stored_snapshots(dir, &layers)?)
    } else {
        None
    };
    let svg = render(&manifest, &layers, wal, snapshots.as_deref());
    match output {
        Some(to) => std::fs::write(to, svg).map_err(|e| Error::Path {
            path: to.to_owned(),
            message: format!("cannot write the picture: {e}"),
        }),
        None => Ok(out.write_all(svg.as_bytes())?),
    }
}

/// The LSNs of the WAL the timeline stores (`<timeline>/wal/`), if it stores any: from its oldest
/// segment's start to the end of the last whole record of its newest.
fn stored_wal(dir: &Path) -> Result<Option<Range<Lsn>>, Error> {
    let wal = dir.join(pageserver::walreceiver::wal_store::WAL_DIR);
    if !wal.is_dir() {
        return Ok(None);
    }
    let io = |e: std::io::Error| Error::Path {
        path: wal.clone(),
        message: e.to_string(),
    };
    // Every segment file has the segment's size (they are created whole).
    let mut segment_size = None;
    for entry in std::fs::read_dir(&wal).map_err(io)? {
        let entry = entry.map_err(io)?;
        let len = entry.metadata().map_err(io)?.len();
        let name = entry.file_name().to_string_lossy().into_owned();
        let name = name
            .strip_suffix(postgres_wal::segment::PARTIAL_SUFFIX)
            .unwrap_or(&name);
        if name.len() == 24 && name.bytes().all(|b| b.is_ascii_hexdigit()) {
            segment_size = u32::try_from(len)
                .ok()
                .filter(|s| postgres_wal::segment::is_valid_segment_size(*s));
            break;
        }
    }
    let Some(segment_size) = segment_size else {
        return Ok(None);
    };
    let files = postgres_wal::segment::segment_files_in(&wal, segment_size).map_err(io)?;
    let Some(oldest) = files.iter().map(|f| f.segment.segno).min() else {
        return Ok(None);
    };
    let (_, stored) =
        pageserver::walreceiver::wal_store::WalStore::open(dir, segment_size).map_err(io)?;
    let start = postgres_wal::segment::segment_start(oldest, segment_size);
    Ok(stored.map(|s| start..s.valid_end.max(start)))
}

fn render(
    manifest: &Manifest,
    layers: &[Drawn<'_>],
    wal: Option<Range<Lsn>>,
    snapshots: Option<&[pageserver_api::datadir::Snapshot]>,
) -> String {
    let plot = Plot::new(layers);
    let mut svg = String::new();
    let _ = writeln!(svg, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>");
    let _ = writeln!(
        svg,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
         viewBox=\"0 0 {WIDTH} {HEIGHT}\" style=\"background:#ffffff\">"
    );
    title(&mut svg, manifest, layers);
    legend(&mut svg, layers);
    if layers.is_empty() {
        frame(&mut svg);
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" {FONT}>no layers</text>",
            LEFT + Plot::width() / 2.0,
            TOP + Plot::height() / 2.0
        );
        svg.push_str("</svg>\n");
        return svg;
    }
    gap_bands(&mut svg, &plot);
    frame(&mut svg);
    lsn_labels(&mut svg, &plot, layers);
    key_labels(&mut svg, &plot);
    if layers
        .iter()
        .any(|l| l.wal_records.is_some_and(|(wal, _)| wal > 0))
    {
        svg.push_str(HATCH);
    }
    // Deltas first, L1s under L0s, then images over both.
    for level in [LayerLevel::L1, LayerLevel::L0, LayerLevel::Image] {
        for l in layers.iter().filter(|l| l.level == level) {
            rect(&mut svg, &plot, l);
        }
    }
    gap_marks(&mut svg, &plot);
    if let Some(snapshots) = snapshots {
        snapshot_lines(&mut svg, &plot, snapshots);
    }
    if let Some(wal) = wal {
        wal_band(&mut svg, &plot, wal);
    }
    svg.push_str("</svg>\n");
    svg
}

fn count(layers: &[Drawn<'_>], level: LayerLevel) -> usize {
    layers.iter().filter(|l| l.level == level).count()
}

fn title(svg: &mut String, m: &Manifest, layers: &[Drawn<'_>]) {
    let _ = writeln!(
        svg,
        "<text class=\"title\" x=\"{LEFT}\" y=\"24\" font-family=\"sans-serif\" \
         font-size=\"15\">tenant {} timeline {}: {} layers: {} L0, {} L1, {} image</text>",
        esc(m.tenant_id),
        esc(m.timeline_id),
        layers.len(),
        count(layers, LayerLevel::L0),
        count(layers, LayerLevel::L1),
        count(layers, LayerLevel::Image),
    );
    let _ = writeln!(
        svg,
        "<text x=\"{LEFT}\" y=\"44\" {FONT}>disk_consistent_lsn {} gc_cutoff_lsn {} \
         ({} retired files, not drawn)</text>",
        m.disk_consistent_lsn,
        m.gc_cutoff_lsn,
        m.retired.len()
    );
}

fn legend(svg: &mut String, layers: &[Drawn<'_>]) {
    let mut x = LEFT;
    for (level, fill, label) in LEVELS {
        let _ = writeln!(
            svg,
            "<rect class=\"legend {}\" x=\"{x}\" y=\"58\" width=\"14\" height=\"10\" \
             fill=\"{fill}\" stroke=\"#333333\" stroke-width=\"0.5\"/>",
            class(level)
        );
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"67\" {FONT}>{label} ({})</text>",
            x + 20.0,
            count(layers, level)
        );
        x += LEGEND_STEP;
    }
}

fn frame(svg: &mut String) {
    let (left, right) = (LEFT, LEFT + Plot::width());
    let (top, bottom) = (TOP, TOP + Plot::height());
    let _ = writeln!(
        svg,
        "<path class=\"frame\" d=\"M{left} {top} H{right} V{bottom} H{left} Z\" fill=\"none\" \
         stroke=\"#999999\" stroke-width=\"1\"/>"
    );
}

/// A number of keys, exact while it is small, else as a power of two.
fn keys_text(n: f64) -> String {
    if n == 1.0 {
        "1 key".to_owned()
    } else if n < 1e7 {
        format!("{n:.0} keys")
    } else {
        format!("about 2^{:.0} keys", n.log2())
    }
}

/// The LSN labels: every image layer's LSN first, then the axis's ends, then its ticks, each
/// where it does not crowd one already placed; and the axis caption.
fn lsn_labels(svg: &mut String, plot: &Plot, layers: &[Drawn<'_>]) {
    let left = LEFT;
    let images: BTreeSet<Lsn> = layers
        .iter()
        .filter(|l| l.level == LayerLevel::Image)
        .map(|l| l.lsns.start)
        .collect();
    let candidates = images
        .iter()
        .copied()
        .chain([plot.lsns.lo, plot.lsns.hi])
        .chain(plot.lsns.ticks());
    let mut placed: Vec<f64> = Vec::new();
    for lsn in candidates {
        let y = plot.lsns.y(lsn);
        if placed.iter().any(|p| (p - y).abs() < LSN_LABEL_SPACING) {
            continue;
        }
        placed.push(y);
        let _ = writeln!(
            svg,
            "<line x1=\"{}\" y1=\"{y:.1}\" x2=\"{left}\" y2=\"{y:.1}\" stroke=\"#999999\"/>",
            left - 5.0
        );
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\" {FONT}>{lsn}</text>",
            left - 8.0,
            y + 4.0
        );
    }
    let _ = writeln!(
        svg,
        "<text x=\"16\" y=\"{y}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {y})\" \
         {FONT}>{}</text>",
        esc(plot.lsns.describe()),
        y = TOP + Plot::height() / 2.0
    );
}

/// The key labels, each anchored so it stays inside the plot's width and placed where it does
/// not overlap one already placed: the first and last boundary that are not the key space's
/// ends, the ends, the two sides of each gap, then boundaries near a quarter, half and three
/// quarters of the way; and the caption.
fn key_labels(svg: &mut String, plot: &Plot) {
    let bottom = TOP + Plot::height();
    let (left, right) = (LEFT, LEFT + Plot::width());
    let pieces = &plot.keys.pieces;
    let mut candidates: Vec<Key> = Vec::new();
    if let (Some(first), Some(last)) = (pieces.first(), pieces.last()) {
        let inner = |k: &Key| *k != Key::MIN && *k != Key::MAX;
        let bounds = || pieces.iter().map(|p| p.from).chain([last.to]);
        candidates.extend(bounds().find(inner));
        candidates.extend(bounds().rev().find(inner));
        candidates.extend([first.from, last.to]);
        for gap in plot.keys.gaps() {
            candidates.extend([gap.from, gap.to]);
        }
        for share in [0.5, 0.25, 0.75] {
            let target = left + share * Plot::width();
            let nearest = pieces.iter().map(|p| p.from).min_by(|a, b| {
                (plot.keys.x(*a) - target)
                    .abs()
                    .total_cmp(&(plot.keys.x(*b) - target).abs())
            });
            candidates.extend(nearest);
        }
    }
    let mut placed: Vec<(f64, f64)> = Vec::new();
    for key in candidates {
        let x = plot.keys.x(key);
        let (anchor, from) = if x - KEY_LABEL_WIDTH / 2.0 < left {
            ("start", x)
        } else if x + KEY_LABEL_WIDTH / 2.0 > right {
            ("end", x - KEY_LABEL_WIDTH)
        } else {
            ("middle", x - KEY_LABEL_WIDTH / 2.0)
        };
        let extent = (from - LABEL_GAP, from + KEY_LABEL_WIDTH + LABEL_GAP);
        if placed.iter().any(|(a, b)| extent.0 < *b && *a < extent.1) {
            continue;
        }
        placed.push(extent);
        let _ = writeln!(
            svg,
            "<line x1=\"{x:.1}\" y1=\"{bottom}\" x2=\"{x:.1}\" y2=\"{}\" stroke=\"#999999\"/>",
            bottom + 5.0
        );
        let _ = writeln!(
            svg,
            "<text x=\"{x:.1}\" y=\"{}\" text-anchor=\"{anchor}\" {FONT}>{key}</text>",
            bottom + 18.0
        );
    }
    let gaps = plot.keys.gaps().count();
    let scaled = keys_text(plot.keys.keys_to_scale());
    let caption = if gaps == 0 {
        format!("key, linear: {scaled} across")
    } else {
        let widest = plot
            .keys
            .gaps()
            .map(|g| key_distance(g.from, g.to))
            .fold(0.0, f64::max);
        format!(
            "key, linear over {scaled}; {gaps} gap{} cut to {GAP_WIDTH} px and marked // \
             (steps to the key space's ends or over {GAP_RATIO}x the median; widest {})",
            if gaps == 1 { "" } else { "s" },
            keys_text(widest)
        )
    };
    let _ = writeln!(
        svg,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" {FONT}>{}</text>",
        LEFT + Plot::width() / 2.0,
        bottom + 45.0,
        esc(caption)
    );
}

/// A light band behind each gap, so a layer drawn across one shows where its keys are cut.
fn gap_bands(svg: &mut String, plot: &Plot) {
    for gap in plot.keys.gaps() {
        let _ = writeln!(
            svg,
            "<path class=\"gap\" d=\"M{:.1} {TOP} H{:.1} V{} H{:.1} Z\" fill=\"#eeeeee\"/>",
            gap.x0,
            gap.x1,
            TOP + Plot::height(),
            gap.x0
        );
    }
}

/// A break mark (//) on the key axis at each gap, over everything.
fn gap_marks(svg: &mut String, plot: &Plot) {
    let bottom = TOP + Plot::height();
    for gap in plot.keys.gaps() {
        let middle = (gap.x0 + gap.x1) / 2.0;
        for dx in [-3.0, 3.0] {
            let x = middle + dx;
            let _ = writeln!(
                svg,
                "<path class=\"break\" d=\"M{:.1} {} L{:.1} {}\" stroke=\"#444444\" \
                 stroke-width=\"1.5\"/>",
                x - 3.0,
                bottom + 5.0,
                x + 3.0,
                bottom - 5.0
            );
        }
    }
}

fn rect(svg: &mut String, plot: &Plot, l: &Drawn<'_>) {
    let x = plot.keys.x(l.keys.start);
    let width = (plot.keys.x(l.keys.end) - x).max(MIN_SIZE / 2.0);
    let (y, height) = if l.level == LayerLevel::Image {
        // Centred on its LSN.
        (plot.lsns.y(l.lsns.start) - IMAGE_BAR / 2.0, IMAGE_BAR)
    } else {
        let (top, bottom) = (plot.lsns.y(l.lsns.end), plot.lsns.y(l.lsns.start));
        if bottom - top >= MIN_SIZE {
            (top, bottom - top)
        } else {
            ((top + bottom - MIN_SIZE) / 2.0, MIN_SIZE)
        }
    };
    let fill = colour(l.level);
    // An image bar is drawn nearly solid over the deltas it lies on.
    let opacity = if l.level == LayerLevel::Image {
        "0.9"
    } else {
        "0.7"
    };
    let lsns = if l.level == LayerLevel::Image {
        format!("lsn {}", l.lsns.start)
    } else {
        format!("lsns {}..{}", l.lsns.start, l.lsns.end)
    };
    let wal = match l.wal_records {
        Some((wal, all)) => format!("&#10;{wal} of {all} values are PostgreSQL WAL records"),
        None => String::new(),
    };
    let _ = writeln!(
        svg,
        "<rect class=\"layer {}\" x=\"{x:.1}\" y=\"{y:.1}\" width=\"{width:.1}\" \
         height=\"{height:.1}\" fill=\"{fill}\" fill-opacity=\"{opacity}\" stroke=\"#222222\" \
         stroke-width=\"0.5\"><title>{} {}&#10;keys {}..{}&#10;{lsns}{wal}</title></rect>",
        class(l.level),
        l.level,
        esc(l.name),
        l.keys.start,
        l.keys.end,
    );
    if l.wal_records.is_some_and(|(wal, _)| wal > 0) {
        // Hatched over its colour: what only PostgreSQL's redo makes pages of.
        let _ = writeln!(
            svg,
            "<rect class=\"wal-records\" x=\"{x:.1}\" y=\"{y:.1}\" width=\"{width:.1}\" \
             height=\"{height:.1}\" fill=\"url(#wal-hatch)\" pointer-events=\"none\"/>"
        );
    }
}

/// The hatching of delta layers that hold WAL records.
const HATCH: &str = "<defs><pattern id=\"wal-hatch\" width=\"6\" height=\"6\" \
     patternUnits=\"userSpaceOnUse\" patternTransform=\"rotate(45)\"><line x1=\"0\" y1=\"0\" \
     x2=\"0\" y2=\"6\" stroke=\"#5b2a86\" stroke-width=\"2\"/></pattern></defs>\n";

/// The WAL the timeline stores, as a band beside the LSN axis, clipped to the plot.
fn wal_band(svg: &mut String, plot: &Plot, wal: Range<Lsn>) {
    let (lo, hi) = (plot.lsns.lo, plot.lsns.hi);
    let (start, end) = (wal.start.max(lo), wal.end.min(hi));
    let x = LEFT + Plot::width() + 8.0;
    if start < end {
        let (top, bottom) = (plot.lsns.y(end), plot.lsns.y(start));
        let _ = writeln!(
            svg,
            "<rect class=\"wal\" x=\"{x:.1}\" y=\"{top:.1}\" width=\"8\" \
             height=\"{:.1}\" fill=\"#5b2a86\" fill-opacity=\"0.6\"/>",
            (bottom - top).max(MIN_SIZE)
        );
    }
    let _ = writeln!(
        svg,
        "<text class=\"wal-label\" x=\"{LEFT}\" y=\"{}\" {FONT}>WAL stored {}..{} \
         (the band right of the plot, where it meets the layers' LSNs)</text>",
        HEIGHT - 8.0,
        wal.start,
        wal.end
    );
}
