//! Blobs: variable-length byte strings stored back to back in a file of 8 KiB blocks.
//!
//! ```text
//! len < 128:   [0 l6..l0]                                    then len bytes
//! len >= 128:  [1 l30..l24] [l23..l16] [l15..l8] [l7..l0]    then len bytes  (big-endian)
//! ```
//!
//! The header is 1 byte for short blobs (most deltas) and 4 bytes otherwise, with the high bit
//! of the first byte telling which. Blobs are not aligned: a blob, and even its header, may
//! span any number of block boundaries. A blob is addressed by the byte offset of its header.
//!
//! Reading treats the file as untrusted: a header that claims more bytes than the reader allows,
//! or than the file has, is an error, and no buffer is sized from a header alone beyond what
//! has actually been read.

use crate::format::block_io::{BlockReadError, BlockReader};
use crate::PAGE_SZ;

/// The longest blob the format can describe: 31 bits of length.
pub const MAX_BLOB_LEN: usize = 0x7FFF_FFFF;

/// Blobs shorter than this get a 1-byte header.
const SHORT_BLOB_LIMIT: usize = 0x80;

const LONG_HEADER_FLAG: u8 = 0x80;

/// The header of a blob of `len` bytes, in a 4-byte buffer of which the first
/// [`BlobHeader::len`] bytes are used.
#[derive(Clone, Copy)]
pub struct BlobHeader {
    bytes: [u8; 4],
    len: u8,
}

impl BlobHeader {
    /// Reads the header at the start of `bytes`: (header length, blob length), or `None` if
    /// `bytes` ends inside it.
    pub fn parse(bytes: &[u8]) -> Option<(usize, usize)> {
        let first = *bytes.first()?;
        if first & LONG_HEADER_FLAG == 0 {
            return Some((1, usize::from(first)));
        }
        let rest = bytes.get(1..4)?;
        let len = u32::from_be_bytes([first & !LONG_HEADER_FLAG, rest[0], rest[1], rest[2]]);
        Some((4, usize::try_from(len).unwrap_or(usize::MAX)))
    }

    #[inline]
    pub fn new(blob_len: usize) -> Result<BlobHeader, BlobTooLarge> {
        if blob_len < SHORT_BLOB_LIMIT {
            // Checked just above: fits in 7 bits.
            return Ok(BlobHeader {
                bytes: [blob_len as u8, 0, 0, 0],
                len: 1,
            });
        }
        let len32 = u32::try_from(blob_len)
            .ok()
            .filter(|l| *l as usize <= MAX_BLOB_LEN)
            .ok_or(BlobTooLarge { len: blob_len })?;
        let mut bytes = len32.to_be_bytes();
        bytes[0] |= LONG_HEADER_FLAG;
        Ok(BlobHeader { bytes, len: 4 })
    }

    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// Header bytes, 1 or 4.
    #[inline]
    pub fn encoded_len(&self) -> usize {
        usize::from(self.len)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("blob of {len} bytes is too large: the limit is {MAX_BLOB_LEN} bytes")]
pub struct BlobTooLarge {
    pub len: usize,
}

/// Appends one encoded blob to `buf`. The in-memory form of exactly what a file holds.
#[inline]
pub fn append_blob_to_vec(buf: &mut Vec<u8>, blob: &[u8]) -> Result<(), BlobTooLarge> {
    let header = BlobHeader::new(blob.len())?;
    buf.extend_from_slice(header.as_bytes());
    buf.extend_from_slice(blob);
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum BlobReadError {
    #[error(transparent)]
    Block(#[from] BlockReadError),
    #[error("blob at offset {offset} claims {len} bytes, more than the {limit} allowed: the file is corrupt")]
    TooLong {
        offset: u64,
        len: usize,
        limit: usize,
    },
    #[error("blob offset {offset} is beyond the largest addressable block")]
    OffsetOutOfRange { offset: u64 },
}

/// Reads blobs from any [`BlockReader`].
pub struct BlockCursor<'a, R: BlockReader + ?Sized> {
    reader: &'a R,
    max_blob_len: usize,
}

impl<'a, R: BlockReader + ?Sized> BlockCursor<'a, R> {
    pub fn new(reader: &'a R) -> Self {
        BlockCursor {
            reader,
            max_blob_len: MAX_BLOB_LEN,
        }
    }

    /// Refuse blobs longer than `limit` (e.g. the configured maximum value size) as corrupt.
    pub fn with_max_blob_len(mut self, limit: usize) -> Self {
        self.max_blob_len = limit.min(MAX_BLOB_LEN);
        self
    }

    /// Reads the blob whose header starts at byte `offset`.
    pub fn read_blob(&self, offset: u64) -> Result<Vec<u8>, BlobReadError> {
        let mut buf = Vec::new();
        self.read_blob_into_buf(offset, &mut buf)?;
        Ok(buf)
    }

    /// Reads the blob at `offset` into `buf`, replacing its contents.
    pub fn read_blob_into_buf(&self, offset: u64, buf: &mut Vec<u8>) -> Result<(), BlobReadError> {
        buf.clear();
        let mut pos = Position::new(offset)?;
        // Each block is asked for once, however many of the header's bytes and the blob's
        // pieces it holds: a lookup per block, and a read cost that counts blocks, not bytes.
        let mut blkno = pos.blkno;
        let mut block = self.reader.read_blk(blkno)?;
        let mut next_byte = |pos: &mut Position| -> Result<u8, BlobReadError> {
            if pos.blkno != blkno {
                blkno = pos.blkno;
                block = self.reader.read_blk(blkno)?;
            }
            let byte = block[pos.in_block];
            pos.advance(1, offset)?;
            Ok(byte)
        };
        let first = next_byte(&mut pos)?;
        let len = if first & LONG_HEADER_FLAG == 0 {
            usize::from(first)
        } else {
            let rest = [
                next_byte(&mut pos)?,
                next_byte(&mut pos)?,
                next_byte(&mut pos)?,
            ];
            let len = u32::from_be_bytes([first & !LONG_HEADER_FLAG, rest[0], rest[1], rest[2]]);
            usize::try_from(len).unwrap_or(usize::MAX)
        };
        if len > self.max_blob_len {
            return Err(BlobReadError::TooLong {
                offset,
                len,
                limit: self.max_blob_len,
            });
        }

        // Grow with what is read, not with what the header claims.
        buf.reserve(len.min(PAGE_SZ));
        let mut remaining = len;
        while remaining > 0 {
            if pos.blkno != blkno {
                blkno = pos.blkno;
                block = self.reader.read_blk(blkno)?;
            }
            let n = remaining.min(PAGE_SZ - pos.in_block);
            buf.extend_from_slice(&block[pos.in_block..pos.in_block + n]);
            remaining -= n;
            pos.advance(n, offset)?;
        }
        Ok(())
    }
}

/// A byte position as (block, offset in block).
struct Position {
    blkno: u32,
    in_block: usize,
}

impl Position {
    fn new(offset: u64) -> Result<Self, BlobReadError> {
        let blkno = u32::try_from(offset / PAGE_SZ as u64)
            .map_err(|_| BlobReadError::OffsetOutOfRange { offset })?;
        Ok(Position {
            blkno,
            // Less than PAGE_SZ.
            in_block: (offset % PAGE_SZ as u64) as usize,
        })
    }

    fn advance(&mut self, n: usize, origin: u64) -> Result<(), BlobReadError> {
        self.in_block += n;
        if self.in_block == PAGE_SZ {
            self.in_block = 0;
            self.blkno = self
                .blkno
                .checked_add(1)
                .ok_or(BlobReadError::OffsetOutOfRange { offset: origin })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::block_io::BlockLease;
    use proptest::prelude::*;
    use std::path::PathBuf;

    /// Blocks held in memory, for testing the format without files.
    struct MemBlocks(Vec<u8>);

    impl BlockReader for MemBlocks {
        fn read_blk(&self, blkno: u32) -> Result<BlockLease<'_>, BlockReadError> {
            let start = blkno as usize * PAGE_SZ;
            if start >= self.0.len() {
                return Err(BlockReadError::OutOfBounds {
                    path: PathBuf::from("memory"),
                    blkno,
                    blocks: (self.0.len() / PAGE_SZ) as u64,
                });
            }
            let mut page = Box::new([0u8; PAGE_SZ]);
            let end = (start + PAGE_SZ).min(self.0.len());
            page[..end - start].copy_from_slice(&self.0[start..end]);
            Ok(BlockLease::Owned(page))
        }
    }

    #[test]
    fn header_sizes_at_the_boundaries() {
        assert_eq!(BlobHeader::new(0).unwrap().as_bytes(), &[0]);
        assert_eq!(BlobHeader::new(127).unwrap().as_bytes(), &[127]);
        assert_eq!(BlobHeader::new(128).unwrap().as_bytes(), &[0x80, 0, 0, 128]);
        assert_eq!(
            BlobHeader::new(MAX_BLOB_LEN).unwrap().as_bytes(),
            &[0xFF, 0xFF, 0xFF, 0xFF]
        );
        assert_eq!(
            BlobHeader::new(MAX_BLOB_LEN + 1).err(),
            Some(BlobTooLarge {
                len: MAX_BLOB_LEN + 1
            })
        );
    }

    #[test]
    fn corrupt_length_is_an_error_not_an_allocation() {
        // A header claiming 2 GiB - 1 in a file of one block.
        let mut data = vec![0xFF, 0xFF, 0xFF, 0xFF];
        data.resize(PAGE_SZ, 0);
        let blocks = MemBlocks(data);
        let err = BlockCursor::new(&blocks).read_blob(0).unwrap_err();
        assert!(matches!(
            err,
            BlobReadError::Block(BlockReadError::OutOfBounds { blkno: 1, .. })
        ));
        let err = BlockCursor::new(&blocks)
            .with_max_blob_len(1 << 20)
            .read_blob(0)
            .unwrap_err();
        assert!(err.to_string().contains("corrupt"), "{err}");
    }

    proptest! {
        #[test]
        fn blobs_round_trip_across_block_edges(
            lens in prop::collection::vec(
                prop_oneof![0usize..140, Just(127usize), Just(128usize), 0usize..3 * PAGE_SZ],
                1..40,
            ),
            lead in 0usize..PAGE_SZ,
        ) {
            // `lead` shifts everything so headers land on and across block edges.
            let mut data = vec![0xAA; lead];
            let mut blobs = Vec::new();
            for (i, len) in lens.iter().enumerate() {
                let blob: Vec<u8> = (0..*len).map(|j| (i * 31 + j * 7) as u8).collect();
                let offset = data.len() as u64;
                append_blob_to_vec(&mut data, &blob).unwrap();
                blobs.push((offset, blob));
            }
            let blocks = MemBlocks(data);
            let cursor = BlockCursor::new(&blocks);
            for (offset, blob) in &blobs {
                prop_assert_eq!(&cursor.read_blob(*offset).unwrap(), blob);
            }
        }
    }
}
