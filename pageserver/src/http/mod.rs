//! The HTTP API (docs/http-api.md, docs/openapi.yaml).
//!
//! Handlers parse every id, key, LSN and body themselves, so that each mistake gets a
//! `{"msg": ...}` that says what is wrong (see [`error`]). Storage work (ingest,
//! checkpoints, reads that need the disk) runs on the blocking pool via [`blocking`]: a spawned
//! task runs to completion even if the client hangs up, so no flush or batch is ever abandoned
//! halfway. A read that the page cache can answer whole runs in place instead ([`read`]), on
//! the async worker, without the hand-off to a pool thread and back.
//!
//! Middleware, outermost first: request accounting (a counter per method, route and status, a
//! latency histogram per route and method, a log line per failed request), then auth
//! ([`auth`]) when enabled, then the request body limits ([`body_limits`]). Connections, their
//! cap and the header read timeout are [`server`]'s.
//!
//! Metric labels never take a client's text: a method outside the standard nine is `other`,
//! and the route is the matched route's template (`/v1/tenant/{tenant_id}`), or `unmatched`,
//! never the path. So however a client probes, the series stay a fixed, small set.

pub use crate::serving::auth;
pub mod body_limits;
pub mod error;
pub mod metrics_page;
pub mod routes;
pub mod server;
pub mod write_stall;

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;

use axum::http::StatusCode;

use crate::config::PageServerConf;
use crate::page_cache::PageCache;
use crate::tenant::admission::Admissions;
use crate::tenant::mgr::TenantManager;
use crate::tenant::timeline::scan::cursor_cache::CursorCache;
use auth::JwtAuth;
use error::ApiError;

/// What every handler can reach.
pub struct AppState {
    pub conf: PageServerConf,
    pub tenants: Arc<TenantManager>,
    pub cache: Arc<PageCache>,
    /// Cursors of paged key scans between their pages.
    pub scan_cursors: CursorCache,
    pub auth: Option<JwtAuth>,
    pub started_at: SystemTime,
    /// The bytes of request bodies being read, all requests together.
    pub body_budget: Arc<body_limits::BodyBudget>,
    /// The connection cap, shared with the accept loop ([`server::serve`]).
    pub connections: Arc<server::ConnectionLimit>,
    /// The bounds on imports, basebackups and on-demand downloads (shared with the page
    /// service).
    pub admissions: Arc<Admissions>,
}

pub type SharedState = Arc<AppState>;

/// Every route of the API. `pageserver/tests/openapi_routes.rs` keeps docs/openapi.yaml in
/// step with it.
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/v1/status"),
    ("PUT", "/v1/failpoints"),
    ("GET", "/v1/tenant"),
    ("POST", "/v1/tenant"),
    ("GET", "/v1/tenant/{tenant_id}"),
    ("DELETE", "/v1/tenant/{tenant_id}"),
    ("POST", "/v1/tenant/{tenant_id}/attach"),
    ("POST", "/v1/tenant/{tenant_id}/detach"),
    ("GET", "/v1/tenant/{tenant_id}/timeline"),
    ("POST", "/v1/tenant/{tenant_id}/timeline"),
    ("GET", "/v1/tenant/{tenant_id}/timeline/{timeline_id}"),
    ("DELETE", "/v1/tenant/{tenant_id}/timeline/{timeline_id}"),
    (
        "POST",
        "/v1/tenant/{tenant_id}/timeline/{timeline_id}/ingest",
    ),
    ("GET", "/v1/tenant/{tenant_id}/timeline/{timeline_id}/page"),
    ("GET", "/v1/tenant/{tenant_id}/timeline/{timeline_id}/keys"),
    (
        "PUT",
        "/v1/tenant/{tenant_id}/timeline/{timeline_id}/checkpoint",
    ),
    (
        "PUT",
        "/v1/tenant/{tenant_id}/timeline/{timeline_id}/compact",
    ),
    ("PUT", "/v1/tenant/{tenant_id}/timeline/{timeline_id}/gc"),
    ("GET", "/v1/tenant/{tenant_id}/timeline/{timeline_id}/layer"),
    (
        "PUT",
        "/v1/tenant/{tenant_id}/timeline/{timeline_id}/import",
    ),
    (
        "GET",
        "/v1/tenant/{tenant_id}/timeline/{timeline_id}/basebackup",
    ),
    ("GET", "/v1/page_cache"),
    ("POST", "/v1/page_cache/drop"),
    ("GET", "/metrics"),
];

pub fn router(state: SharedState) -> Router {
    use routes::*;
    // Every endpoint's latency series exists from the start, at zero.
    for (method, route) in ROUTES {
        crate::metrics::http_request_seconds().with_label_values(&[method, route]);
    }
    let metrics_page = Arc::new(metrics_page::MetricsPage::new(&state));
    Router::new()
        .route("/v1/status", get(status))
        .route("/v1/failpoints", put(failpoints))
        .route("/v1/tenant", get(tenant_list).post(tenant_create))
        .route(
            "/v1/tenant/{tenant_id}",
            get(tenant_info).delete(tenant_delete),
        )
        .route("/v1/tenant/{tenant_id}/attach", post(tenant_attach))
        .route("/v1/tenant/{tenant_id}/detach", post(tenant_detach))
        .route(
            "/v1/tenant/{tenant_id}/timeline",
            get(timeline_list).post(timeline_create),
        )
        .route(
            "/v1/tenant/{tenant_id}/timeline/{timeline_id}",
            get(timeline_info).delete(timeline_delete),
        )
        .route(
            "/v1/tenant/{tenant_id}/timeline/{timeline_id}/ingest",
            post(ingest),
        )
        .route(
            "/v1/tenant/{tenant_id}/timeline/{timeline_id}/page",
            get(get_page),
        )
        .route(
            "/v1/tenant/{tenant_id}/timeline/{timeline_id}/keys",
            get(scan_keys),
        )
        .route(
            "/v1/tenant/{tenant_id}/timeline/{timeline_id}/checkpoint",
            put(checkpoint),
        )
        .route(
            "/v1/tenant/{tenant_id}/timeline/{timeline_id}/compact",
            put(compact),
        )
        .route("/v1/tenant/{tenant_id}/timeline/{timeline_id}/gc", put(gc))
        .route(
            "/v1/tenant/{tenant_id}/timeline/{timeline_id}/layer",
            get(layer_list),
        )
        .route(
            "/v1/tenant/{tenant_id}/timeline/{timeline_id}/import",
            put(import),
        )
        .route(
            "/v1/tenant/{tenant_id}/timeline/{timeline_id}/basebackup",
            get(basebackup),
        )
        .route("/v1/page_cache", get(page_cache_stats))
        .route("/v1/page_cache/drop", post(page_cache_drop))
        .route("/metrics", get(move || metrics(metrics_page.clone())))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            body_limits::limit_body,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            check_auth,
        ))
        .layer(axum::middleware::from_fn(account))
        .with_state(state)
}

async fn not_found(request: Request) -> ApiError {
    ApiError::not_found(format!("no such endpoint: {}", request.uri().path()))
}

async fn method_not_allowed(request: Request) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::METHOD_NOT_ALLOWED,
        format!(
            "{} is not allowed on {}",
            request.method(),
            request.uri().path()
        ),
    )
}

async fn check_auth(State(state): State<SharedState>, request: Request, next: Next) -> Response {
    if let Some(auth) = &state.auth {
        if !auth::is_public(request.uri().path()) {
            let header = request
                .headers()
                .get(axum::http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok());
            if let Err(e) = auth.check(header, request.method(), request.uri().path()) {
                let mut response = e.into_response();
                if has_body(&request) {
                    // The body stays unread, so the connection cannot carry another request.
                    response.headers_mut().insert(
                        axum::http::header::CONNECTION,
                        axum::http::HeaderValue::from_static("close"),
                    );
                }
                return response;
            }
        }
    }
    next.run(request).await
}

pub(crate) fn has_body(request: &Request) -> bool {
    let headers = request.headers();
    headers.contains_key(axum::http::header::TRANSFER_ENCODING)
        || headers
            .get(axum::http::header::CONTENT_LENGTH)
            .is_some_and(|len| len != "0")
}

/// The `method` label: one of the standard methods, or `other`.
pub fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        Method::TRACE => "TRACE",
        Method::CONNECT => "CONNECT",
        _ => "other",
    }
}

/// The `route` label of a request that matched no route.
pub const UNMATCHED_ROUTE: &str = "unmatched";

async fn account(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    let method_label = method_label(&method);
    // Set by the router before this middleware runs (it wraps each route); a request for an
    // unknown path reaches the fallback without one.
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or(UNMATCHED_ROUTE, |m| m.as_str())
        .to_owned();
    let path = request.uri().path().to_owned();
    let response = next.run(request).await;
    let status = response.status();
    crate::metrics::HTTP_REQUESTS
        .with_label_values(&[method_label, &route, status.as_str()])
        .inc();
    crate::metrics::http_request_seconds()
        .with_label_values(&[method_label, &route])
        .observe(started.elapsed().as_secs_f64());
    if status.is_client_error() {
        // Debug, not info: a client probing for pages that do not exist is normal traffic.
        tracing::debug!(%method, path, status = status.as_u16(), "request refused");
    }
    response
}

/// How many times a read runs again after downloads it needed before it gives up: each run
/// makes at least one more layer resident, unless eviction takes them away as fast.
const MAX_READ_DOWNLOAD_ROUNDS: u32 = 16;

/// Runs a read here, on the async worker, when it needs no disk I/O (a hot page: see
/// [`crate::io::cached_only`]), and otherwise on the blocking pool, where it may wait for the
/// disk but not for the object store: a layer it needs that is not on the local disk is
/// downloaded under `admissions`' bounds on a thread of its own while this task waits (holding
/// no thread), and the read runs again. No thread hand-off for what the page cache holds, no
/// blocked worker for what it does not, no pool thread held by a slow store. `read` may run
/// several times, so it must not count anything itself; its result is kept only from the run
/// that finished.
pub async fn read<T, F>(admissions: &Admissions, read: F) -> Result<T, ApiError>
where
    F: Fn() -> T + Send + Sync + 'static,
    T: Send + 'static,
{
    // A panic in place fails this call as one on the blocking pool would, and no more.
    let attempt = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        crate::io::cached_only::try_cached(&read)
    }));
    match attempt {
        Ok(Some(done)) => {
            crate::metrics::READS_IN_PLACE.inc();
            return Ok(done);
        }
        Ok(None) => {}
        Err(_) => return Err(ApiError::internal("the read panicked")),
    }
    read_on_pool(admissions, read).await
}

/// [`read`] without the attempt in place: for reads too long to run on an async worker even
/// when the page cache holds everything (a page of a scan).
pub async fn read_on_pool<T, F>(admissions: &Admissions, read: F) -> Result<T, ApiError>
where
    F: Fn() -> T + Send + Sync + 'static,
    T: Send + 'static,
{
    let read = Arc::new(read);
    let mut downloads = 0;
    for _ in 0..MAX_READ_DOWNLOAD_ROUNDS {
        let this_run = read.clone();
        let outcome = blocking(move || {
            crate::io::read_cost::carry_downloads(downloads);
            let outcome = crate::io::cached_only::without_downloads(|| this_run());
            crate::io::read_cost::carry_downloads(0);
            Ok(outcome)
        })
        .await?;
        match outcome {
            Ok(done) => return Ok(done),
            Err(pending) => {
                admissions.download(pending).await?;
                downloads += 1;
            }
        }
    }
    Err(ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "the layers this read needs were evicted again as fast as they were downloaded \
             ({MAX_READ_DOWNLOAD_ROUNDS} rounds); try again shortly"
        ),
    ))
}

/// Runs `work` on a thread of its own (named `name`), holding `permit` until it ends, to
/// completion even if the request is dropped: for work that may wait on a client or the
/// object store for long, which must not hold a thread of the shared blocking pool (see
/// `tenant::admission`).
pub async fn on_own_thread<T, F>(
    name: &str,
    permit: crate::tenant::admission::Permit,
    work: F,
) -> Result<T, ApiError>
where
    F: FnOnce() -> Result<T, ApiError> + Send + 'static,
    T: Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work))
                .unwrap_or_else(|_| Err(ApiError::internal("the work panicked")));
            drop(permit);
            let _ = tx.send(result);
        })
        .map_err(|e| ApiError::internal(format!("no thread for {name}: {e}")))?;
    rx.await
        .map_err(|_| ApiError::internal(format!("{name} ended without an answer")))?
}

/// Runs storage work on the blocking pool, to completion even if the request is dropped.
pub async fn blocking<T, F>(work: F) -> Result<T, ApiError>
where
    F: FnOnce() -> Result<T, ApiError> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError::internal(format!("request task failed: {e}")))?
}
