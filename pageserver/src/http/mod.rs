//! The HTTP API (docs/http-api.md, docs/openapi.yaml).
//!
//! Handlers parse every id, key, LSN and body themselves, so that each mistake gets a
//! `{"msg": ...}` that says what is wrong (see [`error`]), and then call the floor below both
//! doors ([`crate::serving`]): reads go through its read path ([`crate::serving::read`]),
//! storage work (ingest, checkpoints, imports) runs where [`crate::serving::work`] puts it, to
//! completion even if the client hangs up, so no flush or batch is ever abandoned halfway.
//!
//! Middleware, outermost first: request accounting (a counter per method, route and status, a
//! latency histogram per route and method, a log line per failed request), then auth
//! ([`auth`]) when enabled, then the request body limits ([`body_limits`]). Connections and the
//! header read timeout are [`server`]'s, under the connection cap both doors share
//! ([`crate::serving::connections`]).
//!
//! Metric labels never take a client's text: a method outside the standard nine is `other`,
//! and the route is the matched route's template (`/v1/tenant/{tenant_id}`), or `unmatched`,
//! never the path. So however a client probes, the series stay a fixed, small set.

pub mod auth;
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

use crate::config::PageServerConf;
use crate::page_cache::PageCache;
use crate::serving::auth::JwtAuth;
use crate::serving::connections::ConnectionLimit;
use crate::serving::read::PageReads;
use crate::tenant::admission::Admissions;
use crate::tenant::mgr::TenantManager;
use crate::tenant::timeline::scan::cursor_cache::CursorCache;
use error::ApiError;

/// What every handler can reach.
pub struct AppState {
    pub conf: PageServerConf,
    pub tenants: Arc<TenantManager>,
    pub cache: Arc<PageCache>,
    /// The read path (shared with the page service).
    pub reads: Arc<PageReads>,
    pub auth: Option<JwtAuth>,
    pub started_at: SystemTime,
    /// The bytes of request bodies being read, all requests together.
    pub body_budget: Arc<body_limits::BodyBudget>,
    /// The connection cap, shared with the accept loop ([`server::serve`]).
    pub connections: Arc<ConnectionLimit>,
    /// The bounds on imports, basebackups and on-demand downloads (shared with the page
    /// service).
    pub admissions: Arc<Admissions>,
    /// The timelines' WAL receivers.
    pub receivers: Arc<crate::walreceiver::Receivers>,
}

impl AppState {
    /// The state of a server run with `conf`: its connection cap, request body budget,
    /// admission bounds and read path made from `conf`'s settings.
    pub fn new(
        conf: PageServerConf,
        tenants: Arc<TenantManager>,
        cache: Arc<PageCache>,
        auth: Option<JwtAuth>,
    ) -> AppState {
        let admissions = Arc::new(Admissions::new(conf.admission_limits()));
        let receivers = crate::walreceiver::Receivers::new(
            conf.wal_receiver_timeout,
            crate::walreceiver::SnapshotSettings {
                distance: conf.snapshot_wal_distance,
                pg_bin_dir: conf.pg_bin_dir.clone(),
                pg_user: conf.pg_user.clone(),
                replay_dir: conf
                    .snapshot_replay_dir
                    .clone()
                    .unwrap_or_else(|| "snapshot_replay".into()),
            },
        );
        let reads = Arc::new(PageReads::new(
            tenants.clone(),
            admissions.clone(),
            conf.wait_lsn_timeout,
            CursorCache::new(conf.cursor_cache_conf()),
        ));
        AppState {
            body_budget: Arc::new(body_limits::BodyBudget::new(
                conf.max_buffered_request_bytes,
            )),
            connections: Arc::new(ConnectionLimit::new(conf.max_connections())),
            admissions,
            reads,
            conf,
            tenants,
            cache,
            auth,
            started_at: SystemTime::now(),
            receivers,
        }
    }
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
    (
        "PUT",
        "/v1/tenant/{tenant_id}/timeline/{timeline_id}/wal_receiver",
    ),
    (
        "GET",
        "/v1/tenant/{tenant_id}/timeline/{timeline_id}/wal_receiver",
    ),
    (
        "DELETE",
        "/v1/tenant/{tenant_id}/timeline/{timeline_id}/wal_receiver",
    ),
    (
        "GET",
        "/v1/tenant/{tenant_id}/timeline/{timeline_id}/wal/{file}",
    ),
    (
        "GET",
        "/v1/tenant/{tenant_id}/timeline/{timeline_id}/lsn_by_timestamp",
    ),
    (
        "POST",
        "/v1/tenant/{tenant_id}/timeline/{timeline_id}/lsn_lease",
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
        .route(
            "/v1/tenant/{tenant_id}/timeline/{timeline_id}/wal_receiver",
            put(wal_receiver_put)
                .get(wal_receiver_get)
                .delete(wal_receiver_delete),
        )
        .route(
            "/v1/tenant/{tenant_id}/timeline/{timeline_id}/wal/{file}",
            get(wal_file),
        )
        .route(
            "/v1/tenant/{tenant_id}/timeline/{timeline_id}/lsn_by_timestamp",
            get(lsn_by_timestamp),
        )
        .route(
            "/v1/tenant/{tenant_id}/timeline/{timeline_id}/lsn_lease",
            post(lsn_lease),
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
            let access = auth::access(request.method(), request.uri().path());
            if let Err(e) = auth.check(header, access) {
                let mut response = ApiError::from(e).into_response();
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

/// [`crate::serving::work::blocking`] for a handler's work, which fails with an [`ApiError`].
pub async fn blocking<T, F>(work: F) -> Result<T, ApiError>
where
    F: FnOnce() -> Result<T, ApiError> + Send + 'static,
    T: Send + 'static,
{
    crate::serving::work::blocking(work).await
}

/// [`crate::serving::work::on_own_thread`] for a handler's work, which fails with an
/// [`ApiError`].
pub async fn on_own_thread<T, F>(
    name: &str,
    permit: crate::tenant::admission::Permit,
    work: F,
) -> Result<T, ApiError>
where
    F: FnOnce() -> Result<T, ApiError> + Send + 'static,
    T: Send + 'static,
{
    crate::serving::work::on_own_thread(name, permit, work).await
}
