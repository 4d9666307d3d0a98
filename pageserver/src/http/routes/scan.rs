//! Paged key-range scans: `GET .../keys` answers a page of the keys in `[start, end)` with their
//! pages as of an LSN, and a token to continue from. The cursor cache keeps the scan's state
//! between pages (`timeline::scan::cursor_cache`) and says where the next page starts; the
//! token is that position's wire form ([`token`]), and the page's JSON is written by [`body`].

use axum::extract::{Path, State};
use axum::http::{header, Uri};
use axum::response::{IntoResponse, Response};
use pageserver_api::Key;
use utils::Lsn;

use super::{key_param, lsn_param, parse_tenant, parse_timeline, query_params, ApiResult};
use crate::http::error::ApiError;
use crate::http::SharedState;
use crate::tenant::timeline::scan::cursor_cache::{ScanFrom, ScanPosition, ScanRequest};
use body::scan_page_body;

pub mod body;
pub mod token;

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
    /// The decoded `page_token`: where the previous page ended.
    token: Option<ScanPosition>,
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
                token =
                    Some(token::decode(value).map_err(|e| ApiError::bad_request(e.to_string()))?)
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
    if let Some(position) = &query.token {
        token::check_request(
            position,
            tenant_id,
            timeline_id,
            query.lsn,
            query.start,
            query.end,
        )
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    }
    let timeline = state.reads.timeline(tenant_id, timeline_id)?;
    let lsn = match (query.lsn, &query.token) {
        (Some(lsn), _) => lsn,
        (None, Some(position)) => position.lsn,
        (None, None) => timeline.last_record_lsn(),
    };
    let request = ScanRequest {
        lsn,
        end: query.end,
        from: match query.token {
            Some(position) => ScanFrom::After(position),
            None => ScanFrom::Start(query.start),
        },
        limit: query.limit,
    };
    let (body, cost) = state
        .reads
        .scan_page(timeline, request, |page| {
            let next_page_token = page.next.as_ref().map(token::encode);
            scan_page_body(&page.entries, next_page_token.as_deref())
        })
        .await?;
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
