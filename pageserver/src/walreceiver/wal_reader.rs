//! The stored WAL read back in order, a chunk at a time: what page ingest and background
//! snapshots decode behind the receiver.
//!
//! A reader goes forward from where its caller is; a chunk never crosses a segment's end (each
//! segment is a file of its own) nor the flushed LSN (the bytes past it may still be written).
//! The file of the segment being read stays open until the reader moves to the next segment,
//! which it finds under the latest PostgreSQL timeline stored for it (a timeline switch renames
//! a segment to the new timeline's name).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use postgres_wal::segment::{segment_start, segno_of};
use utils::Lsn;

use super::replay_plan::latest_segment_file;

pub(super) struct WalReader {
    segment_size: u32,
    /// The segment file being read, by segment number.
    open: Option<(u64, File)>,
}

impl WalReader {
    pub(super) fn new(segment_size: u32) -> WalReader {
        WalReader {
            segment_size,
            open: None,
        }
    }

    /// The stored WAL of `timeline_dir` from `from`: at most `max` bytes, up to `flushed` and
    /// the end of `from`'s segment; empty when `from` is at or past `flushed`.
    pub(super) fn read(
        &mut self,
        timeline_dir: &Path,
        from: Lsn,
        flushed: Lsn,
        max: u64,
    ) -> Result<Vec<u8>, String> {
        if from >= flushed {
            return Ok(Vec::new());
        }
        let size = self.segment_size;
        let segno = segno_of(from, size);
        let end = flushed
            .min(segment_start(segno + 1, size))
            .min(Lsn(from.0 + max));
        if self.open.as_ref().is_none_or(|(open, _)| *open != segno) {
            let path = latest_segment_file(timeline_dir, segno, size).ok_or_else(|| {
                format!(
                    "the WAL segment that holds {} is not stored",
                    segment_start(segno, size)
                )
            })?;
            let file = File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            self.open = Some((segno, file));
        }
        let (_, file) = self.open.as_ref().expect("opened above");
        let mut bytes = vec![0u8; (end.0 - from.0) as usize];
        file.read_exact_at(&mut bytes, from.0 - segment_start(segno, size).0)
            .map_err(|e| format!("reading the WAL at {from}: {e}"))?;
        Ok(bytes)
    }
}
