//! The formats below layers: 8 KiB blocks read through the page cache ([`block_io`]), or read
//! in place when all of a range is cached ([`cached_range`]),
//! length-prefixed blobs that span blocks ([`blob_io`]), the on-disk B-tree of layer
//! indexes ([`disk_btree`]), and the per-value compression layers may store ([`compression`]).
//! Nothing here knows what a layer, a key's history or a timeline is.

pub mod blob_io;
pub mod block_io;
pub(crate) mod cached_range;
pub mod compression;
pub mod disk_btree;

/// `N` bytes of `bytes` from `off`, for decoding fixed layouts. Panics if they are not all
/// there: callers index only into buffers whose length they have checked.
pub(crate) fn array_at<const N: usize>(bytes: &[u8], off: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&bytes[off..off + N]);
    out
}
