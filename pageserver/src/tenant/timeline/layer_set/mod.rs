//! The timeline's set of layer files: the durable manifest that lists them (`manifest`), the
//! layer map that readers walk (`map`), the choices of compaction, image creation and GC over a
//! map (`policy`), and the one commit that changes both (`change`).

pub(super) mod change;
pub mod manifest;
pub mod map;
pub(super) mod policy;
