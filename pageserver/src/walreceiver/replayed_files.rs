//! The files of a directory a background snapshot's replay shut down with, as the import
//! takes them (`snapshots.rs`): their stamps, which say whether a file was written since the
//! last import, and a tar archive of the directory that holds of some relation files only the
//! blocks the replay may have written (`snapshot_reads.rs` says which).

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use pageserver_api::datadir::BLCKSZ;

use crate::datadir::PartlyRead;

/// Writes `dir` as a tar archive to `out`: directories before what they hold, names sorted,
/// modes as they are; of the relation files in `partly_read` (paths relative to `dir`), only
/// the blocks listed, one after the other, and none of those that list none (the import
/// takes the rest as stored: `import_replayed`). The import reads it as it would a
/// `pg_basebackup`'s.
pub fn tar_dir(dir: &Path, out: impl Write, partly_read: &[PartlyRead]) -> io::Result<()> {
    // Not dropped on an error: a builder's drop ends the archive, and the import must see a
    // cut-off one (and store nothing), never a short archive that looks whole.
    let mut tar = std::mem::ManuallyDrop::new(tar::Builder::new(out));
    tar.mode(tar::HeaderMode::Complete);
    tar.follow_symlinks(false);
    let partly_read: BTreeMap<&str, &PartlyRead> =
        partly_read.iter().map(|f| (f.path.as_str(), f)).collect();
    append_tree(&mut tar, dir, "", &partly_read)?;
    tar.finish()?;
    // SAFETY: taken once, and `tar` is not used after.
    drop(unsafe { std::mem::ManuallyDrop::take(&mut tar) });
    Ok(())
}

fn append_tree(
    tar: &mut tar::Builder<impl Write>,
    dir: &Path,
    prefix: &str,
    partly_read: &BTreeMap<&str, &PartlyRead>,
) -> io::Result<()> {
    let mut entries: Vec<_> = fs::read_dir(dir)?.collect::<io::Result<_>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = entry.file_name();
        let name = name
            .to_str()
            .ok_or_else(|| io::Error::other(format!("a file name that is not UTF-8: {name:?}")))?;
        let path = format!("{prefix}{name}");
        let kind = entry.file_type()?;
        if kind.is_dir() {
            tar.append_dir(&path, entry.path())?;
            append_tree(tar, &entry.path(), &format!("{path}/"), partly_read)?;
        } else if let Some(file) = partly_read.get(path.as_str()) {
            if !file.blocks.is_empty() {
                append_blocks(tar, &entry.path(), &path, file)?;
            }
        } else {
            // Symlinks too, as they are (the import refuses them, saying which).
            tar.append_path_with_name(entry.path(), &path)?;
        }
    }
    Ok(())
}

/// The blocks of `file` listed, one after the other, as a member named `path`.
fn append_blocks(
    tar: &mut tar::Builder<impl Write>,
    at: &Path,
    path: &str,
    file: &PartlyRead,
) -> io::Result<()> {
    let opened = fs::File::open(at)?;
    let mut header = tar::Header::new_gnu();
    header.set_metadata_in_mode(&opened.metadata()?, tar::HeaderMode::Complete);
    header.set_size(file.blocks.len() as u64 * BLCKSZ as u64);
    let blocks = BlocksReader {
        file: opened,
        blocks: file.blocks.iter(),
        page: Box::new([0; BLCKSZ]),
        at: BLCKSZ,
    };
    tar.append_data(&mut header, path, blocks)
}

/// Reads the listed blocks of a file one after the other.
struct BlocksReader<'a> {
    file: fs::File,
    blocks: std::slice::Iter<'a, u32>,
    page: Box<[u8; BLCKSZ]>,
    /// How much of `page` was read out.
    at: usize,
}

impl Read for BlocksReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.at == BLCKSZ {
            let Some(block) = self.blocks.next() else {
                return Ok(0);
            };
            // A block past the end is an error (`UnexpectedEof`): the file is not as listed.
            self.file
                .read_exact_at(&mut self.page[..], u64::from(*block) * BLCKSZ as u64)?;
            self.at = 0;
        }
        let n = buf.len().min(BLCKSZ - self.at);
        buf[..n].copy_from_slice(&self.page[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// What says a file was not written since: its size, modification and change times to the
/// nanosecond, and its inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStamp {
    pub len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    ino: u64,
}

impl FileStamp {
    /// Whether `other` is of the same file (inode): written since or not, not another file
    /// made at its path.
    pub fn same_inode(&self, other: &FileStamp) -> bool {
        self.ino == other.ino
    }
}

/// The stamp of every relation segment file under `dir` (regular files only, symlinks not
/// followed), by path relative to `dir`.
pub fn relation_file_stamps(dir: &Path) -> io::Result<BTreeMap<String, FileStamp>> {
    use std::os::unix::fs::MetadataExt;
    let mut stamps = BTreeMap::new();
    let mut dirs = vec![(dir.to_owned(), String::new())];
    while let Some((at, prefix)) = dirs.pop() {
        for entry in fs::read_dir(&at)? {
            let entry = entry?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            let path = format!("{prefix}{name}");
            let kind = entry.file_type()?;
            if kind.is_dir() {
                dirs.push((entry.path(), format!("{path}/")));
            } else if kind.is_file() && crate::datadir::relation_of_file(&path).is_some() {
                let m = entry.metadata()?;
                let stamp = FileStamp {
                    len: m.len(),
                    mtime: (m.mtime(), m.mtime_nsec()),
                    ctime: (m.ctime(), m.ctime_nsec()),
                    ino: m.ino(),
                };
                stamps.insert(path, stamp);
            }
        }
    }
    Ok(stamps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_read_in_part_hold_the_blocks_listed_and_those_read_not_at_all_are_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("base/5");
        fs::create_dir_all(&db).unwrap();
        let rel: Vec<u8> = (0..4 * BLCKSZ).map(|i| (i / BLCKSZ) as u8 + 1).collect();
        fs::write(db.join("16384"), &rel).unwrap();
        fs::write(db.join("16385"), &rel[..BLCKSZ]).unwrap();
        fs::write(db.join("16386"), &rel[..BLCKSZ]).unwrap();
        fs::write(db.join("PG_VERSION"), b"15\n").unwrap();
        let partly_read = |path: &str, blocks: Vec<u32>| PartlyRead {
            path: path.to_string(),
            size: 0,
            blocks,
        };
        let mut archive = Vec::new();
        tar_dir(
            dir.path(),
            &mut archive,
            &[
                partly_read("base/5/16384", vec![1, 3]),
                partly_read("base/5/16385", Vec::new()),
            ],
        )
        .unwrap();
        let mut members = BTreeMap::new();
        for entry in tar::Archive::new(&archive[..]).entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().to_str().unwrap().to_owned();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            members.insert(path, data);
        }
        assert_eq!(
            members.keys().collect::<Vec<_>>(),
            [
                "base",
                "base/5",
                "base/5/16384",
                "base/5/16386",
                "base/5/PG_VERSION"
            ]
        );
        let mut expect = rel[BLCKSZ..2 * BLCKSZ].to_vec();
        expect.extend_from_slice(&rel[3 * BLCKSZ..]);
        assert_eq!(members["base/5/16384"], expect);
        assert_eq!(members["base/5/16386"], rel[..BLCKSZ]);

        // A block the file does not have: an error, not a short member.
        let e = tar_dir(
            dir.path(),
            io::sink(),
            &[partly_read("base/5/16384", vec![1, 4])],
        )
        .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }
}
