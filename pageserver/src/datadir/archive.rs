//! What both kinds of archive share: the errors of writing one, the WAL a replay gives, and
//! the writing of a member whose bytes are at hand or in a file.

use std::io::{self, Read, Write};

use pageserver_api::datadir::DatadirDecodeError;
use utils::Lsn;

use crate::tenant::timeline::TimelineError;

#[derive(Debug, thiserror::Error)]
pub enum BasebackupError {
    /// Nothing to give at that LSN (404).
    #[error("{0}")]
    NoSnapshot(String),
    #[error(transparent)]
    Timeline(#[from] TimelineError),
    /// No archive without replay at that LSN (422).
    #[error("{0}")]
    NotMaterialized(String),
    #[error("the timeline's stored data directory is damaged: {0}")]
    Damaged(String),
    /// Writing the archive failed (the client went away).
    #[error("writing the archive failed: {0}")]
    Write(#[from] io::Error),
}

impl From<DatadirDecodeError> for BasebackupError {
    fn from(e: DatadirDecodeError) -> Self {
        BasebackupError::Damaged(e.to_string())
    }
}

/// WAL to replay on top of a snapshot: the LSN asked for, the end of the last record at or
/// before it (where the WAL given is cut: the rest of its segment is zeros, so a replay of
/// everything given stops exactly there), and the segment files from the snapshot to it.
#[derive(Debug)]
pub struct Replay {
    pub target: Lsn,
    pub end: Lsn,
    /// The timeline of the WAL at `end`, recovery's target timeline.
    pub tli: u32,
    /// The history files (name, contents) of that timeline's line past timeline 1.
    pub history: Vec<(String, Vec<u8>)>,
    /// Whether the WAL stored goes on past `target`.
    pub goes_on: bool,
    /// The last record that ends at or before `target` (at `end`, unless none ends in the
    /// segments decoded): where it starts and ends, and whether it is an `XLOG_SWITCH` (the
    /// rest of its segment is padding).
    pub last_record: Option<(Lsn, Lsn, bool)>,
    /// Opened when the replay was planned, so that a rename of a segment (the one being
    /// filled becomes whole) does not pull it away from the archive.
    pub segments: Vec<(String, std::fs::File)>,
}

/// Reads a shared file from its start, positionally (the file's cursor is not ours).
pub struct PositionalReader<'a> {
    pub file: &'a std::fs::File,
    pub at: u64,
}

impl Read for PositionalReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = std::os::unix::fs::FileExt::read_at(self.file, buf, self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}

/// Appends a regular file member of `bytes`.
pub fn append_file<W: Write>(
    tar: &mut tar::Builder<W>,
    path: &str,
    mode: u32,
    mtime: u64,
    bytes: &[u8],
) -> io::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_mode(mode);
    header.set_mtime(mtime);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(bytes.len() as u64);
    tar.append_data(&mut header, path, bytes)
}
