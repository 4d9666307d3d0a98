//! PostgreSQL data directories in and out of a timeline.
//!
//! A timeline stores a data directory in the key space of `pageserver_api::datadir`: relation
//! forks block by block (what GetPage@LSN serves to compute), every other file byte for byte,
//! and metadata values that list them. This module is the Postgres-facing floor above
//! `tenant::timeline`, which it drives and which knows nothing of it:
//!
//! - `path.rs`: which archive members are relation segments, plain files, or refused;
//! - `pg_control.rs`: the control file fields an import checks (identity, clean stop, LSN);
//! - `wal_end.rs`: the end of a backup's WAL, the LSN its state is at;
//! - `import/`: a tar stream into a timeline as one snapshot, storing only what changed,
//!   applied whole or not at all;
//! - `basebackup.rs`: the snapshot at or below an LSN as a tar stream a stock PostgreSQL
//!   starts from (with WAL to replay to the LSN); `materialize.rs`: the pages at the LSN
//!   themselves, with a shutdown checkpoint there of our making, so nothing is replayed;
//!   `checkpoint_start.rs`: a background snapshot's replay started right at it, from a
//!   checkpoint record put before its first record (or, for one made at a primary's
//!   checkpoint, that record rewritten) rather than at a checkpoint's redo point;
//! - `wal_versions.rs`: a decoded WAL record as the versions it makes in that key space (page
//!   images, WAL records to redo, sizes, relation directories), with `wal_slru.rs` for the
//!   non-relation files (`wal_files.rs`: `pg_xact/`, relation maps, database directories;
//!   `wal_multixact.rs`: `pg_multixact/`; `wal_counters.rs`: the transaction id, OID and
//!   multixact counters a checkpoint carries).
//!
//! Limits: only the `pg_default` and `pg_global` tablespaces, regular files and directories (no
//! symlinks: a `pg_wal` elsewhere), permission bits only (setuid, setgid and sticky refused,
//! but setgid on a directory dropped: `import/member.rs`), `pg_control` format 1300
//! (PostgreSQL 13 to 16); a relation's empty trailing segment files (left by a truncation
//! until the next checkpoint) are not reproduced.

mod archive;
mod basebackup;
pub mod checkpoint_start;
mod import;
mod materialize;
mod path;
pub mod pg_control;
pub mod wal_counters;
mod wal_end;
pub mod wal_files;
pub mod wal_multixact;
pub mod wal_versions;

pub use basebackup::{
    snapshot_at, write_basebackup, BasebackupError, Replay, Restore, PROMOTE_TRIGGER_FILE,
};
pub use import::{import_archive, import_replayed, ImportError, ImportReport, PartlyRead};
pub use materialize::{control_file_at, plan as plan_materialized, starts_clean, Materialized};

/// The relation fork whose segment `path` (relative to a data directory) is, if it is one, and
/// the segment's number: an import stores those block by block.
pub fn relation_of_file(path: &str) -> Option<(pageserver_api::datadir::RelTag, u32)> {
    match path::classify(path, true) {
        Ok(path::DatadirPath::Relation { rel, segno }) => Some((rel, segno)),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
