//! Retries: how long an operation is retried, and which failures are worth another attempt.

use std::time::{Duration, Instant};

use crate::{RemoteError, RemotePath, RemoteStorage};

/// How long an operation is retried. Backoff starts at `initial` and doubles up to
/// `max_backoff`; no new attempt starts once `timeout` has passed since the first.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    pub initial: Duration,
    pub max_backoff: Duration,
    pub timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            initial: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
            timeout: Duration::from_secs(30),
        }
    }
}

/// What one attempt's failure means for the next.
pub(crate) enum AttemptError {
    /// A retry cannot change it.
    Final(RemoteError),
    /// Worth another attempt.
    Transient(String),
}

impl From<object_store::Error> for AttemptError {
    fn from(e: object_store::Error) -> Self {
        AttemptError::Transient(e.to_string())
    }
}

/// Maps the errors a retry cannot change; everything else is transient.
pub(crate) fn classify(op: &'static str, key: &RemotePath, e: object_store::Error) -> AttemptError {
    match e {
        object_store::Error::NotFound { .. } => AttemptError::Final(RemoteError::NotFound {
            key: key.to_string(),
        }),
        object_store::Error::InvalidPath { .. } => AttemptError::Final(RemoteError::BadKey {
            key: key.to_string(),
            reason: e.to_string(),
        }),
        e => AttemptError::Transient(format!("{op}: {e}")),
    }
}

impl RemoteStorage {
    /// Runs `attempt` until it succeeds or fails for good, under the retry policy, each
    /// attempt first passing the fault injection.
    pub(crate) async fn retrying<T, F, Fut>(
        &self,
        op: &'static str,
        key: &RemotePath,
        mut attempt: F,
    ) -> Result<T, RemoteError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, AttemptError>>,
    {
        let started = Instant::now();
        let mut backoff = self.retry.initial;
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let outcome = match &self.faults {
                Some(faults) if faults.should_fail(op, key) => Err(AttemptError::Transient(
                    format!("{op}: injected failure (test_remote_failures)"),
                )),
                _ => attempt().await,
            };
            let reason = match outcome {
                Ok(value) => {
                    if let Some(faults) = &self.faults {
                        faults.succeeded(op, key);
                    }
                    return Ok(value);
                }
                Err(AttemptError::Final(e)) => return Err(e),
                Err(AttemptError::Transient(reason)) => reason,
            };
            let elapsed = started.elapsed();
            if elapsed + backoff > self.retry.timeout {
                tracing::error!(op, key = %key, attempts, "remote operation failed, giving up: {reason}");
                return Err(RemoteError::Failed {
                    op,
                    key: key.to_string(),
                    attempts,
                    elapsed,
                    reason,
                });
            }
            tracing::warn!(op, key = %key, attempt = attempts, retry_in_ms = backoff.as_millis() as u64,
                "remote operation failed: {reason}");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(self.retry.max_backoff);
        }
    }
}
