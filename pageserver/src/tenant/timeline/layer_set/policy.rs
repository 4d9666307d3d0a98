//! The choices compaction, image creation and GC make over a layer map, apart from the work
//! that carries them out: which L0s one compaction merges, which pieces of the key space get
//! new images, where GC moves the cutoff and which layers it then removes. Each is a function
//! of one map snapshot and the settings (image creation's byte trigger reads the layers'
//! indexes through the function it is given), so each writer is choose (here), write (its own
//! file), commit (`change.rs`), and each rule is tested without writing a layer.
//!
//! One rule ties compaction to image creation: L1 layers may stack over one key above its
//! newest image up to [`l1_stack_limit`] (twice `image_creation_threshold`); compaction waits
//! for images past it ([`choose_compaction`]), and image creation images every piece at it
//! ([`choose_images`]), even where no other trigger fires, so the wait always ends.

use std::ops::Range;

use pageserver_api::Key;
use utils::Lsn;

use super::map::LayerMap;
use crate::tenant::storage_layer::Layer;
use crate::tenant::timeline::{TimelineConf, TimelineError};

/// The most L0s one compaction merges: bounds its memory to this many stream buffers.
pub const MAX_COMPACTION_INPUTS: usize = 32;

/// The oldest L0s to merge: whole LSN ranges (an import's group is never split), as many as
/// fit in [`MAX_COMPACTION_INPUTS`] layers, and always the first two ranges (a group holds at
/// most `MAX_IMPORT_RUNS + 1` layers, so two fit).
fn compaction_inputs(l0: &[Layer]) -> Vec<Layer> {
    let mut inputs: Vec<Layer> = Vec::new();
    let mut ranges = 0;
    let mut rest = l0;
    while let Some(first) = rest.first() {
        let range = first.lsn_range();
        let group = rest.iter().take_while(|l| l.lsn_range() == range).count();
        if ranges >= 2 && inputs.len() + group > MAX_COMPACTION_INPUTS {
            break;
        }
        inputs.extend(rest[..group].iter().cloned());
        ranges += 1;
        rest = &rest[group..];
    }
    inputs
}

/// How many L1 layers may stack over one key above its newest image before L0 compaction waits
/// for image creation: twice `image_creation_threshold` (0, no limit, when image creation is
/// off).
pub fn l1_stack_limit(conf: &TimelineConf) -> usize {
    2 * conf.image_creation_threshold
}

/// A key range whose newest image is one layer, or which has none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub keys: Range<Key>,
    /// The index of its newest image among those given to [`pieces`].
    pub image: Option<usize>,
}

/// Cuts `[Key::MIN, Key::MAX)` into pieces by the newest image over each key: `images` are
/// the key range and LSN of each image layer.
pub fn pieces(images: &[(Range<Key>, Lsn)]) -> Vec<Piece> {
    let mut bounds: Vec<Key> = images
        .iter()
        .flat_map(|(keys, _)| [keys.start, keys.end])
        .chain([Key::MIN, Key::MAX])
        .collect();
    bounds.sort_unstable();
    bounds.dedup();
    let mut out: Vec<Piece> = Vec::new();
    for w in bounds.windows(2) {
        let (start, end) = (w[0], w[1]);
        let newest = images
            .iter()
            .enumerate()
            .filter(|(_, (keys, _))| keys.start <= start && end <= keys.end)
            .max_by_key(|(_, (_, lsn))| *lsn)
            .map(|(i, _)| i);
        match out.last_mut() {
            Some(last) if last.image == newest => last.keys.end = end,
            _ => out.push(Piece {
                keys: start..end,
                image: newest,
            }),
        }
    }
    out
}

/// The most of `ranges` that hold any one key.
pub fn max_stack(ranges: &[Range<Key>]) -> usize {
    let mut events: Vec<(Key, i32)> = ranges
        .iter()
        .filter(|r| r.start < r.end)
        .flat_map(|r| [(r.start, 1), (r.end, -1)])
        .collect();
    // At one key, ends before starts: [a, b) and [b, c) never stack.
    events.sort_unstable();
    let (mut depth, mut most) = (0i32, 0i32);
    for (_, step) in events {
        depth += step;
        most = most.max(depth);
    }
    most as usize
}

/// The most L1 layers above the newest image that stack over any one key, by key ranges alone
/// (no I/O): what a read of the worst key visits below the L0s, besides one image.
pub fn l1_stack_above_images(map: &LayerMap) -> usize {
    let images = map.image_ranges();
    pieces(&images)
        .iter()
        .map(|piece| range_stack(map, &piece.keys, piece.image.map(|i| images[i].1)))
        .max()
        .unwrap_or(0)
}

/// The most L1 layers above `above` (the piece's image LSN, if any) whose key ranges hold any
/// one key of `keys`: by ranges alone, so a layer that only spans the piece counts too. What
/// L0 compaction waits on, so image creation must clear it even where no trigger fires.
fn range_stack(map: &LayerMap, keys: &Range<Key>, above: Option<Lsn>) -> usize {
    let stacked: Vec<Range<Key>> = map
        .below_l0
        .iter()
        .filter(|l| l.is_delta_file())
        .filter(|l| above.is_none_or(|a| l.lsn_range().start > a))
        .map(|l| l.key_range())
        .map(|r| r.start.max(keys.start)..r.end.min(keys.end))
        .collect();
    max_stack(&stacked)
}

/// Whether the key ranges of `covers` together hold all of `keys`.
pub fn covered(keys: &Range<Key>, mut covers: Vec<Range<Key>>) -> bool {
    covers.sort_unstable_by_key(|r| r.start);
    let mut reached = keys.start;
    for r in covers {
        if reached >= keys.end {
            break;
        }
        if r.start > reached {
            return false;
        }
        reached = reached.max(r.end);
    }
    reached >= keys.end
}

/// Whether `layer` may be removed under `cutoff` and `retain`, given the image layers of the
/// same map (see the module documentation).
fn removable(layer: &Layer, images: &[(Range<Key>, Lsn)], cutoff: Lsn, retain: &[Lsn]) -> bool {
    let lsns = layer.lsn_range();
    let last = Lsn(lsns.end.0 - 1);
    if last > cutoff {
        return false;
    }
    let is_image = layer.is_image();
    let keys = layer.key_range();
    // Images newer than the layer's history and at or below `upto`, together covering it.
    let covered_upto = |upto: Lsn| {
        let covers = images
            .iter()
            .filter(|(_, lsn)| *lsn <= upto && if is_image { *lsn > last } else { *lsn >= last })
            .map(|(r, _)| r.clone())
            .collect();
        covered(&keys, covers)
    };
    covered_upto(cutoff)
        && retain
            .iter()
            .filter(|r| **r >= lsns.start && **r < cutoff)
            .all(|r| covered_upto(*r))
}

/// What one compaction should do.
pub enum CompactionChoice {
    /// Too few L0 ranges.
    Nothing,
    /// L1s above the images already stack to the limit: image creation must catch up first.
    WaitForImages { stack: usize, limit: usize },
    /// Merge these L0s, the oldest.
    Merge(Vec<Layer>),
}

/// Which L0s a compaction merges, if it should run: at least `min_inputs` (and two) distinct
/// LSN ranges, and L1s not yet at [`l1_stack_limit`] above the images.
pub fn choose_compaction(
    map: &LayerMap,
    min_inputs: usize,
    conf: &TimelineConf,
) -> CompactionChoice {
    // A depth of one is never compacted: an output's LSN range must differ from every
    // input's (an import's group alone would give its outputs its range).
    if map.l0_depth() < min_inputs.max(2) {
        return CompactionChoice::Nothing;
    }
    // Image creation has fallen behind: another run of L1s would put one more layer under
    // every read. Wait for images instead (L0s pile up meanwhile, and ingest backpressure
    // holds them), so the layers a read visits keep their bound.
    let limit = l1_stack_limit(conf);
    if limit != 0 {
        let stack = l1_stack_above_images(map);
        if stack >= limit {
            return CompactionChoice::WaitForImages { stack, limit };
        }
    }
    CompactionChoice::Merge(compaction_inputs(&map.l0))
}

/// What one image creation should write: the pieces of the key space due for images, at the
/// last LSN of the L1 layers.
#[derive(Debug)]
pub struct ImagePlan {
    pub lsn: Lsn,
    /// Pieces of the key space looked at.
    pub pieces: usize,
    /// The key ranges of those due, in key order.
    pub due: Vec<Range<Key>>,
}

/// Which pieces get new images (see `image_creation.rs` for the triggers); `None` when there
/// are no L1 layers. `value_bytes_in(layer, keys)` is the bytes of `layer`'s values in `keys`.
pub fn choose_images(
    map: &LayerMap,
    conf: &TimelineConf,
    force: bool,
    value_bytes_in: impl Fn(&Layer, Range<Key>) -> Result<u64, TimelineError>,
) -> Result<Option<ImagePlan>, TimelineError> {
    let Some(l1_end) = map.l1_end() else {
        return Ok(None);
    };
    let lsn = Lsn(l1_end.0 - 1);
    let images: Vec<&Layer> = map.below_l0.iter().filter(|l| l.is_image()).collect();
    // In the same order as `images`, so a piece's index names its image in both.
    let all = pieces(&map.image_ranges());
    let threshold = conf.image_creation_threshold;
    let limit = l1_stack_limit(conf);
    let mut due = Vec::new();
    for piece in &all {
        let image = piece.image.map(|i| images[i]);
        let above = image.map_or(Lsn(0), |i| i.lsn_range().start);
        let mut stacked = Vec::new();
        let mut delta_bytes = 0u64;
        for layer in &map.below_l0 {
            if !layer.is_delta_file() {
                continue;
            }
            let own = layer.key_range();
            let keys = own.start.max(piece.keys.start)..own.end.min(piece.keys.end);
            // No L1 straddles an image's LSN: one starting above it lies wholly above.
            let is_above = image.is_none() || layer.lsn_range().start > above;
            if !is_above || keys.start >= keys.end {
                continue;
            }
            let bytes = value_bytes_in(layer, keys.clone())?;
            if bytes > 0 {
                stacked.push(keys);
                delta_bytes += bytes;
            }
        }
        // L0 compaction waits on this piece (see `l1_stack_above_images`): new images end
        // the wait even when its L1s only span it, holding none of its keys.
        let holds_compaction =
            limit != 0 && range_stack(map, &piece.keys, image.map(|_| above)) >= limit;
        if stacked.is_empty() && !holds_compaction {
            continue;
        }
        let by_count = threshold != 0 && max_stack(&stacked) >= threshold;
        let by_size = threshold != 0
            && image.is_some_and(|i| {
                delta_bytes * 100 >= i.file_size() * u64::from(conf.image_creation_delta_percent)
            });
        if force || by_count || by_size || holds_compaction {
            due.push(piece.keys.clone());
        }
    }
    Ok(Some(ImagePlan {
        lsn,
        pieces: all.len(),
        due,
    }))
}

/// Where a GC pass moves the cutoff (see `gc.rs`): `gc_horizon` below `last_record`, never
/// below where it is, never past the L1s' last LSN (where images are made), never past the
/// oldest lease of a read in progress.
pub fn gc_cutoff(
    map: &LayerMap,
    last_record: Lsn,
    gc_horizon: u64,
    oldest_lease: Option<Lsn>,
) -> Lsn {
    let old = map.gc_cutoff;
    let wanted = Lsn(last_record.0.saturating_sub(gc_horizon));
    let cutoff = match map.l1_end() {
        Some(end) => old.max(wanted.min(Lsn(end.0 - 1))),
        None => old,
    };
    // Leases are taken at or above the cutoff, under the pass's lock, so this never lowers
    // it.
    match oldest_lease {
        Some(leased) => cutoff.min(leased).max(old),
        None => cutoff,
    }
}

/// The L1 and image layers a GC pass at `cutoff` removes, keeping what a read at any of
/// `retain` would reach (see `gc.rs`).
pub fn gc_removable(map: &LayerMap, cutoff: Lsn, retain: &[Lsn]) -> Vec<Layer> {
    let images = map.image_ranges();
    map.below_l0
        .iter()
        .filter(|l| removable(l, &images, cutoff, retain))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests;
