//! WAL file names and where segments sit in the LSN space.
//!
//! A segment's name is three groups of 8 hex digits: its timeline (TLI), then its number
//! split as `segno / segments_per_xlogid` and `segno % segments_per_xlogid`, where
//! `segments_per_xlogid = 2^32 / segment_size` (PostgreSQL's `XLogFileName`). A timeline's
//! history file is its TLI in 8 hex digits and `.history`.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use utils::Lsn;

/// The suffix of a segment still being filled (`pg_receivewal`'s, and PostgreSQL's for the
/// last segment of a timeline it left).
pub const PARTIAL_SUFFIX: &str = ".partial";

/// A segment file found in a directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentFile {
    pub segment: SegmentName,
    pub path: PathBuf,
    /// Named with [`PARTIAL_SUFFIX`].
    pub partial: bool,
}

/// The segment files of `segment_size` in `dir`, whole or partial, in no order; nothing for a
/// directory that does not exist. Other files are left out.
pub fn segment_files_in(dir: &Path, segment_size: u32) -> io::Result<Vec<SegmentFile>> {
    let entries = match std::fs::read_dir(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        entries => entries?,
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let (base, partial) = match name.strip_suffix(PARTIAL_SUFFIX) {
            Some(base) => (base, true),
            None => (name, false),
        };
        if let Some(segment) = SegmentName::parse(base, segment_size) {
            found.push(SegmentFile {
                segment,
                path: entry.path(),
                partial,
            });
        }
    }
    Ok(found)
}

/// A WAL segment: the timeline it belongs to and its number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SegmentName {
    pub tli: u32,
    pub segno: u64,
}

/// The segment number that holds `lsn`.
pub fn segno_of(lsn: Lsn, segment_size: u32) -> u64 {
    lsn.0 / u64::from(segment_size)
}

/// The LSN of the first byte of segment `segno`.
pub fn segment_start(segno: u64, segment_size: u32) -> Lsn {
    Lsn(segno * u64::from(segment_size))
}

/// Whether `size` is a segment size PostgreSQL allows: a power of two from 1 MiB to 1 GiB.
pub fn is_valid_segment_size(size: u32) -> bool {
    size.is_power_of_two() && ((1 << 20)..=(1 << 30)).contains(&size)
}

impl SegmentName {
    /// The segment of timeline `tli` that holds `lsn`.
    pub fn of(tli: u32, lsn: Lsn, segment_size: u32) -> SegmentName {
        SegmentName {
            tli,
            segno: segno_of(lsn, segment_size),
        }
    }

    /// The LSN of its first byte.
    pub fn start(&self, segment_size: u32) -> Lsn {
        segment_start(self.segno, segment_size)
    }

    /// Its file name, as PostgreSQL writes it.
    pub fn file_name(&self, segment_size: u32) -> String {
        let per_id = (1u64 << 32) / u64::from(segment_size);
        format!(
            "{:08X}{:08X}{:08X}",
            self.tli,
            self.segno / per_id,
            self.segno % per_id
        )
    }

    /// Parses a segment file name (24 hex digits, upper or lower case; a `.partial` suffix is
    /// not part of it). `None` for anything else, and for a name whose low part is not a
    /// segment of `segment_size`.
    pub fn parse(name: &str, segment_size: u32) -> Option<SegmentName> {
        if name.len() != 24 || !name.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let tli = u32::from_str_radix(&name[0..8], 16).ok()?;
        let high = u64::from_str_radix(&name[8..16], 16).ok()?;
        let low = u64::from_str_radix(&name[16..24], 16).ok()?;
        let per_id = (1u64 << 32) / u64::from(segment_size);
        if low >= per_id {
            return None;
        }
        Some(SegmentName {
            tli,
            segno: high.checked_mul(per_id)?.checked_add(low)?,
        })
    }
}

impl fmt::Display for SegmentName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "timeline {} segment {}", self.tli, self.segno)
    }
}

/// The name of timeline `tli`'s history file.
pub fn history_file_name(tli: u32) -> String {
    format!("{tli:08X}.history")
}

/// The timeline of a history file name (`00000002.history`).
pub fn parse_history_file_name(name: &str) -> Option<u32> {
    let hex = name.strip_suffix(".history")?;
    if hex.len() != 8 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SEG: u32 = 16 << 20;

    #[test]
    fn names_are_postgres_names() {
        let name = SegmentName::of(1, Lsn(0x0300_0000), SEG);
        assert_eq!(name.file_name(SEG), "000000010000000000000003");
        let far = SegmentName::of(2, Lsn(0x1_2300_0000), SEG);
        assert_eq!(far.file_name(SEG), "000000020000000100000023");
        assert_eq!(
            SegmentName::parse("000000020000000100000023", SEG),
            Some(far)
        );
        // The low part holds at most 2^32 / segment size segments.
        assert_eq!(SegmentName::parse("000000010000000000000100", SEG), None);
        assert_eq!(SegmentName::parse("00000001000000000000003", SEG), None);
        assert_eq!(SegmentName::parse("00000001000000000000000G", SEG), None);
        assert_eq!(history_file_name(2), "00000002.history");
        assert_eq!(parse_history_file_name("0000000A.history"), Some(10));
        assert_eq!(parse_history_file_name("0000000A.partial"), None);
        assert!(is_valid_segment_size(SEG) && !is_valid_segment_size(3 << 20));
    }

    proptest! {
        #[test]
        fn a_name_parses_back(tli in 1u32.., lsn in 0u64..(1 << 48), shift in 20u32..=30) {
            let size = 1u32 << shift;
            let name = SegmentName::of(tli, Lsn(lsn), size);
            prop_assert_eq!(SegmentName::parse(&name.file_name(size), size), Some(name));
            prop_assert!(name.start(size).0 <= lsn && lsn < name.start(size).0 + u64::from(size));
        }
    }
}
