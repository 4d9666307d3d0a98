//! `pagectl`: looks inside the page server's files when something is wrong with them.
//!
//! ```text
//! pagectl layer summary <file>                         every field of a layer's summary
//! pagectl layer index   <file> [--key K] [--limit N]   index entries in (key, lsn) order
//! pagectl layer values  <file> [--key K] [--lsn L] [--limit N] [--raw]
//!                                                      each version with its value decoded
//! pagectl layer get     <file> --key K --lsn L         what a read of K at L takes from the layer
//! pagectl layer verify  <file>                         read and check everything, and against
//!                                                      the manifest beside it if there is one
//! pagectl metadata <timeline dir | metadata file>      the manifest: disk_consistent_lsn, layers
//! pagectl draw <timeline dir | metadata file> [-o F] [--contents]
//!                                                      the manifest's layers as an SVG picture
//!                                                      (with the layers holding WAL records
//!                                                      hatched, and the snapshots), and the
//!                                                      WAL stored
//! pagectl import --tenant T --timeline TL <PGDATA | -> [--lsn L] [--endpoint URL]
//!                                                      a data directory (or a tar stream on
//!                                                      stdin) into a timeline, over HTTP
//! pagectl basebackup --tenant T --timeline TL --into DIR [--lsn L] [--endpoint URL]
//!                                                      a timeline's snapshot into a directory
//! pagectl getpage --tenant T --timeline TL --key K... [--lsn L...] [--grpc-endpoint URL]
//!                                                      pages through the page service (gRPC)
//! pagectl wal <segment file>...                        WAL records, checked, one line each
//! ```
//!
//! The `layer` commands take delta and image layer files alike (`layer.rs`); `draw` is in
//! `draw.rs`. The commands that talk to a running server share `server.rs` (endpoints, ids,
//! tokens, LSNs): `import` and `basebackup` are in `datadir.rs`, with their progress line in
//! `progress.rs`, and `getpage` in `getpage.rs`; `wal` in `wal.rs`. Output goes to stdout, one line per item, so
//! it can be grepped and diffed; docs/pagectl.md shows each command's output. A problem (a
//! missing file, a file that is not a layer, a corrupt one, a server's refusal) is one line on
//! stderr naming the file or the cause, and exit code 1; a usage error (clap's message, or a
//! batch too large for the protocol) is exit code 2. Everything read is checked exactly as the
//! page server checks it, through the same code, so pagectl never trusts what the page server
//! would refuse.

use std::fmt::Write as _;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, CommandFactory, Parser, Subcommand};
use pageserver::page_cache::{PageCache, PageCacheConfig, PageCacheConfigError};
use pageserver::tenant::storage_layer::{LayerFileError, LayerFileKind};
use pageserver::tenant::timeline::layer_set::manifest::{
    Manifest, MetadataError, StoredMetadata, METADATA_FILE,
};
use pageserver::tenant::timeline::TimelineError;
use pageserver::PAGE_SZ;
use pageserver_api::{Key, Value, DEFAULT_MAX_VALUE_SIZE};
use utils::Lsn;

mod datadir;
mod draw;
mod getpage;
mod layer;
mod progress;
mod server;
mod wal;

/// Pages in the private page cache (1 MiB): pagectl reads most blocks once, and a read that
/// finds every page pinned gets a private copy instead.
const CACHE_PAGES: u64 = 128;
/// Patches listed per delta before the rest are only counted.
const MAX_PATCHES_SHOWN: usize = 16;

/// Inspect the page server's files (delta and image layers, timeline metadata), move a
/// PostgreSQL data directory in and out of a timeline, and read pages over gRPC.
///
/// Exit codes: 0 done, 1 a problem (named on stderr), 2 a usage error.
#[derive(Parser)]
#[command(name = "pagectl", version)]
struct Cli {
    /// The page server's configured maximum value size, in bytes.
    ///
    /// A stored value longer than this is reported as corruption, as the page server would.
    #[arg(long, global = true, default_value_t = DEFAULT_MAX_VALUE_SIZE, value_name = "BYTES")]
    max_value_size: usize,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Layer files, delta or image (the kind comes from the file's name, else its magic).
    #[command(subcommand)]
    Layer(LayerCommand),
    /// Print a timeline's metadata.
    Metadata {
        /// A timeline directory, or the `metadata` file in one.
        path: PathBuf,
    },
    /// Draw the layers a timeline's manifest lists as an SVG picture.
    ///
    /// Keys across, LSNs up, both to scale, one rectangle per layer, coloured by level (L0, L1,
    /// image); far-apart keys are cut short as marked breaks, and the LSN axis is logarithmic
    /// when the thinnest delta layer would vanish (docs/pagectl.md). Only the manifest is read:
    /// the ranges come from the layer names.
    Draw {
        /// A timeline directory, or the `metadata` file in one.
        path: PathBuf,
        /// Write the SVG to this file instead of stdout.
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Also read every delta layer on the local disk, and hatch those that hold
        /// PostgreSQL WAL records (their share is in the tooltip); and draw the timeline's
        /// snapshots, from the newest snapshot list in the layers, as lines at their LSNs.
        #[arg(long)]
        contents: bool,
    },
    /// Import a PostgreSQL data directory into a timeline, over the server's HTTP API.
    ///
    /// A cleanly stopped cluster's directory (archived by pagectl itself), or `-` for a tar
    /// stream on stdin such as `pg_basebackup -Ft -X fetch -D -`. Prints the server's report.
    Import(datadir::ImportArgs),
    /// Write a timeline's snapshot at an LSN into a new directory a PostgreSQL starts from.
    ///
    /// On a failure the directory is removed again (or emptied, if it was there before).
    Basebackup(datadir::BasebackupArgs),
    /// Read pages through the page service (gRPC), as compute does: every key at every LSN,
    /// in one GetPages batch.
    ///
    /// One line per page (found, with its length, CRC-32C and the LSN it was read at, or not
    /// found), then the batch's read cost.
    Getpage(getpage::GetPageArgs),
    /// Print the records of WAL segment files, checked as the page server checks them.
    ///
    /// One line per record, in the fields pg_waldump prints (resource manager, lengths without
    /// and with full-page images, xid, LSN, the record before it), with commit and abort
    /// times; then where the WAL ends, and why: the end of the files, or the first record or
    /// page that does not check.
    Wal(wal::WalArgs),
}

#[derive(Subcommand)]
enum LayerCommand {
    /// Print every field of the summary block.
    Summary {
        /// The layer file.
        file: PathBuf,
    },
    /// List index entries in (key, lsn) order, without reading values.
    Index {
        /// The layer file.
        file: PathBuf,
        #[command(flatten)]
        filter: Filter,
    },
    /// List versions with their values decoded.
    Values {
        /// The layer file.
        file: PathBuf,
        #[command(flatten)]
        filter: Filter,
        /// Only versions at or below this LSN (X/X or decimal).
        #[arg(long)]
        lsn: Option<Lsn>,
        /// Also hex-dump each value's stored bytes (a delta layer's serialized value, an image
        /// layer's page).
        #[arg(long)]
        raw: bool,
        /// Bytes of each value the hex dump shows.
        #[arg(long, default_value_t = 256, value_name = "BYTES", requires = "raw")]
        raw_bytes: usize,
    },
    /// Show what a read of a key at an LSN takes from this layer.
    ///
    /// The versions from the newest at or below the LSN down to an image or will_init delta,
    /// newest first, as the page server's read path returns them; from an image layer, the
    /// key's image if the LSN is at or above the layer's.
    Get {
        /// The layer file.
        file: PathBuf,
        /// The page key (36 hex digits).
        #[arg(long)]
        key: Key,
        /// The LSN of the read (X/X or decimal).
        #[arg(long)]
        lsn: Lsn,
    },
    /// Read and check everything; exit 1 at the first problem.
    ///
    /// Reads every index node and every value and checks everything the format promises (see
    /// `DeltaLayer::verify` and `ImageLayer::verify`). In a timeline directory, first checks the
    /// file as the page server does at startup (listed in the manifest, of the listed size,
    /// opened as the kind its listed level says, its summary naming the manifest's tenant and
    /// timeline and the ranges its name says, its versions within disk_consistent_lsn), then
    /// the file's CRC-32C against the manifest's.
    Verify {
        /// The layer file.
        file: PathBuf,
    },
}

#[derive(Args)]
struct Filter {
    /// Only this key's versions (36 hex digits).
    #[arg(long)]
    key: Option<Key>,
    /// Print at most this many entries.
    #[arg(long, value_name = "N")]
    limit: Option<usize>,
}

impl Filter {
    /// Whether an entry of `key` is past what the filter selects (the index is in key order).
    fn past(&self, key: Key) -> bool {
        self.key.is_some_and(|k| key > k)
    }

    fn start(&self) -> Key {
        self.key.unwrap_or(Key::MIN)
    }

    fn limit(&self) -> usize {
        self.limit.unwrap_or(usize::MAX)
    }
}

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error(transparent)]
    Layer(#[from] LayerFileError),
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    #[error(transparent)]
    Timeline(#[from] TimelineError),
    #[error("cannot create the page cache: {0}")]
    Cache(#[from] PageCacheConfigError),
    #[error("{}: {message}", path.display())]
    Path { path: PathBuf, message: String },
    /// An import or a basebackup failed (the server's answer, the transfer, the directory).
    #[error("{0:#}")]
    Datadir(anyhow::Error),
    /// A read through the page service failed (connecting, the server's refusal).
    #[error("{0:#}")]
    Server(anyhow::Error),
    /// Writing to stdout failed; a closed pipe (`pagectl ... | head`) is not reported.
    #[error("writing the output: {0}")]
    Output(#[from] io::Error),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Getpage(args) = &cli.command {
        if let Err(message) = args.pages() {
            // Exits 2, as clap does for what it finds wrong itself.
            Cli::command()
                .error(clap::error::ErrorKind::TooManyValues, message)
                .exit();
        }
    }
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    let result = run(cli, &mut out).and_then(|()| out.flush().map_err(Error::from));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Error::Output(e)) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            // Flush what was printed before the problem, so it comes before the message.
            let _ = out.flush();
            let _ = writeln!(io::stderr(), "pagectl: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli, out: &mut impl Write) -> Result<(), Error> {
    match cli.command {
        Command::Metadata { path } => metadata(&path, out),
        Command::Draw {
            path,
            output,
            contents,
        } => draw::draw(&path, output.as_deref(), contents, out),
        Command::Layer(command) => layer::run(command, cli.max_value_size, out),
        Command::Import(args) => datadir::import(args, out).map_err(Error::Datadir),
        Command::Basebackup(args) => datadir::basebackup(args, out).map_err(Error::Datadir),
        Command::Getpage(args) => getpage::getpage(args, out).map_err(Error::Server),
        Command::Wal(args) => wal::wal(args, out),
    }
}

/// A directory opens like a file on Linux and would be reported as a short layer.
fn check_not_dir(file: &Path) -> Result<(), Error> {
    if file.is_dir() {
        return Err(Error::Path {
            path: file.to_owned(),
            message: "is a directory, not a layer file".to_owned(),
        });
    }
    Ok(())
}

fn private_cache() -> Result<Arc<PageCache>, Error> {
    Ok(Arc::new(PageCache::new(PageCacheConfig {
        capacity_bytes: CACHE_PAGES * PAGE_SZ as u64,
        ..PageCacheConfig::default()
    })?))
}

/// The timeline directory `path` names: itself, or the directory of its `metadata` file.
fn timeline_dir(path: &Path) -> Result<&Path, Error> {
    if path.is_dir() {
        Ok(path)
    } else if path.file_name() == Some(METADATA_FILE.as_ref()) {
        Ok(path.parent().unwrap_or(Path::new("")))
    } else {
        let message = if path.exists() {
            format!("not a timeline directory or a file named {METADATA_FILE}")
        } else {
            "no such file or directory".to_owned()
        };
        Err(Error::Path {
            path: path.to_owned(),
            message,
        })
    }
}

fn metadata(path: &Path, out: &mut impl Write) -> Result<(), Error> {
    let dir = timeline_dir(path)?;
    let stored = Manifest::load(dir)?;
    writeln!(
        out,
        "file:                {}",
        dir.join(METADATA_FILE).display()
    )?;
    match stored {
        StoredMetadata::Legacy {
            disk_consistent_lsn,
        } => {
            writeln!(out, "format:              1 (no layer list)")?;
            writeln!(out, "disk_consistent_lsn: {disk_consistent_lsn}")?;
        }
        StoredMetadata::Manifest(m) => {
            // The file loaded, so it has its version at bytes 4..6.
            let path = dir.join(METADATA_FILE);
            let bytes = std::fs::read(&path).map_err(|e| Error::Path {
                path: path.clone(),
                message: e.to_string(),
            })?;
            let version = bytes
                .get(4..6)
                .map_or(0, |v| u16::from_be_bytes([v[0], v[1]]));
            writeln!(out, "format:              {version}")?;
            writeln!(out, "tenant:              {}", m.tenant_id)?;
            writeln!(out, "timeline:            {}", m.timeline_id)?;
            writeln!(out, "disk_consistent_lsn: {}", m.disk_consistent_lsn)?;
            writeln!(out, "gc_cutoff_lsn:       {}", m.gc_cutoff_lsn)?;
            writeln!(out, "contiguous_from:     {}", m.contiguous_from)?;
            // What the page server checks before it loads the timeline.
            match pageserver::tenant::timeline::layer_set::manifest::history::check(&m) {
                Ok(()) => writeln!(out, "history:             complete")?,
                Err(e) => writeln!(out, "history:             incomplete: {e}")?,
            }
            writeln!(out, "layers:              {}", m.layers.len())?;
            for l in &m.layers {
                writeln!(
                    out,
                    "layer {} level={} size={} crc32c={:#010x} group={}",
                    l.name, l.level, l.size, l.crc32c, l.group_size
                )?;
            }
            writeln!(out, "retired:             {}", m.retired.len())?;
            for name in &m.retired {
                writeln!(out, "retired {name}")?;
            }
        }
    }
    Ok(())
}

/// One line describing a value: `image len=.. crc=..`, `delta will_init=.. patches=[..]` or
/// `wal-record will_init=.. len=.. rmgr=.. info=..`.
fn describe(value: &Value) -> String {
    match value {
        Value::Image(page) => format!(
            "image len={} crc={:#010x}",
            page.len(),
            // A fingerprint to compare pages across layers.
            utils::crc32c::crc32c(page)
        ),
        Value::Delta { will_init, patches } => {
            let mut s = format!("delta will_init={will_init} patches=[");
            for (i, p) in patches.iter().take(MAX_PATCHES_SHOWN).enumerate() {
                let sep = if i == 0 { "" } else { "," };
                let _ = write!(s, "{sep}({},{})", p.offset, p.data.len());
            }
            if patches.len() > MAX_PATCHES_SHOWN {
                let _ = write!(s, ",... {} more", patches.len() - MAX_PATCHES_SHOWN);
            }
            s.push(']');
            s
        }
        Value::WalRecord { will_init, record } => {
            let mut s = format!("wal-record will_init={will_init} len={}", record.len());
            if record.len() >= postgres_wal::record::RECORD_HEADER_LEN {
                let header = postgres_wal::record::RecordHeader::decode(record);
                let _ = write!(
                    s,
                    " rmgr={} info={:#04x}",
                    postgres_wal::record::rmgr_name(header.rmid),
                    header.info
                );
            }
            s
        }
    }
}

/// The first `max` of a serialized value's `bytes` (those stored in the file between the blob
/// header and the checksum), 16 to a line, with their offsets.
fn hex_dump(bytes: &[u8], max: usize, out: &mut impl Write) -> io::Result<()> {
    let shown = &bytes[..bytes.len().min(max)];
    for (n, line) in shown.chunks(16).enumerate() {
        let mut text = format!("    {:08x} ", n * 16);
        for b in line {
            let _ = write!(text, " {b:02x}");
        }
        let pad = 3 * (16 - line.len());
        let ascii: String = line
            .iter()
            .map(|&b| {
                if b.is_ascii_graphic() {
                    char::from(b)
                } else {
                    '.'
                }
            })
            .collect();
        writeln!(out, "{text}{:pad$}  |{ascii}|", "")?;
    }
    if bytes.len() > shown.len() {
        writeln!(
            out,
            "    ... {} more bytes (--raw-bytes shows more)",
            bytes.len() - shown.len()
        )?;
    }
    Ok(())
}
