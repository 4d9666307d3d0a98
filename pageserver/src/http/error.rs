//! API errors: every failure is a JSON body `{"msg": "..."}` with the status that fits it; a
//! 503 (retrying later may work) also says when, with `Retry-After`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::tenant::admission::{Busy, DownloadError};
use crate::tenant::mgr::TenantError;
use crate::tenant::timeline::TimelineError;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub msg: String,
}

impl ApiError {
    pub fn new(status: StatusCode, msg: impl Into<String>) -> ApiError {
        ApiError {
            status,
            msg: msg.into(),
        }
    }

    /// A refusal that will pass (work at its bound): a 503, which says when to come back.
    pub fn try_again(msg: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, msg)
    }

    pub fn bad_request(msg: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, msg)
    }

    pub fn not_found(msg: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, msg)
    }

    /// A page with no version at or below the LSN read at: the same words on every door.
    pub fn no_version(key: pageserver_api::Key, lsn: utils::Lsn) -> ApiError {
        ApiError::not_found(format!("page {key} has no version at or below {lsn}"))
    }

    pub fn internal(msg: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, msg)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // A 500 is a failure of ours; a 503 (a broken tenant, a wait for an LSN that timed
        // out, a shutdown) is expected under its circumstances and already logged where it
        // began.
        if self.status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::error!(
                status = self.status.as_u16(),
                "request failed: {}",
                self.msg
            );
        } else if self.status.is_server_error() {
            tracing::info!(
                status = self.status.as_u16(),
                "request refused: {}",
                self.msg
            );
        }
        // The log has the whole message; the client gets it without the server's paths.
        let msg = if self.status.is_server_error() {
            redact_paths(&self.msg)
        } else {
            self.msg
        };
        let mut response = (self.status, Json(serde_json::json!({ "msg": msg }))).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static(RETRY_AFTER_SECONDS),
            );
        }
        response
    }
}

/// `Retry-After` of every 503: the conditions behind one (a broken tenant loading, a wait
/// for an LSN, an upload queue, a download) are re-checked at each request, and a refused
/// request has already waited its bound on the server, so a second is enough.
pub const RETRY_AFTER_SECONDS: &str = "1";

/// `msg` with every file system path cut down to names the client knows: from the work
/// directory's `tenants/` on (`tenants/<tenant>/timelines/<timeline>/<file>`), or the file name
/// alone for a path elsewhere. Storage errors name files by their whole path, which is what
/// the server's log needs but not what a client should see of the machine.
///
/// A path is a word that starts with `/` or has a `tenants/` component; quotes and brackets
/// around it and punctuation after it stay. LSNs (`0/16B5A50`) are not paths.
pub fn redact_paths(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    let mut rest = msg;
    while !rest.is_empty() {
        let word_end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        let (word, tail) = rest.split_at(word_end);
        let space_end = tail
            .find(|c: char| !c.is_whitespace())
            .unwrap_or(tail.len());
        let (space, tail) = tail.split_at(space_end);
        let core_start = word
            .find(|c: char| !"\"'`([<".contains(c))
            .unwrap_or(word.len());
        let core_len = word[core_start..]
            .trim_end_matches(|c: char| "\"'`)]>,;:.".contains(c))
            .len();
        let core = &word[core_start..core_start + core_len];
        let is_path = (core.starts_with('/') && core.len() > 1)
            || core.starts_with("tenants/")
            || core.contains("/tenants/");
        if is_path {
            out.push_str(&word[..core_start]);
            out.push_str(&client_path(core));
            out.push_str(&word[core_start + core_len..]);
        } else {
            out.push_str(word);
        }
        out.push_str(space);
        rest = tail;
    }
    out
}

fn client_path(path: &str) -> String {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    match parts
        .iter()
        .rposition(|p| *p == crate::tenant::mgr::TENANTS_DIR)
    {
        Some(at) => parts[at..].join("/"),
        None => parts.last().copied().unwrap_or_default().to_owned(),
    }
}

/// The status that fits a timeline error.
fn timeline_status(e: &TimelineError) -> StatusCode {
    use TimelineError::*;
    match e {
        // The request contradicts the timeline's history.
        // ... or another writer's: an import holds the timeline until it finishes.
        LsnDurable { .. } | LsnNotAdvancing { .. } | ImportInProgress => StatusCode::CONFLICT,
        // The batch itself is malformed.
        BatchLsnBackwards { .. }
        | BatchDuplicate { .. }
        | ValueTooLarge { .. }
        | ValueNotEncodable { .. }
        | PageTooLarge { .. }
        | Reserved { .. }
        | BatchSpanTooWide { .. } => StatusCode::BAD_REQUEST,
        // That history is gone for good.
        BelowGcCutoff { .. } => StatusCode::GONE,
        // Retrying later may succeed.
        LsnNotYetIngested { .. }
        | WaitLsnTimeout { .. }
        | TooManyLsnWaiters { .. }
        | IngestStopped { .. }
        // The store takes no uploads for now; the batch was not stored.
        | UploadQueueFull { .. }
        | Broken { .. }
        | ShuttingDown
        // The remote store did not give the layer; it may later.
        | LayerDownload { .. } => StatusCode::SERVICE_UNAVAILABLE,
        Put(_)
        | Get(_)
        | Freeze(_)
        | Flush(_)
        | Layer(_)
        | ImageLayer(_)
        | Metadata(_)
        | ChangeIndeterminate(_)
        | LayerSet { .. }
        | Redo { .. }
        | Io { .. } => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl From<Busy> for ApiError {
    fn from(e: Busy) -> ApiError {
        ApiError::try_again(e.to_string())
    }
}

impl From<DownloadError> for ApiError {
    fn from(e: DownloadError) -> ApiError {
        match e {
            DownloadError::Busy(busy) => busy.into(),
            // The store failed or did not answer in time (its deadlines are remote storage's).
            failed @ DownloadError::Failed { .. } => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, failed.to_string())
            }
        }
    }
}

impl From<TimelineError> for ApiError {
    fn from(e: TimelineError) -> ApiError {
        ApiError::new(timeline_status(&e), e.to_string())
    }
}

impl From<TenantError> for ApiError {
    fn from(e: TenantError) -> ApiError {
        let status = match &e {
            TenantError::TenantNotFound(_)
            | TenantError::TimelineNotFound { .. }
            | TenantError::NotInRemoteStorage(_) => StatusCode::NOT_FOUND,
            TenantError::TenantExists(_)
            | TenantError::TenantBeingDeleted(_)
            | TenantError::TimelineExists { .. }
            | TenantError::TimelineBeingDeleted { .. }
            | TenantError::TimelineHasBranches { .. }
            | TenantError::InvalidBranch { .. }
            | TenantError::GenerationNotNewer { .. } => StatusCode::CONFLICT,
            TenantError::TenantBroken { .. } | TenantError::ShuttingDown => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            TenantError::Io { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            // The store did not answer, or answered with something we cannot use.
            TenantError::Remote(_) | TenantError::AttachedBroken { .. } => StatusCode::BAD_GATEWAY,
            TenantError::Timeline(inner) => timeline_status(inner),
        };
        ApiError::new(status, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_cut_to_the_tenants_names() {
        let tl =
            "tenants/0123456789abcdef0123456789abcdef/timelines/fedcba9876543210fedcba9876543210";
        let cases = [
            (
                format!("/srv/ps/{tl}.___temp: No such file or directory (os error 2)"),
                format!("{tl}.___temp: No such file or directory (os error 2)"),
            ),
            (
                format!("timeline metadata /srv/ps/{tl}/metadata: Permission denied"),
                format!("timeline metadata {tl}/metadata: Permission denied"),
            ),
            (
                format!("layer \"/srv/ps/{tl}/x\" is corrupt"),
                format!("layer \"{tl}/x\" is corrupt"),
            ),
            (
                format!("relative .pageserver/{tl}/metadata."),
                format!("relative {tl}/metadata."),
            ),
            (
                "key file (/etc/keys/auth.pem) unreadable".to_owned(),
                "key file (auth.pem) unreadable".to_owned(),
            ),
            // The workdir itself may be named `tenants`: the last such component counts.
            (
                format!("/home/tenants/x/{tl}/metadata"),
                format!("{tl}/metadata"),
            ),
        ];
        for (from, to) in cases {
            assert_eq!(redact_paths(&from), to);
        }
        // Not paths: LSNs, endpoints' text without a leading slash, a lone slash.
        for text in [
            "timed out after 60s waiting for LSN 0/21; the last ingested LSN is 0/20",
            "a / b",
            "  spaced\tout  ",
        ] {
            assert_eq!(redact_paths(text), text);
        }
    }

    #[test]
    fn only_server_errors_are_redacted() {
        let body = |e: ApiError| {
            let response = e.into_response();
            let bytes = futures_body(response);
            serde_json::from_slice::<serde_json::Value>(&bytes).unwrap()["msg"]
                .as_str()
                .unwrap()
                .to_owned()
        };
        assert_eq!(
            body(ApiError::internal("/srv/x/tenants/t: gone")),
            "tenants/t: gone"
        );
        assert_eq!(
            body(ApiError::not_found("no such endpoint: /v1/nothing")),
            "no such endpoint: /v1/nothing"
        );
    }

    #[test]
    fn every_503_says_when_to_retry() {
        let unavailable = ApiError::from(TimelineError::UploadQueueFull {
            queued_bytes: 2 << 20,
            limit: 1 << 20,
            waited: std::time::Duration::from_secs(30),
            store_error: String::new(),
        });
        assert_eq!(unavailable.status, StatusCode::SERVICE_UNAVAILABLE);
        let response = unavailable.into_response();
        assert_eq!(
            response.headers().get(axum::http::header::RETRY_AFTER),
            Some(&axum::http::HeaderValue::from_static(RETRY_AFTER_SECONDS))
        );
        let other = ApiError::internal("x").into_response();
        assert!(other
            .headers()
            .get(axum::http::header::RETRY_AFTER)
            .is_none());
    }

    fn futures_body(response: Response) -> Vec<u8> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime
            .block_on(axum::body::to_bytes(response.into_body(), 1 << 20))
            .unwrap()
            .to_vec()
    }
}
