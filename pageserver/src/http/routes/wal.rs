//! A timeline's WAL receiver (`PUT`, `GET`, `DELETE .../wal_receiver`) and its WAL files
//! (`GET .../wal/{file}`: a segment or a history file by its PostgreSQL name, what a
//! `restore_command` fetches), and the LSN of a time (`GET .../lsn_by_timestamp`).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value as JsonValue};

use super::{bool_query, json_body, query_params, timeline_of, ApiResult};
use crate::http::error::ApiError;
use crate::http::{blocking, SharedState};
use crate::walreceiver::{commit_time, wal_store, ReceiverConf, ReceiverError};

/// A WAL file is sent in chunks of this size.
const CHUNK: u64 = 256 << 10;

/// The body of `PUT .../wal_receiver`.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiverRequest {
    connstr: Option<String>,
    slot_name: Option<String>,
    application_name: Option<String>,
    ingest_pages: Option<bool>,
    snapshot_wal_distance: Option<u64>,
}

fn receiver_error(e: ReceiverError) -> ApiError {
    let status = match &e {
        ReceiverError::Settings(_) => StatusCode::BAD_REQUEST,
        e if e.is_permanent() => StatusCode::CONFLICT,
        ReceiverError::Io(_) => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::BAD_GATEWAY,
    };
    ApiError::new(status, e.to_string())
}

pub async fn wal_receiver_put(
    State(state): State<SharedState>,
    Path(ids): Path<(String, String)>,
    body: Body,
) -> ApiResult<Json<JsonValue>> {
    let timeline = timeline_of(&state, &ids)?;
    let request: ReceiverRequest = json_body(body).await?;
    let connstr = request
        .connstr
        .ok_or_else(|| ApiError::bad_request("the body needs connstr"))?;
    let slot_name = request
        .slot_name
        .unwrap_or_else(|| format!("pageserver_{}", timeline.timeline_id()));
    let conf = ReceiverConf {
        connstr,
        application_name: request
            .application_name
            .unwrap_or_else(|| slot_name.clone()),
        slot_name,
        ingest_pages: request.ingest_pages.unwrap_or(false),
        snapshot_wal_distance: request.snapshot_wal_distance,
    };
    let receivers = state.receivers.clone();
    let started = blocking(move || Ok(receivers.start(timeline, conf))).await?;
    let started = started.map_err(receiver_error)?;
    Ok(Json(
        serde_json::to_value(started).map_err(|e| ApiError::internal(e.to_string()))?,
    ))
}

pub async fn wal_receiver_get(
    State(state): State<SharedState>,
    Path(ids): Path<(String, String)>,
) -> ApiResult<Json<JsonValue>> {
    let timeline = timeline_of(&state, &ids)?;
    let receiver = state
        .receivers
        .state(timeline.tenant_id(), timeline.timeline_id())
        .ok_or_else(|| ApiError::not_found("the timeline has no WAL receiver"))?;
    Ok(Json(
        serde_json::to_value(receiver).map_err(|e| ApiError::internal(e.to_string()))?,
    ))
}

pub async fn wal_receiver_delete(
    State(state): State<SharedState>,
    Path(ids): Path<(String, String)>,
    uri: Uri,
) -> ApiResult<Json<JsonValue>> {
    let timeline = timeline_of(&state, &ids)?;
    let drop_slot = bool_query(&uri, "drop_slot")?;
    let receivers = state.receivers.clone();
    let removed = blocking(move || Ok(receivers.remove(&timeline, drop_slot)))
        .await?
        .map_err(receiver_error)?;
    if !removed {
        return Err(ApiError::not_found("the timeline has no WAL receiver"));
    }
    Ok(Json(json!({})))
}

/// Whether `name` is a WAL file name: a segment (24 hex digits) or a history file.
fn is_wal_file_name(name: &str) -> bool {
    (name.len() == 24 && name.bytes().all(|b| b.is_ascii_hexdigit()))
        || postgres_wal::segment::parse_history_file_name(name).is_some()
}

pub async fn wal_file(
    State(state): State<SharedState>,
    Path((tenant, timeline, name)): Path<(String, String, String)>,
) -> ApiResult<Response> {
    let timeline = timeline_of(&state, &(tenant, timeline))?;
    if !is_wal_file_name(&name) {
        return Err(ApiError::bad_request(format!(
            "`{name}` is not a WAL file name (a segment like 000000010000000000000003, or a history file like 00000002.history)"
        )));
    }
    let dir = timeline.dir().to_owned();
    let file = blocking(move || {
        // A descriptor held for the whole answer, not the table of open files (which reopens
        // by path): the segment being filled is renamed when it is whole. Looked up twice, as
        // a rename between the lookup and the open moves it once.
        let open = || wal_store::find_file(&dir, &name).and_then(|p| std::fs::File::open(p).ok());
        let mut file = open().or_else(open);
        if file.is_none() {
            // Not on the local disk: from the WAL archive, if it has it.
            if let Some(remote) = timeline.remote_copy() {
                let fetched = remote
                    .fetch_wal(&dir.join(wal_store::WAL_DIR), &name)
                    .map_err(|e| {
                        ApiError::try_again(format!(
                            "fetching WAL file {name} from remote storage: {e}"
                        ))
                    })?;
                if fetched {
                    file = open();
                }
            }
        }
        let file = file
            .ok_or_else(|| ApiError::not_found(format!("the timeline has no WAL file {name}")))?;
        let len = file
            .metadata()
            .map_err(|e| ApiError::internal(format!("{name}: {e}")))?
            .len();
        Ok((Arc::new(file), len))
    })
    .await?;
    // In chunks read on the blocking pool as the client takes them: a request holds one chunk.
    let stream = futures::stream::unfold((file, 0u64), |((file, len), at)| async move {
        if at >= len {
            return None;
        }
        let n = (len - at).min(CHUNK) as usize;
        let reader = file.clone();
        let chunk = tokio::task::spawn_blocking(move || {
            let mut buf = vec![0u8; n];
            std::os::unix::fs::FileExt::read_exact_at(&*reader, &mut buf, at)
                .map(|()| Bytes::from(buf))
        })
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
        Some((chunk, ((file, len), at + n as u64)))
    });
    let mut response = Body::from_stream(stream).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/octet-stream"),
    );
    Ok(response)
}

/// A time as the API takes it (RFC 3339, UTC: `2026-11-26T10:00:00Z`, fractions allowed), in
/// microseconds since the Unix epoch.
pub(super) fn parse_timestamp(text: &str) -> ApiResult<i64> {
    let time = humantime::parse_rfc3339_weak(text).map_err(|e| {
        ApiError::bad_request(format!(
            "timestamp `{text}`: {e} (expected RFC 3339 in UTC, like 2026-11-26T10:00:00Z)"
        ))
    })?;
    let micros = time
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|_| ApiError::bad_request(format!("timestamp `{text}` is before 1970")))?
        .as_micros();
    i64::try_from(micros)
        .map_err(|_| ApiError::bad_request(format!("timestamp `{text}` is too far ahead")))
}

/// A time in microseconds since the Unix epoch, as the API writes times.
pub(super) fn format_timestamp(micros: i64) -> String {
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_micros(micros.max(0) as u64);
    humantime::format_rfc3339_micros(time).to_string()
}

/// `GET .../lsn_by_timestamp?timestamp=T`: the LSN of the state after the last commit at or
/// before `T` (`walreceiver::commit_time`).
pub async fn lsn_by_timestamp(
    State(state): State<SharedState>,
    Path(ids): Path<(String, String)>,
    uri: Uri,
) -> ApiResult<Json<JsonValue>> {
    let timeline = timeline_of(&state, &ids)?;
    let mut time = None;
    for (_, value) in query_params(&uri, &["timestamp"], "timestamp")? {
        time = Some(parse_timestamp(&value)?);
    }
    let time = time.ok_or_else(|| ApiError::bad_request("timestamp= is required".to_owned()))?;
    let found = blocking(move || {
        commit_time::lsn_by_time(&timeline, time)
            .map_err(|e| ApiError::try_again(format!("reading the WAL for its commit times: {e}")))
    })
    .await?;
    Ok(Json(json!({
        "kind": found.kind,
        "lsn": found.lsn.map(|l| l.to_string()),
        "commit_time": found.commit_time.map(format_timestamp),
    })))
}
