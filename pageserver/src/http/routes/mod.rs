//! The handlers, one per route, and the JSON they exchange: the tenants' in `tenant.rs`, a data
//! directory's import and basebackup in `datadir.rs`, the body of a scan page in `scan_body.rs`,
//! the layer files on the local disk that tenant and timeline info count in `residence.rs`, the
//! rest here.

use std::sync::Arc;
use std::time::{Instant, UNIX_EPOCH};

use axum::body::{Body, Bytes, HttpBody as _};
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::BytesMut;
use pageserver_api::ingest::{BatchDecoder, IngestDecodeError, PutRecord};
use pageserver_api::Key;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value as JsonValue};
use utils::{Lsn, TenantId, TimelineId};

use super::body_limits::GatheredBody;
use super::error::{redact_paths, ApiError};
use super::metrics_page::MetricsPage;
use super::{blocking, read, read_on_pool, SharedState};
use crate::io::read_cost;
use crate::page_cache::KindStats;
use crate::tenant::mgr::TenantState;
use crate::tenant::storage_layer::max_stored_value_len;
use crate::tenant::timeline::layer_set::manifest::LayerLevel;
use crate::tenant::timeline::scan::cursor_cache::{ScanFrom, ScanRequest, ScanToken};
use crate::tenant::timeline::{LayerDescription, LayerKind, Timeline};

type ApiResult<T> = Result<T, ApiError>;

mod datadir;
mod residence;
pub mod scan_body;
mod tenant;
pub use datadir::{basebackup, import};
use scan_body::scan_page_body;
pub use tenant::*;

pub(super) fn parse_tenant(text: &str) -> ApiResult<TenantId> {
    text.parse()
        .map_err(|e: utils::id::IdParseError| ApiError::bad_request(e.to_string()))
}

fn parse_timeline(text: &str) -> ApiResult<TimelineId> {
    text.parse()
        .map_err(|e: utils::id::IdParseError| ApiError::bad_request(e.to_string()))
}

/// The most a JSON request body may hold; they are all a few ids.
pub(super) const MAX_JSON_BODY: usize = 64 * 1024;

/// The whole body, refused with 413 past `limit` bytes; 408 or 503 when a limit of
/// [`super::body_limits`] cut it off. Read into one buffer sized from the body's length, so a
/// body costs its size once (collecting chunks, then copying them together, would cost it
/// twice at the end).
async fn read_body(mut body: Body, limit: usize) -> ApiResult<Bytes> {
    let expected = usize::try_from(body.size_hint().lower()).unwrap_or(usize::MAX);
    let mut buffer = BytesMut::with_capacity(expected.min(limit));
    let mut received = 0;
    while let Some(chunk) = next_chunk(&mut body, limit, &mut received).await? {
        buffer.extend_from_slice(&chunk);
    }
    Ok(buffer.freeze())
}

/// The next chunk of `body`'s data, refused once the body passes `limit` bytes in all
/// (`received` counts them); `None` at its end.
async fn next_chunk(
    body: &mut Body,
    limit: usize,
    received: &mut usize,
) -> ApiResult<Option<Bytes>> {
    use http_body_util::BodyExt;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            super::body_limits::api_error(&e).unwrap_or_else(|| {
                ApiError::bad_request("the request body could not be read to its end")
            })
        })?;
        if let Ok(data) = frame.into_data() {
            if data.len() > limit - *received {
                return Err(ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("request body is over the limit of {limit} bytes"),
                ));
            }
            *received += data.len();
            return Ok(Some(data));
        }
    }
    Ok(None)
}

/// A JSON body of type `T`; an empty body is `T::default()`. Anything else must be JSON (a body
/// of only whitespace is not: it is refused like any other body that does not parse).
pub(super) async fn json_body<T: DeserializeOwned + Default>(body: Body) -> ApiResult<T> {
    let body = read_body(body, MAX_JSON_BODY).await?;
    if body.is_empty() {
        return Ok(T::default());
    }
    serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
}

fn layer_json(layer: &LayerDescription) -> JsonValue {
    json!({
        "kind": match layer.kind {
            LayerKind::Open => "open",
            LayerKind::Frozen => "frozen",
            LayerKind::Delta => "delta",
            LayerKind::Image => "image",
        },
        "level": layer.level.map(|l| l.to_string()),
        "lsn_start": layer.lsn_start.to_string(),
        "lsn_end": layer.lsn_end.map(|l| l.to_string()),
        "size_bytes": layer.size_bytes,
        "values": layer.values,
        "file_name": layer.file_name,
        "resident": layer.resident,
    })
}

fn timeline_json(timeline: &Timeline) -> JsonValue {
    let layers = timeline.layers();
    let count = |kind| layers.iter().filter(|l| l.kind == kind).count();
    let bytes = |kinds: &[LayerKind]| -> u64 {
        layers
            .iter()
            .filter(|l| kinds.contains(&l.kind))
            .map(|l| l.size_bytes)
            .sum()
    };
    let broken = timeline.broken_reason().map(|r| redact_paths(&r));
    let mut info = json!({
        "tenant_id": timeline.tenant_id().to_string(),
        "timeline_id": timeline.timeline_id().to_string(),
        "last_record_lsn": timeline.last_record_lsn().to_string(),
        "disk_consistent_lsn": timeline.disk_consistent_lsn().to_string(),
        "gc_cutoff_lsn": timeline.gc_cutoff_lsn().to_string(),
        "ancestor_timeline_id": timeline.ancestor().map(|(a, _)| a.timeline_id().to_string()),
        "ancestor_lsn": timeline.ancestor().map(|(_, lsn)| lsn.to_string()),
        "remote_consistent_lsn": timeline.remote_consistent_lsn().map(|l| l.to_string()),
        "state": if broken.is_some() { "Broken" } else { "Active" },
        "broken_reason": broken,
        "layers": {
            "open": count(LayerKind::Open),
            "frozen": count(LayerKind::Frozen),
            "delta": count(LayerKind::Delta),
            "l0": layers.iter().filter(|l| l.level == Some(LayerLevel::L0)).count(),
            "l1": layers.iter().filter(|l| l.level == Some(LayerLevel::L1)).count(),
            "image": count(LayerKind::Image),
        },
        "in_memory_bytes": bytes(&[LayerKind::Open, LayerKind::Frozen]),
        "delta_layer_bytes": bytes(&[LayerKind::Delta]),
        "image_layer_bytes": bytes(&[LayerKind::Image]),
    });
    residence::Residence::of([timeline]).add_to(&mut info);
    info
}

pub async fn status(State(state): State<SharedState>) -> Json<JsonValue> {
    let started = state
        .started_at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Json(json!({
        "id": state.conf.id,
        "version": env!("CARGO_PKG_VERSION"),
        "testing": crate::failpoints::ENABLED,
        "started_at": started,
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailpointConfig {
    name: String,
    actions: String,
}

pub async fn failpoints(body: Body) -> ApiResult<Json<JsonValue>> {
    if !crate::failpoints::ENABLED {
        return Err(ApiError::bad_request(
            "failpoints need a build with the `testing` feature",
        ));
    }
    let body = read_body(body, MAX_JSON_BODY).await?;
    let configs: Vec<FailpointConfig> = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(format!(
            "invalid request body: {e} (expected [{{\"name\": ..., \"actions\": ...}}])"
        ))
    })?;
    for config in &configs {
        crate::failpoints::configure(&config.name, &config.actions)
            .map_err(ApiError::bad_request)?;
        tracing::info!("failpoint {} set to `{}`", config.name, config.actions);
    }
    Ok(Json(json!({})))
}

pub async fn timeline_list(
    State(state): State<SharedState>,
    Path(tenant_id): Path<String>,
) -> ApiResult<Json<JsonValue>> {
    let tenant = state.tenants.get_tenant(parse_tenant(&tenant_id)?)?;
    if let TenantState::Broken { reason } = tenant.state() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("tenant {} is broken: {reason}", tenant.id()),
        ));
    }
    let timelines = tenant.list_timelines();
    Ok(Json(JsonValue::Array(
        timelines.iter().map(|t| timeline_json(t)).collect(),
    )))
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimelineCreateRequest {
    new_timeline_id: Option<String>,
    /// A branch of this timeline...
    ancestor_timeline_id: Option<String>,
    /// ...at this LSN (default: its `last_record_lsn`).
    ancestor_start_lsn: Option<String>,
}

pub async fn timeline_create(
    State(state): State<SharedState>,
    Path(tenant_id): Path<String>,
    body: Body,
) -> ApiResult<(StatusCode, Json<JsonValue>)> {
    // The body first, whatever the answer: a connection whose request body was left unread
    // cannot carry the client's next request.
    let request: TimelineCreateRequest = json_body(body).await?;
    let tenant = state.tenants.get_tenant(parse_tenant(&tenant_id)?)?;
    let id = request
        .new_timeline_id
        .as_deref()
        .map(parse_timeline)
        .transpose()?;
    let ancestor = request
        .ancestor_timeline_id
        .as_deref()
        .map(parse_timeline)
        .transpose()?;
    let start_lsn = match request.ancestor_start_lsn.as_deref() {
        None => None,
        Some(_) if ancestor.is_none() => {
            return Err(ApiError::bad_request(
                "ancestor_start_lsn needs ancestor_timeline_id",
            ))
        }
        Some(text) => Some(
            text.parse::<Lsn>()
                .map_err(|e| ApiError::bad_request(format!("ancestor_start_lsn {text:?}: {e}")))?,
        ),
    };
    let timeline = blocking(move || {
        Ok(match ancestor {
            Some(ancestor) => tenant.create_branch(id, ancestor, start_lsn)?,
            None => tenant.create_timeline(id)?,
        })
    })
    .await?;
    Ok((StatusCode::CREATED, Json(timeline_json(&timeline))))
}

/// The timeline a data path names.
pub(super) fn timeline_of(
    state: &SharedState,
    (tenant_id, timeline_id): &(String, String),
) -> ApiResult<std::sync::Arc<Timeline>> {
    let tenant = parse_tenant(tenant_id)?;
    let timeline = parse_timeline(timeline_id)?;
    Ok(state.tenants.get_timeline(tenant, timeline)?)
}

pub async fn timeline_info(
    State(state): State<SharedState>,
    Path(ids): Path<(String, String)>,
) -> ApiResult<Json<JsonValue>> {
    let timeline = timeline_of(&state, &ids)?;
    Ok(Json(timeline_json(&timeline)))
}

pub async fn timeline_delete(
    State(state): State<SharedState>,
    Path((tenant_id, timeline_id)): Path<(String, String)>,
) -> ApiResult<Json<JsonValue>> {
    let tenant = state.tenants.get_tenant(parse_tenant(&tenant_id)?)?;
    let id = parse_timeline(&timeline_id)?;
    blocking(move || Ok(tenant.delete_timeline(id)?)).await?;
    Ok(Json(json!({})))
}

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
    let max_payload = max_stored_value_len(state.conf.max_value_size);
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

/// `error` with `Connection: close`, for a refusal that leaves a request body unread.
pub(super) fn closing(error: ApiError) -> Response {
    let mut response = error.into_response();
    response.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    response
}

async fn store_batch(
    timeline: std::sync::Arc<Timeline>,
    records: Vec<PutRecord>,
    body_len: u64,
) -> ApiResult<Json<JsonValue>> {
    let count = records.len();
    let timeline = blocking(move || {
        timeline.put_batch(&records)?;
        // Counted here: a batch is stored even if its client hangs up before the answer.
        crate::metrics::INGEST_RECORDS.inc_by(count as u64);
        crate::metrics::INGEST_BYTES.inc_by(body_len);
        Ok(timeline)
    })
    .await?;
    Ok(Json(json!({
        "records": count,
        "last_record_lsn": timeline.last_record_lsn().to_string(),
        "disk_consistent_lsn": timeline.disk_consistent_lsn().to_string(),
    })))
}

/// A key query parameter: 36 hex characters.
fn key_param(name: &str, value: &str) -> ApiResult<Key> {
    value
        .parse::<Key>()
        .map_err(|e| ApiError::bad_request(format!("query parameter {name}: {e}")))
}

/// The `lsn` query parameter: `X/X`, decimal, or `latest` (`None`).
pub(super) fn lsn_param(value: &str) -> ApiResult<Option<Lsn>> {
    if value == "latest" {
        return Ok(None);
    }
    value
        .parse::<Lsn>()
        .map(Some)
        .map_err(|e| ApiError::bad_request(format!("query parameter lsn: {e}")))
}

/// The query string's parameters, percent-decoded by the framework's `Query` extractor (as
/// `application/x-www-form-urlencoded`, so `+` is a space), each one of `known` and given at
/// most once: a repeated parameter is refused rather than one of its values silently winning.
/// `expected` lists `known` for the message about an unknown one.
pub(super) fn query_params<'k>(
    uri: &Uri,
    known: &[&'k str],
    expected: &str,
) -> ApiResult<Vec<(&'k str, String)>> {
    let Query(pairs) = Query::<Vec<(String, String)>>::try_from_uri(uri)
        .map_err(|e| ApiError::bad_request(format!("invalid query string: {}", e.body_text())))?;
    let mut params: Vec<(&'k str, String)> = Vec::with_capacity(pairs.len());
    for (name, value) in pairs {
        let Some(&name) = known.iter().find(|k| **k == name) else {
            let shown: String = name.chars().take(40).collect();
            return Err(ApiError::bad_request(format!(
                "unknown query parameter `{shown}` (expected {expected})"
            )));
        };
        if params.iter().any(|(seen, _)| *seen == name) {
            return Err(ApiError::bad_request(format!(
                "query parameter `{name}` is given more than once"
            )));
        }
        params.push((name, value));
    }
    Ok(params)
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
        Ok((_, Some(page), lsn, cost)) => {
            let headers = [
                (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
                (header::HeaderName::from_static("x-lsn"), lsn.to_string()),
                (X_READ_COST, cost.to_string()),
            ];
            ("ok", (headers, page).into_response())
        }
        // A key with no version still cost a read, which the caller may want to see.
        Ok((key, None, lsn, cost)) => {
            let error = ApiError::no_version(key, lsn);
            let headers = [(X_READ_COST, cost.to_string())];
            ("not_found", (headers, error).into_response())
        }
        Err(e) if e.status == StatusCode::NOT_FOUND => ("not_found", e.into_response()),
        Err(e) => ("error", e.into_response()),
    };
    crate::metrics::GETPAGE_SECONDS
        .with_label_values(&[outcome])
        .observe(started.elapsed().as_secs_f64());
    response
}

const X_READ_COST: header::HeaderName = header::HeaderName::from_static("x-read-cost");

async fn get_page_inner(
    state: &SharedState,
    ids: &(String, String),
    uri: &Uri,
) -> ApiResult<(Key, Option<Bytes>, Lsn, read_cost::ReadCost)> {
    let (key, lsn) = page_query(uri)?;
    let timeline = timeline_of(state, ids)?;
    let lsn = lsn.unwrap_or_else(|| timeline.last_record_lsn());
    // Waits as a task, not on a thread: a client that hangs up ends its wait.
    timeline.wait_lsn(lsn, state.conf.wait_lsn_timeout).await?;
    let (page, cost) = read(&state.admissions, move || {
        read_cost::measure(|| timeline.get_page(key, lsn))
    })
    .await?;
    read_cost::record(&cost, 1);
    Ok((key, page?, lsn, cost))
}

/// Scan pages hold this many entries unless the request says otherwise...
const DEFAULT_SCAN_LIMIT: usize = 100;
/// ...and never more than this (about 11 MiB of JSON for 8 KiB pages).
const MAX_SCAN_LIMIT: usize = 1000;

/// The query of a key-range scan page.
struct ScanQuery {
    start: Key,
    end: Key,
    /// `None` for `latest`.
    lsn: Option<Lsn>,
    limit: usize,
    token: Option<ScanToken>,
}

/// `start=K&end=K&lsn=L[&limit=N][&page_token=T]`, in any order; nothing else.
fn scan_query(uri: &Uri) -> ApiResult<ScanQuery> {
    let (mut start, mut end, mut lsn, mut limit, mut token) = (None, None, None, None, None);
    let known = ["start", "end", "lsn", "limit", "page_token"];
    for (name, value) in query_params(uri, &known, "start, end, lsn, limit and page_token")? {
        let value = value.as_str();
        match name {
            "start" => start = Some(key_param(name, value)?),
            "end" => end = Some(key_param(name, value)?),
            "lsn" => lsn = Some(lsn_param(value)?),
            "limit" => {
                let n = value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_SCAN_LIMIT).contains(n))
                    .ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "query parameter limit: `{}` is not a number from 1 to {MAX_SCAN_LIMIT}",
                            value.chars().take(40).collect::<String>()
                        ))
                    })?;
                limit = Some(n);
            }
            _ => {
                token = Some(
                    ScanToken::decode(value).map_err(|e| ApiError::bad_request(e.to_string()))?,
                )
            }
        }
    }
    let missing = |name: &str, what: &str| {
        ApiError::bad_request(format!("missing query parameter `{name}` ({what})"))
    };
    let start = start.ok_or_else(|| missing("start", "the first key, 36 hex characters"))?;
    let end = end.ok_or_else(|| missing("end", "the key after the last, 36 hex characters"))?;
    let lsn = lsn.ok_or_else(|| missing("lsn", "an LSN such as 0/16B5A50, or `latest`"))?;
    if start > end {
        return Err(ApiError::bad_request(format!(
            "start {start} is above end {end}"
        )));
    }
    Ok(ScanQuery {
        start,
        end,
        lsn,
        limit: limit.unwrap_or(DEFAULT_SCAN_LIMIT),
        token,
    })
}

/// `GET .../keys`: a page of the keys in `[start, end)` with their pages as of the LSN; see
/// docs/http-api.md and `timeline::scan::cursor_cache`.
pub async fn scan_keys(
    State(state): State<SharedState>,
    Path((tenant_id, timeline_id)): Path<(String, String)>,
    uri: Uri,
) -> ApiResult<Response> {
    let query = scan_query(&uri)?;
    let tenant_id = parse_tenant(&tenant_id)?;
    let timeline_id = parse_timeline(&timeline_id)?;
    if let Some(token) = &query.token {
        token
            .check_request(tenant_id, timeline_id, query.lsn, query.start, query.end)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
    }
    let timeline = state.tenants.get_timeline(tenant_id, timeline_id)?;
    let lsn = match (query.lsn, &query.token) {
        (Some(lsn), _) => lsn,
        (None, Some(token)) => token.lsn,
        (None, None) => timeline.last_record_lsn(),
    };
    timeline.wait_lsn(lsn, state.conf.wait_lsn_timeout).await?;
    let admissions = state.admissions.clone();
    let (body, cost) = read_on_pool(&admissions, move || {
        let request = ScanRequest {
            lsn,
            end: query.end,
            from: match query.token {
                Some(token) => ScanFrom::Token(token),
                None => ScanFrom::Start(query.start),
            },
            limit: query.limit,
        };
        let (result, cost) = read_cost::measure(|| state.scan_cursors.page(&timeline, request));
        // Up to about 11 MiB of JSON: written here, off the async workers.
        let body = result.map(|r| scan_page_body(&r.entries, r.next_page_token.as_deref()));
        (body, cost)
    })
    .await?;
    let body = body?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/json".to_owned()),
            (header::HeaderName::from_static("x-lsn"), lsn.to_string()),
            (
                header::HeaderName::from_static("x-read-cost"),
                cost.to_string(),
            ),
        ],
        body,
    )
        .into_response())
}

pub async fn checkpoint(
    State(state): State<SharedState>,
    Path(ids): Path<(String, String)>,
) -> ApiResult<Json<JsonValue>> {
    let timeline = timeline_of(&state, &ids)?;
    let timeline = blocking(move || {
        timeline.checkpoint()?;
        Ok(timeline)
    })
    .await?;
    Ok(Json(timeline_json(&timeline)))
}

/// `force_images=true|false`: whether image creation images every piece with history above
/// its image, triggers or not.
fn compact_query(uri: &Uri) -> ApiResult<bool> {
    let mut force = false;
    for (_, value) in query_params(uri, &["force_images"], "force_images")? {
        force = match value.as_str() {
            "true" => true,
            "false" => false,
            _ => {
                return Err(ApiError::bad_request(
                    "query parameter force_images: expected true or false",
                ))
            }
        };
    }
    Ok(force)
}

pub async fn compact(
    State(state): State<SharedState>,
    Path(ids): Path<(String, String)>,
    uri: Uri,
) -> ApiResult<Json<JsonValue>> {
    let force_images = compact_query(&uri)?;
    let timeline = timeline_of(&state, &ids)?;
    let (timeline, compaction, images) = blocking(move || {
        let compaction = timeline.compact_l0(2)?;
        let images = timeline.create_images(force_images)?;
        Ok((timeline, compaction, images))
    })
    .await?;
    let mut info = timeline_json(&timeline);
    info["compaction"] = json!({
        "inputs": compaction.inputs,
        "outputs": compaction.outputs,
        "bytes_read": compaction.bytes_read,
        "bytes_written": compaction.bytes_written,
        "materialized": compaction.materialized,
        "waiting_for_images": compaction.waiting_for_images,
    });
    info["image_creation"] = json!({
        "lsn": images.lsn.map(|l| l.to_string()),
        "pieces": images.pieces,
        "pieces_imaged": images.pieces_imaged,
        "layers_written": images.layers_written,
        "images": images.images,
        "bytes_read": images.bytes_read,
        "bytes_written": images.bytes_written,
    });
    Ok(Json(info))
}

pub async fn gc(
    State(state): State<SharedState>,
    Path(ids): Path<(String, String)>,
) -> ApiResult<Json<JsonValue>> {
    let timeline = timeline_of(&state, &ids)?;
    let (timeline, outcome) = blocking(move || {
        // The timeline's branch points are retained by `gc` itself.
        let outcome = timeline.gc(&[])?;
        Ok((timeline, outcome))
    })
    .await?;
    let mut info = timeline_json(&timeline);
    info["gc"] = json!({
        "cutoff": outcome.cutoff.to_string(),
        "layers_removed": outcome.layers_removed,
        "bytes_removed": outcome.bytes_removed,
    });
    Ok(Json(info))
}

pub async fn layer_list(
    State(state): State<SharedState>,
    Path(ids): Path<(String, String)>,
) -> ApiResult<Json<JsonValue>> {
    let timeline = timeline_of(&state, &ids)?;
    let layers: Vec<JsonValue> = timeline.layers().iter().map(layer_json).collect();
    Ok(Json(json!({ "layers": layers })))
}

fn kind_json(k: &KindStats) -> JsonValue {
    json!({
        "accesses": k.accesses,
        "hits": k.hits,
        "misses": k.misses,
        "inserts": k.inserts,
        "evictions": k.evictions,
        "bytes_resident": k.bytes_resident,
    })
}

pub async fn page_cache_stats(State(state): State<SharedState>) -> Json<JsonValue> {
    let stats = state.cache.stats();
    Json(json!({
        "capacity_bytes": stats.capacity_bytes,
        "file_pages": kind_json(&stats.file_pages),
        "index_pages": kind_json(&stats.index_pages),
        "materialized_pages": kind_json(&stats.materialized_pages),
        "inserts_refused": stats.inserts_refused,
        "inserts_duplicate": stats.inserts_duplicate,
        "miss_waits": stats.miss_waits,
        "pinned_pages": stats.pinned_pages,
    }))
}

pub async fn page_cache_drop(State(state): State<SharedState>) -> Json<JsonValue> {
    let dropped = state.cache.drop_unpinned();
    Json(json!({
        "file_pages": dropped.file_pages,
        "index_pages": dropped.index_pages,
        "materialized_pages": dropped.materialized_pages,
    }))
}

/// On the blocking pool: a page of thousands of timelines takes milliseconds of CPU to render,
/// which the async workers serving reads should not wait behind.
pub async fn metrics(page: Arc<MetricsPage>) -> Result<Response, ApiError> {
    let text = blocking(move || Ok(page.render())).await?;
    Ok(([(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], text).into_response())
}
