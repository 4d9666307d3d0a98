//! `pagebench`: load for the page server's HTTP API, measured against an HTTP baseline.
//!
//! ```text
//! pagebench prepare --keys N [--value-size B] [--batch-size R] [--tenant T]
//!     a new timeline (in a new tenant unless given) holding one page image per key,
//!     checkpointed; prints the ids to pass to `getpage`
//! pagebench getpage --tenant T --timeline TL --keys N --clients C [--lsn latest|X/X] [--seed S]
//!     GetPage@LSN of uniformly random keys in [0, N), then the `/v1/status` baseline
//! pagebench ingest [--tenant T] [--timeline TL]... --clients C --batch-size R [--value-size B]
//!     batches of R page images, one timeline per client, then the `/v1/status` baseline
//! pagebench scale --pageserver BIN --workdir DIR [--keys N] [--total 10GiB] ...
//!     starts the server itself: GiBs of random updates with compaction, images and GC,
//!     against a flush-only baseline (method in `scale.rs`)
//! ```
//!
//! Every command takes `--endpoint` (default `http://127.0.0.1:9898`), `--token` (or the
//! `PAGEBENCH_TOKEN` environment variable) for `Authorization: Bearer`, `--threads` (the tool's
//! runtime workers) and `--json` (one JSON object on stdout instead of a table); `getpage` and
//! `ingest` take `--clients`, `--duration` (default 10s) and `--warmup` (default 2s). The exit
//! code is 1 if anything failed, including a single request of a run.
//!
//! # Method
//!
//! **Closed loop.** Each of the C clients owns one keep-alive HTTP/1.1 connection (with
//! `TCP_NODELAY`) and keeps exactly one request outstanding: it sends the next request as soon
//! as it has read the whole response to the previous one. What is measured is the rate the
//! server sustains with C requests in flight, and latencies are service times at that
//! concurrency. A closed loop slows down with the server, so it cannot show the queueing an
//! open-loop arrival rate would build up.
//!
//! **Latency** is taken around one HTTP exchange: from just before the request is handed to
//! the connection until the last byte of the response body has been read. Opening a
//! connection, when one has to be opened, is inside it (the warmup opens the first ones; the
//! report says how many were opened). Each client records into its own HDR histogram (1 ns to
//! 1 h, 3 significant digits); the histograms are merged at the end.
//!
//! **Window.** A phase runs `--warmup`, then the measured `--duration`. An exchange counts if
//! it started inside the window. No exchange starts after the window; those in flight finish
//! and count, and rates divide by the time from the window's start to the last completion,
//! which is never less than `--duration`.
//!
//! **Errors.** Every response is checked: its status, and for GetPage the page's length and
//! stamp (below), so a wrong page is an error too. A failed exchange, in the warmup or the
//! window, is counted and the first few are printed; it stays out of the latency histogram and
//! the rates.
//!
//! **Baseline.** Right after the scenario, the same number of clients runs `GET /v1/status`
//! with the same warmup and duration, on fresh connections: the HTTP stack, routing and
//! middleware, no storage work, a response of about 100 bytes. `ratio_to_baseline` is the
//! scenario's requests/s over the baseline's. The tool shares the machine with the server, so
//! its own CPU use is a tax on both phases alike: the ratio is the figure that carries from
//! one machine to another. `/v1/status` is public, so with auth on, checking the token is in
//! the scenario only. On a small machine shared with the server, `--threads 1` leaves the
//! server more of the CPU and gives steadier figures; one thread drives tens of thousands of
//! requests per second.
//!
//! **Keys and pages.** Key `i` is block `i` of one relation, `Key::rel_block(1663, 5, 16384,
//! 0, i)`, as in the criterion benches. Page `i` is `--value-size` bytes: `i` as a big-endian
//! u64 in its first 8 bytes (its stamp), then a byte pattern of `i`. `prepare` and `ingest`
//! write the same page for a key, so `getpage` can check every page whichever wrote it last.
//!
//! **Ingest.** LSNs are ordered per timeline, so each client ingests into a timeline of its
//! own: the ones given with `--timeline`, then new ones in the tenant. A batch is R image
//! records with keys cycling over `[0, --keys)`, each record at its own LSN. LSNs advance by a
//! record's encoded size rounded up to 8, as WAL positions would, starting above the
//! timeline's `last_record_lsn` (read before the first batch and again after a failed one).
//! The next batch is encoded on another thread while the current one is in flight, so
//! encoding is not part of the loop. Throughput counts image bytes, not record headers, as
//! `cargo bench -p benches --bench ingest` does; latency is per batch.
//!
//! Units: MiB/s are 2^20 bytes per second (criterion's unit); latencies are microseconds.

use std::future::Future;
use std::process::ExitCode;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use clap::{Args, Parser, Subcommand};
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use pageserver_api::ingest::{encode_batch, PutRecord, RECORD_HEADER_LEN};
use pageserver_api::{Key, Value};
use serde_json::{json, Map, Value as JsonValue};
use utils::{Lsn, TenantId, TimelineId};

/// The relation whose blocks are the benchmark's keys: tablespace, database, relation, fork.
const RELATION: (u32, u32, u32, u8) = (1663, 5, 16384, 0);
/// Bytes at the start of a page that hold its key number.
const STAMP_LEN: usize = 8;
/// Failed exchanges printed per phase; the rest are only counted.
const ERRORS_SHOWN: u64 = 5;
/// How long a client waits after a failed exchange, so a dead server is not hammered.
const ERROR_PAUSE: Duration = Duration::from_millis(10);
/// The histograms' range: 1 ns to 1 hour.
const HISTOGRAM_MAX_NS: u64 = 3_600 * 1_000_000_000;
const MIB: f64 = (1u64 << 20) as f64;
const OCTET_STREAM: &str = "application/octet-stream";
const JSON_TYPE: &str = "application/json";
const TOKEN_ENV: &str = "PAGEBENCH_TOKEN";

mod scale;

/// Load generator for the page server's HTTP API; see the method at the top of pagebench.rs.
#[derive(Parser)]
#[command(name = "pagebench", version)]
struct Cli {
    /// The page server's HTTP endpoint.
    #[arg(long, global = true, default_value = "http://127.0.0.1:9898")]
    endpoint: String,
    /// Sent as `Authorization: Bearer <TOKEN>`; defaults to $PAGEBENCH_TOKEN.
    #[arg(long, global = true)]
    token: Option<String>,
    /// Worker threads of the tool's runtime (default: one per CPU).
    #[arg(long, global = true)]
    threads: Option<usize>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create a timeline holding one page image per key, then checkpoint it.
    Prepare(PrepareArgs),
    /// GetPage@LSN of random keys, then the /v1/status baseline.
    Getpage(GetPageArgs),
    /// Batches of page images, one timeline per client, then the /v1/status baseline.
    Ingest(IngestArgs),
    /// GiBs of random updates with compaction, images and GC at default settings, against a
    /// flush-only baseline, starting the server itself (see `scale.rs`).
    Scale(scale::ScaleArgs),
}

#[derive(Args)]
struct PageArgs {
    /// Keys: blocks 0..KEYS of the benchmark relation.
    #[arg(long, default_value_t = 10_000)]
    keys: u32,
    /// Bytes per page image.
    #[arg(long, default_value_t = 8192)]
    value_size: usize,
}

#[derive(Args)]
struct RunArgs {
    /// Concurrent clients, one connection and one request in flight each.
    #[arg(long, default_value_t = 1)]
    clients: usize,
    /// The measured window, e.g. `10s`.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Load before the window, not measured (connections open, caches warm).
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct PrepareArgs {
    /// Add the timeline to this tenant instead of creating a tenant.
    #[arg(long)]
    tenant: Option<TenantId>,
    #[command(flatten)]
    pages: PageArgs,
    /// Records per ingest request.
    #[arg(long, default_value_t = 256)]
    batch_size: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct GetPageArgs {
    #[arg(long)]
    tenant: TenantId,
    #[arg(long)]
    timeline: TimelineId,
    #[command(flatten)]
    pages: PageArgs,
    /// The LSN to read at: `latest` or X/X.
    #[arg(long, default_value = "latest")]
    lsn: ReadLsn,
    /// Seed of the key choice; client c draws from seed + c.
    #[arg(long, default_value_t = 0x5eed)]
    seed: u64,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Args)]
struct IngestArgs {
    /// The tenant of the timelines; a new one if not given.
    #[arg(long)]
    tenant: Option<TenantId>,
    /// A timeline to ingest into (repeat it, one per client); clients without one get a new one.
    #[arg(long = "timeline")]
    timelines: Vec<TimelineId>,
    #[command(flatten)]
    pages: PageArgs,
    /// Records per ingest request.
    #[arg(long, default_value_t = 256)]
    batch_size: usize,
    #[command(flatten)]
    run: RunArgs,
}

/// `--lsn`: the timeline's latest LSN, or a fixed one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReadLsn {
    Latest,
    At(Lsn),
}

impl FromStr for ReadLsn {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text == "latest" {
            return Ok(ReadLsn::Latest);
        }
        text.parse()
            .map(ReadLsn::At)
            .map_err(|e| format!("{e} (expected `latest` or X/X)"))
    }
}

impl std::fmt::Display for ReadLsn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadLsn::Latest => f.write_str("latest"),
            ReadLsn::At(lsn) => write!(f, "{lsn}"),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = cli.threads {
        runtime.worker_threads(threads.max(1));
    }
    let outcome = runtime
        .enable_all()
        .build()
        .context("starting the runtime")
        .and_then(|runtime| runtime.block_on(run(cli)));
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("pagebench: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs one command; `Ok(false)` when it ran to the end but some requests failed.
async fn run(cli: Cli) -> anyhow::Result<bool> {
    let token = cli.token.or_else(|| std::env::var(TOKEN_ENV).ok());
    let endpoint = Arc::new(Endpoint::parse(&cli.endpoint, token)?);
    match cli.command {
        Command::Prepare(args) => prepare(endpoint, args).await,
        Command::Getpage(args) => getpage(endpoint, args).await,
        Command::Ingest(args) => ingest(endpoint, args).await,
        Command::Scale(args) => scale::run(args).await,
    }
}

// ---------------------------------------------------------------------------------------------
// Keys, pages and batches

/// The key of page `index`: block `index` of the benchmark relation.
fn key_for(index: u32) -> Key {
    let (spcnode, dbnode, relnode, forknum) = RELATION;
    Key::rel_block(spcnode, dbnode, relnode, forknum, index)
}

/// Page `index`: its stamp (`index` as a big-endian u64), then a byte pattern of `index`.
fn page_image(index: u32, size: usize) -> Bytes {
    let low = index.to_le_bytes()[0];
    // Truncation intended: the pattern repeats every 256 bytes.
    let mut page: Vec<u8> = (0..size).map(|i| (i as u8) ^ low).collect();
    let stamp = u64::from(index).to_be_bytes();
    let n = size.min(STAMP_LEN);
    page[..n].copy_from_slice(&stamp[..n]);
    Bytes::from(page)
}

/// Checks a GetPage response for page `index`.
fn check_page(index: u32, size: usize, status: StatusCode, body: &[u8]) -> anyhow::Result<()> {
    let key = key_for(index);
    if status != StatusCode::OK {
        bail!("GetPage {key}: {}", describe_failure(status, body));
    }
    if body.len() != size {
        bail!("GetPage {key}: {} bytes, expected {size}", body.len());
    }
    let n = size.min(STAMP_LEN);
    if body[..n] != u64::from(index).to_be_bytes()[..n] {
        bail!(
            "GetPage {key}: wrong page: its stamp is {:02x?}, expected page {index}",
            &body[..n]
        );
    }
    Ok(())
}

/// LSN distance between consecutive records: a record's encoded size rounded up to 8, the
/// way WAL positions advance.
fn lsn_step(value_size: usize) -> u64 {
    let record = u64::try_from(RECORD_HEADER_LEN + value_size).expect("usize fits in u64");
    record.next_multiple_of(8)
}

/// One ingest request body, and where it leaves the key cycle and the LSN.
struct Batch {
    body: Bytes,
    records: u64,
    payload_bytes: u64,
    last_lsn: Lsn,
    next_key: u32,
}

/// `count` image records: keys from `first_key` cycling over `[0, keys)`, LSNs from
/// `first_lsn` up by [`lsn_step`].
fn build_batch(
    first_lsn: Lsn,
    first_key: u32,
    count: usize,
    keys: u32,
    value_size: usize,
) -> anyhow::Result<Batch> {
    let step = lsn_step(value_size);
    let mut records = Vec::with_capacity(count);
    let (mut key, mut lsn) = (first_key % keys, first_lsn);
    for i in 0..count {
        if i > 0 {
            lsn = lsn.checked_add(step).context("the LSN overflowed")?;
        }
        records.push(PutRecord {
            key: key_for(key),
            lsn,
            value: Value::Image(page_image(key, value_size)),
        });
        key = if key + 1 == keys { 0 } else { key + 1 };
    }
    let body = encode_batch(&records).context("encoding a batch")?;
    Ok(Batch {
        body: Bytes::from(body),
        records: u64::try_from(count)?,
        payload_bytes: u64::try_from(count * value_size)?,
        last_lsn: lsn,
        next_key: key,
    })
}

// ---------------------------------------------------------------------------------------------
// HTTP

/// Where the server is and what to authenticate with.
#[derive(Debug)]
struct Endpoint {
    host: String,
    port: u16,
    /// `host:port` as given, for the `Host` header.
    authority: String,
    authorization: Option<HeaderValue>,
}

impl Endpoint {
    fn parse(url: &str, token: Option<String>) -> anyhow::Result<Endpoint> {
        let uri: hyper::Uri = url
            .parse()
            .with_context(|| format!("invalid endpoint `{url}`"))?;
        if uri.scheme_str() != Some("http") {
            bail!("endpoint `{url}`: only http:// is supported");
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            bail!("endpoint `{url}`: expected http://host:port, without a path");
        }
        let authority = uri
            .authority()
            .with_context(|| format!("endpoint `{url}` has no host"))?;
        let authorization = token
            .map(|t| HeaderValue::try_from(format!("Bearer {t}")))
            .transpose()
            .context("the token is not a valid header value")?;
        Ok(Endpoint {
            host: authority
                .host()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port: authority.port_u16().unwrap_or(80),
            authority: authority.as_str().to_owned(),
            authorization,
        })
    }
}

/// One keep-alive HTTP/1.1 connection, opened on first use and again after it breaks.
struct Connection {
    endpoint: Arc<Endpoint>,
    sender: Option<SendRequest<Full<Bytes>>>,
    /// Connections opened so far; more than one means some were closed or broke.
    opened: u64,
}

impl Connection {
    fn new(endpoint: Arc<Endpoint>) -> Connection {
        Connection {
            endpoint,
            sender: None,
            opened: 0,
        }
    }

    /// One exchange: the response's status and its whole body. After a failure the connection
    /// is dropped and the next exchange opens a new one.
    async fn exchange(
        &mut self,
        method: Method,
        path: &str,
        body: Option<(Bytes, &'static str)>,
    ) -> anyhow::Result<(StatusCode, Bytes)> {
        let (status, _, body) = self.exchange_with_headers(method, path, body).await?;
        Ok((status, body))
    }

    /// [`Connection::exchange`], with the response's headers.
    async fn exchange_with_headers(
        &mut self,
        method: Method,
        path: &str,
        body: Option<(Bytes, &'static str)>,
    ) -> anyhow::Result<(StatusCode, HeaderMap, Bytes)> {
        let result = self.exchange_inner(method.clone(), path, body).await;
        if result.is_err() {
            self.sender = None;
        }
        result.with_context(|| format!("{method} {path}"))
    }

    async fn exchange_inner(
        &mut self,
        method: Method,
        path: &str,
        body: Option<(Bytes, &'static str)>,
    ) -> anyhow::Result<(StatusCode, HeaderMap, Bytes)> {
        if self.sender.as_ref().is_none_or(SendRequest::is_closed) {
            self.sender = Some(open(&self.endpoint).await?);
            self.opened += 1;
        }
        let sender = self.sender.as_mut().expect("opened above");
        sender.ready().await.context("the connection broke")?;
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, &self.endpoint.authority);
        if let Some(authorization) = &self.endpoint.authorization {
            request = request.header(AUTHORIZATION, authorization.clone());
        }
        let body = match body {
            Some((bytes, content_type)) => {
                request = request.header(CONTENT_TYPE, content_type);
                bytes
            }
            None => Bytes::new(),
        };
        let response = sender.send_request(request.body(Full::new(body))?).await?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = response
            .into_body()
            .collect()
            .await
            .context("reading the response body")?
            .to_bytes();
        Ok((status, headers, body))
    }

    /// A management call: the `expect`ed status and a JSON response, or an error carrying the
    /// server's message.
    async fn call(
        &mut self,
        method: Method,
        path: &str,
        body: Option<JsonValue>,
        expect: StatusCode,
    ) -> anyhow::Result<JsonValue> {
        let body = body.map(|json| (Bytes::from(json.to_string()), JSON_TYPE));
        let (status, bytes) = self.exchange(method.clone(), path, body).await?;
        if status != expect {
            bail!("{method} {path}: {}", describe_failure(status, &bytes));
        }
        serde_json::from_slice(&bytes)
            .with_context(|| format!("{method} {path}: the response is not JSON"))
    }

    async fn create_tenant(&mut self) -> anyhow::Result<TenantId> {
        let info = self
            .call(
                Method::POST,
                "/v1/tenant",
                Some(json!({})),
                StatusCode::CREATED,
            )
            .await?;
        parse_field(&info, "id")
    }

    /// A new timeline and its `last_record_lsn`.
    async fn create_timeline(&mut self, tenant: TenantId) -> anyhow::Result<(TimelineId, Lsn)> {
        let path = format!("/v1/tenant/{tenant}/timeline");
        let info = self
            .call(Method::POST, &path, Some(json!({})), StatusCode::CREATED)
            .await?;
        Ok((
            parse_field(&info, "timeline_id")?,
            parse_field(&info, "last_record_lsn")?,
        ))
    }

    async fn last_record_lsn(&mut self, timeline_path: &str) -> anyhow::Result<Lsn> {
        let info = self
            .call(Method::GET, timeline_path, None, StatusCode::OK)
            .await?;
        parse_field(&info, "last_record_lsn")
    }
}

async fn open(endpoint: &Endpoint) -> anyhow::Result<SendRequest<Full<Bytes>>> {
    let stream = tokio::net::TcpStream::connect((endpoint.host.as_str(), endpoint.port))
        .await
        .with_context(|| format!("connecting to {}", endpoint.authority))?;
    stream.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    // A connection's own error surfaces in the exchange that was using it.
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

/// `status: message` of a failed response, the message from the server's `{"msg": ...}`.
fn describe_failure(status: StatusCode, body: &[u8]) -> String {
    let msg = serde_json::from_slice::<JsonValue>(body)
        .ok()
        .and_then(|v| v.get("msg")?.as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned());
    format!("{status}: {msg}")
}

/// A string field of a JSON response, parsed.
fn parse_field<T>(json: &JsonValue, name: &str) -> anyhow::Result<T>
where
    T: FromStr,
    T::Err: std::error::Error + Send + Sync + 'static,
{
    let text = json
        .get(name)
        .and_then(JsonValue::as_str)
        .with_context(|| format!("the response has no string field `{name}`: {json}"))?;
    text.parse()
        .with_context(|| format!("field `{name}` of the response"))
}

fn timeline_path(tenant: TenantId, timeline: TimelineId) -> String {
    format!("/v1/tenant/{tenant}/timeline/{timeline}")
}

// ---------------------------------------------------------------------------------------------
// Clients and phases

/// What one exchange achieved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Done {
    /// Payload bytes: the page read, or the images ingested.
    bytes: u64,
    /// Pages read or records ingested.
    records: u64,
}

/// One timed exchange.
struct Exchange {
    started: Instant,
    latency: Duration,
    result: anyhow::Result<Done>,
}

/// Awaits `work`, timing it.
async fn timed<T>(work: impl Future<Output = T>) -> (Instant, Duration, T) {
    let started = Instant::now();
    let output = work.await;
    (started, started.elapsed(), output)
}

/// What a client does, one exchange at a time.
enum Work {
    /// The page of a random key in `[0, keys)`.
    GetPage {
        /// The page path up to the key's value.
        prefix: String,
        keys: u32,
        value_size: usize,
        rng: fastrand::Rng,
    },
    /// `GET /v1/status`.
    Status,
    /// One batch into the client's own timeline.
    Ingest(Box<IngestClient>),
}

impl Work {
    async fn step(&mut self, conn: &mut Connection) -> Exchange {
        match self {
            Work::GetPage {
                prefix,
                keys,
                value_size,
                rng,
            } => {
                let index = rng.u32(0..*keys);
                let path = format!("{prefix}{}", key_for(index));
                let (started, latency, response) =
                    timed(conn.exchange(Method::GET, &path, None)).await;
                let result = response.and_then(|(status, body)| {
                    check_page(index, *value_size, status, &body)?;
                    Ok(Done {
                        bytes: u64::try_from(body.len())?,
                        records: 1,
                    })
                });
                Exchange {
                    started,
                    latency,
                    result,
                }
            }
            Work::Status => {
                let (started, latency, response) =
                    timed(conn.exchange(Method::GET, "/v1/status", None)).await;
                let result = response.and_then(|(status, body)| {
                    if status != StatusCode::OK {
                        bail!("GET /v1/status: {}", describe_failure(status, &body));
                    }
                    Ok(Done {
                        bytes: u64::try_from(body.len())?,
                        records: 1,
                    })
                });
                Exchange {
                    started,
                    latency,
                    result,
                }
            }
            Work::Ingest(client) => client.step(conn).await,
        }
    }
}

/// An ingest client: its timeline and the batch it sends next.
struct IngestClient {
    timeline_path: String,
    ingest_path: String,
    keys: u32,
    value_size: usize,
    batch_size: usize,
    /// The batch to send next; `None` until the timeline's `last_record_lsn` has been read
    /// (at the start, and after a failed batch).
    next: Option<Batch>,
    /// Where the key cycle resumes after a failed batch.
    next_key: u32,
}

impl IngestClient {
    async fn step(&mut self, conn: &mut Connection) -> Exchange {
        let batch = match self.next.take() {
            Some(batch) => batch,
            None => match self.resume(conn).await {
                Ok(batch) => batch,
                Err(e) => {
                    return Exchange {
                        started: Instant::now(),
                        latency: Duration::ZERO,
                        result: Err(e),
                    }
                }
            },
        };
        // Encode the following batch while this one is in flight.
        let (keys, value_size, count) = (self.keys, self.value_size, self.batch_size);
        let (following_key, last_lsn) = (batch.next_key, batch.last_lsn);
        let following = tokio::task::spawn_blocking(move || {
            let first = last_lsn
                .checked_add(lsn_step(value_size))
                .context("the LSN overflowed")?;
            build_batch(first, following_key, count, keys, value_size)
        });
        let body = Some((batch.body.clone(), OCTET_STREAM));
        let (started, latency, response) =
            timed(conn.exchange(Method::POST, &self.ingest_path, body)).await;
        let result = response.and_then(|(status, body)| {
            if status != StatusCode::OK {
                bail!(
                    "ingest into {}: {}",
                    self.timeline_path,
                    describe_failure(status, &body)
                );
            }
            Ok(Done {
                bytes: batch.payload_bytes,
                records: batch.records,
            })
        });
        let following = following
            .await
            .map_err(|e| anyhow!("encoding a batch: {e}"))
            .and_then(|built| built);
        self.next = match (&result, following) {
            (Ok(_), Ok(next)) => Some(next),
            // After a failure, where the timeline stands is read again before the next batch.
            _ => None,
        };
        self.next_key = batch.next_key;
        Exchange {
            started,
            latency,
            result,
        }
    }

    /// The next batch, starting above the timeline's `last_record_lsn`.
    async fn resume(&mut self, conn: &mut Connection) -> anyhow::Result<Batch> {
        let last = conn.last_record_lsn(&self.timeline_path).await?;
        let first = last
            .checked_add(lsn_step(self.value_size))
            .context("the LSN overflowed")?;
        let (key, count, keys, size) = (self.next_key, self.batch_size, self.keys, self.value_size);
        tokio::task::spawn_blocking(move || build_batch(first, key, count, keys, size))
            .await
            .map_err(|e| anyhow!("encoding a batch: {e}"))?
    }
}

/// The warmup's end and the measured window's end.
#[derive(Clone, Copy)]
struct Window {
    start: Instant,
    end: Instant,
}

impl Window {
    /// The rates' denominator: from the window's start to the last completion, at least the
    /// window's length.
    fn measured(&self, last_done: Option<Instant>) -> Duration {
        last_done.map_or(self.end, |t| t.max(self.end)) - self.start
    }
}

/// Prints the first failures of a phase and counts the rest.
struct ErrorLog {
    phase: &'static str,
    seen: AtomicU64,
}

impl ErrorLog {
    fn report(&self, error: &anyhow::Error) {
        let seen = self.seen.fetch_add(1, Ordering::Relaxed);
        if seen < ERRORS_SHOWN {
            eprintln!("pagebench: {}: {error:#}", self.phase);
        } else if seen == ERRORS_SHOWN {
            eprintln!("pagebench: {}: more errors, only counted", self.phase);
        }
    }
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HISTOGRAM_MAX_NS, 3).expect("valid histogram bounds")
}

/// What a phase (or one of its clients) measured.
struct PhaseStats {
    name: &'static str,
    /// Latencies of the successful exchanges in the window, in nanoseconds.
    histogram: Histogram<u64>,
    /// Successful exchanges in the window.
    requests: u64,
    /// Failed exchanges, warmup included.
    errors: u64,
    bytes: u64,
    records: u64,
    connections: u64,
    last_done: Option<Instant>,
    /// The rates' denominator (see [`Window::measured`]).
    elapsed: Duration,
}

impl PhaseStats {
    fn new(name: &'static str) -> PhaseStats {
        PhaseStats {
            name,
            histogram: new_histogram(),
            requests: 0,
            errors: 0,
            bytes: 0,
            records: 0,
            connections: 0,
            last_done: None,
            elapsed: Duration::ZERO,
        }
    }

    fn record(&mut self, started: Instant, latency: Duration, done: Done) {
        let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.histogram.saturating_record(nanos.max(1));
        self.requests += 1;
        self.bytes += done.bytes;
        self.records += done.records;
        let finished = started + latency;
        self.last_done = Some(self.last_done.map_or(finished, |t| t.max(finished)));
    }

    fn merge(&mut self, other: PhaseStats) -> anyhow::Result<()> {
        self.histogram
            .add(&other.histogram)
            .map_err(|e| anyhow!("merging histograms: {e:?}"))?;
        self.requests += other.requests;
        self.errors += other.errors;
        self.bytes += other.bytes;
        self.records += other.records;
        self.connections += other.connections;
        self.last_done = match (self.last_done, other.last_done) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        Ok(())
    }

    fn per_sec(&self, count: u64) -> f64 {
        // Precision loss irrelevant: a rate.
        count as f64 / self.elapsed.as_secs_f64()
    }

    fn requests_per_sec(&self) -> f64 {
        self.per_sec(self.requests)
    }

    fn mib_per_sec(&self) -> f64 {
        self.per_sec(self.bytes) / MIB
    }
}

/// Latency percentiles in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Latency {
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    max_us: f64,
}

impl Latency {
    /// Percentiles of a histogram of nanoseconds; all zero when it is empty.
    fn of(histogram: &Histogram<u64>) -> Latency {
        if histogram.is_empty() {
            return Latency::default();
        }
        // Precision loss irrelevant: the histogram keeps 3 significant digits.
        let us = |ns: u64| ns as f64 / 1000.0;
        Latency {
            p50_us: us(histogram.value_at_quantile(0.5)),
            p99_us: us(histogram.value_at_quantile(0.99)),
            p999_us: us(histogram.value_at_quantile(0.999)),
            max_us: us(histogram.max()),
        }
    }
}

async fn client_loop(
    mut conn: Connection,
    mut work: Work,
    window: Window,
    log: Arc<ErrorLog>,
) -> PhaseStats {
    let mut stats = PhaseStats::new(log.phase);
    while Instant::now() < window.end {
        let exchange = work.step(&mut conn).await;
        match exchange.result {
            Ok(done) if exchange.started >= window.start => {
                stats.record(exchange.started, exchange.latency, done)
            }
            Ok(_) => {}
            Err(e) => {
                stats.errors += 1;
                log.report(&e);
                tokio::time::sleep(ERROR_PAUSE).await;
            }
        }
    }
    stats.connections = conn.opened;
    stats
}

/// Runs one client per `works` entry through the warmup and the window.
async fn run_phase(
    name: &'static str,
    endpoint: &Arc<Endpoint>,
    works: Vec<Work>,
    run: &RunArgs,
) -> anyhow::Result<PhaseStats> {
    if !run.json {
        eprintln!(
            "pagebench: {name}: {} clients, {} warmup, {} measured",
            works.len(),
            humantime::format_duration(run.warmup),
            humantime::format_duration(run.duration)
        );
    }
    let log = Arc::new(ErrorLog {
        phase: name,
        seen: AtomicU64::new(0),
    });
    let start = Instant::now() + run.warmup;
    let window = Window {
        start,
        end: start + run.duration,
    };
    let clients: Vec<_> = works
        .into_iter()
        .map(|work| {
            let conn = Connection::new(endpoint.clone());
            tokio::spawn(client_loop(conn, work, window, log.clone()))
        })
        .collect();
    let mut phase = PhaseStats::new(name);
    for client in clients {
        phase.merge(client.await.context("a client failed")?)?;
    }
    phase.elapsed = window.measured(phase.last_done);
    Ok(phase)
}

async fn status_baseline(endpoint: &Arc<Endpoint>, run: &RunArgs) -> anyhow::Result<PhaseStats> {
    let works = (0..run.clients).map(|_| Work::Status).collect();
    run_phase("status", endpoint, works, run).await
}

// ---------------------------------------------------------------------------------------------
// Reports

fn round(value: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (value * scale).round() / scale
}

/// A scenario and its baseline, as JSON or as a table.
struct Report {
    scenario: &'static str,
    clients: usize,
    main: PhaseStats,
    baseline: PhaseStats,
    /// Scenario-specific fields, added to the JSON and listed under the table.
    details: Map<String, JsonValue>,
}

impl Report {
    fn ratio(&self) -> f64 {
        let base = self.baseline.requests_per_sec();
        if base > 0.0 {
            self.main.requests_per_sec() / base
        } else {
            0.0
        }
    }

    fn ok(&self) -> bool {
        self.main.errors == 0 && self.baseline.errors == 0
    }

    fn to_json(&self) -> JsonValue {
        let main = Latency::of(&self.main.histogram);
        let base = Latency::of(&self.baseline.histogram);
        let mut out = json!({
            "scenario": self.scenario,
            "clients": self.clients,
            "duration_s": round(self.main.elapsed.as_secs_f64(), 3),
            "requests": self.main.requests,
            "errors": self.main.errors,
            "requests_per_sec": round(self.main.requests_per_sec(), 1),
            "mb_per_sec": round(self.main.mib_per_sec(), 2),
            "p50_us": main.p50_us,
            "p99_us": main.p99_us,
            "p999_us": main.p999_us,
            "max_us": main.max_us,
            "connections": self.main.connections,
            "baseline": {
                "scenario": "status",
                "duration_s": round(self.baseline.elapsed.as_secs_f64(), 3),
                "requests": self.baseline.requests,
                "errors": self.baseline.errors,
                "requests_per_sec": round(self.baseline.requests_per_sec(), 1),
                "p50_us": base.p50_us,
                "p99_us": base.p99_us,
                "p999_us": base.p999_us,
                "max_us": base.max_us,
                "connections": self.baseline.connections,
            },
            "ratio_to_baseline": round(self.ratio(), 3),
        });
        if let JsonValue::Object(fields) = &mut out {
            fields.extend(self.details.clone());
        }
        out
    }

    fn print_table(&self) {
        println!(
            "{:<8} {:>10} {:>7} {:>12} {:>9} {:>10} {:>10} {:>10} {:>10} {:>6}",
            "phase",
            "requests",
            "errors",
            "requests/s",
            "MiB/s",
            "p50 µs",
            "p99 µs",
            "p99.9 µs",
            "max µs",
            "conns"
        );
        for phase in [&self.main, &self.baseline] {
            let latency = Latency::of(&phase.histogram);
            println!(
                "{:<8} {:>10} {:>7} {:>12.1} {:>9.2} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>6}",
                phase.name,
                phase.requests,
                phase.errors,
                phase.requests_per_sec(),
                phase.mib_per_sec(),
                latency.p50_us,
                latency.p99_us,
                latency.p999_us,
                latency.max_us,
                phase.connections
            );
        }
        println!(
            "{} with {} clients over {:.2} s: {:.1} % of the status baseline's requests/s",
            self.scenario,
            self.clients,
            self.main.elapsed.as_secs_f64(),
            100.0 * self.ratio()
        );
        for (name, value) in &self.details {
            match value {
                JsonValue::String(text) => println!("  {name}: {text}"),
                other => println!("  {name}: {other}"),
            }
        }
    }

    /// Prints the report; true if nothing failed.
    fn print(&self, json: bool) -> bool {
        if json {
            println!("{}", self.to_json());
        } else {
            self.print_table();
        }
        if !self.ok() {
            eprintln!(
                "pagebench: {} failed requests ({} in {}, {} in the baseline)",
                self.main.errors + self.baseline.errors,
                self.main.errors,
                self.scenario,
                self.baseline.errors
            );
        }
        self.ok()
    }
}

fn check_run_args(run: &RunArgs, pages: &PageArgs) -> anyhow::Result<()> {
    if run.clients == 0 {
        bail!("--clients must be at least 1");
    }
    if run.duration.is_zero() {
        bail!("--duration must be more than zero");
    }
    if pages.keys == 0 {
        bail!("--keys must be at least 1");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Commands

async fn prepare(endpoint: Arc<Endpoint>, args: PrepareArgs) -> anyhow::Result<bool> {
    let PageArgs { keys, value_size } = args.pages;
    if keys == 0 || args.batch_size == 0 {
        bail!("--keys and --batch-size must be at least 1");
    }
    let mut conn = Connection::new(endpoint.clone());
    let tenant = match args.tenant {
        Some(tenant) => tenant,
        None => conn.create_tenant().await?,
    };
    let (timeline, last) = conn.create_timeline(tenant).await?;
    let path = timeline_path(tenant, timeline);
    let ingest_path = format!("{path}/ingest");

    let started = Instant::now();
    let mut lsn = last
        .checked_add(lsn_step(value_size))
        .context("the LSN overflowed")?;
    let mut key = 0;
    let batch_keys = u32::try_from(args.batch_size).unwrap_or(u32::MAX);
    while key < keys {
        let count = batch_keys.min(keys - key);
        let batch = build_batch(lsn, key, usize::try_from(count)?, keys, value_size)?;
        let (status, body) = conn
            .exchange(Method::POST, &ingest_path, Some((batch.body, OCTET_STREAM)))
            .await?;
        if status != StatusCode::OK {
            bail!(
                "ingest into {path} at key {key}: {}",
                describe_failure(status, &body)
            );
        }
        lsn = batch
            .last_lsn
            .checked_add(lsn_step(value_size))
            .context("the LSN overflowed")?;
        key += count;
    }
    let ingest_s = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let info = conn
        .call(
            Method::PUT,
            &format!("{path}/checkpoint"),
            None,
            StatusCode::OK,
        )
        .await?;
    let checkpoint_s = started.elapsed().as_secs_f64();
    let last_record_lsn: Lsn = parse_field(&info, "last_record_lsn")?;
    let disk_consistent_lsn: Lsn = parse_field(&info, "disk_consistent_lsn")?;
    // Precision loss irrelevant: a rate.
    let mib_per_sec = (f64::from(keys) * value_size as f64) / MIB / ingest_s;
    if args.json {
        println!(
            "{}",
            json!({
                "tenant_id": tenant.to_string(),
                "timeline_id": timeline.to_string(),
                "keys": keys,
                "value_size": value_size,
                "batch_size": args.batch_size,
                "last_record_lsn": last_record_lsn.to_string(),
                "disk_consistent_lsn": disk_consistent_lsn.to_string(),
                "ingest_s": round(ingest_s, 3),
                "checkpoint_s": round(checkpoint_s, 3),
                "mb_per_sec": round(mib_per_sec, 2),
            })
        );
    } else {
        println!("tenant   {tenant}");
        println!("timeline {timeline}");
        println!(
            "{keys} pages of {value_size} bytes in {ingest_s:.2} s ({mib_per_sec:.1} MiB/s, \
             batches of {}), checkpoint {checkpoint_s:.2} s, last_record_lsn {last_record_lsn}, \
             disk_consistent_lsn {disk_consistent_lsn}",
            args.batch_size
        );
        println!(
            "next: pagebench getpage --endpoint {} --tenant {tenant} --timeline {timeline} \
             --keys {keys} --value-size {value_size} --clients 1",
            endpoint_url(&endpoint)
        );
    }
    Ok(true)
}

fn endpoint_url(endpoint: &Endpoint) -> String {
    format!("http://{}", endpoint.authority)
}

async fn getpage(endpoint: Arc<Endpoint>, args: GetPageArgs) -> anyhow::Result<bool> {
    check_run_args(&args.run, &args.pages)?;
    let path = timeline_path(args.tenant, args.timeline);
    // A missing timeline is one clear error rather than a run of 404s.
    Connection::new(endpoint.clone())
        .call(Method::GET, &path, None, StatusCode::OK)
        .await?;
    let prefix = format!("{path}/page?lsn={}&key=", args.lsn);
    let works = (0..args.run.clients)
        .map(|client| Work::GetPage {
            prefix: prefix.clone(),
            keys: args.pages.keys,
            value_size: args.pages.value_size,
            rng: fastrand::Rng::with_seed(args.seed.wrapping_add(client as u64)),
        })
        .collect();
    let main = run_phase("getpage", &endpoint, works, &args.run).await?;
    let baseline = status_baseline(&endpoint, &args.run).await?;
    let mut details = Map::new();
    details.insert("keys".into(), json!(args.pages.keys));
    details.insert("value_size".into(), json!(args.pages.value_size));
    details.insert("lsn".into(), json!(args.lsn.to_string()));
    details.insert("seed".into(), json!(args.seed));
    let report = Report {
        scenario: "getpage",
        clients: args.run.clients,
        main,
        baseline,
        details,
    };
    Ok(report.print(args.run.json))
}

async fn ingest(endpoint: Arc<Endpoint>, args: IngestArgs) -> anyhow::Result<bool> {
    check_run_args(&args.run, &args.pages)?;
    if args.batch_size == 0 {
        bail!("--batch-size must be at least 1");
    }
    if args.timelines.len() > args.run.clients {
        bail!(
            "{} timelines for {} clients: each client ingests into one timeline",
            args.timelines.len(),
            args.run.clients
        );
    }
    let mut conn = Connection::new(endpoint.clone());
    let tenant = match args.tenant {
        Some(tenant) => tenant,
        None => conn.create_tenant().await?,
    };
    let mut timelines = args.timelines.clone();
    for timeline in &timelines {
        // A missing timeline is one clear error rather than a run of 404s.
        conn.last_record_lsn(&timeline_path(tenant, *timeline))
            .await?;
    }
    while timelines.len() < args.run.clients {
        timelines.push(conn.create_timeline(tenant).await?.0);
    }
    let works = timelines
        .iter()
        .map(|&timeline| {
            let path = timeline_path(tenant, timeline);
            Work::Ingest(Box::new(IngestClient {
                ingest_path: format!("{path}/ingest"),
                timeline_path: path,
                keys: args.pages.keys,
                value_size: args.pages.value_size,
                batch_size: args.batch_size,
                next: None,
                next_key: 0,
            }))
        })
        .collect();
    let main = run_phase("ingest", &endpoint, works, &args.run).await?;
    let baseline = status_baseline(&endpoint, &args.run).await?;
    let mut details = Map::new();
    details.insert("batch_size".into(), json!(args.batch_size));
    details.insert("value_size".into(), json!(args.pages.value_size));
    details.insert("keys".into(), json!(args.pages.keys));
    details.insert("records".into(), json!(main.records));
    details.insert(
        "records_per_sec".into(),
        json!(round(main.per_sec(main.records), 1)),
    );
    details.insert("tenant_id".into(), json!(tenant.to_string()));
    details.insert(
        "timelines".into(),
        json!(timelines.iter().map(|t| t.to_string()).collect::<Vec<_>>()),
    );
    let report = Report {
        scenario: "ingest",
        clients: args.run.clients,
        main,
        baseline,
        details,
    };
    Ok(report.print(args.run.json))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pageserver_api::ingest::decode_batch;

    #[test]
    fn key_i_is_block_i_of_one_relation_in_ascending_order() {
        assert_eq!(key_for(0), Key::rel_block(1663, 5, 16384, 0, 0));
        assert_eq!(key_for(12_345), Key::rel_block(1663, 5, 16384, 0, 12_345));
        for i in [0, 1, 255, 256, 65_535, 9_999] {
            assert_eq!(key_for(i).next(), key_for(i + 1), "keys are dense at {i}");
        }
        // The text form a GetPage query carries.
        assert_eq!(
            key_for(1).to_string(),
            concat!("00", "0000067f", "00000005", "00004000", "00", "00000001")
        );
    }

    #[test]
    fn pages_carry_their_stamp_and_are_checked() {
        let page = page_image(42, 8192);
        assert_eq!(page.len(), 8192);
        assert_eq!(&page[..8], &42u64.to_be_bytes());
        check_page(42, 8192, StatusCode::OK, &page).expect("its own page");
        assert_ne!(page_image(42, 8192), page_image(43, 8192));

        let wrong = check_page(43, 8192, StatusCode::OK, &page).unwrap_err();
        assert!(wrong.to_string().contains("wrong page"), "{wrong}");
        let short = check_page(42, 8192, StatusCode::OK, &page[..100]).unwrap_err();
        assert!(short.to_string().contains("100 bytes"), "{short}");
        let missing = check_page(
            42,
            8192,
            StatusCode::NOT_FOUND,
            br#"{"msg": "no such page"}"#,
        )
        .unwrap_err();
        assert!(missing.to_string().contains("404"), "{missing}");
        assert!(missing.to_string().contains("no such page"), "{missing}");

        // Pages shorter than the stamp keep what fits of it.
        let tiny = page_image(0x0102_0304, 4);
        assert_eq!(&tiny[..], &[0, 0, 0, 0]);
        check_page(0x0102_0304, 4, StatusCode::OK, &tiny).expect("tiny page");
        check_page(7, 0, StatusCode::OK, &[]).expect("empty page");
    }

    #[test]
    fn batches_decode_with_ascending_lsns_and_cycling_keys() {
        let step = lsn_step(8192);
        assert_eq!(step, 8224, "31-byte header + 8192 rounded up to 8");
        let first = Lsn(0x1000);
        let batch = build_batch(first, 8, 5, 10, 8192).expect("batch");
        assert_eq!(batch.records, 5);
        assert_eq!(batch.payload_bytes, 5 * 8192);
        assert_eq!(batch.last_lsn, Lsn(first.0 + 4 * step));
        assert_eq!(batch.next_key, 3, "8, 9, 0, 1, 2 then 3");

        let records = decode_batch(batch.body, 1 << 20).expect("decodes");
        let keys: Vec<Key> = records.iter().map(|r| r.key).collect();
        assert_eq!(keys, [8, 9, 0, 1, 2].map(key_for));
        for (i, record) in records.iter().enumerate() {
            assert_eq!(record.lsn, Lsn(first.0 + i as u64 * step));
            let index = [8, 9, 0, 1, 2][i];
            assert_eq!(record.value, Value::Image(page_image(index, 8192)));
        }
    }

    #[test]
    fn percentiles_of_a_known_distribution() {
        assert_eq!(Latency::of(&new_histogram()), Latency::default());

        // 1 µs .. 1000 µs, once each.
        let mut stats = PhaseStats::new("test");
        let t0 = Instant::now();
        for us in 1..=1000u64 {
            stats.record(t0, Duration::from_micros(us), Done::default());
        }
        let latency = Latency::of(&stats.histogram);
        let near = |got: f64, want: f64| (got - want).abs() <= want * 0.002;
        assert!(near(latency.p50_us, 500.0), "{latency:?}");
        assert!(near(latency.p99_us, 990.0), "{latency:?}");
        assert!(near(latency.p999_us, 999.0), "{latency:?}");
        assert!(near(latency.max_us, 1000.0), "{latency:?}");

        // Merging adds counts; the last completion is the latest of both.
        let mut other = PhaseStats::new("test");
        other.record(
            t0,
            Duration::from_secs(2),
            Done {
                bytes: 8,
                records: 1,
            },
        );
        stats.merge(other).expect("merge");
        assert_eq!(stats.requests, 1001);
        assert_eq!(stats.bytes, 8);
        assert_eq!(stats.last_done, Some(t0 + Duration::from_secs(2)));
        assert!(near(Latency::of(&stats.histogram).max_us, 2_000_000.0));
    }

    #[test]
    fn rates_divide_by_the_window_or_the_last_completion() {
        let start = Instant::now();
        let window = Window {
            start,
            end: start + Duration::from_secs(10),
        };
        assert_eq!(window.measured(None), Duration::from_secs(10));
        assert_eq!(
            window.measured(Some(start + Duration::from_secs(9))),
            Duration::from_secs(10)
        );
        assert_eq!(
            window.measured(Some(start + Duration::from_secs(11))),
            Duration::from_secs(11)
        );
    }

    #[test]
    fn endpoints_and_lsns_parse() {
        let e = Endpoint::parse("http://127.0.0.1:19990", Some("abc".into())).expect("parse");
        assert_eq!((e.host.as_str(), e.port), ("127.0.0.1", 19990));
        assert_eq!(e.authority, "127.0.0.1:19990");
        assert_eq!(e.authorization.as_ref().unwrap(), "Bearer abc");
        let e = Endpoint::parse("http://[::1]:9898/", None).expect("ipv6");
        assert_eq!((e.host.as_str(), e.port), ("::1", 9898));
        assert!(e.authorization.is_none());
        assert!(Endpoint::parse("https://localhost:9898", None).is_err());
        assert!(Endpoint::parse("http://localhost:9898/v1", None).is_err());

        assert_eq!("latest".parse::<ReadLsn>(), Ok(ReadLsn::Latest));
        assert_eq!(
            "1/A0".parse::<ReadLsn>(),
            Ok(ReadLsn::At(Lsn(0x1_0000_00A0)))
        );
        assert_eq!(ReadLsn::At(Lsn(0x1_0000_00A0)).to_string(), "1/A0");
        assert!("yesterday".parse::<ReadLsn>().is_err());
    }
}
