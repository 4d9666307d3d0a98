//! Remote storage: the object store that holds a pageserver's layer files and indexes.
//!
//! A small interface of our own ([`RemoteStorage`]) over the `object_store` crate, with two
//! backends picked by [`RemoteStorageConfig`]:
//!
//! - a **local directory** (`LocalFs`): every object a file under the directory, written to a
//!   staging name, fsynced, and renamed (or hard-linked, for a conditional create) into place,
//!   with the directory fsynced, so an object is whole or absent after a crash; with
//!   `hard_links`, the upload of a file its caller declares immutable links the file itself
//!   into place (`local_link.rs`);
//! - an **S3 bucket** (`S3`): any S3 API endpoint (AWS, or a local server with plain HTTP),
//!   path-style requests, region, endpoint and credentials by AWS's conventions, and never a
//!   request to the EC2 instance metadata service unless the settings ask for it (`s3.rs`).
//!
//! # Operations
//!
//! | operation | what it does | an absent object |
//! |---|---|---|
//! | [`put`](RemoteStorage::put), [`upload`](RemoteStorage::upload), [`put_file`](RemoteStorage::put_file) | writes a whole object (a file in parts of 8 MiB to S3 or 1 MiB to a directory, never whole in memory; with the file's expected length and CRC-32C, never other bytes) | created |
//! | [`create_if_absent`](RemoteStorage::create_if_absent) | writes only if no object has the key | created; otherwise `Ok(false)` and nothing changes |
//! | [`get`](RemoteStorage::get), [`get_range`](RemoteStorage::get_range) | reads an object or a byte range of it | [`RemoteError::NotFound`] |
//! | [`download`](RemoteStorage::download), [`download_to_file`](RemoteStorage::download_to_file) | streams an object into a local file, fsynced | [`RemoteError::NotFound`] |
//! | [`list`](RemoteStorage::list) | every object under a key prefix, with sizes | none listed |
//! | [`delete`](RemoteStorage::delete) | removes an object | `Ok` (deletion is idempotent) |
//!
//! The operations on whole objects are here; `transfer.rs` streams files up and down through
//! the caller's [`LocalFile`] (`local_file.rs`, the seam where a test injects local faults),
//! `retry.rs` decides what is retried and for how long, `s3.rs` builds the S3 client.
//!
//! Keys are [`RemotePath`]s: relative, `/`-separated, printable ASCII, never climbing out of
//! the configured root or prefix.
//!
//! # Deadlines, retries and faults
//!
//! Every request to S3 has deadlines ([`Deadlines`]: `remote_storage_connect_timeout` to
//! connect, `remote_storage_request_timeout` from its start to the last byte of its answer),
//! and no request moves more than one part of an object (uploads and downloads go in parts of
//! [`PART_SIZE`]), so one deadline fits every request. A request that failed in a way another
//! attempt may change is retried with backoff, in one loop (`retry.rs`), until it succeeds, fails
//! for good (not found, access denied, no such bucket, bad credentials: each its own
//! [`RemoteError`]), or `remote_storage_operation_timeout` passes: then the caller has its
//! error, also when the store stopped answering mid-request. Every failed attempt is logged
//! with its operation and key. A caller that must not give up (the pageserver's upload queue)
//! tries again itself, later.
//!
//! With `test_remote_failures = N` ([`RemoteStorage::with_injected_failures`]) every operation
//! on a key fails its first N attempts before it reaches the backend, and the count starts
//! again after a success: tests see every retry path without a flaky network.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use object_store::local::LocalFileSystem;
use object_store::multipart::MultipartStore;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

mod config;
mod faults;
mod local_file;
mod local_link;
mod retry;
mod s3;
mod transfer;

pub use config::{RemoteStorageConfig, S3Config};
use faults::FaultInjection;
pub use local_file::{Inode, LocalFile, StdFile};
use local_link::LinkingDir;
pub use retry::RetryPolicy;
use retry::{classify, AttemptError};

/// Objects up to this size are written to S3 in one request; larger ones in parts of this size
/// (S3's multipart minimum is 5 MiB).
pub const PART_SIZE: usize = 8 << 20;
/// The same for a local directory, where a part is only a write: small parts keep an upload's
/// buffers small.
pub const LOCAL_PART_SIZE: usize = 1 << 20;
/// Parts of one object in flight at once over the network: they hide the round trips. Each
/// holds a part in memory, so an upload holds up to `(parts in flight + 2) × part size` (the
/// parts in flight, the one being gathered, and the read buffer): 48 MiB.
const PARTS_IN_FLIGHT: usize = 4;
/// Parts of one object in flight at once into a local directory: a part is a write into the
/// page cache, with no round trip to hide, so one is enough and the upload holds 3 MiB.
const LOCAL_PARTS_IN_FLIGHT: usize = 1;

/// Objects worth writing at once over the network (what a caller uploading many may run in
/// parallel): each hides the others' round trips.
const OBJECTS_IN_FLIGHT: usize = 4;
/// Objects worth writing at once into a local directory: the writes share one disk and have no
/// round trip to hide, while each holds its buffers (3 MiB).
const LOCAL_OBJECTS_IN_FLIGHT: usize = 1;

/// A key in the remote store, relative to its root (the directory, or the bucket's prefix).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RemotePath(String);

impl RemotePath {
    /// Checks `key`: non-empty `/`-separated segments of printable ASCII, none `.` or `..`.
    pub fn new(key: impl Into<String>) -> Result<RemotePath, RemoteError> {
        let key = key.into();
        let bad = |reason: &str| RemoteError::BadKey {
            key: key.clone(),
            reason: reason.to_owned(),
        };
        if key.is_empty() || key.len() > 1024 {
            return Err(bad("a key is 1 to 1024 bytes"));
        }
        if !key.bytes().all(|b| b.is_ascii_graphic() && b != b'\\') {
            return Err(bad("a key is printable ASCII without backslashes"));
        }
        if key
            .split('/')
            .any(|segment| segment.is_empty() || segment == "." || segment == "..")
        {
            return Err(bad("empty, `.` and `..` segments are not allowed"));
        }
        Ok(RemotePath(key))
    }

    /// `self/name`.
    pub fn join(&self, name: &str) -> Result<RemotePath, RemoteError> {
        RemotePath::new(format!("{}/{name}", self.0))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The last segment.
    pub fn file_name(&self) -> &str {
        self.0.rsplit('/').next().unwrap_or(&self.0)
    }
}

impl fmt::Display for RemotePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for RemotePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// What an upload sent or a download wrote: its length and CRC-32C, computed as it streamed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transferred {
    pub len: u64,
    pub crc32c: u32,
}

/// One object a listing found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedObject {
    pub key: RemotePath,
    pub size: u64,
}

/// How long the store may take; see the module documentation and docs/remote-storage.md.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadlines {
    /// Connecting to the store: TCP, and TLS for https.
    pub connect: Duration,
    /// One request, from its start to the last byte of its answer (at most a part).
    pub request: Duration,
    /// One operation, or one part of a transfer, with all its retries.
    pub operation: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            connect: Duration::from_secs(5),
            request: Duration::from_secs(30),
            operation: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("remote object {key} not found")]
    NotFound { key: String },
    #[error("remote key {key:?} is not valid: {reason}")]
    BadKey { key: String, reason: String },
    #[error("remote storage settings: {0}")]
    Config(String),
    #[error("no S3 credentials: {0}")]
    NoCredentials(String),
    #[error("{op}: the bucket does not exist: {store} (NoSuchBucket)")]
    NoSuchBucket { op: &'static str, store: String },
    #[error("{op} of remote object {key}: access denied by {store}: the credentials lack the permission ({reason})")]
    AccessDenied {
        op: &'static str,
        key: String,
        store: String,
        reason: String,
    },
    #[error("{op} of remote object {key}: {store} does not accept the credentials ({reason})")]
    Unauthenticated {
        op: &'static str,
        key: String,
        store: String,
        reason: String,
    },
    #[error("{op} of remote object {key} was refused, and retrying cannot change that: {reason}")]
    Rejected {
        op: &'static str,
        key: String,
        reason: String,
    },
    #[error(
        "{op} of remote object {key} failed after {attempts} attempts in {elapsed:?}: {reason}"
    )]
    Failed {
        op: &'static str,
        key: String,
        attempts: u32,
        elapsed: Duration,
        reason: String,
    },
    #[error("{op} of remote object {key}: local file {}: {source}", path.display())]
    LocalIo {
        op: &'static str,
        key: String,
        path: PathBuf,
        source: std::io::Error,
    },
}

impl RemoteError {
    /// Whether only a change of the settings, the credentials or the store can end it: an
    /// operator's matter, never solved by waiting.
    pub fn needs_operator(&self) -> bool {
        matches!(
            self,
            RemoteError::Config(_)
                | RemoteError::NoCredentials(_)
                | RemoteError::NoSuchBucket { .. }
                | RemoteError::AccessDenied { .. }
                | RemoteError::Unauthenticated { .. }
                | RemoteError::Rejected { .. }
        )
    }
}

/// See the module documentation.
#[derive(Clone)]
pub struct RemoteStorage {
    store: Arc<dyn ObjectStore>,
    /// The same store's parts API, where parts go over the network (S3): each part is then
    /// retried on its own. `None` for a directory.
    multipart: Option<Arc<dyn MultipartStore>>,
    /// Whether the operation deadline cuts off an attempt in flight (S3; see `retry.rs`).
    hard_deadline: bool,
    /// Prepended to every key (the S3 prefix); empty for a directory.
    prefix: String,
    retry: RetryPolicy,
    faults: Option<Arc<FaultInjection>>,
    description: String,
    /// [`PARTS_IN_FLIGHT`] or [`LOCAL_PARTS_IN_FLIGHT`].
    parts_in_flight: usize,
    /// [`PART_SIZE`] or [`LOCAL_PART_SIZE`].
    part_size: usize,
    /// [`OBJECTS_IN_FLIGHT`] or [`LOCAL_OBJECTS_IN_FLIGHT`].
    objects_in_flight: usize,
    /// A local directory with `hard_links`: where immutable files are uploaded by link.
    linking: Option<Arc<LinkingDir>>,
}

impl fmt::Debug for RemoteStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.description)
    }
}

impl RemoteStorage {
    /// Opens the backend `config` names with the default [`Deadlines`].
    pub fn new(config: &RemoteStorageConfig) -> Result<RemoteStorage, RemoteError> {
        RemoteStorage::open(config, Deadlines::default())
    }

    /// Opens the backend `config` names. A local directory is created if missing; nothing is
    /// sent to S3 yet ([`RemoteStorage::check`] does).
    pub fn open(
        config: &RemoteStorageConfig,
        deadlines: Deadlines,
    ) -> Result<RemoteStorage, RemoteError> {
        let (parts_in_flight, part_size, objects_in_flight) = match config {
            RemoteStorageConfig::LocalFs { .. } => (
                LOCAL_PARTS_IN_FLIGHT,
                LOCAL_PART_SIZE,
                LOCAL_OBJECTS_IN_FLIGHT,
            ),
            RemoteStorageConfig::S3(_) => (PARTS_IN_FLIGHT, PART_SIZE, OBJECTS_IN_FLIGHT),
        };
        let mut linking = None;
        let (store, multipart, prefix, description) = match config {
            RemoteStorageConfig::LocalFs {
                local_path,
                hard_links,
            } => {
                std::fs::create_dir_all(local_path).map_err(|e| {
                    RemoteError::Config(format!(
                        "cannot create remote storage directory {}: {e}",
                        local_path.display()
                    ))
                })?;
                let store = LocalFileSystem::new_with_prefix(local_path)
                    .map_err(|e| {
                        RemoteError::Config(format!(
                            "remote storage directory {}: {e}",
                            local_path.display()
                        ))
                    })?
                    .with_fsync(true);
                let store = Arc::new(store);
                if *hard_links {
                    linking = Some(Arc::new(LinkingDir::new(store.clone(), local_path.clone())));
                }
                (
                    store as Arc<dyn ObjectStore>,
                    None,
                    String::new(),
                    format!("local directory {}", local_path.display()),
                )
            }
            RemoteStorageConfig::S3(s3) => {
                let opened = s3::open(s3, &deadlines, &s3::Environment::of_process())?;
                let store = Arc::new(opened.store);
                (
                    store.clone() as Arc<dyn ObjectStore>,
                    Some(store as Arc<dyn MultipartStore>),
                    opened.prefix,
                    opened.description,
                )
            }
        };
        Ok(RemoteStorage {
            store,
            hard_deadline: multipart.is_some(),
            multipart,
            prefix,
            retry: RetryPolicy {
                timeout: deadlines.operation,
                ..RetryPolicy::default()
            },
            faults: None,
            description,
            parts_in_flight,
            part_size,
            objects_in_flight,
            linking,
        })
    }

    /// How many objects a caller with many to upload should write at once: several over the
    /// network, one into a local directory.
    pub fn objects_in_flight(&self) -> usize {
        self.objects_in_flight
    }

    /// Makes every operation on a key fail its first `tries` attempts (`test_remote_failures`).
    pub fn with_injected_failures(mut self, tries: u32) -> RemoteStorage {
        self.faults = (tries > 0).then(|| Arc::new(FaultInjection::new(tries)));
        self
    }

    pub fn with_retry_policy(mut self, retry: RetryPolicy) -> RemoteStorage {
        self.retry = retry;
        self
    }

    fn location(&self, key: &RemotePath) -> Result<ObjectPath, RemoteError> {
        let full = if self.prefix.is_empty() {
            key.0.clone()
        } else {
            format!("{}/{}", self.prefix, key.0)
        };
        ObjectPath::parse(&full).map_err(|e| RemoteError::BadKey {
            key: key.to_string(),
            reason: e.to_string(),
        })
    }

    /// Writes `bytes` as the object `key`, replacing any.
    pub async fn put(&self, key: &RemotePath, bytes: Bytes) -> Result<(), RemoteError> {
        let location = self.location(key)?;
        self.retrying("put", key, || async {
            self.store
                .put(&location, PutPayload::from_bytes(bytes.clone()))
                .await
                .map_err(|e| classify(self.context("put", key), e))?;
            Ok(())
        })
        .await
    }

    /// Writes `bytes` as the object `key` unless an object of that key exists: `Ok(true)` if
    /// this call created it, `Ok(false)` if one was there. An attempt whose answer was lost
    /// after it created the object makes the retry see `false`: compare the contents when it
    /// matters.
    pub async fn create_if_absent(
        &self,
        key: &RemotePath,
        bytes: Bytes,
    ) -> Result<bool, RemoteError> {
        let location = self.location(key)?;
        self.retrying("create", key, || async {
            let options = PutOptions::from(PutMode::Create);
            match self
                .store
                .put_opts(&location, PutPayload::from_bytes(bytes.clone()), options)
                .await
            {
                Ok(_) => Ok(true),
                Err(object_store::Error::AlreadyExists { .. })
                | Err(object_store::Error::Precondition { .. }) => Ok(false),
                Err(e) => Err(classify(self.context("create", key), e)),
            }
        })
        .await
    }

    /// The whole object `key`.
    pub async fn get(&self, key: &RemotePath) -> Result<Bytes, RemoteError> {
        let location = self.location(key)?;
        self.retrying("get", key, || async {
            let result = self
                .store
                .get(&location)
                .await
                .map_err(|e| classify(self.context("get", key), e))?;
            result
                .bytes()
                .await
                .map_err(|e| classify(self.context("get", key), e))
        })
        .await
    }

    /// Bytes `range` of the object `key`. A range past its end is an error.
    pub async fn get_range(
        &self,
        key: &RemotePath,
        range: std::ops::Range<u64>,
    ) -> Result<Bytes, RemoteError> {
        let location = self.location(key)?;
        self.retrying("get_range", key, || async {
            self.store
                .get_range(&location, range.clone())
                .await
                .map_err(|e| classify(self.context("get_range", key), e))
        })
        .await
    }

    /// Every object whose key starts with `prefix/`, in no particular order.
    pub async fn list(&self, prefix: &RemotePath) -> Result<Vec<ListedObject>, RemoteError> {
        let location = self.location(prefix)?;
        let strip = if self.prefix.is_empty() {
            0
        } else {
            self.prefix.len() + 1
        };
        self.retrying("list", prefix, || async {
            let mut stream = self.store.list(Some(&location));
            let mut found = Vec::new();
            while let Some(meta) = stream.next().await {
                let meta = meta.map_err(|e| classify(self.context("list", prefix), e))?;
                let full = meta.location.as_ref();
                let Some(relative) = full.get(strip..) else {
                    continue;
                };
                // Keys we could not have written (someone else's files) are not ours to list.
                if let Ok(key) = RemotePath::new(relative) {
                    found.push(ListedObject {
                        key,
                        size: meta.size,
                    });
                }
            }
            Ok(found)
        })
        .await
    }

    /// Removes the object `key`; an absent one is not an error.
    pub async fn delete(&self, key: &RemotePath) -> Result<(), RemoteError> {
        let location = self.location(key)?;
        self.retrying("delete", key, || async {
            match self.store.delete(&location).await {
                Ok(()) => Ok(()),
                Err(e) => match classify(self.context("delete", key), e) {
                    AttemptError::Final(RemoteError::NotFound { .. }) => Ok(()),
                    other => Err(other),
                },
            }
        })
        .await
    }

    /// Checks that the store answers and takes the credentials: for S3, one listing under the
    /// prefix (the bucket exists, the credentials are valid and may list it), a single attempt
    /// within the request deadline; a directory was checked when it was opened. So a server
    /// with a wrong bucket, no access or no store to reach refuses to start, saying which,
    /// instead of failing every upload later.
    pub async fn check(&self) -> Result<(), RemoteError> {
        if self.multipart.is_none() {
            return Ok(());
        }
        let shown = RemotePath(format!("{}/", self.prefix));
        let prefix = (!self.prefix.is_empty()).then(|| ObjectPath::from(self.prefix.as_str()));
        let started = std::time::Instant::now();
        let listing = tokio::time::timeout(
            self.retry.timeout,
            self.store.list_with_delimiter(prefix.as_ref()),
        )
        .await;
        let reason = match listing {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) => match classify(self.context("list", &shown), e) {
                AttemptError::Final(e) => return Err(e),
                AttemptError::Transient(reason) => reason,
            },
            Err(_) => format!("list: no answer within {:?}", self.retry.timeout),
        };
        Err(RemoteError::Failed {
            op: "list",
            key: shown.to_string(),
            attempts: 1,
            elapsed: started.elapsed(),
            reason: format!("{reason} (is {} reachable?)", self.description),
        })
    }
}

/// Every operation's future can be spawned on a runtime, as the pageserver does; closures
/// over borrowed streams inside them have broken that before (rustc's "Send is not general
/// enough"), which only shows where a caller spawns.
#[cfg(test)]
mod spawnable {
    use super::*;
    #[allow(dead_code)]
    fn every_operation(s: RemoteStorage, k: RemotePath, p: std::path::PathBuf) {
        let (s1, k1) = (s.clone(), k.clone());
        tokio::spawn(async move { s1.get(&k1).await });
        let (s1, k1) = (s.clone(), k.clone());
        tokio::spawn(async move { s1.put(&k1, Bytes::new()).await });
        let (s1, k1) = (s.clone(), k.clone());
        tokio::spawn(async move { s1.list(&k1).await });
        let (s1, k1) = (s.clone(), k.clone());
        tokio::spawn(async move { s1.delete(&k1).await });
        let (s1, k1, p1) = (s.clone(), k.clone(), p.clone());
        tokio::spawn(async move { s1.put_file(&k1, &p1).await });
        let (s1, k1, p1) = (s.clone(), k.clone(), p.clone());
        tokio::spawn(async move { s1.download_to_file(&k1, &p1).await });
        let (s1, k1, p1) = (s.clone(), k.clone(), p.clone());
        tokio::spawn(async move {
            let file: Arc<dyn LocalFile> = Arc::new(StdFile::open(&p1).unwrap());
            s1.upload(&k1, file.clone(), None).await?;
            s1.download(&k1, file).await
        });
    }
}
