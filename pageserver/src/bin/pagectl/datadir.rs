//! `pagectl import` and `pagectl basebackup`: a PostgreSQL data directory into a timeline and
//! back out, from the shell, over the page server's HTTP API.
//!
//! `import` archives a directory itself (symbolic links kept as links, so the server refuses a
//! tablespace or a `pg_wal` elsewhere by name) or passes standard input through (a
//! `pg_basebackup -Ft -X fetch -D -` stream), and streams it into `PUT .../import`;
//! `basebackup` streams `GET .../basebackup` into a new directory (mode 0700, as PostgreSQL
//! wants it) and unpacks it as it arrives. Neither holds the archive: pieces of 256 KiB pass
//! through a queue of eight.
//!
//! Progress (`progress.rs`, only on a terminal) counts the archive's bytes. An import of a
//! directory knows its total before it starts, reckoned from the directory's listing; a stream
//! on stdin and a basebackup do not (the server writes the archive as it reads the snapshot),
//! so their line gives bytes, time and rate only.
//!
//! A basebackup that fails leaves no half-restored cluster behind, as `pg_basebackup` does: the
//! directory it created is removed, and one it was given (it must be empty) is emptied again
//! and gets its permission bits back.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context};
use bytes::Bytes;
use clap::Args;
use http_body_util::BodyExt;
use hyper::body::Frame;
use hyper::{Method, Request, StatusCode};
use utils::Lsn;

use crate::progress::Progress;
use crate::server::{Endpoint, ReadLsn, TimelineArgs};

const PIECE: usize = 256 * 1024;
const QUEUED: usize = 8;
/// A tar member's header, and the unit its data is padded to.
const TAR_BLOCK: u64 = 512;
/// The longest path a GNU tar header holds without a long-name member before it.
const TAR_NAME_LEN: usize = 100;

#[derive(Args)]
pub struct ImportArgs {
    /// The page server's HTTP API.
    #[arg(long, default_value = "http://127.0.0.1:9898", value_name = "URL")]
    endpoint: Endpoint,
    #[command(flatten)]
    target: TimelineArgs,
    /// The data directory of a stopped cluster, or `-` for a tar stream on stdin (e.g. from
    /// `pg_basebackup -Ft -X fetch -D -`).
    source: PathBuf,
    /// The snapshot's LSN (X/X), instead of the one the archive says.
    #[arg(long)]
    lsn: Option<Lsn>,
}

#[derive(Args)]
pub struct BasebackupArgs {
    /// The page server's HTTP API.
    #[arg(long, default_value = "http://127.0.0.1:9898", value_name = "URL")]
    endpoint: Endpoint,
    #[command(flatten)]
    target: TimelineArgs,
    /// The directory to create (it must not exist, or be empty). On a failure pagectl removes
    /// it again, or empties it if it was there before.
    #[arg(long)]
    into: PathBuf,
    /// `X/X` or `latest`.
    #[arg(long, default_value = "latest")]
    lsn: ReadLsn,
    /// A time instead of an LSN (RFC 3339 in UTC, `2026-11-26T10:00:00Z`): the state after the
    /// last commit at or before it, found in the WAL streamed in.
    #[arg(long, conflicts_with = "lsn", value_name = "TIME")]
    time: Option<String>,
    /// The pages at the LSN themselves, shut down there, with no WAL for PostgreSQL to replay
    /// (`replay=none`: page ingest in full-image mode, from a stopped primary's snapshot).
    #[arg(long)]
    no_replay: bool,
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

/// One HTTP/1.1 request to the server, on a connection of its own.
async fn send(
    endpoint: &Endpoint,
    target: &TimelineArgs,
    method: Method,
    path_and_query: String,
    body: ChannelBody,
) -> anyhow::Result<hyper::Response<hyper::body::Incoming>> {
    let stream = tokio::net::TcpStream::connect(endpoint.socket())
        .await
        .with_context(|| format!("connecting to {endpoint}"))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let mut request = Request::builder()
        .method(method)
        .uri(path_and_query)
        .header(hyper::header::HOST, endpoint.authority());
    if let Some(token) = target.token() {
        request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    sender
        .send_request(request.body(body)?)
        .await
        .with_context(|| format!("talking to {endpoint}"))
}

fn route(target: &TimelineArgs, route: &str) -> String {
    format!(
        "/v1/tenant/{}/timeline/{}/{route}",
        target.tenant, target.timeline
    )
}

async fn failure(response: hyper::Response<hyper::body::Incoming>) -> anyhow::Error {
    let status = response.status();
    let body = response.into_body().collect().await.map(|b| b.to_bytes());
    let text = body
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    anyhow::anyhow!("the server answered {status}: {}", text.trim())
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// The size of the archive `tar::Builder::append_dir_all` makes of `dir`, reckoned from its
/// listing: a header per member (and a long-name member before one whose path is too long for
/// it), each file's bytes padded to whole blocks, and two zero blocks at the end. The directory
/// may change meanwhile (it should not: the cluster is stopped), so this is what the progress
/// line counts toward, never a check.
fn archive_size(dir: &Path) -> io::Result<u64> {
    let padded = |n: u64| n.div_ceil(TAR_BLOCK) * TAR_BLOCK;
    let mut total = 2 * TAR_BLOCK;
    let mut pending = vec![(dir.to_path_buf(), 0usize)];
    while let Some((path, name_len)) = pending.pop() {
        let meta = std::fs::symlink_metadata(&path)?;
        total += TAR_BLOCK;
        if name_len >= TAR_NAME_LEN {
            // "./" and a terminating zero are stored with the long name.
            total += TAR_BLOCK + padded(name_len as u64 + 3);
        }
        if meta.is_file() {
            total += padded(meta.len());
        } else if meta.is_dir() {
            for entry in std::fs::read_dir(&path)? {
                let entry = entry?;
                let len = entry.file_name().len();
                let name_len = if name_len == 0 {
                    len
                } else {
                    name_len + 1 + len
                };
                pending.push((entry.path(), name_len));
            }
        }
    }
    Ok(total)
}

pub fn import(args: ImportArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let from_stdin = args.source == Path::new("-");
    let total = if from_stdin {
        None
    } else {
        if !args.source.is_dir() {
            bail!(
                "{}: {}",
                args.source.display(),
                if args.source.exists() {
                    "not a directory (give a data directory, or - for a tar stream on stdin)"
                } else {
                    "no such directory"
                }
            );
        }
        Some(
            archive_size(&args.source)
                .with_context(|| format!("reading {}", args.source.display()))?,
        )
    };
    let runtime = runtime()?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(QUEUED);
    let sent = Arc::new(AtomicU64::new(0));
    let source = args.source.clone();
    let mut pieces = PieceSender {
        tx,
        buf: Vec::with_capacity(PIECE),
        sent: sent.clone(),
    };
    let producer = std::thread::spawn(move || -> io::Result<()> {
        if from_stdin {
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
    let progress = Progress::start("import", sent, total);
    let mut path = route(&args.target, "import");
    if let Some(lsn) = &args.lsn {
        path.push_str(&format!("?lsn={lsn}"));
    }
    let outcome = runtime.block_on(async {
        // Asked first, with no body: a server that refuses the import at once (no such
        // timeline) may close the connection while the archive is still being sent, and a
        // client that is still writing then sees a broken pipe rather than the answer.
        let (_, empty) = tokio::sync::mpsc::channel(1);
        let timeline = format!(
            "/v1/tenant/{}/timeline/{}",
            args.target.tenant, args.target.timeline
        );
        let found = send(
            &args.endpoint,
            &args.target,
            Method::GET,
            timeline,
            ChannelBody(empty),
        )
        .await?;
        if found.status() != StatusCode::OK {
            return Err(failure(found).await);
        }
        let response = send(
            &args.endpoint,
            &args.target,
            Method::PUT,
            path,
            ChannelBody(rx),
        )
        .await?;
        if response.status() != StatusCode::OK {
            return Err(failure(response).await);
        }
        let body = response.into_body().collect().await?.to_bytes();
        Ok(String::from_utf8_lossy(&body).into_owned())
    });
    progress.finish();
    // Dropping the runtime drops the request body's receiver with the connection's task, so
    // an archiver still sending to a server that answered early stops instead of waiting.
    drop(runtime);
    let produced = producer
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the archiving thread panicked")));
    match (produced, outcome) {
        // The server's answer to an archive cut short says less than why it was cut short.
        (Err(e), Err(answer)) if e.kind() != io::ErrorKind::BrokenPipe => Err(anyhow::anyhow!(
            "archiving {}: {e} ({answer:#})",
            args.source.display()
        )),
        (_, Err(answer)) => Err(answer),
        (Err(e), Ok(_)) => Err(e).with_context(|| format!("archiving {}", args.source.display())),
        (Ok(()), Ok(report)) => {
            writeln!(out, "{report}")?;
            Ok(())
        }
    }
}

/// The directory a basebackup unpacks into, and how to undo it (see the module documentation).
struct Destination {
    path: PathBuf,
    /// The permission bits of a directory that was there before; `None` if pagectl made it.
    was: Option<std::fs::Permissions>,
}

impl Destination {
    fn prepare(path: &Path) -> anyhow::Result<Destination> {
        use std::os::unix::fs::PermissionsExt;
        let was = match std::fs::read_dir(path) {
            Ok(mut entries) => {
                if entries.next().is_some() {
                    bail!("{} is not empty", path.display());
                }
                Some(std::fs::metadata(path)?.permissions())
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::create_dir(path)
                    .with_context(|| format!("creating {}", path.display()))?;
                None
            }
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let destination = Destination {
            path: path.to_owned(),
            was,
        };
        if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700)) {
            let error =
                anyhow::Error::new(e).context(format!("making {} mode 0700", path.display()));
            return Err(destination.undo_after(error));
        }
        Ok(destination)
    }

    /// Removes what the failed basebackup left: the directory itself if pagectl made it, else
    /// everything in it, with its permission bits put back.
    fn undo(&self) -> io::Result<()> {
        let Some(permissions) = &self.was else {
            return std::fs::remove_dir_all(&self.path);
        };
        for entry in std::fs::read_dir(&self.path)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                std::fs::remove_dir_all(entry.path())?;
            } else {
                std::fs::remove_file(entry.path())?;
            }
        }
        std::fs::set_permissions(&self.path, permissions.clone())
    }

    /// `error`, with what was undone after it (or that undoing failed too).
    fn undo_after(&self, error: anyhow::Error) -> anyhow::Error {
        let undone = match (self.undo(), &self.was) {
            (Ok(()), None) => format!("{} removed", self.path.display()),
            (Ok(()), Some(_)) => format!("{} emptied again", self.path.display()),
            (Err(e), _) => format!("cleaning up {} failed too: {e}", self.path.display()),
        };
        anyhow::anyhow!("{error:#} ({undone})")
    }
}

pub fn basebackup(args: BasebackupArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let destination = Destination::prepare(&args.into)?;
    match fetch_and_unpack(&args) {
        Ok(snapshot) => {
            writeln!(
                out,
                "the snapshot at {snapshot} is in {}",
                args.into.display()
            )?;
            Ok(())
        }
        Err(error) => Err(destination.undo_after(error)),
    }
}

/// Streams the snapshot into `args.into`; returns the snapshot's LSN, and what is replayed
/// after it.
fn fetch_and_unpack(args: &BasebackupArgs) -> anyhow::Result<String> {
    let runtime = runtime()?;
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
    let progress = Progress::start("basebackup", received.clone(), None);
    let point = match &args.time {
        Some(time) => format!("timestamp={}", time.replace('+', "%2B")),
        None => format!("lsn={}", args.lsn),
    };
    let replay = if args.no_replay { "&replay=none" } else { "" };
    let path = format!("{}?{point}{replay}", route(&args.target, "basebackup"));
    let outcome = runtime.block_on(async {
        let (_, empty) = tokio::sync::mpsc::channel(1);
        let response = send(
            &args.endpoint,
            &args.target,
            Method::GET,
            path,
            ChannelBody(empty),
        )
        .await?;
        if response.status() != StatusCode::OK {
            return Err(failure(response).await);
        }
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let mut snapshot = header("x-snapshot-lsn").unwrap_or_else(|| "?".to_owned());
        if let Some(target) = header("x-replay-to") {
            snapshot.push_str(&format!(
                ", with the WAL up to {target} (replayed when PostgreSQL starts)"
            ));
        }
        if let Some(at) = header("x-materialized-lsn") {
            snapshot = format!("{at} (the pages there, nothing to replay)");
        }
        if let Some(at) = header("x-commit-time") {
            snapshot.push_str(&format!(", the last commit at or before the time at {at},"));
        }
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
        .unwrap_or_else(|_| Err(io::Error::other("the unpacking thread panicked")));
    let snapshot = outcome?;
    unpacked.with_context(|| format!("unpacking into {}", args.into.display()))?;
    Ok(snapshot)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reckoned size is the size of the archive the import sends, for short and long
    /// names, empty and odd-sized files, nested directories and a symbolic link.
    #[test]
    fn the_archive_size_is_reckoned_from_the_listing() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("base/5")).unwrap();
        std::fs::write(root.join("PG_VERSION"), b"15\n").unwrap();
        std::fs::write(root.join("base/5/16384"), vec![1u8; 3 * 8192]).unwrap();
        std::fs::write(root.join("base/5/empty"), b"").unwrap();
        std::fs::write(root.join("odd"), vec![2u8; 513]).unwrap();
        let long = "x".repeat(150);
        std::fs::write(root.join("base").join(&long), b"long").unwrap();
        std::os::unix::fs::symlink("/elsewhere/pg_wal", root.join("pg_wal")).unwrap();

        let mut archive = Vec::new();
        let mut builder = tar::Builder::new(&mut archive);
        builder.follow_symlinks(false);
        builder.mode(tar::HeaderMode::Complete);
        builder.append_dir_all(".", root).unwrap();
        builder.finish().unwrap();
        drop(builder);
        assert_eq!(archive_size(root).unwrap(), archive.len() as u64);
    }
}
