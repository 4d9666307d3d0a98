//! The page service for compute: GetPage@LSN over gRPC (`libs/page_api/proto`,
//! docs/grpc-api.md), on its own address beside the HTTP API.
//!
//! A call names its tenant and timeline in metadata, and with auth on carries the same JWT as
//! HTTP, checked by the same rule ([`crate::serving::auth`], access to the tenant's data); a
//! `GetPages` stream does both once, when it opens. Errors are the HTTP API's: the same
//! [`ServeError`] with its message, its kind mapped to a gRPC code by [`status_of`], so a
//! client sees the same words on either door.
//!
//! Reads go through the read path both doors share ([`crate::serving::read`]): the wait for
//! an LSN as a task (a caller that goes away ends it), then the read in place when the page
//! cache can answer it whole, on the blocking pool when it needs the disk. A `GetPages` stream
//! ([`get_pages`]) reads its batches concurrently, up to
//! [`get_pages::MAX_BATCHES_IN_FLIGHT`] of them, and answers each as soon as it is read, so
//! answers overtake each other. Each batch looks its timeline up again, as every HTTP request
//! does, so a stream never reads a timeline that was detached or deleted since it opened. A
//! stream checks its token when it opens; a token that expires later does not end it.
//!
//! What a client can make the server hold is bounded: a connection's streams
//! ([`MAX_STREAMS_PER_CONNECTION`]), a request message ([`MAX_REQUEST_BYTES`]), what a client
//! may send ahead (the receive windows), and, in bytes, the answers a stream and a connection
//! hold until h2 has written them ([`budget`]: settings `grpc_answer_bytes_per_stream` and
//! `grpc_answer_bytes_per_connection`). A stream over its budget reads no more requests, so
//! a client that does not read its answers, or grants no flow-control window, is not read
//! from either: its requests wait on its side.
//!
//! At shutdown, open streams end with UNAVAILABLE after the answers already queued, unary
//! calls run to their end, and the server stops waiting for whatever is still open
//! [`SHUTDOWN_GRACE`] later (a client that reads nothing, so its stream cannot even be told):
//! it flushes and exits, which closes those connections.
//!
//! Beside the page service, on the same address, the standard health service and server
//! reflection ([`conventions`]), which need no token.

pub mod budget;
pub mod calls;
pub mod conventions;
pub mod get_pages;
pub mod handshake;
pub mod incoming;
pub mod service;

use std::sync::Arc;
use std::time::Duration;

use page_api::proto::page_service_server::PageServiceServer;
use tokio::sync::watch;

use self::budget::AnswerLimits;
use crate::serving::auth::JwtAuth;
use crate::serving::connections::ConnectionLimit;
use crate::serving::error::{ErrorKind, ServeError};
use crate::serving::read::PageReads;

/// What every call can reach.
pub struct PageServiceState {
    /// The read path (shared with the HTTP API).
    pub reads: Arc<PageReads>,
    pub auth: Option<JwtAuth>,
    /// The bytes of answers a stream, and a connection, may hold.
    pub answer_limits: AnswerLimits,
}

/// How long calls may still run after shutdown began (the HTTP server's grace, too).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// Streams one connection may have open at once.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 256;

/// The largest request message, past which a call ends with OUT_OF_RANGE: a batch of 1024
/// pages is under 34 KiB. tonic buffers a message whole before decoding it, so this bounds what
/// a stream's unfinished message can hold (tonic's default is 4 MiB, a gigabyte over a
/// connection's streams).
pub const MAX_REQUEST_BYTES: usize = 64 << 10;

/// Serves the page service on `listener`, its connections under `connections` (the cap it
/// shares with the HTTP server), each with `handshake_timeout` to send its HTTP/2 handshake,
/// until `shutdown` turns true: see the module documentation for what happens to the calls
/// then.
pub async fn serve(
    listener: tokio::net::TcpListener,
    connections: Arc<ConnectionLimit>,
    handshake_timeout: Duration,
    state: Arc<PageServiceState>,
    shutdown: watch::Receiver<bool>,
) -> Result<Served, tonic::transport::Error> {
    let answer_limits = state.answer_limits;
    let incoming = incoming::incoming(listener, connections, handshake_timeout, answer_limits);
    let health = conventions::health_service(shutdown.clone()).await;
    let (reflection_v1, reflection_v1alpha) = conventions::reflection();
    let page_service = PageServiceServer::new(service::PageService::new(state, shutdown.clone()))
        .max_decoding_message_size(MAX_REQUEST_BYTES);
    let server = tonic::transport::Server::builder()
        // Requests are small: let a client's many of them through without waiting for window
        // updates (what it may send ahead, unread, is at most the connection's window), and
        // keep a dead peer from holding a stream forever. What the server sends waits in h2
        // for the client's window, counted against the answer budgets until it is written.
        .initial_connection_window_size(Some(4 << 20))
        .initial_stream_window_size(Some(1 << 20))
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .max_concurrent_streams(Some(MAX_STREAMS_PER_CONNECTION))
        .add_service(budget::Budgeted::new(page_service, answer_limits))
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .serve_with_incoming_shutdown(incoming, stopping(shutdown.clone()));
    tokio::select! {
        served = server => served.map(|()| Served::Drained),
        () = async {
            stopping(shutdown).await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => {
            tracing::warn!(
                "page service: calls still open {} s after shutdown began were cut off (their \
                 connections close when the process exits)",
                SHUTDOWN_GRACE.as_secs()
            );
            Ok(Served::CutOff)
        }
    }
}

/// How the page service ended, once shutdown began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// Every call ended.
    Drained,
    /// Calls still open at the end of [`SHUTDOWN_GRACE`] were cut off; their connections'
    /// tasks are still in the runtime.
    CutOff,
}

/// Completes when `shutdown` turns true (or its sender is gone).
async fn stopping(mut shutdown: watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stopping| *stopping).await;
}

/// The gRPC status of an error: its kind's code, the same message as HTTP sends (without the
/// server's paths for a failure on our side).
pub fn status_of(e: ServeError) -> tonic::Status {
    use tonic::Code;
    let code = match e.kind {
        ErrorKind::BadRequest => Code::InvalidArgument,
        ErrorKind::Unauthenticated => Code::Unauthenticated,
        ErrorKind::Forbidden => Code::PermissionDenied,
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::Conflict => Code::FailedPrecondition,
        // History below the GC cutoff: gone for good, unlike a state that may change.
        ErrorKind::Gone => Code::OutOfRange,
        // The page is stored as WAL records at that LSN; an earlier LSN answers.
        ErrorKind::Unprocessable => Code::FailedPrecondition,
        ErrorKind::TryAgain | ErrorKind::Upstream => Code::Unavailable,
        ErrorKind::Internal => Code::Internal,
    };
    if code == Code::Internal {
        tracing::error!("page service call failed: {}", e.msg);
    }
    tonic::Status::new(code, e.client_message())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn kinds_map_to_their_codes_with_the_same_message() {
        let cases = [
            (ErrorKind::BadRequest, Code::InvalidArgument),
            (ErrorKind::Unauthenticated, Code::Unauthenticated),
            (ErrorKind::Forbidden, Code::PermissionDenied),
            (ErrorKind::NotFound, Code::NotFound),
            (ErrorKind::Conflict, Code::FailedPrecondition),
            (ErrorKind::Gone, Code::OutOfRange),
            (ErrorKind::Unprocessable, Code::FailedPrecondition),
            (ErrorKind::TryAgain, Code::Unavailable),
            (ErrorKind::Upstream, Code::Unavailable),
            (ErrorKind::Internal, Code::Internal),
        ];
        for (kind, grpc) in cases {
            let status = status_of(ServeError::new(kind, "what went wrong"));
            assert_eq!(status.code(), grpc, "{kind:?}");
            assert_eq!(status.message(), "what went wrong");
        }
        let status = status_of(ServeError::internal("/srv/ps/tenants/t/x: gone"));
        assert_eq!(status.message(), "tenants/t/x: gone");
    }
}
