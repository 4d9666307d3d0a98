//! The page service's calls (see the module above for what they share).

use std::sync::Arc;
use std::time::Instant;

use page_api::proto::{self, page_service_server};
use page_api::{key_from_wire, lsn_from_wire, rel_from_wire, TENANT_ID_HEADER, TIMELINE_ID_HEADER};
use pageserver_api::datadir::{decode_rel_size, RelTag};
use tokio::sync::watch;
use tonic::metadata::MetadataMap;
use tonic::{Code, Request, Response, Status, Streaming};
use utils::{Lsn, TenantId, TimelineId};

use super::budget::AnswerBudget;
use super::get_pages::{self, GetPagesStream};
use super::{status_of, PageServiceState};
use crate::http::error::ApiError;
use crate::http::read;
use crate::io::read_cost::{self, ReadCost};
use crate::tenant::timeline::Timeline;

/// The service; one per server, shared by every connection.
pub struct PageService {
    state: Arc<PageServiceState>,
    /// Turns true when the server shuts down: open `GetPages` streams end then.
    shutdown: watch::Receiver<bool>,
}

impl PageService {
    pub fn new(state: Arc<PageServiceState>, shutdown: watch::Receiver<bool>) -> PageService {
        PageService { state, shutdown }
    }

    /// The timeline a call's metadata names, once its token allows it.
    fn timeline_of(&self, metadata: &MetadataMap) -> Result<Arc<Timeline>, ApiError> {
        let ids = self.timeline_ids(metadata)?;
        self.state.timeline(ids)
    }

    /// The tenant and timeline a call's metadata names, once its token allows them.
    fn timeline_ids(&self, metadata: &MetadataMap) -> Result<TimelineIds, ApiError> {
        let tenant: TenantId = parse_id(metadata, TENANT_ID_HEADER)?;
        if let Some(auth) = &self.state.auth {
            let authorization = match metadata.get("authorization") {
                None => None,
                Some(value) => Some(value.to_str().map_err(|_| {
                    ApiError::new(
                        axum::http::StatusCode::UNAUTHORIZED,
                        "malformed authorization metadata: not ASCII",
                    )
                })?),
            };
            auth.check_tenant(authorization, tenant)?;
        }
        let timeline: TimelineId = parse_id(metadata, TIMELINE_ID_HEADER)?;
        Ok((tenant, timeline))
    }
}

pub(super) type TimelineIds = (TenantId, TimelineId);

impl PageServiceState {
    /// The timeline, as it is now: looked up for every call and every batch (as HTTP looks it
    /// up for every request), so that a stream opened before a detach, a re-attach or a
    /// deletion never reads a timeline object that is no longer the tenant's.
    pub(super) fn timeline(
        &self,
        (tenant, timeline): TimelineIds,
    ) -> Result<Arc<Timeline>, ApiError> {
        Ok(self.tenants.get_timeline(tenant, timeline)?)
    }
}

/// An id from metadata `name`.
fn parse_id<T>(metadata: &MetadataMap, name: &str) -> Result<T, ApiError>
where
    T: std::str::FromStr<Err = utils::id::IdParseError>,
{
    let value = metadata
        .get(name)
        .ok_or_else(|| ApiError::bad_request(format!("missing metadata `{name}`")))?;
    let text = value
        .to_str()
        .map_err(|_| ApiError::bad_request(format!("metadata `{name}`: not ASCII")))?;
    text.parse().map_err(|e: utils::id::IdParseError| {
        ApiError::bad_request(format!("metadata `{name}`: {e}"))
    })
}

/// Records a call's outcome and latency, and turns its error into a status.
fn finish<T>(
    method: &'static str,
    started: Instant,
    result: Result<T, ApiError>,
) -> Result<Response<T>, Status> {
    let result = result.map_err(status_of);
    let code = match &result {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    };
    record_call(method, code, started);
    result.map(Response::new)
}

pub(super) fn record_call(method: &'static str, code: Code, started: Instant) {
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

/// The LSN a wire `lsn` asks for: itself, or the latest for 0.
fn read_lsn(timeline: &Timeline, wire: u64) -> Lsn {
    lsn_from_wire(wire).unwrap_or_else(|| timeline.last_record_lsn())
}

/// The relation fork and LSN of a `GetRelSize` or `RelExists` request.
fn rel_and_lsn(
    timeline: &Timeline,
    rel: Option<&proto::RelTag>,
    lsn: u64,
) -> Result<(RelTag, Lsn), ApiError> {
    let rel = rel_from_wire(rel).map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok((rel, read_lsn(timeline, lsn)))
}

pub(super) fn cost_to_wire(cost: &ReadCost) -> proto::ReadCost {
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

fn rel_text(rel: &RelTag) -> String {
    format!(
        "relation {}/{}/{} fork {}",
        rel.spcnode, rel.dbnode, rel.relnode, rel.forknum
    )
}

#[tonic::async_trait]
impl page_service_server::PageService for PageService {
    async fn ping(
        &self,
        request: Request<proto::PingRequest>,
    ) -> Result<Response<proto::PingResponse>, Status> {
        let started = Instant::now();
        let id = request.into_inner().id;
        finish("Ping", started, Ok(proto::PingResponse { id }))
    }

    async fn get_page(
        &self,
        request: Request<proto::GetPageRequest>,
    ) -> Result<Response<proto::GetPageResponse>, Status> {
        let started = Instant::now();
        let result = self.get_page_inner(request).await;
        finish("GetPage", started, result)
    }

    type GetPagesStream = GetPagesStream;

    async fn get_pages(
        &self,
        request: Request<Streaming<proto::GetPagesRequest>>,
    ) -> Result<Response<GetPagesStream>, Status> {
        let started = Instant::now();
        // The token and the timeline are checked when the stream opens: a stream for a
        // timeline that does not exist is refused whole.
        let checked = self
            .timeline_ids(request.metadata())
            .and_then(|ids| self.state.timeline(ids).map(|_| ids));
        let ids = match checked {
            Ok(ids) => ids,
            Err(e) => {
                let status = status_of(e);
                record_call("GetPages", status.code(), started);
                return Err(status);
            }
        };
        // The budgets its answers count against, which the server's wrapper of this service
        // made for the stream (see `super::budget`); a fresh pair where there is none.
        let budget = request
            .extensions()
            .get::<AnswerBudget>()
            .cloned()
            .unwrap_or_else(|| self.state.answer_limits.for_new_stream(None));
        Ok(Response::new(get_pages::serve(
            self.state.clone(),
            ids,
            request.into_inner(),
            budget,
            self.shutdown.clone(),
        )))
    }

    async fn get_rel_size(
        &self,
        request: Request<proto::GetRelSizeRequest>,
    ) -> Result<Response<proto::GetRelSizeResponse>, Status> {
        let started = Instant::now();
        let result = async {
            let timeline = self.timeline_of(request.metadata())?;
            let request = request.into_inner();
            let (rel, lsn) = rel_and_lsn(&timeline, request.rel.as_ref(), request.lsn)?;
            match self.rel_size(timeline, rel, lsn).await? {
                Some(blocks) => Ok(proto::GetRelSizeResponse { blocks, lsn: lsn.0 }),
                None => Err(ApiError::not_found(format!(
                    "{} does not exist at {lsn}",
                    rel_text(&rel)
                ))),
            }
        }
        .await;
        finish("GetRelSize", started, result)
    }

    async fn rel_exists(
        &self,
        request: Request<proto::RelExistsRequest>,
    ) -> Result<Response<proto::RelExistsResponse>, Status> {
        let started = Instant::now();
        let result = async {
            let timeline = self.timeline_of(request.metadata())?;
            let request = request.into_inner();
            let (rel, lsn) = rel_and_lsn(&timeline, request.rel.as_ref(), request.lsn)?;
            let exists = self.rel_size(timeline, rel, lsn).await?.is_some();
            Ok(proto::RelExistsResponse { exists, lsn: lsn.0 })
        }
        .await;
        finish("RelExists", started, result)
    }
}

impl PageService {
    async fn get_page_inner(
        &self,
        request: Request<proto::GetPageRequest>,
    ) -> Result<proto::GetPageResponse, ApiError> {
        let timeline = self.timeline_of(request.metadata())?;
        let request = request.into_inner();
        let key = key_from_wire(&request.key).map_err(|e| ApiError::bad_request(e.to_string()))?;
        let lsn = read_lsn(&timeline, request.lsn);
        timeline.wait_lsn(lsn, self.state.wait_lsn_timeout).await?;
        let (page, cost) = read(&self.state.admissions, move || {
            read_cost::measure(|| timeline.get_page(key, lsn))
        })
        .await?;
        read_cost::record(&cost, 1);
        let page = page?;
        let page = page.ok_or_else(|| ApiError::no_version(key, lsn))?;
        Ok(proto::GetPageResponse {
            page,
            lsn: lsn.0,
            cost: Some(cost_to_wire(&cost)),
        })
    }

    /// The size of `rel` at `lsn`, `None` if the fork does not exist there.
    async fn rel_size(
        &self,
        timeline: Arc<Timeline>,
        rel: RelTag,
        lsn: Lsn,
    ) -> Result<Option<u32>, ApiError> {
        timeline.wait_lsn(lsn, self.state.wait_lsn_timeout).await?;
        let value = read(&self.state.admissions, move || {
            timeline.get_page(rel.size_key(), lsn)
        })
        .await??;
        value
            .map(|bytes| {
                decode_rel_size(&bytes).map_err(|e| {
                    ApiError::internal(format!("the stored size of {}: {e}", rel_text(&rel)))
                })
            })
            .transpose()
    }
}
