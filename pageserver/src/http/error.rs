//! API errors: every failure is a JSON body `{"msg": "..."}` with the status that fits it.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

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
        (self.status, Json(serde_json::json!({ "msg": self.msg }))).into_response()
    }
}

/// The status that fits a timeline error.
fn timeline_status(e: &TimelineError) -> StatusCode {
    use TimelineError::*;
    match e {
        // The request contradicts the timeline's history.
        LsnDurable { .. } | LsnNotAdvancing { .. } => StatusCode::CONFLICT,
        // The batch itself is malformed.
        BatchLsnBackwards { .. }
        | BatchDuplicate { .. }
        | ValueTooLarge { .. }
        | ValueNotEncodable { .. }
        | PageTooLarge { .. }
        | Reserved { .. }
        | BatchSpanTooWide { .. } => StatusCode::BAD_REQUEST,
        // Retrying later may succeed.
        LsnNotYetIngested { .. }
        | WaitLsnTimeout { .. }
        | TooManyLsnWaiters { .. }
        | Broken { .. }
        | ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
        Put(_)
        | Get(_)
        | Freeze(_)
        | Flush(_)
        | Layer(_)
        | Metadata(_)
        | LayerSet { .. }
        | Redo { .. }
        | Io { .. } => StatusCode::INTERNAL_SERVER_ERROR,
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
            TenantError::TenantNotFound(_) | TenantError::TimelineNotFound { .. } => {
                StatusCode::NOT_FOUND
            }
            TenantError::TenantExists(_) | TenantError::TimelineExists { .. } => {
                StatusCode::CONFLICT
            }
            TenantError::TenantBroken { .. } | TenantError::ShuttingDown => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            TenantError::Io { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            TenantError::Timeline(inner) => timeline_status(inner),
        };
        ApiError::new(status, e.to_string())
    }
}
