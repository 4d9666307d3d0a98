//! File I/O: every read and write of our files goes through [`virtual_file`] (the fault seam
//! and the descriptor cache), [`crashsafe`] makes a file durable under its final name, and
//! [`read_cost`] counts what a request read, and [`cached_only`] lets a read refuse to wait
//! for the disk.

pub mod cached_only;
pub mod crashsafe;
pub mod read_cost;
pub mod virtual_file;
