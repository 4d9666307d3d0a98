//! Page versions in and out: `POST .../ingest` stores a batch of records, `GET .../page` reads
//! one page as of an LSN. Both are timed into their histograms by outcome; a read answers with
//! its cost in `x-read-cost`, found or not.

use std::time::Instant;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use pageserver_api::ingest::{BatchDecoder, IngestDecodeError, PutRecord};
use pageserver_api::Key;
use serde_json::{json, Value as JsonValue};
use utils::Lsn;

use super::{closing, key_param, lsn_param, next_chunk, query_params, timeline_of, ApiResult};
use crate::http::body_limits::GatheredBody;
use crate::http::error::ApiError;
use crate::http::{blocking, SharedState};
use crate::io::read_cost::ReadCost;
use crate::serving::error::ServeError;
use crate::serving::read::PageAnswer;
use crate::tenant::storage_layer::max_stored_value_len;
use crate::tenant::timeline::Timeline;

pub async fn ingest(
    State(state): State<SharedState>,
    Path(ids): Path<(String, String)>,
    headers: axum::http::HeaderMap,
    body: Body,
) -> Result<Json<JsonValue>, Response> {
    let started = Instant::now();
    let result = ingest_inner(&state, &ids, &headers, body).await;
    let outcome = if result.is_ok() { "ok" } else { "error" };
    crate::metrics::INGEST_SECONDS
        .with_label_values(&[outcome])
        .observe(started.elapsed().as_secs_f64());
    result
}

async fn ingest_inner(
    state: &SharedState,
    ids: &(String, String),
    headers: &axum::http::HeaderMap,
    body: Body,
) -> Result<Json<JsonValue>, Response> {
    // Which timeline first (404 and 400 as for any route), then the body's size (413).
    let timeline = timeline_of(state, ids).map_err(closing)?;
    let limit = state.conf.max_request_body_size;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(len) = declared.filter(|len| *len > limit as u64) {
        // Refused from its length, before a byte of it is read; the unread body means the
        // connection cannot carry another request, and the client is told so.
        return Err(closing(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body of {len} bytes is over the limit of {limit} bytes"),
        )));
    }
    let max_payload = max_stored_value_len(state.conf.timeline.max_value_size);
    let (decoded, body_len) = read_batch(body, limit, max_payload)
        .await
        .map_err(closing)?;
    // The whole body was read: a refusal leaves the connection usable.
    let records = decoded.map_err(|e| ApiError::bad_request(e.to_string()).into_response())?;
    store_batch(timeline, records, body_len)
        .await
        .map_err(IntoResponse::into_response)
}

/// Reads an ingest body to its end and decodes it. Large chunks are kept as they arrived and
/// decoded in place, a record within one sharing the chunk's memory; small ones are gathered
/// into one buffer ([`GatheredBody`]), so the body holds about as much memory as its bytes,
/// which the request body budget covers (`body_limits.rs`). Decoding waits for the end of the
/// body: decoded records of small values take more memory than their bytes on the wire. A body
/// that fails to arrive is an error of the outer result.
async fn read_batch(
    mut body: Body,
    limit: usize,
    max_payload: usize,
) -> ApiResult<(Result<Vec<PutRecord>, IngestDecodeError>, u64)> {
    let mut gathered = GatheredBody::default();
    let mut received = 0;
    while let Some(chunk) = next_chunk(&mut body, limit, &mut received).await? {
        gathered.push(chunk);
    }
    let decode = || {
        let mut decoder = BatchDecoder::new(max_payload);
        for segment in gathered.into_segments() {
            decoder.feed(segment)?;
        }
        decoder.finish()
    };
    Ok((decode(), received as u64))
}

async fn store_batch(
    timeline: std::sync::Arc<Timeline>,
    records: Vec<PutRecord>,
    body_len: u64,
) -> ApiResult<Json<JsonValue>> {
    let count = records.len();
    let (timeline, hold) = blocking(move || {
        let hold = timeline.put_batch_paced(&records)?;
        // Counted here: a batch is stored even if its client hangs up before the answer.
        crate::metrics::INGEST_RECORDS.inc_by(count as u64);
        crate::metrics::INGEST_BYTES.inc_by(body_len);
        Ok((timeline, hold))
    })
    .await?;
    // The answer waits at the pace of the flush and the uploads (`timeline/pacing.rs`), on the
    // runtime: no blocking thread is held.
    if !hold.is_zero() {
        tokio::time::sleep(hold).await;
    }
    Ok(Json(json!({
        "records": count,
        "last_record_lsn": timeline.last_record_lsn().to_string(),
        "disk_consistent_lsn": timeline.disk_consistent_lsn().to_string(),
    })))
}

/// `key=<36 hex>&lsn=<X/X | decimal | latest>`, in any order; nothing else.
fn page_query(uri: &Uri) -> ApiResult<(Key, Option<Lsn>)> {
    let mut key = None;
    let mut lsn = None;
    for (name, value) in query_params(uri, &["key", "lsn"], "key and lsn")? {
        match name {
            "key" => key = Some(key_param(name, &value)?),
            _ => lsn = Some(lsn_param(&value)?),
        }
    }
    let key = key.ok_or_else(|| ApiError::bad_request("missing query parameter `key`"))?;
    let lsn = lsn.ok_or_else(|| {
        ApiError::bad_request(
            "missing query parameter `lsn` (an LSN such as 0/16B5A50, or `latest`)",
        )
    })?;
    Ok((key, lsn))
}

pub async fn get_page(
    State(state): State<SharedState>,
    Path(ids): Path<(String, String)>,
    uri: Uri,
) -> Response {
    let started = Instant::now();
    let (outcome, response) = match get_page_inner(&state, &ids, &uri).await {
        Ok((
            _,
            PageAnswer {
                page: Some(page),
                lsn,
                cost,
            },
        )) => {
            let headers = [
                (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
                (header::HeaderName::from_static("x-lsn"), lsn.to_string()),
                (X_READ_COST, cost.to_string()),
            ];
            ("ok", (headers, page).into_response())
        }
        // A key with no version still cost a read, which the caller may want to see.
        Ok((
            key,
            PageAnswer {
                page: None,
                lsn,
                cost,
            },
        )) => {
            let error = ApiError::from(ServeError::no_version(key, lsn));
            let headers = [(X_READ_COST, cost.to_string())];
            ("not_found", (headers, error).into_response())
        }
        Err((e, _)) if e.status == StatusCode::NOT_FOUND => ("not_found", e.into_response()),
        // An error the read itself met (a page that needs PostgreSQL's redo, a layer it could
        // not read): what the read cost up to there, too.
        Err((e, Some(cost))) => {
            let headers = [(X_READ_COST, cost.to_string())];
            ("error", (headers, e).into_response())
        }
        Err((e, None)) => ("error", e.into_response()),
    };
    crate::metrics::GETPAGE_SECONDS
        .with_label_values(&[outcome])
        .observe(started.elapsed().as_secs_f64());
    response
}

const X_READ_COST: header::HeaderName = header::HeaderName::from_static("x-read-cost");

/// The page, or the error with what the read cost if it got as far as a read.
async fn get_page_inner(
    state: &SharedState,
    ids: &(String, String),
    uri: &Uri,
) -> Result<(Key, PageAnswer), (ApiError, Option<ReadCost>)> {
    let (key, lsn) = page_query(uri).map_err(|e| (e, None))?;
    let timeline = timeline_of(state, ids).map_err(|e| (e, None))?;
    let answer = state.reads.page(timeline, key, lsn).await.map_err(|e| {
        let cost = e.cost;
        (ApiError::from(e), cost)
    })?;
    Ok((key, answer))
}
