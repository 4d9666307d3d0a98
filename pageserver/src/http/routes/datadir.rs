//! A PostgreSQL data directory in and out of a timeline: `PUT .../import` reads a tar stream
//! as it arrives, `GET .../basebackup` writes one as it is read. Neither holds more than a few
//! chunks of the archive in memory (the body budget of `body_limits` does not apply to an
//! import: its bytes are not buffered). Each waits on its client for as long as the client
//! takes, so each runs on a thread of its own, never the shared blocking pool, and only so many
//! run at once (`tenant::admission`).

use std::io::{self, Read, Write};
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http_body_util::BodyExt;
use pageserver_api::datadir::SnapshotKind;
use serde_json::Value as JsonValue;
use tokio::sync::mpsc;
use utils::Lsn;

use super::{closing, lsn_param, query_params, timeline_of, ApiResult};
use crate::datadir::{
    import_archive, plan_materialized, snapshot_at, starts_clean, write_basebackup,
    BasebackupError, ImportError, Materialized, Restore,
};
use crate::http::error::ApiError;
use crate::http::{blocking, on_own_thread, SharedState};
use crate::walreceiver::commit_time::{self, Found};
use crate::walreceiver::replay_plan::{replay_of, ReplayError};

/// Bytes of archive handed to the client at a time, and how many such pieces may wait.
const BASEBACKUP_PIECE: usize = 256 * 1024;
const BASEBACKUP_PIECES_QUEUED: usize = 8;

/// `lsn=<X/X | decimal | latest>`, optional; `None` for latest or absent.
fn optional_lsn(uri: &Uri) -> ApiResult<Option<Lsn>> {
    let mut lsn = None;
    for (_, value) in query_params(uri, &["lsn"], "lsn")? {
        lsn = lsn_param(&value)?;
    }
    Ok(lsn)
}

fn import_error(e: ImportError) -> ApiError {
    match e {
        ImportError::Invalid(m) => ApiError::bad_request(m),
        ImportError::Conflict(m) => ApiError::new(StatusCode::CONFLICT, m),
        ImportError::Read(e) => {
            ApiError::bad_request(format!("the archive could not be read: {e}"))
        }
        ImportError::Timeline(e) => e.into(),
        e @ ImportError::Damaged(_) => ApiError::internal(e.to_string()),
    }
}

pub async fn import(
    State(state): State<SharedState>,
    Path(ids): Path<(String, String)>,
    uri: Uri,
    body: Body,
) -> Result<Json<JsonValue>, Response> {
    let timeline = timeline_of(&state, &ids).map_err(closing)?;
    let lsn = optional_lsn(&uri).map_err(closing)?;
    // Before a byte of the body is read: an import waits on its client for as long as the
    // client sends, on a thread of its own, so only so many may run.
    let permit = state
        .admissions
        .imports
        .admit(timeline.tenant_id())
        .map_err(|busy| closing(busy.into()))?;
    let body_error = Arc::new(Mutex::new(None));
    let mut reader = BodyReader {
        body,
        runtime: tokio::runtime::Handle::current(),
        current: Bytes::new(),
        error: body_error.clone(),
    };
    let result = on_own_thread("import", permit, move || {
        let outcome = import_archive(&timeline, &mut reader, lsn);
        let label = match &outcome {
            Ok(_) => "ok",
            Err(ImportError::Invalid(_) | ImportError::Conflict(_) | ImportError::Read(_)) => {
                "refused"
            }
            Err(_) => "error",
        };
        crate::metrics::DATADIR_IMPORTS
            .with_label_values(&[label])
            .inc();
        // A refusal found mid-archive reads the rest of the body (within bounds) first, so
        // that a client still sending gets the answer rather than a reset connection.
        let drained = outcome.is_ok() || drain(&mut reader);
        Ok((outcome.map_err(import_error), drained))
    })
    .await;
    let (outcome, drained) = match result {
        Ok(pair) => pair,
        Err(e) => (Err(e), false),
    };
    match outcome {
        Ok(report) => Ok(Json(serde_json::to_value(report).expect("plain fields"))),
        Err(error) => {
            // What cut the body off (a stall, a client that went away) explains it best.
            let cause = body_error.lock().expect("never poisoned").take();
            match cause {
                Some(cause) => Err(closing(cause)),
                None if drained => Err(error.into_response()),
                None => Err(closing(error)),
            }
        }
    }
}

/// The most of a refused import's body read to its end before answering, in bytes and time.
const DRAIN_MAX_BYTES: u64 = 256 * 1024 * 1024;
const DRAIN_MAX_TIME: std::time::Duration = std::time::Duration::from_secs(10);

/// Reads and drops the rest of the body; whether it reached the end within the bounds.
fn drain(reader: &mut BodyReader) -> bool {
    let started = std::time::Instant::now();
    let mut left = DRAIN_MAX_BYTES;
    let mut buf = vec![0u8; 64 * 1024];
    while left > 0 && started.elapsed() < DRAIN_MAX_TIME {
        match reader.read(&mut buf) {
            Ok(0) => return true,
            Ok(n) => left = left.saturating_sub(n as u64),
            Err(_) => return false,
        }
    }
    false
}

/// The request body as a blocking reader, for the import on its own thread.
struct BodyReader {
    body: Body,
    runtime: tokio::runtime::Handle,
    current: Bytes,
    /// Why the body failed, as the response should say it.
    error: Arc<Mutex<Option<ApiError>>>,
}

impl Read for BodyReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            // On the import's own thread, outside the runtime's workers: blocking is allowed.
            match self.runtime.block_on(self.body.frame()) {
                None => return Ok(0),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        crate::metrics::DATADIR_IMPORT_BYTES.inc_by(data.len() as u64);
                        self.current = data;
                    }
                }
                Some(Err(e)) => {
                    let error = crate::http::body_limits::api_error(&e).unwrap_or_else(|| {
                        ApiError::bad_request("the request body could not be read to its end")
                    });
                    let message = error.msg.clone();
                    *self.error.lock().expect("never poisoned") = Some(error);
                    return Err(io::Error::other(message));
                }
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        let _ = self.current.split_to(n);
        Ok(n)
    }
}

fn basebackup_error(e: BasebackupError) -> ApiError {
    match e {
        BasebackupError::NoSnapshot(m) => ApiError::new(StatusCode::NOT_FOUND, m),
        BasebackupError::NotMaterialized(m) => ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, m),
        BasebackupError::Timeline(e) => e.into(),
        e => ApiError::internal(e.to_string()),
    }
}

pub async fn basebackup(
    State(state): State<SharedState>,
    Path(ids): Path<(String, String)>,
    uri: Uri,
) -> ApiResult<Response> {
    let timeline = timeline_of(&state, &ids)?;
    let mut lsn = None;
    let mut time = None;
    let mut materialize = false;
    let params = query_params(
        &uri,
        &["lsn", "timestamp", "replay"],
        "lsn, timestamp or replay",
    )?;
    for (name, value) in params {
        match name {
            "lsn" => lsn = lsn_param(&value)?,
            "replay" => {
                materialize = match value.as_str() {
                    "none" => true,
                    "wal" => false,
                    other => {
                        return Err(ApiError::bad_request(format!(
                            "replay={other}: give replay=wal (the default: the snapshot below \
                             and the WAL to replay) or replay=none (the pages at the LSN, with \
                             nothing to replay)"
                        )))
                    }
                }
            }
            _ => time = Some(super::wal::parse_timestamp(&value)?),
        }
    }
    let mut commit_time = None;
    let lsn = match (lsn, time) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request(
                "lsn= and timestamp= name two points: give one".to_owned(),
            ))
        }
        (Some(lsn), None) => lsn,
        (None, None) => timeline.last_record_lsn(),
        (None, Some(time)) => {
            let (lsn, at) = lsn_of_time(&timeline, time).await?;
            commit_time = Some(at);
            lsn
        }
    };
    // The archive is written as the client reads it, for as long as the client takes, on a
    // thread of its own: only so many may run.
    let permit = state.admissions.basebackups.admit(timeline.tenant_id())?;
    let (snapshot, replay, materialized, timeline, lease) = blocking(move || {
        // Past the newest snapshot, or between two: the snapshot below, and the WAL received
        // since, replayed by PostgreSQL when it starts, if the timeline has that WAL; or with
        // replay=none, the pages at the LSN itself.
        let last = timeline.last_record_lsn();
        let snapshot = snapshot_at(&timeline, lsn.min(last)).map_err(basebackup_error)?;
        // At a snapshot that replays its own WAL when it starts (a standby's, a background
        // snapshot's), nothing to replay is the pages there too.
        let own_replay = materialize
            && lsn == snapshot.lsn
            && snapshot.kind == SnapshotKind::Stopped
            && !starts_clean(&timeline, snapshot).map_err(basebackup_error)?;
        if materialize && (lsn > snapshot.lsn || own_replay) {
            let materialized = materialized_at(&timeline, snapshot, lsn)?;
            // Held until the archive is written: GC keeps the versions at its LSN.
            let lease = timeline.lease_lsn(materialized.at)?;
            return Ok((snapshot, None, Some(materialized), timeline, lease));
        }
        if materialize && snapshot.kind != SnapshotKind::Stopped {
            // The backup itself would replay the WAL it holds.
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!(
                    "no basebackup without replay at {lsn}: the snapshot there is a backup of a \
                     running cluster, which PostgreSQL recovers from its own WAL"
                ),
            ));
        }
        // At a background snapshot's own LSN too: its `pg_wal/` is the timeline's WAL from
        // its checkpoint's redo point.
        let replay = if lsn > snapshot.lsn || snapshot.wal_from < snapshot.lsn {
            match replay_of(&timeline, snapshot.wal_from, lsn) {
                Ok(Some(replay)) => Some(replay),
                Ok(None) if lsn > last => {
                    // As before there was WAL: nothing is known beyond the last record.
                    snapshot_at(&timeline, lsn).map_err(basebackup_error)?;
                    None
                }
                // A background snapshot without its WAL would not start.
                Ok(None) if snapshot.wal_from < snapshot.lsn => {
                    return Err(ApiError::not_found(format!(
                        "no basebackup at {lsn}: the snapshot at {} replays the timeline's WAL \
                         from {}, and the timeline holds none",
                        snapshot.lsn, snapshot.wal_from
                    )))
                }
                Ok(None) => None,
                Err(ReplayError::Fetch(e)) => return Err(ApiError::try_again(e)),
                Err(ReplayError::Missing(e)) => {
                    return Err(ApiError::not_found(format!(
                    "no basebackup at {lsn}: the newest snapshot at or below it is at {}, and {e}",
                    snapshot.lsn
                )))
                }
            }
        } else {
            None
        };
        // Held until the archive is written (or its client leaves): GC does not pass the
        // snapshot's LSN half way through.
        let lease = timeline.lease_lsn(snapshot.lsn)?;
        Ok((snapshot, replay, None, timeline, lease))
    })
    .await?;
    let replay_to = replay.as_ref().map(|r| r.target);
    // At a stopped cluster's snapshot, the snapshot itself has nothing to replay.
    let materialized_at = match &materialized {
        Some(m) => Some(m.at),
        None if materialize => Some(snapshot.lsn),
        None => None,
    };
    // The archive is written on a thread of its own into a bounded queue the response body
    // drains: a slow client slows the writer down, and one that leaves stops it.
    let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(BASEBACKUP_PIECES_QUEUED);
    let writer = std::thread::Builder::new().name("basebackup".into());
    let spawned = writer.spawn(move || {
        let mut out = PieceWriter {
            tx: tx.clone(),
            buf: Vec::with_capacity(BASEBACKUP_PIECE),
        };
        let restore = match (&replay, &materialized) {
            (Some(replay), _) => Restore::Replay(replay),
            (None, Some(m)) => Restore::Materialized(m),
            (None, None) => Restore::Snapshot,
        };
        if let Err(e) = write_basebackup(&timeline, snapshot, restore, &mut out) {
            tracing::warn!(
                tenant = %timeline.tenant_id(),
                timeline = %timeline.timeline_id(),
                "basebackup at {} stopped: {e}",
                materialized_at.unwrap_or(snapshot.lsn)
            );
            // The client sees the transfer fail, never a short archive that looks whole.
            let _ = tx.blocking_send(Err(io::Error::other(e.to_string())));
        }
        drop(lease);
        drop(permit);
    });
    spawned.map_err(|e| ApiError::internal(format!("no thread for the basebackup: {e}")))?;
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|piece| (piece, rx))
    });
    let mut response = Body::from_stream(stream).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-tar"),
    );
    headers.insert(
        "x-snapshot-lsn",
        HeaderValue::from_str(&snapshot.lsn.to_string()).expect("an LSN is ASCII"),
    );
    headers.insert(
        "x-snapshot-kind",
        HeaderValue::from_str(&snapshot.kind.to_string()).expect("ASCII"),
    );
    if let Some(at) = commit_time {
        headers.insert(
            "x-commit-time",
            HeaderValue::from_str(&super::wal::format_timestamp(at)).expect("ASCII"),
        );
    }
    if let Some(at) = materialized_at {
        headers.insert(
            "x-materialized-lsn",
            HeaderValue::from_str(&at.to_string()).expect("an LSN is ASCII"),
        );
    }
    if let Some(target) = replay_to {
        headers.insert(
            "x-replay-to",
            HeaderValue::from_str(&target.to_string()).expect("an LSN is ASCII"),
        );
    }
    Ok(response)
}

/// How far back from the LSN asked for a restore without replay looks for the record that
/// ends last at or before it: a record is at most a few hundred KiB, and this spans at least
/// two segments of any size a primary uses by default.
const LAST_RECORD_LOOKBACK: u64 = 64 << 20;

/// How far back from a snapshot's own LSN the record that ends there is looked for (a
/// checkpoint record: 114 bytes).
const OWN_RECORD_LOOKBACK: u64 = 64 << 10;

/// The plan of an archive of the pages at `lsn` (above `snapshot`) with nothing to replay.
fn materialized_at(
    timeline: &Arc<crate::tenant::timeline::Timeline>,
    snapshot: pageserver_api::datadir::Snapshot,
    lsn: Lsn,
) -> ApiResult<Materialized> {
    // At the snapshot's own LSN, the record that ends there is before it.
    let from = if lsn > snapshot.lsn {
        snapshot
            .lsn
            .max(Lsn(lsn.0.saturating_sub(LAST_RECORD_LOOKBACK)))
    } else {
        Lsn(lsn.0.saturating_sub(OWN_RECORD_LOOKBACK))
    };
    let replay = match replay_of(timeline, from, lsn) {
        Ok(Some(replay)) => replay,
        Ok(None) => {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("no basebackup without replay at {lsn}: the timeline holds no WAL"),
            ))
        }
        Err(ReplayError::Fetch(e)) => return Err(ApiError::try_again(e)),
        Err(ReplayError::Missing(e)) => {
            return Err(ApiError::not_found(format!(
                "no basebackup without replay at {lsn}: {e}"
            )))
        }
    };
    plan_materialized(timeline, snapshot, &replay).map_err(|e| match e {
        BasebackupError::NotMaterialized(m) => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("no basebackup without replay at {lsn}: {m}"),
        ),
        e => basebackup_error(e),
    })
}

/// The LSN a restore at `time` goes to (the state after the last commit at or before it), and
/// that commit's time.
async fn lsn_of_time(
    timeline: &Arc<crate::tenant::timeline::Timeline>,
    time: i64,
) -> ApiResult<(Lsn, i64)> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64);
    let shown = super::wal::format_timestamp(time);
    if time > now {
        return Err(ApiError::bad_request(format!(
            "timestamp {shown} is in the future: the state then is not known yet"
        )));
    }
    let timeline = timeline.clone();
    let found = blocking(move || {
        commit_time::lsn_by_time(&timeline, time)
            .map_err(|e| ApiError::try_again(format!("reading the WAL for its commit times: {e}")))
    })
    .await?;
    match (found.kind, found.lsn, found.commit_time) {
        (Found::Present | Found::Future, Some(lsn), Some(at)) => Ok((lsn, at)),
        (Found::Past, _, at) => Err(ApiError::not_found(format!(
            "no basebackup at {shown}: it is before the first commit the timeline's WAL holds ({})",
            at.map_or_else(|| "unknown".to_owned(), super::wal::format_timestamp)
        ))),
        _ => Err(ApiError::not_found(format!(
            "no basebackup at {shown}: the timeline's WAL archive holds no commit (restores by time need WAL streamed in)"
        ))),
    }
}

/// Collects the archive into pieces and queues them for the response body.
struct PieceWriter {
    tx: mpsc::Sender<io::Result<Bytes>>,
    buf: Vec<u8>,
}

impl PieceWriter {
    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let piece = Bytes::from(std::mem::replace(
            &mut self.buf,
            Vec::with_capacity(BASEBACKUP_PIECE),
        ));
        crate::metrics::BASEBACKUP_BYTES.inc_by(piece.len() as u64);
        self.tx.blocking_send(Ok(piece)).map_err(|_| {
            io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the client closed the connection",
            )
        })
    }
}

impl Write for PieceWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(BASEBACKUP_PIECE - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == BASEBACKUP_PIECE {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}
