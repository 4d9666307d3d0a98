//! Per-tenant storage: the layers of the format stack, from blocks up.

pub mod blob_io;
pub mod block_io;
pub mod cursor_cache;
pub mod delta_layer;
pub mod disk_btree;
pub mod ephemeral_file;
pub mod flush_loop;
pub mod inmemory_layer;
pub mod metadata;
pub mod mgr;
pub mod read_cost;
pub mod scan;
pub mod storage_layer;
#[cfg(test)]
mod test_support;
pub mod timeline;
