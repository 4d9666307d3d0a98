//! `pagectl`: looks inside the page server's files when something is wrong with them.
//!
//! ```text
//! pagectl layer summary <file>                         every field of a delta layer's summary
//! pagectl layer index   <file> [--key K] [--limit N]   index entries in (key, lsn) order
//! pagectl layer values  <file> [--key K] [--lsn L] [--limit N] [--raw]
//!                                                      each version with its value decoded
//! pagectl layer get     <file> --key K --lsn L         what a read of K at L takes from the layer
//! pagectl layer verify  <file>                         read and check everything, and against
//!                                                      the manifest beside it if there is one
//! pagectl metadata <timeline dir | metadata file>      the manifest: disk_consistent_lsn, layers
//! ```
//!
//! Output goes to stdout, one line per item, so it can be grepped and diffed; docs/pagectl.md
//! shows each command's output. A problem (a missing file, a file that is not a layer, a
//! corrupt one) is one line on stderr naming the file, and exit code 1; a usage error is exit
//! code 2. Everything read is checked exactly as the page server checks it, through the same
//! code, so pagectl never trusts what the page server would refuse.

use std::fmt::Write as _;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};
use pageserver::page_cache::{PageCache, PageCacheConfig, PageCacheConfigError};
use pageserver::tenant::storage_layer::delta_layer::{
    DeltaLayer, DeltaLayerError, IndexEntry, DELTA_FORMAT_VERSION, DELTA_MAGIC,
};
use pageserver::tenant::timeline::metadata::{
    MetadataError, StoredMetadata, TimelineMetadata, METADATA_FILE,
};
use pageserver::tenant::timeline::{open_listed_layer, TimelineError};
use pageserver::PAGE_SZ;
use pageserver_api::{Key, Value, DEFAULT_MAX_VALUE_SIZE};
use utils::Lsn;

/// Pages in the private page cache (1 MiB): pagectl reads most blocks once, and a read that
/// finds every page pinned gets a private copy instead.
const CACHE_PAGES: u64 = 128;
/// Patches listed per delta before the rest are only counted.
const MAX_PATCHES_SHOWN: usize = 16;

/// Inspect the page server's files: delta layers and timeline metadata.
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
    /// Delta layer files.
    #[command(subcommand)]
    Layer(LayerCommand),
    /// Print a timeline's metadata.
    Metadata {
        /// A timeline directory, or the `metadata` file in one.
        path: PathBuf,
    },
}

#[derive(Subcommand)]
enum LayerCommand {
    /// Print every field of the summary block.
    Summary {
        /// The delta layer file.
        file: PathBuf,
    },
    /// List index entries in (key, lsn) order, without reading values.
    Index {
        /// The delta layer file.
        file: PathBuf,
        #[command(flatten)]
        filter: Filter,
    },
    /// List versions with their values decoded.
    Values {
        /// The delta layer file.
        file: PathBuf,
        #[command(flatten)]
        filter: Filter,
        /// Only versions at or below this LSN (X/X or decimal).
        #[arg(long)]
        lsn: Option<Lsn>,
        /// Also hex-dump each serialized value.
        #[arg(long)]
        raw: bool,
        /// Bytes of each value the hex dump shows.
        #[arg(long, default_value_t = 256, value_name = "BYTES", requires = "raw")]
        raw_bytes: usize,
    },
    /// Show what a read of a key at an LSN takes from this layer.
    ///
    /// The versions from the newest at or below the LSN down to an image or will_init delta,
    /// newest first, as the page server's read path returns them.
    Get {
        /// The delta layer file.
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
    /// `DeltaLayer::verify`). In a timeline directory, first checks the file as the page server
    /// does at startup (listed in the manifest, of the listed size, its summary naming the
    /// manifest's tenant and timeline and the ranges its name says), then the file's CRC-32C
    /// against the manifest's.
    Verify {
        /// The delta layer file.
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
    Layer(#[from] DeltaLayerError),
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    #[error(transparent)]
    Timeline(#[from] TimelineError),
    #[error("cannot create the page cache: {0}")]
    Cache(#[from] PageCacheConfigError),
    #[error("{}: {message}", path.display())]
    Path { path: PathBuf, message: String },
    /// Writing to stdout failed; a closed pipe (`pagectl ... | head`) is not reported.
    #[error("writing the output: {0}")]
    Output(#[from] io::Error),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
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
        Command::Layer(command) => {
            let open = |file: &Path| open_layer(file, cli.max_value_size);
            match command {
                LayerCommand::Summary { file } => summary(&open(&file)?, out),
                LayerCommand::Index { file, filter } => index(&open(&file)?, &filter, out),
                LayerCommand::Values {
                    file,
                    filter,
                    lsn,
                    raw,
                    raw_bytes,
                } => {
                    let raw = raw.then_some(raw_bytes);
                    values(&open(&file)?, &filter, lsn, raw, out)
                }
                LayerCommand::Get { file, key, lsn } => get(&open(&file)?, key, lsn, out),
                LayerCommand::Verify { file } => verify(&file, cli.max_value_size, out),
            }
        }
    }
}

fn open_layer(file: &Path, max_value_size: usize) -> Result<DeltaLayer, Error> {
    check_not_dir(file)?;
    Ok(DeltaLayer::open(file, private_cache()?, max_value_size)?)
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

fn summary(layer: &DeltaLayer, out: &mut impl Write) -> Result<(), Error> {
    let s = layer.summary();
    let path = layer.path();
    let len = std::fs::metadata(path)
        .map_err(|source| DeltaLayerError::Io {
            path: path.to_owned(),
            source,
        })?
        .len();
    let implied = s.file_name();
    let actual = path.file_name().map(|n| n.to_string_lossy());
    let matches = if actual.as_deref() == Some(implied.as_str()) {
        "matches"
    } else {
        "does NOT match the file's name"
    };
    let page = PAGE_SZ as u64;
    let magic = String::from_utf8_lossy(&DELTA_MAGIC.to_be_bytes()).into_owned();
    // Opening the file checked the magic and version, so they are the ones we know.
    writeln!(out, "file:              {}", path.display())?;
    writeln!(out, "magic:             {DELTA_MAGIC:#010x} ({magic})")?;
    writeln!(out, "format version:    {DELTA_FORMAT_VERSION}")?;
    writeln!(out, "tenant:            {}", s.tenant_id)?;
    writeln!(out, "timeline:          {}", s.timeline_id)?;
    writeln!(out, "key start:         {}", s.key_start)?;
    writeln!(out, "key end:           {} (exclusive)", s.key_end)?;
    writeln!(out, "lsn start:         {}", s.lsn_start)?;
    writeln!(out, "lsn end:           {} (exclusive)", s.lsn_end)?;
    writeln!(
        out,
        "index start:       block {} (byte {})",
        s.index_start_blk,
        u64::from(s.index_start_blk) * page
    )?;
    writeln!(
        out,
        "index root:        block {} (file block {})",
        s.index_root_blk,
        u64::from(s.index_start_blk) + u64::from(s.index_root_blk)
    )?;
    writeln!(out, "entries:           {}", s.entries)?;
    writeln!(out, "values end:        byte {}", s.values_end)?;
    writeln!(
        out,
        "file size:         {len} bytes ({} blocks)",
        len.div_ceil(page)
    )?;
    writeln!(out, "implied file name: {implied}")?;
    writeln!(out, "file name:         {matches}")?;
    Ok(())
}

fn index(layer: &DeltaLayer, filter: &Filter, out: &mut impl Write) -> Result<(), Error> {
    // An entry's value length comes from the next entry's offset, so each line is printed
    // when the entry after it arrives (or the index ends).
    let mut pending: Option<IndexEntry> = None;
    let mut printed = 0usize;
    let mut result = Ok(());
    let limit = filter.limit();
    let values_end = layer.summary().values_end;
    let finished = layer.visit_index(filter.start(), |entry| {
        if let Some(prev) = pending.take() {
            result = print_index_entry(&prev, entry.offset, out);
            printed += 1;
        }
        if result.is_err() || printed >= limit || filter.past(entry.key) {
            return false;
        }
        pending = Some(entry);
        true
    })?;
    result?;
    if let Some(last) = pending {
        // The index ended (or failed, and the error was returned above): the last value ends
        // where the values do.
        debug_assert!(finished);
        print_index_entry(&last, values_end, out)?;
    }
    Ok(())
}

fn print_index_entry(e: &IndexEntry, next_offset: u64, out: &mut impl Write) -> io::Result<()> {
    let len = match e.value_len(next_offset) {
        Some(len) => len.to_string(),
        None => "?".to_owned(),
    };
    writeln!(
        out,
        "{} {} offset={} will_init={} len={len}",
        e.key, e.lsn, e.offset, e.will_init
    )
}

fn values(
    layer: &DeltaLayer,
    filter: &Filter,
    lsn: Option<Lsn>,
    raw: Option<usize>,
    out: &mut impl Write,
) -> Result<(), Error> {
    let limit = filter.limit();
    let mut printed = 0usize;
    let mut result = Ok(());
    layer.visit_index(filter.start(), |entry| {
        if printed >= limit || filter.past(entry.key) {
            return false;
        }
        if lsn.is_none_or(|l| entry.lsn <= l) {
            result = print_value(layer, &entry, raw, out);
            printed += 1;
        }
        result.is_ok()
    })?;
    result
}

fn print_value(
    layer: &DeltaLayer,
    entry: &IndexEntry,
    raw: Option<usize>,
    out: &mut impl Write,
) -> Result<(), Error> {
    let value = layer.read_entry(entry)?;
    writeln!(out, "{} {} {}", entry.key, entry.lsn, describe(&value))?;
    if let Some(max) = raw {
        // The encoding is canonical, so these are byte for byte the bytes in the file.
        let bytes = value.serialize().map_err(|e| Error::Path {
            path: layer.path().to_owned(),
            message: format!("value of key {} at {}: {e}", entry.key, entry.lsn),
        })?;
        hex_dump(&bytes, max, out)?;
    }
    Ok(())
}

fn get(layer: &DeltaLayer, key: Key, lsn: Lsn, out: &mut impl Write) -> Result<(), Error> {
    let found = layer.get(key, lsn)?;
    for (version, value) in &found.records {
        writeln!(out, "{key} {version} {}", describe(value))?;
    }
    let base = if found.complete {
        "complete: the oldest version listed needs no older history"
    } else {
        "incomplete: older layers are read too"
    };
    writeln!(out, "{} versions, {base}", found.records.len())?;
    Ok(())
}

fn verify(file: &Path, max_value_size: usize, out: &mut impl Write) -> Result<(), Error> {
    check_not_dir(file)?;
    let dir = file.parent().unwrap_or(Path::new("."));
    let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let stored = if dir.join(METADATA_FILE).exists() {
        Some(TimelineMetadata::load(dir)?)
    } else {
        None
    };
    let (layer, manifest) = match stored {
        Some(StoredMetadata::Manifest(manifest)) => {
            let cache = private_cache()?;
            let layer = open_listed_layer(dir, name, &manifest, |path| {
                DeltaLayer::open(path, cache, max_value_size)
            })
            .map_err(|e| match e {
                TimelineError::LayerSet { reason, .. } => Error::Path {
                    path: file.to_owned(),
                    message: reason,
                },
                other => other.into(),
            })?;
            let listed = manifest
                .layer(name)
                .expect("open_listed_layer found it")
                .crc32c;
            let crc = layer.file_crc32c()?;
            if crc != listed {
                return Err(DeltaLayerError::Corrupt {
                    path: file.to_owned(),
                    reason: format!(
                        "the file's CRC-32C is {crc:#010x}, the manifest lists {listed:#010x}"
                    ),
                }
                .into());
            }
            (layer, "listed, size and crc32c match")
        }
        other => {
            let layer = open_layer(file, max_value_size)?;
            // Without a manifest, the name is all there is to check the summary against.
            let s = layer.summary();
            layer.check_identity(s.tenant_id, s.timeline_id)?;
            let why = if other.is_some() {
                "format 1 metadata beside it lists no layers"
            } else {
                "none beside it"
            };
            (layer, why)
        }
    };
    let r = layer.verify()?;
    writeln!(
        out,
        "{}: ok: entries={} images={} deltas={} value_bytes={} index_blocks={} manifest: {manifest}",
        layer.path().display(),
        r.entries,
        r.images,
        r.deltas,
        r.value_bytes,
        r.index_blocks
    )?;
    Ok(())
}

fn metadata(path: &Path, out: &mut impl Write) -> Result<(), Error> {
    let dir = if path.is_dir() {
        path
    } else if path.file_name() == Some(METADATA_FILE.as_ref()) {
        path.parent().unwrap_or(Path::new(""))
    } else {
        let message = if path.exists() {
            format!("not a timeline directory or a file named {METADATA_FILE}")
        } else {
            "no such file or directory".to_owned()
        };
        return Err(Error::Path {
            path: path.to_owned(),
            message,
        });
    };
    let stored = TimelineMetadata::load(dir)?;
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
            writeln!(out, "layers:              {}", m.layers.len())?;
            for l in &m.layers {
                writeln!(
                    out,
                    "layer {} level={} size={} crc32c={:#010x}",
                    l.name, l.level, l.size, l.crc32c
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

/// One line describing a value: `image len=.. crc=..` or `delta will_init=.. patches=[..]`.
fn describe(value: &Value) -> String {
    match value {
        Value::Image(page) => format!(
            "image len={} crc={:#010x}",
            page.len(),
            // A fingerprint to compare pages across layers.
            crc32c::crc32c(page)
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
