//! What an operator or a test forces that the background loops would do in their own time: a
//! timeline's checkpoint (freeze and flush), compaction with image creation, and GC, each
//! answering with the timeline info and what the step did; failpoints, in a build with the
//! `testing` feature; and the page cache's counters, and dropping its unpinned pages.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::Uri;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value as JsonValue};

use super::timeline::timeline_json;
use super::{bool_query, read_body, timeline_of, ApiResult};
use crate::http::body_limits::MAX_JSON_BODY;
use crate::http::error::ApiError;
use crate::http::{blocking, SharedState};
use crate::page_cache::KindStats;

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

pub async fn compact(
    State(state): State<SharedState>,
    Path(ids): Path<(String, String)>,
    uri: Uri,
) -> ApiResult<Json<JsonValue>> {
    // Whether image creation images every piece with history above its image, triggers or not.
    let force_images = bool_query(&uri, "force_images")?;
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
