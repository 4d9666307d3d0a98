//! The two axes of `pagectl draw`, both to scale, so a layer's width is how many keys it spans
//! and its height how many LSNs.
//!
//! **Keys** are placed linearly by their value, over the key space that holds layers: the
//! range from the lowest layer boundary to the highest. Layer boundaries are not spread evenly
//! over it (a relation's blocks are a few thousand keys of an 18-byte space; two relations are
//! 2^40 keys apart; the first and last image piece reach the key space's very ends), so one
//! linear scale would leave every layer but one a hairline. Some steps between consecutive
//! boundaries are therefore *gaps*, drawn [`GAP_WIDTH`] pixels wide and marked as breaks: a
//! step from the key space's first key or to its last (`Key::MIN`, `Key::MAX`: where a tiling
//! begins and ends, nothing a relation holds), and a step more than [`GAP_RATIO`] times the
//! median of the other steps. Everything else is on one common scale, except that a run of keys
//! between gaps never gets fewer than [`MIN_RUN_WIDTH`] pixels.
//!
//! **LSNs** are linear from the lowest LSN a layer has to the highest, unless the thinnest
//! delta layer would be less than [`MIN_LINEAR_ROW`] pixels tall: a small flush after a bulk
//! import, a run of L0s above a long L1 run. Then the axis is logarithmic in the distance from
//! one end, the bottom (the oldest LSN) or the top (the newest), whichever leaves the thinnest
//! delta layer taller, with labelled ticks at powers of 16 from that end. The caption says
//! which scale the picture uses.

use std::collections::BTreeSet;

use pageserver_api::Key;
use utils::Lsn;

/// A step between boundaries this many times the median step is drawn as a gap.
pub const GAP_RATIO: f64 = 1024.0;
/// The width a gap is drawn with.
pub const GAP_WIDTH: f64 = 16.0;
/// The least width of a run of keys between gaps (a few keys of metadata beside a relation).
pub const MIN_RUN_WIDTH: f64 = 4.0;
/// Below this height for the thinnest delta layer, the LSN axis becomes logarithmic.
pub const MIN_LINEAR_ROW: f64 = 3.0;

/// How many keys lie from `a` to `b` (`a <= b`), as a float: exact while the two differ only
/// in their last 16 bytes, else to 16 significant bytes, which is all a picture can show.
pub fn key_distance(a: Key, b: Key) -> f64 {
    let (a, b) = (a.to_bytes(), b.to_bytes());
    let Some(first) = a.iter().zip(&b).position(|(x, y)| x != y) else {
        return 0.0;
    };
    let window = first..(first + 16).min(a.len());
    let number = |bytes: &[u8]| {
        bytes
            .iter()
            .fold(0u128, |n, byte| (n << 8) | u128::from(*byte))
    };
    let dropped = a.len() - window.end;
    let difference = number(&b[window.clone()]).saturating_sub(number(&a[window]));
    difference as f64 * 256f64.powi(dropped as i32)
}

/// One stretch of the key axis: keys `from..to` drawn from `x0` to `x1`.
#[derive(Clone, Debug)]
pub struct Piece {
    pub from: Key,
    pub to: Key,
    pub x0: f64,
    pub x1: f64,
    /// Drawn narrow, not to scale (see the module documentation).
    pub gap: bool,
}

/// The key axis: boundaries placed to scale, gaps cut short.
pub struct KeyAxis {
    pub pieces: Vec<Piece>,
    left: f64,
    right: f64,
}

impl KeyAxis {
    /// The axis over the distinct layer boundaries `bounds`, drawn from `left` to `right`.
    pub fn new(bounds: &BTreeSet<Key>, left: f64, right: f64) -> KeyAxis {
        let bounds: Vec<Key> = bounds.iter().copied().collect();
        let steps: Vec<f64> = bounds
            .windows(2)
            .map(|w| key_distance(w[0], w[1]))
            .collect();
        // A step from the first key or to the last one reaches the end of the key space. When
        // there are other steps, those are gaps; the others are gaps past the ratio to their
        // median.
        let at_end: Vec<bool> = bounds
            .windows(2)
            .map(|w| w[0] == Key::MIN || w[1] == Key::MAX)
            .collect();
        let inner = at_end.iter().any(|e| !e);
        let mut sorted: Vec<f64> = steps
            .iter()
            .zip(&at_end)
            .filter(|(_, end)| !inner || !**end)
            .map(|(s, _)| *s)
            .collect();
        sorted.sort_by(f64::total_cmp);
        let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
        let is_gap: Vec<bool> = steps
            .iter()
            .zip(&at_end)
            .map(|(s, end)| (inner && *end) || *s > GAP_RATIO * median)
            .collect();
        // Runs of steps between gaps: each its keys, and the width it gets.
        let mut runs: Vec<(std::ops::Range<usize>, f64)> = Vec::new();
        let mut start = 0;
        for i in 0..=steps.len() {
            if i == steps.len() || is_gap[i] {
                if i > start {
                    runs.push((start..i, steps[start..i].iter().sum()));
                }
                start = i + 1;
            }
        }
        let gaps = is_gap.iter().filter(|g| **g).count();
        let room = (right - left - gaps as f64 * GAP_WIDTH).max(0.0);
        let widths = run_widths(&runs.iter().map(|r| r.1).collect::<Vec<_>>(), room);
        let mut width_of_step = vec![GAP_WIDTH; steps.len()];
        for ((range, keys), width) in runs.iter().zip(widths) {
            for i in range.clone() {
                width_of_step[i] = if *keys > 0.0 {
                    width * steps[i] / keys
                } else {
                    width / range.len() as f64
                };
            }
        }
        let mut x = left;
        let pieces = steps
            .iter()
            .enumerate()
            .map(|(i, _)| {
                let piece = Piece {
                    from: bounds[i],
                    to: bounds[i + 1],
                    x0: x,
                    x1: x + width_of_step[i],
                    gap: is_gap[i],
                };
                x = piece.x1;
                piece
            })
            .collect();
        KeyAxis {
            pieces,
            left,
            right,
        }
    }

    /// Where `key` is drawn (a key outside the boundaries at the nearer end).
    pub fn x(&self, key: Key) -> f64 {
        let (Some(first), Some(last)) = (self.pieces.first(), self.pieces.last()) else {
            // One boundary, or none: the middle.
            return (self.left + self.right) / 2.0;
        };
        if key <= first.from {
            return first.x0;
        }
        if key >= last.to {
            return last.x1;
        }
        let at = self.pieces.partition_point(|p| p.to <= key);
        let p = &self.pieces[at];
        let whole = key_distance(p.from, p.to);
        let part = if whole > 0.0 {
            key_distance(p.from, key) / whole
        } else {
            0.0
        };
        p.x0 + part * (p.x1 - p.x0)
    }

    pub fn gaps(&self) -> impl Iterator<Item = &Piece> {
        self.pieces.iter().filter(|p| p.gap)
    }

    /// Keys drawn to scale (every step but the gaps').
    pub fn keys_to_scale(&self) -> f64 {
        self.pieces
            .iter()
            .filter(|p| !p.gap)
            .map(|p| key_distance(p.from, p.to))
            .sum()
    }
}

/// The widths of runs of `keys` keys sharing `room` pixels on one scale, none below
/// [`MIN_RUN_WIDTH`] (those that would be get it, and the others share what is left).
fn run_widths(keys: &[f64], room: f64) -> Vec<f64> {
    let mut narrow = vec![false; keys.len()];
    loop {
        let fixed = narrow.iter().filter(|n| **n).count() as f64 * MIN_RUN_WIDTH;
        let scaled: f64 = keys
            .iter()
            .zip(&narrow)
            .filter(|(_, n)| !**n)
            .map(|(k, _)| k)
            .sum();
        let per_key = if scaled > 0.0 {
            (room - fixed).max(0.0) / scaled
        } else {
            0.0
        };
        let widths: Vec<f64> = keys
            .iter()
            .zip(&narrow)
            .map(|(k, n)| if *n { MIN_RUN_WIDTH } else { k * per_key })
            .collect();
        let mut changed = false;
        for (i, w) in widths.iter().enumerate() {
            if !narrow[i] && *w < MIN_RUN_WIDTH {
                narrow[i] = true;
                changed = true;
            }
        }
        if !changed {
            if scaled == 0.0 && !keys.is_empty() && narrow.iter().all(|n| !*n) {
                // Only empty runs: share the room evenly.
                return vec![room / keys.len() as f64; keys.len()];
            }
            return widths;
        }
    }
}

/// How the LSN axis maps LSNs to heights.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LsnScale {
    Linear,
    /// Logarithmic in the distance above the lowest LSN, in steps of `unit` LSNs.
    LogAbove {
        unit: f64,
    },
    /// Logarithmic in the distance below the highest LSN.
    LogBelow {
        unit: f64,
    },
}

/// The LSN axis: `lo` at `bottom`, `hi` at `top`.
pub struct LsnAxis {
    pub lo: Lsn,
    pub hi: Lsn,
    pub scale: LsnScale,
    top: f64,
    bottom: f64,
}

impl LsnAxis {
    /// The axis from `lo` to `hi`, its scale chosen for the delta layers' LSN ranges `deltas`.
    pub fn new(lo: Lsn, hi: Lsn, deltas: &[(Lsn, Lsn)], top: f64, bottom: f64) -> LsnAxis {
        let hi = hi.max(Lsn(lo.0 + 1));
        let mut axis = LsnAxis {
            lo,
            hi,
            scale: LsnScale::Linear,
            top,
            bottom,
        };
        let Some(thinnest) = deltas.iter().map(|(a, b)| b.0.saturating_sub(a.0)).min() else {
            return axis;
        };
        let thinnest_height = |axis: &LsnAxis| {
            deltas
                .iter()
                .map(|(a, b)| axis.y(*a) - axis.y(*b))
                .fold(f64::INFINITY, f64::min)
        };
        let linear = thinnest_height(&axis);
        if linear >= MIN_LINEAR_ROW {
            return axis;
        }
        let unit = thinnest.max(1) as f64;
        let mut best = (linear, LsnScale::Linear);
        for scale in [LsnScale::LogAbove { unit }, LsnScale::LogBelow { unit }] {
            axis.scale = scale;
            let height = thinnest_height(&axis);
            // A log scale only where it shows the thinnest layer markedly better.
            if height > 2.0 * best.0 {
                best = (height, scale);
            }
        }
        axis.scale = best.1;
        axis
    }

    /// Where `lsn` lies from 0 (`lo`) to 1 (`hi`).
    pub fn fraction(&self, lsn: Lsn) -> f64 {
        let lsn = lsn.clamp(self.lo, self.hi);
        let range = (self.hi.0 - self.lo.0) as f64;
        match self.scale {
            LsnScale::Linear => (lsn.0 - self.lo.0) as f64 / range,
            LsnScale::LogAbove { unit } => {
                ((lsn.0 - self.lo.0) as f64 / unit).ln_1p() / (range / unit).ln_1p()
            }
            LsnScale::LogBelow { unit } => {
                1.0 - ((self.hi.0 - lsn.0) as f64 / unit).ln_1p() / (range / unit).ln_1p()
            }
        }
    }

    pub fn y(&self, lsn: Lsn) -> f64 {
        self.bottom - self.fraction(lsn) * (self.bottom - self.top)
    }

    /// The LSNs to label besides the ends: multiples of a power of two (about eight of them)
    /// on a linear axis; powers of 16 from the scale's end on a logarithmic one.
    pub fn ticks(&self) -> Vec<Lsn> {
        let (lo, hi) = (self.lo.0, self.hi.0);
        match self.scale {
            LsnScale::Linear => {
                let step = ((hi - lo) / 8).max(1).next_power_of_two();
                let first = lo.div_ceil(step) * step;
                (0..)
                    .map(|i| first.saturating_add(i * step))
                    .take_while(|t| *t <= hi)
                    .map(Lsn)
                    .collect()
            }
            LsnScale::LogAbove { .. } | LsnScale::LogBelow { .. } => {
                let above = matches!(self.scale, LsnScale::LogAbove { .. });
                (0..16)
                    .map(|k| 16u64.saturating_pow(k))
                    .take_while(|d| *d < hi - lo)
                    .map(|d| Lsn(if above { lo + d } else { hi - d }))
                    .collect()
            }
        }
    }

    /// The caption's account of the scale.
    pub fn describe(&self) -> String {
        match self.scale {
            LsnScale::Linear => format!("LSN, linear from {} to {}", self.lo, self.hi),
            LsnScale::LogAbove { .. } => format!(
                "LSN, log scale of the distance above {} (ticks 16x apart)",
                self.lo
            ),
            LsnScale::LogBelow { .. } => format!(
                "LSN, log scale of the distance below {} (ticks 16x apart)",
                self.hi
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(block: u32) -> Key {
        Key::rel_block(1663, 5, 16384, 0, block)
    }

    #[test]
    fn key_distances_are_exact_where_keys_differ_late_and_close_where_early() {
        assert_eq!(key_distance(key(1), key(9)), 8.0);
        assert_eq!(key_distance(key(9), key(9)), 0.0);
        let other = Key::rel_block(1663, 5, 16390, 0, 0);
        // Relation 16390 is 6 relations of 2^40 keys (fork byte and block) further.
        assert_eq!(key_distance(key(0), other), 6.0 * 2f64.powi(40));
        let whole = key_distance(Key::MIN, Key::MAX);
        assert!((whole / 2f64.powi(144) - 1.0).abs() < 1e-9, "{whole}");
    }

    #[test]
    fn keys_are_to_scale_and_far_steps_are_gaps() {
        // Two relations of 24 blocks each, 2^42 keys apart, and the key space's ends.
        let other = |b| Key::rel_block(1663, 5, 16390, 0, b);
        let bounds: BTreeSet<Key> = [
            Key::MIN,
            key(0),
            key(12),
            key(24),
            other(0),
            other(6),
            other(24),
            Key::MAX,
        ]
        .into();
        let axis = KeyAxis::new(&bounds, 0.0, 1000.0);
        let gaps: Vec<(Key, Key)> = axis.gaps().map(|p| (p.from, p.to)).collect();
        assert_eq!(
            gaps,
            [
                (Key::MIN, key(0)),
                (key(24), other(0)),
                (other(24), Key::MAX)
            ]
        );
        assert_eq!(axis.keys_to_scale(), 48.0);
        // 1000 - 3 gaps of 16 px: 952 px for 48 keys, both relations alike.
        let per_key = (1000.0 - 3.0 * GAP_WIDTH) / 48.0;
        assert!((axis.x(key(12)) - axis.x(key(0)) - 12.0 * per_key).abs() < 1e-6);
        assert!((axis.x(other(6)) - axis.x(other(0)) - 6.0 * per_key).abs() < 1e-6);
        assert_eq!(axis.x(Key::MIN), 0.0);
        assert_eq!(axis.x(Key::MAX), 1000.0);
        assert!((axis.x(other(0)) - axis.x(key(24)) - GAP_WIDTH).abs() < 1e-6);
    }

    #[test]
    fn the_key_spaces_ends_are_gaps_however_few_the_other_steps() {
        // An image over the whole key space and a layer of one key: the layer is the picture.
        let bounds: BTreeSet<Key> = [Key::MIN, key(1), key(2), Key::MAX].into();
        let axis = KeyAxis::new(&bounds, 0.0, 1000.0);
        assert_eq!(axis.gaps().count(), 2);
        assert_eq!(axis.keys_to_scale(), 1.0);
        let one = axis.x(key(2)) - axis.x(key(1));
        assert!((one - (1000.0 - 2.0 * GAP_WIDTH)).abs() < 1e-6, "{one}");
        // Only the ends: drawn as they are.
        let ends: BTreeSet<Key> = [Key::MIN, key(1), Key::MAX].into();
        assert_eq!(KeyAxis::new(&ends, 0.0, 1000.0).gaps().count(), 0);
    }

    #[test]
    fn a_run_of_few_keys_beside_many_keeps_a_visible_width() {
        let far = Key::rel_block(1663, 5, 16390, 0, 0);
        let bounds: BTreeSet<Key> = [key(0), key(100_000), far, far.next()].into();
        let axis = KeyAxis::new(&bounds, 0.0, 1000.0);
        assert_eq!(axis.gaps().count(), 1);
        let run = axis.x(far.next()) - axis.x(far);
        assert!((run - MIN_RUN_WIDTH).abs() < 1e-6, "{run}");
        let big = axis.x(key(100_000)) - axis.x(key(0));
        assert!(
            (big - (1000.0 - GAP_WIDTH - MIN_RUN_WIDTH)).abs() < 1e-6,
            "{big}"
        );
    }

    #[test]
    fn lsns_are_linear_unless_the_thinnest_delta_would_vanish() {
        let linear = LsnAxis::new(Lsn(0x10), Lsn(0x50), &[(Lsn(0x10), Lsn(0x30))], 0.0, 640.0);
        assert_eq!(linear.scale, LsnScale::Linear);
        assert_eq!(linear.y(Lsn(0x30)), 320.0);
        assert_eq!(linear.ticks().first(), Some(&Lsn(0x10)));

        // Small flushes at the bottom, a long range above: log above the bottom.
        let deltas = [(Lsn(0x10), Lsn(0x20)), (Lsn(0x20), Lsn(0x1000_0000))];
        let above = LsnAxis::new(Lsn(0x10), Lsn(0x1000_0000), &deltas, 0.0, 640.0);
        assert!(
            matches!(above.scale, LsnScale::LogAbove { .. }),
            "{:?}",
            above.scale
        );
        assert!(above.y(Lsn(0x10)) - above.y(Lsn(0x20)) >= 20.0);
        assert!(above.describe().contains("above 0/10"));
        assert!(above.ticks().contains(&Lsn(0x110)));

        // A long L1 run with small L0s on top: log below the top.
        let deltas = [
            (Lsn(0x1), Lsn(0x4000_0000)),
            (Lsn(0x4000_0000), Lsn(0x4000_1000)),
        ];
        let below = LsnAxis::new(Lsn(0x1), Lsn(0x4000_1000), &deltas, 0.0, 640.0);
        assert!(
            matches!(below.scale, LsnScale::LogBelow { .. }),
            "{:?}",
            below.scale
        );
        assert!(below.y(Lsn(0x4000_0000)) - below.y(Lsn(0x4000_1000)) >= 20.0);
        // Higher LSNs are higher up, whatever the scale.
        for axis in [&linear, &above, &below] {
            let ys: Vec<f64> = [axis.lo, Lsn(axis.lo.0 + 5), axis.hi]
                .iter()
                .map(|l| axis.y(*l))
                .collect();
            assert!(ys.windows(2).all(|w| w[0] >= w[1]), "{ys:?}");
        }
    }
}
