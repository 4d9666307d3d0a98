//! The remote index (`index_part.json-<generation>`): the remote copy of a timeline's
//! manifest, and the source of truth for what the object store holds of it.
//!
//! ```json
//! {
//!   "version": 2,
//!   "tenant_id": "0123…", "timeline_id": "fedc…", "generation": 2,
//!   "disk_consistent_lsn": "0/16B5A50", "gc_cutoff_lsn": "0/0", "contiguous_from": "0/0",
//!   "layers": {
//!     "<layer file name>": { "size": 270336, "crc32c": 3735928559, "level": "L0",
//!                            "generation": 1, "group_size": 1 }
//!   },
//!   "wal": { … }
//! }
//! ```
//!
//! `wal` (optional) lists the WAL segments the store holds and the WAL receiver's settings;
//! `wal_index.rs` describes it.
//!
//! `contiguous_from` and `group_size` are the manifest's (`timeline::layer_set::manifest`): where the
//! layers' history starts, and how many files the change that wrote a layer wrote at its LSN
//! range. An attach checks the history they describe (`layer_set::manifest::history`) when the timeline
//! loads, so an index that lost a layer leaves the tenant broken instead of serving reads that
//! walk past the hole. Version 1 (before them) still parses: its history is taken as
//! contiguous from its `disk_consistent_lsn` and its group sizes as unknown.
//!
//! Every layer the index lists is in the store as `<layer file name>-<its generation>`, whole,
//! of that size and CRC-32C: the upload queue uploads an index only after the layers it lists,
//! and deletes a layer's object only after an index that no longer lists it is durable. A layer
//! object the index does not list is not part of the timeline. `disk_consistent_lsn` here is
//! the timeline's `remote_consistent_lsn`: everything at or below it can be rebuilt from the
//! store alone. Every byte is untrusted: [`IndexPart::parse`] checks names, levels,
//! generations and ids, and says what is wrong.

use std::collections::BTreeMap;

use remote_storage::{RemoteError, RemotePath};
use serde::{Deserialize, Serialize};
use utils::{Generation, Lsn, TenantId, TimelineId};

use crate::tenant::storage_layer::LayerName;
use crate::tenant::timeline::layer_set::manifest::{LayerLevel, Manifest};
use crate::tenant::timeline::Ancestry;

use super::wal_index::{parse_object_name, RawWal, WalIndex};

pub const INDEX_VERSION: u32 = 2;
/// Without `contiguous_from` and group sizes.
const INDEX_VERSION_1: u32 = 1;
pub const INDEX_FILE_PREFIX: &str = "index_part.json";
/// Far beyond a real index (a million layers at ~150 bytes each); a larger object is refused
/// before it is parsed.
pub const MAX_INDEX_BYTES: u64 = 256 << 20;

/// One layer the index lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexLayer {
    pub size: u64,
    pub crc32c: u32,
    pub level: LayerLevel,
    /// The generation whose object holds it: its remote name ends with it.
    pub generation: Generation,
    /// The manifest's group size (0: not known).
    pub group_size: u32,
}

/// See the module documentation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexPart {
    pub tenant_id: TenantId,
    pub timeline_id: TimelineId,
    /// The generation that wrote this index.
    pub generation: Generation,
    pub disk_consistent_lsn: Lsn,
    pub gc_cutoff_lsn: Lsn,
    /// The manifest's: the history is contiguous from here to `disk_consistent_lsn`.
    pub contiguous_from: Lsn,
    pub layers: BTreeMap<String, IndexLayer>,
    /// For a branch: its ancestor and branch LSN (`timeline::ancestry`), so that an attach
    /// links it again.
    pub ancestry: Option<Ancestry>,
    /// The WAL the store holds, and the receiver's settings (`wal_index.rs`).
    pub wal: WalIndex,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawIndex {
    version: u32,
    tenant_id: String,
    timeline_id: String,
    generation: u32,
    disk_consistent_lsn: String,
    gc_cutoff_lsn: String,
    /// Version 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    contiguous_from: Option<String>,
    layers: BTreeMap<String, RawLayer>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ancestor_timeline_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ancestor_lsn: Option<String>,
    /// Version 2, optional: absent when the timeline has no WAL and no receiver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    wal: Option<RawWal>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLayer {
    size: u64,
    crc32c: u32,
    level: String,
    generation: u32,
    /// Version 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    group_size: Option<u32>,
}

impl IndexPart {
    /// The index of `manifest` as `generation` writes it, each layer's object of the
    /// generation `layer_generation` names.
    pub fn from_manifest(
        manifest: &Manifest,
        generation: Generation,
        mut layer_generation: impl FnMut(&str) -> Generation,
    ) -> IndexPart {
        IndexPart {
            tenant_id: manifest.tenant_id,
            timeline_id: manifest.timeline_id,
            generation,
            disk_consistent_lsn: manifest.disk_consistent_lsn,
            gc_cutoff_lsn: manifest.gc_cutoff_lsn,
            contiguous_from: manifest.contiguous_from,
            layers: manifest
                .layers
                .iter()
                .map(|l| {
                    let layer = IndexLayer {
                        size: l.size,
                        crc32c: l.crc32c,
                        level: l.level,
                        generation: layer_generation(&l.name),
                        group_size: l.group_size,
                    };
                    (l.name.clone(), layer)
                })
                .collect(),
            ancestry: None,
            wal: WalIndex::default(),
        }
    }

    pub fn to_json(&self) -> Vec<u8> {
        let raw = RawIndex {
            version: INDEX_VERSION,
            tenant_id: self.tenant_id.to_string(),
            timeline_id: self.timeline_id.to_string(),
            generation: self.generation.get(),
            disk_consistent_lsn: self.disk_consistent_lsn.to_string(),
            gc_cutoff_lsn: self.gc_cutoff_lsn.to_string(),
            contiguous_from: Some(self.contiguous_from.to_string()),
            layers: self
                .layers
                .iter()
                .map(|(name, l)| {
                    let raw = RawLayer {
                        size: l.size,
                        crc32c: l.crc32c,
                        level: l.level.to_string(),
                        generation: l.generation.get(),
                        group_size: Some(l.group_size),
                    };
                    (name.clone(), raw)
                })
                .collect(),
            ancestor_timeline_id: self.ancestry.map(|a| a.timeline_id.to_string()),
            ancestor_lsn: self.ancestry.map(|a| a.lsn.to_string()),
            wal: (!self.wal.is_empty()).then(|| self.wal.to_raw()),
        };
        serde_json::to_vec_pretty(&raw).expect("an index always serializes")
    }

    /// Parses and checks an index; the error says what is wrong.
    pub fn parse(bytes: &[u8]) -> Result<IndexPart, String> {
        let raw: RawIndex = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        let v1 = match raw.version {
            INDEX_VERSION => false,
            INDEX_VERSION_1 => true,
            version => {
                return Err(format!(
                    "index format version {version} (this pageserver reads {INDEX_VERSION_1} and {INDEX_VERSION})"
                ))
            }
        };
        // What version 2 added is there exactly when the version says so.
        let added = |present: bool, what: &str| match (v1, present) {
            (false, false) => Err(format!("{what} is missing (version {INDEX_VERSION})")),
            (true, true) => Err(format!("{what} is not part of version {INDEX_VERSION_1}")),
            _ => Ok(()),
        };
        let generation = Generation::new(raw.generation)
            .ok_or_else(|| "generation 0 names no generation".to_owned())?;
        let lsn = |what: &str, text: &str| {
            text.parse::<Lsn>()
                .map_err(|e| format!("{what} {text:?}: {e}"))
        };
        let disk_consistent_lsn = lsn("disk_consistent_lsn", &raw.disk_consistent_lsn)?;
        let gc_cutoff_lsn = lsn("gc_cutoff_lsn", &raw.gc_cutoff_lsn)?;
        added(raw.contiguous_from.is_some(), "contiguous_from")?;
        let contiguous_from = match &raw.contiguous_from {
            Some(text) => lsn("contiguous_from", text)?,
            // Servers then left gaps where nothing was written: nothing below is checked.
            None => disk_consistent_lsn,
        };
        let ancestry = match (&raw.ancestor_timeline_id, &raw.ancestor_lsn) {
            (None, None) => None,
            (Some(id), Some(text)) => Some(Ancestry {
                timeline_id: id
                    .parse()
                    .map_err(|e| format!("ancestor_timeline_id: {e}"))?,
                lsn: lsn("ancestor_lsn", text)?,
            }),
            _ => return Err("ancestor_timeline_id and ancestor_lsn come together".to_owned()),
        };
        let mut layers = BTreeMap::new();
        for (name, l) in raw.layers {
            let bad = |reason: String| format!("layer {name:?}: {reason}");
            crate::tenant::timeline::layer_set::manifest::check_layer_name(&name)
                .map_err(|r| bad(r.to_owned()))?;
            let parsed: LayerName = name.parse().map_err(|e| bad(format!("{e}")))?;
            let level = match (l.level.as_str(), &parsed) {
                ("L0", LayerName::Delta(_)) => LayerLevel::L0,
                ("L1", LayerName::Delta(_)) => LayerLevel::L1,
                ("image", LayerName::Image(_)) => LayerLevel::Image,
                (level, _) => {
                    return Err(bad(format!(
                        "level {level:?} is not one of L0, L1 (delta layers) or image (image layers) that fits its name"
                    )))
                }
            };
            let layer_generation = Generation::new(l.generation)
                .filter(|g| *g <= generation)
                .ok_or_else(|| {
                    bad(format!(
                        "generation {} is not from 1 to the index's {}",
                        l.generation,
                        generation.get()
                    ))
                })?;
            added(l.group_size.is_some(), "group_size").map_err(bad)?;
            if parsed.lsn_range().end.0.saturating_sub(1) > disk_consistent_lsn.0 {
                return Err(bad(format!(
                    "it reaches beyond disk_consistent_lsn {disk_consistent_lsn}"
                )));
            }
            layers.insert(
                name.clone(),
                IndexLayer {
                    size: l.size,
                    crc32c: l.crc32c,
                    level,
                    generation: layer_generation,
                    group_size: l.group_size.unwrap_or(0),
                },
            );
        }
        Ok(IndexPart {
            tenant_id: raw
                .tenant_id
                .parse()
                .map_err(|e| format!("tenant_id: {e}"))?,
            timeline_id: raw
                .timeline_id
                .parse()
                .map_err(|e| format!("timeline_id: {e}"))?,
            generation,
            disk_consistent_lsn,
            gc_cutoff_lsn,
            contiguous_from,
            layers,
            ancestry,
            wal: match raw.wal {
                Some(wal) => WalIndex::from_raw(wal, generation)?,
                None => WalIndex::default(),
            },
        })
    }

    /// The manifest this index describes (no retired files: the store has none).
    pub fn to_manifest(&self) -> Manifest {
        let mut manifest = Manifest::empty(self.tenant_id, self.timeline_id);
        manifest.disk_consistent_lsn = self.disk_consistent_lsn;
        manifest.gc_cutoff_lsn = self.gc_cutoff_lsn;
        manifest.contiguous_from = self.contiguous_from;
        for (name, l) in &self.layers {
            manifest.add_layer(
                crate::tenant::timeline::layer_set::manifest::LayerFileEntry {
                    name: name.clone(),
                    size: l.size,
                    crc32c: l.crc32c,
                    level: l.level,
                    group_size: l.group_size,
                },
            );
        }
        manifest
    }
}

/// Where a timeline's objects live: `tenants/<tenant>/timelines/<timeline>/`.
pub fn timeline_path(tenant: TenantId, timeline: TimelineId) -> RemotePath {
    RemotePath::new(format!("tenants/{tenant}/timelines/{timeline}")).expect("ids make valid keys")
}

/// A tenant's objects: `tenants/<tenant>/`.
pub fn tenant_path(tenant: TenantId) -> RemotePath {
    RemotePath::new(format!("tenants/{tenant}")).expect("ids make valid keys")
}

/// The object of layer `name` written by `generation`.
pub fn layer_path(
    timeline: &RemotePath,
    name: &str,
    generation: Generation,
) -> Result<RemotePath, RemoteError> {
    timeline.join(&format!("{name}{}", generation.suffix()))
}

/// The index written by `generation`.
pub fn index_path(timeline: &RemotePath, generation: Generation) -> RemotePath {
    timeline
        .join(&format!("{INDEX_FILE_PREFIX}{}", generation.suffix()))
        .expect("a valid key")
}

/// What an object of a timeline's prefix is, by its name.
#[derive(Debug, PartialEq, Eq)]
pub enum RemoteObject {
    Index(Generation),
    Layer {
        name: String,
        generation: Generation,
    },
    /// A WAL segment (`wal_index.rs`), whole or partial.
    Wal {
        name: String,
        partial: bool,
        generation: Generation,
    },
    /// Not an object we write.
    Other,
}

pub fn classify_object(file_name: &str) -> RemoteObject {
    match Generation::split_suffix(file_name) {
        Some((INDEX_FILE_PREFIX, generation)) => RemoteObject::Index(generation),
        Some((name, generation)) if name.parse::<LayerName>().is_ok() => RemoteObject::Layer {
            name: name.to_owned(),
            generation,
        },
        Some((name, generation)) => match parse_object_name(name) {
            Some((segment, partial)) => RemoteObject::Wal {
                name: segment.to_owned(),
                partial,
                generation,
            },
            None => RemoteObject::Other,
        },
        _ => RemoteObject::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> IndexPart {
        let mut manifest = Manifest::empty(TenantId::generate(), TimelineId::generate());
        manifest.disk_consistent_lsn = Lsn(0x30);
        manifest.add_layer(crate::tenant::timeline::layer_set::manifest::LayerFileEntry {
            name: "000000000000000000000000000000000000-ffffffffffffffffffffffffffffffffffff__0000000000000001-0000000000000021".to_owned(),
            size: 8192 * 3,
            crc32c: 0xdead_beef,
            level: LayerLevel::L0,
            group_size: 1,
        });
        IndexPart::from_manifest(&manifest, Generation::new(2).unwrap(), |_| {
            Generation::FIRST
        })
    }

    #[test]
    fn round_trips_through_json() {
        let index = sample();
        let parsed = IndexPart::parse(&index.to_json()).unwrap();
        assert_eq!(parsed, index);
        assert_eq!(parsed.to_manifest().layers.len(), 1);
        assert!(!String::from_utf8(index.to_json())
            .unwrap()
            .contains("ancestor"));
    }

    #[test]
    fn a_branch_index_names_its_ancestor() {
        let mut index = sample();
        index.ancestry = Some(Ancestry {
            timeline_id: TimelineId::generate(),
            lsn: Lsn(0x20),
        });
        let json = String::from_utf8(index.to_json()).unwrap();
        assert_eq!(IndexPart::parse(json.as_bytes()).unwrap(), index);
        let half = json.replace("\"ancestor_lsn\": \"0/20\"", "\"other\": 1");
        assert!(IndexPart::parse(half.as_bytes()).is_err());
        let one = json.replace(",\n  \"ancestor_lsn\": \"0/20\"", "");
        let error = IndexPart::parse(one.as_bytes()).unwrap_err();
        assert!(error.contains("come together"), "{error}: {one}");
    }

    #[test]
    fn untrusted_bytes_are_refused_with_reasons() {
        let good = String::from_utf8(sample().to_json()).unwrap();
        for (edit, says) in [
            (
                good.replace("\"version\": 2", "\"version\": 9"),
                "version 9",
            ),
            (
                good.replace("\"generation\": 2", "\"generation\": 0"),
                "generation 0",
            ),
            (
                good.replace("\"generation\": 1", "\"generation\": 3"),
                "generation 3",
            ),
            (good.replace("\"L0\"", "\"image\""), "level"),
            (good.replace("0/30", "0/1F"), "beyond disk_consistent_lsn"),
            (good.replace("\"size\"", "\"bytes\""), "unknown field"),
            (good.replace("__0000000000000001", "__zz"), "layer"),
            ("[".to_owned(), "EOF"),
        ] {
            let err = IndexPart::parse(edit.as_bytes()).unwrap_err();
            assert!(err.contains(says), "{says}: {err}");
        }
    }

    #[test]
    fn version_1_parses_with_its_history_unchecked_and_version_2_needs_its_fields() {
        let good = String::from_utf8(sample().to_json()).unwrap();
        let v1 = good
            .replace("\"version\": 2", "\"version\": 1")
            .replace(",\n  \"contiguous_from\": \"0/0\"", "")
            .replace(",\n      \"group_size\": 1", "");
        assert!(
            !v1.contains("group_size") && !v1.contains("contiguous_from"),
            "{v1}"
        );
        let index = IndexPart::parse(v1.as_bytes()).unwrap();
        assert_eq!(index.contiguous_from, index.disk_consistent_lsn);
        assert!(index.layers.values().all(|l| l.group_size == 0));
        let manifest = index.to_manifest();
        assert_eq!(manifest.contiguous_from, Lsn(0x30));
        // Written back as version 2, with what version 1 lacked.
        let again = IndexPart::parse(&index.to_json()).unwrap();
        assert_eq!(again, index);
        for (edit, says) in [
            (
                good.replace(",\n  \"contiguous_from\": \"0/0\"", ""),
                "contiguous_from is missing",
            ),
            (
                good.replace(",\n      \"group_size\": 1", ""),
                "group_size is missing",
            ),
            (
                v1.replace(
                    "\"gc_cutoff_lsn\"",
                    "\"contiguous_from\": \"0/0\", \"gc_cutoff_lsn\"",
                ),
                "not part of version 1",
            ),
            (
                good.replace("\"contiguous_from\": \"0/0\"", "\"contiguous_from\": \"x\""),
                "contiguous_from \"x\"",
            ),
        ] {
            let err = IndexPart::parse(edit.as_bytes()).unwrap_err();
            assert!(err.contains(says), "{says}: {err}");
        }
    }

    #[test]
    fn object_names_carry_generations() {
        let tl = timeline_path(TenantId::generate(), TimelineId::generate());
        let g = Generation::new(0x1f).unwrap();
        assert!(index_path(&tl, g)
            .as_str()
            .ends_with("/index_part.json-0000001f"));
        assert_eq!(
            classify_object("index_part.json-0000001f"),
            RemoteObject::Index(g)
        );
        let name = "000000000000000000000000000000000000-ffffffffffffffffffffffffffffffffffff__0000000000000001-0000000000000021";
        let layer = layer_path(&tl, name, g).unwrap();
        assert_eq!(
            classify_object(layer.file_name()),
            RemoteObject::Layer {
                name: name.to_owned(),
                generation: g
            }
        );
        assert_eq!(classify_object("index_part.json"), RemoteObject::Other);
        assert_eq!(classify_object("junk-0000001f"), RemoteObject::Other);
    }
}
