//! Timeline metadata: the manifest of a timeline, and the commit point of every change to its
//! layer set.
//!
//! It holds `disk_consistent_lsn` (every version at or below it is in fsynced layer files) and
//! the list of layer files that hold those versions: each file's name, size and CRC-32C. A layer
//! file exists for the timeline only once a manifest listing it is durable; a file the manifest
//! does not list is not part of the timeline, whatever its name says (a flush that crashed
//! between writing its layer and storing the manifest), and a listed file that is missing, of
//! another size, or whose summary names other ranges or another timeline, makes the timeline
//! refuse to load rather than answer from a set it cannot vouch for.
//!
//! # Format 4 (current)
//!
//! ```text
//! offset size field
//!      0    4 magic                 0x544C4D44 ("TLMD")
//!      4    2 format version        4
//!      6    2 reserved              0
//!      8   16 tenant id
//!     24   16 timeline id
//!     40    8 disk_consistent_lsn
//!     48    8 gc_cutoff_lsn         reads below it are refused (0: none)
//!     56    8 contiguous_from       the layers' LSN ranges meet, with no gap, from here up to
//!                                   disk_consistent_lsn (see `history.rs`)
//!     64    4 layer count N
//!     68      N layer entries, sorted by name, no name twice:
//!               name length:u16  name (ASCII, a file name)  size:u64  CRC-32C of the file:u32
//!               level:u8 (0: L0 delta, 1: L1 delta, 2: image; an image name has level 2
//!               and a delta name level 0 or 1)
//!               group size:u32 (the layer files the change that wrote this one wrote at its
//!               LSN range, itself included; 0: not known)
//!       …     4 retired count M
//!             M retired names, sorted, no name twice and none listed above:
//!               name length:u16  name
//!    end-4    4 CRC-32C of every byte before it
//! ```
//!
//! *Retired* files are layer files a committed change replaced (a compaction's inputs, what GC
//! removed). They are deleted only after a manifest without them among the layers is durable,
//! and only once no reader uses them; until they are gone the manifest names them, so a crash
//! in between leaves files that the next load knows to delete, never files it must guess about.
//!
//! `contiguous_from` and the group sizes are what lets a load tell a complete layer set from
//! one that lost a layer (`manifest::history`): a timeline's history starts at
//! `contiguous_from` (0 for a new timeline, the branch point for a branch), and every group of
//! files one change wrote is listed whole until GC removes some of it.
//!
//! Format 3 is format 4 without `contiguous_from` (the layer count at offset 56) and without
//! the group sizes: it loads with `contiguous_from` at its `disk_consistent_lsn`, since what
//! servers before format 4 wrote may have gaps where nothing was written (below an import), and
//! with every group size unknown. Format 2 (no `gc_cutoff_lsn`, no levels, no retired list) was
//! written before compaction: its layers are all L0 deltas. Format 1 (20 bytes: magic, version
//! 1, reserved, `disk_consistent_lsn`, CRC-32C) predates the manifest; it still loads
//! ([`StoredMetadata::Legacy`]) and the timeline replaces it with a manifest at once
//! (`tenant::timeline::init`). All of them still load; the next store writes format 4.
//!
//! # Atomic replacement
//!
//! A temporary file is written and fsynced, renamed over `metadata`, and the directory fsynced.
//! A reader sees the old manifest or the new one, never a mix; a failed check is a corruption
//! error naming the file. The whole file is rewritten at each change: at about 100 bytes a
//! layer that stays small next to the layer it commits.

use std::io;
use std::path::{Path, PathBuf};

use utils::{Lsn, TenantId, TimelineId};

use crate::format::array_at;
use crate::io::crashsafe::{PathError, StagedFile};
use crate::io::virtual_file::{FileIo, VirtualFile};
use crate::tenant::storage_layer::LayerName;

pub mod history;

pub const METADATA_FILE: &str = "metadata";
const METADATA_TEMP: &str = "metadata.___temp";
const MAGIC: u32 = 0x544C_4D44;
const VERSION_LEGACY: u16 = 1;
const VERSION_2: u16 = 2;
const VERSION_3: u16 = 3;
const VERSION: u16 = 4;
const LEGACY_LEN: usize = 20;
const HEADER_2_LEN: usize = 52;
const HEADER_3_LEN: usize = 60;
const HEADER_LEN: usize = 68;
const CRC_LEN: usize = 4;
/// Far beyond any real manifest (a million layers); a longer file is corrupt, and is refused
/// before it is read into memory.
const MAX_FILE_LEN: u64 = 256 << 20;

mod off {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 4;
    pub const RESERVED: usize = 6;
    pub const TENANT: usize = 8;
    pub const TIMELINE: usize = 24;
    pub const DISK_CONSISTENT_LSN: usize = 40;
    /// Formats 3 and 4.
    pub const GC_CUTOFF_LSN: usize = 48;
    /// Format 4.
    pub const CONTIGUOUS_FROM: usize = 56;
    pub const LAYER_COUNT: usize = 64;
    pub const LAYERS: usize = 68;
    /// Format 3.
    pub const LAYER_COUNT_3: usize = 56;
    pub const LAYERS_3: usize = 60;
    /// Format 2.
    pub const LAYER_COUNT_2: usize = 48;
    pub const LAYERS_2: usize = 52;
    /// Format 1: the LSN and the checksum.
    pub const LEGACY_LSN: usize = 8;
    pub const LEGACY_CRC: usize = 16;
}

/// What a layer file is to the timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayerLevel {
    /// A delta layer a flush or an import wrote: one per flush, LSN ranges tiling the newest
    /// history; an import's share one LSN range (a group, `layer_set/map.rs`).
    L0,
    /// A delta layer compaction wrote from L0s: a run of them shares an LSN range, each a
    /// part of the key space.
    L1,
    /// An image layer.
    Image,
}

impl LayerLevel {
    fn code(self) -> u8 {
        match self {
            LayerLevel::L0 => 0,
            LayerLevel::L1 => 1,
            LayerLevel::Image => 2,
        }
    }

    fn from_code(code: u8) -> Option<LayerLevel> {
        Some(match code {
            0 => LayerLevel::L0,
            1 => LayerLevel::L1,
            2 => LayerLevel::Image,
            _ => return None,
        })
    }

    /// Whether a file of this name can be a layer of this level.
    fn fits(self, name: &str) -> bool {
        match name.parse::<LayerName>() {
            Ok(LayerName::Image(_)) => self == LayerLevel::Image,
            Ok(LayerName::Delta(_)) => self != LayerLevel::Image,
            Err(_) => false,
        }
    }
}

impl std::fmt::Display for LayerLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LayerLevel::L0 => "L0",
            LayerLevel::L1 => "L1",
            LayerLevel::Image => "image",
        })
    }
}

/// One layer file the timeline owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerFileEntry {
    /// The file's name in the timeline directory (it encodes the layer's ranges).
    pub name: String,
    /// The file's length in bytes.
    pub size: u64,
    /// CRC-32C of the whole file.
    pub crc32c: u32,
    pub level: LayerLevel,
    /// How many layer files the change that wrote this one wrote at its LSN range, itself
    /// included: 1 for a flush, the outputs of a compaction, the files of an import, the
    /// images of one image creation. 0 when not known (a manifest older than format 4).
    pub group_size: u32,
}

/// The manifest: see the module documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub tenant_id: TenantId,
    pub timeline_id: TimelineId,
    pub disk_consistent_lsn: Lsn,
    /// Reads below it are refused: GC may have removed what they need.
    pub gc_cutoff_lsn: Lsn,
    /// The layers' LSN ranges meet, with no gap, from here up to `disk_consistent_lsn`: the
    /// start of the timeline's own history (0, or a branch's branch point), or for a timeline
    /// older than format 4 its `disk_consistent_lsn` when it was upgraded.
    pub contiguous_from: Lsn,
    /// Sorted by name.
    pub layers: Vec<LayerFileEntry>,
    /// Files replaced by a committed change and still to delete; sorted, none in `layers`.
    pub retired: Vec<String>,
}

/// What a timeline directory's `metadata` file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoredMetadata {
    Manifest(Manifest),
    /// Format 1: no layer list, so the directory's layer files are the set.
    Legacy {
        disk_consistent_lsn: Lsn,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    #[error("timeline metadata {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    /// Stored under its name, its directory not fsynced: the manifest on disk is the new one
    /// now, and after a crash it may be the old one again.
    #[error("timeline metadata {}: {source}, after it was renamed into place: the new manifest may or may not be stored", path.display())]
    Indeterminate { path: PathBuf, source: io::Error },
    #[error("timeline metadata {} is corrupt: {reason}", path.display())]
    Corrupt { path: PathBuf, reason: String },
    #[error("timeline metadata cannot list layer file {name:?}: {reason}")]
    BadLayerName { name: String, reason: &'static str },
}

/// The group size of `n` files written together (saturating: no change writes 2^32 files).
pub fn group_size(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Whether `name` can stand in a manifest: one plain ASCII file name, nothing a path could
/// climb out of the directory with.
pub fn check_layer_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > 255 {
        return Err("a file name is 1 to 255 bytes");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_graphic() && b != b'/' && b != b'\\')
    {
        return Err("a file name is printable ASCII without slashes");
    }
    if name == "." || name == ".." || name == METADATA_FILE || name == METADATA_TEMP {
        return Err("the name is reserved");
    }
    Ok(())
}

/// Appends a name as its length (u16) and its bytes.
fn push_name(b: &mut Vec<u8>, name: &str) -> Result<(), &'static str> {
    check_layer_name(name)?;
    let len = u16::try_from(name.len()).map_err(|_| "name too long")?;
    b.extend_from_slice(&len.to_be_bytes());
    b.extend_from_slice(name.as_bytes());
    Ok(())
}

/// The name at `at` (length, then bytes) and where it ends; `body_len` bounds it.
fn read_name(b: &[u8], at: usize, body_len: usize) -> Result<(&str, usize), String> {
    if at + 2 > body_len {
        return Err("runs past the end of the file".to_owned());
    }
    let name_end = at + 2 + usize::from(u16::from_be_bytes(array_at(b, at)));
    if name_end > body_len {
        return Err("runs past the end of the file".to_owned());
    }
    let name = std::str::from_utf8(&b[at + 2..name_end])
        .map_err(|_| "the name is not UTF-8".to_owned())?;
    check_layer_name(name).map_err(|reason| format!("name {name:?}: {reason}"))?;
    Ok((name, name_end))
}

impl Manifest {
    /// An empty timeline's manifest.
    pub fn empty(tenant_id: TenantId, timeline_id: TimelineId) -> Manifest {
        Manifest {
            tenant_id,
            timeline_id,
            disk_consistent_lsn: Lsn::INVALID,
            gc_cutoff_lsn: Lsn::INVALID,
            contiguous_from: Lsn::INVALID,
            layers: Vec::new(),
            retired: Vec::new(),
        }
    }

    /// The manifest of a new timeline whose history starts at `lsn`: a branch at its branch
    /// point, with nothing of its own yet.
    pub fn starting_at(tenant_id: TenantId, timeline_id: TimelineId, lsn: Lsn) -> Manifest {
        Manifest {
            disk_consistent_lsn: lsn,
            contiguous_from: lsn,
            ..Manifest::empty(tenant_id, timeline_id)
        }
    }

    /// The entry of layer file `name`, if listed.
    pub fn layer(&self, name: &str) -> Option<&LayerFileEntry> {
        self.layers
            .binary_search_by(|l| l.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.layers[i])
    }

    /// Lists `entry`, keeping the list sorted (replacing an entry of the same name).
    pub fn add_layer(&mut self, entry: LayerFileEntry) {
        self.retired.retain(|r| *r != entry.name);
        match self
            .layers
            .binary_search_by(|l| l.name.as_str().cmp(&entry.name))
        {
            Ok(i) => self.layers[i] = entry,
            Err(i) => self.layers.insert(i, entry),
        }
    }

    /// Moves layer `name` from the layers to the retired files; `false` if it is not listed.
    pub fn retire_layer(&mut self, name: &str) -> bool {
        let Ok(i) = self.layers.binary_search_by(|l| l.name.as_str().cmp(name)) else {
            return false;
        };
        self.layers.remove(i);
        if let Err(at) = self.retired.binary_search_by(|r| r.as_str().cmp(name)) {
            self.retired.insert(at, name.to_owned());
        }
        true
    }

    fn encode(&self) -> Result<Vec<u8>, MetadataError> {
        let names: usize = self.layers.iter().map(|l| l.name.len() + 19).sum::<usize>()
            + self.retired.iter().map(|r| r.len() + 2).sum::<usize>();
        let mut b = Vec::with_capacity(HEADER_LEN + names + 4 + CRC_LEN);
        b.extend_from_slice(&MAGIC.to_be_bytes());
        b.extend_from_slice(&VERSION.to_be_bytes());
        b.extend_from_slice(&[0, 0]);
        b.extend_from_slice(self.tenant_id.as_bytes());
        b.extend_from_slice(self.timeline_id.as_bytes());
        b.extend_from_slice(&self.disk_consistent_lsn.0.to_be_bytes());
        b.extend_from_slice(&self.gc_cutoff_lsn.0.to_be_bytes());
        b.extend_from_slice(&self.contiguous_from.0.to_be_bytes());
        let count = |n: usize| {
            u32::try_from(n).map_err(|_| MetadataError::BadLayerName {
                name: String::new(),
                reason: "more than 2^32 names",
            })
        };
        b.extend_from_slice(&count(self.layers.len())?.to_be_bytes());
        for (i, layer) in self.layers.iter().enumerate() {
            let bad = |reason| MetadataError::BadLayerName {
                name: layer.name.clone(),
                reason,
            };
            if i > 0 && self.layers[i - 1].name >= layer.name {
                return Err(bad("the layer list is not sorted by name, or names repeat"));
            }
            if !layer.level.fits(&layer.name) {
                return Err(bad("the name is not a layer of its level"));
            }
            push_name(&mut b, &layer.name).map_err(bad)?;
            b.extend_from_slice(&layer.size.to_be_bytes());
            b.extend_from_slice(&layer.crc32c.to_be_bytes());
            b.push(layer.level.code());
            b.extend_from_slice(&layer.group_size.to_be_bytes());
        }
        b.extend_from_slice(&count(self.retired.len())?.to_be_bytes());
        for (i, name) in self.retired.iter().enumerate() {
            let bad = |reason| MetadataError::BadLayerName {
                name: name.clone(),
                reason,
            };
            if i > 0 && self.retired[i - 1] >= *name {
                return Err(bad("the retired list is not sorted, or names repeat"));
            }
            if self.layer(name).is_some() {
                return Err(bad("a retired file is still listed as a layer"));
            }
            push_name(&mut b, name).map_err(bad)?;
        }
        let crc = utils::crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_be_bytes());
        Ok(b)
    }

    /// Parses any format; every byte is untrusted.
    pub fn decode(b: &[u8]) -> Result<StoredMetadata, String> {
        let u16_at = |o: usize| u16::from_be_bytes(array_at(b, o));
        let u32_at = |o: usize| u32::from_be_bytes(array_at(b, o));
        let u64_at = |o: usize| u64::from_be_bytes(array_at(b, o));
        if b.len() < 8 {
            return Err(format!("{} bytes: too short for a header", b.len()));
        }
        let magic = u32_at(off::MAGIC);
        if magic != MAGIC {
            return Err(format!("bad magic {magic:#010x}, expected {MAGIC:#010x}"));
        }
        let version = u16_at(off::VERSION);
        let (body_len, min_len) = match version {
            VERSION_LEGACY => (off::LEGACY_CRC, LEGACY_LEN),
            VERSION_2 => (b.len().saturating_sub(CRC_LEN), HEADER_2_LEN + CRC_LEN),
            VERSION_3 => (b.len().saturating_sub(CRC_LEN), HEADER_3_LEN + 4 + CRC_LEN),
            VERSION => (b.len().saturating_sub(CRC_LEN), HEADER_LEN + 4 + CRC_LEN),
            _ => return Err(format!("unsupported format version {version}")),
        };
        if b.len() < min_len || (version == VERSION_LEGACY && b.len() != LEGACY_LEN) {
            return Err(format!(
                "{} bytes, too short or long for format {version}",
                b.len()
            ));
        }
        let stored = u32_at(body_len);
        let computed = utils::crc32c::crc32c(&b[..body_len]);
        if stored != computed {
            return Err(format!(
                "checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"
            ));
        }
        if u16_at(off::RESERVED) != 0 {
            return Err("reserved bytes 6..8 are not zero".to_owned());
        }
        if version == VERSION_LEGACY {
            return Ok(StoredMetadata::Legacy {
                disk_consistent_lsn: Lsn(u64_at(off::LEGACY_LSN)),
            });
        }
        // Format 3 and later: levels, the GC cutoff and retired files. Format 4: group sizes and
        // where the history is contiguous from.
        let v3 = version >= VERSION_3;
        let v4 = version == VERSION;
        let (count_at, mut at) = match version {
            VERSION => (off::LAYER_COUNT, off::LAYERS),
            VERSION_3 => (off::LAYER_COUNT_3, off::LAYERS_3),
            _ => (off::LAYER_COUNT_2, off::LAYERS_2),
        };
        // The fixed part of an entry after its name: size, CRC, (format 3) level, (format 4)
        // group size.
        let fixed = match version {
            VERSION => 17,
            VERSION_3 => 13,
            _ => 12,
        };
        let count = u32_at(count_at);
        // Every entry takes at least its fixed parts and one byte of name.
        let room = (body_len - at) / (2 + 1 + fixed);
        if usize::try_from(count).map_or(true, |c| c > room) {
            return Err(format!("{count} layers cannot fit in {} bytes", b.len()));
        }
        // Grown as entries are read: a count that fits is still not proof of a real file.
        let mut layers: Vec<LayerFileEntry> = Vec::with_capacity((count as usize).min(1024));
        for i in 0..count {
            let (name, name_end) = read_name(b, at, body_len)
                .map_err(|reason| format!("layer entry {i}: {reason}"))?;
            if name_end + fixed > body_len {
                return Err(format!("layer entry {i} runs past the end of the file"));
            }
            if layers.last().is_some_and(|prev| prev.name.as_str() >= name) {
                return Err(format!(
                    "layer entry {i}: {name:?} is out of order or listed twice"
                ));
            }
            let level = if v3 {
                let code = b[name_end + 12];
                LayerLevel::from_code(code)
                    .ok_or_else(|| format!("layer entry {i}: unknown level {code}"))?
            } else {
                LayerLevel::L0
            };
            if !level.fits(name) {
                return Err(format!(
                    "layer entry {i}: {name:?} is not the name of a layer of level {level}"
                ));
            }
            layers.push(LayerFileEntry {
                name: name.to_owned(),
                size: u64_at(name_end),
                crc32c: u32_at(name_end + 8),
                level,
                group_size: if v4 { u32_at(name_end + 13) } else { 0 },
            });
            at = name_end + fixed;
        }
        let mut retired: Vec<String> = Vec::new();
        if v3 {
            if at + 4 > body_len {
                return Err("the retired count runs past the end of the file".to_owned());
            }
            let count = u32_at(at);
            at += 4;
            if usize::try_from(count).map_or(true, |c| c > (body_len - at) / 3) {
                return Err(format!(
                    "{count} retired names cannot fit in {} bytes",
                    b.len()
                ));
            }
            for i in 0..count {
                let (name, name_end) = read_name(b, at, body_len)
                    .map_err(|reason| format!("retired name {i}: {reason}"))?;
                if retired.last().is_some_and(|prev| prev.as_str() >= name) {
                    return Err(format!(
                        "retired name {i}: {name:?} is out of order or listed twice"
                    ));
                }
                // Sorted by name: one search, not a pass over every layer per retired name.
                if layers
                    .binary_search_by(|l| l.name.as_str().cmp(name))
                    .is_ok()
                {
                    return Err(format!("retired name {i}: {name:?} is also a layer"));
                }
                retired.push(name.to_owned());
                at = name_end;
            }
        }
        if at != body_len {
            return Err(format!("{} bytes follow the last entry", body_len - at));
        }
        let disk_consistent_lsn = Lsn(u64_at(off::DISK_CONSISTENT_LSN));
        Ok(StoredMetadata::Manifest(Manifest {
            tenant_id: TenantId::from_bytes(array_at(b, off::TENANT)),
            timeline_id: TimelineId::from_bytes(array_at(b, off::TIMELINE)),
            disk_consistent_lsn,
            gc_cutoff_lsn: Lsn(if v3 { u64_at(off::GC_CUTOFF_LSN) } else { 0 }),
            // Older servers left gaps where nothing was written; from here on there are none.
            contiguous_from: if v4 {
                Lsn(u64_at(off::CONTIGUOUS_FROM))
            } else {
                disk_consistent_lsn
            },
            layers,
            retired,
        }))
    }

    /// Reads `<dir>/metadata`, in either format.
    pub fn load(dir: &Path) -> Result<StoredMetadata, MetadataError> {
        let path = dir.join(METADATA_FILE);
        let io_err = |source| MetadataError::Io {
            path: path.clone(),
            source,
        };
        let file = VirtualFile::open(&path).map_err(io_err)?;
        let len = file.metadata().map_err(io_err)?.len();
        if len > MAX_FILE_LEN {
            return Err(MetadataError::Corrupt {
                path,
                reason: format!("{len} bytes, more than any manifest takes"),
            });
        }
        let mut bytes = vec![0u8; len as usize];
        file.read_exact_at(&mut bytes, 0).map_err(io_err)?;
        Self::decode(&bytes).map_err(|reason| MetadataError::Corrupt { path, reason })
    }

    /// Replaces `<dir>/metadata` atomically and durably: the commit point of a change to the
    /// layer set.
    pub fn store(&self, dir: &Path) -> Result<(), MetadataError> {
        let bytes = self.encode()?;
        let io_err = |e: PathError| MetadataError::Io {
            path: e.path,
            source: e.source,
        };
        // A temporary file left by a crash is removed at load; one left by a failed store
        // earlier in this run is replaced.
        let staged = StagedFile::create(dir, METADATA_TEMP, "metadata").map_err(io_err)?;
        staged
            .file()
            .write_all_at(&bytes, 0)
            .map_err(|source| MetadataError::Io {
                path: staged.temp_path().to_owned(),
                source,
            })?;
        staged.commit(METADATA_FILE).map_err(|e| {
            let PathError { path, source } = e.error;
            if e.renamed {
                MetadataError::Indeterminate { path, source }
            } else {
                MetadataError::Io { path, source }
            }
        })?;
        Ok(())
    }
}

/// Writes a format 1 file, as servers before the manifest did: for upgrade tests.
#[cfg(test)]
pub(crate) fn store_legacy(dir: &Path, disk_consistent_lsn: Lsn) {
    let mut b = [0u8; LEGACY_LEN];
    b[0..4].copy_from_slice(&MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&VERSION_LEGACY.to_be_bytes());
    b[8..16].copy_from_slice(&disk_consistent_lsn.0.to_be_bytes());
    let crc = utils::crc32c::crc32c(&b[..16]);
    b[16..20].copy_from_slice(&crc.to_be_bytes());
    std::fs::write(dir.join(METADATA_FILE), b).unwrap();
}

#[cfg(test)]
mod tests;
