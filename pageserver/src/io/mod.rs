//! File I/O: every read and write of our files goes through [`virtual_file`] (the fault seam
//! and the descriptor cache), [`crashsafe`] makes a file durable under its final name,
//! [`read_cost`] counts what a request read, [`cached_only`] lets a read refuse to wait
//! for the disk, and [`transfer_file`] is what remote storage uploads from and downloads into.

pub mod cached_only;
pub mod crashsafe;
pub mod read_cost;
pub mod transfer_file;
pub mod virtual_file;
