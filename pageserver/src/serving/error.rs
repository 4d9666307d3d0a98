//! What went wrong with a request, in words both doors use: a [`ServeError`] is an
//! [`ErrorKind`] and a message. The kind says what a client can do about it; each door maps it
//! once to its own statuses (`http::error` to an HTTP status, `grpc::status_of` to a gRPC
//! code), so a client sees the same words on either door.
//!
//! The storage layers' errors become kinds here, once: [`TimelineError`], [`TenantError`],
//! and the admission bounds' [`Busy`] and [`DownloadError`].

use crate::io::read_cost::ReadCost;
use crate::tenant::admission::{Busy, DownloadError};
use crate::tenant::mgr::TenantError;
use crate::tenant::timeline::TimelineError;

/// What a client can make of a failed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request itself is malformed: the same request fails again.
    BadRequest,
    /// No credentials, or ones that are not valid.
    Unauthenticated,
    /// Valid credentials that do not cover what was asked.
    Forbidden,
    /// What the request names does not exist.
    NotFound,
    /// The request contradicts the state it meets (a timeline's history, another writer).
    Conflict,
    /// History below the GC cutoff: gone for good, unlike a state that may change.
    Gone,
    /// A valid request the stored history cannot answer as asked: a page that needs
    /// PostgreSQL's redo at that LSN (the message names an LSN that answers).
    Unprocessable,
    /// A bound or a passing state refuses it now; it may work shortly (HTTP says when).
    TryAgain,
    /// The object store failed or answered with something we cannot use.
    Upstream,
    /// A failure of ours.
    Internal,
}

/// A failed request: what kind of failure, and the words for it.
#[derive(Debug)]
pub struct ServeError {
    pub kind: ErrorKind,
    pub msg: String,
    /// What the read cost, for a read that found what it reports (a page that needs
    /// PostgreSQL's redo): HTTP sends it in `X-Read-Cost`, as for a page.
    pub cost: Option<ReadCost>,
}

impl ServeError {
    pub fn new(kind: ErrorKind, msg: impl Into<String>) -> ServeError {
        ServeError {
            kind,
            msg: msg.into(),
            cost: None,
        }
    }

    /// The error of a read that cost `cost`.
    pub fn with_cost(self, cost: ReadCost) -> ServeError {
        ServeError {
            cost: Some(cost),
            ..self
        }
    }

    pub fn bad_request(msg: impl Into<String>) -> ServeError {
        ServeError::new(ErrorKind::BadRequest, msg)
    }

    pub fn not_found(msg: impl Into<String>) -> ServeError {
        ServeError::new(ErrorKind::NotFound, msg)
    }

    /// A refusal that will pass (work at its bound).
    pub fn try_again(msg: impl Into<String>) -> ServeError {
        ServeError::new(ErrorKind::TryAgain, msg)
    }

    pub fn internal(msg: impl Into<String>) -> ServeError {
        ServeError::new(ErrorKind::Internal, msg)
    }

    /// A page with no version at or below the LSN read at: the same words on every door.
    pub fn no_version(key: pageserver_api::Key, lsn: utils::Lsn) -> ServeError {
        ServeError::not_found(format!("page {key} has no version at or below {lsn}"))
    }

    /// The message as a client sees it: a failure of ours without the server's paths
    /// ([`redact_paths`]); the log has the whole message.
    pub fn client_message(&self) -> String {
        match self.kind {
            ErrorKind::TryAgain | ErrorKind::Upstream | ErrorKind::Internal => {
                redact_paths(&self.msg)
            }
            _ => self.msg.clone(),
        }
    }
}

impl std::fmt::Display for ServeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.msg)
    }
}

/// The kind of a timeline error.
fn timeline_kind(e: &TimelineError) -> ErrorKind {
    use TimelineError::*;
    match e {
        // The request contradicts the timeline's history.
        // ... or another writer's: an import holds the timeline until it finishes.
        LsnDurable { .. } | LsnNotAdvancing { .. } | ImportInProgress => ErrorKind::Conflict,
        // The batch itself is malformed.
        BatchLsnBackwards { .. }
        | BatchDuplicate { .. }
        | BatchValue { .. }
        | PageTooLarge { .. }
        | Reserved { .. }
        | BatchSpanTooWide { .. } => ErrorKind::BadRequest,
        // That history is gone for good.
        BelowGcCutoff { .. } => ErrorKind::Gone,
        // Stored, but only PostgreSQL's redo makes the page at that LSN.
        NeedsWalRedo { .. } => ErrorKind::Unprocessable,
        // Retrying later may succeed.
        LsnNotYetIngested { .. }
        | WaitLsnTimeout { .. }
        | TooManyLsnWaiters { .. }
        | IngestStopped { .. }
        // The store takes no uploads for now; the batch was not stored.
        | UploadQueueFull { .. }
        | Broken { .. }
        | ShuttingDown
        // The remote store did not give the layer; it may later.
        | LayerDownload { .. } => ErrorKind::TryAgain,
        Put(_)
        | Get(_)
        | Freeze(_)
        | Flush(_)
        | Layer(_)
        | Metadata(_)
        | ChangeIndeterminate(_)
        | LayerSet { .. }
        | Redo { .. }
        | Io { .. } => ErrorKind::Internal,
    }
}

impl From<TimelineError> for ServeError {
    fn from(e: TimelineError) -> ServeError {
        ServeError::new(timeline_kind(&e), e.to_string())
    }
}

impl From<TenantError> for ServeError {
    fn from(e: TenantError) -> ServeError {
        let kind = match &e {
            TenantError::TenantNotFound(_)
            | TenantError::TimelineNotFound { .. }
            | TenantError::NotInRemoteStorage(_) => ErrorKind::NotFound,
            TenantError::TenantExists(_)
            | TenantError::TenantBeingDeleted(_)
            | TenantError::TimelineExists { .. }
            | TenantError::TimelineBeingDeleted { .. }
            | TenantError::TimelineHasBranches { .. }
            | TenantError::InvalidBranch { .. }
            | TenantError::GenerationNotNewer { .. } => ErrorKind::Conflict,
            TenantError::TenantBroken { .. } | TenantError::ShuttingDown => ErrorKind::TryAgain,
            TenantError::Io { .. } => ErrorKind::Internal,
            // The store did not answer, or answered with something we cannot use.
            TenantError::Remote(_) | TenantError::AttachedBroken { .. } => ErrorKind::Upstream,
            TenantError::Timeline(inner) => timeline_kind(inner),
        };
        ServeError::new(kind, e.to_string())
    }
}

impl From<Busy> for ServeError {
    fn from(e: Busy) -> ServeError {
        ServeError::try_again(e.to_string())
    }
}

impl From<DownloadError> for ServeError {
    fn from(e: DownloadError) -> ServeError {
        match e {
            DownloadError::Busy(busy) => busy.into(),
            // The store failed or did not answer in time (its deadlines are remote storage's).
            failed @ DownloadError::Failed { .. } => ServeError::try_again(failed.to_string()),
        }
    }
}

/// `msg` with every file system path cut down to names the client knows: from the work
/// directory's `tenants/` on (`tenants/<tenant>/timelines/<timeline>/<file>`), or the file name
/// alone for a path elsewhere. Storage errors name files by their whole path, which is what
/// the server's log needs but not what a client should see of the machine.
///
/// A path is a word that starts with `/` or has a `tenants/` component; quotes and brackets
/// around it and punctuation after it stay. LSNs (`0/16B5A50`) are not paths.
pub fn redact_paths(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    let mut rest = msg;
    while !rest.is_empty() {
        let word_end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        let (word, tail) = rest.split_at(word_end);
        let space_end = tail
            .find(|c: char| !c.is_whitespace())
            .unwrap_or(tail.len());
        let (space, tail) = tail.split_at(space_end);
        let core_start = word
            .find(|c: char| !"\"'`([<".contains(c))
            .unwrap_or(word.len());
        let core_len = word[core_start..]
            .trim_end_matches(|c: char| "\"'`)]>,;:.".contains(c))
            .len();
        let core = &word[core_start..core_start + core_len];
        let is_path = (core.starts_with('/') && core.len() > 1)
            || core.starts_with("tenants/")
            || core.contains("/tenants/");
        if is_path {
            out.push_str(&word[..core_start]);
            out.push_str(&client_path(core));
            out.push_str(&word[core_start + core_len..]);
        } else {
            out.push_str(word);
        }
        out.push_str(space);
        rest = tail;
    }
    out
}

fn client_path(path: &str) -> String {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    match parts
        .iter()
        .rposition(|p| *p == crate::tenant::mgr::TENANTS_DIR)
    {
        Some(at) => parts[at..].join("/"),
        None => parts.last().copied().unwrap_or_default().to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_cut_to_the_tenants_names() {
        let tl =
            "tenants/0123456789abcdef0123456789abcdef/timelines/fedcba9876543210fedcba9876543210";
        let cases = [
            (
                format!("/srv/ps/{tl}.___temp: No such file or directory (os error 2)"),
                format!("{tl}.___temp: No such file or directory (os error 2)"),
            ),
            (
                format!("timeline metadata /srv/ps/{tl}/metadata: Permission denied"),
                format!("timeline metadata {tl}/metadata: Permission denied"),
            ),
            (
                format!("layer \"/srv/ps/{tl}/x\" is corrupt"),
                format!("layer \"{tl}/x\" is corrupt"),
            ),
            (
                format!("relative .pageserver/{tl}/metadata."),
                format!("relative {tl}/metadata."),
            ),
            (
                "key file (/etc/keys/auth.pem) unreadable".to_owned(),
                "key file (auth.pem) unreadable".to_owned(),
            ),
            // The workdir itself may be named `tenants`: the last such component counts.
            (
                format!("/home/tenants/x/{tl}/metadata"),
                format!("{tl}/metadata"),
            ),
        ];
        for (from, to) in cases {
            assert_eq!(redact_paths(&from), to);
        }
        // Not paths: LSNs, endpoints' text without a leading slash, a lone slash.
        for text in [
            "timed out after 60s waiting for LSN 0/21; the last ingested LSN is 0/20",
            "a / b",
            "  spaced\tout  ",
        ] {
            assert_eq!(redact_paths(text), text);
        }
    }

    #[test]
    fn only_failures_on_our_side_are_redacted() {
        let path = "/srv/x/tenants/t: gone";
        assert_eq!(
            ServeError::internal(path).client_message(),
            "tenants/t: gone"
        );
        assert_eq!(
            ServeError::try_again(path).client_message(),
            "tenants/t: gone"
        );
        assert_eq!(
            ServeError::not_found("no such endpoint: /v1/nothing").client_message(),
            "no such endpoint: /v1/nothing"
        );
    }
}
