//! The page server: ingests LSN-ordered page versions, keeps the newest in ephemeral files,
//! flushes them to immutable layer files, and serves "page K as of LSN L" through one shared,
//! read-only page cache.
//!
//! The modules follow the data's path, lowest floor first; none imports one above it:
//!
//! - [`io`]: every file read and write (the fault seam, the descriptor cache), crash-safe
//!   file creation, and the per-request read accounting;
//! - [`page_cache`]: one cache of immutable 8 KiB pages shared by every reader;
//! - [`format`]: blocks, blobs and the B-tree, which know bytes and nothing of layers;
//! - [`tenant::storage_layer`]: the ephemeral file, the in-memory layer and the layer files;
//! - [`tenant::timeline`]: a timeline's layers, ingest, GetPage@LSN, scans, flushes, the
//!   manifest;
//! - [`tenant::remote_timeline_client`]: the remote copy of each timeline, which follows every
//!   committed manifest into the object store (the upload queue and the remote index), finds
//!   what the store holds on attach, and downloads layer files on demand; the object store
//!   itself (a local directory or S3) is the `remote_storage` crate (`libs/remote_storage`);
//! - [`tenant::tasks`]: the background loops that drive timelines; [`tenant::mgr`]: tenants
//!   and timelines on disk;
//! - [`datadir`]: PostgreSQL data directories in (import of a tar snapshot) and out
//!   (basebackup at an LSN), driving timelines;
//! - [`walreceiver`]: a stock PostgreSQL's WAL streamed in over the replication protocol,
//!   durable in the timeline's WAL files before the primary is told it is flushed;
//! - [`serving`]: what both doors stand on, knowing neither HTTP nor gRPC: the read path, where
//!   a request's storage work runs, the error kinds, auth's rule and the connection cap;
//! - [`http`]: the API, and the `/metrics` page that reads state at scrape time;
//! - [`grpc`]: the page service for compute (batched, pipelined GetPage), beside the API; the
//!   two doors import nothing of each other.

pub mod config;
pub mod datadir;
pub mod failpoints;
pub mod format;
pub mod grpc;
pub mod http;
pub mod io;
pub mod metrics;
pub mod page_cache;
pub mod serving;
pub mod tenant;
pub mod walreceiver;

/// The size of a block of every file we write and of every page in the page cache.
pub const PAGE_SZ: usize = 8192;
