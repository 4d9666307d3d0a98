//! The background loops that drive timelines: [`flush`] writes frozen layers to disk.

pub mod flush;
