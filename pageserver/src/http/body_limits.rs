//! Request bodies: a stall timeout, and one budget for the bytes of every body being read.
//!
//! A handler reads its body into memory whole (an ingest batch is validated whole before any of
//! it is stored), so without a bound twenty clients each sending most of a 60 MiB body hold
//! 1.2 GB of the server's memory for as long as they like. Two limits close that:
//!
//! - **The budget** (`max_buffered_request_bytes`): the bytes of request bodies that handlers
//!   may hold, all requests together. A request with a `Content-Length` reserves that much
//!   before its handler runs; if the budget cannot cover it the request is refused at once with
//!   503 and `Connection: close`, before a byte of its body is read. Bytes a body sends beyond
//!   its reservation (a chunked body, or one whose length is over `max_request_body_size` and
//!   that a JSON handler reads the first 64 KiB of) are taken from the budget as they arrive;
//!   when that fails the read fails, and the handler answers 503. Nothing waits for budget:
//!   a refusal says why and the client retries, where waiting would keep a connection and its
//!   partial body alive.
//! - **The stall timeout** (`http_body_read_timeout`): a body that sends nothing for this long
//!   fails its read, and the handler answers 408. The read stops, its buffer is dropped, and
//!   hyper closes the connection because the body was not read to its end.
//! - **Streamed bodies**: an import (`PUT .../import`) reads its body as it arrives, holding a
//!   chunk at a time, so it reserves and takes nothing from the budget. Its stall timeout is
//!   `import_body_read_timeout` (a `pg_basebackup` sends nothing until its start checkpoint is
//!   done), and its minimum rate counts from its first byte.
//! - **A minimum rate** ([`MIN_BODY_RATE`]): past its first `http_body_read_timeout`, a body must
//!   have sent at least 1 MiB for every second since; one that trickles a byte now and then
//!   (never stalling long enough for the timeout) fails with 408 too, so no client holds its
//!   reservation of the budget for longer than its size justifies.
//!
//! Invariant: the budget held by a request is released when its response is ready (the
//! handler has returned and dropped its buffer), or when the request is dropped, whichever
//! comes first. (A storage task on the blocking pool may outlive a client that hung up, with
//! the decoded batch; that is bounded by the pool, not by this budget.) The budget counts in
//! KiB, so that one reservation of any allowed body size fits the semaphore's `u32`.

use std::future::Future as _;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body::{Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::error::ApiError;
use super::SharedState;

/// The most a JSON request body may hold; they are all a few ids.
pub const MAX_JSON_BODY: usize = 64 * 1024;

/// The budget's unit, in bytes.
const UNIT: usize = 1024;

/// The bytes of request bodies being read, all requests together; see the module docs.
pub struct BodyBudget {
    units: Arc<Semaphore>,
    capacity_units: usize,
}

impl BodyBudget {
    pub fn new(capacity_bytes: usize) -> BodyBudget {
        let capacity_units = capacity_bytes / UNIT;
        BodyBudget {
            units: Arc::new(Semaphore::new(capacity_units)),
            capacity_units,
        }
    }

    pub fn capacity_bytes(&self) -> u64 {
        (self.capacity_units * UNIT) as u64
    }

    /// Bytes reserved by requests right now.
    pub fn used_bytes(&self) -> u64 {
        (self.capacity_units - self.units.available_permits()) as u64 * UNIT as u64
    }

    /// `bytes` of budget now, or `None` if it is not there.
    fn try_take(&self, bytes: usize) -> Option<OwnedSemaphorePermit> {
        let units = u32::try_from(bytes.div_ceil(UNIT)).ok()?;
        self.units.clone().try_acquire_many_owned(units).ok()
    }
}

/// Why a body could not be read; the handler's body reader turns it into a response
/// ([`api_error`]).
#[derive(Debug, thiserror::Error)]
pub enum BodyLimitError {
    #[error("the request body sent nothing for {0:?} (http_body_read_timeout, or import_body_read_timeout for an import)")]
    Stalled(Duration),
    #[error(
        "the request body sent {received} bytes in {elapsed:?}: under the minimum rate of 1 MiB/s \
         after the first http_body_read_timeout"
    )]
    TooSlow { received: usize, elapsed: Duration },
    #[error(
        "request bodies being read already take the server's budget of {capacity} bytes \
         (max_buffered_request_bytes); retry later"
    )]
    OverBudget { capacity: u64 },
}

/// The response for a body read that failed because of one of our limits, if it did.
pub fn api_error(error: &(dyn std::error::Error + 'static)) -> Option<ApiError> {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if let Some(limit) = e.downcast_ref::<BodyLimitError>() {
            let status = match limit {
                BodyLimitError::Stalled(_) | BodyLimitError::TooSlow { .. } => {
                    StatusCode::REQUEST_TIMEOUT
                }
                BodyLimitError::OverBudget { .. } => StatusCode::SERVICE_UNAVAILABLE,
            };
            return Some(ApiError::new(status, limit.to_string()));
        }
        cause = e.source();
    }
    None
}

/// What a request holds of the budget, shared by its body and the middleware that releases it.
#[derive(Default)]
struct Held {
    permit: Option<OwnedSemaphorePermit>,
    /// A limit cut the body off: the connection cannot carry another request.
    failed: bool,
}

type SharedHeld = Arc<Mutex<Held>>;

fn hold(held: &SharedHeld, permit: OwnedSemaphorePermit) {
    let mut held = held
        .lock()
        .expect("never poisoned: no panics under the lock");
    match &mut held.permit {
        Some(p) => p.merge(permit),
        None => held.permit = Some(permit),
    }
}

/// The middleware: reserves a body's declared length, wraps the body in a [`LimitedBody`],
/// and releases the budget once the response is ready.
pub async fn limit_body(
    State(state): State<SharedState>,
    request: Request,
    next: Next,
) -> Response {
    if !super::has_body(&request) {
        return next.run(request).await;
    }
    let budget = &state.body_budget;
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let held = SharedHeld::default();
    // A length over max_request_body_size is refused by every handler without reading more
    // than 64 KiB of it, so it reserves nothing up front; its bytes are counted as they come.
    // Only ingest reads a large body: any other route reads at most its JSON limit, and
    // reserves no more (what it reads beyond is counted as it comes).
    let ingest = request.uri().path().ends_with("/ingest");
    // An import reads its body as it arrives and holds a chunk at a time: it reserves nothing
    // and takes nothing from the budget; it has its own stall timeout, and its minimum rate
    // counts from its first byte (see `LimitedBody::deadline`).
    let streamed = request.uri().path().ends_with("/import");
    let reserved = declared
        .filter(|len| *len <= state.conf.max_request_body_size && !streamed)
        .map(|len| if ingest { len } else { len.min(MAX_JSON_BODY) })
        .unwrap_or(0);
    if reserved > 0 {
        match budget.try_take(reserved) {
            Some(permit) => hold(&held, permit),
            None => {
                let error = BodyLimitError::OverBudget {
                    capacity: budget.capacity_bytes(),
                };
                let mut response =
                    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, error.to_string())
                        .into_response();
                let headers = response.headers_mut();
                // The body stays unread, so the connection cannot carry another request.
                headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                return response;
            }
        }
    }
    let stall_timeout = if streamed {
        state.conf.import_body_read_timeout
    } else {
        state.conf.http_body_read_timeout
    };
    let (parts, body) = request.into_parts();
    let body = LimitedBody {
        inner: body,
        budget: state.body_budget.clone(),
        held: held.clone(),
        covered: reserved.div_ceil(UNIT) * UNIT,
        budgeted: !streamed,
        first_byte: None,
        received: 0,
        stall_timeout,
        stall: Box::pin(tokio::time::sleep(stall_timeout)),
        started: tokio::time::Instant::now(),
        last_frame: tokio::time::Instant::now(),
    };
    let mut response = next.run(Request::from_parts(parts, Body::new(body))).await;
    let held = std::mem::take(&mut *held.lock().expect("never poisoned"));
    if held.failed {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    // The handler has returned, and with it the buffer the budget stood for.
    drop(held.permit);
    response
}

/// A request body under the stall timeout and the budget; see the module docs.
struct LimitedBody {
    inner: Body,
    budget: Arc<BodyBudget>,
    held: SharedHeld,
    /// Bytes the budget held for this body covers (whole units).
    covered: usize,
    /// Whether bytes past `covered` are taken from the budget (not for a streamed body).
    budgeted: bool,
    /// When the first byte came (a streamed body's minimum rate counts from there).
    first_byte: Option<tokio::time::Instant>,
    received: usize,
    stall_timeout: Duration,
    /// Fires when the body has sent nothing for `stall_timeout`, or falls behind
    /// [`MIN_BODY_RATE`]; reset by every frame.
    stall: Pin<Box<tokio::time::Sleep>>,
    started: tokio::time::Instant,
    last_frame: tokio::time::Instant,
}

/// The slowest a body may arrive once its first `http_body_read_timeout` is over, in bytes per
/// second; see the module docs.
pub const MIN_BODY_RATE: u64 = 1 << 20;

impl LimitedBody {
    /// When the body fails unless more arrives: `stall_timeout` after its last frame, or when
    /// what it has sent falls behind the minimum rate, whichever comes first.
    fn deadline(&self) -> tokio::time::Instant {
        let by_stall = self.last_frame + self.stall_timeout;
        // A streamed body (an import) may wait long for its first byte (a pg_basebackup's
        // start checkpoint), so its rate counts from there; a trickle still cannot hold it,
        // and with it its timeline's writes, for long.
        let rate_from = if self.budgeted {
            self.started
        } else {
            match self.first_byte {
                Some(first) => first,
                None => return by_stall,
            }
        };
        let by_rate = rate_from
            + self.stall_timeout
            + Duration::from_secs_f64(self.received as f64 / MIN_BODY_RATE as f64);
        by_stall.min(by_rate)
    }
}

impl LimitedBody {
    fn fail(&mut self, error: BodyLimitError) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        self.held.lock().expect("never poisoned").failed = true;
        Poll::Ready(Some(Err(axum::Error::new(error))))
    }
}

impl HttpBody for LimitedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => {
                if this.stall.as_mut().poll(cx).is_ready() {
                    let now = tokio::time::Instant::now();
                    let error = if now >= this.last_frame + this.stall_timeout {
                        BodyLimitError::Stalled(this.stall_timeout)
                    } else {
                        BodyLimitError::TooSlow {
                            received: this.received,
                            elapsed: now - this.started,
                        }
                    };
                    return this.fail(error);
                }
                Poll::Pending
            }
            Poll::Ready(Some(Ok(frame))) => {
                this.last_frame = tokio::time::Instant::now();
                if let Some(data) = frame.data_ref() {
                    this.received += data.len();
                    if !data.is_empty() && this.first_byte.is_none() {
                        this.first_byte = Some(this.last_frame);
                    }
                }
                let deadline = this.deadline();
                this.stall.as_mut().reset(deadline);
                if this.budgeted && this.received > this.covered {
                    let more = this.received - this.covered;
                    match this.budget.try_take(more) {
                        Some(permit) => {
                            this.covered += more.div_ceil(UNIT) * UNIT;
                            hold(&this.held, permit);
                        }
                        None => {
                            let capacity = this.budget.capacity_bytes();
                            return this.fail(BodyLimitError::OverBudget { capacity });
                        }
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A body's chunks gathered as they arrive, holding about as much memory as their bytes.
///
/// A chunk hyper hands out shares its read buffer, so keeping a small chunk keeps a whole read
/// buffer alive (and a chunked body may arrive a byte per chunk): small chunks are copied into
/// one growing buffer. A chunk of at least [`GatheredBody::KEEP_WHOLE`] bytes is kept as it
/// came, without a copy; the read buffer it shares holds at most 128 KiB, so it keeps at most
/// twice its size alive.
#[derive(Default)]
pub struct GatheredBody {
    segments: Vec<Bytes>,
    small: bytes::BytesMut,
}

impl GatheredBody {
    pub const KEEP_WHOLE: usize = 64 * 1024;

    pub fn push(&mut self, chunk: Bytes) {
        if chunk.len() >= Self::KEEP_WHOLE {
            if !self.small.is_empty() {
                self.segments.push(self.small.split().freeze());
            }
            self.segments.push(chunk);
        } else {
            self.small.extend_from_slice(&chunk);
        }
    }

    /// The body's bytes, in order, in as few pieces as the gathering left.
    pub fn into_segments(mut self) -> Vec<Bytes> {
        if !self.small.is_empty() {
            self.segments.push(self.small.split().freeze());
        }
        self.segments
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_counts_whole_units_and_refuses_past_its_capacity() {
        let budget = BodyBudget::new(10 * UNIT);
        let a = budget.try_take(4 * UNIT).unwrap();
        let b = budget.try_take(UNIT + 1).unwrap(); // two units
        assert_eq!(budget.used_bytes(), 6 * UNIT as u64);
        assert!(budget.try_take(5 * UNIT).is_none());
        let c = budget.try_take(4 * UNIT).unwrap();
        assert!(budget.try_take(1).is_none());
        drop((a, b, c));
        assert_eq!(budget.used_bytes(), 0);
        assert_eq!(budget.capacity_bytes(), 10 * UNIT as u64);
    }

    #[test]
    fn limit_errors_are_found_under_wrappers() {
        let stalled = axum::Error::new(BodyLimitError::Stalled(Duration::from_secs(1)));
        let error = api_error(&stalled).unwrap();
        assert_eq!(error.status, StatusCode::REQUEST_TIMEOUT);
        assert!(
            error.msg.contains("http_body_read_timeout"),
            "{}",
            error.msg
        );
        let over = axum::Error::new(axum::Error::new(BodyLimitError::OverBudget { capacity: 7 }));
        assert_eq!(
            api_error(&over).unwrap().status,
            StatusCode::SERVICE_UNAVAILABLE
        );
        let other = axum::Error::new(std::io::Error::other("reset"));
        assert!(api_error(&other).is_none());
    }

    #[tokio::test]
    async fn a_stalled_body_fails_and_chunks_past_the_reservation_take_budget() {
        use http_body_util::BodyExt;
        let budget = Arc::new(BodyBudget::new(4 * UNIT));
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(4);
        let held = SharedHeld::default();
        let mut body = LimitedBody {
            inner: Body::new(ChannelBody(rx)),
            budget: budget.clone(),
            held: held.clone(),
            covered: 0,
            budgeted: true,
            first_byte: None,
            received: 0,
            stall_timeout: Duration::from_millis(50),
            stall: Box::pin(tokio::time::sleep(Duration::from_millis(50))),
            started: tokio::time::Instant::now(),
            last_frame: tokio::time::Instant::now(),
        };
        tx.send(Ok(Frame::data(Bytes::from(vec![0u8; 3 * UNIT]))))
            .await
            .unwrap();
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.data_ref().unwrap().len(), 3 * UNIT);
        assert_eq!(budget.used_bytes(), 3 * UNIT as u64);
        // Over the budget: the read fails, and the request is marked for closing.
        tx.send(Ok(Frame::data(Bytes::from(vec![0u8; 2 * UNIT]))))
            .await
            .unwrap();
        let error = body.frame().await.unwrap().unwrap_err();
        assert_eq!(
            api_error(&error).unwrap().status,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert!(held.lock().unwrap().failed);
        // Nothing more arrives: after the stall timeout the read fails with a 408.
        held.lock().unwrap().failed = false;
        let error = body.frame().await.unwrap().unwrap_err();
        assert_eq!(
            api_error(&error).unwrap().status,
            StatusCode::REQUEST_TIMEOUT
        );
        drop(tx);
        // The budget is the request's until its holder is dropped.
        assert_eq!(budget.used_bytes(), 3 * UNIT as u64);
        drop(std::mem::take(&mut *held.lock().unwrap()));
        assert_eq!(budget.used_bytes(), 0);
    }

    /// A body that sends one byte every 50 ms (never a gap of `stall`, far below the minimum
    /// rate), budgeted or streamed; the error that cut it off, if one did within 1.5 s, and the
    /// budget held then.
    async fn trickle(budgeted: bool) -> (Option<axum::Error>, u64) {
        use http_body_util::BodyExt;
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(4);
        let stall = Duration::from_millis(200);
        let budget = Arc::new(BodyBudget::new(64 * UNIT));
        let mut body = LimitedBody {
            inner: Body::new(ChannelBody(rx)),
            budget: budget.clone(),
            held: SharedHeld::default(),
            covered: 0,
            budgeted,
            first_byte: None,
            received: 0,
            stall_timeout: stall,
            stall: Box::pin(tokio::time::sleep(stall)),
            started: tokio::time::Instant::now(),
            last_frame: tokio::time::Instant::now(),
        };
        tokio::spawn(async move {
            for _ in 0..30 {
                tokio::time::sleep(Duration::from_millis(50)).await;
                if tx
                    .send(Ok(Frame::data(Bytes::from_static(b"x"))))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
        loop {
            match body.frame().await {
                None => return (None, budget.used_bytes()),
                Some(Ok(_)) => {}
                Some(Err(e)) => return (Some(e), budget.used_bytes()),
            }
        }
    }

    #[tokio::test]
    async fn a_body_that_trickles_without_stalling_fails_its_minimum_rate() {
        for budgeted in [true, false] {
            let (error, held) = trickle(budgeted).await;
            let error = error.expect("the trickle was never cut off");
            let api = api_error(&error).unwrap();
            assert_eq!(api.status, StatusCode::REQUEST_TIMEOUT);
            assert!(api.msg.contains("minimum rate"), "{}", api.msg);
            if !budgeted {
                // A streamed body takes nothing from the budget.
                assert_eq!(held, 0);
            }
        }
    }

    /// A body whose frames come from a channel: it stalls when the test sends nothing.
    struct ChannelBody(tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, std::io::Error>>);

    impl HttpBody for ChannelBody {
        type Data = Bytes;
        type Error = std::io::Error;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
            self.0.poll_recv(cx)
        }
    }

    #[test]
    fn gathered_small_chunks_are_copied_together_and_large_ones_kept_as_they_came() {
        let mut body = GatheredBody::default();
        let mut expected = Vec::new();
        for i in 0..10_000u32 {
            body.push(Bytes::from(vec![i as u8]));
            expected.push(i as u8);
        }
        let large = Bytes::from(vec![7u8; GatheredBody::KEEP_WHOLE]);
        body.push(large.clone());
        expected.extend_from_slice(&large);
        body.push(Bytes::from_static(b"tail"));
        expected.extend_from_slice(b"tail");
        let segments = body.into_segments();
        // Ten thousand one-byte chunks became one piece; the large chunk is the same memory.
        assert_eq!(segments.len(), 3);
        assert_eq!(segments[0].len(), 10_000);
        assert_eq!(segments[1].as_ptr(), large.as_ptr());
        assert_eq!(segments.concat(), expected);
        assert!(GatheredBody::default().into_segments().is_empty());
    }
}
