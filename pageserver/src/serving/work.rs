//! Where a request's storage work runs: on the blocking pool ([`blocking`]), or on a thread of
//! its own for work that may wait on a client or the object store for long
//! ([`on_own_thread`]). Either way the work runs to completion even if the request is dropped,
//! so that no batch, flush or import is abandoned halfway when a client hangs up.

use super::error::ServeError;

/// Runs `work` on a thread of its own (named `name`), holding `permit` until it ends, to
/// completion even if the request is dropped: for work that may wait on a client or the
/// object store for long, which must not hold a thread of the shared blocking pool (see
/// `tenant::admission`).
pub async fn on_own_thread<T, E, F>(
    name: &str,
    permit: crate::tenant::admission::Permit,
    work: F,
) -> Result<T, E>
where
    F: FnOnce() -> Result<T, E> + Send + 'static,
    T: Send + 'static,
    E: From<ServeError> + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work))
                .unwrap_or_else(|_| Err(ServeError::internal("the work panicked").into()));
            drop(permit);
            let _ = tx.send(result);
        })
        .map_err(|e| ServeError::internal(format!("no thread for {name}: {e}")))?;
    rx.await
        .map_err(|_| ServeError::internal(format!("{name} ended without an answer")))?
}

/// Runs storage work on the blocking pool, to completion even if the request is dropped.
pub async fn blocking<T, E, F>(work: F) -> Result<T, E>
where
    F: FnOnce() -> Result<T, E> + Send + 'static,
    T: Send + 'static,
    E: From<ServeError> + Send + 'static,
{
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ServeError::internal(format!("request task failed: {e}")))?
}
