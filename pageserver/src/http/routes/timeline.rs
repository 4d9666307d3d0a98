//! A tenant's timelines: list, create (a new timeline, or a branch of one at an LSN), one,
//! delete; a timeline's layers; and the timeline info JSON that these and the maintenance
//! routes answer with.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value as JsonValue};
use utils::Lsn;

use super::residence::Residence;
use super::{json_body, parse_tenant, parse_timeline, timeline_of, ApiResult};
use crate::http::error::ApiError;
use crate::http::{blocking, SharedState};
use crate::serving::error::redact_paths;
use crate::tenant::mgr::TenantState;
use crate::tenant::timeline::layer_set::manifest::LayerLevel;
use crate::tenant::timeline::{LayerDescription, LayerKind, Timeline};
use crate::walreceiver::replay_plan;

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

pub(super) fn timeline_json(timeline: &Timeline) -> JsonValue {
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
    Residence::of([timeline]).add_to(&mut info);
    info
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
    let receivers = state.receivers.clone();
    let timeline = blocking(move || {
        Ok(match ancestor {
            Some(ancestor) => {
                // Past the ancestor's last record: as far as its WAL streamed in is durable.
                let wal_end = match start_lsn {
                    Some(lsn) => tenant
                        .get_timeline(ancestor)
                        .ok()
                        .filter(|t| lsn > t.last_record_lsn())
                        .and_then(|t| {
                            let flushed = receivers
                                .state(t.tenant_id(), t.timeline_id())
                                .and_then(|s| s.flushed_lsn);
                            replay_plan::durable_end(&t, flushed)
                        }),
                    None => None,
                };
                tenant.create_branch_within(id, ancestor, start_lsn, wal_end)?
            }
            None => tenant.create_timeline(id)?,
        })
    })
    .await?;
    Ok((StatusCode::CREATED, Json(timeline_json(&timeline))))
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
    let receivers = state.receivers.clone();
    blocking(move || {
        receivers.stop_timeline(tenant.id(), id);
        Ok(tenant.delete_timeline(id)?)
    })
    .await?;
    Ok(Json(json!({})))
}

pub async fn layer_list(
    State(state): State<SharedState>,
    Path(ids): Path<(String, String)>,
) -> ApiResult<Json<JsonValue>> {
    let timeline = timeline_of(&state, &ids)?;
    let layers: Vec<JsonValue> = timeline.layers().iter().map(layer_json).collect();
    Ok(Json(json!({ "layers": layers })))
}

/// The body of `POST .../lsn_lease`.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LsnLeaseRequest {
    lsn: Option<String>,
}

/// `POST .../lsn_lease {"lsn": X}`: GC keeps what a restore or a branch at `X` needs for
/// `lsn_lease_length` (`timeline::lsn_lease`); taken again, the lease is extended.
pub async fn lsn_lease(
    State(state): State<SharedState>,
    Path(ids): Path<(String, String)>,
    body: Body,
) -> ApiResult<Json<JsonValue>> {
    let request: LsnLeaseRequest = json_body(body).await?;
    let timeline = timeline_of(&state, &ids)?;
    let lsn: Lsn = request
        .lsn
        .ok_or_else(|| ApiError::bad_request("the body must be {\"lsn\": \"X/X\"}"))?
        .parse()
        .map_err(|e| ApiError::bad_request(format!("lsn: {e}")))?;
    let length = state.conf.lsn_lease_length;
    let until = std::time::Instant::now() + length;
    timeline.lease_lsn_until(lsn, until)?;
    let valid_until = std::time::SystemTime::now() + length;
    Ok(Json(json!({
        "lsn": lsn.to_string(),
        "valid_until": humantime::format_rfc3339_millis(valid_until).to_string(),
    })))
}
