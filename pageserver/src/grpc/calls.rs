//! What every page service call does at its edges: which tenant and timeline its metadata
//! names, whether its token may read them, and, once it ends, its outcome and latency in the
//! `pageserver_grpc_*` metrics; and a read's cost in its wire form.

use std::time::Instant;

use page_api::proto;
use page_api::{TENANT_ID_HEADER, TIMELINE_ID_HEADER};
use tonic::metadata::MetadataMap;
use tonic::Code;
use utils::{TenantId, TimelineId};

use crate::io::read_cost::ReadCost;
use crate::serving::auth::{Access, JwtAuth};
use crate::serving::error::{ErrorKind, ServeError};

/// The tenant and timeline a call is for.
pub type TimelineIds = (TenantId, TimelineId);

/// The tenant and timeline a call's metadata names, once its token (with `auth` on) allows
/// reading the tenant's data.
pub fn timeline_ids(
    auth: Option<&JwtAuth>,
    metadata: &MetadataMap,
) -> Result<TimelineIds, ServeError> {
    let tenant: TenantId = parse_id(metadata, TENANT_ID_HEADER)?;
    if let Some(auth) = auth {
        let authorization = match metadata.get("authorization") {
            None => None,
            Some(value) => Some(value.to_str().map_err(|_| {
                ServeError::new(
                    ErrorKind::Unauthenticated,
                    "malformed authorization metadata: not ASCII",
                )
            })?),
        };
        auth.check(authorization, Access::Tenant(&tenant.to_string()))?;
    }
    let timeline: TimelineId = parse_id(metadata, TIMELINE_ID_HEADER)?;
    Ok((tenant, timeline))
}

/// An id from metadata `name`.
fn parse_id<T>(metadata: &MetadataMap, name: &str) -> Result<T, ServeError>
where
    T: std::str::FromStr<Err = utils::id::IdParseError>,
{
    let value = metadata
        .get(name)
        .ok_or_else(|| ServeError::bad_request(format!("missing metadata `{name}`")))?;
    let text = value
        .to_str()
        .map_err(|_| ServeError::bad_request(format!("metadata `{name}`: not ASCII")))?;
    text.parse().map_err(|e: utils::id::IdParseError| {
        ServeError::bad_request(format!("metadata `{name}`: {e}"))
    })
}

/// Counts a call (or a `GetPages` batch) that ended with `code`, `started` ago.
pub fn record_call(method: &'static str, code: Code, started: Instant) {
    crate::metrics::GRPC_REQUESTS
        .with_label_values(&[method, code_name(code)])
        .inc();
    crate::metrics::GRPC_REQUEST_SECONDS
        .with_label_values(&[method])
        .observe(started.elapsed().as_secs_f64());
}

/// A code's name as the gRPC specification spells it.
fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// A read's cost as a message carries it.
pub fn cost_to_wire(cost: &ReadCost) -> proto::ReadCost {
    proto::ReadCost {
        layers: cost.layers,
        idx_hit: cost.idx_hit,
        idx_miss: cost.idx_miss,
        val_hit: cost.val_hit,
        val_miss: cost.val_miss,
        ios: cost.ios,
        bytes: cost.bytes,
        waits: cost.waits,
        downloads: cost.downloads,
    }
}
