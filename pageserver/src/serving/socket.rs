//! Delegation for the wrappers both doors put around a connection's socket (a cap on
//! connections, a handshake deadline, a stall detector on writes): each wrapper writes out only
//! the calls it changes, and these macros forward the rest to the wrapped stream unchanged,
//! vectored writes included (a wrapper that forgot `poll_write_vectored` would make every
//! write of a response one system call per buffer).
//!
//! `delegate_async_read!([generics] Type, field)` and `delegate_async_write!(...)` implement
//! tokio's `AsyncRead` / `AsyncWrite` for `Type` by forwarding to `self.field`, which must be
//! `Unpin`.

/// Implements `AsyncRead` for a wrapper by forwarding to one of its fields.
macro_rules! delegate_async_read {
    ([$($generics:tt)*] $wrapper:ty, $field:ident) => {
        impl<$($generics)*> tokio::io::AsyncRead for $wrapper {
            fn poll_read(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &mut tokio::io::ReadBuf<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                tokio::io::AsyncRead::poll_read(std::pin::Pin::new(&mut self.$field), cx, buf)
            }
        }
    };
}

/// Implements `AsyncWrite` for a wrapper by forwarding every call to one of its fields.
macro_rules! delegate_async_write {
    ([$($generics:tt)*] $wrapper:ty, $field:ident) => {
        impl<$($generics)*> tokio::io::AsyncWrite for $wrapper {
            fn poll_write(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                tokio::io::AsyncWrite::poll_write(std::pin::Pin::new(&mut self.$field), cx, buf)
            }

            fn poll_write_vectored(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                tokio::io::AsyncWrite::poll_write_vectored(std::pin::Pin::new(&mut self.$field), cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                tokio::io::AsyncWrite::is_write_vectored(&self.$field)
            }

            fn poll_flush(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                tokio::io::AsyncWrite::poll_flush(std::pin::Pin::new(&mut self.$field), cx)
            }

            fn poll_shutdown(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                tokio::io::AsyncWrite::poll_shutdown(std::pin::Pin::new(&mut self.$field), cx)
            }
        }
    };
}

pub(crate) use {delegate_async_read, delegate_async_write};
