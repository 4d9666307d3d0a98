//! Per-tenant storage: the layers of the format stack, from blocks up.

pub mod admission;
pub mod mgr;
pub mod remote_timeline_client;
pub mod storage_layer;
pub mod tasks;
#[cfg(test)]
pub(crate) mod test_support;
pub mod timeline;
