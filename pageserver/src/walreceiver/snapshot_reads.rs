//! What of a replayed directory's relation files a background snapshot's import reads, when
//! the directory was kept from the snapshot before (`snapshots.rs`): only what the replay may
//! have written since, as the WAL it replayed says ([`Touched`]).
//!
//! A relation segment file, which the directory held as imported at the kept snapshot (same
//! path) and which is not empty, is read:
//!
//! - not at all when the WAL names no fork of its relation and its stamp (size, times, inode)
//!   is as it was at that import;
//! - in part when it is of a main fork whose blocks the WAL names, and the same file (inode):
//!   those blocks, and every block past its size at that import (redo extends a relation with
//!   empty pages up to a block it names);
//! - whole otherwise: a new file, another fork of a relation named (the visibility map and
//!   free space map pages redo changes without naming them), a relation an smgr record names
//!   (created, truncated), a file that shrank or was made again, a stamp that changed where
//!   nothing was named, or any file after a database or tablespace record (`Touched`).
//!
//! Why this holds: the blocks of a file left unread are, at the kept snapshot, what the
//! timeline stores there (that import read or kept them); no WAL record since names them, so
//! redo did not write them and page ingest stored no version of them since. Both conditions
//! are needed: page ingest stores versions of every page a record names, also where redo
//! leaves the file as it was; and a stamp alone could miss a write on a file system with
//! coarse times.

use std::collections::BTreeMap;

use pageserver_api::datadir::{BLCKSZ, RELSEG_BLOCKS};

use super::replayed_files::FileStamp;
use super::snapshot_scan::{Named, Touched};
use crate::datadir::PartlyRead;

/// The relation files of the replayed directory (`stamps`) that the import reads in part or
/// not at all (the others it reads whole), `kept` being the stamps of those the directory held
/// when the kept snapshot was imported (none: it was made afresh, and every file is read).
pub(super) fn partly_read(
    stamps: &BTreeMap<String, FileStamp>,
    kept: Option<&BTreeMap<String, FileStamp>>,
    touched: &Touched,
) -> Vec<PartlyRead> {
    let Some(kept) = kept else {
        return Vec::new();
    };
    stamps
        .iter()
        .filter_map(|(path, stamp)| {
            let before = kept.get(path)?;
            let (rel, segno) = crate::datadir::relation_of_file(path)?;
            if stamp.len == 0 {
                return None;
            }
            let blocks = match touched.named(rel.spcnode, rel.dbnode, rel.relnode, rel.forknum) {
                Named::Nothing if stamp == before => Vec::new(),
                Named::Blocks(named) if stamp.same_inode(before) => {
                    blocks_to_read(named, segno, before.len, stamp.len)?
                }
                _ => return None,
            };
            Some(PartlyRead {
                path: path.clone(),
                size: stamp.len,
                blocks,
            })
        })
        .collect()
}

/// The blocks to read (numbered within the file) of segment `segno` of a main fork whose
/// blocks `named` (numbered within the relation) the WAL names, `before` bytes long at the
/// kept snapshot and `now` bytes long: those named, and those past `before`. None: the whole
/// file (it shrank, or it would be read whole anyway).
fn blocks_to_read(
    named: &std::collections::BTreeSet<u32>,
    segno: u32,
    before: u64,
    now: u64,
) -> Option<Vec<u32>> {
    let block = BLCKSZ as u64;
    if before > now || !before.is_multiple_of(block) || !now.is_multiple_of(block) {
        return None;
    }
    let (held, blocks) = ((before / block) as u32, (now / block) as u32);
    let first = segno.checked_mul(RELSEG_BLOCKS)?;
    let mut read: Vec<u32> = named
        .range(first..first.saturating_add(held))
        .map(|b| b - first)
        .collect();
    read.extend(held..blocks);
    (read.len() < blocks as usize).then_some(read)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn a_main_fork_reads_the_blocks_named_and_those_past_its_old_size() {
        let named = BTreeSet::from([1, 5, 20, RELSEG_BLOCKS + 2, RELSEG_BLOCKS + 40]);
        let b = BLCKSZ as u64;
        assert_eq!(blocks_to_read(&named, 0, 10 * b, 10 * b), Some(vec![1, 5]));
        // Grown from 10 to 22 blocks: 20 is among those past the old size.
        assert_eq!(
            blocks_to_read(&named, 0, 10 * b, 22 * b),
            Some(vec![1, 5, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21])
        );
        // The second segment numbers its blocks from its own start.
        assert_eq!(
            blocks_to_read(&named, 1, 10 * b, 12 * b),
            Some(vec![2, 10, 11])
        );
        // Every block read, or a file that shrank or is not whole blocks: read whole.
        assert_eq!(
            blocks_to_read(&BTreeSet::from([0, 1]), 0, 2 * b, 2 * b),
            None
        );
        assert_eq!(blocks_to_read(&named, 0, 3 * b, 2 * b), None);
        assert_eq!(blocks_to_read(&named, 0, 3 * b, 2 * b + 1), None);
    }
}
