//! The handlers, one file per resource, and the JSON they exchange; the router table that maps
//! paths to them is `super::router`.
//!
//! - `tenant.rs`: tenants (list, create, one, delete, attach, detach);
//! - `timeline.rs`: a tenant's timelines (list, create or branch, one, delete) and a timeline's
//!   layer list;
//! - `page.rs`: page versions in (`POST .../ingest`) and out (`GET .../page`);
//! - `scan.rs`: paged key-range scans (`GET .../keys`), with their page body (`scan/body.rs`)
//!   and the wire format of their page token (`scan/token.rs`);
//! - `maintenance.rs`: what an operator or a test forces that background work would do anyway
//!   (checkpoint, compaction and image creation, GC), failpoints, and the page cache's stats
//!   and drop;
//! - `datadir.rs`: a PostgreSQL data directory's import and basebackup;
//! - `residence.rs`: the layer files on the local disk that tenant and timeline info count;
//! - `wal.rs`: a timeline's WAL receiver, and its WAL files by name.
//!
//! This file holds what they share: parsing ids, query strings and bodies, with the messages
//! each mistake gets; and the server's own status and `/metrics`.

use std::sync::Arc;
use std::time::UNIX_EPOCH;

use axum::body::{Body, Bytes, HttpBody as _};
use axum::extract::{Query, State};
use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::BytesMut;
use pageserver_api::Key;
use serde::de::DeserializeOwned;
use serde_json::{json, Value as JsonValue};
use utils::{Lsn, TenantId, TimelineId};

use super::body_limits::MAX_JSON_BODY;
use super::error::ApiError;
use super::metrics_page::MetricsPage;
use super::{blocking, SharedState};
use crate::tenant::timeline::Timeline;

mod datadir;
mod maintenance;
mod page;
mod residence;
pub mod scan;
mod tenant;
mod timeline;
mod wal;
pub use datadir::{basebackup, import};
pub use maintenance::{checkpoint, compact, failpoints, gc, page_cache_drop, page_cache_stats};
pub use page::{get_page, ingest};
pub use scan::scan_keys;
pub use tenant::*;
pub use timeline::{
    layer_list, lsn_lease, timeline_create, timeline_delete, timeline_info, timeline_list,
};
pub use wal::{
    lsn_by_timestamp, wal_file, wal_receiver_delete, wal_receiver_get, wal_receiver_put,
};

type ApiResult<T> = Result<T, ApiError>;

pub(super) fn parse_tenant(text: &str) -> ApiResult<TenantId> {
    text.parse()
        .map_err(|e: utils::id::IdParseError| ApiError::bad_request(e.to_string()))
}

fn parse_timeline(text: &str) -> ApiResult<TimelineId> {
    text.parse()
        .map_err(|e: utils::id::IdParseError| ApiError::bad_request(e.to_string()))
}

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

/// The query's only parameter, `name`, as `true` or `false`; absent is `false`.
fn bool_query(uri: &Uri, name: &str) -> ApiResult<bool> {
    let mut value = false;
    for (_, text) in query_params(uri, &[name], name)? {
        value = match text.as_str() {
            "true" => true,
            "false" => false,
            _ => {
                return Err(ApiError::bad_request(format!(
                    "query parameter {name}: expected true or false"
                )))
            }
        };
    }
    Ok(value)
}

/// The timeline a data path names.
pub(super) fn timeline_of(
    state: &SharedState,
    (tenant_id, timeline_id): &(String, String),
) -> ApiResult<std::sync::Arc<Timeline>> {
    let tenant = parse_tenant(tenant_id)?;
    let timeline = parse_timeline(timeline_id)?;
    Ok(state.reads.timeline(tenant, timeline)?)
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

/// On the blocking pool: a page of thousands of timelines takes milliseconds of CPU to render,
/// which the async workers serving reads should not wait behind.
pub async fn metrics(page: Arc<MetricsPage>) -> Result<Response, ApiError> {
    let text = blocking(move || Ok(page.render())).await?;
    Ok(([(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], text).into_response())
}
