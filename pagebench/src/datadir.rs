//! `pagebench datadir`: import and basebackup of a real PostgreSQL data directory, against
//! `tar` copying the same directory on the same disk in the same run, and what an incremental
//! snapshot stores against the blocks that changed.
//!
//! ```text
//! pagebench datadir --pageserver BIN --workdir DIR --pgdata A [--pgdata-after B]
//! ```
//!
//! `A` (and `B`, the same cluster later) are cleanly stopped data directories, made beforehand
//! (docs/benchmarks.md has the commands). The tool starts the server itself in `DIR/server`.
//!
//! `A` is read once first, so every phase reads it from a warm cache. Then `--rounds` times:
//!
//! 1. **Baseline**: `tar -C A -c . | tar -C DIR/copy -x`, then `sync`: a durable copy of the
//!    directory on the same disk. Its MiB/s (bytes of A's archive over the time) is the
//!    yardstick of both directions in that round.
//! 2. **Import**: `tar -C A -c .` streamed into `PUT .../import` of a fresh timeline (durable
//!    when it answers).
//! 3. **Basebackup**: `GET .../basebackup` streamed into `tar -C DIR/restored -x`, then `sync`,
//!    and compared with `A` by `diff -r`. Then the round waits for the import's layer to reach
//!    remote storage (the default local directory store, on the same disk), so no upload runs
//!    under the next round.
//!
//! The medians of the per-round ratios are the result. **Memory**, with a 16 MiB page cache:
//! the server's peak RSS (`VmHWM`) in round 0 against its RSS before the first import (a cold
//! server: the page cache fills for the first time); then the peak is started over
//! (`/proc/PID/clear_refs`) and the peak of the later rounds is measured against the RSS after
//! round 0: what one more import and basebackup add to a server that has run one.
//! Then:
//!
//! 4. **Branches**: 20 branches of the last imported timeline, each timed around its HTTP call,
//!    against creating 20 empty timelines the same way.
//! 5. **Incremental** (with `B`): `B` imported after `A`; the bytes the import stored against
//!    the bytes of every 8 KiB block that differs between the two directories (a file only in
//!    `B` counts whole).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use http_body_util::BodyExt;
use hyper::body::Frame;

use super::scale::Server;
use super::*;

/// Branches created (and empty timelines, the baseline) for the branch creation figure.
const BRANCHES: usize = 20;

#[derive(Args)]
pub struct DatadirArgs {
    /// The pageserver binary to start (a release build).
    #[arg(long)]
    pageserver: PathBuf,
    /// Where the server's work directory, the copy and the restore go.
    #[arg(long)]
    workdir: PathBuf,
    /// A cleanly stopped data directory.
    #[arg(long)]
    pgdata: PathBuf,
    /// The same cluster later, cleanly stopped: imported after `--pgdata`.
    #[arg(long)]
    pgdata_after: Option<PathBuf>,
    /// Port the server listens on.
    #[arg(long, default_value_t = 19871)]
    port: u16,
    /// Rounds of (tar copy, import into a fresh timeline, basebackup); medians are reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

/// A request body fed from a channel, chunk by chunk.
struct ChannelBody(tokio::sync::mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(Frame::data(c))))
    }
}

async fn connect(
    endpoint: &Endpoint,
) -> anyhow::Result<hyper::client::conn::http1::SendRequest<ChannelBody>> {
    let stream = tokio::net::TcpStream::connect((endpoint.host.as_str(), endpoint.port)).await?;
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    Ok(sender)
}

/// `tar -C dir -c .` streamed into an import; the report and the archive's size.
async fn import(endpoint: &Endpoint, path: &str, dir: &Path) -> anyhow::Result<(JsonValue, u64)> {
    let mut tar = Command::new("tar")
        .arg("-C")
        .arg(dir)
        .args(["-c", "."])
        .stdout(Stdio::piped())
        .spawn()
        .context("starting tar")?;
    let mut out = tar.stdout.take().expect("piped");
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(8);
    let reader = std::thread::spawn(move || -> std::io::Result<u64> {
        let mut total = 0u64;
        loop {
            let mut buf = vec![0u8; 256 * 1024];
            let n = out.read(&mut buf)?;
            if n == 0 {
                return Ok(total);
            }
            total += n as u64;
            buf.truncate(n);
            if tx.blocking_send(Bytes::from(buf)).is_err() {
                return Ok(total);
            }
        }
    });
    let mut sender = connect(endpoint).await?;
    let request = Request::builder()
        .method(Method::PUT)
        .uri(format!("{path}/import"))
        .header(HOST, endpoint.authority.as_str())
        .body(ChannelBody(rx))?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    let bytes = reader.join().expect("the reader thread does not panic")?;
    tar.wait()?;
    if status != StatusCode::OK {
        bail!("import: {}", describe_failure(status, &body));
    }
    Ok((serde_json::from_slice(&body)?, bytes))
}

/// `GET .../basebackup` streamed into `tar -C dir -x`; bytes of the archive.
async fn basebackup(endpoint: &Endpoint, path: &str, dir: &Path) -> anyhow::Result<u64> {
    std::fs::create_dir_all(dir)?;
    let mut tar = Command::new("tar")
        .arg("-C")
        .arg(dir)
        .arg("-x")
        .stdin(Stdio::piped())
        .spawn()
        .context("starting tar")?;
    let mut input = tar.stdin.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::sync_channel::<Bytes>(8);
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        for chunk in rx {
            input.write_all(&chunk)?;
        }
        Ok(())
    });
    let (_, empty) = tokio::sync::mpsc::channel(1);
    let mut sender = connect(endpoint).await?;
    let request = Request::builder()
        .method(Method::GET)
        .uri(format!("{path}/basebackup"))
        .header(HOST, endpoint.authority.as_str())
        .body(ChannelBody(empty))?;
    let response = sender.send_request(request).await?;
    if response.status() != StatusCode::OK {
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        bail!("basebackup: {}", describe_failure(status, &body));
    }
    let mut body = response.into_body();
    let mut total = 0u64;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            total += data.len() as u64;
            tx.send(data)?;
        }
    }
    drop(tx);
    writer.join().expect("the writer thread does not panic")?;
    if !tar.wait()?.success() {
        bail!("tar -x failed");
    }
    Ok(total)
}

fn run_ok(command: &mut Command) -> anyhow::Result<()> {
    let status = command.status()?;
    if !status.success() {
        bail!("{command:?} failed: {status}");
    }
    Ok(())
}

/// Every file under `dir` by relative path, as 8 KiB blocks' hashes.
fn block_hashes(dir: &Path) -> anyhow::Result<HashMap<PathBuf, Vec<u64>>> {
    let mut out = HashMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                let bytes = std::fs::read(entry.path())?;
                let hashes = bytes
                    .chunks(8192)
                    .map(|chunk| {
                        // FNV-1a: enough to tell changed blocks apart for a byte count.
                        chunk.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
                        }) ^ chunk.len() as u64
                    })
                    .collect();
                out.insert(entry.path().strip_prefix(dir)?.to_path_buf(), hashes);
            }
        }
    }
    Ok(out)
}

/// Bytes of the 8 KiB blocks of `after` that differ from `before` (new files whole).
fn changed_bytes(before: &Path, after: &Path) -> anyhow::Result<u64> {
    let old = block_hashes(before)?;
    let new = block_hashes(after)?;
    let mut changed = 0u64;
    for (path, blocks) in &new {
        let size = std::fs::metadata(after.join(path))?.len();
        let old_blocks = old.get(path);
        for (i, hash) in blocks.iter().enumerate() {
            if old_blocks.and_then(|b| b.get(i)) != Some(hash) {
                changed += (size - i as u64 * 8192).min(8192);
            }
        }
    }
    Ok(changed)
}

/// A durable tar copy of `from` into `to`; how long it took.
fn tar_copy(from: &Path, to: &Path) -> anyhow::Result<Duration> {
    let _ = std::fs::remove_dir_all(to);
    std::fs::create_dir_all(to)?;
    let started = Instant::now();
    let pipeline = format!(
        "tar -C '{}' -c . | tar -C '{}' -x && sync",
        from.display(),
        to.display()
    );
    run_ok(Command::new("sh").args(["-c", &pipeline]))?;
    let took = started.elapsed();
    std::fs::remove_dir_all(to)?;
    Ok(took)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

pub async fn run(args: DatadirArgs) -> anyhow::Result<bool> {
    let copy = args.workdir.join("copy");
    let restored = args.workdir.join("restored");
    // The source read once first, so that every phase reads it from the same (warm) cache.
    run_ok(Command::new("sh").args([
        "-c",
        &format!("tar -C '{}' -c . > /dev/null", args.pgdata.display()),
    ]))?;

    let server = Server::launch(
        &args.pageserver,
        &args.workdir,
        args.port,
        "server",
        &["page_cache_size=16MiB"],
    )
    .await?;
    let rss_before = server.peak_rss_bytes().unwrap_or(0);
    // After the first round: the resident memory the later rounds grow from, if the peak
    // could be started over there.
    let mut warm_rss = None;
    let mut conn = Connection::new(server.endpoint.clone());
    let tenant = conn.create_tenant().await?;
    let mib = |b: u64| b as f64 / MIB;
    let mut identical = true;
    let (mut import_ratios, mut basebackup_ratios) = (Vec::new(), Vec::new());
    let mut path = String::new();
    for round in 0..args.rounds {
        // Each round: the baseline, an import into a fresh timeline, its basebackup.
        let copy_time = tar_copy(&args.pgdata, &copy)?;
        let (timeline, _) = conn.create_timeline(tenant).await?;
        path = format!("/v1/tenant/{tenant}/timeline/{timeline}");
        let started = Instant::now();
        let (report, archive_bytes) = import(&server.endpoint, &path, &args.pgdata).await?;
        let import_time = started.elapsed();
        // The import's layers are uploaded (to the local directory store, a copy on the same
        // disk) before the basebackup starts: that background copy is the import's cost,
        // reported apart, not the basebackup's.
        let started = Instant::now();
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let info = conn.call(Method::GET, &path, None, StatusCode::OK).await?;
            if info["remote_consistent_lsn"] == info["disk_consistent_lsn"] {
                break;
            }
            if Instant::now() > deadline {
                bail!("the upload did not finish within 300 s: {info}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let upload_time = started.elapsed();
        // What the upload left dirty in the kernel is written out before the basebackup, whose
        // own `sync` would otherwise wait for it.
        run_ok(&mut Command::new("sync"))?;
        let _ = std::fs::remove_dir_all(&restored);
        let started = Instant::now();
        let restored_bytes = basebackup(&server.endpoint, &path, &restored).await?;
        run_ok(&mut Command::new("sync"))?;
        let basebackup_time = started.elapsed();
        identical &= Command::new("diff")
            .arg("-r")
            .arg(&args.pgdata)
            .arg(&restored)
            .stdout(Stdio::null())
            .status()?
            .success();
        let _ = std::fs::remove_dir_all(&restored);
        let copy_rate = mib_per_sec(archive_bytes, copy_time);
        let import_rate = mib_per_sec(archive_bytes, import_time);
        let basebackup_rate = mib_per_sec(restored_bytes, basebackup_time);
        if round == 0 && args.rounds > 1 {
            let (peak, rss) = (server.peak_rss_bytes(), server.rss_bytes());
            if let (Some(peak), Some(rss), true) = (peak, rss, server.reset_peak_rss()) {
                warm_rss = Some((peak, rss));
            }
        }
        import_ratios.push(import_rate / copy_rate);
        basebackup_ratios.push(basebackup_rate / copy_rate);
        println!(
            "round {round}: archive {:.1} MiB ({} blocks); tar copy {copy_rate:.1} MiB/s, import \
             {import_rate:.1} MiB/s ({:.0}%), its upload after the answer {:.1} s, basebackup \
             {basebackup_rate:.1} MiB/s ({:.0}%)",
            mib(archive_bytes),
            report["blocks_new"],
            100.0 * import_rate / copy_rate,
            upload_time.as_secs_f64(),
            100.0 * basebackup_rate / copy_rate,
        );
    }
    let peak_after = server.peak_rss_bytes().unwrap_or(0);
    println!(
        "median of {} rounds: import {:.0}% of tar, basebackup {:.0}% of tar (restores identical: {identical})",
        args.rounds,
        100.0 * median(import_ratios),
        100.0 * median(basebackup_ratios),
    );
    let cold_peak = warm_rss.map_or(peak_after, |(peak, _)| peak);
    println!(
        "peak RSS growth of round 0: {:.1} MiB (RSS {:.1} MiB before the first import; page cache \
         16 MiB, filled for the first time)",
        mib(cold_peak.saturating_sub(rss_before)),
        mib(rss_before)
    );
    if let Some((_, warm)) = warm_rss {
        println!(
            "peak RSS growth of rounds 1 to {}: {:.1} MiB (over the RSS after round 0, {:.1} MiB)",
            args.rounds - 1,
            mib(peak_after.saturating_sub(warm)),
            mib(warm),
        );
    }

    // Branches of the last round's timeline (the whole directory behind it), against creating
    // empty timelines: both are one HTTP call that writes a new timeline directory.
    let timeline_id: TimelineId = path.rsplit('/').next().unwrap_or_default().parse()?;
    let (mut branch_ms, mut empty_ms) = (Vec::new(), Vec::new());
    for _ in 0..BRANCHES {
        let started = Instant::now();
        conn.call(
            Method::POST,
            &format!("/v1/tenant/{tenant}/timeline"),
            Some(json!({ "ancestor_timeline_id": timeline_id.to_string() })),
            StatusCode::CREATED,
        )
        .await?;
        branch_ms.push(started.elapsed().as_secs_f64() * 1000.0);
        let started = Instant::now();
        conn.create_timeline(tenant).await?;
        empty_ms.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    println!(
        "branch creation: median {:.2} ms, max {:.2} ms over {BRANCHES} (an empty timeline: median {:.2} ms)",
        median(branch_ms.clone()),
        branch_ms.iter().copied().fold(0.0, f64::max),
        median(empty_ms),
    );

    // The incremental snapshot, onto the last round's timeline.
    if let Some(after) = &args.pgdata_after {
        let changed = changed_bytes(&args.pgdata, after)?;
        let (report, _) = import(&server.endpoint, &path, after).await?;
        let stored = report["bytes_stored"].as_u64().unwrap_or(0);
        println!(
            "incremental: stored {:.1} MiB for {:.1} MiB of changed blocks: {:.2}x \
             (blocks changed {}, new {}, unchanged {})",
            mib(stored),
            mib(changed),
            stored as f64 / changed.max(1) as f64,
            report["blocks_changed"],
            report["blocks_new"],
            report["blocks_unchanged"]
        );
    }
    Ok(identical)
}

fn mib_per_sec(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / MIB / elapsed.as_secs_f64()
}
