//! A layer file whose local copy comes and goes: the local disk as a cache of remote storage.
//!
//! An [`OnDemandLayer`] is known by its name (its key and LSN ranges) and its manifest entry
//! (size, CRC-32C) whether or not its file is on the local disk, so a read walks past it by
//! its ranges without touching anything. The first read that needs its versions while it is
//! not resident downloads it through the timeline's [`LayerDownloader`], checked against the
//! listed size and checksum before it is renamed into place and opened; concurrent readers of
//! the layer wait for that one download instead of starting their own.
//!
//! Eviction ([`OnDemandLayer::evict`]) drops the resident copy: readers that still hold it go
//! on reading it, and the last of them removes the file (only if the file at that path is
//! still that copy, not one downloaded again since: see `layer_file::replace_lock`).
//!
//! ```text
//!   Evicted ──first read: download, verify, rename, open──▶ Resident
//!      ▲                                                      │
//!      └──────────── evict (the file goes with its last reader)┘
//! ```

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Instant;

use utils::{Lsn, TenantId, TimelineId};

use super::delta_layer::DeltaLayer;
use super::image_layer::ImageLayer;
use super::{Layer, LayerName, LayerReadError};
use crate::io::cached_only::PendingDownload;
use crate::io::crashsafe::TEMP_SUFFIX;
use crate::page_cache::PageCache;

/// Fetches layer files from remote storage (the timeline's remote client).
pub trait LayerDownloader: Send + Sync {
    /// Writes layer file `name` to `dest` (a temporary path the caller renames into place),
    /// fsynced, after checking that it is `size` bytes with CRC-32C `crc32c`.
    fn download(&self, name: &str, dest: &Path, size: u64, crc32c: u32) -> Result<(), String>;
}

/// Milliseconds since the first use, for "least recently read" (a process-wide clock).
fn now_ms() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// What an on-demand layer needs to open its file as the layer its name says.
#[derive(Clone)]
pub struct OpenSettings {
    pub tenant_id: TenantId,
    pub timeline_id: TimelineId,
    pub cache: Arc<PageCache>,
    pub max_value_size: usize,
    pub downloader: Arc<dyn LayerDownloader>,
}

/// See the module documentation.
pub struct OnDemandLayer {
    file_name: String,
    name: LayerName,
    size: u64,
    crc32c: u32,
    path: PathBuf,
    settings: OpenSettings,
    /// The opened local copy. Replaced only under `download`.
    resident: RwLock<Option<Layer>>,
    /// Held across a download (and by eviction and retirement): readers of an absent layer
    /// wait for one download.
    download: Mutex<()>,
    last_read_ms: AtomicU64,
    /// Set by [`OnDemandLayer::retire`]: a copy downloaded later (by a reader of an older
    /// snapshot) goes with its last reader too.
    retired: std::sync::atomic::AtomicBool,
}

impl OnDemandLayer {
    /// A layer of `dir` listed as `file_name`, `size` bytes with CRC-32C `crc32c`; `resident`
    /// is its opened local copy, if there is one.
    pub fn new(
        dir: &Path,
        file_name: &str,
        size: u64,
        crc32c: u32,
        settings: OpenSettings,
        resident: Option<Layer>,
    ) -> Result<OnDemandLayer, LayerReadError> {
        let name = file_name
            .parse::<LayerName>()
            .map_err(|e| LayerReadError::Download {
                name: file_name.to_owned(),
                reason: e.to_string(),
            })?;
        Ok(OnDemandLayer {
            file_name: file_name.to_owned(),
            name,
            size,
            crc32c,
            path: dir.join(file_name),
            settings,
            resident: RwLock::new(resident),
            download: Mutex::new(()),
            last_read_ms: AtomicU64::new(now_ms()),
            retired: std::sync::atomic::AtomicBool::new(false),
        })
    }

    pub fn file_name(&self) -> &str {
        &self.file_name
    }

    pub fn layer_name(&self) -> &LayerName {
        &self.name
    }

    /// The listed size of the file.
    pub fn file_size(&self) -> u64 {
        self.size
    }

    pub fn crc32c(&self) -> u32 {
        self.crc32c
    }

    pub fn is_image(&self) -> bool {
        matches!(self.name, LayerName::Image(_))
    }

    pub fn lsn_range(&self) -> std::ops::Range<Lsn> {
        self.name.lsn_range()
    }

    pub fn key_range(&self) -> std::ops::Range<pageserver_api::Key> {
        self.name.key_range().clone()
    }

    /// When a read last needed its versions (milliseconds on a process-wide clock).
    pub fn last_read_ms(&self) -> u64 {
        self.last_read_ms.load(Ordering::Relaxed)
    }

    fn current(&self) -> Option<Layer> {
        self.resident
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn set(&self, layer: Option<Layer>) -> Option<Layer> {
        let mut slot = self.resident.write().unwrap_or_else(|e| e.into_inner());
        std::mem::replace(&mut *slot, layer)
    }

    fn downloading(&self) -> MutexGuard<'_, ()> {
        self.download.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether its file is on the local disk now. Never waits for a download.
    pub fn is_resident(&self) -> bool {
        self.current().is_some()
    }

    /// The opened local copy if it is resident now, without downloading or counting a read.
    pub fn loaded(&self) -> Option<Layer> {
        self.current()
    }

    /// The opened local copy, downloaded first if it is not resident. A resident layer costs
    /// a read lock and an `Arc` clone: reads of one layer never queue behind each other. A read
    /// that may not wait for a download (see [`crate::io::cached_only`]) gets an error instead,
    /// and hands back the download as a [`PendingDownload`].
    pub fn resident(self: &Arc<Self>) -> Result<Layer, LayerReadError> {
        let now = now_ms();
        // Only a clock that moved is written: the line stays shared between readers' cores.
        if self.last_read_ms.load(Ordering::Relaxed) != now {
            self.last_read_ms.store(now, Ordering::Relaxed);
        }
        if let Some(layer) = self.current() {
            return Ok(layer);
        }
        let pending = || Arc::new(ResidentLayer(self.clone())) as Arc<dyn PendingDownload>;
        if let Some(refused) = crate::io::cached_only::refuse_download(pending) {
            return Err(LayerReadError::Download {
                name: self.file_name.clone(),
                reason: refused.to_string(),
            });
        }
        let _downloading = self.downloading();
        // Another reader may have downloaded it while this one waited.
        if let Some(layer) = self.current() {
            return Ok(layer);
        }
        crate::io::read_cost::downloaded();
        let layer = self.download_and_open()?;
        if self.retired.load(Ordering::Acquire) {
            layer.retire();
        }
        self.set(Some(layer.clone()));
        Ok(layer)
    }

    /// Makes it resident, as a read would (a prefetch); `Ok(true)` if it downloaded.
    pub fn prefetch(&self) -> Result<bool, LayerReadError> {
        let _downloading = self.downloading();
        if self.current().is_some() || self.retired.load(Ordering::Acquire) {
            return Ok(false);
        }
        self.set(Some(self.download_and_open()?));
        Ok(true)
    }

    /// Drops the local copy (see the module documentation); `false` if it was not resident,
    /// or it is being downloaded right now.
    pub fn evict(&self) -> bool {
        let Ok(_downloading) = self.download.try_lock() else {
            return false;
        };
        match self.set(None) {
            Some(layer) => {
                layer.retire();
                true
            }
            None => false,
        }
    }

    /// The layer is gone from the timeline (compacted or collected): its local copy, if any,
    /// goes with its last reader, and so does one a reader downloads later.
    pub fn retire(&self) {
        let _downloading = self.downloading();
        self.retired.store(true, Ordering::Release);
        if let Some(layer) = self.current() {
            layer.retire();
        }
    }

    fn download_and_open(&self) -> Result<Layer, LayerReadError> {
        fail::fail_point!("on-demand-download", |_| Err(LayerReadError::Download {
            name: self.file_name.clone(),
            reason: "failpoint on-demand-download".to_owned(),
        }));
        let failed = |reason: String| LayerReadError::Download {
            name: self.file_name.clone(),
            reason,
        };
        let temp = self
            .path
            .with_file_name(format!("{}.download{TEMP_SUFFIX}", self.file_name));
        let started = Instant::now();
        self.settings
            .downloader
            .download(&self.file_name, &temp, self.size, self.crc32c)
            .map_err(failed)?;
        // Only the rename under the lock (see `replace_lock`): the directory's fsync would
        // hold every removal of a retired file, of any timeline, behind this one.
        let replacing = super::layer_file::replace_lock();
        crate::io::crashsafe::rename_durably_holding(&temp, &self.path, replacing)
            .map_err(|e| failed(format!("renaming the download into place: {e}")))?;
        let s = &self.settings;
        let layer = if self.is_image() {
            let image = ImageLayer::open(&self.path, s.cache.clone(), s.max_value_size)?;
            image.check_identity(s.tenant_id, s.timeline_id)?;
            Layer::Image(Arc::new(image))
        } else {
            let delta = DeltaLayer::open(&self.path, s.cache.clone(), s.max_value_size)?;
            delta.check_identity(s.tenant_id, s.timeline_id)?;
            Layer::Delta(Arc::new(delta))
        };
        tracing::info!(
            tenant = %s.tenant_id,
            timeline = %s.timeline_id,
            layer = %self.file_name,
            bytes = self.size,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "downloaded a layer file on demand"
        );
        Ok(layer)
    }
}

/// A download a read handed back (see [`OnDemandLayer::resident`]): makes the layer resident
/// as a prefetch does.
struct ResidentLayer(Arc<OnDemandLayer>);

impl PendingDownload for ResidentLayer {
    fn path(&self) -> &Path {
        &self.0.path
    }

    fn name(&self) -> String {
        self.0.file_name.clone()
    }

    fn tenant_id(&self) -> TenantId {
        self.0.settings.tenant_id
    }

    fn download(&self) -> Result<(), String> {
        match self.0.prefetch() {
            Ok(_) => Ok(()),
            // The caller names the layer and says it was a download.
            Err(LayerReadError::Download { reason, .. }) => Err(reason),
            Err(e) => Err(e.to_string()),
        }
    }
}
