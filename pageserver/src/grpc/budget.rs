//! The bytes of answers the page service holds for a stream and for a connection, bounded.
//!
//! A client that never reads (or, over HTTP/2, grants no flow-control window) leaves every
//! answer the server has made waiting: read but not yet encoded, encoded and queued in h2's
//! send buffer, waiting for a window that never opens. Without a bound in bytes, a stream's
//! batches in flight and a connection's hundreds of streams multiplied that into gigabytes. So
//! every answer is counted from the moment its batch is taken until its last byte is handed to
//! the socket, against two [`ByteBudget`]s: its stream's and its connection's
//! ([`AnswerBudget`]). A stream takes a new batch only while both are under their limits
//! ([`AnswerBudget::admit`]); otherwise it stops reading requests, which then wait in HTTP/2
//! flow control on the client's side: backpressure, not buffering.
//!
//! How an answer is counted, in two overlapping parts, so that no byte is ever uncounted:
//!
//! - [`Held`]: taken when a batch is admitted, at an estimate (a page is 8 KiB), set to the
//!   answer's real encoded size once it is read, and given back when the response stream is
//!   polled for the answer after it: by then tonic has encoded this one and handed it to h2
//!   (tonic encodes an answer of more than 32 KiB on its own and yields it at once; smaller ones
//!   gather up to 32 KiB in its buffer first, the only bytes counted by neither part).
//! - [`ChargedBody`]: each encoded chunk of the response body is charged as it leaves tonic,
//!   and the charge is given back when h2 drops the chunk, that is once the last byte is
//!   written to the socket (or the stream is reset). The chunk's bytes are the charge's owner
//!   ([`Bytes::from_owner`]), so the release is exact and needs no cooperation from h2.
//!
//! A budget admits while it is under its limit, so it can be exceeded by one batch's answer:
//! one held answer past the limit, never a stream of them. Pages larger than 8 KiB (values of
//! other keys, up to `max_value_size`) are counted at their size once read; a batch of them can
//! take its stream past the budget by more, once, and then the stream reads nothing until it
//! is back under.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::Notify;
use tonic::codegen::{http, BoxFuture, Service};
use tonic::server::NamedService;
use tonic::transport::server::TcpConnectInfo;

/// What tonic puts in the extensions of every request on a connection.
#[derive(Debug, Clone)]
pub struct ConnectionInfo {
    pub tcp: TcpConnectInfo,
    /// The bytes of answers the connection's streams hold, together.
    pub answers: Arc<ByteBudget>,
}

/// The limits of the budgets: settings `grpc_answer_bytes_per_stream` and
/// `grpc_answer_bytes_per_connection`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnswerLimits {
    pub per_stream: usize,
    pub per_connection: usize,
}

impl AnswerLimits {
    /// A new connection's budget, shared by its streams.
    pub fn for_new_connection(&self) -> Arc<ByteBudget> {
        Arc::new(ByteBudget::new(self.per_connection))
    }

    /// A new stream's budgets, on `connection` (on a connection of its own if `None`).
    pub fn for_new_stream(&self, connection: Option<Arc<ByteBudget>>) -> AnswerBudget {
        AnswerBudget::new(
            self.per_stream,
            connection.unwrap_or_else(|| self.for_new_connection()),
        )
    }
}

/// Bytes a stream's answers may take, and who waits for room.
#[derive(Debug)]
pub struct ByteBudget {
    limit: usize,
    held: AtomicUsize,
    /// Woken when `held` falls below `limit`.
    room: Notify,
}

impl ByteBudget {
    pub fn new(limit: usize) -> ByteBudget {
        ByteBudget {
            limit,
            held: AtomicUsize::new(0),
            room: Notify::new(),
        }
    }

    /// The bytes counted now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// Counts `bytes` if the budget is under its limit.
    fn try_take(&self, bytes: usize) -> bool {
        let mut held = self.held.load(Ordering::Acquire);
        loop {
            if held >= self.limit {
                return false;
            }
            match self.held.compare_exchange_weak(
                held,
                held + bytes,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(now) => held = now,
            }
        }
    }

    /// Counts `bytes` whatever the limit: bytes that already exist.
    fn charge(&self, bytes: usize) {
        self.held.fetch_add(bytes, Ordering::AcqRel);
    }

    fn give_back(&self, bytes: usize) {
        let before = self.held.fetch_sub(bytes, Ordering::AcqRel);
        debug_assert!(before >= bytes, "gave back {bytes} of {before} bytes");
        if before >= self.limit && before - bytes < self.limit {
            self.room.notify_waiters();
        }
    }
}

/// The budgets one stream's answers count against: its own, and its connection's (shared by
/// the connection's streams).
#[derive(Debug, Clone)]
pub struct AnswerBudget {
    pub stream: Arc<ByteBudget>,
    pub connection: Arc<ByteBudget>,
}

impl AnswerBudget {
    pub fn new(stream_limit: usize, connection: Arc<ByteBudget>) -> AnswerBudget {
        AnswerBudget {
            stream: Arc::new(ByteBudget::new(stream_limit)),
            connection,
        }
    }

    /// Counts `bytes` once both budgets are under their limits; until then, waits. Cancel-safe:
    /// dropped before it completes, it has counted nothing.
    ///
    /// Only the stream's own task admits on its stream budget, so that one is checked and then
    /// charged, and only the connection's is taken with a check in one step: nothing is taken
    /// and given back on a failed attempt, which would wake this very wait (and every other on
    /// the budget) for no room at all.
    pub async fn admit(&self, bytes: usize) -> Held {
        loop {
            // Registered before the attempt, so that room made between the two is not missed.
            let stream_room = self.stream.room.notified();
            let connection_room = self.connection.room.notified();
            tokio::pin!(stream_room, connection_room);
            stream_room.as_mut().enable();
            connection_room.as_mut().enable();
            if self.stream.held() < self.stream.limit && self.connection.try_take(bytes) {
                self.stream.charge(bytes);
                return Held {
                    budget: self.clone(),
                    bytes,
                };
            }
            tokio::select! {
                () = stream_room => {}
                () = connection_room => {}
            }
        }
    }

    /// Counts `bytes` that exist already, whatever the limits.
    pub fn charge(&self, bytes: usize) -> Held {
        self.stream.charge(bytes);
        self.connection.charge(bytes);
        Held {
            budget: self.clone(),
            bytes,
        }
    }
}

/// Bytes counted against an [`AnswerBudget`] until this is dropped.
#[derive(Debug)]
pub struct Held {
    budget: AnswerBudget,
    bytes: usize,
}

impl Held {
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Counts `bytes` instead, whatever the limits: the answer's real size, once known.
    pub fn resize(&mut self, bytes: usize) {
        if bytes > self.bytes {
            self.budget.stream.charge(bytes - self.bytes);
            self.budget.connection.charge(bytes - self.bytes);
        } else {
            self.budget.stream.give_back(self.bytes - bytes);
            self.budget.connection.give_back(self.bytes - bytes);
        }
        self.bytes = bytes;
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.stream.give_back(self.bytes);
        self.budget.connection.give_back(self.bytes);
    }
}

/// A response body whose data chunks stay counted against `budget` until they are dropped.
pub struct ChargedBody<B> {
    inner: B,
    budget: AnswerBudget,
}

impl<B> ChargedBody<B> {
    pub fn new(inner: B, budget: AnswerBudget) -> ChargedBody<B> {
        ChargedBody { inner, budget }
    }
}

/// A chunk's bytes with their charge: dropping them gives it back.
struct ChargedBytes {
    bytes: Bytes,
    _held: Held,
}

impl AsRef<[u8]> for ChargedBytes {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl<B> Body for ChargedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let frame = std::task::ready!(Pin::new(&mut self.inner).poll_frame(cx));
        Poll::Ready(frame.map(|frame| {
            frame.map(|frame| {
                frame.map_data(|bytes| {
                    let held = self.budget.charge(bytes.len());
                    Bytes::from_owner(ChargedBytes { bytes, _held: held })
                })
            })
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A gRPC service whose every call gets a stream budget on its connection's budget, in its
/// request's extensions (where a `GetPages` stream finds it), and whose response body is a
/// [`ChargedBody`] on that budget.
#[derive(Clone)]
pub struct Budgeted<S> {
    inner: S,
    limits: AnswerLimits,
}

impl<S> Budgeted<S> {
    pub fn new(inner: S, limits: AnswerLimits) -> Budgeted<S> {
        Budgeted { inner, limits }
    }
}

impl<S: NamedService> NamedService for Budgeted<S> {
    const NAME: &'static str = S::NAME;
}

type GrpcRequest = http::Request<tonic::body::Body>;
type GrpcResponse = http::Response<tonic::body::Body>;

impl<S> Service<GrpcRequest> for Budgeted<S>
where
    S: Service<GrpcRequest, Response = GrpcResponse, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = GrpcResponse;
    type Error = Infallible;
    type Future = BoxFuture<GrpcResponse, Infallible>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: GrpcRequest) -> Self::Future {
        let connection = request
            .extensions()
            .get::<ConnectionInfo>()
            .map(|info| info.answers.clone());
        let budget = self.limits.for_new_stream(connection);
        request.extensions_mut().insert(budget.clone());
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| tonic::body::Body::new(ChargedBody::new(body, budget))))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn budget(stream: usize, connection: usize) -> AnswerBudget {
        AnswerBudget::new(stream, Arc::new(ByteBudget::new(connection)))
    }

    async fn admitted_soon(budget: &AnswerBudget, bytes: usize) -> Option<Held> {
        tokio::time::timeout(Duration::from_millis(50), budget.admit(bytes))
            .await
            .ok()
    }

    #[tokio::test]
    async fn admits_while_under_the_limit_then_waits_for_room() {
        let b = budget(100, 1000);
        let first = admitted_soon(&b, 60).await.unwrap();
        // Under the limit: admitted, though it takes the stream past it.
        let second = admitted_soon(&b, 60).await.unwrap();
        assert_eq!(b.stream.held(), 120);
        assert!(admitted_soon(&b, 1).await.is_none());
        // A cancelled wait counted nothing.
        assert_eq!((b.stream.held(), b.connection.held()), (120, 120));
        let waiting = tokio::spawn({
            let b = b.clone();
            async move { b.admit(10).await }
        });
        drop(first);
        let third = waiting.await.unwrap();
        assert_eq!(b.stream.held(), 70);
        drop((second, third));
        assert_eq!((b.stream.held(), b.connection.held()), (0, 0));
    }

    #[tokio::test]
    async fn a_full_connection_stops_every_stream_on_it() {
        let connection = Arc::new(ByteBudget::new(100));
        let a = AnswerBudget::new(1000, connection.clone());
        let b = AnswerBudget::new(1000, connection.clone());
        let held = a.admit(100).await;
        assert!(admitted_soon(&b, 1).await.is_none());
        assert_eq!(b.stream.held(), 0, "a refused admission counts nothing");
        let waiting = tokio::spawn({
            let b = b.clone();
            async move { b.admit(5).await }
        });
        drop(held);
        assert_eq!(waiting.await.unwrap().bytes(), 5);
    }

    #[tokio::test]
    async fn a_refused_admission_does_not_wake_itself() {
        use std::future::Future;
        use std::task::{Wake, Waker};

        #[derive(Default)]
        struct Wakes(AtomicUsize);
        impl Wake for Wakes {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }

        // Room in the stream's budget for the start of the batch, none in the connection's.
        let connection = Arc::new(ByteBudget::new(100));
        let full = AnswerBudget::new(1000, connection.clone()).charge(100);
        let b = AnswerBudget::new(100, connection);
        let _half = b.charge(50);
        let wakes = Arc::new(Wakes::default());
        let waker = Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        let admit = b.admit(60);
        tokio::pin!(admit);
        assert!(admit.as_mut().poll(&mut cx).is_pending());
        assert_eq!(wakes.0.load(Ordering::SeqCst), 0, "woken with no room made");
        assert_eq!(b.stream.held(), 50);
        drop(full);
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
        assert!(admit.as_mut().poll(&mut cx).is_ready());
    }

    #[tokio::test]
    async fn resize_and_charges_count_whatever_the_limit() {
        let b = budget(100, 100);
        let mut held = b.admit(10).await;
        held.resize(250);
        assert_eq!((b.stream.held(), b.connection.held()), (250, 250));
        let charged = b.charge(50);
        assert_eq!(b.stream.held(), 300);
        held.resize(20);
        drop(charged);
        assert_eq!(b.stream.held(), 20);
        drop(held);
        assert_eq!((b.stream.held(), b.connection.held()), (0, 0));
    }

    #[tokio::test]
    async fn a_body_chunk_stays_counted_until_its_bytes_are_dropped() {
        use http_body_util::BodyExt;
        let b = budget(1 << 20, 1 << 20);
        let source = http_body_util::StreamBody::new(futures::stream::iter(vec![
            Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(vec![7u8; 1000]))),
            Ok(Frame::data(Bytes::from(vec![8u8; 24]))),
        ]));
        let mut body = ChargedBody::new(source, b.clone());
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(b.stream.held(), 1000);
        let second = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(b.connection.held(), 1024);
        // Sliced and advanced as h2 does, the bytes keep their charge until the last goes.
        let mut rest = first.slice(100..);
        drop(first);
        bytes::Buf::advance(&mut rest, 800);
        assert_eq!(b.stream.held(), 1024);
        assert_eq!(&rest[..], &[7u8; 100][..]);
        drop((rest, second));
        assert_eq!((b.stream.held(), b.connection.held()), (0, 0));
        assert!(body.frame().await.is_none());
    }
}
