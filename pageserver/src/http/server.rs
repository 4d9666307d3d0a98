//! The accept loop and the HTTP/1.1 connections behind the router.
//!
//! We serve connections ourselves (hyper's HTTP/1.1 connection, not `axum::serve`) for limits
//! `axum::serve` cannot set:
//!
//! - **A connection cap** (`max_connections`, shared with the page service:
//!   [`crate::serving::connections`]). The loop takes a permit before it accepts, so a
//!   connection over the cap waits in the kernel's listen queue, holding no descriptor of ours,
//!   until one closes. The default cap leaves `max_file_descriptors` for our files.
//! - **A header read timeout** (`http_header_read_timeout`). hyper starts its clock whenever a
//!   connection begins waiting for a request's head: on a fresh connection and after every
//!   response on a kept-alive one. So the one setting both cuts off a client that sends its
//!   request line and headers too slowly and closes an idle keep-alive connection. hyper closes
//!   such a connection without a response (a client sees the connection end).
//! - **A response write timeout** (`http_response_write_timeout`): a client that stops reading
//!   its response loses the connection, and the server the response
//!   ([`super::write_stall`]).
//! - **Bounded per-connection buffers**: a request head may take at most
//!   [`MAX_HEAD_BYTES`] (431 past it) and hyper's read buffer never grows beyond that, so
//!   what an open connection can hold is bounded however its client behaves. Request bodies
//!   are bounded separately ([`super::body_limits`]).
//!
//! hyper answers a request it cannot parse itself, before any of our code sees it: 400 (a
//! malformed request line or header), 414 (a request target over 65534 bytes) or 431 (a head
//! over [`MAX_HEAD_BYTES`] or over 100 headers), each with an empty body, then closes the
//! connection. [`ErrorBodies`] sits between hyper and the socket and gives those answers the
//! `{"msg": ...}` body of every other error.
//!
//! hyper's error responses are only looked for before the router has taken a request on the
//! connection: after that, a write may be body bytes of ours, which a tenant chooses (a page).
//!
//! Shutdown: when the shutdown future completes the loop stops accepting and drops the
//! listener; every connection is told to finish its request in flight and close (idle ones
//! close at once); `serve` returns when the last has closed, or after [`SHUTDOWN_DRAIN`],
//! dropping the connections still open (a client trickling a body or reading its response a
//! byte at a time would otherwise hold the final flush forever).

use std::future::Future;
use std::io;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper::service::Service as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;

use super::write_stall::WriteStall;
use crate::serving::connections::{accept_error, ConnectionLimit};

/// The largest request head (request line and headers) and hyper's read buffer.
pub const MAX_HEAD_BYTES: usize = 128 * 1024;

/// The timeouts of every connection; see the module docs.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionTimeouts {
    pub header_read: Duration,
    pub response_write: Duration,
}

/// Serves `router` on `listener` until `shutdown` completes and every connection has closed.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    connections: Arc<ConnectionLimit>,
    timeouts: ConnectionTimeouts,
    shutdown: impl Future<Output = ()>,
) {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(timeouts.header_read)
        .max_buf_size(MAX_HEAD_BYTES);
    let graceful = GracefulShutdown::new();
    let mut shutdown = pin!(shutdown);
    loop {
        let place = tokio::select! {
            () = &mut shutdown => break,
            place = connections.reserve_http() => place,
        };
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_error(e).await;
                    continue;
                }
            },
        };
        let admitted = place.accepted();
        // Set once the router takes a request: from then on bytes of our responses pass through
        // the socket, and ErrorBodies no longer looks for hyper's errors in them.
        let served = Arc::new(AtomicBool::new(false));
        let service = {
            let router = TowerToHyperService::new(router.clone());
            let served = served.clone();
            hyper::service::service_fn(move |request| {
                served.store(true, Ordering::Release);
                router.call(request)
            })
        };
        let io = WriteStall::new(ErrorBodies::new(stream, served), timeouts.response_write);
        let connection = builder.serve_connection(TokioIo::new(io), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                // A client that hangs up or times out is normal traffic.
                tracing::debug!(%peer, "connection ended: {e}");
            }
            drop(admitted);
        });
    }
    // New connections are refused from here on.
    drop(listener);
    // A client that trickles its body or reads its response a byte at a time must not hold
    // the shutdown, and with it the final flush, forever.
    if tokio::time::timeout(SHUTDOWN_DRAIN, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            open = connections.open(),
            "requests still in flight {SHUTDOWN_DRAIN:?} after shutdown began: their connections \
             are dropped"
        );
    }
}

/// How long a shutdown waits for requests in flight before it drops their connections.
pub const SHUTDOWN_DRAIN: Duration = Duration::from_secs(30);

/// A socket that gives hyper's own error responses a JSON body; see the module docs.
///
/// hyper writes such a response as one head with `content-length: 0` and nothing after it,
/// then closes the connection. Every response of ours to a request has a body (errors carry
/// their `msg`), so a 400, 414 or 431 head with `content-length: 0` is hyper's. Its write is
/// replaced by the same head with a JSON body; hyper is told its bytes were written once the
/// replacement has been.
pub struct ErrorBodies<S> {
    inner: S,
    /// The replacement being written, how far, and how long hyper's original was.
    rewrite: Option<(Vec<u8>, usize, usize)>,
    /// Whether the router has taken a request on this connection. Until it has, nothing but
    /// hyper's own answers can be written; after, a write may be bytes of a body of ours (a
    /// page's bytes are the tenant's to choose, and may look like a head), so no write is
    /// rewritten. hyper's errors after a served request keep their empty body.
    served: Arc<AtomicBool>,
}

impl<S> ErrorBodies<S> {
    pub fn new(inner: S, served: Arc<AtomicBool>) -> ErrorBodies<S> {
        ErrorBodies {
            inner,
            rewrite: None,
            served,
        }
    }
}

/// The response to write instead of `head`, if `head` is one of hyper's bodiless errors.
fn with_json_body(head: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(head).ok()?;
    let rest = text
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| text.strip_prefix("HTTP/1.0 "))?;
    let msg = match rest.get(..4)? {
        "400 " => "the request is not valid HTTP/1.1: its request line or a header could not be parsed".to_owned(),
        "414 " => "the request target (path and query) is over 65534 bytes".to_owned(),
        "431 " => format!(
            "the request head is too large: at most {} KiB of request line and headers, and 100 headers",
            MAX_HEAD_BYTES / 1024
        ),
        _ => return None,
    };
    if !text.ends_with("\r\n\r\n") {
        return None;
    }
    const EMPTY: &str = "\r\ncontent-length: 0\r\n";
    let at = text.to_ascii_lowercase().find(EMPTY)?;
    let body = serde_json::json!({ "msg": msg }).to_string();
    let mut out = String::with_capacity(text.len() + body.len() + 64);
    out.push_str(&text[..at]);
    out.push_str("\r\ncontent-type: application/json\r\ncontent-length: ");
    out.push_str(&body.len().to_string());
    out.push_str("\r\n");
    out.push_str(&text[at + EMPTY.len()..]);
    out.push_str(&body);
    Some(out.into_bytes())
}

impl<S: AsyncWrite + Unpin> ErrorBodies<S> {
    /// Writes the rest of the replacement; `Ready(Ok(n))` with the length of hyper's original
    /// once it is all written.
    fn poll_rewrite(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let (bytes, written, original) = self.rewrite.as_mut().expect("a rewrite in progress");
        while *written < bytes.len() {
            match Pin::new(&mut self.inner).poll_write(cx, &bytes[*written..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => *written += n,
                Poll::Ready(Err(e)) => {
                    self.rewrite = None;
                    return Poll::Ready(Err(e));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        let original = *original;
        self.rewrite = None;
        Poll::Ready(Ok(original))
    }

    /// Starts a rewrite if `head` (all hyper is writing) is one of its bodiless errors.
    fn start_rewrite(&mut self, head: &[u8]) -> bool {
        if self.rewrite.is_some() {
            return true;
        }
        if self.served.load(Ordering::Acquire) {
            return false;
        }
        match with_json_body(head) {
            Some(bytes) => {
                self.rewrite = Some((bytes, 0, head.len()));
                true
            }
            None => false,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ErrorBodies<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ErrorBodies<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.start_rewrite(buf) {
            return self.poll_rewrite(cx);
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let mut parts = bufs.iter().filter(|b| !b.is_empty());
        if let (Some(only), None) = (parts.next(), parts.next()) {
            if self.start_rewrite(only) {
                return self.poll_rewrite(cx);
            }
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hypers_bodiless_errors_get_a_json_body() {
        let head = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: Mon, 23 Nov 2026 17:00:00 GMT\r\n\r\n";
        let out = String::from_utf8(with_json_body(head).unwrap()).unwrap();
        let (head_out, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(head_out.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
        assert!(head_out.contains("\r\ncontent-type: application/json\r\n"));
        assert!(head_out.contains(&format!("\r\ncontent-length: {}\r\n", body.len())));
        assert!(head_out.ends_with("date: Mon, 23 Nov 2026 17:00:00 GMT"));
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert!(json["msg"].as_str().unwrap().contains("128 KiB"));
        for status in ["400 Bad Request", "414 URI Too Long"] {
            let head = format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n");
            assert!(with_json_body(head.as_bytes()).is_some(), "{status}");
        }
    }

    #[test]
    fn other_writes_pass_unchanged() {
        // Our own errors have bodies; other statuses are not hyper's parse errors; a head
        // followed by more bytes is not a bodiless response.
        for write in [
            "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 12\r\n\r\n",
            "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n{}",
            "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            "{\"msg\": \"HTTP/1.1 400 \"}",
        ] {
            assert!(with_json_body(write.as_bytes()).is_none(), "{write}");
        }
    }

    /// A socket that takes at most 16 bytes per write, and is not ready every other time.
    #[derive(Default)]
    struct Trickle {
        written: Vec<u8>,
        calls: usize,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.calls += 1;
            if self.calls.is_multiple_of(2) {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            let n = buf.len().min(16);
            self.written.extend_from_slice(&buf[..n]);
            Poll::Ready(Ok(n))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn a_rewrite_reports_the_original_length_once_written() {
        let served = Arc::new(AtomicBool::new(false));
        let mut wrapped = ErrorBodies::new(Trickle::default(), served.clone());
        let head = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n";
        let n = std::future::poll_fn(|cx| Pin::new(&mut wrapped).poll_write(cx, head))
            .await
            .unwrap();
        assert_eq!(n, head.len());
        let all = String::from_utf8(wrapped.inner.written.clone()).unwrap();
        assert_eq!(all.as_bytes(), with_json_body(head).unwrap().as_slice());
        assert!(all.ends_with("could not be parsed\"}"), "{all}");
        // The next write is hyper's own again.
        let n = std::future::poll_fn(|cx| Pin::new(&mut wrapped).poll_write(cx, b"abc"))
            .await
            .unwrap();
        assert_eq!(n, 3);
        assert!(wrapped.inner.written.ends_with(b"}abc"));

        // Once a request was served, bytes that look like one of hyper's heads may be a page
        // of ours: written as they are.
        served.store(true, Ordering::Release);
        let before = wrapped.inner.written.len();
        let n = std::future::poll_fn(|cx| Pin::new(&mut wrapped).poll_write(cx, head))
            .await
            .unwrap();
        assert_eq!(n, 16, "the trickle takes 16 bytes at a time");
        assert_eq!(&wrapped.inner.written[before..], &head[..16]);
    }
}
