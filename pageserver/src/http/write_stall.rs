//! A socket whose writes fail once they have made no progress for a while.
//!
//! hyper has no write timeout: a client that asks for a large response (a scan page of a
//! thousand 8 KiB pages is about 11 MiB of JSON) and never reads it keeps the connection and the
//! whole response in memory for as long as it likes, and a few hundred such clients hold
//! gigabytes. [`WriteStall`] sits between hyper and the socket: when a write, flush or shutdown
//! has been pending for `http_response_write_timeout` without the socket taking a byte, it fails
//! with `TimedOut`; hyper then drops the connection and the response with it.
//!
//! Only a stall counts, not the length of the whole response, so a slow but reading client is
//! never cut off. Reads are not affected (the header read timeout and the body stall timeout
//! cover them).

use std::future::Future as _;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::{Instant, Sleep};

use crate::serving::socket::delegate_async_read;

/// See the module docs.
pub struct WriteStall<S> {
    inner: S,
    timeout: Duration,
    /// When the pending write gives up; meaningful while `armed`.
    deadline: Pin<Box<Sleep>>,
    /// A write is pending and `deadline` runs for it.
    armed: bool,
}

impl<S> WriteStall<S> {
    pub fn new(inner: S, timeout: Duration) -> WriteStall<S> {
        WriteStall {
            inner,
            timeout,
            deadline: Box::pin(tokio::time::sleep(timeout)),
            armed: false,
        }
    }

    /// Passes a ready result through (any progress ends the stall); a pending one arms the
    /// deadline, or fails once it has passed.
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        result: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if result.is_ready() {
            self.armed = false;
            return result;
        }
        if !self.armed {
            self.deadline.as_mut().reset(Instant::now() + self.timeout);
            self.armed = true;
        }
        if self.deadline.as_mut().poll(cx).is_ready() {
            self.armed = false;
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the client read nothing of the response for {:?} (http_response_write_timeout)",
                    self.timeout
                ),
            )));
        }
        Poll::Pending
    }
}

delegate_async_read!([S: AsyncRead + Unpin] WriteStall<S>, inner);

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteStall<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.watch(cx, result)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.watch(cx, result)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut self.inner).poll_flush(cx);
        self.watch(cx, result)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.watch(cx, result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A socket that takes `budget` bytes, then is never ready again.
    struct Clogged {
        budget: usize,
    }

    impl AsyncWrite for Clogged {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            if self.budget == 0 {
                return Poll::Pending;
            }
            let n = buf.len().min(self.budget);
            self.budget -= n;
            Poll::Ready(Ok(n))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    async fn write(io: &mut WriteStall<Clogged>, buf: &[u8]) -> io::Result<usize> {
        std::future::poll_fn(|cx| Pin::new(&mut *io).poll_write(cx, buf)).await
    }

    #[tokio::test]
    async fn a_stalled_write_fails_after_the_timeout_and_progress_resets_it() {
        let mut io = WriteStall::new(Clogged { budget: 10 }, Duration::from_millis(50));
        assert_eq!(write(&mut io, &[0; 8]).await.unwrap(), 8);
        assert_eq!(write(&mut io, &[0; 8]).await.unwrap(), 2);
        let started = std::time::Instant::now();
        let error = write(&mut io, &[0; 8]).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(error.to_string().contains("http_response_write_timeout"));
        assert!(started.elapsed() >= Duration::from_millis(50));
        // The socket takes bytes again: writes go through, and a new stall gets a full timeout.
        io.inner.budget = 4;
        assert_eq!(write(&mut io, &[0; 8]).await.unwrap(), 4);
        let started = std::time::Instant::now();
        write(&mut io, &[0; 8]).await.unwrap_err();
        assert!(started.elapsed() >= Duration::from_millis(50));
    }
}
