//! The timeline's set of layer files: the durable manifest that lists them (`manifest`), the
//! layer map that readers walk (`map`), and the one commit that changes both (`change`).

pub(super) mod change;
pub mod manifest;
pub mod map;
