//! Creating a timeline, and loading one back: its manifest against the files in its directory.
//!
//! The manifest (`timeline::layer_set::manifest`) is the layer set. Loading reconciles the directory with it:
//!
//! | found in the directory                        | what load does                          |
//! |-----------------------------------------------|-----------------------------------------|
//! | a listed layer file, of the listed size, whose summary names this tenant, timeline and the ranges its name says | opens it |
//! | a listed layer file that is missing, of another size, or another layer | refuses to load, naming the file (the tenant is broken) |
//! | a layer-named file the manifest does not list, starting above `disk_consistent_lsn` | removes it (after the listed layers pass): a flush or an import wrote it, and crashed before its manifest was stored |
//! | an unlisted delta layer spanning exactly two or more consecutive listed L0 LSN ranges | removes it: a compaction wrote it, and crashed before its manifest was stored |
//! | an unlisted image layer at the last LSN of a listed L1 layer | removes it: an image creation wrote it, and crashed before its manifest was stored |
//! | a file the manifest names as retired | removes it, then stores the manifest without the name: a committed compaction or GC replaced it |
//! | `*.___temp`, ephemeral files                  | removes them                            |
//! | `ancestor` (a branch's link, `ancestry.rs`)    | leaves it: the tenant reads it          |
//! | anything else (an unlisted layer of older versions included) | logs it by name and leaves it alone |
//!
//! With remote storage ([`Timeline::load_with_remote`]) the L1 and image layers are on demand
//! (`storage_layer::on_demand`), and a listed layer whose local file is missing or of another
//! size is taken from the store when the store's newest index lists it with the manifest's size
//! and checksum: a missing layer (an L0 too) stays evicted, to be downloaded by the first read
//! or compaction that needs it; a damaged file is downloaded again before the load returns.
//!
//! The whole-file CRC-32C in the manifest is not recomputed here, since that would read every
//! layer at every start; the size and the summary's identity catch a missing, swapped, grown or
//! truncated file, and the per-value and per-node checksums catch damage inside one when it is
//! read. `pagectl layer verify` checks the CRC-32C too.
//!
//! A format 1 metadata file (before the manifest) has no list: its directory's layer files at
//! or below `disk_consistent_lsn` are the set, each checked for identity, and a manifest of them
//! replaces the old file before the timeline serves anything.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use utils::{Lsn, TenantId, TimelineId};

use super::{LayerMap, LifecycleCell, LsnWait, Timeline, TimelineConf, TimelineError, WriterState};
use crate::io::crashsafe::TEMP_SUFFIX;
use crate::page_cache::PageCache;
use crate::tenant::storage_layer::delta_layer::DeltaLayer;
use crate::tenant::storage_layer::ephemeral_file::remove_leftovers;
use crate::tenant::storage_layer::image_layer::ImageLayer;
use crate::tenant::storage_layer::on_demand::{LayerDownloader, OnDemandLayer, OpenSettings};
use crate::tenant::storage_layer::{Layer, LayerName};
use crate::tenant::timeline::layer_set::manifest::{
    LayerFileEntry, LayerLevel, Manifest, StoredMetadata, METADATA_FILE,
};

/// What the WAL receiver keeps in a timeline's directory (`walreceiver`): the WAL it received,
/// and its settings. A load leaves both alone.
pub const WAL_DIR: &str = "wal";
pub const WAL_RECEIVER_FILE: &str = "wal_receiver.json";

impl Timeline {
    /// Creates an empty timeline in `dir` (which must exist and be empty).
    pub fn create(
        dir: &Path,
        tenant_id: TenantId,
        timeline_id: TimelineId,
        cache: Arc<PageCache>,
        conf: TimelineConf,
    ) -> Result<Timeline, TimelineError> {
        Manifest::empty(tenant_id, timeline_id).store(dir)?;
        Self::load(dir, tenant_id, timeline_id, cache, conf)
    }

    /// Loads a timeline from `dir`: reads its manifest, reconciles the directory with it (see
    /// the module documentation) and opens the listed layer files.
    pub fn load(
        dir: &Path,
        tenant_id: TenantId,
        timeline_id: TimelineId,
        cache: Arc<PageCache>,
        conf: TimelineConf,
    ) -> Result<Timeline, TimelineError> {
        Self::load_with_remote(dir, tenant_id, timeline_id, cache, conf, None)
    }

    /// [`Timeline::load`] for a timeline with remote storage: its L1 and image layers are
    /// on demand, and a listed layer file that is missing or of another size locally is taken
    /// from the store when `remote` lists it with the manifest's size and checksum (see
    /// "With remote storage" in the module documentation).
    pub fn load_with_remote(
        dir: &Path,
        tenant_id: TenantId,
        timeline_id: TimelineId,
        cache: Arc<PageCache>,
        conf: TimelineConf,
        remote: Option<RemoteLayers>,
    ) -> Result<Timeline, TimelineError> {
        let io_err = |source| TimelineError::Io {
            path: dir.to_owned(),
            source,
        };
        let stored = Manifest::load(dir)?;
        if let Some(remote) = &remote {
            remote.check_not_behind(&stored)?;
        }
        remove_leftovers(dir).map_err(io_err)?;
        let on_demand = remote.as_ref().map(|r| OpenSettings {
            tenant_id,
            timeline_id,
            cache: cache.clone(),
            max_value_size: conf.max_value_size,
            downloader: r.downloader.clone(),
        });
        let opener = LayerOpener {
            dir,
            tenant_id,
            timeline_id,
            cache: &cache,
            max_value_size: conf.max_value_size,
            remote: remote.as_ref().zip(on_demand.as_ref()),
        };
        let (manifest, map) = match stored {
            StoredMetadata::Manifest(manifest) => {
                if (manifest.tenant_id, manifest.timeline_id) != (tenant_id, timeline_id) {
                    return Err(TimelineError::LayerSet {
                        file: METADATA_FILE.to_owned(),
                        reason: format!(
                            "it is the manifest of timeline {} of tenant {}",
                            manifest.timeline_id, manifest.tenant_id
                        ),
                    });
                }
                // Before any file is opened or removed: a set with a hole is refused whole.
                super::manifest::history::check(&manifest).map_err(|e| {
                    TimelineError::LayerSet {
                        file: METADATA_FILE.to_owned(),
                        reason: format!("the layer set has lost part of its history: {e}"),
                    }
                })?;
                let mut manifest = manifest;
                let map = opener.open_listed(&mut manifest)?;
                (manifest, map)
            }
            StoredMetadata::Legacy {
                disk_consistent_lsn,
            } => opener.upgrade_legacy(disk_consistent_lsn)?,
        };
        let durable = manifest.disk_consistent_lsn;
        let mut map = map;
        map.gc_cutoff = manifest.gc_cutoff_lsn;
        let lsn_wait = LsnWait::new(durable, conf.max_lsn_waiters);
        Ok(Timeline {
            tenant_id,
            timeline_id,
            cache_scope: TimelineId::generate(),
            dir: dir.to_owned(),
            cache,
            conf,
            layers: RwLock::new(Arc::new(map)),
            write_lock: Mutex::new(WriterState::default()),
            broken: Mutex::new(None),
            flush_lock: Mutex::new(()),
            pacer: Default::default(),
            compaction_lock: Mutex::new(()),
            image_lock: Mutex::new(()),
            manifest: Mutex::new(manifest),
            flush_wakeup: None,
            compaction_wakeup: None,
            l0_lock: Mutex::new(()),
            l0_changed: std::sync::Condvar::new(),
            l0_stop_waiters: std::sync::atomic::AtomicUsize::new(0),
            ancestor: OnceLock::new(),
            branch_points: Mutex::new(Vec::new()),
            lsn_leases: Mutex::new(Default::default()),
            import_lock: Mutex::new(()),
            lifecycle: LifecycleCell::new(),
            last_record_lsn: AtomicU64::new(durable.0),
            disk_consistent_lsn: AtomicU64::new(durable.0),
            lsn_wait,
            remote: OnceLock::new(),
            on_demand,
        })
    }
}

/// What every layer file of one timeline directory is opened and checked with.
struct LayerOpener<'a> {
    dir: &'a Path,
    tenant_id: TenantId,
    timeline_id: TimelineId,
    cache: &'a Arc<PageCache>,
    max_value_size: usize,
    remote: Option<(&'a RemoteLayers, &'a OpenSettings)>,
}

/// What a timeline with remote storage loads with.
pub struct RemoteLayers {
    pub downloader: Arc<dyn LayerDownloader>,
    /// The layers the store's newest index lists, by name: size and CRC-32C.
    pub listed: HashMap<String, (u64, u32)>,
    /// The store's newest index's `disk_consistent_lsn` and generation, if it has one.
    pub durable: Option<(Lsn, utils::Generation)>,
}

impl RemoteLayers {
    /// Refuses a local disk *behind* the store's index: it is older than what the store holds
    /// (restored from a backup, or another attachment's), and uploading from it would take the
    /// store back.
    fn check_not_behind(&self, stored: &StoredMetadata) -> Result<(), TimelineError> {
        let local = match stored {
            StoredMetadata::Manifest(m) => m.disk_consistent_lsn,
            StoredMetadata::Legacy {
                disk_consistent_lsn,
            } => *disk_consistent_lsn,
        };
        match self.durable {
            Some((remote, generation)) if remote > local => Err(TimelineError::LayerSet {
                file: METADATA_FILE.to_owned(),
                reason: format!(
                    "the remote index (generation {}) is at disk_consistent_lsn {remote}, ahead of the local disk's {local}; the local copy is stale",
                    generation.get()
                ),
            }),
            _ => Ok(()),
        }
    }
}

/// What to do with a directory entry that is not a listed layer.
enum Unlisted {
    Remove(&'static str),
    Ignore,
}

impl LayerOpener<'_> {
    /// Opens every layer the manifest lists, then removes the layer files it does not and
    /// the retired ones (storing a manifest without the retired names).
    fn open_listed(&self, manifest: &mut Manifest) -> Result<LayerMap, TimelineError> {
        let durable = manifest.disk_consistent_lsn;
        let mut map = LayerMap::default();
        for entry in &manifest.layers {
            let layer = match self.fetch_from_store(entry)? {
                Some(layer) => layer,
                None => match open_listed_layer(
                    self.dir,
                    &entry.name,
                    manifest,
                    self.cache,
                    self.max_value_size,
                ) {
                    Ok(layer) => self.on_demand(entry, layer)?,
                    Err(e) => self.fetch_damaged(entry, e)?,
                },
            };
            match (entry.level, layer) {
                (LayerLevel::L0, layer) => map.l0.push(layer),
                (_, layer) => map.below_l0.push(layer),
            }
        }
        map.l0
            .sort_by_key(|l| (l.lsn_range().end, l.lsn_range().start));
        map.sort_below_l0();
        // Only once the listed set is whole: a load that is refused deletes nothing. A flush
        // that crashed before its manifest leaves a layer starting above disk_consistent_lsn;
        // a compaction that crashed before its manifest leaves layers spanning two or more
        // listed L0s exactly; a retired file was replaced by a committed change. Any other
        // unlisted layer (a copy of a listed one, renamed, restored by hand) is left for
        // whoever put it there.
        let l0_lsns: Vec<std::ops::Range<Lsn>> = map.l0.iter().map(|l| l.lsn_range()).collect();
        let l1_ends: Vec<Lsn> = map
            .below_l0
            .iter()
            .filter(|l| l.is_delta_file())
            .map(|l| l.lsn_range().end)
            .collect();
        self.sweep(|name| {
            if manifest.layer(name).is_some() {
                None
            } else if manifest.retired.iter().any(|r| r == name) {
                Some(Unlisted::Remove(
                    "a retired layer file (a committed compaction or GC replaced it)",
                ))
            } else {
                match name.parse::<LayerName>() {
                    Ok(layer) if layer.lsn_range().start > durable => Some(Unlisted::Remove(
                        "a layer file no manifest lists, above disk_consistent_lsn (its flush did not finish)",
                    )),
                    Ok(layer) if is_uncommitted_compaction(&l0_lsns, &layer.lsn_range()) => {
                        Some(Unlisted::Remove(
                            "a layer file no manifest lists, spanning listed L0 layers (a compaction's output that was never committed)",
                        ))
                    }
                    Ok(layer @ LayerName::Image(_))
                        if l1_ends.contains(&layer.lsn_range().end) =>
                    {
                        Some(Unlisted::Remove(
                            "an image layer no manifest lists, at the last LSN of listed L1 layers (an image creation's output that was never committed)",
                        ))
                    }
                    _ => Some(Unlisted::Ignore),
                }
            }
        })?;
        if !manifest.retired.is_empty() {
            manifest.retired.clear();
            manifest.store(self.dir)?;
        }
        Ok(map)
    }

    /// With remote storage, a listed layer whose local file is missing or of another size, and
    /// which the store holds as listed: a damaged file is downloaded again now, a missing layer
    /// is left to download on demand (an L0 too: L0s are never evicted, but one an attach
    /// found only in the store is fetched by its first read or by compaction). `None`: the
    /// local file is the one to open (or the store cannot help).
    fn fetch_from_store(&self, entry: &LayerFileEntry) -> Result<Option<Layer>, TimelineError> {
        let local = match std::fs::symlink_metadata(self.dir.join(&entry.name)) {
            Ok(meta) if meta.is_file() => Some(meta.len()),
            _ => None,
        };
        let Some(settings) = self.store_copy(entry).filter(|_| local != Some(entry.size)) else {
            return Ok(None);
        };
        let damaged = local.map(|size| {
            format!(
                "the local layer file is {size} bytes, the manifest lists {}",
                entry.size
            )
        });
        self.take_from_store(entry, settings, damaged).map(Some)
    }

    /// With remote storage, a listed layer whose local file failed its checks (a damaged
    /// summary, another layer's bytes under its name) and which the store holds as listed: the
    /// file is removed and downloaded again now. Without, or if the store lacks it, `error`.
    fn fetch_damaged(
        &self,
        entry: &LayerFileEntry,
        error: TimelineError,
    ) -> Result<Layer, TimelineError> {
        let Some(settings) = self.store_copy(entry) else {
            return Err(error);
        };
        let damaged = format!("the local layer file failed its checks ({error})");
        self.take_from_store(entry, settings, Some(damaged))
    }

    /// With remote storage, if the store's newest index lists `entry` as the manifest does
    /// (its object can stand in for the local file): what its on-demand layer opens with.
    fn store_copy(&self, entry: &LayerFileEntry) -> Option<&OpenSettings> {
        let (remote, settings) = self.remote?;
        (remote.listed.get(&entry.name) == Some(&(entry.size, entry.crc32c))).then_some(settings)
    }

    /// Layer `entry` as the store holds it: left evicted, or, with `damaged` (why the local
    /// file is not the layer), that file removed and the layer downloaded again now.
    fn take_from_store(
        &self,
        entry: &LayerFileEntry,
        settings: &OpenSettings,
        damaged: Option<String>,
    ) -> Result<Layer, TimelineError> {
        let layer = OnDemandLayer::new(
            self.dir,
            &entry.name,
            entry.size,
            entry.crc32c,
            settings.clone(),
            None,
        )?;
        if let Some(why) = damaged {
            tracing::warn!(tenant = %self.tenant_id, timeline = %self.timeline_id, layer = %entry.name,
                "{why}: downloading it again");
            let path = self.dir.join(&entry.name);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => return Err(TimelineError::Io { path, source }),
            }
            layer.prefetch()?;
        }
        Ok(Layer::OnDemand(Arc::new(layer)))
    }

    /// An L1 or image layer opened from its local file, as a timeline with remote storage
    /// holds it: on demand (resident now). An L0 stays as it is.
    fn on_demand(&self, entry: &LayerFileEntry, layer: Layer) -> Result<Layer, TimelineError> {
        let Some((_, settings)) = self.remote.filter(|_| entry.level != LayerLevel::L0) else {
            return Ok(layer);
        };
        let layer = OnDemandLayer::new(
            self.dir,
            &entry.name,
            entry.size,
            entry.crc32c,
            settings.clone(),
            Some(layer),
        )?;
        Ok(Layer::OnDemand(Arc::new(layer)))
    }

    /// A format 1 directory: the layer files at or below `disk_consistent_lsn` are the set.
    /// Stores the manifest of that set before returning it.
    fn upgrade_legacy(&self, durable: Lsn) -> Result<(Manifest, LayerMap), TimelineError> {
        // Written, but the metadata update that would acknowledge it was lost: removed without
        // being read, so a layer torn by the crash cannot fail the load.
        let unacknowledged = |end: Lsn| end.0.saturating_sub(1) > durable.0;
        let mut names = Vec::new();
        self.sweep(|name| {
            let Ok(layer) = name.parse::<LayerName>() else {
                return Some(Unlisted::Ignore);
            };
            if unacknowledged(layer.lsn_range().end) {
                Some(Unlisted::Remove("a layer beyond disk_consistent_lsn"))
            } else {
                names.push(name.to_owned());
                None
            }
        })?;
        let mut manifest = Manifest::empty(self.tenant_id, self.timeline_id);
        manifest.disk_consistent_lsn = durable;
        // What it holds is not checked for holes: format 1 kept no list to check against.
        manifest.contiguous_from = durable;
        let mut deltas = Vec::with_capacity(names.len());
        for name in names {
            let layer = self.open_unlisted(&name)?;
            let lsn_end = layer.summary().lsn_end;
            if unacknowledged(lsn_end) {
                return Err(TimelineError::LayerSet {
                    file: name,
                    reason: format!("its name hides versions up to {lsn_end}"),
                });
            }
            manifest.add_layer(LayerFileEntry {
                name,
                size: layer.file_size(),
                crc32c: layer.file_crc32c()?,
                level: LayerLevel::L0,
                // Format 1 kept no groups (every file was one flush's, but unverified).
                group_size: 0,
            });
            deltas.push(Arc::new(layer));
        }
        manifest.store(self.dir)?;
        tracing::info!(
            tenant = %self.tenant_id,
            timeline = %self.timeline_id,
            layers = manifest.layers.len(),
            "replaced format 1 metadata with a manifest of the timeline's layer files"
        );
        deltas.sort_by_key(|l: &Arc<DeltaLayer>| (l.summary().lsn_end, l.summary().lsn_start));
        let map = LayerMap {
            l0: deltas.into_iter().map(Layer::Delta).collect(),
            ..LayerMap::default()
        };
        Ok((manifest, map))
    }

    /// Goes through the directory: removes temporary files, and for every other entry but the
    /// metadata asks `unlisted` whether it is a listed layer (`None`), a file to remove, or one
    /// to leave alone.
    fn sweep(
        &self,
        mut unlisted: impl FnMut(&str) -> Option<Unlisted>,
    ) -> Result<(), TimelineError> {
        let io_err = |source| TimelineError::Io {
            path: self.dir.to_owned(),
            source,
        };
        for entry in std::fs::read_dir(self.dir).map_err(io_err)? {
            let entry = entry.map_err(io_err)?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                tracing::warn!(tenant = %self.tenant_id, timeline = %self.timeline_id, file = ?name,
                    "ignoring a file whose name is not UTF-8 in the timeline directory");
                continue;
            };
            if [
                METADATA_FILE,
                super::ANCESTOR_FILE,
                WAL_DIR,
                WAL_RECEIVER_FILE,
            ]
            .contains(&name)
            {
                continue;
            }
            let remove = if name.ends_with(TEMP_SUFFIX) {
                Some("a temporary file")
            } else {
                match unlisted(name) {
                    None => None,
                    Some(Unlisted::Remove(why)) => Some(why),
                    Some(Unlisted::Ignore) => {
                        tracing::warn!(tenant = %self.tenant_id, timeline = %self.timeline_id, file = name,
                            "ignoring a file that is not one of the timeline's layer files");
                        None
                    }
                }
            };
            if let Some(why) = remove {
                tracing::info!(tenant = %self.tenant_id, timeline = %self.timeline_id, file = name,
                    "removing {why}");
                std::fs::remove_file(entry.path()).map_err(io_err)?;
            }
        }
        Ok(())
    }

    /// Opens layer file `name` of a format 1 directory and checks that it is the layer its
    /// name says, of this timeline.
    fn open_unlisted(&self, name: &str) -> Result<DeltaLayer, TimelineError> {
        let layer = DeltaLayer::open(
            &self.dir.join(name),
            self.cache.clone(),
            self.max_value_size,
        )?;
        layer.check_identity(self.tenant_id, self.timeline_id)?;
        Ok(layer)
    }
}

/// Opens layer file `name` of timeline directory `dir` as the page server does with every
/// listed layer at startup: `manifest` must list it, the file must exist with the listed size
/// and open as the kind of layer its listed level says (an image layer, or a delta layer for
/// L0 and L1), its summary must name the manifest's tenant and timeline and the ranges its
/// name says, and its versions must not reach beyond the manifest's `disk_consistent_lsn`.
/// What `pagectl layer verify` does before reading the rest.
pub fn open_listed_layer(
    dir: &Path,
    name: &str,
    manifest: &Manifest,
    cache: &Arc<PageCache>,
    max_value_size: usize,
) -> Result<Layer, TimelineError> {
    let (path, level) = check_listed(dir, name, manifest)?;
    let layer = match level {
        LayerLevel::Image => {
            let image = ImageLayer::open(&path, cache.clone(), max_value_size)?;
            image.check_identity(manifest.tenant_id, manifest.timeline_id)?;
            Layer::Image(Arc::new(image))
        }
        LayerLevel::L0 | LayerLevel::L1 => {
            let delta = DeltaLayer::open(&path, cache.clone(), max_value_size)?;
            delta.check_identity(manifest.tenant_id, manifest.timeline_id)?;
            Layer::Delta(Arc::new(delta))
        }
    };
    let durable = manifest.disk_consistent_lsn;
    let lsn_end = layer.lsn_range().end;
    // lsn_end is above the start (the summaries check it), so this cannot wrap.
    if lsn_end.0 - 1 > durable.0 {
        return Err(TimelineError::LayerSet {
            file: name.to_owned(),
            reason: format!(
                "its versions reach {}, beyond the manifest's disk_consistent_lsn {durable}",
                Lsn(lsn_end.0 - 1)
            ),
        });
    }
    Ok(layer)
}

/// Whether `range` runs exactly from the start of one of `l0`'s LSN ranges (sorted) to the end
/// of a later one, over two or more of them: what an L0 compaction's outputs span.
fn is_uncommitted_compaction(l0: &[std::ops::Range<Lsn>], range: &std::ops::Range<Lsn>) -> bool {
    // The distinct ranges, oldest first: an import's group of L0s shares one, and an import's
    // range starts above the flushes' end (the LSNs in between hold nothing).
    let mut distinct: Vec<&std::ops::Range<Lsn>> = l0.iter().collect();
    distinct.dedup();
    let Some(first) = distinct.iter().position(|r| r.start == range.start) else {
        return false;
    };
    for (n, r) in distinct[first..].iter().enumerate() {
        if r.end == range.end {
            return n >= 1;
        }
        if r.end > range.end {
            return false;
        }
    }
    false
}

/// Checks that `manifest` lists layer file `name` and that it exists in `dir` with the listed
/// size; returns its path and its listed level.
fn check_listed(
    dir: &Path,
    name: &str,
    manifest: &Manifest,
) -> Result<(std::path::PathBuf, LayerLevel), TimelineError> {
    let refused = |reason: String| TimelineError::LayerSet {
        file: name.to_owned(),
        reason,
    };
    let entry = manifest
        .layer(name)
        .ok_or_else(|| refused("the manifest does not list it".to_owned()))?;
    let path = dir.join(name);
    let size = match std::fs::symlink_metadata(&path) {
        Ok(meta) if meta.is_file() => meta.len(),
        Ok(_) => return Err(refused("listed in the manifest, but not a file".to_owned())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(refused("listed in the manifest, but missing".to_owned()))
        }
        Err(source) => return Err(TimelineError::Io { path, source }),
    };
    if size != entry.size {
        return Err(refused(format!(
            "it is {size} bytes, the manifest lists {}",
            entry.size
        )));
    }
    Ok((path, entry.level))
}

#[cfg(test)]
mod tests;
