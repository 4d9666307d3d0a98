//! A stock PostgreSQL's WAL, streamed in as a replica's would be.
//!
//! Per timeline, at most one receiver: a thread of its own that holds a physical replication
//! connection to the primary (`connection.rs`, over TLS as `sslmode` asks: `tls.rs`), decodes every byte it receives as it arrives
//! (`postgres_wal`: a stream that does not check is an error, never stored as WAL; records are
//! checked as their bytes pass, none held whole), writes it into the timeline's WAL files
//! (`wal_store.rs`) and reports back, after each batch of messages, what it received (write),
//! what is durable here (flush, after an fsync: a primary whose `synchronous_standby_names`
//! names our application name commits once its commit record is flushed here) and the same as
//! applied.
//!
//! ```text
//!   PUT wal_receiver ─▶ first connection (409/400 if the primary is refused) ─▶ streaming
//!        (a timeline with no snapshot: base_backup, `base_backup.rs`, before streaming)
//!        streaming ──(connection lost)──▶ waiting_retry ──(backoff, 0.1 s to 10 s)──▶ connecting
//!        connecting ──(connected, slot, START_REPLICATION)──▶ streaming
//!        any ──(DELETE, timeline shut down, a refusal no retry can change)──▶ stopped
//! ```
//!
//! The receiver's settings (`wal_receiver.json` in the timeline's directory, mode 0600: the
//! connection string may hold a password) are durable: the server starts the receivers of the
//! timelines it loads. Streaming resumes at the start of the newest stored segment, through
//! the slot, which keeps the primary's WAL from there.
//!
//! What is checked before streaming: the primary's system identifier is the one of the
//! timeline's snapshots (and of the WAL stored before); the timeline must have a snapshot (one
//! without takes a base backup over the connection first); the WAL the timeline holds must be
//! on the primary's line of PostgreSQL timelines (`timelines.rs`, which also follows the
//! switches from one to the next while streaming); the primary must still have the WAL where
//! streaming resumes.
//!
//! Restores read the WAL back through `replay_plan.rs`: the timeline's own, then its
//! ancestors' up to their branch points.
//!
//! With `ingest_pages` in the settings, a second thread (`page_ingest.rs`) turns the stored
//! WAL into the timeline's page versions, reading the files behind the flushed LSN, so the
//! stream never waits for it. The two threads share `state.rs`: the state the API shows, the
//! stop flag, the segment size.
//!
//! With `snapshot_wal_distance` (the receiver's, else the server's), a third thread
//! (`snapshots.rs`) has stock PostgreSQL (`pg_replay.rs`) replay the newest snapshot to the
//! first record boundary that much WAL later, and imports what it shuts down with as a new
//! snapshot there; page ingest waits there meanwhile. `snapshot_scan.rs` decodes the WAL up to
//! there for the counters the snapshot starts with and what it names of the relations' files,
//! of which `snapshot_reads.rs` has the import read only what the replay may have written.

mod base_backup;
pub mod commit_time;
mod connection;
pub mod connstr;
mod page_ingest;
mod pg_replay;
mod receiver;
pub mod replay_plan;
mod replayed_files;
mod snapshot_reads;
mod snapshot_scan;
mod snapshots;
mod state;
#[cfg(test)]
mod tests;
mod timelines;
mod tls;
mod wal_reader;
pub mod wal_store;

pub use receiver::{ReceiverConf, Receivers, SnapshotSettings};
pub use state::{ReceiverState, StateName};

/// What went wrong with a receiver.
#[derive(Debug, thiserror::Error)]
pub enum ReceiverError {
    #[error("cannot reach the primary: {0}")]
    Connect(String),
    #[error("the primary refused the login: {0}")]
    Auth(String),
    #[error("the primary answered {code}: {message}")]
    Server { code: String, message: String },
    #[error("the primary broke the replication protocol: {0}")]
    Protocol(String),
    #[error("the WAL stream does not check: {0}")]
    Wal(#[from] postgres_wal::WalError),
    #[error("{0}")]
    Refused(String),
    #[error("I/O: {0}")]
    Io(std::io::Error),
    #[error("the receiver's settings: {0}")]
    Settings(String),
}

impl ReceiverError {
    pub(crate) fn io(e: std::io::Error) -> ReceiverError {
        ReceiverError::Io(e)
    }

    /// Whether only a change of the primary or of the settings can end it (no retry will).
    pub fn is_permanent(&self) -> bool {
        match self {
            ReceiverError::Auth(_) | ReceiverError::Refused(_) | ReceiverError::Settings(_) => true,
            // invalid_authorization_specification, invalid_password, insufficient_privilege
            // (no REPLICATION right), undefined_object (WAL removed: 58P01 is undefined_file).
            ReceiverError::Server { code, .. } => {
                matches!(code.as_str(), "28000" | "28P01" | "42501" | "58P01")
            }
            _ => false,
        }
    }
}
