//! `pagebench scale`: what a timeline's reads, ingest rate, write amplification and disk use
//! become over GiBs of updates, with L0 compaction, image creation and GC running in the
//! background at their default settings. The tool starts the server itself, once per phase, in
//! a fresh work directory, so every figure comes from one invocation on one machine.
//!
//! ```text
//! pagebench scale --pageserver target/release/pageserver --workdir /tmp/scale
//!     [--keys 131072] [--total 10GiB] [--first-read-at 1GiB] [--baseline 1GiB]
//!     [--insert-only 2GiB] [--reads 2000] [--batch-size 256] [--pagectl target/release/pagectl]
//! ```
//!
//! # Phases
//!
//! 1. **Flush-only baseline.** `compaction_threshold=0` (no compaction, no images, no GC, no
//!    backpressure): `--baseline` bytes of updates; its MiB/s is what ingest costs with nothing
//!    but flushes behind it.
//! 2. **Scale run**, default settings except `materialized_versions_per_key=0` (reads must walk
//!    the layers, not find a memorized page). First every key gets an image (`--keys` pages of
//!    8 KiB: the logical size), then updates. At `--first-read-at` bytes of payload in all, and
//!    again at `--total`, ingest pauses, the background is let settle (until fewer than
//!    `compaction_threshold` L0s wait, at most 60 s), the page cache is dropped, and `--reads`
//!    random keys are read at `latest`, one at a time: latency, and the layers each read visited
//!    (`X-Read-Cost: layers=`). Every page is checked by its stamp. While ingest runs, a sampler
//!    polls the timeline every 200 ms for the most L0 layers seen.
//! 3. **After GC**: one `PUT .../gc` (the background runs it too), then the bytes of the
//!    timeline's layer files against the logical size and the horizon (`gc_horizon`, 64 MiB).
//! 4. **Insert-only**: a fresh server, `--insert-only` bytes of new keys in key order, settled;
//!    its write amplification.
//!
//! **An update** is an 8 KiB page image of a key drawn uniformly at random (seeded), so every
//! page stays checkable by its stamp; a batch holds `--batch-size` of them at consecutive LSNs
//! (advancing by the record's size, as WAL would). Images rather than small deltas make the
//! payload count honest (every byte ingested is a byte a read may need) and are the heavier
//! case for compaction and write amplification.
//!
//! **Write amplification** is (L0 bytes flushed + L1 bytes compaction wrote + image bytes) over
//! the payload ingested, from the server's own counters. **Memory** is the server's peak RSS
//! (`VmHWM`), which includes the page cache (`page_cache_size`, 64 MiB) and every buffer.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::AtomicBool;

use super::*;
use utils::units::parse_size;

/// Page size of every record.
const PAGE: usize = 8192;
/// How long a server may take to answer `/v1/status` after it starts.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the background may take to settle at a pause.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(180);
/// How long the layer files must stay unchanged for the background to count as settled.
const QUIET: Duration = Duration::from_secs(12);
/// The default `compaction_threshold`: a settled timeline has fewer L0s than this.
const COMPACTION_THRESHOLD: u64 = 4;

#[derive(Args)]
pub struct ScaleArgs {
    /// The pageserver binary to start (a release build).
    #[arg(long)]
    pageserver: PathBuf,
    /// Where the phases' work directories go (each removed after its phase).
    #[arg(long)]
    workdir: PathBuf,
    /// Port the server listens on.
    #[arg(long, default_value_t = 19870)]
    port: u16,
    /// Keys of the scale run; the logical size is keys x 8 KiB.
    #[arg(long, default_value_t = 131_072)]
    keys: u32,
    /// Payload of the scale run, the first images included.
    #[arg(long, default_value = "10GiB", value_parser = parse_size)]
    total: u64,
    /// Payload at which the first reads are taken.
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    first_read_at: u64,
    /// Payload of the flush-only baseline.
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    baseline: u64,
    /// Payload of the insert-only run (0: skip it).
    #[arg(long, default_value = "2GiB", value_parser = parse_size)]
    insert_only: u64,
    /// Random reads at each read point.
    #[arg(long, default_value_t = 2000)]
    reads: u32,
    /// Records per ingest request.
    #[arg(long, default_value_t = 256)]
    batch_size: usize,
    /// A pagectl binary: draws the timeline's layers at each read point (`scale-<n>.svg` in
    /// the current directory).
    #[arg(long)]
    pagectl: Option<PathBuf>,
    #[arg(long, default_value_t = 0x5ca1e)]
    seed: u64,
}

/// A server of one phase: killed, and its work directory removed, when dropped.
pub(crate) struct Server {
    child: Child,
    workdir: PathBuf,
    pub(crate) endpoint: Arc<Endpoint>,
}

impl Server {
    async fn start(args: &ScaleArgs, name: &str, settings: &[&str]) -> anyhow::Result<Server> {
        Server::launch(&args.pageserver, &args.workdir, args.port, name, settings).await
    }

    /// Starts `pageserver` in a fresh `<root>/<name>` on `port`, with `-c` `settings`, and
    /// waits for it to answer.
    pub(crate) async fn launch(
        pageserver: &Path,
        root: &Path,
        port: u16,
        name: &str,
        settings: &[&str],
    ) -> anyhow::Result<Server> {
        let workdir = root.join(name);
        let _ = std::fs::remove_dir_all(&workdir);
        std::fs::create_dir_all(root)?;
        let mut command = std::process::Command::new(pageserver);
        command
            .arg("-D")
            .arg(&workdir)
            .args(["-c", &format!("listen_http_addr=127.0.0.1:{port}")]);
        for setting in settings {
            command.args(["-c", setting]);
        }
        let log = std::fs::File::create(root.join(format!("{name}.log")))?;
        let child = command
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", pageserver.display()))?;
        let endpoint = Arc::new(Endpoint::parse(&format!("http://127.0.0.1:{port}"), None)?);
        let server = Server {
            child,
            workdir,
            endpoint,
        };
        wait_until_answering(&server.endpoint, START_TIMEOUT).await?;
        Ok(server)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The server's peak resident memory, from `/proc`.
    pub(crate) fn peak_rss_bytes(&self) -> Option<u64> {
        self.status_bytes("VmHWM:")
    }

    /// The server's resident memory now, from `/proc`.
    pub(crate) fn rss_bytes(&self) -> Option<u64> {
        self.status_bytes("VmRSS:")
    }

    /// Starts the peak over from the resident memory now (`clear_refs` 5, Linux 4.0 on);
    /// whether it could.
    pub(crate) fn reset_peak_rss(&self) -> bool {
        std::fs::write(format!("/proc/{}/clear_refs", self.pid()), "5").is_ok()
    }

    fn status_bytes(&self, field: &str) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        let line = status.lines().find(|l| l.starts_with(field))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.workdir);
    }
}

/// One timeline being written: where, and the LSN its next batch starts at.
struct Target {
    tenant: TenantId,
    timeline: TimelineId,
    path: String,
    next_lsn: Lsn,
    /// Payload ingested so far.
    payload: u64,
    /// Latency of every batch, in microseconds.
    batches: Histogram<u64>,
}

impl Target {
    async fn create(conn: &mut Connection) -> anyhow::Result<Target> {
        let tenant = conn.create_tenant().await?;
        let (timeline, last) = conn.create_timeline(tenant).await?;
        Ok(Target {
            tenant,
            timeline,
            path: timeline_path(tenant, timeline),
            next_lsn: last.checked_add(lsn_step(PAGE)).context("LSN overflow")?,
            payload: 0,
            batches: Histogram::new_with_bounds(1, HISTOGRAM_MAX_NS / 1000, 3)?,
        })
    }

    fn dir(&self, server: &Server) -> PathBuf {
        server
            .workdir
            .join("tenants")
            .join(self.tenant.to_string())
            .join("timelines")
            .join(self.timeline.to_string())
    }

    /// Ingests batches of the keys `next_key` gives until `payload` bytes have gone in all.
    async fn ingest_until(
        &mut self,
        conn: &mut Connection,
        payload: u64,
        batch_size: usize,
        mut next_key: impl FnMut() -> u32,
    ) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let ingest_path = format!("{}/ingest", self.path);
        while self.payload < payload {
            let mut records = Vec::with_capacity(batch_size);
            for _ in 0..batch_size {
                let key = next_key();
                records.push(PutRecord {
                    key: key_for(key),
                    lsn: self.next_lsn,
                    value: Value::Image(page_image(key, PAGE)),
                });
                self.next_lsn = self
                    .next_lsn
                    .checked_add(lsn_step(PAGE))
                    .context("LSN overflow")?;
            }
            let body = Bytes::from(encode_batch(&records).context("encoding a batch")?);
            let sent = Instant::now();
            let (status, reply) = conn
                .exchange(Method::POST, &ingest_path, Some((body, OCTET_STREAM)))
                .await?;
            if status != StatusCode::OK {
                bail!("ingest: {}", describe_failure(status, &reply));
            }
            let micros = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
            self.batches.saturating_record(micros.max(1));
            self.payload += (batch_size * PAGE) as u64;
        }
        Ok(started.elapsed())
    }

    async fn info(&self, conn: &mut Connection) -> anyhow::Result<JsonValue> {
        conn.call(Method::GET, &self.path, None, StatusCode::OK)
            .await
    }

    /// Waits until fewer than `compaction_threshold` L0s wait and the layer files have not
    /// changed for [`QUIET`] (the background has caught up: an image creation in progress
    /// takes a few seconds without a change, so the window is longer), or [`SETTLE_TIMEOUT`].
    async fn settle(&self, conn: &mut Connection) -> anyhow::Result<()> {
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        let mut last: Option<(JsonValue, Instant)> = None;
        while Instant::now() < deadline {
            let listing = conn
                .call(
                    Method::GET,
                    &format!("{}/layer", self.path),
                    None,
                    StatusCode::OK,
                )
                .await?;
            let l0 = listing["layers"]
                .as_array()
                .map_or(0, |l| l.iter().filter(|l| l["level"] == "L0").count());
            let files: JsonValue = listing["layers"]
                .as_array()
                .map(|l| l.iter().map(|l| l["file_name"].clone()).collect())
                .unwrap_or_default();
            match &last {
                Some((seen, since)) if *seen == files => {
                    if (l0 as u64) < COMPACTION_THRESHOLD && since.elapsed() >= QUIET {
                        return Ok(());
                    }
                }
                _ => last = Some((files, Instant::now())),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        eprintln!("pagebench: the background did not settle within {SETTLE_TIMEOUT:?}");
        Ok(())
    }
}

/// The most L0 layers seen while a sampler ran.
struct L0Sampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<u64>,
}

impl L0Sampler {
    fn start(endpoint: Arc<Endpoint>, path: String) -> L0Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                let mut conn = Connection::new(endpoint);
                let mut most = 0;
                while !stop.load(Ordering::Acquire) {
                    if let Ok(info) = conn.call(Method::GET, &path, None, StatusCode::OK).await {
                        most = most.max(info["layers"]["l0"].as_u64().unwrap_or(0));
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                most
            }
        });
        L0Sampler { stop, task }
    }

    async fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Release);
        self.task.await.unwrap_or(0)
    }
}

/// What the reads at one point found.
struct ReadPoint {
    payload: u64,
    layers: Vec<u32>,
    micros: Histogram<u64>,
    layer_files: JsonValue,
}

impl ReadPoint {
    fn layers_at(&self, quantile: f64) -> u32 {
        let mut sorted = self.layers.clone();
        sorted.sort_unstable();
        let index = ((sorted.len() as f64 * quantile).ceil() as usize).saturating_sub(1);
        sorted.get(index).copied().unwrap_or(0)
    }
}

/// `reads` random keys at `latest` after a page cache drop, each checked.
async fn read_point(
    conn: &mut Connection,
    target: &Target,
    keys: u32,
    reads: u32,
    rng: &mut fastrand::Rng,
) -> anyhow::Result<ReadPoint> {
    conn.call(Method::POST, "/v1/page_cache/drop", None, StatusCode::OK)
        .await?;
    let mut point = ReadPoint {
        payload: target.payload,
        layers: Vec::with_capacity(reads as usize),
        micros: Histogram::new_with_bounds(1, HISTOGRAM_MAX_NS / 1000, 3)?,
        layer_files: target.info(conn).await?["layers"].clone(),
    };
    for _ in 0..reads {
        let index = rng.u32(0..keys);
        let path = format!("{}/page?key={}&lsn=latest", target.path, key_for(index));
        let sent = Instant::now();
        let (status, headers, body) = conn.exchange_with_headers(Method::GET, &path, None).await?;
        let micros = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
        check_page(index, PAGE, status, &body)?;
        point.micros.saturating_record(micros.max(1));
        let cost = headers
            .get("x-read-cost")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        let layers = cost
            .split_whitespace()
            .find_map(|f| f.strip_prefix("layers="))
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("no layers= in X-Read-Cost `{cost}`"))?;
        point.layers.push(layers);
    }
    Ok(point)
}

/// A counter's value on the server's `/metrics` page.
async fn metric(conn: &mut Connection, name: &str) -> anyhow::Result<f64> {
    let (status, body) = conn.exchange(Method::GET, "/metrics", None).await?;
    if status != StatusCode::OK {
        bail!("/metrics: {}", describe_failure(status, &body));
    }
    let text = std::str::from_utf8(&body)?;
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .with_context(|| format!("no {name} on /metrics"))
}

/// Bytes written to layer files so far: flushed L0s, compaction's L1s, images.
async fn layer_bytes_written(conn: &mut Connection) -> anyhow::Result<f64> {
    Ok(metric(conn, "pageserver_layer_flush_bytes_total").await?
        + metric(conn, "pageserver_compaction_written_bytes_total").await?
        + metric(conn, "pageserver_image_written_bytes_total").await?)
}

/// The bytes of the layer files in a timeline directory.
fn bytes_on_disk(dir: &Path) -> anyhow::Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().contains("__") {
            total += entry.metadata()?.len();
        }
    }
    Ok(total)
}

fn draw(args: &ScaleArgs, target: &Target, server: &Server, n: usize) {
    let Some(pagectl) = &args.pagectl else { return };
    let out = format!("scale-{n}.svg");
    let status = std::process::Command::new(pagectl)
        .arg("draw")
        .arg(target.dir(server))
        .args(["-o", &out])
        .status();
    if !status.is_ok_and(|s| s.success()) {
        eprintln!("pagebench: pagectl draw failed; no {out}");
    }
}

fn mib_per_sec(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / MIB / elapsed.as_secs_f64()
}

pub async fn run(args: ScaleArgs) -> anyhow::Result<bool> {
    if args.keys == 0 || args.batch_size == 0 || args.first_read_at > args.total {
        bail!("--keys and --batch-size must be at least 1, --first-read-at at most --total");
    }
    let mut rng = fastrand::Rng::with_seed(args.seed);
    let keys = args.keys;
    let no_memo = "materialized_versions_per_key=0";

    // 1. Flush-only baseline.
    let baseline_rate = {
        let server = Server::start(&args, "baseline", &["compaction_threshold=0", no_memo]).await?;
        let mut conn = Connection::new(server.endpoint.clone());
        let mut target = Target::create(&mut conn).await?;
        let elapsed = target
            .ingest_until(&mut conn, args.baseline, args.batch_size, || {
                rng.u32(0..keys)
            })
            .await?;
        mib_per_sec(target.payload, elapsed)
    };
    println!("flush-only baseline: {baseline_rate:.1} MiB/s");

    // 2. The scale run.
    let server = Server::start(&args, "scale", &[no_memo]).await?;
    let mut conn = Connection::new(server.endpoint.clone());
    let mut target = Target::create(&mut conn).await?;
    let mut next = 0u32;
    let load = u64::from(keys) * PAGE as u64;
    target
        .ingest_until(&mut conn, load, args.batch_size, || {
            next = (next + 1) % keys;
            next
        })
        .await?;
    let mut points = Vec::new();
    let mut most_l0 = 0;
    let mut update_time = Duration::ZERO;
    let update_start = target.payload;
    for (n, until) in [args.first_read_at, args.total].into_iter().enumerate() {
        let sampler = L0Sampler::start(server.endpoint.clone(), target.path.clone());
        update_time += target
            .ingest_until(&mut conn, until, args.batch_size, || rng.u32(0..keys))
            .await?;
        most_l0 = most_l0.max(sampler.finish().await);
        target.settle(&mut conn).await?;
        draw(&args, &target, &server, n + 1);
        let point = read_point(&mut conn, &target, keys, args.reads, &mut rng).await?;
        println!(
            "after {:.1} GiB: layers visited p50 {} p99 {} max {}; latency p50 {} µs p99 {} µs; layers {}",
            point.payload as f64 / (1u64 << 30) as f64,
            point.layers_at(0.5),
            point.layers_at(0.99),
            point.layers_at(1.0),
            point.micros.value_at_quantile(0.5),
            point.micros.value_at_quantile(0.99),
            point.layer_files
        );
        points.push(point);
    }
    let update_rate = mib_per_sec(target.payload - update_start, update_time);
    let written = layer_bytes_written(&mut conn).await?;
    let write_amp = written / target.payload as f64;
    let stop_waits = metric(
        &mut conn,
        "pageserver_ingest_l0_wait_seconds_count{reason=\"stop\"}",
    )
    .await
    .unwrap_or(0.0);
    let batches = &target.batches;

    let backpressure_flushes = metric(&mut conn, "pageserver_ingest_backpressure_flushes_total")
        .await
        .unwrap_or(0.0);

    // 3. After GC: as the background left it, then after images of everything at the newest
    // L1 end (`PUT .../compact?force_images=true`) and another GC.
    conn.call(
        Method::PUT,
        &format!("{}/gc", target.path),
        None,
        StatusCode::OK,
    )
    .await?;
    let on_disk = bytes_on_disk(&target.dir(&server))?;
    conn.call(
        Method::PUT,
        &format!("{}/compact?force_images=true", target.path),
        None,
        StatusCode::OK,
    )
    .await?;
    conn.call(
        Method::PUT,
        &format!("{}/gc", target.path),
        None,
        StatusCode::OK,
    )
    .await?;
    // Removed files go once no read holds them: at once, since none runs.
    let on_disk_forced = bytes_on_disk(&target.dir(&server))?;
    let logical = u64::from(keys) * PAGE as u64;
    let peak_rss = server.peak_rss_bytes();
    drop(server);

    // 4. Insert-only.
    let insert_amp = if args.insert_only > 0 {
        let server = Server::start(&args, "insert", &[no_memo]).await?;
        let mut conn = Connection::new(server.endpoint.clone());
        let mut target = Target::create(&mut conn).await?;
        let mut next = 0u32;
        target
            .ingest_until(&mut conn, args.insert_only, args.batch_size, || {
                next += 1;
                next
            })
            .await?;
        target.settle(&mut conn).await?;
        Some(layer_bytes_written(&mut conn).await? / target.payload as f64)
    } else {
        None
    };

    let (first, last) = (&points[0], &points[1]);
    let ratio =
        |q: f64| last.micros.value_at_quantile(q) as f64 / first.micros.value_at_quantile(q) as f64;
    let reads: Vec<JsonValue> = points
        .iter()
        .map(|p| {
            json!({
                "payload_gib": round(p.payload as f64 / (1u64 << 30) as f64, 2),
                "layers_p50": p.layers_at(0.5),
                "layers_p99": p.layers_at(0.99),
                "layers_max": p.layers_at(1.0),
                "latency_us_p50": p.micros.value_at_quantile(0.5),
                "latency_us_p99": p.micros.value_at_quantile(0.99),
                "layer_files": p.layer_files,
            })
        })
        .collect();
    let report = json!({
        "keys": keys,
        "logical_bytes": logical,
        "payload_bytes": target.payload,
        "baseline_mib_per_sec": round(baseline_rate, 1),
        "update_mib_per_sec": round(update_rate, 1),
        "ingest_ratio_to_baseline": round(update_rate / baseline_rate, 3),
        "most_l0_seen": most_l0,
        "stop_waits": stop_waits,
        "batch_ms": {
            "p50": round(batches.value_at_quantile(0.5) as f64 / 1000.0, 1),
            "p99": round(batches.value_at_quantile(0.99) as f64 / 1000.0, 1),
            "p99_9": round(batches.value_at_quantile(0.999) as f64 / 1000.0, 1),
            "max": round(batches.max() as f64 / 1000.0, 1),
        },
        "reads": reads,
        "latency_ratio_p50": round(ratio(0.5), 2),
        "latency_ratio_p99": round(ratio(0.99), 2),
        "write_amplification": round(write_amp, 2),
        "insert_only_write_amplification": insert_amp.map(|a| round(a, 2)),
        "bytes_on_disk_after_gc": on_disk,
        "disk_to_logical_plus_horizon": round(on_disk as f64 / (logical + (64 << 20)) as f64, 2),
        "bytes_on_disk_after_forced_images_and_gc": on_disk_forced,
        "forced_disk_to_logical_plus_horizon":
            round(on_disk_forced as f64 / (logical + (64 << 20)) as f64, 2),
        "backpressure_flushes": backpressure_flushes,
        "peak_rss_bytes": peak_rss,
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(true)
}
