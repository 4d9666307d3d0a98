//! The page service's calls (see the module above for what they share): each reads its
//! request off the wire, calls the read path ([`crate::serving::read`]) and writes its answer.

use std::sync::Arc;
use std::time::Instant;

use page_api::proto::{self, page_service_server};
use page_api::{key_from_wire, lsn_from_wire, rel_from_wire};
use pageserver_api::datadir::RelTag;
use tokio::sync::watch;
use tonic::metadata::MetadataMap;
use tonic::{Code, Request, Response, Status, Streaming};
use utils::Lsn;

use super::budget::AnswerBudget;
use super::calls::{cost_to_wire, record_call, timeline_ids, TimelineIds};
use super::get_pages::{self, GetPagesStream};
use super::{status_of, PageServiceState};
use crate::serving::error::ServeError;
use crate::serving::read::rel_text;
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

    /// The tenant and timeline a call's metadata names, once its token allows them.
    fn timeline_ids(&self, metadata: &MetadataMap) -> Result<TimelineIds, ServeError> {
        timeline_ids(self.state.auth.as_ref(), metadata)
    }

    /// The timeline a call's metadata names, once its token allows it.
    fn timeline_of(&self, metadata: &MetadataMap) -> Result<Arc<Timeline>, ServeError> {
        let (tenant, timeline) = self.timeline_ids(metadata)?;
        self.state.reads.timeline(tenant, timeline)
    }
}

/// Records a call's outcome and latency, and turns its error into a status.
fn finish<T>(
    method: &'static str,
    started: Instant,
    result: Result<T, ServeError>,
) -> Result<Response<T>, Status> {
    let result = result.map_err(status_of);
    let code = match &result {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    };
    record_call(method, code, started);
    result.map(Response::new)
}

/// The relation fork and LSN (`None`: the latest) of a `GetRelSize` or `RelExists` request.
fn rel_and_lsn(rel: Option<&proto::RelTag>, lsn: u64) -> Result<(RelTag, Option<Lsn>), ServeError> {
    let rel = rel_from_wire(rel).map_err(|e| ServeError::bad_request(e.to_string()))?;
    Ok((rel, lsn_from_wire(lsn)))
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
            .and_then(|(tenant, timeline)| {
                self.state.reads.timeline(tenant, timeline)?;
                Ok((tenant, timeline))
            });
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
            let (rel, lsn) = rel_and_lsn(request.rel.as_ref(), request.lsn)?;
            match self.state.reads.rel_size(timeline, rel, lsn).await? {
                (Some(blocks), lsn) => Ok(proto::GetRelSizeResponse { blocks, lsn: lsn.0 }),
                (None, lsn) => Err(ServeError::not_found(format!(
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
            let (rel, lsn) = rel_and_lsn(request.rel.as_ref(), request.lsn)?;
            let (blocks, lsn) = self.state.reads.rel_size(timeline, rel, lsn).await?;
            Ok(proto::RelExistsResponse {
                exists: blocks.is_some(),
                lsn: lsn.0,
            })
        }
        .await;
        finish("RelExists", started, result)
    }
}

impl PageService {
    async fn get_page_inner(
        &self,
        request: Request<proto::GetPageRequest>,
    ) -> Result<proto::GetPageResponse, ServeError> {
        let timeline = self.timeline_of(request.metadata())?;
        let request = request.into_inner();
        let key =
            key_from_wire(&request.key).map_err(|e| ServeError::bad_request(e.to_string()))?;
        let answer = self
            .state
            .reads
            .page(timeline, key, lsn_from_wire(request.lsn))
            .await?;
        let page = answer
            .page
            .ok_or_else(|| ServeError::no_version(key, answer.lsn))?;
        Ok(proto::GetPageResponse {
            page,
            lsn: answer.lsn.0,
            cost: Some(cost_to_wire(&answer.cost)),
        })
    }
}
