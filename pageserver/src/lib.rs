//! The page server: ingests LSN-ordered page versions, keeps the newest in ephemeral files,
//! flushes them to immutable layer files, and serves "page K as of LSN L" through one shared,
//! read-only page cache.
//!
//! The modules follow the data's path: [`virtual_file`] (the file I/O seam) → [`tenant::block_io`]
//! (8 KiB blocks and leases on them) → [`tenant::blob_io`] (length-prefixed blobs spanning
//! blocks) → [`tenant::ephemeral_file`] (the append-only file behind the in-memory layer), with
//! [`page_cache`] shared by every reader of immutable blocks.

pub mod config;
pub mod failpoints;
pub mod http;
pub mod metrics;
pub mod page_cache;
pub mod tenant;
pub mod virtual_file;

/// The size of a block of every file we write and of every page in the page cache.
pub const PAGE_SZ: usize = 8192;
