//! The tenants' routes: list, create, one, delete, attach from remote storage, detach.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value as JsonValue};
use utils::Generation;

use super::residence::Residence;
use super::{json_body, parse_tenant, ApiResult};
use crate::http::error::ApiError;
use crate::http::{blocking, SharedState};
use crate::serving::error::redact_paths;
use crate::tenant::mgr::{Tenant, TenantState};

pub(super) fn tenant_json(tenant: &Tenant) -> JsonValue {
    let (state, reason) = match tenant.state() {
        TenantState::Active => ("Active", None),
        TenantState::Broken { reason } => ("Broken", Some(redact_paths(reason))),
    };
    let timelines = tenant.list_timelines();
    let mut info = json!({
        "id": tenant.id().to_string(),
        "generation": tenant.generation().get(),
        "state": state,
        "broken_reason": reason,
        "timelines": timelines.len(),
    });
    Residence::of(timelines.iter().map(|t| &**t)).add_to(&mut info);
    info
}

pub async fn tenant_list(State(state): State<SharedState>) -> Json<JsonValue> {
    let tenants = state.tenants.list_tenants();
    Json(JsonValue::Array(
        tenants.iter().map(|t| tenant_json(t)).collect(),
    ))
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantCreateRequest {
    new_tenant_id: Option<String>,
}

pub async fn tenant_create(
    State(state): State<SharedState>,
    body: Body,
) -> ApiResult<(StatusCode, Json<JsonValue>)> {
    let request: TenantCreateRequest = json_body(body).await?;
    let id = request
        .new_tenant_id
        .as_deref()
        .map(parse_tenant)
        .transpose()?;
    let tenants = state.tenants.clone();
    let tenant = blocking(move || Ok(tenants.create_tenant(id)?)).await?;
    Ok((StatusCode::CREATED, Json(tenant_json(&tenant))))
}

pub async fn tenant_info(
    State(state): State<SharedState>,
    Path(tenant_id): Path<String>,
) -> ApiResult<Json<JsonValue>> {
    let tenant = state.tenants.get_tenant(parse_tenant(&tenant_id)?)?;
    Ok(Json(tenant_json(&tenant)))
}

pub async fn tenant_delete(
    State(state): State<SharedState>,
    Path(tenant_id): Path<String>,
) -> ApiResult<Json<JsonValue>> {
    let id = parse_tenant(&tenant_id)?;
    let tenants = state.tenants.clone();
    let receivers = state.receivers.clone();
    blocking(move || {
        receivers.stop_tenant(id);
        Ok(tenants.delete_tenant(id)?)
    })
    .await?;
    Ok(Json(json!({})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantAttachRequest {
    generation: u32,
}

/// Attaches a tenant from remote storage (`tenant::mgr::attach`).
pub async fn tenant_attach(
    State(state): State<SharedState>,
    Path(tenant_id): Path<String>,
    body: Body,
) -> ApiResult<(StatusCode, Json<JsonValue>)> {
    // The body first (see `timeline_create`).
    let request: Option<TenantAttachRequest> = json_body(body).await?;
    let id = parse_tenant(&tenant_id)?;
    let request = request.ok_or_else(|| {
        ApiError::bad_request("the body must be {\"generation\": N}, N from 1 up".to_owned())
    })?;
    let generation = Generation::new(request.generation)
        .ok_or_else(|| ApiError::bad_request("generation must be 1 or more".to_owned()))?;
    let tenants = state.tenants.clone();
    let tenant = blocking(move || Ok(tenants.attach_tenant(id, generation)?)).await?;
    // The WAL receivers the remote index named stream on here. Off the async workers: a start
    // reads the timeline, which may download a layer.
    let (receivers, timelines) = (state.receivers.clone(), tenant.list_timelines());
    blocking(move || {
        for timeline in timelines {
            if let Err(e) = receivers.resume(timeline.clone()) {
                tracing::error!(tenant = %timeline.tenant_id(), timeline = %timeline.timeline_id(),
                    "the attached timeline's WAL receiver settings cannot be used, so it does not start: {e}");
            }
        }
        Ok(())
    })
    .await?;
    Ok((StatusCode::CREATED, Json(tenant_json(&tenant))))
}

/// Uploads everything of a tenant, then removes its local copy (`tenant::mgr::attach`).
pub async fn tenant_detach(
    State(state): State<SharedState>,
    Path(tenant_id): Path<String>,
) -> ApiResult<Json<JsonValue>> {
    let id = parse_tenant(&tenant_id)?;
    let tenants = state.tenants.clone();
    let receivers = state.receivers.clone();
    blocking(move || {
        // Stopped first, so that the WAL they stored is uploaded with the rest.
        receivers.stop_tenant(id);
        let detached = tenants.detach_tenant(id);
        if detached.is_err() {
            // Still attached here, serving as before: its receivers too.
            for timeline in tenants.get_tenant(id).map(|t| t.list_timelines()).unwrap_or_default() {
                if let Err(e) = receivers.resume(timeline) {
                    tracing::error!(tenant = %id, "a WAL receiver does not restart after a failed detach: {e}");
                }
            }
        }
        Ok(detached?)
    })
    .await?;
    Ok(Json(json!({})))
}
