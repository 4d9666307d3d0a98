//! `getpage --protocol grpc`: the page service (gRPC) under load, against a `Ping` baseline on
//! the same kind of channel.
//!
//! Each client owns one channel (one HTTP/2 connection, `TCP_NODELAY`) and keeps
//! `--pipeline` calls in flight on it:
//!
//! - `--batch-size 0`: unary `GetPage` calls, one random page each, `--pipeline` of them at
//!   once (each a closed loop of its own on the shared channel);
//! - `--batch-size N`: one `GetPages` stream per client, with `--pipeline` batches of N random
//!   pages in flight (with `--sequential`, N consecutive pages from a random one); a new batch
//!   is sent as soon as an answer arrives.
//!
//! Latency is per call (a batch: from its send to its answer). The baseline runs unary `Ping`
//! calls with the same clients and pipeline depth. The report's requests are calls; pages are
//! its records, and `pages_vs_ping_x_batch` is pages/s over (Ping calls/s × batch size): above
//! 1 when reading a batch's pages costs less than a trivial call.

use std::collections::HashMap;

use page_api::proto::page_service_client::PageServiceClient;
use page_api::proto::{GetPageRequest, GetPagesRequest, PageRef, PingRequest};
use page_api::{TENANT_ID_HEADER, TIMELINE_ID_HEADER};
use tokio::sync::mpsc;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::transport::Channel;

use super::*;

/// Largest answer a client accepts: a batch of 1024 pages of 8 KiB with room to spare.
const MAX_MESSAGE: usize = 64 << 20;

/// Where and as whom to call.
#[derive(Clone)]
struct Target {
    endpoint: String,
    metadata: MetadataMap,
}

impl Target {
    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        *request.metadata_mut() = self.metadata.clone();
        request
    }

    async fn connect(&self) -> anyhow::Result<PageServiceClient<Channel>> {
        let channel = tonic::transport::Endpoint::from_shared(self.endpoint.clone())
            .with_context(|| format!("--grpc-endpoint {}", self.endpoint))?
            .tcp_nodelay(true)
            .initial_stream_window_size(Some(4 << 20))
            .initial_connection_window_size(Some(16 << 20))
            .connect()
            .await
            .with_context(|| format!("connecting to {}", self.endpoint))?;
        Ok(PageServiceClient::new(channel).max_decoding_message_size(MAX_MESSAGE))
    }
}

/// What one client does in a phase.
#[derive(Clone, Copy)]
enum Call {
    Ping,
    GetPage,
    GetPages { batch: usize },
}

pub(crate) async fn getpage(
    args: GetPageArgs,
    grpc: GrpcArgs,
    token: Option<String>,
) -> anyhow::Result<bool> {
    check_run_args(&args.run, &args.pages)?;
    if grpc.pipeline == 0 {
        bail!("--pipeline must be at least 1");
    }
    if grpc.batch_size > page_api::MAX_BATCH_PAGES {
        bail!(
            "--batch-size {} is above the protocol's {}",
            grpc.batch_size,
            page_api::MAX_BATCH_PAGES
        );
    }
    let mut metadata = MetadataMap::new();
    metadata.insert(
        TENANT_ID_HEADER,
        MetadataValue::try_from(args.tenant.to_string())?,
    );
    metadata.insert(
        TIMELINE_ID_HEADER,
        MetadataValue::try_from(args.timeline.to_string())?,
    );
    if let Some(token) = token {
        let value = MetadataValue::try_from(format!("Bearer {token}"))
            .context("the token is not valid metadata")?;
        metadata.insert("authorization", value);
    }
    let target = Target {
        endpoint: grpc.grpc_endpoint.clone(),
        metadata,
    };
    let lsn = match args.lsn {
        ReadLsn::Latest => 0,
        ReadLsn::At(lsn) => lsn.0,
    };
    // A missing timeline is one clear error rather than a run of failures.
    let mut probe = target.connect().await?;
    probe
        .get_page(target.request(GetPageRequest {
            key: Bytes::copy_from_slice(&key_for(0).to_bytes()),
            lsn,
        }))
        .await
        .map_err(|s| anyhow!("GetPage of key 0: {}: {}", s.code(), s.message()))?;
    let call = match grpc.batch_size {
        0 => Call::GetPage,
        batch => Call::GetPages { batch },
    };
    let scenario = Scenario {
        target,
        keys: args.pages.keys,
        value_size: args.pages.value_size,
        lsn,
        seed: args.seed,
        pipeline: grpc.pipeline,
        sequential: grpc.sequential,
    };
    let name = match call {
        Call::GetPage => "getpage",
        _ => "getpages",
    };
    let main = scenario.run_phase(name, call, &args.run).await?;
    let baseline = scenario.run_phase("ping", Call::Ping, &args.run).await?;
    let pages_per_sec = main.per_sec(main.records);
    let mut details = Map::new();
    details.insert("protocol".into(), json!("grpc"));
    details.insert("batch_size".into(), json!(grpc.batch_size));
    details.insert("pipeline".into(), json!(grpc.pipeline));
    details.insert("sequential".into(), json!(grpc.sequential));
    details.insert("keys".into(), json!(args.pages.keys));
    details.insert("value_size".into(), json!(args.pages.value_size));
    details.insert("lsn".into(), json!(args.lsn.to_string()));
    details.insert("pages_per_sec".into(), json!(round(pages_per_sec, 1)));
    let per_call = grpc.batch_size.max(1) as f64;
    let ping_pages = baseline.requests_per_sec() * per_call;
    details.insert(
        "pages_vs_ping_x_batch".into(),
        json!(round(
            if ping_pages > 0.0 {
                pages_per_sec / ping_pages
            } else {
                0.0
            },
            3
        )),
    );
    let report = Report {
        scenario: name,
        clients: args.run.clients,
        main,
        baseline,
        details,
    };
    Ok(report.print(args.run.json))
}

/// What every client of a run shares.
struct Scenario {
    target: Target,
    keys: u32,
    value_size: usize,
    lsn: u64,
    seed: u64,
    pipeline: usize,
    sequential: bool,
}

impl Scenario {
    async fn run_phase(
        &self,
        name: &'static str,
        call: Call,
        run: &RunArgs,
    ) -> anyhow::Result<PhaseStats> {
        if !run.json {
            eprintln!(
                "pagebench: {name}: {} clients × {} in flight, {} warmup, {} measured",
                run.clients,
                self.pipeline,
                humantime::format_duration(run.warmup),
                humantime::format_duration(run.duration)
            );
        }
        let log = Arc::new(ErrorLog {
            phase: name,
            seen: AtomicU64::new(0),
        });
        // Every channel is open before the warmup starts.
        let mut channels = Vec::with_capacity(run.clients);
        for _ in 0..run.clients {
            channels.push(self.target.connect().await?);
        }
        let start = Instant::now() + run.warmup;
        let window = Window {
            start,
            end: start + run.duration,
        };
        let mut tasks = Vec::new();
        for (client, channel) in channels.into_iter().enumerate() {
            let seed = self.seed.wrapping_add(client as u64);
            let (target, log) = (self.target.clone(), log.clone());
            let pages = Pages {
                keys: self.keys,
                value_size: self.value_size,
                lsn: self.lsn,
            };
            match call {
                Call::GetPages { batch } => {
                    let stream = StreamClient {
                        pages,
                        batch,
                        sequential: self.sequential,
                        depth: self.pipeline,
                        rng: fastrand::Rng::with_seed(seed),
                    };
                    tasks.push(tokio::spawn(stream.run(channel, target, window, log)));
                }
                Call::Ping | Call::GetPage => {
                    for lane in 0..self.pipeline {
                        let rng = fastrand::Rng::with_seed(
                            seed.wrapping_mul(31).wrapping_add(lane as u64),
                        );
                        let unary = UnaryClient { pages, call, rng };
                        let (channel, target, log) = (channel.clone(), target.clone(), log.clone());
                        tasks.push(tokio::spawn(unary.run(channel, target, window, log)));
                    }
                }
            }
        }
        let mut phase = PhaseStats::new(name);
        for task in tasks {
            phase.merge(task.await.context("a client failed")?)?;
        }
        phase.connections = run.clients as u64;
        phase.elapsed = window.measured(phase.last_done);
        Ok(phase)
    }
}

/// The pages a client reads, and how it checks them.
#[derive(Clone, Copy)]
struct Pages {
    keys: u32,
    value_size: usize,
    lsn: u64,
}

impl Pages {
    fn check(&self, index: u32, page: &[u8]) -> anyhow::Result<u64> {
        check_page(index, self.value_size, StatusCode::OK, page)?;
        Ok(page.len() as u64)
    }
}

/// One closed loop of unary calls on a shared channel.
struct UnaryClient {
    pages: Pages,
    call: Call,
    rng: fastrand::Rng,
}

impl UnaryClient {
    async fn run(
        mut self,
        mut client: PageServiceClient<Channel>,
        target: Target,
        window: Window,
        log: Arc<ErrorLog>,
    ) -> PhaseStats {
        let mut stats = PhaseStats::new(log.phase);
        while Instant::now() < window.end {
            let (started, latency, result) = match self.call {
                Call::Ping => {
                    let request = target.request(PingRequest { id: 1 });
                    let (started, latency, answer) = timed(client.ping(request)).await;
                    let result = answer
                        .map(|_| Done {
                            bytes: 0,
                            records: 1,
                        })
                        .map_err(|s| anyhow!("Ping: {}: {}", s.code(), s.message()));
                    (started, latency, result)
                }
                _ => {
                    let index = self.rng.u32(0..self.pages.keys);
                    let request = target.request(GetPageRequest {
                        key: Bytes::copy_from_slice(&key_for(index).to_bytes()),
                        lsn: self.pages.lsn,
                    });
                    let (started, latency, answer) = timed(client.get_page(request)).await;
                    let result = answer
                        .map_err(|s| {
                            anyhow!("GetPage {}: {}: {}", key_for(index), s.code(), s.message())
                        })
                        .and_then(|answer| {
                            let bytes = self.pages.check(index, &answer.get_ref().page)?;
                            Ok(Done { bytes, records: 1 })
                        });
                    (started, latency, result)
                }
            };
            match result {
                Ok(done) if started >= window.start => stats.record(started, latency, done),
                Ok(_) => {}
                Err(e) => {
                    stats.errors += 1;
                    log.report(&e);
                    tokio::time::sleep(ERROR_PAUSE).await;
                }
            }
        }
        stats
    }
}

/// One `GetPages` stream with `depth` batches in flight.
struct StreamClient {
    pages: Pages,
    batch: usize,
    sequential: bool,
    depth: usize,
    rng: fastrand::Rng,
}

impl StreamClient {
    async fn run(
        mut self,
        mut client: PageServiceClient<Channel>,
        target: Target,
        window: Window,
        log: Arc<ErrorLog>,
    ) -> PhaseStats {
        let mut stats = PhaseStats::new(log.phase);
        if let Err(e) = self.stream(&mut client, &target, window, &mut stats).await {
            stats.errors += 1;
            log.report(&e);
        }
        stats
    }

    async fn stream(
        &mut self,
        client: &mut PageServiceClient<Channel>,
        target: &Target,
        window: Window,
        stats: &mut PhaseStats,
    ) -> anyhow::Result<()> {
        let (requests, outbound) = mpsc::channel(self.depth);
        let outbound = tokio_stream::wrappers::ReceiverStream::new(outbound);
        // Sent batches by id: when, and which pages.
        let mut in_flight: HashMap<u64, (Instant, Vec<u32>)> = HashMap::new();
        let mut next_id = 0u64;
        for _ in 0..self.depth {
            self.send(&requests, &mut in_flight, &mut next_id).await?;
        }
        let mut answers = client
            .get_pages(target.request(outbound))
            .await
            .map_err(|s| anyhow!("GetPages: {}: {}", s.code(), s.message()))?
            .into_inner();
        while !in_flight.is_empty() {
            let answer = answers
                .message()
                .await
                .map_err(|s| anyhow!("GetPages: {}: {}", s.code(), s.message()))?
                .context("GetPages: the stream ended with batches unanswered")?;
            let (started, indexes) = in_flight
                .remove(&answer.id)
                .with_context(|| format!("GetPages: an answer to batch {}, not sent", answer.id))?;
            let latency = started.elapsed();
            if let Some(error) = &answer.error {
                bail!(
                    "GetPages batch {}: code {}: {}",
                    answer.id,
                    error.code,
                    error.message
                );
            }
            if answer.pages.len() != indexes.len() {
                bail!(
                    "GetPages batch {}: {} pages for {} asked",
                    answer.id,
                    answer.pages.len(),
                    indexes.len()
                );
            }
            let mut bytes = 0;
            for (index, page) in indexes.iter().zip(&answer.pages) {
                if !page.found {
                    bail!("GetPage {}: not found", key_for(*index));
                }
                bytes += self.pages.check(*index, &page.page)?;
            }
            if started >= window.start {
                let records = indexes.len() as u64;
                stats.record(started, latency, Done { bytes, records });
            }
            if Instant::now() < window.end {
                self.send(&requests, &mut in_flight, &mut next_id).await?;
            }
        }
        Ok(())
    }

    async fn send(
        &mut self,
        requests: &mpsc::Sender<GetPagesRequest>,
        in_flight: &mut HashMap<u64, (Instant, Vec<u32>)>,
        next_id: &mut u64,
    ) -> anyhow::Result<()> {
        let keys = self.pages.keys;
        let indexes: Vec<u32> = if self.sequential {
            let start = self.rng.u32(0..keys);
            (0..self.batch as u32).map(|i| (start + i) % keys).collect()
        } else {
            (0..self.batch).map(|_| self.rng.u32(0..keys)).collect()
        };
        let pages = indexes
            .iter()
            .map(|&index| PageRef {
                key: Bytes::copy_from_slice(&key_for(index).to_bytes()),
                lsn: self.pages.lsn,
            })
            .collect();
        let id = *next_id;
        *next_id += 1;
        in_flight.insert(id, (Instant::now(), indexes));
        requests
            .send(GetPagesRequest { id, pages })
            .await
            .map_err(|_| anyhow!("GetPages: the stream closed"))
    }
}

/// `clients` `GetPages` streams of `batch` random pages each, one batch in flight per stream,
/// at `latest`, for `duration` without a warmup: the page service's share of `pagebench
/// soak`. Channels are opened first, so a window after a restart connects afresh.
pub(crate) async fn getpages_window(
    endpoint: &str,
    tenant: TenantId,
    timeline: TimelineId,
    keys: u32,
    clients: usize,
    batch: usize,
    duration: Duration,
) -> anyhow::Result<PhaseStats> {
    let mut metadata = MetadataMap::new();
    metadata.insert(
        TENANT_ID_HEADER,
        MetadataValue::try_from(tenant.to_string())?,
    );
    metadata.insert(
        TIMELINE_ID_HEADER,
        MetadataValue::try_from(timeline.to_string())?,
    );
    let scenario = Scenario {
        target: Target {
            endpoint: endpoint.to_string(),
            metadata,
        },
        keys,
        value_size: 8192,
        lsn: 0,
        seed: fastrand::u64(..),
        pipeline: 1,
        sequential: false,
    };
    let run = RunArgs {
        clients,
        duration,
        warmup: Duration::ZERO,
        json: true,
    };
    scenario
        .run_phase("getpages", Call::GetPages { batch }, &run)
        .await
}
