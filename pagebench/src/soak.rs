//! `pagebench soak`: a long run of mixed load with restarts, watched for errors, memory, file
//! descriptors and tail latency over time. The tool starts the server itself and keeps its work
//! directory across restarts, so the run covers startup on a directory that a loaded server left.
//!
//! ```text
//! pagebench soak --pageserver target/release/pageserver --workdir /tmp/soak
//!     [--duration 30m] [--interval 1m] [--restart-every 5m] [--keys 4096]
//!     [--http-clients 2] [--grpc-clients 1] [--grpc-batch 32] [--ingest-mib-per-sec 2]
//!     [--scans-per-sec 4] [--maintenance-every 20s] [--csv soak.csv] [--json]
//! ```
//!
//! # The load
//!
//! One timeline of `--keys` pages (8 KiB images stamped with their key, written first), then,
//! all at once and without pause:
//!
//! - `--http-clients` closed-loop `GET .../page` clients at `latest`, random keys;
//! - `--grpc-clients` page service streams, one `GetPages` batch of `--grpc-batch` random keys
//!   in flight each;
//! - one ingest client sending batches of 16 new images of the same keys (so reads always find
//!   a newer version to return), paced to `--ingest-mib-per-sec`;
//! - one scan client, paced to `--scans-per-sec`: up to three pages of 100 keys from a random
//!   key, following `next_page_token`;
//! - every `--maintenance-every`: `checkpoint`, `compact` and `gc` on the timeline, besides
//!   what the background loops do on their own.
//!
//! The reads are the closed loops: with the defaults they keep both cores of a 2-vCPU machine
//! busy, the point where `pagebench getpage` stops gaining throughput from more clients.
//! Every page read (HTTP, gRPC or scan) is checked by its stamp; every failed exchange is an
//! error, and the run exits non-zero if there was one.
//!
//! # Restarts and intervals
//!
//! The run is cut into `--interval` windows. Every `--restart-every` the server is stopped with
//! SIGTERM between two windows (it must exit 0), started again on the same work directory, and
//! the next window begins once it answers: a restart costs no request. Each window's row has,
//! per kind of load, the requests, errors and p99 latency, and the server's resident memory
//! (`VmRSS`, sampled every second: mean and max) and open file descriptors (`/proc/<pid>/fd`:
//! min and max).

use std::path::PathBuf;
use std::process::{Child, Stdio};

use super::*;

/// Records per ingest batch: 128 KiB of images.
const INGEST_BATCH: usize = 16;
/// Keys per scan page, and pages per scan at most.
const SCAN_LIMIT: u32 = 100;
const SCAN_PAGES: usize = 3;
/// How long a server may take to answer after it starts, and to exit after SIGTERM.
const START_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_TIMEOUT: Duration = Duration::from_secs(60);
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

#[derive(Args)]
pub struct SoakArgs {
    /// The pageserver binary to start (a release build).
    #[arg(long)]
    pageserver: PathBuf,
    /// Where the server's work directory (`<workdir>/soak`) and log go; emptied first.
    #[arg(long)]
    workdir: PathBuf,
    /// The server's HTTP port.
    #[arg(long, default_value_t = 9898)]
    port: u16,
    /// The page service's port.
    #[arg(long, default_value_t = 9899)]
    grpc_port: u16,
    #[arg(long, default_value = "30m", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// One row of figures per interval.
    #[arg(long, default_value = "1m", value_parser = humantime::parse_duration)]
    interval: Duration,
    /// A graceful restart between two intervals this often; 0 for none.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    restart_every: Duration,
    #[arg(long, default_value_t = 4096)]
    keys: u32,
    #[arg(long, default_value_t = 2)]
    http_clients: usize,
    #[arg(long, default_value_t = 1)]
    grpc_clients: usize,
    #[arg(long, default_value_t = 32)]
    grpc_batch: usize,
    #[arg(long, default_value_t = 2.0)]
    ingest_mib_per_sec: f64,
    #[arg(long, default_value_t = 4.0)]
    scans_per_sec: f64,
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    maintenance_every: Duration,
    /// More `-c` settings for the server (`page_cache_size=64MiB` is set already).
    #[arg(long = "set")]
    settings: Vec<String>,
    /// Also write the rows as CSV here (`scripts/plot-soak` draws them).
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// The server under test, on one work directory for the whole run.
struct SoakServer {
    child: Child,
    endpoint: Arc<Endpoint>,
}

impl SoakServer {
    async fn start(args: &SoakArgs) -> anyhow::Result<SoakServer> {
        let mut command = std::process::Command::new(&args.pageserver);
        command
            .arg("-D")
            .arg(args.workdir.join("soak"))
            .args(["-c", &format!("listen_http_addr=127.0.0.1:{}", args.port)])
            .args([
                "-c",
                &format!("listen_grpc_addr=127.0.0.1:{}", args.grpc_port),
            ])
            .args(["-c", "page_cache_size=64MiB"]);
        for setting in &args.settings {
            command.args(["-c", setting]);
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(args.workdir.join("soak.log"))?;
        let child = command
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", args.pageserver.display()))?;
        let endpoint = Arc::new(Endpoint::parse(
            &format!("http://127.0.0.1:{}", args.port),
            None,
        )?);
        let server = SoakServer { child, endpoint };
        wait_until_answering(&server.endpoint, START_TIMEOUT).await?;
        Ok(server)
    }

    /// SIGTERM, and the exit it must make: status 0 within `STOP_TIMEOUT`.
    async fn stop(mut self) -> anyhow::Result<()> {
        let pid = libc::pid_t::try_from(self.child.id())?;
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
            bail!("SIGTERM: {}", std::io::Error::last_os_error());
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait()? {
                if !status.success() {
                    bail!("the server exited with {status} after SIGTERM");
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the server did not exit within {STOP_TIMEOUT:?} of SIGTERM");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Resident bytes and open file descriptors, from `/proc`.
    fn sample(&self) -> Option<(u64, u64)> {
        let pid = self.child.id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
        Some((kib * 1024, fds))
    }
}

impl Drop for SoakServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One kind of load in one interval.
#[derive(Default)]
struct KindRow {
    requests: u64,
    errors: u64,
    p99_us: f64,
}

impl KindRow {
    fn of(stats: &PhaseStats) -> KindRow {
        KindRow {
            requests: stats.requests,
            errors: stats.errors,
            p99_us: if stats.requests > 0 {
                Latency::of(&stats.histogram).p99_us
            } else {
                0.0
            },
        }
    }

    fn json(&self) -> JsonValue {
        json!({"requests": self.requests, "errors": self.errors, "p99_us": round(self.p99_us, 1)})
    }
}

const KINDS: [&str; 5] = [
    "http_getpage",
    "grpc_getpages",
    "ingest",
    "scan",
    "maintenance",
];

/// The figures of one interval.
struct Row {
    minute: f64,
    restarted: bool,
    kinds: [KindRow; 5],
    rss_mean_mib: f64,
    rss_max_mib: f64,
    fds_min: u64,
    fds_max: u64,
}

impl Row {
    fn errors(&self) -> u64 {
        self.kinds.iter().map(|k| k.errors).sum()
    }

    fn json(&self) -> JsonValue {
        let mut row = Map::new();
        row.insert("minute".into(), json!(round(self.minute, 2)));
        row.insert("restarted".into(), json!(self.restarted));
        for (name, kind) in KINDS.iter().zip(&self.kinds) {
            row.insert((*name).into(), kind.json());
        }
        row.insert("rss_mean_mib".into(), json!(round(self.rss_mean_mib, 1)));
        row.insert("rss_max_mib".into(), json!(round(self.rss_max_mib, 1)));
        row.insert("fds_min".into(), json!(self.fds_min));
        row.insert("fds_max".into(), json!(self.fds_max));
        JsonValue::Object(row)
    }

    fn csv_header() -> String {
        let mut fields = vec!["minute".to_string(), "restarted".to_string()];
        for name in KINDS {
            fields.push(format!("{name}_requests"));
            fields.push(format!("{name}_errors"));
            fields.push(format!("{name}_p99_us"));
        }
        fields.extend(["rss_mean_mib", "rss_max_mib", "fds_min", "fds_max"].map(String::from));
        fields.join(",")
    }

    fn csv(&self) -> String {
        let mut fields = vec![
            format!("{:.2}", self.minute),
            u8::from(self.restarted).to_string(),
        ];
        for kind in &self.kinds {
            fields.push(kind.requests.to_string());
            fields.push(kind.errors.to_string());
            fields.push(format!("{:.1}", kind.p99_us));
        }
        fields.push(format!("{:.1}", self.rss_mean_mib));
        fields.push(format!("{:.1}", self.rss_max_mib));
        fields.push(self.fds_min.to_string());
        fields.push(self.fds_max.to_string());
        fields.join(",")
    }
}

/// What every window's clients share.
struct Load {
    tenant: TenantId,
    timeline: TimelineId,
    timeline_path: String,
    ingest: IngestClient,
}

pub(crate) async fn run(args: SoakArgs) -> anyhow::Result<bool> {
    if args.interval.is_zero() || args.duration < args.interval {
        bail!("--interval must be above 0 and at most --duration");
    }
    if args.keys < 2 * SCAN_LIMIT {
        bail!("--keys must be at least {}", 2 * SCAN_LIMIT);
    }
    let _ = std::fs::remove_dir_all(&args.workdir);
    std::fs::create_dir_all(&args.workdir)?;
    let mut server = SoakServer::start(&args).await?;
    let mut load = prepare(&server, &args).await?;
    let started = Instant::now();
    let mut rows: Vec<Row> = Vec::new();
    let mut last_restart = Instant::now();
    let mut restarts = 0u32;
    if !args.json {
        eprintln!("pagebench: soak: {}", Row::csv_header());
    }
    while started.elapsed() + args.interval / 2 < args.duration {
        let restart_due =
            !args.restart_every.is_zero() && last_restart.elapsed() >= args.restart_every;
        if restart_due {
            server.stop().await?;
            server = SoakServer::start(&args).await?;
            last_restart = Instant::now();
            restarts += 1;
        }
        let minute = started.elapsed().as_secs_f64() / 60.0;
        let mut row = window(&server, &args, &mut load).await?;
        row.minute = minute;
        row.restarted = restart_due;
        if !args.json {
            eprintln!("pagebench: soak: {}", row.csv());
        }
        rows.push(row);
    }
    server.stop().await?;
    if let Some(path) = &args.csv {
        let mut text = Row::csv_header();
        for row in &rows {
            text.push('\n');
            text.push_str(&row.csv());
        }
        text.push('\n');
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    let errors: u64 = rows.iter().map(Row::errors).sum();
    let summary = summarize(&args, &rows, errors, restarts);
    if args.json {
        println!("{summary}");
    } else {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    }
    Ok(errors == 0)
}

/// The timeline and its first image of every key, flushed.
async fn prepare(server: &SoakServer, args: &SoakArgs) -> anyhow::Result<Load> {
    let mut conn = Connection::new(server.endpoint.clone());
    let tenant = conn.create_tenant().await?;
    let (timeline, _) = conn.create_timeline(tenant).await?;
    let timeline_path = timeline_path(tenant, timeline);
    let mut ingest = IngestClient {
        ingest_path: format!("{timeline_path}/ingest"),
        timeline_path: timeline_path.clone(),
        keys: args.keys,
        value_size: 8192,
        batch_size: 256,
        next: None,
        next_key: 0,
    };
    let mut written = 0;
    while written < u64::from(args.keys) {
        written += ingest.step(&mut conn).await.result?.records;
    }
    conn.call(
        Method::PUT,
        &format!("{timeline_path}/checkpoint"),
        None,
        StatusCode::OK,
    )
    .await?;
    ingest.batch_size = INGEST_BATCH;
    ingest.next = None;
    Ok(Load {
        tenant,
        timeline,
        timeline_path,
        ingest,
    })
}

/// One interval of every kind of load at once, and the samples of the server meanwhile.
async fn window(server: &SoakServer, args: &SoakArgs, load: &mut Load) -> anyhow::Result<Row> {
    let end = Instant::now() + args.interval;
    let window = Window {
        start: Instant::now(),
        end,
    };
    let log = |phase| {
        Arc::new(ErrorLog {
            phase,
            seen: AtomicU64::new(0),
        })
    };
    let http: Vec<_> = (0..args.http_clients)
        .map(|_| {
            let work = Work::GetPage {
                prefix: format!("{}/page?lsn=latest&key=", load.timeline_path),
                keys: args.keys,
                value_size: 8192,
                rng: fastrand::Rng::new(),
            };
            let conn = Connection::new(server.endpoint.clone());
            tokio::spawn(client_loop(conn, work, window, log("http_getpage")))
        })
        .collect();
    let grpc_endpoint = format!("http://127.0.0.1:{}", args.grpc_port);
    let grpc = grpc::getpages_window(
        &grpc_endpoint,
        load.tenant,
        load.timeline,
        args.keys,
        args.grpc_clients,
        args.grpc_batch,
        args.interval,
    );
    let ingest = paced_ingest(server, &mut load.ingest, args.ingest_mib_per_sec, end);
    let scans = scans(server, &load.timeline_path, args, end);
    let maintenance = maintenance(server, &load.timeline_path, args.maintenance_every, end);
    let samples = sample(server, end);
    let (grpc, ingest, scans, maintenance, samples) =
        tokio::join!(grpc, ingest, scans, maintenance, samples);
    let mut http_stats = PhaseStats::new("http_getpage");
    for client in http {
        http_stats.merge(client.await.context("a client failed")?)?;
    }
    let grpc = grpc.unwrap_or_else(|e| {
        eprintln!("pagebench: soak: page service: {e:#}");
        let mut failed = PhaseStats::new("getpages");
        failed.errors = 1;
        failed
    });
    let rss: Vec<f64> = samples.iter().map(|s| s.0 as f64 / MIB).collect();
    let fds: Vec<u64> = samples.iter().map(|s| s.1).collect();
    Ok(Row {
        minute: 0.0,
        restarted: false,
        kinds: [
            KindRow::of(&http_stats),
            KindRow::of(&grpc),
            KindRow::of(&ingest),
            KindRow::of(&scans),
            KindRow::of(&maintenance),
        ],
        rss_mean_mib: rss.iter().sum::<f64>() / rss.len().max(1) as f64,
        rss_max_mib: rss.iter().copied().fold(0.0, f64::max),
        fds_min: fds.iter().copied().min().unwrap_or(0),
        fds_max: fds.iter().copied().max().unwrap_or(0),
    })
}

/// A load that runs at a fixed pace until the window ends, counting what each exchange did.
struct Paced {
    stats: PhaseStats,
    log: ErrorLog,
    next: Instant,
    every: Duration,
    end: Instant,
}

impl Paced {
    fn new(phase: &'static str, every: Duration, end: Instant) -> Paced {
        Paced {
            stats: PhaseStats::new(phase),
            log: ErrorLog {
                phase,
                seen: AtomicU64::new(0),
            },
            next: Instant::now(),
            every,
            end,
        }
    }

    /// Waits for the next exchange's moment; false once the window is over.
    async fn tick(&mut self) -> bool {
        if self.next >= self.end {
            return false;
        }
        tokio::time::sleep_until(self.next.into()).await;
        self.next += self.every;
        true
    }

    /// Records what a timed exchange did.
    fn record(&mut self, exchange: Exchange) {
        match exchange.result {
            Ok(done) => self.stats.record(exchange.started, exchange.latency, done),
            Err(e) => {
                self.stats.errors += 1;
                self.log.report(&e);
            }
        }
    }

    /// Times `work` and records what it did.
    async fn exchange(&mut self, work: impl Future<Output = anyhow::Result<Done>>) {
        let (started, latency, result) = timed(work).await;
        self.record(Exchange {
            started,
            latency,
            result,
        });
    }
}

async fn paced_ingest(
    server: &SoakServer,
    client: &mut IngestClient,
    mib_per_sec: f64,
    end: Instant,
) -> PhaseStats {
    let batch_mib = (INGEST_BATCH * 8192) as f64 / MIB;
    let mut paced = Paced::new(
        "ingest",
        Duration::from_secs_f64(batch_mib / mib_per_sec.max(0.01)),
        end,
    );
    let mut conn = Connection::new(server.endpoint.clone());
    while paced.tick().await {
        paced.record(client.step(&mut conn).await);
    }
    paced.stats
}

async fn scans(
    server: &SoakServer,
    timeline_path: &str,
    args: &SoakArgs,
    end: Instant,
) -> PhaseStats {
    let every = Duration::from_secs_f64(1.0 / args.scans_per_sec.max(0.01));
    let mut paced = Paced::new("scan", every, end);
    let mut conn = Connection::new(server.endpoint.clone());
    let mut rng = fastrand::Rng::new();
    while paced.tick().await {
        let from = rng.u32(0..args.keys - SCAN_LIMIT);
        let to = (from + SCAN_LIMIT * SCAN_PAGES as u32).min(args.keys);
        paced
            .exchange(scan(&mut conn, timeline_path, from, to))
            .await;
    }
    paced.stats
}

/// Up to `SCAN_PAGES` pages of keys `[from, to)` at `latest`; every page checked by its stamp
/// and every key of the range present, in order.
async fn scan(
    conn: &mut Connection,
    timeline_path: &str,
    from: u32,
    to: u32,
) -> anyhow::Result<Done> {
    let (start, end) = (key_for(from), key_for(to));
    let mut token: Option<String> = None;
    let mut expected = from;
    let mut done = Done::default();
    for _ in 0..SCAN_PAGES {
        let mut path =
            format!("{timeline_path}/keys?start={start}&end={end}&lsn=latest&limit={SCAN_LIMIT}");
        if let Some(token) = &token {
            path.push_str(&format!("&page_token={token}"));
        }
        let page = conn.call(Method::GET, &path, None, StatusCode::OK).await?;
        let entries = page["entries"].as_array().context("scan: no entries")?;
        for entry in entries {
            let key = entry["key"]
                .as_str()
                .context("scan: an entry without a key")?;
            if key != key_for(expected).to_string() {
                bail!(
                    "scan of {start}..{end}: key {key} where {} was due",
                    key_for(expected)
                );
            }
            let page = entry["page"]
                .as_str()
                .context("scan: an entry without a page")?;
            check_base64_page(expected, page)?;
            expected += 1;
            done.records += 1;
            done.bytes += 8192;
        }
        match page["next_page_token"].as_str() {
            Some(next) => token = Some(next.to_string()),
            None => break,
        }
    }
    if token.is_none() && expected != to {
        bail!("scan of {start}..{end} ended at {} of {to} keys", expected);
    }
    Ok(done)
}

/// Checks an 8 KiB page in standard base64 by its length and its stamp.
fn check_base64_page(index: u32, text: &str) -> anyhow::Result<()> {
    // 8192 bytes are 10,924 characters, the last two of them padding.
    if text.len() != 10_924 || !text.ends_with('=') {
        bail!(
            "scan: page {index} is {} base64 characters, not 8 KiB",
            text.len()
        );
    }
    let value = |c: u8| -> anyhow::Result<u64> {
        Ok(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => bail!("scan: page {index} is not base64"),
        } as u64)
    };
    // The first 12 characters are the first 9 bytes; the stamp is the first 8.
    let mut bits: u128 = 0;
    for &c in &text.as_bytes()[..12] {
        bits = (bits << 6) | u128::from(value(c)?);
    }
    let stamp = (bits >> 8) as u64;
    if stamp != u64::from(index) {
        bail!("scan: wrong page for key {index}: its stamp is {stamp}");
    }
    Ok(())
}

async fn maintenance(
    server: &SoakServer,
    timeline_path: &str,
    every: Duration,
    end: Instant,
) -> PhaseStats {
    let mut paced = Paced::new("maintenance", every, end);
    paced.next += every / 2;
    let mut conn = Connection::new(server.endpoint.clone());
    while paced.tick().await {
        for action in ["checkpoint", "compact", "gc"] {
            let path = format!("{timeline_path}/{action}");
            let call = conn.call(Method::PUT, &path, None, StatusCode::OK);
            paced
                .exchange(async {
                    call.await.map(|_| Done {
                        bytes: 0,
                        records: 1,
                    })
                })
                .await;
        }
    }
    paced.stats
}

async fn sample(server: &SoakServer, end: Instant) -> Vec<(u64, u64)> {
    let mut samples = Vec::new();
    let mut next = Instant::now();
    while next < end {
        tokio::time::sleep_until(next.into()).await;
        samples.extend(server.sample());
        next += SAMPLE_EVERY;
    }
    samples
}

/// The run's figures: the rows, the errors, and how memory and descriptors moved.
///
/// Memory is judged two ways. `after_warmup`: the rows from a quarter of the run on (at least
/// the first restart period), their largest and smallest interval maximum. `process_peaks`: the
/// largest interval maximum of each server process, from start to restart; a server that keeps
/// something across restarts that grows (more layers to load, a longer manifest) shows as peaks
/// that climb. A restarted process warms up again (its allocator's arenas grow for minutes), so
/// with restarts the peaks are the fair comparison, and a run without restarts
/// (`--restart-every 0`) shows the warm-up itself.
fn summarize(args: &SoakArgs, rows: &[Row], errors: u64, restarts: u32) -> JsonValue {
    let warm_from = (args.restart_every.as_secs_f64() / 60.0)
        .max(args.duration.as_secs_f64() / 240.0)
        .min(args.duration.as_secs_f64() / 120.0);
    let warm: Vec<&Row> = rows.iter().filter(|r| r.minute >= warm_from).collect();
    let rss: Vec<f64> = warm.iter().map(|r| r.rss_max_mib).collect();
    let mut peaks: Vec<f64> = Vec::new();
    for row in rows {
        match peaks.last_mut() {
            Some(peak) if !row.restarted => *peak = peak.max(row.rss_max_mib),
            _ => peaks.push(row.rss_max_mib),
        }
    }
    let fds_min = warm.iter().map(|r| r.fds_min).min().unwrap_or(0);
    let fds_max = warm.iter().map(|r| r.fds_max).max().unwrap_or(0);
    let worst_p99 = |kind: usize| {
        rows.iter()
            .map(|r| r.kinds[kind].p99_us)
            .fold(0.0, f64::max)
    };
    let mut worst = Map::new();
    for (i, name) in KINDS.iter().enumerate() {
        worst.insert((*name).into(), json!(round(worst_p99(i), 1)));
    }
    json!({
        "scenario": "soak",
        "duration_s": args.duration.as_secs(),
        "interval_s": args.interval.as_secs(),
        "restarts": restarts,
        "errors": errors,
        "keys": args.keys,
        "clients": {"http": args.http_clients, "grpc": args.grpc_clients, "grpc_batch": args.grpc_batch},
        "ingest_mib_per_sec": args.ingest_mib_per_sec,
        "scans_per_sec": args.scans_per_sec,
        "after_warmup": {
            "from_minute": round(warm_from, 2),
            "rss_max_mib": spread(&rss),
            "fds": {"min": fds_min, "max": fds_max},
        },
        "process_peaks": spread(&peaks),
        "worst_p99_us": worst,
        "rows": rows.iter().map(Row::json).collect::<Vec<_>>(),
    })
}

/// The smallest and largest of `values`, and how far apart they are (% of the smallest).
fn spread(values: &[f64]) -> JsonValue {
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(0.0, f64::max);
    let pct = if min > 0.0 && min.is_finite() {
        (max - min) / min * 100.0
    } else {
        0.0
    };
    json!({
        "min": round(if min.is_finite() { min } else { 0.0 }, 1),
        "max": round(max, 1),
        "spread_pct": round(pct, 1),
        "values": values.iter().map(|v| round(*v, 1)).collect::<Vec<_>>(),
    })
}
