//! The one retry loop of remote storage, and the one classification of the store's errors it
//! runs on.
//!
//! # Classification
//!
//! Every `object_store` error is either **transient** (another attempt may succeed: timeouts,
//! connection errors, 5xx answers, 408 and 429, S3's `RequestTimeout` and `SlowDown`) or
//! **permanent** (the same request will fail the same way; each its own [`RemoteError`]):
//!
//! | the store's answer | [`RemoteError`] |
//! |---|---|
//! | 404, `NoSuchKey` | [`NotFound`](RemoteError::NotFound) |
//! | `NoSuchBucket` (a 404 naming the bucket) | [`NoSuchBucket`](RemoteError::NoSuchBucket) |
//! | 403, `AccessDenied` | [`AccessDenied`](RemoteError::AccessDenied) |
//! | 401, `InvalidAccessKeyId`, `SignatureDoesNotMatch`, `ExpiredToken` | [`Unauthenticated`](RemoteError::Unauthenticated) |
//! | any other 4xx, an unsupported operation | [`Rejected`](RemoteError::Rejected) |
//!
//! # Retries
//!
//! `object_store`'s own retries are off (`max_retries = 0`, see `s3.rs`): there is one layer of
//! retries, this one, because only it knows the key (every failed attempt is logged with it),
//! the fault injection, and the operation's deadline. A transient failure is retried with
//! exponential backoff and jitter (backon; 50 ms doubling to 2 s); a permanent one ends the
//! operation at once. No attempt starts once the operation's deadline ([`RetryPolicy::timeout`],
//! `remote_storage_operation_timeout`) would pass during its backoff; against S3 the deadline is
//! also hard: an attempt still running at it is cut off, so the caller has its error by then
//! whatever the network does. A local directory's attempts are file system calls, which cannot
//! be cut off, so only the first rule holds there.
//!
//! A transfer in parts (`transfer.rs`) retries each part on its own, with a deadline of its own:
//! a long download that keeps moving is never cut off, and a stalled one fails within one
//! deadline of its last part.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use backon::{ExponentialBuilder, Retryable};

use crate::{RemoteError, RemotePath, RemoteStorage};

/// How an operation is retried. Backoff starts at `initial` and doubles up to `max_backoff`,
/// with jitter; `timeout` is the operation's deadline (see the module documentation).
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
            timeout: crate::Deadlines::default().operation,
        }
    }
}

/// What one attempt's failure means for the next.
#[derive(Debug)]
pub(crate) enum AttemptError {
    /// A retry cannot change it.
    Final(RemoteError),
    /// Worth another attempt.
    Transient(String),
}

impl AttemptError {
    fn is_transient(&self) -> bool {
        matches!(self, AttemptError::Transient(_))
    }
}

/// Where an error happened, for its message.
#[derive(Clone, Copy)]
pub(crate) struct Context<'a> {
    pub op: &'static str,
    pub key: &'a RemotePath,
    /// The store's description (bucket, prefix, endpoint).
    pub store: &'a str,
}

/// Sorts an `object_store` error into a permanent [`RemoteError`] or a transient failure; see
/// the module documentation.
pub(crate) fn classify(cx: Context<'_>, e: object_store::Error) -> AttemptError {
    use object_store::Error as E;
    // Display prints the whole chain of sources, down to the answer's status and body.
    let text = e.to_string();
    let code = s3_error_code(&text);
    let status = http_status(&text);
    let (op, key, store) = (cx.op, cx.key.to_string(), cx.store.to_owned());
    let reason = format!("{op}: {text}");
    match (&e, code) {
        (_, Some("NoSuchBucket")) => AttemptError::Final(RemoteError::NoSuchBucket { op, store }),
        (E::NotFound { .. }, _) => AttemptError::Final(RemoteError::NotFound { key }),
        (E::InvalidPath { .. }, _) => AttemptError::Final(RemoteError::BadKey { key, reason }),
        (E::PermissionDenied { .. }, _)
        | (_, Some("AccessDenied" | "AllAccessDisabled" | "AccountProblem")) => {
            AttemptError::Final(RemoteError::AccessDenied {
                op,
                key,
                store,
                reason,
            })
        }
        (E::Unauthenticated { .. }, _)
        | (
            _,
            Some(
                "InvalidAccessKeyId"
                | "SignatureDoesNotMatch"
                | "ExpiredToken"
                | "InvalidToken"
                | "TokenRefreshRequired",
            ),
        ) => AttemptError::Final(RemoteError::Unauthenticated {
            op,
            key,
            store,
            reason,
        }),
        (
            E::AlreadyExists { .. }
            | E::Precondition { .. }
            | E::NotModified { .. }
            | E::NotSupported { .. }
            | E::NotImplemented { .. }
            | E::UnknownConfigurationKey { .. },
            _,
        ) => AttemptError::Final(RemoteError::Rejected { op, key, reason }),
        (_, Some("RequestTimeout" | "SlowDown" | "InternalError" | "ServiceUnavailable")) => {
            AttemptError::Transient(reason)
        }
        (_, _) => match status {
            Some(s) if (400..500).contains(&s) && s != 408 && s != 429 => {
                AttemptError::Final(RemoteError::Rejected { op, key, reason })
            }
            // 5xx, 408, 429, or no answer at all (connect, timeout, a cut connection).
            _ => AttemptError::Transient(reason),
        },
    }
}

/// The S3 error code of an error answer (`<Code>NoSuchBucket</Code>`), if the text has one.
pub(crate) fn s3_error_code(text: &str) -> Option<&str> {
    let start = text.find("<Code>")? + "<Code>".len();
    let len = text[start..].find("</Code>")?;
    Some(&text[start..start + len])
}

/// The HTTP status of an error answer. `object_store` keeps it in a type it does not export
/// (its `RetryError`), whose message reads "...status code: 503 Service Unavailable: ...".
fn http_status(text: &str) -> Option<u16> {
    let at = text.find("status code: ")? + "status code: ".len();
    text[at..].get(..3)?.parse().ok()
}

impl RemoteStorage {
    pub(crate) fn context<'a>(&'a self, op: &'static str, key: &'a RemotePath) -> Context<'a> {
        Context {
            op,
            key,
            store: &self.description,
        }
    }

    /// Runs `attempt` until it succeeds, fails for good, or its deadline passes, under the
    /// retry policy (see the module documentation), each attempt first passing the fault
    /// injection.
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
        let deadline = self.retry.timeout;
        let attempts = AtomicU32::new(0);
        let last_failure = Mutex::new(String::new());
        let backoff = ExponentialBuilder::default()
            .with_min_delay(self.retry.initial)
            .with_max_delay(self.retry.max_backoff)
            .with_jitter()
            .without_max_times();
        let run = (|| {
            attempts.fetch_add(1, Ordering::Relaxed);
            let injected = self
                .faults
                .as_ref()
                .is_some_and(|faults| faults.should_fail(op, key));
            let attempt = attempt();
            async move {
                if injected {
                    return Err(AttemptError::Transient(format!(
                        "{op}: injected failure (test_remote_failures)"
                    )));
                }
                attempt.await
            }
        })
        .retry(backoff)
        .sleep(tokio::time::sleep)
        .when(AttemptError::is_transient)
        // No attempt that would start past the deadline.
        .adjust(|_, delay| delay.filter(|d| started.elapsed() + *d < deadline))
        .notify(|e, delay| {
            if let AttemptError::Transient(reason) = e {
                tracing::warn!(op, key = %key, attempt = attempts.load(Ordering::Relaxed),
                    retry_in_ms = delay.as_millis() as u64, "remote operation failed: {reason}");
                *last_failure.lock().unwrap_or_else(|e| e.into_inner()) = reason.clone();
            }
        });
        let outcome = if self.hard_deadline {
            match tokio::time::timeout(deadline, run).await {
                Ok(outcome) => outcome,
                Err(_) => {
                    let last = last_failure
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .clone();
                    Err(AttemptError::Transient(if last.is_empty() {
                        format!("{op}: no answer within the deadline of {deadline:?}")
                    } else {
                        format!("{op}: no answer within the deadline of {deadline:?}; before that: {last}")
                    }))
                }
            }
        } else {
            run.await
        };
        let attempts = attempts.load(Ordering::Relaxed);
        match outcome {
            Ok(value) => {
                if let Some(faults) = &self.faults {
                    faults.succeeded(op, key);
                }
                Ok(value)
            }
            Err(AttemptError::Final(e)) => {
                if e.needs_operator() {
                    tracing::error!(op, key = %key, "remote operation failed, and retrying cannot help: {e}");
                }
                Err(e)
            }
            Err(AttemptError::Transient(reason)) => {
                let elapsed = started.elapsed();
                tracing::error!(op, key = %key, attempts, "remote operation failed, giving up: {reason}");
                Err(RemoteError::Failed {
                    op,
                    key: key.to_string(),
                    attempts,
                    elapsed,
                    reason,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_and_statuses_are_read_from_the_answer() {
        let text = "Generic S3 error: Error performing GET http://127.0.0.1:1/b/k in 2ms - \
                    Server returned non-2xx status code: 404 Not Found: <?xml version=\"1.0\"?>\
                    <Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist\
                    </Message></Error>";
        assert_eq!(s3_error_code(text), Some("NoSuchBucket"));
        assert_eq!(http_status(text), Some(404));
        assert_eq!(s3_error_code("no code here"), None);
        assert_eq!(http_status("connection refused"), None);
    }

    #[test]
    fn errors_are_sorted_into_permanent_and_transient() {
        let key = RemotePath::new("a/b").unwrap();
        let cx = Context {
            op: "get",
            key: &key,
            store: "S3 bucket b",
        };
        let generic = |text: &str| object_store::Error::Generic {
            store: "S3",
            source: text.to_owned().into(),
        };
        let boxed = |text: &str| -> Box<dyn std::error::Error + Send + Sync> { text.into() };
        let permanent = |e| matches!(classify(cx, e), AttemptError::Final(_));
        assert!(matches!(
            classify(
                cx,
                object_store::Error::NotFound {
                    path: "a/b".into(),
                    source: boxed("404")
                }
            ),
            AttemptError::Final(RemoteError::NotFound { .. })
        ));
        assert!(matches!(
            classify(
                cx,
                object_store::Error::PermissionDenied {
                    path: "a/b".into(),
                    source: boxed("403")
                }
            ),
            AttemptError::Final(RemoteError::AccessDenied { .. })
        ));
        assert!(matches!(
            classify(
                cx,
                object_store::Error::Unauthenticated {
                    path: "a/b".into(),
                    source: boxed("401")
                }
            ),
            AttemptError::Final(RemoteError::Unauthenticated { .. })
        ));
        assert!(matches!(
            classify(
                cx,
                generic("status code: 404 Not Found: <Error><Code>NoSuchBucket</Code></Error>")
            ),
            AttemptError::Final(RemoteError::NoSuchBucket { .. })
        ));
        assert!(matches!(
            classify(
                cx,
                generic("status code: 403 Forbidden: <Error><Code>InvalidAccessKeyId</Code>")
            ),
            AttemptError::Final(RemoteError::Unauthenticated { .. })
        ));
        assert!(permanent(generic(
            "status code: 400 Bad Request: <Error><Code>AuthorizationHeaderMalformed</Code>"
        )));
        for transient in [
            "status code: 503 Service Unavailable: <Error><Code>SlowDown</Code></Error>",
            "status code: 500 Internal Server Error: ",
            "status code: 429 Too Many Requests: ",
            "status code: 400 Bad Request: <Error><Code>RequestTimeout</Code></Error>",
            "error sending request: operation timed out",
            "error trying to connect: tcp connect error: Connection refused (os error 111)",
        ] {
            assert!(!permanent(generic(transient)), "{transient}");
        }
    }
}
