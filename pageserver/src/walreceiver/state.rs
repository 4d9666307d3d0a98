//! What a receiver's threads share: the state `GET .../wal_receiver` answers, the stop flag,
//! and what the stream learned that page ingest needs (the segment size). The streaming thread
//! (`receiver.rs`) writes it, page ingest (`page_ingest.rs`) reads it and adds its own part, and
//! the HTTP handlers read a copy.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use serde::Serialize;
use utils::Lsn;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StateName {
    Connecting,
    /// Taking a base backup of the primary into a timeline that had no snapshot.
    BaseBackup,
    Streaming,
    WaitingRetry,
    Stopped,
}

/// What `GET .../wal_receiver` answers.
#[derive(Clone, Debug, Serialize)]
pub struct ReceiverState {
    pub state: StateName,
    /// Without its password.
    pub connstr: String,
    pub slot_name: String,
    pub application_name: String,
    pub system_id: Option<String>,
    /// The PostgreSQL timeline (TLI) being streamed.
    pub timeline: Option<u32>,
    /// Whether the connection to the primary is encrypted (TLS).
    pub tls: Option<bool>,
    /// Just past the last byte received.
    #[serde(serialize_with = "lsn_text")]
    pub received_lsn: Option<Lsn>,
    /// Just past the last byte durable here (what the primary is told is flushed).
    #[serde(serialize_with = "lsn_text")]
    pub flushed_lsn: Option<Lsn>,
    /// Just past the last byte in the object store (listed by its durable index).
    #[serde(serialize_with = "lsn_text")]
    pub archived_lsn: Option<Lsn>,
    /// The end of the primary's WAL, as it last said.
    #[serde(serialize_with = "lsn_text")]
    pub primary_wal_end: Option<Lsn>,
    /// `primary_wal_end - flushed_lsn`.
    pub lag_bytes: Option<u64>,
    /// Unix milliseconds of the last message from the primary.
    pub last_message_ms: Option<u64>,
    pub last_error: Option<String>,
    /// Whether page ingest runs (`ingest_pages`).
    pub ingest_pages: bool,
    /// Where page ingest is: the end of the last record whose versions the timeline holds.
    #[serde(serialize_with = "lsn_text")]
    pub pages_lsn: Option<Lsn>,
    /// Why page ingest does not go on, if it does not (it tries again).
    pub pages_error: Option<String>,
    /// Background snapshots: one after each this many bytes of WAL (0: none).
    pub snapshot_wal_distance: u64,
    /// Whether one is being made now.
    pub snapshot_running: bool,
    /// The LSN of the last one made since the receiver started.
    #[serde(serialize_with = "lsn_text")]
    pub snapshot_lsn: Option<Lsn>,
    /// Why the last one failed, if it did (it tries again).
    pub snapshot_error: Option<String>,
}

/// An LSN as `X/X` text, as the rest of the API writes LSNs.
fn lsn_text<S: serde::Serializer>(lsn: &Option<Lsn>, s: S) -> Result<S::Ok, S::Error> {
    match lsn {
        Some(lsn) => s.serialize_str(&lsn.to_string()),
        None => s.serialize_none(),
    }
}

/// Where page ingest stops, while a background snapshot wants it to: before the first record
/// that starts at or past `from` (the snapshot is at the end of that record).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct IngestLimit {
    pub from: Option<Lsn>,
}

impl IngestLimit {
    /// Page ingest stops before the first record starting at or past `lsn`.
    pub(super) fn from(lsn: Lsn) -> IngestLimit {
        IngestLimit { from: Some(lsn) }
    }

    /// Whether page ingest stops before `record`.
    pub(super) fn stops_before(&self, record: &postgres_wal::DecodedRecord) -> bool {
        self.from.is_some_and(|from| record.start >= from)
    }

    /// Whether page ingest, having ingested the WAL to `ingested`, is there: every record
    /// after starts past the limit.
    pub(super) fn reached(&self, ingested: Lsn) -> bool {
        self.from.is_some_and(|from| ingested >= from)
    }
}

pub(super) struct Shared {
    state: Mutex<ReceiverState>,
    /// Notified when `flushed_lsn` moves and when the receiver stops: what page ingest waits
    /// for.
    flushed: Condvar,
    pub(super) stop: AtomicBool,
    /// The primary's WAL segment size, once connected (0 before).
    pub(super) segment_size: AtomicU32,
    /// See `Receivers`' `timeout`.
    pub(super) timeout: Duration,
    /// Where page ingest stops (a background snapshot holds it while it replays and imports:
    /// `snapshots.rs`).
    ingest_limit: Mutex<IngestLimit>,
    /// Held by page ingest over each step, so that a limit set is seen by the next one.
    pub(super) ingest_step: Mutex<()>,
}

impl Shared {
    pub(super) fn new(state: ReceiverState, timeout: Duration) -> Shared {
        Shared {
            state: Mutex::new(state),
            flushed: Condvar::new(),
            stop: AtomicBool::new(false),
            segment_size: AtomicU32::new(0),
            timeout,
            ingest_limit: Mutex::new(IngestLimit::default()),
            ingest_step: Mutex::new(()),
        }
    }

    /// Where page ingest stops.
    pub(super) fn ingest_limit(&self) -> IngestLimit {
        *self.ingest_limit.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets or lifts the limit; a set one holds once this returns (the step under way, which
    /// may not have seen it, is over).
    pub(super) fn set_ingest_limit(&self, limit: IngestLimit) {
        *self.ingest_limit.lock().unwrap_or_else(|e| e.into_inner()) = limit;
        drop(self.ingest_step.lock().unwrap_or_else(|e| e.into_inner()));
        if limit == IngestLimit::default() {
            let _state = self.state();
            self.flushed.notify_all();
        }
    }

    pub(super) fn state(&self) -> MutexGuard<'_, ReceiverState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets `flushed_lsn` in `state` (this receiver's, locked) and wakes whoever waits for it.
    pub(super) fn set_flushed(&self, state: &mut ReceiverState, flushed: Lsn) {
        state.flushed_lsn = Some(flushed);
        self.flushed.notify_all();
    }

    /// Stops the receiver's threads: the flag they look at, and a wake-up for a waiting one.
    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let _state = self.state();
        self.flushed.notify_all();
    }

    /// Waits until `flushed_lsn` is other than `seen`, the receiver stops, or `timeout` passes.
    pub(super) fn wait_for_flush(&self, seen: Option<Lsn>, timeout: Duration) {
        let state = self.state();
        let _ = self
            .flushed
            .wait_timeout_while(state, timeout, |s| {
                s.flushed_lsn == seen && !self.stop.load(Ordering::Acquire)
            })
            .unwrap_or_else(|e| e.into_inner());
    }
}
