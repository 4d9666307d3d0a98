//! The one way a change to a timeline's layer set becomes durable and visible: a flush, an
//! import, a compaction, an image creation and a GC each describe theirs as a [`LayerChange`]
//! (files added, layers removed, a new `disk_consistent_lsn` or GC cutoff) and end in
//! [`Timeline::commit`], which does, in this order:
//!
//! 1. failpoint `<kind>-before-manifest` (a flush's is `flush-before-metadata`); a compaction,
//!    image creation or GC is refused once shutdown began (the directory may be about to go);
//! 2. opens the new files as the layer map will hold them (L1 and image layers through the
//!    local-disk cache when there is remote storage);
//! 3. stores one manifest with all of it: **the commit point** (`commit_manifest`, which also
//!    hands the manifest to remote storage and runs the history check first);
//! 4. failpoint `<kind>-after-manifest`;
//! 5. publishes the new layer map in one swap (with `disk_consistent_lsn`, under the map's
//!    lock, so that a put never starts a layer reaching back into a flushed one);
//! 6. retires the removed layers (each file goes with its last reader) and wakes who waits on
//!    the L0 count: ingest backpressure when L0s left, the compaction loop when L0s came.
//!
//! An error before the commit point removes the new files (nothing lists them); an error at it
//! depends on where the manifest's store failed: before its rename the same, after it nothing is
//! removed and the timeline breaks with its layer set unknown (`timeline/broken.rs`), since the
//! manifest on disk may list them. An error after the commit point (only the failpoint) leaves
//! a durable change that the map does not show yet: the next load shows it.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use utils::Lsn;

use super::manifest::{self, group_size, LayerFileEntry, LayerLevel, Manifest, MetadataError};
use crate::tenant::storage_layer::delta_layer::{self, DeltaLayer};
use crate::tenant::storage_layer::image_layer::{self, ImageLayer};
use crate::tenant::storage_layer::on_demand::OnDemandLayer;
use crate::tenant::storage_layer::Layer;
use crate::tenant::timeline::{Timeline, TimelineError};

/// Who changes the layer set: names the failpoints, and says whether shutdown refuses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::tenant::timeline) enum ChangeKind {
    /// The oldest frozen layer, written as an L0 (or as nothing, when it held nothing).
    Flush,
    /// An import's group of L0s, all at its LSN.
    Import,
    Compaction,
    ImageCreation,
    Gc,
}

impl ChangeKind {
    /// The failpoints just before the manifest is stored and just after.
    fn failpoints(self) -> (Option<&'static str>, Option<&'static str>) {
        match self {
            ChangeKind::Flush => (Some("flush-before-metadata"), None),
            // An import's is at the start of its commit, before its checkpoint.
            ChangeKind::Import => (None, None),
            ChangeKind::Compaction => (
                Some("compaction-before-manifest"),
                Some("compaction-after-manifest"),
            ),
            ChangeKind::ImageCreation => (
                Some("image-creation-before-manifest"),
                Some("image-creation-after-manifest"),
            ),
            ChangeKind::Gc => (Some("gc-before-manifest"), Some("gc-after-manifest")),
        }
    }

    /// Maintenance stops at shutdown; a flush is how shutdown makes ingest durable, and an
    /// import checks for shutdown before its own checkpoint.
    fn refused_at_shutdown(self) -> bool {
        matches!(
            self,
            ChangeKind::Compaction | ChangeKind::ImageCreation | ChangeKind::Gc
        )
    }
}

/// A layer file a change adds: durable under its final name, not yet listed anywhere.
pub(in crate::tenant::timeline) struct NewLayerFile {
    pub path: PathBuf,
    pub name: String,
    pub size: u64,
    pub crc32c: u32,
    pub level: LayerLevel,
    /// The file opened already, as the layer map will hold it ([`Timeline::open_new_layer`]):
    /// a caller that commits under locks opens its files before taking them.
    pub opened: Option<Layer>,
}

impl NewLayerFile {
    /// A delta layer file a flush or an import (`L0`) or a compaction (`L1`) wrote.
    pub fn delta(written: &delta_layer::WrittenLayer, level: LayerLevel) -> NewLayerFile {
        NewLayerFile {
            path: written.path.clone(),
            name: written.summary.file_name(),
            size: written.size,
            crc32c: written.crc32c,
            level,
            opened: None,
        }
    }

    /// An image layer file an image creation wrote.
    pub fn image(written: &image_layer::WrittenLayer) -> NewLayerFile {
        NewLayerFile {
            path: written.path.clone(),
            name: written.summary.layer_name().to_string(),
            size: written.size,
            crc32c: written.crc32c,
            level: LayerLevel::Image,
            opened: None,
        }
    }
}

/// One change to the layer set, as [`Timeline::commit`] makes it durable and visible.
pub(in crate::tenant::timeline) struct LayerChange {
    pub kind: ChangeKind,
    /// New files, written together: the manifest lists them as one group.
    pub add: Vec<NewLayerFile>,
    /// Layers of the current map the change replaces or drops: retired in the manifest, gone
    /// from the map, and deleted with their last reader.
    pub remove: Vec<Layer>,
    /// The new `disk_consistent_lsn`, for a flush or an import.
    pub disk_consistent_lsn: Option<Lsn>,
    /// The new GC cutoff, for a GC.
    pub gc_cutoff: Option<Lsn>,
    /// A flush: the map drops its oldest frozen layer.
    pub flushed_frozen: bool,
}

impl LayerChange {
    pub fn new(kind: ChangeKind) -> LayerChange {
        LayerChange {
            kind,
            add: Vec::new(),
            remove: Vec::new(),
            disk_consistent_lsn: None,
            gc_cutoff: None,
            flushed_frozen: false,
        }
    }
}

impl Timeline {
    /// Makes `change` durable and visible (see the module documentation). Returns the layers
    /// the map took, in the order of `change.add`.
    pub(in crate::tenant::timeline) fn commit(
        &self,
        change: LayerChange,
    ) -> Result<Vec<Layer>, TimelineError> {
        self.commit_then(change, || {})
    }

    /// [`Timeline::commit`], calling `after_swap` once the new map is published and before
    /// the removed layers are retired: GC releases the leases there (retiring an on-demand
    /// layer waits for a download of it in progress, which no lease should wait behind).
    pub(in crate::tenant::timeline) fn commit_then(
        &self,
        change: LayerChange,
        after_swap: impl FnOnce(),
    ) -> Result<Vec<Layer>, TimelineError> {
        let kind = change.kind;
        let (before, after) = kind.failpoints();
        let stored = (|| {
            if let Some(name) = before {
                self.failpoint(name)?;
            }
            if kind.refused_at_shutdown() {
                self.check_not_shutting_down()?;
            }
            let opened = change
                .add
                .iter()
                .map(|file| match &file.opened {
                    Some(layer) => Ok(layer.clone()),
                    None => self.open_new_layer(file),
                })
                .collect::<Result<Vec<_>, _>>()?;
            self.commit_manifest(|manifest| {
                if let Some(lsn) = change.disk_consistent_lsn {
                    manifest.disk_consistent_lsn = lsn;
                }
                if let Some(cutoff) = change.gc_cutoff {
                    manifest.gc_cutoff_lsn = cutoff;
                }
                for layer in &change.remove {
                    manifest.retire_layer(&layer.file_name().unwrap_or_default());
                }
                for file in &change.add {
                    manifest.add_layer(LayerFileEntry {
                        name: file.name.clone(),
                        size: file.size,
                        crc32c: file.crc32c,
                        level: file.level,
                        group_size: group_size(change.add.len()),
                    });
                }
            })?;
            Ok::<_, TimelineError>(opened)
        })();
        let opened = stored.inspect_err(|_| {
            // Nothing is removed while the manifest on disk may list them (see `broken.rs`).
            self.remove_uncommitted(change.add.iter().map(|file| file.path.clone()));
        })?;
        if let Some(name) = after {
            self.failpoint(name)?;
        }
        let l0_added = change.add.iter().any(|f| f.level == LayerLevel::L0);
        let l0_removed = {
            let map = self.layer_map();
            change
                .remove
                .iter()
                .any(|r| map.l0.iter().any(|l| l.same_as(r)))
        };
        self.update_layer_map(|map| {
            if change.flushed_frozen {
                map.frozen.remove(0);
            }
            let kept = |l: &Layer| !change.remove.iter().any(|r| l.same_as(r));
            map.l0.retain(kept);
            map.below_l0.retain(kept);
            let mut below = false;
            for (file, layer) in change.add.iter().zip(&opened) {
                if file.level == LayerLevel::L0 {
                    map.l0.push(layer.clone());
                } else {
                    map.below_l0.push(layer.clone());
                    below = true;
                }
            }
            if below {
                map.sort_below_l0();
            }
            if let Some(cutoff) = change.gc_cutoff {
                map.gc_cutoff = map.gc_cutoff.max(cutoff);
            }
            if let Some(lsn) = change.disk_consistent_lsn {
                // Under the map's lock: a put that finds no layer starts the next one at
                // disk_consistent_lsn + 1, which must not reach back into this change's.
                self.disk_consistent_lsn.store(lsn.0, Ordering::Release);
            }
            Ok::<_, TimelineError>(())
        })?;
        after_swap();
        for layer in &change.remove {
            layer.retire();
        }
        if l0_removed {
            self.l0_count_changed();
        }
        if l0_added {
            if let Some(compaction) = &self.compaction_wakeup {
                let threshold = self.conf.compaction_threshold;
                if threshold != 0 && self.layer_map().l0_depth() >= threshold {
                    compaction.notify();
                }
            }
        }
        Ok(opened)
    }

    /// A new layer file as the layer map holds it: an L0 as it is (L0s stay on the local
    /// disk), an L1 or image layer through the local-disk cache when there is remote storage.
    pub(in crate::tenant::timeline) fn open_new_layer(
        &self,
        file: &NewLayerFile,
    ) -> Result<Layer, TimelineError> {
        let max_value_size = self.conf.max_value_size;
        let layer = match file.level {
            LayerLevel::L0 | LayerLevel::L1 => Layer::Delta(Arc::new(DeltaLayer::open(
                &file.path,
                self.cache.clone(),
                max_value_size,
            )?)),
            LayerLevel::Image => Layer::Image(Arc::new(ImageLayer::open(
                &file.path,
                self.cache.clone(),
                max_value_size,
            )?)),
        };
        if file.level == LayerLevel::L0 {
            return Ok(layer);
        }
        self.file_layer(layer, &file.name, file.size, file.crc32c)
    }

    /// Failpoint `name`: an error naming it, in `testing` builds when it is armed.
    #[cfg_attr(not(feature = "testing"), allow(unused_variables))]
    pub(in crate::tenant::timeline) fn failpoint(&self, name: &str) -> Result<(), TimelineError> {
        fail::fail_point!(name, |_| Err(TimelineError::Io {
            path: self.dir.clone(),
            source: std::io::Error::other(format!("failpoint {name}")),
        }));
        Ok(())
    }

    /// Changes the manifest and stores it: the commit point of a change to the layer set. The
    /// manifest's lock is held throughout, so that commits (a flush's, a compaction's) never
    /// work from the same old manifest. Retired files already removed are dropped from the
    /// list first.
    ///
    /// A store that fails after its rename ([`MetadataError::Indeterminate`]) leaves the new
    /// manifest or, after a crash, the old one: the timeline breaks with the layer set unknown
    /// (`timeline/broken.rs`), so that no file either one lists is removed and nothing commits on top
    /// of either until a load reads which it is.
    fn commit_manifest(&self, change: impl FnOnce(&mut Manifest)) -> Result<(), TimelineError> {
        let mut current = self.manifest();
        self.check_layer_set_known()?;
        let mut next = current.clone();
        change(&mut next);
        next.retired.retain(|name| self.dir.join(name).exists());
        // A change that would leave a hole in the history is a bug: refused before it is
        // durable, so the layer set on disk stays one that loads.
        manifest::history::check(&next).map_err(|e| TimelineError::LayerSet {
            file: manifest::METADATA_FILE.to_owned(),
            reason: format!("a change to the layer set was refused: {e}"),
        })?;
        match next.store(&self.dir) {
            Ok(()) => {}
            Err(e @ MetadataError::Indeterminate { .. }) => {
                self.break_timeline(e.to_string(), true);
                return Err(TimelineError::ChangeIndeterminate(e));
            }
            Err(e) => return Err(e.into()),
        }
        if let Some(remote) = self.remote.get() {
            remote.manifest_committed(&next);
        }
        *current = next;
        Ok(())
    }

    /// Removes the files of `paths` that the manifest does not list: new layer files of a
    /// change that failed before (or in) its commit, which nothing else knows. Best effort: a
    /// file left behind is unlisted, and the next load judges it. Nothing is removed while
    /// the manifest on disk is unknown: it may list them.
    pub(in crate::tenant::timeline) fn remove_uncommitted(
        &self,
        paths: impl IntoIterator<Item = PathBuf>,
    ) {
        if self.layer_set_unknown() {
            return;
        }
        let manifest = self.manifest();
        for path in paths {
            let listed = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| manifest.layer(n).is_some());
            if !listed {
                let _ = std::fs::remove_file(&path);
            }
        }
    }

    /// A new L1 or image layer file, as the layer map holds it: on demand with remote storage
    /// (resident now), as it is without.
    fn file_layer(
        &self,
        layer: Layer,
        name: &str,
        size: u64,
        crc32c: u32,
    ) -> Result<Layer, TimelineError> {
        let Some(settings) = &self.on_demand else {
            return Ok(layer);
        };
        let on_demand =
            OnDemandLayer::new(&self.dir, name, size, crc32c, settings.clone(), Some(layer))?;
        Ok(Layer::OnDemand(Arc::new(on_demand)))
    }

    /// Refuses to commit a compaction, image creation or GC once shutdown began: the
    /// directory may be about to be deleted (see [`Timeline::shutdown`]).
    fn check_not_shutting_down(&self) -> Result<(), TimelineError> {
        if self.is_shutting_down() {
            return Err(TimelineError::ShuttingDown);
        }
        Ok(())
    }
}
