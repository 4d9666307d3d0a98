//! The connection cap both doors share (`max_connections`): a connection holds a place from
//! before it is accepted (HTTP) or from its accept (the page service) until it closes, so the
//! descriptors of connections stay bounded whichever door they come through. The page service
//! may hold all places but a floor kept for HTTP ([`ConnectionLimit::http_floor`]): its
//! connections are long-lived and may sit idle, and must never lock the HTTP API out.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The connection cap: permits taken by the accept loop, one per open connection (and one
/// for the connection it is waiting to accept).
pub struct ConnectionLimit {
    permits: Arc<Semaphore>,
    /// The places the page service may hold: all but [`Self::http_floor`], so that page
    /// service connections (which may sit idle for hours) can never lock the HTTP API out.
    page_service_permits: Arc<Semaphore>,
    max: usize,
    open: AtomicUsize,
}

impl ConnectionLimit {
    pub fn new(max: usize) -> ConnectionLimit {
        let floor = Self::http_floor(max);
        ConnectionLimit {
            permits: Arc::new(Semaphore::new(max)),
            page_service_permits: Arc::new(Semaphore::new(max - floor)),
            max,
            open: AtomicUsize::new(0),
        }
    }

    /// Places only HTTP connections may take: a quarter of the cap, at most 16, at least
    /// one (none when the cap is a single connection).
    pub fn http_floor(max: usize) -> usize {
        (max / 4).clamp(1, 16).min(max.saturating_sub(1))
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// A place under the cap for the HTTP connection about to be accepted: waits while the
    /// cap is reached. It counts as open once [`Place::accepted`].
    pub async fn reserve_http(self: &Arc<Self>) -> Place {
        Place {
            limit: self.clone(),
            permit: acquire(&self.permits).await,
        }
    }

    /// A place under the cap for a page service connection: waits while the cap, or the
    /// page service's share of it (all but [`Self::http_floor`]), is reached. The cap bounds
    /// the connections of both doors together.
    pub async fn admit_page_service(self: &Arc<Self>) -> Admitted {
        let share = acquire(&self.page_service_permits).await;
        let mut admitted = Admitted::new(self.clone(), acquire(&self.permits).await);
        admitted.share = Some(share);
        admitted
    }
}

async fn acquire(permits: &Arc<Semaphore>) -> OwnedSemaphorePermit {
    permits
        .clone()
        .acquire_owned()
        .await
        .expect("the semaphore is never closed")
}

/// A place under the cap taken before its connection is accepted.
pub struct Place {
    limit: Arc<ConnectionLimit>,
    permit: OwnedSemaphorePermit,
}

impl Place {
    /// The place of the connection just accepted.
    pub fn accepted(self) -> Admitted {
        Admitted::new(self.limit, self.permit)
    }
}

/// One accepted connection's place under the cap, given back when it is dropped.
pub struct Admitted {
    limit: Arc<ConnectionLimit>,
    _permit: OwnedSemaphorePermit,
    /// A page service connection's place in its share.
    share: Option<OwnedSemaphorePermit>,
}

impl Admitted {
    fn new(limit: Arc<ConnectionLimit>, permit: OwnedSemaphorePermit) -> Admitted {
        limit.open.fetch_add(1, Ordering::Relaxed);
        Admitted {
            limit,
            _permit: permit,
            share: None,
        }
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.limit.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// As hyper 0.14 and `axum::serve` do: errors of one connection are its own; anything else
/// (EMFILE: out of descriptors) is worth an error line and a pause before accepting again.
pub async fn accept_error(e: io::Error) {
    if matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    ) {
        return;
    }
    tracing::error!("accepting a connection failed: {e}; pausing for a second");
    tokio::time::sleep(Duration::from_secs(1)).await;
}
