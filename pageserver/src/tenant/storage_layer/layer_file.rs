//! What every kind of layer file shares below its own format, written once: opening the file
//! and reading its summary block, the fields every summary starts with, the whole-file
//! CRC-32C, the check that a file is the layer its name and its timeline say, reading an index
//! numbered from its first block, and writing a file (in large chunks, checksummed as it is
//! written, committed through [`StagedFile`]).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use pageserver_api::Key;
use utils::{TenantId, TimelineId};

use crate::format::array_at;
use crate::format::block_io::{
    BlockCheck, BlockLease, BlockReadError, BlockReader, FileBlockReader,
};
use crate::io::crashsafe::{PathError, StagedFile, TEMP_SUFFIX};
use crate::io::virtual_file::{FileIo, VirtualFile};
use crate::page_cache::{FileId, PageCache};
use crate::tenant::storage_layer::LayerName;
use crate::PAGE_SZ;

/// Layer files are written in chunks of this size rather than one syscall per value, and read
/// whole (for their CRC-32C) in chunks of it too.
pub(crate) const WRITE_CHUNK: usize = 1 << 20;

/// A layer file being written asks the kernel to start writing each this many bytes to disk
/// as soon as they are written ([`FileIo::start_writeback`]): the disk works while the rest is
/// produced, and the fsync at the end waits for the last few MiB rather than the whole file.
pub(crate) const WRITEBACK_STEP: u64 = 8 << 20;

/// The kind of a layer file, as its errors name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerFileKind {
    Delta,
    Image,
}

impl std::fmt::Display for LayerFileKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LayerFileKind::Delta => "delta layer",
            LayerFileKind::Image => "image layer",
        })
    }
}

/// What went wrong with a layer file of either kind, naming the file: the one error of delta
/// and image layer files, their reads and their writes.
#[derive(Debug, thiserror::Error)]
pub enum LayerFileError {
    #[error("{kind} {}: {source}", path.display())]
    Io {
        kind: LayerFileKind,
        path: PathBuf,
        source: io::Error,
    },
    #[error("{kind} {} is corrupt: {reason}", path.display())]
    Corrupt {
        kind: LayerFileKind,
        path: PathBuf,
        reason: String,
    },
    #[error("{kind} {}: {message}", path.display())]
    Usage {
        kind: LayerFileKind,
        path: PathBuf,
        message: String,
    },
}

impl LayerFileError {
    /// A failed file operation of a layer file of `kind`.
    pub fn from_path(kind: LayerFileKind, e: PathError) -> LayerFileError {
        LayerFileError::Io {
            kind,
            path: e.path,
            source: e.source,
        }
    }
}

/// Offsets of the fields every summary block starts with, the same in every kind of layer.
pub(crate) mod head_off {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 4;
    /// Reserved, zero; covered by the summary's checksum.
    pub const RESERVED: usize = 6;
    pub const TENANT: usize = 8;
    pub const TIMELINE: usize = 24;
    pub const KEY_START: usize = 40;
    pub const KEY_END: usize = 58;
    /// Where each kind's own fields begin.
    pub const END: usize = 76;
}

/// The fields every summary starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SummaryHead {
    pub tenant_id: TenantId,
    pub timeline_id: TimelineId,
    pub key_start: Key,
    /// Exclusive.
    pub key_end: Key,
    /// The kind's format version, one of [`SummaryLayout::versions`].
    pub version: u16,
}

/// How one kind of layer lays out its summary block: the shared head, its own big-endian
/// fields, the CRC-32C of every byte before `crc_off` at `crc_off`, and zeros after it.
pub(crate) struct SummaryLayout {
    pub magic: u32,
    /// The format versions readers accept, oldest first.
    pub versions: &'static [u16],
    pub crc_off: usize,
    /// The kind's own reserved fields, (offset, length), which must be zero.
    pub reserved: &'static [(usize, usize)],
}

pub(crate) fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes(array_at(b, off))
}

pub(crate) fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_be_bytes(array_at(b, off))
}

impl SummaryLayout {
    /// A summary block holding `head` and the kind's own `fields` (offset, big-endian bytes).
    pub fn encode(&self, head: &SummaryHead, fields: &[(usize, &[u8])]) -> Box<[u8; PAGE_SZ]> {
        use head_off::*;
        let mut b = Box::new([0u8; PAGE_SZ]);
        let mut put = |off: usize, bytes: &[u8]| b[off..off + bytes.len()].copy_from_slice(bytes);
        put(MAGIC, &self.magic.to_be_bytes());
        put(VERSION, &head.version.to_be_bytes());
        put(TENANT, head.tenant_id.as_bytes());
        put(TIMELINE, head.timeline_id.as_bytes());
        put(KEY_START, &head.key_start.to_bytes());
        put(KEY_END, &head.key_end.to_bytes());
        for (off, bytes) in fields {
            put(*off, bytes);
        }
        let crc = utils::crc32c::crc32c(&b[..self.crc_off]);
        b[self.crc_off..self.crc_off + 4].copy_from_slice(&crc.to_be_bytes());
        b
    }

    /// Checks the magic, version and checksum of a summary block and decodes its head; the
    /// caller decodes and checks its own fields.
    pub fn decode(&self, b: &[u8; PAGE_SZ]) -> Result<SummaryHead, String> {
        use head_off::*;
        let magic = u32_at(b, MAGIC);
        if magic != self.magic {
            return Err(format!(
                "bad magic {magic:#010x}, expected {:#010x}",
                self.magic
            ));
        }
        let version = u16::from_be_bytes(array_at(b, VERSION));
        if !self.versions.contains(&version) {
            return Err(format!("unsupported format version {version}"));
        }
        let stored = u32_at(b, self.crc_off);
        let computed = utils::crc32c::crc32c(&b[..self.crc_off]);
        if stored != computed {
            return Err(format!(
                "summary checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"
            ));
        }
        let head = SummaryHead {
            tenant_id: TenantId::from_bytes(array_at(b, TENANT)),
            timeline_id: TimelineId::from_bytes(array_at(b, TIMELINE)),
            key_start: Key::from_bytes(array_at(b, KEY_START)),
            key_end: Key::from_bytes(array_at(b, KEY_END)),
            version,
        };
        if head.key_start >= head.key_end {
            return Err(format!(
                "empty key range {}..{}",
                head.key_start, head.key_end
            ));
        }
        Ok(head)
    }

    /// The bytes of a summary block that decoding does not look at: the reserved fields and
    /// everything after the checksum, all zero in a sound file.
    fn check_zeros(&self, b: &[u8; PAGE_SZ]) -> Result<(), String> {
        let shared = [
            (head_off::RESERVED, 2),
            (self.crc_off + 4, PAGE_SZ - self.crc_off - 4),
        ];
        for (start, len) in shared.iter().chain(self.reserved) {
            let range = *start..start + len;
            if let Some(at) = b[range.clone()].iter().position(|x| *x != 0) {
                return Err(format!(
                    "summary block byte {} is not zero (reserved)",
                    range.start + at
                ));
            }
        }
        Ok(())
    }
}

/// How a read uses the page cache.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Through the cache: what it lacks is read and inserted.
    Point,
    /// A pass over the whole layer: what the cache lacks is read without being inserted, so
    /// that the pass does not push out what point reads use.
    Scan,
}

/// An open layer file, of any kind.
pub(crate) struct LayerFile {
    kind: LayerFileKind,
    path: PathBuf,
    /// Opened again on use when its descriptor was taken (see `virtual_file`).
    file: VirtualFile,
    file_id: FileId,
    cache: Arc<PageCache>,
    /// The file's size when opened (layer files never change).
    size: u64,
    /// Set once a committed manifest no longer lists the file, or its local copy is evicted:
    /// the last user removes it.
    retired: std::sync::atomic::AtomicBool,
    /// The file's inode and modification time when opened: the last user of a retired file
    /// removes the file at its path only if it is still this one, not a copy downloaded again
    /// since (see [`replace_lock`]). The time too, because a freed inode number is reused.
    identity: (u64, Option<std::time::SystemTime>),
}

/// Held while a retired file is removed and while a downloaded layer is renamed into place,
/// so that removing an evicted copy never removes the copy downloaded after it.
static REPLACE_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// See [`REPLACE_LOCK`].
pub(crate) fn replace_lock() -> std::sync::MutexGuard<'static, ()> {
    REPLACE_LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

impl Drop for LayerFile {
    fn drop(&mut self) {
        if !self.retired.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        use std::os::unix::fs::MetadataExt;
        let removed = {
            let _replacing = replace_lock();
            match std::fs::symlink_metadata(&self.path) {
                // Downloaded again since it was evicted: that copy is not ours to remove.
                Ok(meta) if (meta.ino(), meta.modified().ok()) != self.identity => return,
                Ok(_) => std::fs::remove_file(&self.path),
                Err(e) => Err(e),
            }
        }
        .and_then(|()| {
            let dir = self.path.parent().unwrap_or(Path::new("."));
            crate::io::crashsafe::fsync_dir(dir)
        });
        match removed {
            Ok(()) => tracing::debug!(path = %self.path.display(), "removed a retired layer file"),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            // The manifest still names it as retired: the next load removes it.
            Err(e) => {
                tracing::warn!(path = %self.path.display(), "removing a retired layer file failed: {e}")
            }
        }
    }
}

impl LayerFile {
    /// Opens a layer file and reads its summary block (block 0).
    pub fn open(
        kind: LayerFileKind,
        path: &Path,
        cache: Arc<PageCache>,
    ) -> Result<(LayerFile, Box<[u8; PAGE_SZ]>), LayerFileError> {
        let io_err = |source| LayerFileError::Io {
            kind,
            path: path.to_owned(),
            source,
        };
        use std::os::unix::fs::MetadataExt;
        let file = VirtualFile::open(path).map_err(io_err)?;
        let meta = file.metadata().map_err(io_err)?;
        let (size, identity) = (meta.len(), (meta.ino(), meta.modified().ok()));
        if size < PAGE_SZ as u64 {
            return Err(LayerFileError::Corrupt {
                kind,
                path: path.to_owned(),
                reason: format!("file of {size} bytes has no summary block"),
            });
        }
        let mut block = Box::new([0u8; PAGE_SZ]);
        file.read_exact_at(&mut block[..], 0).map_err(io_err)?;
        let layer = LayerFile {
            kind,
            path: path.to_owned(),
            file,
            file_id: FileId::next(),
            cache,
            size,
            retired: std::sync::atomic::AtomicBool::new(false),
            identity,
        };
        Ok((layer, block))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Marks the file as replaced by a committed change: it is removed from the directory
    /// when this, its last user, is dropped. Readers that still hold the layer (a snapshot of
    /// the layer map taken before the change) go on reading it until then.
    pub fn retire(&self) {
        self.retired
            .store(true, std::sync::atomic::Ordering::Release);
    }

    pub fn file(&self) -> &VirtualFile {
        &self.file
    }

    /// The id the file's blocks are cached under.
    pub fn file_id(&self) -> FileId {
        self.file_id
    }

    pub fn cache(&self) -> &PageCache {
        &self.cache
    }

    pub fn corrupt(&self, reason: impl std::fmt::Display) -> LayerFileError {
        LayerFileError::Corrupt {
            kind: self.kind,
            path: self.path.clone(),
            reason: reason.to_string(),
        }
    }

    pub fn io_error(&self, source: io::Error) -> LayerFileError {
        LayerFileError::Io {
            kind: self.kind,
            path: self.path.clone(),
            source,
        }
    }

    /// Reads `buf.len()` bytes at `offset` straight from the file, around the page cache.
    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<(), LayerFileError> {
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| self.io_error(e))
    }

    /// CRC-32C of the whole file, read straight from the file (not through the page cache: a
    /// bulk read must not push out the hot set).
    pub fn crc32c(&self) -> Result<u32, LayerFileError> {
        crate::io::transfer_file::crc32c_of(&self.file, self.size).map_err(|e| self.io_error(e))
    }

    /// Checks that this is the file its name says, of the timeline it is found in: the name
    /// must be `described` (the layer its summary describes), and the summary's `head` must
    /// name the timeline. A layer copied from elsewhere, or renamed, fails with what differs.
    pub fn check_identity(
        &self,
        described: &LayerName,
        head: &SummaryHead,
        tenant_id: TenantId,
        timeline_id: TimelineId,
    ) -> Result<(), LayerFileError> {
        let name = self.path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let described = described.to_string();
        if name != described {
            return Err(self.corrupt(format!(
                "its summary describes layer {described}, not the one its name says"
            )));
        }
        if (head.tenant_id, head.timeline_id) != (tenant_id, timeline_id) {
            return Err(self.corrupt(format!(
                "it belongs to timeline {} of tenant {}, not timeline {timeline_id} of tenant {tenant_id}",
                head.timeline_id, head.tenant_id
            )));
        }
        Ok(())
    }

    /// For a whole-file check: the summary block's bytes that decoding ignores are zero, and
    /// the file has the size it had when opened (`open` checked that size against the
    /// summary: a file that changed size since is not the file that was opened).
    pub fn check_unread_bytes(&self, layout: &SummaryLayout) -> Result<(), LayerFileError> {
        let mut block = Box::new([0u8; PAGE_SZ]);
        self.read_exact_at(&mut block[..], 0)?;
        layout.check_zeros(&block).map_err(|e| self.corrupt(e))?;
        let len = self.file.metadata().map_err(|e| self.io_error(e))?.len();
        if len != self.size {
            return Err(self.corrupt(format!(
                "file is {len} bytes now, {} when it was opened",
                self.size
            )));
        }
        Ok(())
    }

    /// A reader of the file's blocks, through the page cache as `access` says.
    pub fn blocks(&self, access: Access) -> FileBlockReader<'_> {
        let reader = FileBlockReader::new(&self.file, self.file_id, &self.path, &self.cache);
        match access {
            Access::Point => reader,
            Access::Scan => reader.bypassing_cache(),
        }
    }

    /// A reader of the B-tree whose first block is `start`, numbering blocks from there; its
    /// blocks are index blocks, cached only once they pass `check`.
    pub fn index<'a>(
        &'a self,
        access: Access,
        start: u32,
        check: BlockCheck<'a>,
    ) -> IndexBlocks<'a> {
        IndexBlocks {
            inner: self.blocks(access).index_blocks(check),
            start,
            path: &self.path,
        }
    }
}

/// Reads an index's blocks, numbered from the index's first block.
pub(crate) struct IndexBlocks<'a> {
    inner: FileBlockReader<'a>,
    start: u32,
    path: &'a Path,
}

impl BlockReader for IndexBlocks<'_> {
    fn read_blk(&self, blkno: u32) -> Result<BlockLease<'_>, BlockReadError> {
        let absolute = self
            .start
            .checked_add(blkno)
            .ok_or_else(|| BlockReadError::PastEnd {
                path: self.path.to_owned(),
                blkno,
            })?;
        self.inner.read_blk(absolute)
    }

    fn cached_blocks_verified(&self) -> bool {
        self.inner.cached_blocks_verified()
    }
}

/// What a layer writer made: a durable layer file under its final name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenLayer<S> {
    pub path: PathBuf,
    pub summary: S,
    /// The file's length in bytes.
    pub size: u64,
    /// CRC-32C of the whole file, computed from what was written (no read back).
    pub crc32c: u32,
}

/// Writes a layer file under a temporary name: bytes appended in file order from block 1 on,
/// then block 0, the summary, once everything it describes is known; durable under its final
/// name when [`LayerFileWriter::commit`] returns, removed if dropped before. Memory is one
/// write chunk, whatever the file's size.
pub(crate) struct LayerFileWriter {
    kind: LayerFileKind,
    file: StagedFile,
    /// Bytes not yet written, starting at `pending_offset`.
    pending: Vec<u8>,
    pending_offset: u64,
    /// CRC-32C of the bytes written from block 1 on; block 0 is combined in by `commit`.
    crc_after_summary: u32,
    /// A write failed: what follows it in the file may be missing, so nothing more is taken.
    failed: bool,
    /// Bytes from block 1 up to here were handed to [`FileIo::start_writeback`]; `None` once
    /// the file system said it cannot start writeback.
    writeback_from: Option<u64>,
}

impl LayerFileWriter {
    /// A temporary file name for a layer of `kind` (`delta`, `image`): unique within the
    /// process, so concurrent writers in one directory never share a file.
    pub fn temp_name(kind: &str) -> String {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let serial = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("{kind}-{}-{serial}{TEMP_SUFFIX}", std::process::id())
    }

    /// Creates `<dir>/<temp_name>`; `failpoints` prefixes the commit's failpoints.
    pub fn create(
        kind: LayerFileKind,
        dir: &Path,
        temp_name: &str,
        failpoints: &'static str,
    ) -> Result<LayerFileWriter, LayerFileError> {
        Ok(LayerFileWriter {
            kind,
            file: StagedFile::create(dir, temp_name, failpoints)
                .map_err(|e| LayerFileError::from_path(kind, e))?,
            pending: Vec::with_capacity(WRITE_CHUNK),
            pending_offset: PAGE_SZ as u64,
            crc_after_summary: 0,
            failed: false,
            writeback_from: Some(PAGE_SZ as u64),
        })
    }

    pub fn temp_path(&self) -> &Path {
        self.file.temp_path()
    }

    /// Where the next appended byte goes.
    pub fn offset(&self) -> u64 {
        self.pending_offset + self.pending.len() as u64
    }

    fn io_error(&self, source: io::Error) -> LayerFileError {
        LayerFileError::Io {
            kind: self.kind,
            path: self.temp_path().to_owned(),
            source,
        }
    }

    /// Appends `len` bytes produced by `fill` into the buffer, writing each full chunk.
    fn append_with(
        &mut self,
        mut len: usize,
        mut fill: impl FnMut(&mut Vec<u8>, usize),
    ) -> Result<(), LayerFileError> {
        if self.failed {
            return Err(self.io_error(io::Error::other("an earlier write to this file failed")));
        }
        while len > 0 {
            let n = (WRITE_CHUNK - self.pending.len()).min(len);
            fill(&mut self.pending, n);
            len -= n;
            if self.pending.len() == WRITE_CHUNK {
                self.flush()?;
            }
        }
        Ok(())
    }

    pub fn append(&mut self, mut bytes: &[u8]) -> Result<(), LayerFileError> {
        self.append_with(bytes.len(), |pending, n| {
            pending.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
        })
    }

    pub fn append_zeros(&mut self, len: usize) -> Result<(), LayerFileError> {
        self.append_with(len, |pending, n| pending.resize(pending.len() + n, 0))
    }

    /// Zeros up to the next block boundary, if not on one.
    pub fn pad_to_block(&mut self) -> Result<(), LayerFileError> {
        let in_block = (self.offset() % PAGE_SZ as u64) as usize;
        if in_block == 0 {
            return Ok(());
        }
        self.append_zeros(PAGE_SZ - in_block)
    }

    fn flush(&mut self) -> Result<(), LayerFileError> {
        if let Err(e) = self
            .file
            .file()
            .write_all_at(&self.pending, self.pending_offset)
        {
            self.failed = true;
            return Err(self.io_error(e));
        }
        self.crc_after_summary =
            utils::crc32c::crc32c_append(self.crc_after_summary, &self.pending);
        self.pending_offset += self.pending.len() as u64;
        self.pending.clear();
        self.start_writeback()
    }

    /// Starts writeback of what was written since the last step, once a step has piled up.
    fn start_writeback(&mut self) -> Result<(), LayerFileError> {
        let Some(from) = self.writeback_from else {
            return Ok(());
        };
        let len = self.pending_offset - from;
        if len < WRITEBACK_STEP {
            return Ok(());
        }
        match self.file.file().start_writeback(from, len) {
            Ok(true) => self.writeback_from = Some(self.pending_offset),
            Ok(false) => self.writeback_from = None,
            // An error of the device: the file cannot be trusted to become durable.
            Err(e) => {
                self.failed = true;
                return Err(self.io_error(e));
            }
        }
        Ok(())
    }

    /// Writes what is buffered and the summary block, and makes the file durable as
    /// `final_name`. The file must end on a block boundary.
    pub fn commit<S>(
        mut self,
        summary_block: &[u8; PAGE_SZ],
        summary: S,
        final_name: &str,
    ) -> Result<WrittenLayer<S>, LayerFileError> {
        if self.failed {
            return Err(self.io_error(io::Error::other("an earlier write to this file failed")));
        }
        self.flush()?;
        let size = self.pending_offset;
        debug_assert_eq!(size % PAGE_SZ as u64, 0, "a layer file is whole blocks");
        self.file
            .file()
            .write_all_at(&summary_block[..], 0)
            .map_err(|e| self.io_error(e))?;
        let after_len =
            usize::try_from(size - PAGE_SZ as u64).map_err(|_| LayerFileError::Usage {
                kind: self.kind,
                path: self.temp_path().to_owned(),
                message: format!("a file of {size} bytes"),
            })?;
        let crc32c = utils::crc32c::crc32c_combine(
            utils::crc32c::crc32c(&summary_block[..]),
            self.crc_after_summary,
            after_len,
        );
        // A layer file is not a commit point (the manifest that lists it is): renamed or not
        // before the error, it is listed nowhere, and the next load removes what is left.
        let kind = self.kind;
        let path = self
            .file
            .commit(final_name)
            .map_err(|e| LayerFileError::from_path(kind, PathError::from(e)))?;
        Ok(WrittenLayer {
            path,
            summary,
            size,
            crc32c,
        })
    }
}
