//! Image creation: every page of a key range as of the LSN where the L1 layers end, written as
//! image layers, so that a read of those keys stops there instead of walking every L1 below.
//!
//! ```text
//!   LSN ^                                         L0 L0 L0            (above: not imaged yet)
//!       |  ----------------- B (where the L1s end) ------------------
//!       |  [image @ B-1: k0..k1][image @ B-1: k1..k2]     <- written here, for pieces that
//!       |  L1 ... L1  L1 ... L1  L1 ... L1                   triggered
//!       |  L1 ... L1  L1 ... L1
//!       |  [ older image k0..k1 ][ older image k1..k2 ][ older image k2..MAX ]
//!       +-------------------------------------------------------------> key
//! ```
//!
//! # Pieces and triggers
//!
//! The key space is cut into *pieces* by the images there are: each piece is a key range whose
//! newest image is one layer (or none: at first, the one piece `[Key::MIN, Key::MAX)`). A piece
//! gets new images when
//!
//! - `image_creation_threshold` or more L1 layers above its image hold versions of its keys
//!   over some one key (they stack: a read of that key visits each), or
//! - the bytes of those versions reach `image_creation_delta_percent` of its image's size (the
//!   history above the image is worth as much as the image: reads replay more, and GC cannot
//!   drop the older layers until an image covers them), or
//! - L0 compaction waits on it: L1 layers above its image stack to `2 × image_creation_threshold`
//!   over one of its keys by their key ranges alone (see `compaction.rs`), counting layers that
//!   only span the piece without holding any of its keys, which the first trigger does not.
//!
//! The first two are measured from the layers' indexes alone (two descents per layer and
//! piece, see [`DeltaLayer::value_bytes_in`]), the third from key ranges: no value is read to
//! decide. A piece's new images tile
//! exactly its key range (the last one ends where the piece does, the first starts where it
//! starts, each is cut at `compaction_target_size` between keys), so the images there are
//! always cover every key, from `Key::MIN` to `Key::MAX`, with no gap.
//!
//! # The LSN, and why no L1 straddles it
//!
//! Images are made at `B - 1`, the last LSN of the newest L1 layers: every version at or below
//! it is in an L1 or an older layer, and compaction only ever adds L1s starting at `B` or later.
//! So an image's LSN is never inside an L1's LSN range, which is what lets the layer map walk
//! images and L1s in one order (see `layer_set/map.rs`). `B - 1` is never below the GC cutoff,
//! which GC keeps at or below it (see `gc.rs`).
//!
//! # Reading the pages
//!
//! A piece's pages are read with the paged scan of `[start, end)` at `B - 1`
//! ([`Timeline::scan_page`]): the same pages a client scan returns, byte for byte. A key whose
//! versions hold no base has no page and no image (a read of it answers "no page" either way).
//! On a branch the scan reads through to the ancestor's layers at the branch LSN, so a branch's
//! images hold every page of their range, its ancestor's included: an image layer answers for
//! its whole key range, and reads of those keys stop there rather than at the ancestor.
//!
//! # Steps, and what a crash after each leaves
//!
//! 1. The images are written, each durable under its final name. An error from here to the
//!    commit removes them; a crash leaves unlisted image layers at the last LSN of a listed
//!    L1, which the next load removes.
//! 2. One manifest lists them at level `Image` (failpoint `image-creation-before-manifest`
//!    just before): the commit point.
//! 3. The layer map takes them (failpoint `image-creation-after-manifest` just before).
//!
//! Nothing is replaced, so nothing is retired: the layers an image makes unnecessary are GC's
//! to remove. Image creation and GC take `image_lock` (one at a time); L0 compaction never
//! waits for either, and ingest and reads go on throughout.

use super::*;
use crate::tenant::storage_layer::image_layer::ImageLayerWriter;

/// Keys a scan page of image creation reads at a time.
const SCAN_PAGE_KEYS: usize = 256;

/// What one image creation did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageCreationOutcome {
    /// The LSN the images were made at (`None`: no L1 layers, nothing to image).
    pub lsn: Option<Lsn>,
    /// Pieces of the key space looked at.
    pub pieces: usize,
    /// Pieces that triggered and got new images.
    pub pieces_imaged: usize,
    /// Image layers written.
    pub layers_written: usize,
    pub images: u64,
    /// Bytes of layer blocks read for the pages (index and values, through the page cache).
    pub bytes_read: u64,
    pub bytes_written: u64,
}

/// A key range whose newest image is one layer, or which has none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Piece {
    pub keys: Range<Key>,
    /// The index of its newest image among those given to [`pieces`].
    pub image: Option<usize>,
}

/// Cuts `[Key::MIN, Key::MAX)` into pieces by the newest image over each key: `images` are
/// the key range and LSN of each image layer.
pub(crate) fn pieces(images: &[(Range<Key>, Lsn)]) -> Vec<Piece> {
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
pub(crate) fn max_stack(ranges: &[Range<Key>]) -> usize {
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
pub(crate) fn l1_stack_above_images(map: &LayerMap) -> usize {
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
/// The bytes of `layer`'s values in `keys`, from its index. An evicted layer is not downloaded
/// for it: its whole file size stands in (an overestimate, which can only make images sooner).
fn value_bytes_in(layer: &Layer, keys: Range<Key>) -> Result<u64, TimelineError> {
    let resident = match layer {
        Layer::OnDemand(l) => l.loaded(),
        other => Some(other.clone()),
    };
    match resident {
        Some(Layer::Delta(delta)) => Ok(delta.value_bytes_in(keys)?),
        _ => Ok(layer.file_size()),
    }
}

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

impl Timeline {
    /// Writes image layers for the pieces of the key space whose history above their newest
    /// image triggers it (see the module documentation); `force` images every piece that has
    /// any L1 history above its image. One image creation or GC runs at a time per timeline.
    pub fn create_images(&self, force: bool) -> Result<ImageCreationOutcome, TimelineError> {
        let _images = self.image_lock.lock().unwrap_or_else(|e| e.into_inner());
        if self.stopped.load(Ordering::Acquire) {
            return Err(TimelineError::ShuttingDown);
        }
        self.check_layer_set_known()?;
        let mut outcome = ImageCreationOutcome::default();
        let started = Instant::now();
        let map = self.layer_map();
        let Some(l1_end) = map.l1_end() else {
            return Ok(outcome);
        };
        let lsn = Lsn(l1_end.0 - 1);
        outcome.lsn = Some(lsn);
        let images: Vec<&Layer> = map.below_l0.iter().filter(|l| l.is_image()).collect();
        // In the same order as `images`, so a piece's index names its image in both.
        let all = pieces(&map.image_ranges());
        outcome.pieces = all.len();
        let threshold = self.conf.image_creation_threshold;
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
            let limit = super::compaction::l1_stack_limit(&self.conf);
            let holds_compaction =
                limit != 0 && range_stack(&map, &piece.keys, image.map(|_| above)) >= limit;
            if stacked.is_empty() && !holds_compaction {
                continue;
            }
            let by_count = threshold != 0 && max_stack(&stacked) >= threshold;
            let by_size = threshold != 0
                && image.is_some_and(|i| {
                    delta_bytes * 100
                        >= i.file_size() * u64::from(self.conf.image_creation_delta_percent)
                });
            if force || by_count || by_size || holds_compaction {
                due.push(piece.keys.clone());
            }
        }
        drop(map);
        let mut written = Vec::new();
        let (result, cost) = crate::io::read_cost::measure(|| {
            for keys in &due {
                self.image_piece(keys.clone(), lsn, &mut written)?;
            }
            Ok::<_, TimelineError>(())
        });
        let blocks = cost.idx_hit + cost.idx_miss + cost.val_hit + cost.val_miss;
        outcome.bytes_read = u64::from(blocks) * PAGE_SZ as u64;
        if result.is_ok() && written.is_empty() {
            return Ok(outcome);
        }
        if let Err(e) = result {
            self.remove_uncommitted(written.iter().map(|w| w.path.clone()));
            return Err(e);
        }
        let mut change = LayerChange::new(ChangeKind::ImageCreation);
        change.add = written.iter().map(NewLayerFile::image).collect();
        self.commit(change)?;
        outcome.pieces_imaged = due.len();
        outcome.layers_written = written.len();
        outcome.images = written.iter().map(|w| w.summary.entries).sum();
        outcome.bytes_written = written.iter().map(|w| w.size).sum();
        crate::metrics::IMAGE_BYTES_READ.inc_by(outcome.bytes_read);
        crate::metrics::IMAGE_BYTES_WRITTEN.inc_by(outcome.bytes_written);
        crate::metrics::IMAGE_LAYERS_CREATED.inc_by(outcome.layers_written as u64);
        tracing::info!(
            tenant = %self.tenant_id,
            timeline = %self.timeline_id,
            pieces = outcome.pieces,
            pieces_imaged = outcome.pieces_imaged,
            layers = outcome.layers_written,
            images = outcome.images,
            bytes_read = outcome.bytes_read,
            bytes_written = outcome.bytes_written,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "created image layers at {lsn}"
        );
        Ok(outcome)
    }

    /// Writes the pages of `keys` at `lsn` as image layers of about `compaction_target_size`
    /// bytes each, tiling `keys` exactly; adds each finished one to `written`.
    fn image_piece(
        &self,
        keys: Range<Key>,
        lsn: Lsn,
        written: &mut Vec<crate::tenant::storage_layer::image_layer::WrittenLayer>,
    ) -> Result<(), TimelineError> {
        let new_writer = |start: Key| {
            ImageLayerWriter::new(
                &self.dir,
                self.tenant_id,
                self.timeline_id,
                start..keys.end,
                lsn,
            )
        };
        let mut writer = new_writer(keys.start)?;
        let mut cursor = ScanCursor::new(keys.start, keys.end, lsn);
        loop {
            if self.shutting_down.load(Ordering::Acquire) {
                return Err(TimelineError::ShuttingDown);
            }
            let page = self.scan_page(&mut cursor, SCAN_PAGE_KEYS)?;
            for (key, image) in page.entries {
                if writer.values_bytes() >= self.conf.compaction_target_size {
                    let full = std::mem::replace(&mut writer, new_writer(key)?);
                    written.push(full.finish_before(key)?);
                }
                writer.put_image(key, &image)?;
            }
            if !page.more {
                break;
            }
        }
        written.push(writer.finish()?);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
