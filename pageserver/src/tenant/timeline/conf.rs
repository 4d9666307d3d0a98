//! What a timeline needs to know of the settings, declared once: the server reads these fields
//! from `pageserver.toml` by these names (`PageServerConf` holds a `TimelineConf`, flattened),
//! and every timeline gets a copy.

use std::time::Duration;

use serde::Deserialize;

use crate::format::compression::Compression;
use utils::units::{duration, size, size_usize};

/// Settings a timeline needs; each is a top-level key of `pageserver.toml`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct TimelineConf {
    /// The largest page image or reconstructed page.
    #[serde(deserialize_with = "size_usize")]
    pub max_value_size: usize,
    /// Freeze the open layer once its ephemeral file holds this many bytes.
    #[serde(deserialize_with = "size")]
    pub checkpoint_distance: u64,
    /// Freeze the open layer once its first version is this old.
    #[serde(deserialize_with = "duration")]
    pub checkpoint_timeout: Duration,
    /// When more frozen layers than this wait for their flush, a put waits until the oldest is
    /// written (writing it itself when no flush runs).
    pub max_frozen_layers: usize,
    /// Reads that may wait for an LSN at once; more are refused.
    pub max_lsn_waiters: usize,
    /// Compaction writes L1 layers of about this many bytes each.
    #[serde(deserialize_with = "size")]
    pub compaction_target_size: u64,
    /// The background loop compacts once the L0 depth (layers, an import's group counted once)
    /// reaches this; 0: never (and no L0 backpressure).
    pub compaction_threshold: usize,
    /// At this L0 depth, each batch waits a little for compaction first.
    pub l0_slowdown_threshold: usize,
    /// At this L0 depth, batches wait until compaction brings the depth below it.
    pub l0_stop_threshold: usize,
    /// A key range gets new images once this many L1 layers stack over a key above its
    /// newest image; 0: never.
    pub image_creation_threshold: usize,
    /// ...or once the L1 bytes above its image reach this percentage of the image's size.
    pub image_creation_delta_percent: u32,
    /// The LSN distance of history GC keeps below the last ingested LSN.
    #[serde(deserialize_with = "size")]
    pub gc_horizon: u64,
    /// GC keeps every LSN of this last stretch of time restorable (snapshots, layers and WAL),
    /// as far as the WAL archive's commit times tell; 0: off.
    #[serde(deserialize_with = "duration")]
    pub pitr_interval: Duration,
    /// How new layer files (delta and image) store their values: `"off"`, `"zstd"` or
    /// `"zstd:<level>"`. Files already written keep theirs; readers take both.
    pub layer_compression: Compression,
}

impl Default for TimelineConf {
    fn default() -> Self {
        TimelineConf {
            max_value_size: pageserver_api::DEFAULT_MAX_VALUE_SIZE,
            checkpoint_distance: 256 * 1024 * 1024,
            checkpoint_timeout: Duration::from_secs(600),
            max_frozen_layers: 2,
            max_lsn_waiters: 1024,
            compaction_target_size: 128 * 1024 * 1024,
            compaction_threshold: 4,
            l0_slowdown_threshold: 8,
            l0_stop_threshold: 12,
            image_creation_threshold: 3,
            image_creation_delta_percent: 100,
            gc_horizon: 64 * 1024 * 1024,
            pitr_interval: Duration::from_secs(7 * 24 * 3600),
            layer_compression: Compression::Zstd {
                level: Compression::DEFAULT_ZSTD_LEVEL,
            },
        }
    }
}
