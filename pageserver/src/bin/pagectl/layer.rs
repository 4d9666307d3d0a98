//! `pagectl layer ...`: one layer file, delta or image, looked at through the page server's
//! own readers (`DeltaLayer`, `ImageLayer` and their `inspect` modules).
//!
//! The kind of a file is what its name says when the name is a layer's (`LayerName`), else what
//! the magic at the start of its summary block says; a file that is neither is refused by name.
//! In a timeline directory, `verify` opens the file as the kind the manifest's level says, as
//! the page server does.

use std::io::Read;

use pageserver::tenant::storage_layer::delta_layer::{self, DeltaLayer, DELTA_MAGIC};
use pageserver::tenant::storage_layer::image_layer::{self, ImageLayer, IMAGE_MAGIC};
use pageserver::tenant::storage_layer::{Layer, LayerName, LayerRecords};
use pageserver::tenant::timeline::open_listed_layer;

use super::*;

/// An open layer file of either kind.
pub(super) enum LayerFile {
    Delta(Arc<DeltaLayer>),
    Image(Arc<ImageLayer>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Delta,
    Image,
}

impl LayerFile {
    fn path(&self) -> &Path {
        match self {
            LayerFile::Delta(l) => l.path(),
            LayerFile::Image(l) => l.path(),
        }
    }

    fn file_crc32c(&self) -> Result<u32, Error> {
        Ok(match self {
            LayerFile::Delta(l) => l.file_crc32c()?,
            LayerFile::Image(l) => l.file_crc32c()?,
        })
    }

    fn corrupt(&self, reason: String) -> Error {
        let path = self.path().to_owned();
        let kind = match self {
            LayerFile::Delta(_) => LayerFileKind::Delta,
            LayerFile::Image(_) => LayerFileKind::Image,
        };
        LayerFileError::Corrupt { kind, path, reason }.into()
    }

    /// Checks that the summary gives the file's name: without a manifest, the name is all
    /// there is to check the summary against.
    fn check_own_name(&self) -> Result<(), Error> {
        match self {
            LayerFile::Delta(l) => {
                let s = l.summary();
                l.check_identity(s.tenant_id, s.timeline_id)?
            }
            LayerFile::Image(l) => {
                let s = l.summary();
                l.check_identity(s.tenant_id, s.timeline_id)?
            }
        }
        Ok(())
    }
}

pub(super) fn run(
    command: LayerCommand,
    max_value_size: usize,
    out: &mut impl Write,
) -> Result<(), Error> {
    let open = |file: &Path| open_layer(file, max_value_size);
    match command {
        LayerCommand::Summary { file } => match open(&file)? {
            LayerFile::Delta(l) => delta_summary(&l, out),
            LayerFile::Image(l) => image_summary(&l, out),
        },
        LayerCommand::Index { file, filter } => match open(&file)? {
            LayerFile::Delta(l) => delta_index(&l, &filter, out),
            LayerFile::Image(l) => image_index(&l, &filter, out),
        },
        LayerCommand::Values {
            file,
            filter,
            lsn,
            raw,
            raw_bytes,
        } => {
            let raw = raw.then_some(raw_bytes);
            match open(&file)? {
                LayerFile::Delta(l) => delta_values(&l, &filter, lsn, raw, out),
                LayerFile::Image(l) => image_values(&l, &filter, lsn, raw, out),
            }
        }
        LayerCommand::Get { file, key, lsn } => {
            let found = match open(&file)? {
                LayerFile::Delta(l) => l.get(key, lsn)?,
                LayerFile::Image(l) => l.get(key, lsn)?,
            };
            print_records(key, &found, out)
        }
        LayerCommand::Verify { file } => verify(&file, max_value_size, out),
    }
}

/// What kind of layer `file` is: what its name says if it is a layer's name, else what the
/// magic at the start of the file says.
fn kind_of(file: &Path) -> Result<Kind, Error> {
    let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if let Ok(parsed) = name.parse::<LayerName>() {
        return Ok(if parsed.is_image() {
            Kind::Image
        } else {
            Kind::Delta
        });
    }
    let refuse = |message: String| Error::Path {
        path: file.to_owned(),
        message,
    };
    let mut magic = [0u8; 4];
    let mut read = 0;
    let mut f = std::fs::File::open(file).map_err(|e| refuse(e.to_string()))?;
    while read < magic.len() {
        match f.read(&mut magic[read..]) {
            Ok(0) => break,
            Ok(n) => read += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(refuse(e.to_string())),
        }
    }
    if read < magic.len() {
        return Err(refuse(format!(
            "not a layer file: its name is not a layer's, and at {read} bytes it is too short \
             for a summary block"
        )));
    }
    match u32::from_be_bytes(magic) {
        DELTA_MAGIC => Ok(Kind::Delta),
        IMAGE_MAGIC => Ok(Kind::Image),
        other => Err(refuse(format!(
            "not a layer file: its name is not a layer's, and it starts with {other:#010x}, \
             neither a delta layer's magic {DELTA_MAGIC:#010x} ({}) nor an image layer's \
             {IMAGE_MAGIC:#010x} ({})",
            magic_text(DELTA_MAGIC),
            magic_text(IMAGE_MAGIC)
        ))),
    }
}

fn magic_text(magic: u32) -> String {
    String::from_utf8_lossy(&magic.to_be_bytes()).into_owned()
}

pub(super) fn open_layer(file: &Path, max_value_size: usize) -> Result<LayerFile, Error> {
    check_not_dir(file)?;
    let cache = private_cache()?;
    Ok(match kind_of(file)? {
        Kind::Delta => LayerFile::Delta(Arc::new(DeltaLayer::open(file, cache, max_value_size)?)),
        Kind::Image => LayerFile::Image(Arc::new(ImageLayer::open(file, cache, max_value_size)?)),
    })
}

/// The file's size in bytes, for the summary's last lines.
fn file_len(path: &Path) -> Result<u64, Error> {
    Ok(std::fs::metadata(path)
        .map_err(|e| Error::Path {
            path: path.to_owned(),
            message: e.to_string(),
        })?
        .len())
}

/// The lines every summary starts with. Opening the file checked the magic and version, so
/// they are the ones we know.
fn summary_head(
    path: &Path,
    magic: u32,
    version: u16,
    tenant: impl std::fmt::Display,
    timeline: impl std::fmt::Display,
    keys: (Key, Key),
    out: &mut impl Write,
) -> Result<(), Error> {
    writeln!(out, "file:              {}", path.display())?;
    writeln!(
        out,
        "magic:             {magic:#010x} ({})",
        magic_text(magic)
    )?;
    writeln!(out, "format version:    {version}")?;
    writeln!(out, "tenant:            {tenant}")?;
    writeln!(out, "timeline:          {timeline}")?;
    writeln!(out, "key start:         {}", keys.0)?;
    writeln!(out, "key end:           {} (exclusive)", keys.1)?;
    Ok(())
}

/// The lines every summary ends with: the file's size, and whether its name is the one the
/// summary implies (a renamed or copied layer is worth knowing about: the page server finds
/// layers by name).
fn summary_tail(path: &Path, implied: &str, out: &mut impl Write) -> Result<(), Error> {
    let len = file_len(path)?;
    let actual = path.file_name().map(|n| n.to_string_lossy());
    let matches = if actual.as_deref() == Some(implied) {
        "matches"
    } else {
        "does NOT match the file's name"
    };
    writeln!(
        out,
        "file size:         {len} bytes ({} blocks)",
        len.div_ceil(PAGE_SZ as u64)
    )?;
    writeln!(out, "implied file name: {implied}")?;
    writeln!(out, "file name:         {matches}")?;
    Ok(())
}

fn delta_summary(layer: &DeltaLayer, out: &mut impl Write) -> Result<(), Error> {
    let s = layer.summary();
    let page = PAGE_SZ as u64;
    let keys = (s.key_start, s.key_end);
    summary_head(
        layer.path(),
        DELTA_MAGIC,
        s.format_version,
        s.tenant_id,
        s.timeline_id,
        keys,
        out,
    )?;
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
    summary_tail(layer.path(), &s.file_name(), out)
}

fn image_summary(layer: &ImageLayer, out: &mut impl Write) -> Result<(), Error> {
    let s = layer.summary();
    let page = PAGE_SZ as u64;
    let keys = (s.key_start, s.key_end);
    summary_head(
        layer.path(),
        IMAGE_MAGIC,
        s.format_version,
        s.tenant_id,
        s.timeline_id,
        keys,
        out,
    )?;
    writeln!(out, "lsn:               {}", s.lsn)?;
    writeln!(
        out,
        "checksums start:   block {} (byte {}, {} blocks)",
        s.checksums_start_blk,
        u64::from(s.checksums_start_blk) * page,
        s.checksum_blocks()
    )?;
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
    writeln!(
        out,
        "values end:        byte {} ({} value blocks)",
        s.values_end,
        s.value_blocks()
    )?;
    summary_tail(layer.path(), &s.file_name(), out)
}

fn delta_index(layer: &DeltaLayer, filter: &Filter, out: &mut impl Write) -> Result<(), Error> {
    // An entry's value length comes from the next entry's offset, so each line is printed
    // when the entry after it arrives (or the index ends).
    let mut pending: Option<delta_layer::IndexEntry> = None;
    let mut printed = 0usize;
    let mut result = Ok(());
    let limit = filter.limit();
    let values_end = layer.summary().values_end;
    let finished = layer.visit_index(filter.start(), |entry| {
        if let Some(prev) = pending.take() {
            result = print_delta_entry(&prev, entry.offset, out);
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
        print_delta_entry(&last, values_end, out)?;
    }
    Ok(())
}

fn print_delta_entry(
    e: &delta_layer::IndexEntry,
    next_offset: u64,
    out: &mut impl Write,
) -> io::Result<()> {
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

/// An image layer's entries: every one is at the layer's LSN, and says where its image lies.
fn image_index(layer: &ImageLayer, filter: &Filter, out: &mut impl Write) -> Result<(), Error> {
    let lsn = layer.summary().lsn;
    let limit = filter.limit();
    let mut printed = 0usize;
    let mut result = Ok(());
    layer.visit_index(filter.start(), |e| {
        if printed >= limit || filter.past(e.key) {
            return false;
        }
        // A compressed image's length is its frame's.
        let compressed = if e.compressed { " compressed" } else { "" };
        result = writeln!(
            out,
            "{} {lsn} offset={} len={}{compressed}",
            e.key, e.offset, e.len
        );
        printed += 1;
        result.is_ok()
    })?;
    Ok(result?)
}

fn delta_values(
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
            result = print_delta_value(layer, &entry, raw, out);
            printed += 1;
        }
        result.is_ok()
    })?;
    result
}

fn print_delta_value(
    layer: &DeltaLayer,
    entry: &delta_layer::IndexEntry,
    raw: Option<usize>,
    out: &mut impl Write,
) -> Result<(), Error> {
    let value = layer.read_entry(entry)?;
    writeln!(out, "{} {} {}", entry.key, entry.lsn, describe(&value))?;
    if let Some(max) = raw {
        // The encoding is canonical, so these are byte for byte the bytes in the file (or, for
        // a value stored compressed, the bytes its frame makes).
        let bytes = value.serialize().map_err(|e| Error::Path {
            path: layer.path().to_owned(),
            message: format!("value of key {} at {}: {e}", entry.key, entry.lsn),
        })?;
        hex_dump(&bytes, max, out)?;
    }
    Ok(())
}

/// An image layer's images, read and checked as `ImageLayer::get` reads them. All are at the
/// layer's LSN, so `--lsn` below it selects none.
fn image_values(
    layer: &ImageLayer,
    filter: &Filter,
    lsn: Option<Lsn>,
    raw: Option<usize>,
    out: &mut impl Write,
) -> Result<(), Error> {
    let at = layer.summary().lsn;
    if lsn.is_some_and(|l| l < at) {
        return Ok(());
    }
    let limit = filter.limit();
    let mut printed = 0usize;
    let mut result = Ok(());
    layer.visit_index(filter.start(), |entry| {
        if printed >= limit || filter.past(entry.key) {
            return false;
        }
        result = print_image(layer, &entry, at, raw, out);
        printed += 1;
        result.is_ok()
    })?;
    result
}

fn print_image(
    layer: &ImageLayer,
    entry: &image_layer::IndexEntry,
    lsn: Lsn,
    raw: Option<usize>,
    out: &mut impl Write,
) -> Result<(), Error> {
    let image = layer.read_entry(entry)?;
    // An image layer stores the page's bytes as they are: the dump is the bytes in the file.
    let dump = raw.map(|max| (max, image.clone()));
    writeln!(
        out,
        "{} {lsn} {}",
        entry.key,
        describe(&Value::Image(image))
    )?;
    if let Some((max, bytes)) = dump {
        hex_dump(&bytes, max, out)?;
    }
    Ok(())
}

/// What a read of `key` took from one layer, newest first, and whether it needs older layers.
fn print_records(key: Key, found: &LayerRecords, out: &mut impl Write) -> Result<(), Error> {
    for (version, value) in &found.records {
        writeln!(out, "{key} {version} {}", describe(value))?;
    }
    let base = match (found.complete, found.records.is_empty()) {
        (true, false) => "complete: the oldest version listed needs no older history",
        // Only an image layer says this: the key is in its range without an image.
        (true, true) => {
            "complete: the key had no page at the layer's LSN, older layers are not read"
        }
        (false, _) => "incomplete: older layers are read too",
    };
    let n = found.records.len();
    let versions = if n == 1 { "version" } else { "versions" };
    writeln!(out, "{n} {versions}, {base}")?;
    Ok(())
}

fn verify(file: &Path, max_value_size: usize, out: &mut impl Write) -> Result<(), Error> {
    check_not_dir(file)?;
    let dir = file.parent().unwrap_or(Path::new("."));
    let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let stored = if dir.join(METADATA_FILE).exists() {
        Some(Manifest::load(dir)?)
    } else {
        None
    };
    let (layer, manifest) = match stored {
        Some(StoredMetadata::Manifest(manifest)) => {
            let refused = |reason: String| Error::Path {
                path: file.to_owned(),
                message: reason,
            };
            let opened = open_listed_layer(dir, name, &manifest, &private_cache()?, max_value_size)
                .map_err(|e| match e {
                    TimelineError::LayerSet { reason, .. } => refused(reason),
                    other => other.into(),
                })?;
            let layer = match opened {
                Layer::Delta(l) => LayerFile::Delta(l),
                Layer::Image(l) => LayerFile::Image(l),
                Layer::InMemory(_) | Layer::OnDemand(_) => {
                    return Err(refused("not a layer file".to_owned()))
                }
            };
            // `open_listed_layer` found the entry.
            let entry = manifest
                .layer(name)
                .ok_or_else(|| refused("the manifest does not list it".to_owned()))?;
            let crc = layer.file_crc32c()?;
            if crc != entry.crc32c {
                return Err(layer.corrupt(format!(
                    "the file's CRC-32C is {crc:#010x}, the manifest lists {:#010x}",
                    entry.crc32c
                )));
            }
            let note = format!("listed as {}, size and crc32c match", entry.level);
            (layer, note)
        }
        other => {
            let layer = open_layer(file, max_value_size)?;
            layer.check_own_name()?;
            let why = if other.is_some() {
                "format 1 metadata beside it lists no layers"
            } else {
                "none beside it"
            };
            (layer, why.to_owned())
        }
    };
    let path = layer.path().display();
    match &layer {
        LayerFile::Delta(l) => {
            let r = l.verify()?;
            writeln!(
                out,
                "{path}: ok: entries={} images={} deltas={} wal_records={} value_bytes={} \
                 compressed={} index_blocks={} manifest: {manifest}",
                r.entries,
                r.images,
                r.deltas,
                r.wal_records,
                r.value_bytes,
                r.compressed,
                r.index_blocks
            )?;
        }
        LayerFile::Image(l) => {
            let r = l.verify()?;
            writeln!(
                out,
                "{path}: ok: lsn={} entries={} image_bytes={} compressed={} padding_bytes={} \
                 value_blocks={} checksum_blocks={} index_blocks={} manifest: {manifest}",
                l.summary().lsn,
                r.entries,
                r.image_bytes,
                r.compressed,
                r.padding_bytes,
                r.value_blocks,
                r.checksum_blocks,
                r.index_blocks
            )?;
        }
    }
    Ok(())
}
