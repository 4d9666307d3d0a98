//! `pagebench`: load for the page server's HTTP API and page service, measured against a
//! same-protocol baseline.
//!
//! ```text
//! pagebench prepare --keys N [--value-size B] [--batch-size R] [--tenant T]
//!     a new timeline (in a new tenant unless given) holding one page image per key,
//!     checkpointed; prints the ids to pass to `getpage`
//! pagebench getpage --tenant T --timeline TL --keys N --clients C [--lsn latest|X/X] [--seed S]
//!     GetPage@LSN of uniformly random keys in [0, N), then the `/v1/status` baseline
//! pagebench getpage --protocol grpc [--batch-size B] [--pipeline D] ... (same options)
//!     the page service: batches of B pages (0: unary GetPage), D calls in flight per client,
//!     then the `Ping` baseline (method in `grpc.rs`)
//! pagebench ingest [--tenant T] [--timeline TL]... --clients C --batch-size R [--value-size B]
//!     batches of R page images, one timeline per client, then the `/v1/status` baseline
//! pagebench scale --pageserver BIN --workdir DIR [--keys N] [--total 10GiB] ...
//!     starts the server itself: GiBs of random updates with compaction, images and GC,
//!     against a flush-only baseline (method in `scale.rs`)
//! pagebench datadir --pageserver BIN --workdir DIR --pgdata A [--pgdata-after B]
//!     starts the server itself: import and basebackup of a PostgreSQL data directory against
//!     a tar copy, and an incremental snapshot's bytes (method in `datadir.rs`)
//! pagebench soak --pageserver BIN --workdir DIR [--duration 30m] [--restart-every 5m] ...
//!     starts the server itself: mixed load with graceful restarts, errors, RSS, descriptors
//!     and p99 per interval (method in `soak.rs`)
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

mod commands;
mod datadir;
mod grpc;
mod http;
mod phases;
mod report;
mod scale;
mod soak;

use commands::*;
use http::*;
use phases::*;
use report::*;

/// Load generator for the page server's HTTP API and page service (gRPC), each measured against
/// a same-protocol baseline; the method is at the top of pagebench/src/main.rs, the figures in
/// docs/benchmarks.md.
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
    /// GetPage@LSN of random keys, then the /v1/status baseline (or, with `--protocol grpc`,
    /// the page service, then the Ping baseline).
    Getpage(GetPageArgs),
    /// Batches of page images, one timeline per client, then the /v1/status baseline.
    Ingest(IngestArgs),
    /// GiBs of random updates with compaction, images and GC at default settings, against a
    /// flush-only baseline, starting the server itself (see pagebench/src/scale.rs).
    Scale(scale::ScaleArgs),
    /// A long run of mixed load (HTTP and gRPC reads, ingest, scans, maintenance) with
    /// restarts, watched for errors, memory, descriptors and p99 per interval, starting the
    /// server itself (see pagebench/src/soak.rs).
    Soak(soak::SoakArgs),
    /// Import and basebackup of a real PostgreSQL data directory against a tar copy, starting
    /// the server itself (see pagebench/src/datadir.rs).
    Datadir(datadir::DatadirArgs),
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
    #[command(flatten)]
    grpc: GrpcArgs,
}

/// How `getpage` reads: over HTTP, or over the page service (see pagebench/src/grpc.rs).
#[derive(Args, Clone)]
struct GrpcArgs {
    /// `http` (one page per GET) or `grpc` (the page service).
    #[arg(long, value_enum, default_value_t = Protocol::Http)]
    protocol: Protocol,
    /// The page service's address, for `--protocol grpc`.
    #[arg(long, default_value = "http://127.0.0.1:9899")]
    grpc_endpoint: String,
    /// gRPC: pages per GetPages batch; 0 for unary GetPage calls of one page.
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// gRPC: calls in flight per client (batches on its stream, or unary calls on its channel).
    #[arg(long, default_value_t = 1)]
    pipeline: usize,
    /// gRPC: a batch is a run of consecutive keys from a random one (a sequential scan's
    /// prefetch), not random keys.
    #[arg(long)]
    sequential: bool,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Protocol {
    Http,
    Grpc,
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
    let endpoint = Arc::new(Endpoint::parse(&cli.endpoint, token.clone())?);
    match cli.command {
        Command::Prepare(args) => prepare(endpoint, args).await,
        Command::Getpage(args) if args.grpc.protocol == Protocol::Grpc => {
            let grpc = args.grpc.clone();
            grpc::getpage(args, grpc, token).await
        }
        Command::Getpage(args) => getpage(endpoint, args).await,
        Command::Ingest(args) => ingest(endpoint, args).await,
        Command::Scale(args) => scale::run(args).await,
        Command::Soak(args) => soak::run(args).await,
        Command::Datadir(args) => datadir::run(args).await,
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
