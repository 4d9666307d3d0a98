//! A `GetPages` stream: pipelined batches read concurrently and answered as each is read.
//!
//! One task per stream ([`serve_batches`]) takes the client's batches and reads up to
//! [`MAX_BATCHES_IN_FLIGHT`] at once; their answers go to the response stream through a queue of
//! one. What the stream holds is bounded in bytes ([`super::budget`]): a batch is taken only
//! while its stream's answers and its connection's are under their budgets, and its answer
//! stays counted from then until h2 has written its last byte. While over budget the task reads
//! no further request (it holds at most one, read and waiting for room), so a client that does
//! not read its answers, or grants no flow-control window, stops being read from: its requests
//! wait in HTTP/2 flow control on its side. Backpressure, not buffering.
//!
//! The stream ends when the client closes its side and every batch is answered, when the client
//! goes away, with the client's malformed message, or at shutdown, even if the client stopped
//! reading: then with UNAVAILABLE after the answers already queued.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use futures::stream::{FuturesUnordered, Stream, StreamExt};
use page_api::proto;
use page_api::{key_from_wire, lsn_from_wire};
use pageserver_api::Key;
use prost::Message;
use tokio::sync::{mpsc, oneshot, watch};
use tonic::{Code, Status, Streaming};
use utils::Lsn;

use super::budget::{AnswerBudget, Held};
use super::calls::{cost_to_wire, record_call, TimelineIds};
use super::{status_of, PageServiceState};
use crate::io::read_cost::ReadCost;
use crate::serving::error::ServeError;
use crate::tenant::timeline::Timeline;

/// Batches of one `GetPages` stream read at once; the stream's further requests wait.
pub const MAX_BATCHES_IN_FLIGHT: usize = 16;

/// What an answer is counted at before it is read: its pages at 8 KiB each (a relation block),
/// with their field headers and LSNs.
fn answer_estimate(pages: usize) -> usize {
    const PER_PAGE: usize = crate::PAGE_SZ + 32;
    const PER_ANSWER: usize = 256;
    if page_api::check_batch_size(pages).is_ok() {
        PER_ANSWER + pages * PER_PAGE
    } else {
        // Refused whole: the answer is an error message.
        PER_ANSWER
    }
}

/// The answers of a `GetPages` stream, as tonic sends them.
pub type GetPagesStream =
    Pin<Box<dyn Stream<Item = Result<proto::GetPagesResponse, Status>> + Send>>;

/// Serves a `GetPages` stream whose token and timeline were checked: returns its answers.
pub fn serve(
    state: Arc<PageServiceState>,
    ids: TimelineIds,
    inbound: Streaming<proto::GetPagesRequest>,
    budget: AnswerBudget,
    shutdown: watch::Receiver<bool>,
) -> GetPagesStream {
    // One answer queued; its bytes are counted (each answer carries its `Held`).
    let (answers, queued) = mpsc::channel(1);
    // How the stream ends when it ends with an error: after every answer already queued,
    // whether or not there was room to queue the error itself.
    let (end, ended) = oneshot::channel::<Status>();
    tokio::spawn(serve_batches(
        state,
        ids,
        inbound,
        budget,
        Outbox { answers, end },
        shutdown,
    ));
    Box::pin(AnswerStream {
        queued,
        ended: Some(ended),
        sent: None,
    })
}

/// An answer and the bytes it is counted at.
struct Answer {
    response: proto::GetPagesResponse,
    held: Held,
}

/// Where a stream's answers go, and the status it ends with if it ends with an error.
struct Outbox {
    answers: mpsc::Sender<Answer>,
    end: oneshot::Sender<Status>,
}

/// The response stream: the queued answers, then the error status if there is one.
struct AnswerStream {
    queued: mpsc::Receiver<Answer>,
    ended: Option<oneshot::Receiver<Status>>,
    /// The count of the answer handed to tonic last, kept until tonic asks for the next one:
    /// by then it has encoded that answer and handed it to h2, where the response body's
    /// charge counts its bytes (see [`super::budget`]).
    sent: Option<Held>,
}

impl Stream for AnswerStream {
    type Item = Result<proto::GetPagesResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.sent = None;
        match self.queued.poll_recv(cx) {
            Poll::Ready(Some(Answer { response, held })) => {
                self.sent = Some(held);
                return Poll::Ready(Some(Ok(response)));
            }
            Poll::Ready(None) => {}
            Poll::Pending => return Poll::Pending,
        }
        let Some(ended) = self.ended.as_mut() else {
            return Poll::Ready(None);
        };
        let status = std::task::ready!(Pin::new(ended).poll(cx));
        self.ended = None;
        Poll::Ready(status.ok().map(Err))
    }
}

/// Reads a stream's batches, up to [`MAX_BATCHES_IN_FLIGHT`] at once and as its budget allows,
/// and sends each answer as soon as it is ready (see the module documentation).
async fn serve_batches(
    state: Arc<PageServiceState>,
    ids: TimelineIds,
    mut inbound: Streaming<proto::GetPagesRequest>,
    budget: AnswerBudget,
    outbox: Outbox,
    shutdown: watch::Receiver<bool>,
) {
    let Outbox { answers, end } = outbox;
    let shutting_down = || Status::unavailable("the pageserver is shutting down");
    let mut in_flight = FuturesUnordered::new();
    // A batch read from the client and waiting for room in the budget.
    let mut waiting: Option<proto::GetPagesRequest> = None;
    let mut open = true;
    while open || waiting.is_some() || !in_flight.is_empty() {
        let estimate = waiting
            .as_ref()
            .map_or(0, |b| answer_estimate(b.pages.len()));
        tokio::select! {
            // Shutdown first, whatever else is ready.
            biased;
            _ = super::stopping(shutdown.clone()) => {
                // Not a send to await: a client that reads nothing must not hold the shutdown
                // up. The status follows the answers already queued.
                let _ = end.send(shutting_down());
                return;
            }
            _ = answers.closed() => return,
            held = budget.admit(estimate),
                if waiting.is_some() && in_flight.len() < MAX_BATCHES_IN_FLIGHT =>
            {
                if let Some(batch) = waiting.take() {
                    in_flight.push(read_batch(state.clone(), ids, batch, held));
                }
            }
            message = inbound.message(), if open && waiting.is_none() => {
                match message {
                    Ok(Some(batch)) => waiting = Some(batch),
                    Ok(None) => open = false,
                    // A malformed message or a broken connection: nothing more can be read,
                    // and the batches in flight are dropped unanswered.
                    Err(status) => {
                        let _ = end.send(status);
                        return;
                    }
                }
            }
            Some(answer) = in_flight.next(), if !in_flight.is_empty() => {
                tokio::select! {
                    biased;
                    _ = super::stopping(shutdown.clone()) => {
                        let _ = end.send(shutting_down());
                        return;
                    }
                    sent = answers.send(answer) => {
                        if sent.is_err() {
                            // The client is gone; its batches' reads on the blocking pool
                            // finish without it.
                            return;
                        }
                    }
                }
            }
        }
    }
}

/// One batch's answer, its pages or the error that failed it, counted at its encoded size.
async fn read_batch(
    state: Arc<PageServiceState>,
    ids: TimelineIds,
    batch: proto::GetPagesRequest,
    mut held: Held,
) -> Answer {
    let started = Instant::now();
    let id = batch.id;
    crate::metrics::GRPC_BATCH_PAGES.observe(batch.pages.len() as f64);
    let result = match state.reads.timeline(ids.0, ids.1) {
        Ok(timeline) => read_batch_inner(&state, timeline, batch).await,
        Err(e) => Err(e),
    };
    let response = match result {
        Ok((pages, cost)) => {
            record_call("GetPages", Code::Ok, started);
            proto::GetPagesResponse {
                id,
                pages,
                cost: Some(cost_to_wire(&cost)),
                error: None,
            }
        }
        Err(e) => {
            let status = status_of(e);
            record_call("GetPages", status.code(), started);
            proto::GetPagesResponse {
                id,
                pages: Vec::new(),
                cost: None,
                error: Some(proto::Error {
                    code: status.code() as i32,
                    message: status.message().to_owned(),
                }),
            }
        }
    };
    // Its gRPC frame: a flag byte and a 4-byte length before the message.
    held.resize(5 + response.encoded_len());
    Answer { response, held }
}

async fn read_batch_inner(
    state: &PageServiceState,
    timeline: Arc<Timeline>,
    batch: proto::GetPagesRequest,
) -> Result<(Vec<proto::PageResult>, ReadCost), ServeError> {
    page_api::check_batch_size(batch.pages.len())
        .map_err(|e| ServeError::bad_request(e.to_string()))?;
    let requests = batch
        .pages
        .iter()
        .enumerate()
        .map(|(i, page)| {
            let key = key_from_wire(&page.key)
                .map_err(|e| ServeError::bad_request(format!("pages[{i}].{e}")))?;
            Ok((key, lsn_from_wire(page.lsn)))
        })
        .collect::<Result<Vec<(Key, Option<Lsn>)>, ServeError>>()?;
    let answer = state.reads.pages(timeline, requests).await?;
    let results = answer
        .pages
        .into_iter()
        .map(|(page, lsn)| proto::PageResult {
            found: page.is_some(),
            page: page.unwrap_or_default(),
            lsn: lsn.0,
        })
        .collect();
    Ok((results, answer.cost))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn the_estimate_covers_a_batch_of_relation_pages() {
        let pages = (0..page_api::MAX_BATCH_PAGES as u64)
            .map(|n| proto::PageResult {
                found: true,
                page: Bytes::from(vec![1u8; crate::PAGE_SZ]),
                lsn: u64::MAX - n,
            })
            .collect();
        let answer = proto::GetPagesResponse {
            id: u64::MAX,
            pages,
            cost: Some(proto::ReadCost {
                layers: u32::MAX,
                idx_hit: u32::MAX,
                idx_miss: u32::MAX,
                val_hit: u32::MAX,
                val_miss: u32::MAX,
                ios: u32::MAX,
                bytes: u64::MAX,
                waits: u32::MAX,
                downloads: u32::MAX,
            }),
            error: None,
        };
        let estimate = answer_estimate(page_api::MAX_BATCH_PAGES);
        assert!(5 + answer.encoded_len() <= estimate, "{estimate}");
        assert!(estimate < (page_api::MAX_BATCH_PAGES * crate::PAGE_SZ) * 101 / 100);
        assert_eq!(
            answer_estimate(0),
            answer_estimate(page_api::MAX_BATCH_PAGES + 1)
        );
    }
}
