//! The page server's settings: `<workdir>/pageserver.toml`, then `-c key=value` overrides.
//!
//! Every setting has a default, so an empty file (or none) is a working configuration. A fresh
//! work directory gets [`DEFAULT_CONFIG_TOML`] written into it, with the values of that first
//! start's `-c` overrides in place of the defaults ([`initial_config_file`]), so the file records
//! the settings the directory was set up with. Unknown keys are an error that names them,
//! because a misspelt setting silently ignored is worse than a refusal to start; so is a value
//! out of its range. Sizes are bytes, written as integers or with a unit (`"256MiB"`, `"1TiB"`);
//! durations are written with a unit (`"10m"`, `"500ms"`).

use std::fmt::Display;
use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::time::Duration;

use remote_storage::{Deadlines, RemoteStorageConfig};
use serde::{Deserialize, Deserializer};
use utils::units::{duration, size, size_usize};
pub use utils::units::{format_size, parse_size};

use crate::page_cache::materialized::MAX_VERSIONS_PER_KEY;
use crate::page_cache::PageCacheConfig;
use crate::tenant::timeline::scan::cursor_cache::CursorCacheConfig;
use crate::tenant::timeline::TimelineConf;

pub const CONFIG_FILE: &str = "pageserver.toml";
/// The remote storage directory, in the work directory, when `remote_storage` is not set.
pub const DEFAULT_REMOTE_DIR: &str = "remote";

/// Every setting at its default, with what it means: a fresh work directory's `pageserver.toml`
/// when its first start had no `-c` overrides. Parsing it must give [`PageServerConf::default`]
/// (a test checks).
pub const DEFAULT_CONFIG_TOML: &str = include_str!("config/pageserver.toml");

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub enum AuthType {
    Trust,
    NeonJWT,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Plain,
    Json,
}

/// The default `snapshot_wal_distance`, measured (docs/benchmarks.md, *Restore with background
/// snapshots*): a restore replays pgbench's WAL at about 8 ms per MiB on top of about 3 s at a
/// snapshot, so at 64 MiB a restore at a random LSN took 1.06× and 1.07× a restore at a
/// snapshot (the goal is 1.25×; at 128 MiB 1.19× to 1.56× from run to run, at 512 MiB 1.59×).
/// A snapshot goes on
/// from the last one's kept directory, so it costs about what the WAL changed (4 to 9 s per
/// 64 MiB of `pgbench -s 50` here), not what the cluster holds; raise it where that background
/// work (and, with page ingest, its hold) costs more than restores are worth.
pub const DEFAULT_SNAPSHOT_WAL_DISTANCE: u64 = 64 << 20;

/// See the module documentation.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct PageServerConf {
    pub id: u64,
    pub listen_http_addr: SocketAddr,
    pub listen_grpc_addr: SocketAddr,
    #[serde(deserialize_with = "size")]
    pub page_cache_size: u64,
    pub page_cache_index_percent: u8,
    pub materialized_versions_per_key: usize,
    #[serde(deserialize_with = "duration")]
    pub wait_lsn_timeout: Duration,
    pub max_file_descriptors: usize,
    #[serde(deserialize_with = "size_usize")]
    pub max_request_body_size: usize,
    #[serde(deserialize_with = "duration")]
    pub http_header_read_timeout: Duration,
    #[serde(deserialize_with = "duration")]
    pub http_body_read_timeout: Duration,
    #[serde(deserialize_with = "duration")]
    pub import_body_read_timeout: Duration,
    #[serde(deserialize_with = "duration")]
    pub http_response_write_timeout: Duration,
    #[serde(deserialize_with = "duration")]
    pub grpc_handshake_timeout: Duration,
    #[serde(deserialize_with = "size_usize")]
    pub grpc_answer_bytes_per_stream: usize,
    #[serde(deserialize_with = "size_usize")]
    pub grpc_answer_bytes_per_connection: usize,
    #[serde(deserialize_with = "size_usize")]
    pub max_buffered_request_bytes: usize,
    /// `None`: derived from the open-file limit at startup ([`default_max_connections`]).
    pub max_connections: Option<usize>,
    pub max_concurrent_imports: usize,
    pub max_concurrent_imports_per_tenant: usize,
    pub max_concurrent_basebackups: usize,
    pub max_concurrent_basebackups_per_tenant: usize,
    pub max_concurrent_downloads: usize,
    pub max_concurrent_downloads_per_tenant: usize,
    #[serde(deserialize_with = "size")]
    pub scan_cursor_cache_size: u64,
    #[serde(deserialize_with = "duration")]
    pub scan_cursor_idle_timeout: Duration,
    pub log_format: LogFormat,
    pub http_auth_type: AuthType,
    pub auth_validation_public_key_path: Option<PathBuf>,
    /// `None`: the directory `remote` in the work directory ([`PageServerConf::remote_storage`]).
    pub remote_storage: Option<RemoteStorageConfig>,
    #[serde(deserialize_with = "duration")]
    pub remote_storage_connect_timeout: Duration,
    #[serde(deserialize_with = "duration")]
    pub remote_storage_request_timeout: Duration,
    #[serde(deserialize_with = "duration")]
    pub remote_storage_operation_timeout: Duration,
    #[serde(deserialize_with = "size")]
    pub upload_queue_max_bytes: u64,
    #[serde(deserialize_with = "duration")]
    pub upload_queue_wait_timeout: Duration,
    /// The WAL archive uploads the partial tail of received WAL at least this often.
    #[serde(deserialize_with = "duration")]
    pub wal_upload_interval: Duration,
    /// A WAL receiver whose primary sends nothing for this long connects again.
    #[serde(deserialize_with = "duration")]
    pub wal_receiver_timeout: Duration,
    /// How long a lease taken with `POST .../lsn_lease` lasts.
    #[serde(deserialize_with = "duration")]
    pub lsn_lease_length: Duration,
    /// Background snapshots (`walreceiver::snapshots`): at the primary's checkpoints, at most
    /// this much WAL apart where their pace allows; a receiver's own setting overrides it;
    /// 0 turns them off.
    #[serde(deserialize_with = "size")]
    pub snapshot_wal_distance: u64,
    /// Where the PostgreSQL programs that replay background snapshots are; `None`: the
    /// directory `pg_config --bindir` names, else the one of `postgres` on the `PATH`.
    pub pg_bin_dir: Option<PathBuf>,
    /// The user PostgreSQL runs as when the server runs as root (PostgreSQL refuses root).
    pub pg_user: Option<String>,
    /// Where a background snapshot's PostgreSQL replays (one at a time per server); `None`:
    /// `snapshot_replay` in the work directory (a relative path is under it).
    pub snapshot_replay_dir: Option<PathBuf>,
    #[serde(deserialize_with = "size")]
    pub max_local_layer_bytes: u64,
    pub test_remote_failures: u32,
    /// The settings each timeline gets, read from the top level of the file like the rest.
    #[serde(flatten)]
    pub timeline: TimelineConf,
    /// Keys that are no setting: refused by [`PageServerConf::load`]. (Collected rather than
    /// refused by serde's `deny_unknown_fields`, which cannot see through a flattened field.)
    #[serde(flatten, deserialize_with = "unknown_keys")]
    unknown: Vec<String>,
}

impl Default for PageServerConf {
    fn default() -> Self {
        PageServerConf {
            id: 1,
            listen_http_addr: SocketAddr::from(([127, 0, 0, 1], 9898)),
            listen_grpc_addr: SocketAddr::from(([127, 0, 0, 1], 9899)),
            page_cache_size: 64 << 20,
            page_cache_index_percent: (crate::page_cache::DEFAULT_INDEX_SHARE * 100.0) as u8,
            materialized_versions_per_key: PageCacheConfig::default().materialized_versions_per_key,
            wait_lsn_timeout: Duration::from_secs(60),
            max_file_descriptors: crate::io::virtual_file::DEFAULT_MAX_FILE_DESCRIPTORS,
            max_request_body_size: 64 << 20,
            http_header_read_timeout: Duration::from_secs(10),
            http_body_read_timeout: Duration::from_secs(30),
            import_body_read_timeout: Duration::from_secs(600),
            http_response_write_timeout: Duration::from_secs(30),
            grpc_handshake_timeout: Duration::from_secs(10),
            grpc_answer_bytes_per_stream: 16 << 20,
            grpc_answer_bytes_per_connection: 64 << 20,
            max_buffered_request_bytes: 256 << 20,
            max_connections: None,
            max_concurrent_imports: 4,
            max_concurrent_imports_per_tenant: 2,
            max_concurrent_basebackups: 16,
            max_concurrent_basebackups_per_tenant: 4,
            max_concurrent_downloads: 32,
            max_concurrent_downloads_per_tenant: 8,
            scan_cursor_cache_size: 16 << 20,
            scan_cursor_idle_timeout: Duration::from_secs(60),
            log_format: LogFormat::Plain,
            http_auth_type: AuthType::Trust,
            auth_validation_public_key_path: None,
            remote_storage: None,
            remote_storage_connect_timeout: Deadlines::default().connect,
            remote_storage_request_timeout: Deadlines::default().request,
            remote_storage_operation_timeout: Deadlines::default().operation,
            upload_queue_max_bytes: 512 << 20,
            upload_queue_wait_timeout: Duration::from_secs(30),
            wal_upload_interval: crate::tenant::remote_timeline_client::DEFAULT_WAL_UPLOAD_INTERVAL,
            wal_receiver_timeout: Duration::from_secs(60),
            lsn_lease_length: Duration::from_secs(600),
            snapshot_wal_distance: DEFAULT_SNAPSHOT_WAL_DISTANCE,
            pg_bin_dir: None,
            pg_user: None,
            snapshot_replay_dir: None,
            max_local_layer_bytes: 0,
            test_remote_failures: 0,
            timeline: TimelineConf::default(),
            unknown: Vec::new(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {message}", path.display())]
    File { path: PathBuf, message: String },
    #[error("override `{text}`: {message}")]
    Override { text: String, message: String },
    #[error("settings: {0}")]
    Invalid(String),
}

impl PageServerConf {
    /// The settings for `workdir`: its `pageserver.toml` (if any), then `overrides`, each
    /// `key=value` with a TOML value (a bare word is taken as a string).
    pub fn load(workdir: &Path, overrides: &[String]) -> Result<PageServerConf, ConfigError> {
        let path = workdir.join(CONFIG_FILE);
        let mut table = match std::fs::read_to_string(&path) {
            Ok(text) => text.parse::<toml::Table>().map_err(|e| ConfigError::File {
                path: path.clone(),
                message: e.to_string(),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => toml::Table::new(),
            Err(source) => return Err(ConfigError::Read { path, source }),
        };
        for text in overrides {
            let (key, value) = parse_override(text)?;
            table.insert(key, value);
        }
        let conf = PageServerConf::deserialize(toml::Value::Table(table))
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        conf.validate()?;
        Ok(conf)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |m: String| Err(ConfigError::Invalid(m));
        if !self.unknown.is_empty() {
            let named: Vec<String> = self.unknown.iter().map(|k| format!("`{k}`")).collect();
            return invalid(format!(
                "unknown field {}: no setting has that name (every setting is in {CONFIG_FILE} \
                 with its default)",
                named.join(", unknown field ")
            ));
        }
        if self.http_auth_type == AuthType::NeonJWT
            && self.auth_validation_public_key_path.is_none()
        {
            return invalid(
                "http_auth_type = \"NeonJWT\" needs auth_validation_public_key_path".into(),
            );
        }
        if self.listen_grpc_addr == self.listen_http_addr && self.listen_http_addr.port() != 0 {
            return invalid(format!(
                "listen_grpc_addr and listen_http_addr are both {}: the page service needs an \
                 address of its own",
                self.listen_http_addr
            ));
        }
        if self.timeline.max_value_size < crate::PAGE_SZ {
            return invalid(format!(
                "max_value_size {} is smaller than a page ({} bytes)",
                self.timeline.max_value_size,
                crate::PAGE_SZ
            ));
        }
        if self.timeline.checkpoint_timeout.is_zero() {
            return invalid("checkpoint_timeout must be above zero".into());
        }
        if self.page_cache_index_percent > 100 {
            return invalid(format!(
                "page_cache_index_percent {} is above 100",
                self.page_cache_index_percent
            ));
        }
        let max_fds = crate::io::virtual_file::open_files::MAX_CAPACITY;
        if !(8..=max_fds).contains(&self.max_file_descriptors) {
            return invalid(format!(
                "max_file_descriptors {} is outside 8..={max_fds} (a few files are always open: \
                 layers being written, the manifest, the open layers' ephemeral files)",
                self.max_file_descriptors
            ));
        }
        in_range(
            "materialized_versions_per_key",
            self.materialized_versions_per_key,
            0..=MAX_VERSIONS_PER_KEY,
        )?;
        // Values that would stop the server from doing its work: no ingest body fits, every
        // batch freezes a layer, every ingest flushes, every read ahead of ingest fails at once.
        let sizes = |n: &u64| format_size(*n);
        in_range_shown(
            "max_request_body_size",
            self.max_request_body_size as u64,
            MIN_REQUEST_BODY..=MAX_REQUEST_BODY,
            sizes,
        )?;
        in_range_shown(
            "checkpoint_distance",
            self.timeline.checkpoint_distance,
            MIN_CHECKPOINT_DISTANCE..=MAX_CHECKPOINT_DISTANCE,
            sizes,
        )?;
        in_range(
            "max_frozen_layers",
            self.timeline.max_frozen_layers,
            1..=MAX_FROZEN_LAYERS,
        )?;
        in_range_shown(
            "compaction_target_size",
            self.timeline.compaction_target_size,
            MIN_CHECKPOINT_DISTANCE..=MAX_CHECKPOINT_DISTANCE,
            sizes,
        )?;
        if self.timeline.compaction_threshold != 0 {
            in_range(
                "compaction_threshold",
                self.timeline.compaction_threshold,
                2..=crate::tenant::timeline::MAX_COMPACTION_INPUTS,
            )?;
        }
        in_range(
            "l0_slowdown_threshold",
            self.timeline.l0_slowdown_threshold,
            self.timeline.compaction_threshold..=MAX_L0_THRESHOLD,
        )?;
        in_range(
            "l0_stop_threshold",
            self.timeline.l0_stop_threshold,
            self.timeline.l0_slowdown_threshold..=MAX_L0_THRESHOLD,
        )?;
        if self.timeline.image_creation_threshold != 0 {
            in_range(
                "image_creation_threshold",
                self.timeline.image_creation_threshold,
                1..=MAX_L0_THRESHOLD,
            )?;
        }
        in_range(
            "image_creation_delta_percent",
            self.timeline.image_creation_delta_percent,
            1..=MAX_IMAGE_CREATION_DELTA_PERCENT,
        )?;
        in_range_shown(
            "wait_lsn_timeout",
            self.wait_lsn_timeout,
            MIN_WAIT_LSN_TIMEOUT..=MAX_WAIT_LSN_TIMEOUT,
            |d| humantime::format_duration(*d).to_string(),
        )?;
        if self.scan_cursor_idle_timeout.is_zero() {
            return invalid(
                "scan_cursor_idle_timeout must be above zero (scan_cursor_cache_size = 0 keeps \
                 no cursors)"
                    .into(),
            );
        }
        self.validate_http_limits()?;
        self.validate_remote_deadlines()
    }

    /// The remote storage deadlines: zero would fail every request; an operation shorter than
    /// one request could never finish one.
    fn validate_remote_deadlines(&self) -> Result<(), ConfigError> {
        let show = |d: &Duration| humantime::format_duration(*d).to_string();
        for (name, value) in [
            (
                "remote_storage_connect_timeout",
                self.remote_storage_connect_timeout,
            ),
            (
                "remote_storage_request_timeout",
                self.remote_storage_request_timeout,
            ),
            ("upload_queue_wait_timeout", self.upload_queue_wait_timeout),
            ("wal_upload_interval", self.wal_upload_interval),
            ("wal_receiver_timeout", self.wal_receiver_timeout),
            ("lsn_lease_length", self.lsn_lease_length),
        ] {
            in_range_shown(name, value, MIN_REMOTE_DEADLINE..=MAX_REMOTE_DEADLINE, show)?;
        }
        in_range_shown(
            "remote_storage_operation_timeout",
            self.remote_storage_operation_timeout,
            self.remote_storage_request_timeout..=MAX_REMOTE_DEADLINE,
            show,
        )
    }

    /// The remote storage deadlines as set.
    pub fn remote_deadlines(&self) -> Deadlines {
        Deadlines {
            connect: self.remote_storage_connect_timeout,
            request: self.remote_storage_request_timeout,
            operation: self.remote_storage_operation_timeout,
        }
    }

    /// The checks of the HTTP connection limits: zero would refuse every request or close
    /// every connection at once, so it is refused with the range that makes sense.
    fn validate_http_limits(&self) -> Result<(), ConfigError> {
        let invalid = |m: String| Err(ConfigError::Invalid(m));
        for (name, value) in [
            ("http_header_read_timeout", self.http_header_read_timeout),
            ("http_body_read_timeout", self.http_body_read_timeout),
            ("import_body_read_timeout", self.import_body_read_timeout),
            (
                "http_response_write_timeout",
                self.http_response_write_timeout,
            ),
            ("grpc_handshake_timeout", self.grpc_handshake_timeout),
        ] {
            if value.is_zero() {
                return invalid(format!(
                    "{name} must be above zero (e.g. \"10s\"; every connection would be cut \
                     off at once)"
                ));
            }
        }
        if let Some(n) = self.max_connections {
            if !(1..=MAX_CONNECTIONS_LIMIT).contains(&n) {
                return invalid(format!(
                    "max_connections {n} is out of range: from 1 to {MAX_CONNECTIONS_LIMIT} \
                     (leave it out for what the open-file limit leaves after our files)"
                ));
            }
        }
        // Zero would serve no batch; a stream's budget over its connection's would be the
        // connection's.
        let sizes = |n: &u64| format_size(*n);
        in_range_shown(
            "grpc_answer_bytes_per_stream",
            self.grpc_answer_bytes_per_stream as u64,
            MIN_ANSWER_BYTES..=MAX_ANSWER_BYTES,
            sizes,
        )?;
        in_range_shown(
            "grpc_answer_bytes_per_connection",
            self.grpc_answer_bytes_per_connection as u64,
            self.grpc_answer_bytes_per_stream as u64..=MAX_ANSWER_BYTES,
            sizes,
        )?;
        for (name, value) in [
            ("max_concurrent_imports", self.max_concurrent_imports),
            (
                "max_concurrent_imports_per_tenant",
                self.max_concurrent_imports_per_tenant,
            ),
            (
                "max_concurrent_basebackups",
                self.max_concurrent_basebackups,
            ),
            (
                "max_concurrent_basebackups_per_tenant",
                self.max_concurrent_basebackups_per_tenant,
            ),
            ("max_concurrent_downloads", self.max_concurrent_downloads),
            (
                "max_concurrent_downloads_per_tenant",
                self.max_concurrent_downloads_per_tenant,
            ),
        ] {
            // Each runs on a thread of its own.
            in_range(name, value, 1..=MAX_CONCURRENT_WORK)?;
        }
        if self.max_buffered_request_bytes < self.max_request_body_size {
            return invalid(format!(
                "max_buffered_request_bytes {} is below max_request_body_size {}: a body of \
                 the largest allowed size could never be read",
                self.max_buffered_request_bytes, self.max_request_body_size
            ));
        }
        Ok(())
    }

    /// The bounds on long-running work, for `tenant::admission`.
    pub fn admission_limits(&self) -> crate::tenant::admission::AdmissionLimits {
        crate::tenant::admission::AdmissionLimits {
            imports: (
                self.max_concurrent_imports,
                self.max_concurrent_imports_per_tenant,
            ),
            basebackups: (
                self.max_concurrent_basebackups,
                self.max_concurrent_basebackups_per_tenant,
            ),
            downloads: (
                self.max_concurrent_downloads,
                self.max_concurrent_downloads_per_tenant,
            ),
        }
    }

    /// `max_connections`, or its default for this process's open-file limit.
    pub fn max_connections(&self) -> usize {
        self.max_connections.unwrap_or_else(|| {
            default_max_connections(open_files_limit(), self.max_file_descriptors)
        })
    }

    /// Where layers are uploaded, relative paths resolved against `workdir`.
    pub fn remote_storage(&self, workdir: &Path) -> RemoteStorageConfig {
        match &self.remote_storage {
            None => RemoteStorageConfig::local_dir(workdir.join(DEFAULT_REMOTE_DIR)),
            Some(RemoteStorageConfig::LocalFs {
                local_path,
                hard_links,
            }) => RemoteStorageConfig::LocalFs {
                local_path: workdir.join(local_path),
                hard_links: *hard_links,
            },
            Some(s3) => s3.clone(),
        }
    }

    /// The page cache's settings.
    pub fn page_cache_conf(&self) -> PageCacheConfig {
        PageCacheConfig {
            capacity_bytes: self.page_cache_size,
            index_share: f64::from(self.page_cache_index_percent) / 100.0,
            materialized_versions_per_key: self.materialized_versions_per_key,
            ..PageCacheConfig::default()
        }
    }

    pub fn cursor_cache_conf(&self) -> CursorCacheConfig {
        CursorCacheConfig {
            capacity_bytes: self.scan_cursor_cache_size,
            idle_timeout: self.scan_cursor_idle_timeout,
        }
    }

    pub fn timeline_conf(&self) -> TimelineConf {
        self.timeline.clone()
    }
}

/// The most any `max_concurrent_*` bound may be: each unit of that work has a thread.
const MAX_CONCURRENT_WORK: usize = 1024;

/// The most `max_connections` may be set to: beyond it the descriptors alone would exhaust any
/// usual open-file limit.
pub const MAX_CONNECTIONS_LIMIT: usize = 1 << 20;

/// Descriptors kept for neither files nor connections: the async runtime, the log, the
/// listener, the work directory lock, the blocking pool's occasional directory fsync.
const RESERVED_DESCRIPTORS: u64 = 64;

/// The default connection cap for an open-file limit of `nofile`: what it leaves after our
/// files (at most `max_file_descriptors` are open at once) and [`RESERVED_DESCRIPTORS`], from
/// 16 to 1000. So connections alone never exhaust the descriptors files need; a connection
/// over the cap waits in the listen queue, which costs no descriptor. Without a known limit,
/// 1000.
pub fn default_max_connections(nofile: Option<u64>, max_file_descriptors: usize) -> usize {
    let Some(nofile) = nofile else {
        return 1000;
    };
    let files = u64::try_from(max_file_descriptors).unwrap_or(u64::MAX);
    let left = nofile
        .saturating_sub(files)
        .saturating_sub(RESERVED_DESCRIPTORS);
    usize::try_from(left).unwrap_or(usize::MAX).clamp(16, 1000)
}

/// The soft open-file limit (RLIMIT_NOFILE) of this process, from `/proc/self/limits`; `None`
/// where that is unreadable or says "unlimited".
pub fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    parse_open_files_limit(&limits)
}

fn parse_open_files_limit(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The smallest `max_request_body_size`: one record (31 bytes of header) of an 8 KiB page.
pub const MIN_REQUEST_BODY: u64 = 31 + crate::PAGE_SZ as u64;
/// The largest `max_request_body_size`: a body is held in memory whole.
pub const MAX_REQUEST_BODY: u64 = 4 << 30;
/// `checkpoint_distance` from one page...
/// The most L0 layers `l0_slowdown_threshold` and `l0_stop_threshold` may allow.
pub const MAX_L0_THRESHOLD: usize = 1000;
/// The most `image_creation_delta_percent` may be: 100 times the image's size.
pub const MAX_IMAGE_CREATION_DELTA_PERCENT: u32 = 10_000;
pub const MIN_CHECKPOINT_DISTANCE: u64 = crate::PAGE_SZ as u64;
/// ...to 1 TiB, far beyond any memory the open layer's index could use.
pub const MAX_CHECKPOINT_DISTANCE: u64 = 1 << 40;
pub const MAX_FROZEN_LAYERS: usize = 1000;
pub const MIN_WAIT_LSN_TIMEOUT: Duration = Duration::from_millis(1);
/// The remote storage deadlines and the upload queue's wait: 10 ms to an hour.
pub const MIN_REMOTE_DEADLINE: Duration = Duration::from_millis(10);
pub const MAX_REMOTE_DEADLINE: Duration = Duration::from_secs(3600);
pub const MAX_WAIT_LSN_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// The smallest `grpc_answer_bytes_per_stream`: a page. A stream under its budget takes a
/// batch whatever its size, so any budget serves every batch.
pub const MIN_ANSWER_BYTES: u64 = crate::PAGE_SZ as u64;
/// The largest answer budgets: 16 GiB, beyond which they would bound nothing.
pub const MAX_ANSWER_BYTES: u64 = 16 << 30;

fn in_range<T: PartialOrd + Display>(
    name: &str,
    value: T,
    range: RangeInclusive<T>,
) -> Result<(), ConfigError> {
    in_range_shown(name, value, range, T::to_string)
}

/// Refuses `value` outside `range`, saying what the range is.
fn in_range_shown<T: PartialOrd>(
    name: &str,
    value: T,
    range: RangeInclusive<T>,
    show: impl Fn(&T) -> String,
) -> Result<(), ConfigError> {
    if range.contains(&value) {
        return Ok(());
    }
    Err(ConfigError::Invalid(format!(
        "{name} = {} is out of range: it must be from {} to {}",
        show(&value),
        show(range.start()),
        show(range.end())
    )))
}

/// What a fresh work directory's `pageserver.toml` says: [`DEFAULT_CONFIG_TOML`] with each
/// setting given by an `overrides` entry (`key=value`, as for [`PageServerConf::load`]) set to
/// that value, so that the file records the settings of the first start. Call it with
/// overrides that loaded.
pub fn initial_config_file(overrides: &[String]) -> Result<String, ConfigError> {
    let mut lines: Vec<String> = DEFAULT_CONFIG_TOML.lines().map(str::to_owned).collect();
    for text in overrides {
        let (key, value) = parse_override(text)?;
        let setting = format!("{key} = {value} # set with -c at the first start");
        let is_setting = |line: &String| {
            let line = line.strip_prefix("# ").unwrap_or(line);
            line.strip_prefix(key.as_str())
                .is_some_and(|rest| rest.starts_with(" = "))
        };
        match lines.iter_mut().find(|line| is_setting(line)) {
            Some(line) => *line = setting,
            None => lines.push(setting),
        }
    }
    let mut text = lines.join("\n");
    text.push('\n');
    Ok(text)
}

/// `key=value` as a TOML key and value; a value that is not valid TOML is a string, so
/// `-c listen_http_addr=127.0.0.1:0` works without shell quoting gymnastics.
fn parse_override(text: &str) -> Result<(String, toml::Value), ConfigError> {
    let error = |message: &str| ConfigError::Override {
        text: text.to_owned(),
        message: message.to_owned(),
    };
    let (key, raw) = text
        .split_once('=')
        .ok_or_else(|| error("expected key=value"))?;
    let key = key.trim();
    if key.is_empty() {
        return Err(error("the key is empty"));
    }
    let raw = raw.trim();
    let value = format!("v = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_owned()));
    Ok((key.to_owned(), value))
}

/// The keys of a map, whatever their values: what is left of the file once every setting took
/// its own.
fn unknown_keys<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let rest = std::collections::BTreeMap::<String, serde::de::IgnoredAny>::deserialize(d)?;
    Ok(rest.into_keys().collect())
}

#[cfg(test)]
mod tests;
