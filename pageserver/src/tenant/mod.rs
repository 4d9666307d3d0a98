//! Per-tenant storage: the layers of the format stack, from blocks up.

pub mod blob_io;
pub mod block_io;
pub mod ephemeral_file;
pub mod inmemory_layer;
