//! `pagectl import` and `pagectl basebackup`: a PostgreSQL data directory into a timeline and
//! back out, from the shell, over the page server's HTTP API.
//!
//! `import` archives a directory itself (symbolic links kept as links, so the server refuses a
//! tablespace or a `pg_wal` elsewhere by name) or passes standard input through (a
//! `pg_basebackup -Ft -X fetch -D -` stream), and streams it into `PUT .../import`;
//! `basebackup` streams `GET .../basebackup` into a new directory (mode 0700, as PostgreSQL
//! wants it) and unpacks it as it arrives. Neither holds the archive: pieces of 256 KiB pass
//! through a queue of eight. A progress line on stderr counts the bytes, twice a second.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use clap::Args;
use http_body_util::BodyExt;
use hyper::body::Frame;
use hyper::{Method, Request, StatusCode};

const PIECE: usize = 256 * 1024;
const QUEUED: usize = 8;

#[derive(Args)]
pub struct Target {
    /// The page server.
    #[arg(long, default_value = "http://127.0.0.1:9898")]
    endpoint: String,
    #[arg(long)]
    tenant: String,
    #[arg(long)]
    timeline: String,
    /// `Authorization: Bearer` token, when the server checks them (or PAGECTL_TOKEN).
    #[arg(long)]
    token: Option<String>,
}

#[derive(Args)]
pub struct ImportArgs {
    #[command(flatten)]
    target: Target,
    /// The data directory of a stopped cluster, or `-` for a tar stream on stdin (e.g. from
    /// `pg_basebackup -Ft -X fetch -D -`).
    source: PathBuf,
    /// The snapshot's LSN, instead of the one the archive says.
    #[arg(long)]
    lsn: Option<String>,
}

#[derive(Args)]
pub struct BasebackupArgs {
    #[command(flatten)]
    target: Target,
    /// The directory to create (it must not exist, or be empty).
    #[arg(long)]
    into: PathBuf,
    /// `X/X` or `latest` (the default).
    #[arg(long, default_value = "latest")]
    lsn: String,
}

/// A request body fed from a channel, piece by piece.
struct ChannelBody(tokio::sync::mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.0.poll_recv(cx).map(|p| p.map(|p| Ok(Frame::data(p))))
    }
}

/// Collects what a writer (the tar builder) writes into pieces for the request body.
struct PieceSender {
    tx: tokio::sync::mpsc::Sender<Bytes>,
    buf: Vec<u8>,
    sent: Arc<AtomicU64>,
}

impl Write for PieceSender {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(PIECE - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == PIECE {
            self.flush()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let piece = std::mem::replace(&mut self.buf, Vec::with_capacity(PIECE));
        self.sent.fetch_add(piece.len() as u64, Ordering::Relaxed);
        self.tx
            .blocking_send(Bytes::from(piece))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the server stopped reading"))
    }
}

/// Reads the response body's pieces from a channel, for the tar unpacker.
struct PieceReader {
    rx: std::sync::mpsc::Receiver<io::Result<Bytes>>,
    current: Bytes,
}

impl Read for PieceReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.recv() {
                Ok(piece) => self.current = piece?,
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        let _ = self.current.split_to(n);
        Ok(n)
    }
}

impl Target {
    fn authority(&self) -> anyhow::Result<(String, u16)> {
        let uri: hyper::Uri = self.endpoint.parse().context("--endpoint")?;
        if uri.scheme_str() != Some("http") {
            bail!("--endpoint {}: only http:// is supported", self.endpoint);
        }
        let host = uri.host().context("--endpoint has no host")?;
        Ok((host.to_owned(), uri.port_u16().unwrap_or(80)))
    }

    fn path(&self, route: &str) -> String {
        format!(
            "/v1/tenant/{}/timeline/{}/{route}",
            self.tenant, self.timeline
        )
    }

    async fn send(
        &self,
        method: Method,
        path_and_query: String,
        body: ChannelBody,
    ) -> anyhow::Result<hyper::Response<hyper::body::Incoming>> {
        let (host, port) = self.authority()?;
        let stream = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .with_context(|| format!("connecting to {}", self.endpoint))?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        let mut request = Request::builder()
            .method(method)
            .uri(path_and_query)
            .header(hyper::header::HOST, format!("{host}:{port}"));
        let token = self
            .token
            .clone()
            .or_else(|| std::env::var("PAGECTL_TOKEN").ok());
        if let Some(token) = token {
            request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        Ok(sender.send_request(request.body(body)?).await?)
    }
}

/// A progress line on stderr, rewritten every half second until [`Progress::finish`].
struct Progress {
    done: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<()>,
}

impl Progress {
    fn start(what: &'static str, bytes: Arc<AtomicU64>) -> Progress {
        let done = Arc::new(AtomicU64::new(0));
        let finished = done.clone();
        let started = Instant::now();
        let thread = std::thread::spawn(move || loop {
            let last = finished.load(Ordering::Acquire) != 0;
            let n = bytes.load(Ordering::Relaxed) as f64 / (1 << 20) as f64;
            let secs = started.elapsed().as_secs_f64().max(0.001);
            eprint!(
                "\r{what}: {n:.1} MiB in {secs:.1} s ({:.1} MiB/s)   ",
                n / secs
            );
            if last {
                eprintln!();
                return;
            }
            std::thread::park_timeout(Duration::from_millis(500));
        });
        Progress { done, thread }
    }

    /// Prints the final line and returns once it is out.
    fn finish(self) {
        self.done.store(1, Ordering::Release);
        self.thread.thread().unpark();
        let _ = self.thread.join();
    }
}

async fn failure(response: hyper::Response<hyper::body::Incoming>) -> anyhow::Error {
    let status = response.status();
    let body = response.into_body().collect().await.map(|b| b.to_bytes());
    let text = body
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    anyhow::anyhow!("the server answered {status}: {}", text.trim())
}

pub fn import(args: ImportArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(QUEUED);
    let sent = Arc::new(AtomicU64::new(0));
    let source = args.source.clone();
    let mut pieces = PieceSender {
        tx,
        buf: Vec::with_capacity(PIECE),
        sent: sent.clone(),
    };
    let producer = std::thread::spawn(move || -> io::Result<()> {
        if source == Path::new("-") {
            io::copy(&mut io::stdin().lock(), &mut pieces)?;
        } else {
            let mut builder = tar::Builder::new(&mut pieces);
            builder.follow_symlinks(false);
            builder.mode(tar::HeaderMode::Complete);
            builder.append_dir_all(".", &source)?;
            builder.finish()?;
        }
        pieces.flush()
    });
    let progress = Progress::start("import", sent);
    let mut path = args.target.path("import");
    if let Some(lsn) = &args.lsn {
        path.push_str(&format!("?lsn={lsn}"));
    }
    let outcome = runtime.block_on(async {
        let response = args.target.send(Method::PUT, path, ChannelBody(rx)).await?;
        if response.status() != StatusCode::OK {
            return Err(failure(response).await);
        }
        let body = response.into_body().collect().await?.to_bytes();
        Ok(String::from_utf8_lossy(&body).into_owned())
    });
    progress.finish();
    let produced = producer
        .join()
        .expect("the archiving thread does not panic");
    let report = outcome?;
    produced.with_context(|| format!("archiving {}", args.source.display()))?;
    writeln!(out, "{report}")?;
    Ok(())
}

pub fn basebackup(args: BasebackupArgs, out: &mut impl Write) -> anyhow::Result<()> {
    match std::fs::read_dir(&args.into) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                bail!("{} is not empty", args.into.display());
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => std::fs::create_dir(&args.into)
            .with_context(|| format!("creating {}", args.into.display()))?,
        Err(e) => return Err(e).with_context(|| format!("reading {}", args.into.display())),
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&args.into, std::fs::Permissions::from_mode(0o700))?;

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (tx, rx) = std::sync::mpsc::sync_channel::<io::Result<Bytes>>(QUEUED);
    let into = args.into.clone();
    let unpacker = std::thread::spawn(move || -> io::Result<()> {
        let mut archive = tar::Archive::new(PieceReader {
            rx,
            current: Bytes::new(),
        });
        archive.set_preserve_permissions(true);
        archive.set_preserve_mtime(true);
        archive.unpack(&into)
    });
    let received = Arc::new(AtomicU64::new(0));
    let progress = Progress::start("basebackup", received.clone());
    let path = format!("{}?lsn={}", args.target.path("basebackup"), args.lsn);
    let outcome = runtime.block_on(async {
        let (_, empty) = tokio::sync::mpsc::channel(1);
        let response = args
            .target
            .send(Method::GET, path, ChannelBody(empty))
            .await?;
        if response.status() != StatusCode::OK {
            return Err(failure(response).await);
        }
        let snapshot = response
            .headers()
            .get("x-snapshot-lsn")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("?")
            .to_owned();
        let mut body = response.into_body();
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => {
                    if let Ok(data) = frame.into_data() {
                        received.fetch_add(data.len() as u64, Ordering::Relaxed);
                        if tx.send(Ok(data)).is_err() {
                            break;
                        }
                    }
                }
                Err(e) => {
                    // The unpacker must not take a cut-off archive for a whole one.
                    let _ = tx.send(Err(io::Error::other(e.to_string())));
                    bail!("the transfer failed: {e}");
                }
            }
        }
        Ok(snapshot)
    });
    drop(tx);
    progress.finish();
    let unpacked = unpacker
        .join()
        .expect("the unpacking thread does not panic");
    let snapshot = outcome?;
    unpacked.with_context(|| format!("unpacking into {}", args.into.display()))?;
    writeln!(
        out,
        "the snapshot at {snapshot} is in {}",
        args.into.display()
    )?;
    Ok(())
}
