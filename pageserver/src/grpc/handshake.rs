//! A deadline on a page service connection's HTTP/2 handshake.
//!
//! A connection holds a place under the server's connection cap from the moment it is
//! accepted, and hyper's HTTP/2 server waits for the client's preface for as long as the
//! client likes; its keepalive pings start only once the handshake is done. A peer that
//! connects and sends nothing, or a few bytes, would keep its place forever. So until the
//! client has sent the 24-byte preface and the whole of its first frame (the SETTINGS frame
//! that must follow it), reads are raced against a deadline, and a connection still short of
//! that when the deadline passes reads a `TimedOut` error, on which hyper closes it. From then
//! on the connection is HTTP/2's: keepalive pings drop a peer that stops answering.
//!
//! What the bytes say is not judged here: a preface that is not HTTP/2's is hyper's to refuse.
//! Only how many bytes the handshake needs is read from them (the first frame's length).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use crate::serving::socket::delegate_async_write;

/// The client connection preface: `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`.
const PREFACE_LEN: usize = 24;
/// A frame header: 24-bit payload length, type, flags, stream id.
const FRAME_HEADER_LEN: usize = 9;
/// The bytes that say how long the handshake is: the preface and the first frame's header.
const HEADER_END: usize = PREFACE_LEN + FRAME_HEADER_LEN;

/// How far a client has come through the bytes of its handshake.
#[derive(Debug)]
struct HandshakeBytes {
    /// The preface and the first frame's header, as far as they have arrived.
    head: [u8; HEADER_END],
    /// Bytes received so far (counted up to `needed`).
    received: usize,
    /// Bytes the handshake takes: known once the first frame's header has arrived.
    needed: Option<usize>,
}

impl HandshakeBytes {
    fn new() -> Self {
        HandshakeBytes {
            head: [0; HEADER_END],
            received: 0,
            needed: None,
        }
    }

    /// Counts `bytes`, the next ones the client sent; true once the handshake is all in.
    fn received(&mut self, bytes: &[u8]) -> bool {
        if self.received < HEADER_END {
            let n = bytes.len().min(HEADER_END - self.received);
            self.head[self.received..self.received + n].copy_from_slice(&bytes[..n]);
        }
        self.received = self.received.saturating_add(bytes.len());
        if self.needed.is_none() && self.received >= HEADER_END {
            let len = &self.head[PREFACE_LEN..PREFACE_LEN + 3];
            let payload = u32::from_be_bytes([0, len[0], len[1], len[2]]) as usize;
            self.needed = Some(HEADER_END + payload);
        }
        self.needed.is_some_and(|needed| self.received >= needed)
    }
}

/// `io` whose reads fail with `TimedOut` once `timeout` has passed since it was made, unless
/// the client's handshake has arrived by then.
pub struct HandshakeDeadline<S> {
    io: S,
    /// `None` once the handshake has arrived.
    pending: Option<(Pin<Box<Sleep>>, HandshakeBytes)>,
    timeout: Duration,
}

impl<S> HandshakeDeadline<S> {
    pub fn new(io: S, timeout: Duration) -> Self {
        HandshakeDeadline {
            io,
            pending: Some((Box::pin(tokio::time::sleep(timeout)), HandshakeBytes::new())),
            timeout,
        }
    }

    pub fn get_ref(&self) -> &S {
        &self.io
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for HandshakeDeadline<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let Some((deadline, handshake)) = &mut this.pending else {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        };
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if handshake.received(&buf.filled()[before..]) {
                    this.pending = None;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            // Polled after the read, so a deadline that passed while bytes were waiting
            // still lets them in; polling it registers the wakeup when nothing is waiting.
            Poll::Pending => match deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "no HTTP/2 handshake within {} of connecting",
                        humantime::format_duration(this.timeout)
                    ),
                ))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

delegate_async_write!([S: AsyncWrite + Unpin] HandshakeDeadline<S>, io);

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const PREFACE: &[u8; PREFACE_LEN] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    /// The preface and a SETTINGS frame with `settings` 6-byte entries.
    fn handshake(settings: usize) -> Vec<u8> {
        let len = (settings * 6) as u32;
        let mut bytes = PREFACE.to_vec();
        bytes.extend_from_slice(&len.to_be_bytes()[1..]);
        bytes.extend_from_slice(&[0x4, 0, 0, 0, 0, 0]);
        bytes.extend(std::iter::repeat_n(7u8, settings * 6));
        bytes
    }

    #[test]
    fn the_handshake_is_in_once_the_first_frame_is_whole_in_any_pieces() {
        for settings in [0, 1, 3] {
            let bytes = handshake(settings);
            for split in 1..bytes.len() {
                let mut seen = HandshakeBytes::new();
                let mut done_at = None;
                for (i, piece) in bytes.chunks(split).enumerate() {
                    if seen.received(piece) && done_at.is_none() {
                        done_at = Some(((i + 1) * split).min(bytes.len()));
                    }
                }
                assert_eq!(
                    done_at,
                    Some(bytes.len()),
                    "{settings} settings, pieces of {split}"
                );
            }
            let mut short = HandshakeBytes::new();
            assert!(!short.received(&bytes[..bytes.len() - 1]));
        }
        // Bytes past the handshake (the first requests) arrive in the same read.
        let mut seen = HandshakeBytes::new();
        let mut bytes = handshake(2);
        bytes.extend_from_slice(&[1; 100]);
        assert!(seen.received(&bytes));
    }

    async fn read_all_of(conn: &mut HandshakeDeadline<tokio::io::DuplexStream>, n: usize) {
        let mut buf = vec![0; n];
        conn.read_exact(&mut buf).await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_or_stalled_client_times_out_and_a_whole_handshake_does_not() {
        let timeout = Duration::from_secs(10);
        let bytes = handshake(2);

        // Nothing at all.
        let (server, _client) = tokio::io::duplex(1024);
        let mut conn = HandshakeDeadline::new(server, timeout);
        let started = tokio::time::Instant::now();
        let err = conn.read_u8().await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(
            err.to_string().contains("no HTTP/2 handshake within 10s"),
            "{err}"
        );
        assert_eq!(started.elapsed(), timeout);

        // The preface, then nothing: a stall inside the handshake.
        let (server, mut client) = tokio::io::duplex(1024);
        let mut conn = HandshakeDeadline::new(server, timeout);
        client.write_all(&bytes[..PREFACE_LEN + 4]).await.unwrap();
        read_all_of(&mut conn, PREFACE_LEN + 4).await;
        let err = conn.read_u8().await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);

        // The whole handshake: the connection may then be idle for as long as HTTP/2 allows.
        let (server, mut client) = tokio::io::duplex(1024);
        let mut conn = HandshakeDeadline::new(server, timeout);
        client.write_all(&bytes).await.unwrap();
        read_all_of(&mut conn, bytes.len()).await;
        let idle = tokio::time::timeout(timeout * 3, conn.read_u8()).await;
        assert!(idle.is_err(), "the read still waits: {idle:?}");
        client.write_all(&[42]).await.unwrap();
        assert_eq!(conn.read_u8().await.unwrap(), 42);
    }
}
