//! The remote index's WAL section: which of the timeline's WAL files the object store holds,
//! and the WAL receiver's settings, so that an attach elsewhere streams on where this one
//! stopped.
//!
//! ```json
//! "wal": {
//!   "segment_size": 16777216,
//!   "segments": {
//!     "000000010000000000000003": { "len": 16777216, "crc32c": 3735928559, "generation": 2,
//!       "commits": { "first_lsn": "0/3000148", "first_time": 1795737600000000,
//!                    "last_lsn": "0/3FFF0A0", "last_time": 1795737612345678 } }
//!   },
//!   "partial": { "name": "000000010000000000000004", "len": 2301952, "crc32c": 1234, "generation": 2 },
//!   "receiver": { "connstr": "host=…", "slot_name": "…", "application_name": "…" },
//!   "history": { "00000002.history": "1\t0/5000100\tno recovery target specified\n" }
//! }
//! ```
//!
//! `history` holds the timeline history files of the PostgreSQL timelines the WAL went
//! through, whole (each a line per promotion: small), checked as PostgreSQL's own reader
//! would ([`postgres_wal::history`]).
//!
//! A whole segment is the object `wal/<name>-<generation>`, exactly `len` bytes of that
//! CRC-32C. The partial tail (at most one, newer than every whole segment) is the object
//! `wal/<name>.partial-<generation>`: its first `len` bytes have that CRC-32C. The archive
//! writes a longer tail over the same object before the index says so; WAL only grows, so the
//! bytes an index vouches for stay the object's first ones.
//!
//! The receiver's settings include its connection string, password and all: the store that
//! holds every page of the cluster is trusted with what lets a replica read them.
//!
//! `commits` (optional) is the first and last commit whose record ends in the segment (end LSN,
//! and time in microseconds since the Unix epoch): the index a search by time starts from
//! (`wal_commits.rs`).
//!
//! `archived_lsn` is where the section's WAL ends: everything below it can be fetched from the
//! store alone.

use std::collections::BTreeMap;

use postgres_wal::history::TimelineHistory;
use postgres_wal::segment::{is_valid_segment_size, parse_history_file_name, SegmentName};
use postgres_wal::xact::CommitRange;
use serde::{Deserialize, Serialize};
use utils::{Generation, Lsn};

/// The suffix of a partial segment's name (as `pg_receivewal` writes it).
pub const PARTIAL_SUFFIX: &str = ".partial";
/// The folder of WAL objects, in the timeline's prefix.
pub const WAL_PREFIX: &str = "wal";
/// Far beyond a connection string and two names.
const MAX_RECEIVER_SETTINGS_BYTES: usize = 16 << 10;
/// History files: each at most `postgres_wal::history::MAX_HISTORY_LEN` long (the parser
/// refuses longer ones), and at most this many in an index.
pub const MAX_HISTORY_FILES: usize = 1024;

/// One WAL object the section lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArchivedFile {
    /// A whole segment's size, or how much of a partial one the store holds.
    pub len: u64,
    /// Of those `len` bytes.
    pub crc32c: u32,
    /// The generation whose object holds it.
    pub generation: Generation,
    /// Its first and last commit (`wal_commits.rs`), when it has any and they were read.
    pub commits: Option<CommitRange>,
}

/// See the module documentation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WalIndex {
    /// 0 until the first segment is archived.
    pub segment_size: u32,
    pub segments: BTreeMap<String, ArchivedFile>,
    pub partial: Option<(String, ArchivedFile)>,
    /// The WAL receiver's settings, as `walreceiver` stores them.
    pub receiver: Option<serde_json::Value>,
    /// Timeline history files by name (`00000002.history`).
    pub history: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWal {
    segment_size: u32,
    #[serde(default)]
    segments: BTreeMap<String, RawFile>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    partial: Option<RawPartial>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    receiver: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    history: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    len: u64,
    crc32c: u32,
    generation: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    commits: Option<RawCommits>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPartial {
    name: String,
    len: u64,
    crc32c: u32,
    generation: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    commits: Option<RawCommits>,
}

/// A segment's first and last commit: end LSNs, and times in microseconds since the Unix
/// epoch.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCommits {
    first_lsn: String,
    first_time: i64,
    last_lsn: String,
    last_time: i64,
}

impl RawCommits {
    fn of(range: &CommitRange) -> RawCommits {
        RawCommits {
            first_lsn: range.first_end.to_string(),
            first_time: range.first_time,
            last_lsn: range.last_end.to_string(),
            last_time: range.last_time,
        }
    }

    /// The range, checked to lie in segment `segment` (its commits end in it, in order).
    fn check(&self, name: &str, segment: SegmentName, size: u32) -> Result<CommitRange, String> {
        let lsn = |text: &str| {
            text.parse::<Lsn>()
                .map_err(|e| format!("WAL file {name:?}: commits: {text:?}: {e}"))
        };
        let range = CommitRange {
            first_end: lsn(&self.first_lsn)?,
            first_time: self.first_time,
            last_end: lsn(&self.last_lsn)?,
            last_time: self.last_time,
        };
        let start = segment.start(size);
        let end = Lsn(start.0.saturating_add(u64::from(size)));
        let inside = |l: Lsn| l > start && l <= end;
        if !(inside(range.first_end) && inside(range.last_end)) || range.first_end > range.last_end
        {
            return Err(format!(
                "WAL file {name:?}: its commits' LSNs are not in order within the segment"
            ));
        }
        Ok(range)
    }
}

impl WalIndex {
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
            && self.partial.is_none()
            && self.receiver.is_none()
            && self.history.is_empty()
    }

    /// Just past the last byte of WAL the section lists; `None` when it lists none.
    pub fn archived_lsn(&self) -> Option<Lsn> {
        let size = self.segment_size;
        let whole = self
            .segments
            .keys()
            .filter_map(|n| SegmentName::parse(n, size))
            .map(|s| Lsn(s.start(size).0.saturating_add(u64::from(size))))
            .max();
        let partial = self.partial.as_ref().and_then(|(name, f)| {
            SegmentName::parse(name, size).map(|s| Lsn(s.start(size).0.saturating_add(f.len)))
        });
        whole.max(partial)
    }

    /// The object key, under the timeline's prefix, of WAL file `name` written by
    /// `generation`.
    pub fn object_name(name: &str, partial: bool, generation: Generation) -> String {
        let suffix = if partial { PARTIAL_SUFFIX } else { "" };
        format!("{WAL_PREFIX}/{name}{suffix}{}", generation.suffix())
    }

    /// Every object the section lists, by key under the timeline's prefix.
    pub fn object_names(&self) -> Vec<String> {
        let whole = self
            .segments
            .iter()
            .map(|(n, f)| WalIndex::object_name(n, false, f.generation));
        let partial = self
            .partial
            .iter()
            .map(|(n, f)| WalIndex::object_name(n, true, f.generation));
        whole.chain(partial).collect()
    }

    pub(super) fn to_raw(&self) -> RawWal {
        let file = |f: &ArchivedFile| RawFile {
            len: f.len,
            crc32c: f.crc32c,
            generation: f.generation.get(),
            commits: f.commits.as_ref().map(RawCommits::of),
        };
        RawWal {
            segment_size: self.segment_size,
            segments: self
                .segments
                .iter()
                .map(|(n, f)| (n.clone(), file(f)))
                .collect(),
            partial: self.partial.as_ref().map(|(name, f)| RawPartial {
                name: name.clone(),
                len: f.len,
                crc32c: f.crc32c,
                generation: f.generation.get(),
                commits: f.commits.as_ref().map(RawCommits::of),
            }),
            receiver: self.receiver.clone(),
            history: self.history.clone(),
        }
    }

    /// Checks a section read from an index written by `generation`; the error says what is
    /// wrong.
    pub(super) fn from_raw(raw: RawWal, generation: Generation) -> Result<WalIndex, String> {
        let size = raw.segment_size;
        let listed = !raw.segments.is_empty() || raw.partial.is_some();
        if listed && !is_valid_segment_size(size) {
            return Err(format!(
                "wal.segment_size {size} is not a WAL segment size (a power of two from 1 MiB to 1 GiB)"
            ));
        }
        let file_generation = |name: &str, g: u32| {
            Generation::new(g)
                .filter(|g| *g <= generation)
                .ok_or_else(|| {
                    format!(
                        "WAL file {name:?}: generation {g} is not from 1 to the index's {}",
                        generation.get()
                    )
                })
        };
        let segment = |name: &str| {
            SegmentName::parse(name, size)
                // The last segment of the LSN space would end past it.
                .filter(|s| s.start(size).0.checked_add(u64::from(size)).is_some())
                .ok_or_else(|| {
                    format!("WAL file {name:?} is not a segment name for segment size {size}")
                })
        };
        let mut segments = BTreeMap::new();
        let mut newest = None;
        for (name, f) in raw.segments {
            let parsed = segment(&name)?;
            if f.len != u64::from(size) {
                return Err(format!(
                    "WAL segment {name:?}: {} bytes, not the segment size {size}",
                    f.len
                ));
            }
            newest = newest.max(Some((parsed.segno, parsed.tli)));
            let generation = file_generation(&name, f.generation)?;
            let commits = f
                .commits
                .as_ref()
                .map(|c| c.check(&name, parsed, size))
                .transpose()?;
            segments.insert(
                name,
                ArchivedFile {
                    len: f.len,
                    crc32c: f.crc32c,
                    generation,
                    commits,
                },
            );
        }
        let partial = match raw.partial {
            None => None,
            Some(p) => {
                let parsed = segment(&p.name)?;
                if p.len == 0 || p.len >= u64::from(size) {
                    return Err(format!(
                        "the partial WAL segment {:?}: {} bytes, not from 1 to below the segment size {size}",
                        p.name, p.len
                    ));
                }
                if newest.is_some_and(|n| n >= (parsed.segno, parsed.tli)) {
                    return Err(format!(
                        "the partial WAL segment {:?} is not newer than every whole one",
                        p.name
                    ));
                }
                let generation = file_generation(&p.name, p.generation)?;
                let commits = p
                    .commits
                    .as_ref()
                    .map(|c| c.check(&p.name, parsed, size))
                    .transpose()?;
                Some((
                    p.name,
                    ArchivedFile {
                        len: p.len,
                        crc32c: p.crc32c,
                        generation,
                        commits,
                    },
                ))
            }
        };
        if let Some(receiver) = &raw.receiver {
            if !receiver.is_object() || receiver.to_string().len() > MAX_RECEIVER_SETTINGS_BYTES {
                return Err(format!(
                    "wal.receiver: an object of at most {MAX_RECEIVER_SETTINGS_BYTES} bytes"
                ));
            }
        }
        if raw.history.len() > MAX_HISTORY_FILES {
            return Err(format!(
                "wal.history: {} files, more than {MAX_HISTORY_FILES}",
                raw.history.len()
            ));
        }
        for (name, contents) in &raw.history {
            let tli = parse_history_file_name(name).ok_or_else(|| {
                format!("wal.history: {name:?} is not a history file name (00000002.history)")
            })?;
            TimelineHistory::parse(tli, contents.as_bytes())
                .map_err(|e| format!("wal.history: {e}"))?;
        }
        Ok(WalIndex {
            segment_size: size,
            segments,
            partial,
            receiver: raw.receiver,
            history: raw.history,
        })
    }
}

/// The WAL file an object's name (without its generation) stands for: a segment's name, and
/// whether it is a partial one.
pub fn parse_object_name(name: &str) -> Option<(&str, bool)> {
    let (base, partial) = match name.strip_suffix(PARTIAL_SUFFIX) {
        Some(base) => (base, true),
        None => (name, false),
    };
    (base.len() == 24 && base.bytes().all(|b| b.is_ascii_hexdigit())).then_some((base, partial))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEG: u32 = 16 << 20;

    fn g(n: u32) -> Generation {
        Generation::new(n).unwrap()
    }

    fn sample() -> WalIndex {
        let file = |len, gen| ArchivedFile {
            len,
            crc32c: 7,
            generation: g(gen),
            commits: None,
        };
        WalIndex {
            segment_size: SEG,
            segments: [
                ("000000010000000000000003".to_owned(), file(SEG.into(), 1)),
                (
                    "000000010000000000000004".to_owned(),
                    ArchivedFile {
                        commits: Some(CommitRange {
                            first_end: Lsn(4 * u64::from(SEG) + 100),
                            first_time: 1_795_737_600_000_000,
                            last_end: Lsn(5 * u64::from(SEG)),
                            last_time: 1_795_737_601_000_000,
                        }),
                        ..file(SEG.into(), 2)
                    },
                ),
            ]
            .into(),
            partial: Some(("000000010000000000000005".to_owned(), file(4096, 2))),
            receiver: Some(serde_json::json!({"connstr": "host=127.0.0.1"})),
            history: [(
                "00000002.history".to_owned(),
                "1\t0/3000100\tno recovery target specified\n".to_owned(),
            )]
            .into(),
        }
    }

    #[test]
    fn round_trips_and_names_where_its_wal_ends() {
        let wal = sample();
        let back = WalIndex::from_raw(
            serde_json::from_slice(&serde_json::to_vec(&wal.to_raw()).unwrap()).unwrap(),
            g(2),
        )
        .unwrap();
        assert_eq!(back, wal);
        assert_eq!(wal.archived_lsn(), Some(Lsn(5 * u64::from(SEG) + 4096)));
        assert_eq!(
            wal.object_names(),
            vec![
                "wal/000000010000000000000003-00000001",
                "wal/000000010000000000000004-00000002",
                "wal/000000010000000000000005.partial-00000002",
            ]
        );
        let mut whole_only = wal.clone();
        whole_only.partial = None;
        assert_eq!(whole_only.archived_lsn(), Some(Lsn(5 * u64::from(SEG))));
        assert_eq!(WalIndex::default().archived_lsn(), None);
    }

    #[test]
    fn untrusted_sections_are_refused_with_reasons() {
        let refused = |edit: &dyn Fn(&mut serde_json::Value), generation: u32| {
            let mut json = serde_json::to_value(sample().to_raw()).unwrap();
            edit(&mut json);
            WalIndex::from_raw(serde_json::from_value(json).unwrap(), g(generation)).unwrap_err()
        };
        let e = refused(&|j| j["segment_size"] = 1000.into(), 2);
        assert!(e.contains("segment size"), "{e}");
        let e = refused(&|_| {}, 1);
        assert!(e.contains("generation 2"), "{e}");
        let e = refused(
            &|j| j["segments"]["000000010000000000000003"]["len"] = 5.into(),
            2,
        );
        assert!(e.contains("5 bytes"), "{e}");
        let e = refused(
            &|j| j["partial"]["name"] = "000000010000000000000004".into(),
            2,
        );
        assert!(e.contains("not newer"), "{e}");
        let e = refused(&|j| j["partial"]["len"] = SEG.into(), 2);
        assert!(e.contains("below the segment size"), "{e}");
        let e = refused(&|j| j["partial"]["name"] = "../../x".into(), 2);
        assert!(e.contains("not a segment name"), "{e}");
        let e = refused(&|j| j["history"]["../00000002.history"] = "".into(), 2);
        assert!(e.contains("not a history file name"), "{e}");
        let e = refused(
            &|j| j["history"]["00000002.history"] = "2\t0/3000100\tx\n".into(),
            2,
        );
        assert!(e.contains("not an ancestor"), "{e}");
        let e = refused(
            &|j| j["history"]["00000002.history"] = "#".repeat(65 << 10).into(),
            2,
        );
        assert!(e.contains("more than"), "{e}");
        let e = refused(
            &|j| {
                j["segments"]["000000010000000000000004"]["commits"]["last_lsn"] =
                    "0/6000000".into()
            },
            2,
        );
        assert!(e.contains("not in order within the segment"), "{e}");
        let e = refused(
            &|j| {
                let f = j["segments"]["000000010000000000000003"].clone();
                j["segments"]["00000001FFFFFFFF000000FF"] = f;
            },
            2,
        );
        assert!(e.contains("not a segment name"), "{e}");
        let e = refused(&|j| j["receiver"] = "text".into(), 2);
        assert!(e.contains("wal.receiver"), "{e}");
    }

    #[test]
    fn object_names_say_what_they_hold() {
        assert_eq!(
            parse_object_name("000000010000000000000005.partial"),
            Some(("000000010000000000000005", true))
        );
        assert_eq!(
            parse_object_name("000000010000000000000005"),
            Some(("000000010000000000000005", false))
        );
        assert_eq!(parse_object_name("00000002.history"), None);
        assert_eq!(parse_object_name("index_part.json"), None);
    }
}
