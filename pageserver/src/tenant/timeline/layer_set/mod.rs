//! The timeline's set of layer files: the durable manifest that lists them (`manifest`) and
//! the layer map that readers walk (`map`).

pub mod manifest;
pub mod map;
