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
//!   over one of its keys by their key ranges alone (`layer_set/policy.rs`), counting layers that
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
//! # Pages only PostgreSQL's redo makes
//!
//! A piece holding a key whose history at the LSN needs PostgreSQL's redo (a WAL record above
//! its newest materialized version, `TimelineError::NeedsWalRedo`) gets no images: an image
//! layer answers for every key of its range, so one without that key would answer "no page".
//! The files the piece wrote so far are removed, and the piece is counted in
//! `pieces_needing_redo`; images for it come from a snapshot of its pages.
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
    /// Pieces that triggered but hold a page only PostgreSQL's redo makes at the LSN: not
    /// imaged (an image layer answers for every key of its range).
    pub pieces_needing_redo: usize,
    /// Image layers written.
    pub layers_written: usize,
    pub images: u64,
    /// Bytes of layer blocks read for the pages (index and values, through the page cache).
    pub bytes_read: u64,
    pub bytes_written: u64,
}

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

impl Timeline {
    /// Writes image layers for the pieces of the key space whose history above their newest
    /// image triggers it (see the module documentation); `force` images every piece that has
    /// any L1 history above its image. One image creation or GC runs at a time per timeline.
    pub fn create_images(&self, force: bool) -> Result<ImageCreationOutcome, TimelineError> {
        let _images = self.image_lock.lock().unwrap_or_else(|e| e.into_inner());
        if self.is_stopped() {
            return Err(TimelineError::ShuttingDown);
        }
        self.check_layer_set_known()?;
        let mut outcome = ImageCreationOutcome::default();
        let started = Instant::now();
        let Some(plan) =
            policy::choose_images(&self.layer_map(), &self.conf, force, value_bytes_in)?
        else {
            return Ok(outcome);
        };
        let (lsn, due) = (plan.lsn, plan.due);
        outcome.lsn = Some(lsn);
        outcome.pieces = plan.pieces;
        let mut written = Vec::new();
        let (result, cost) = crate::io::read_cost::measure(|| {
            for keys in &due {
                let before = written.len();
                match self.image_piece(keys.clone(), lsn, &mut written) {
                    Ok(()) => outcome.pieces_imaged += 1,
                    Err(TimelineError::NeedsWalRedo { key, redo_from, .. }) => {
                        // The piece keeps its history as it is; what it wrote so far goes.
                        self.remove_uncommitted(written.drain(before..).map(|w| w.path));
                        outcome.pieces_needing_redo += 1;
                        tracing::debug!(
                            tenant = %self.tenant_id,
                            timeline = %self.timeline_id,
                            "no images for {}..{}: page {key} needs WAL redo from {redo_from}",
                            keys.start,
                            keys.end
                        );
                    }
                    Err(e) => return Err(e),
                }
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
            )?
            .with_compression(self.conf.layer_compression)
        };
        let mut writer = new_writer(keys.start)?;
        let mut cursor = ScanCursor::new(keys.start, keys.end, lsn);
        loop {
            if self.is_shutting_down() {
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
