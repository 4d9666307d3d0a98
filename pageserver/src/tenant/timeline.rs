//! A timeline: the layer map of one (tenant, timeline), ingest into it, GetPage@LSN from it,
//! checkpoints to disk, and loading it back after a restart.
//!
//! # Layer map
//!
//! ```text
//!   newest                                                        oldest
//!   open InMemoryLayer -> frozen InMemoryLayers -> delta layer files (by LSN range)
//! ```
//!
//! GetPage@LSN walks the layers from newest to oldest, each contributing the key's versions at
//! or below the LSN, until one reaches a base (an image or a `will_init` delta), and redoes the
//! page. A materialized page in the page cache at or below the LSN serves as the base when there
//! is one: only newer versions are collected and applied on top of it. Those pages are keyed by
//! the timeline's incarnation, so a reloaded timeline never builds on a page that an earlier
//! incarnation reconstructed from versions a crash discarded.
//!
//! # Durability
//!
//! `last_record_lsn` is the newest LSN ingested; `disk_consistent_lsn` (persisted in
//! `metadata`) is the newest LSN whose versions are all in fsynced layer files. A checkpoint
//! freezes the open layer, writes each frozen layer as a delta layer (durable under its final
//! name), and only then advances `disk_consistent_lsn` in the metadata. After a crash the
//! timeline restarts at `disk_consistent_lsn`: a layer file beyond it (written, but its
//! metadata update lost) is removed, because the client re-sends everything after
//! `disk_consistent_lsn` and the versions must not exist twice. Nothing at or below
//! `disk_consistent_lsn` is ever lost or changed.
//!
//! # Concurrency
//!
//! The layer map is behind one `RwLock`: readers share it, a put or a layer swap takes it
//! briefly. Puts and checkpoints are serialized by `write_lock`, taken before the map lock.
//! Flushing in the background, `wait_lsn` and flush triggers by size and age come next.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;
use pageserver_api::{reconstruct_page, Key, RedoError, Value};
use utils::{Lsn, TenantId, TimelineId};

use crate::page_cache::{MaterializedPageKey, PageCache};
use crate::tenant::delta_layer::{DeltaLayer, DeltaLayerError, TEMP_SUFFIX};
use crate::tenant::ephemeral_file::remove_leftovers;
use crate::tenant::inmemory_layer::{
    FreezeError, GetError, InMemoryLayer, PutError, WriteToDiskError,
};
use crate::tenant::metadata::{MetadataError, TimelineMetadata, METADATA_FILE};
use crate::tenant::storage_layer::LayerRecords;
use crate::PAGE_SZ;

/// Settings a timeline needs.
#[derive(Clone, Debug)]
pub struct TimelineConf {
    /// The largest page image or reconstructed page.
    pub max_value_size: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum TimelineError {
    #[error("LSN {lsn} is at or below the durable LSN {disk_consistent}: that history is fixed")]
    LsnDurable { lsn: Lsn, disk_consistent: Lsn },
    #[error("LSN {lsn} is beyond the last ingested LSN {last_record}")]
    LsnNotYetIngested { lsn: Lsn, last_record: Lsn },
    #[error(transparent)]
    Put(#[from] PutError),
    #[error(transparent)]
    Get(#[from] GetError),
    #[error(transparent)]
    Freeze(#[from] FreezeError),
    #[error(transparent)]
    Flush(#[from] WriteToDiskError),
    #[error(transparent)]
    Layer(#[from] DeltaLayerError),
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    #[error("page {key} at {lsn} cannot be reconstructed: {source}")]
    Redo {
        key: Key,
        lsn: Lsn,
        source: RedoError,
    },
    #[error("timeline directory {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

#[derive(Default)]
struct LayerMap {
    open: Option<InMemoryLayer>,
    /// Oldest first.
    frozen: Vec<Arc<InMemoryLayer>>,
    /// Oldest first (by LSN range).
    deltas: Vec<Arc<DeltaLayer>>,
}

/// What the layer map holds, for inspection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerCounts {
    pub open_values: usize,
    pub frozen: usize,
    pub deltas: usize,
}

/// See the module documentation.
pub struct Timeline {
    tenant_id: TenantId,
    timeline_id: TimelineId,
    /// Keys this incarnation's materialized pages in the page cache. A new one per load: pages
    /// reconstructed by an earlier incarnation may rest on versions that a crash discarded
    /// (above `disk_consistent_lsn`), and the cache outlives the timeline.
    cache_scope: TimelineId,
    dir: PathBuf,
    cache: Arc<PageCache>,
    conf: TimelineConf,
    layers: RwLock<LayerMap>,
    write_lock: Mutex<()>,
    last_record_lsn: AtomicU64,
    disk_consistent_lsn: AtomicU64,
}

impl Timeline {
    /// Creates an empty timeline in `dir` (which must exist and be empty).
    pub fn create(
        dir: &Path,
        tenant_id: TenantId,
        timeline_id: TimelineId,
        cache: Arc<PageCache>,
        conf: TimelineConf,
    ) -> Result<Timeline, TimelineError> {
        TimelineMetadata {
            disk_consistent_lsn: Lsn::INVALID,
        }
        .store(dir)?;
        Self::load(dir, tenant_id, timeline_id, cache, conf)
    }

    /// Loads a timeline from `dir`: reads its metadata, removes temporary and ephemeral files
    /// and layers beyond `disk_consistent_lsn`, and opens the remaining layer files.
    pub fn load(
        dir: &Path,
        tenant_id: TenantId,
        timeline_id: TimelineId,
        cache: Arc<PageCache>,
        conf: TimelineConf,
    ) -> Result<Timeline, TimelineError> {
        let io_err = |source| TimelineError::Io {
            path: dir.to_owned(),
            source,
        };
        let metadata = TimelineMetadata::load(dir)?;
        let durable = metadata.disk_consistent_lsn;
        remove_leftovers(dir).map_err(io_err)?;
        let mut deltas = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io_err)? {
            let path = entry.map_err(io_err)?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name == METADATA_FILE {
                continue;
            }
            if name.ends_with(TEMP_SUFFIX) {
                std::fs::remove_file(&path).map_err(io_err)?;
                continue;
            }
            let layer = DeltaLayer::open(&path, cache.clone(), conf.max_value_size)?;
            if layer.summary().lsn_end.0 > durable.0 + 1 {
                // Written, but the metadata update that would acknowledge it was lost.
                drop(layer);
                std::fs::remove_file(&path).map_err(io_err)?;
                continue;
            }
            deltas.push(Arc::new(layer));
        }
        deltas.sort_by_key(|l| (l.summary().lsn_end, l.summary().lsn_start));
        Ok(Timeline {
            tenant_id,
            timeline_id,
            cache_scope: TimelineId::generate(),
            dir: dir.to_owned(),
            cache,
            conf,
            layers: RwLock::new(LayerMap {
                open: None,
                frozen: Vec::new(),
                deltas,
            }),
            write_lock: Mutex::new(()),
            last_record_lsn: AtomicU64::new(durable.0),
            disk_consistent_lsn: AtomicU64::new(durable.0),
        })
    }

    pub fn last_record_lsn(&self) -> Lsn {
        Lsn(self.last_record_lsn.load(Ordering::Acquire))
    }

    pub fn disk_consistent_lsn(&self) -> Lsn {
        Lsn(self.disk_consistent_lsn.load(Ordering::Acquire))
    }

    pub fn layer_counts(&self) -> LayerCounts {
        let map = self.layers.read().unwrap_or_else(|e| e.into_inner());
        LayerCounts {
            open_values: map.open.as_ref().map_or(0, |l| l.len()),
            frozen: map.frozen.len(),
            deltas: map.deltas.len(),
        }
    }

    /// Ingests version `lsn` of `key`. LSNs never go backwards and must be above
    /// `disk_consistent_lsn`; a refused put changes nothing.
    pub fn put(&self, key: Key, lsn: Lsn, value: &Value) -> Result<(), TimelineError> {
        let _writer = self.write_lock.lock().unwrap_or_else(|e| e.into_inner());
        let durable = self.disk_consistent_lsn();
        if lsn <= durable {
            return Err(TimelineError::LsnDurable {
                lsn,
                disk_consistent: durable,
            });
        }
        let mut map = self.layers.write().unwrap_or_else(|e| e.into_inner());
        if map.open.is_none() {
            // The open layer starts where the newest frozen or flushed one ended.
            let start = map
                .frozen
                .last()
                .and_then(|l| l.end_lsn())
                .unwrap_or(Lsn(durable.0 + 1));
            map.open = Some(
                InMemoryLayer::create(
                    &self.dir,
                    self.cache.clone(),
                    start,
                    self.conf.max_value_size,
                )
                .map_err(|source| TimelineError::Io {
                    path: self.dir.clone(),
                    source,
                })?,
            );
        }
        let open = map.open.as_mut().expect("created above");
        open.put(key, lsn, value)?;
        self.last_record_lsn.fetch_max(lsn.0, Ordering::AcqRel);
        Ok(())
    }

    /// Page `key` as of `lsn`; `None` if it has no version at or below `lsn`.
    pub fn get_page(&self, key: Key, lsn: Lsn) -> Result<Option<Bytes>, TimelineError> {
        let last_record = self.last_record_lsn();
        if lsn > last_record {
            return Err(TimelineError::LsnNotYetIngested { lsn, last_record });
        }
        let mat_key = MaterializedPageKey {
            tenant_id: self.tenant_id,
            timeline_id: self.cache_scope,
            key,
        };
        let cached = self.cache.lookup_materialized(&mat_key, lsn);
        // Versions at or below the cached one are already in it.
        let floor = cached.as_ref().map(|(l, _)| *l);

        let mut records: Vec<(Lsn, Value)> = Vec::new();
        let mut complete = false;
        {
            let map = self.layers.read().unwrap_or_else(|e| e.into_inner());
            let mut take = |layer_records: LayerRecords| -> bool {
                for (version, value) in layer_records.records {
                    if floor.is_some_and(|f| version <= f) {
                        return true;
                    }
                    records.push((version, value));
                }
                layer_records.complete
            };
            if let Some(open) = &map.open {
                complete = take(open.get(key, lsn)?);
            }
            for frozen in map.frozen.iter().rev() {
                if complete {
                    break;
                }
                complete = take(frozen.get(key, lsn)?);
            }
            for delta in map.deltas.iter().rev() {
                if complete {
                    break;
                }
                if delta.summary().lsn_start > lsn {
                    continue;
                }
                complete = take(delta.get(key, lsn)?);
            }
        }
        if let Some((cached_lsn, lease)) = &cached {
            if records.is_empty() {
                return Ok(Some(Bytes::copy_from_slice(&lease[..])));
            }
            records.push((
                *cached_lsn,
                Value::Image(Bytes::copy_from_slice(&lease[..])),
            ));
        }
        drop(cached);
        let newest = records.first().map(|(l, _)| *l);
        let page = reconstruct_page(&records, self.conf.max_value_size)
            .map_err(|source| TimelineError::Redo { key, lsn, source })?;
        if let (Some(page), Some(newest)) = (&page, newest) {
            // The page is the same for every LSN from its newest version up to `lsn`.
            if records.len() > 1 {
                if let Ok(full) = <&[u8; PAGE_SZ]>::try_from(&page[..]) {
                    // Best effort: a full cache just means no memorized copy.
                    let _ = self.cache.memorize_materialized(&mat_key, newest, full);
                }
            }
        }
        Ok(page)
    }

    /// Freezes the open layer and writes every frozen layer to a delta layer file, advancing
    /// `disk_consistent_lsn` after each. Returns when all of it is durable.
    pub fn checkpoint(&self) -> Result<(), TimelineError> {
        let _writer = self.write_lock.lock().unwrap_or_else(|e| e.into_inner());
        {
            let mut map = self.layers.write().unwrap_or_else(|e| e.into_inner());
            // An open layer with nothing in it is just dropped: there is nothing to flush.
            if let Some(mut open) = map.open.take().filter(|l| !l.is_empty()) {
                open.freeze(Lsn(self.last_record_lsn().0 + 1))?;
                map.frozen.push(Arc::new(open));
            }
        }
        loop {
            let oldest = {
                let map = self.layers.read().unwrap_or_else(|e| e.into_inner());
                map.frozen.first().cloned()
            };
            let Some(frozen) = oldest else {
                return Ok(());
            };
            let end = frozen.end_lsn().expect("frozen layers have an end");
            let written = frozen.write_to_disk(&self.dir, self.tenant_id, self.timeline_id)?;
            let delta = match written {
                Some((path, _)) => Some(Arc::new(DeltaLayer::open(
                    &path,
                    self.cache.clone(),
                    self.conf.max_value_size,
                )?)),
                None => None,
            };
            let durable = Lsn(end.0 - 1);
            TimelineMetadata {
                disk_consistent_lsn: durable,
            }
            .store(&self.dir)?;
            let mut map = self.layers.write().unwrap_or_else(|e| e.into_inner());
            map.frozen.remove(0);
            if let Some(delta) = delta {
                map.deltas.push(delta);
            }
            self.disk_consistent_lsn.store(durable.0, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests;
