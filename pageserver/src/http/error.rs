//! API errors: every failure is a JSON body `{"msg": "..."}` with the status that fits it; a
//! 503 (retrying later may work) also says when, with `Retry-After`.
//!
//! What the storage layers and the read path report is a [`ServeError`], whose kind is mapped
//! to its status here, once ([`status_of`]); what only HTTP can get wrong (a body over its
//! limit, a method a route does not take) is an [`ApiError`] with its status from the start.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::serving::error::{redact_paths, ErrorKind, ServeError};
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

/// The HTTP status of an error kind.
pub fn status_of(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::BadRequest => StatusCode::BAD_REQUEST,
        ErrorKind::Unauthenticated => StatusCode::UNAUTHORIZED,
        ErrorKind::Forbidden => StatusCode::FORBIDDEN,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Conflict => StatusCode::CONFLICT,
        ErrorKind::Gone => StatusCode::GONE,
        ErrorKind::Unprocessable => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorKind::TryAgain => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::Upstream => StatusCode::BAD_GATEWAY,
        ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl From<ServeError> for ApiError {
    fn from(e: ServeError) -> ApiError {
        ApiError::new(status_of(e.kind), e.msg)
    }
}

// The storage layers' errors reach a handler's `?` through their kind.
macro_rules! through_kind {
    ($($error:ty),*) => {$(
        impl From<$error> for ApiError {
            fn from(e: $error) -> ApiError {
                ServeError::from(e).into()
            }
        }
    )*};
}
through_kind!(TimelineError, TenantError, Busy, DownloadError);

#[cfg(test)]
mod tests {
    use super::*;

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
