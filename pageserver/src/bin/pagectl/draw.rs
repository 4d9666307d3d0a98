//! `pagectl draw`: the layers a timeline's manifest lists, as an SVG picture.
//!
//! Keys run across (x), LSNs up (y), one rectangle per layer: L0 and L1 delta layers as the
//! rectangle of their key and LSN ranges, image layers as a thin bar at their one LSN. Only the
//! manifest is read; every range comes from a layer's name, so a timeline of many thousands
//! of layers draws in a moment. Retired files are not part of the layer set and are not drawn.
//!
//! Both axes are *compressed*: a coordinate is the rank of a value among the distinct range
//! boundaries of the drawn layers, not the value itself (as Neon's layer drawing does).
//!
//! - Keys: a timeline's keys cluster in a few relations spread over an 18-byte space; drawn to
//!   scale, most layers would be hairlines. By rank, every key range is at least one step wide.
//! - LSNs: layers' LSN spans differ by orders of magnitude (a flush of one small batch next to a
//!   bulk import, an L1 run spanning every L0 it replaced). To scale, the L0s that compaction is
//!   waiting on would shrink to slivers above the L1 runs. By rank, every L0 (or an import's
//!   group of L0s) is a row of its own, so the L0 backlog can be counted, an L1 run reads as one row split into its key
//!   partitions, and each image bar sits at the top of the history it was made from. The axis
//!   labels give the real LSNs at their ranks.

use std::collections::BTreeSet;
use std::fmt::Display;
use std::ops::Range;

use pageserver::tenant::storage_layer::LayerName;
use pageserver::tenant::timeline::metadata::LayerLevel;

use super::*;

const WIDTH: f64 = 1200.0;
const HEIGHT: f64 = 800.0;
/// Room for the LSN labels, the key labels, and the title and legend.
const LEFT: f64 = 140.0;
const RIGHT: f64 = 30.0;
const TOP: f64 = 90.0;
const BOTTOM: f64 = 70.0;
/// An image layer spans one LSN: it is a bar this tall, so it can be seen.
const IMAGE_BAR: f64 = 6.0;
/// The least width or height of a delta layer's rectangle.
const MIN_SIZE: f64 = 1.0;
/// At most this many labelled LSN boundaries.
const LSN_TICKS: usize = 10;
/// The width of a key's label (36 digits of 11-pixel monospace), and the least gap between two.
const KEY_LABEL_WIDTH: f64 = 240.0;
const LABEL_GAP: f64 = 12.0;
const FONT: &str = "font-family=\"monospace\" font-size=\"11\"";

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
    /// An image layer's is its LSN to the next: it holds the pages as of its LSN, so its bar
    /// sits at the top of that LSN, level with the end of the deltas it was made from.
    lsns: Range<Lsn>,
}

/// A compressed axis: the distinct boundaries, sorted; each value sits at its rank.
struct RankAxis<T> {
    bounds: Vec<T>,
}

impl<T: Ord + Copy> RankAxis<T> {
    fn new(values: BTreeSet<T>) -> Self {
        RankAxis {
            bounds: values.into_iter().collect(),
        }
    }

    /// Where `v` lies from 0 (the first boundary) to 1 (the last); a value between two
    /// boundaries is placed at the next one (only boundaries are drawn).
    fn fraction(&self, v: T) -> f64 {
        let rank = self.bounds.partition_point(|b| *b < v);
        let steps = self.bounds.len().saturating_sub(1).max(1);
        rank.min(steps) as f64 / steps as f64
    }

    /// At most `n` boundaries spread evenly by rank, the first and the last among them.
    fn ticks(&self, n: usize) -> Vec<T> {
        let len = self.bounds.len();
        if len <= n {
            return self.bounds.clone();
        }
        let mut picked: Vec<T> = (0..n)
            .map(|i| self.bounds[i * (len - 1) / (n - 1).max(1)])
            .collect();
        picked.dedup();
        picked
    }
}

/// The rectangle of the plot the layers are drawn in.
struct Plot {
    keys: RankAxis<Key>,
    lsns: RankAxis<Lsn>,
}

impl Plot {
    fn width() -> f64 {
        WIDTH - LEFT - RIGHT
    }

    fn height() -> f64 {
        HEIGHT - TOP - BOTTOM
    }

    fn x(&self, key: Key) -> f64 {
        LEFT + self.keys.fraction(key) * Self::width()
    }

    fn y(&self, lsn: Lsn) -> f64 {
        TOP + Self::height() - self.lsns.fraction(lsn) * Self::height()
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

pub(super) fn draw(path: &Path, output: Option<&Path>, out: &mut impl Write) -> Result<(), Error> {
    let dir = timeline_dir(path)?;
    let file = dir.join(METADATA_FILE);
    let manifest = match TimelineMetadata::load(dir)? {
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
        layers.push(Drawn {
            name: &entry.name,
            level: entry.level,
            keys: name.key_range().clone(),
            lsns: name.lsn_range(),
        });
    }
    let svg = render(&manifest, &layers);
    match output {
        Some(to) => std::fs::write(to, svg).map_err(|e| Error::Path {
            path: to.to_owned(),
            message: format!("cannot write the picture: {e}"),
        }),
        None => Ok(out.write_all(svg.as_bytes())?),
    }
}

fn render(manifest: &TimelineMetadata, layers: &[Drawn<'_>]) -> String {
    let mut keys = BTreeSet::new();
    let mut lsns = BTreeSet::new();
    for l in layers {
        keys.insert(l.keys.start);
        keys.insert(l.keys.end);
        if l.level != LayerLevel::Image {
            lsns.insert(l.lsns.start);
        }
        lsns.insert(l.lsns.end);
    }
    if lsns.len() == 1 {
        // Only images, all at one LSN: the LSN below gives the axis a step.
        lsns.extend(layers.iter().map(|l| l.lsns.start));
    }
    let plot = Plot {
        keys: RankAxis::new(keys),
        lsns: RankAxis::new(lsns),
    };
    let mut svg = String::new();
    let _ = writeln!(svg, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>");
    let _ = writeln!(
        svg,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
         viewBox=\"0 0 {WIDTH} {HEIGHT}\" style=\"background:#ffffff\">"
    );
    title(&mut svg, manifest, layers);
    legend(&mut svg, layers);
    axes(&mut svg, &plot, layers.is_empty());
    // Deltas first, L1s under L0s, then images over both.
    for level in [LayerLevel::L1, LayerLevel::L0, LayerLevel::Image] {
        for l in layers.iter().filter(|l| l.level == level) {
            rect(&mut svg, &plot, l);
        }
    }
    svg.push_str("</svg>\n");
    svg
}

fn count(layers: &[Drawn<'_>], level: LayerLevel) -> usize {
    layers.iter().filter(|l| l.level == level).count()
}

fn title(svg: &mut String, m: &TimelineMetadata, layers: &[Drawn<'_>]) {
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
        x += 160.0;
    }
}

fn axes(svg: &mut String, plot: &Plot, empty: bool) {
    let (left, right) = (LEFT, LEFT + Plot::width());
    let (top, bottom) = (TOP, TOP + Plot::height());
    let _ = writeln!(
        svg,
        "<path class=\"frame\" d=\"M{left} {top} H{right} V{bottom} H{left} Z\" fill=\"none\" \
         stroke=\"#999999\" stroke-width=\"1\"/>"
    );
    if empty {
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" {FONT}>no layers</text>",
            LEFT + Plot::width() / 2.0,
            TOP + Plot::height() / 2.0
        );
        return;
    }
    for lsn in plot.lsns.ticks(LSN_TICKS) {
        let y = plot.y(lsn);
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
    for (key, x, anchor) in key_labels(plot) {
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
    let _ = writeln!(
        svg,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" {FONT}>key: the {} distinct layer key \
         boundaries, evenly spaced</text>",
        LEFT + Plot::width() / 2.0,
        bottom + 45.0,
        plot.keys.bounds.len()
    );
    let _ = writeln!(
        svg,
        "<text x=\"16\" y=\"{y}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {y})\" \
         {FONT}>LSN: the {} distinct layer LSN boundaries, evenly spaced</text>",
        plot.lsns.bounds.len(),
        y = TOP + Plot::height() / 2.0
    );
}

/// The key boundaries to label, where, and how each label is anchored: the first (its label
/// to the right), the last (to the left), and the middle one by rank if its label, centred,
/// leaves room on either side (a key's label is long: no more fit across the plot).
fn key_labels(plot: &Plot) -> Vec<(Key, f64, &'static str)> {
    let bounds = &plot.keys.bounds;
    let (Some(&first), Some(&last)) = (bounds.first(), bounds.last()) else {
        return Vec::new();
    };
    let mut labels = vec![(first, plot.x(first), "start")];
    if last == first {
        return labels;
    }
    let middle = bounds[bounds.len() / 2];
    let (x, half) = (plot.x(middle), KEY_LABEL_WIDTH / 2.0);
    if x - half >= plot.x(first) + KEY_LABEL_WIDTH + LABEL_GAP
        && x + half <= plot.x(last) - KEY_LABEL_WIDTH - LABEL_GAP
    {
        labels.push((middle, x, "middle"));
    }
    labels.push((last, plot.x(last), "end"));
    labels
}

fn rect(svg: &mut String, plot: &Plot, l: &Drawn<'_>) {
    let x = plot.x(l.keys.start);
    let width = (plot.x(l.keys.end) - x).max(MIN_SIZE);
    let top = plot.y(l.lsns.end);
    let (y, height) = if l.level == LayerLevel::Image {
        // The bar hangs below its LSN, inside the plot.
        (top.min(TOP + Plot::height() - IMAGE_BAR), IMAGE_BAR)
    } else {
        (top, (plot.y(l.lsns.start) - top).max(MIN_SIZE))
    };
    let fill = colour(l.level);
    // An image bar is drawn solid over the deltas it lies on.
    let opacity = if l.level == LayerLevel::Image {
        "1"
    } else {
        "0.7"
    };
    let lsns = if l.level == LayerLevel::Image {
        format!("lsn {}", l.lsns.start)
    } else {
        format!("lsns {}..{}", l.lsns.start, l.lsns.end)
    };
    let _ = writeln!(
        svg,
        "<rect class=\"layer {}\" x=\"{x:.1}\" y=\"{y:.1}\" width=\"{width:.1}\" \
         height=\"{height:.1}\" fill=\"{fill}\" fill-opacity=\"{opacity}\" stroke=\"#222222\" \
         stroke-width=\"0.5\"><title>{} {}&#10;keys {}..{}&#10;{lsns}</title></rect>",
        class(l.level),
        l.level,
        esc(l.name),
        l.keys.start,
        l.keys.end,
    );
}
