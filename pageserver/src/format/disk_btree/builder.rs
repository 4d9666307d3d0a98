//! Writing a tree: [`DiskBtreeBuilder`] takes entries in strictly increasing key order and
//! writes each node once, bottom-up, into a [`BlockSink`] (see the parent module's *Design*).
//!
//! Invariants it keeps for the reader: every node is sealed (header and checksum) before it is
//! written; block numbers increase from each write to the next, so children lie below their
//! parents and the root is the last block; only the last node of each level is partly filled,
//! so no node but an empty root leaf is empty. After a failed write the builder is poisoned and
//! refuses further use, since the tree it would finish is incomplete.

use std::io;
use std::path::PathBuf;

use super::{
    internal_capacity, leaf_capacity, node_checksum, BTREE_FORMAT_VERSION, BTREE_MAGIC,
    CHECKSUM_OFF, COUNT_OFF, HEADER_LEN, KEY_LEN_OFF, LEVEL_OFF, MAGIC_OFF, MAX_HEIGHT,
    MAX_KEY_LEN, VERSION_OFF,
};
use crate::format::array_at;
use crate::format::block_io::{BlockLease, BlockReadError, BlockReader};
use crate::PAGE_SZ;

/// Where a [`DiskBtreeBuilder`] writes its nodes.
pub trait BlockSink {
    /// Writes one block and returns the block number it was written at. Block numbers must
    /// increase from each call to the next (the builder checks): the reader relies on children
    /// having smaller block numbers than their parents.
    fn write_block(&mut self, block: &[u8; PAGE_SZ]) -> io::Result<u32>;
}

impl<S: BlockSink + ?Sized> BlockSink for &mut S {
    fn write_block(&mut self, block: &[u8; PAGE_SZ]) -> io::Result<u32> {
        (**self).write_block(block)
    }
}

/// Blocks kept in memory: a [`BlockSink`] that is also a [`BlockReader`] of what was written,
/// for tests and for building an index before copying it elsewhere.
#[derive(Debug, Clone, Default)]
pub struct VecBlockSink {
    blocks: Vec<[u8; PAGE_SZ]>,
}

impl VecBlockSink {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn blocks(&self) -> &[[u8; PAGE_SZ]] {
        &self.blocks
    }

    /// The blocks, to change (tests corrupt them) or to add blocks before the tree's.
    pub fn blocks_mut(&mut self) -> &mut Vec<[u8; PAGE_SZ]> {
        &mut self.blocks
    }

    pub fn into_blocks(self) -> Vec<[u8; PAGE_SZ]> {
        self.blocks
    }
}

impl BlockSink for VecBlockSink {
    fn write_block(&mut self, block: &[u8; PAGE_SZ]) -> io::Result<u32> {
        let blkno = u32::try_from(self.blocks.len()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::StorageFull,
                "in-memory sink is out of block numbers",
            )
        })?;
        self.blocks.push(*block);
        Ok(blkno)
    }
}

impl BlockReader for VecBlockSink {
    fn read_blk(&self, blkno: u32) -> Result<BlockLease<'_>, BlockReadError> {
        let block = usize::try_from(blkno)
            .ok()
            .and_then(|i| self.blocks.get(i))
            .ok_or_else(|| BlockReadError::OutOfBounds {
                path: PathBuf::from("<memory>"),
                blkno,
                blocks: u64::try_from(self.blocks.len()).unwrap_or(u64::MAX),
            })?;
        // The sink cannot be written while the lease borrows it.
        Ok(BlockLease::Borrowed(block))
    }
}

/// What [`DiskBtreeBuilder::finish`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BtreeInfo {
    /// The root node's block: give it to [`DiskBtreeReader::new`].
    pub root_blk: u32,
    /// Levels, leaves included: the number of blocks a point lookup reads (1 for a tree that
    /// fits in one leaf, including the empty tree).
    pub height: u8,
    /// Entries appended.
    pub entries: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum BtreeBuildError {
    #[error("key #{index} equals the previous key: keys must be strictly increasing")]
    DuplicateKey { index: u64 },
    #[error("key #{index} is smaller than the previous key: keys must be strictly increasing")]
    KeyOutOfOrder { index: u64 },
    #[error("failed to write a B-tree node: {0}")]
    Write(#[source] io::Error),
    #[error(
        "the block sink returned block {got} after block {previous}: block numbers must increase"
    )]
    SinkOrder { previous: u32, got: u32 },
    #[error("the tree would have more than {MAX_HEIGHT} levels")]
    TooTall,
    #[error("an earlier write failed, so the tree is incomplete: the builder is unusable")]
    Poisoned,
}

/// Builds a tree from entries appended in strictly increasing key order; see the module docs.
pub struct DiskBtreeBuilder<const KEY_LEN: usize, S: BlockSink> {
    sink: S,
    /// `levels[n]` is the open node of level n (leaves are level 0). Every level holds at least
    /// one entry, except level 0 before the first append; a full node is written when the next
    /// entry for its level arrives (see `push`).
    pub(super) levels: Vec<OpenNode>,
    last_key: Option<[u8; KEY_LEN]>,
    entries: u64,
    last_blk: Option<u32>,
    /// The limits on entries per node; the format's capacities except in tests, which lower them
    /// to build tall trees from few entries.
    leaf_limit: usize,
    internal_limit: usize,
    poisoned: bool,
}

/// A node being filled, in the buffer it will be written from.
pub(super) struct OpenNode {
    buf: Box<[u8; PAGE_SZ]>,
    level: u8,
    count: usize,
}

impl OpenNode {
    fn new(level: u8) -> Self {
        OpenNode {
            buf: Box::new([0u8; PAGE_SZ]),
            level,
            count: 0,
        }
    }

    /// Appends `key ++ payload`. The caller keeps `count` below the node's capacity.
    fn push(&mut self, key: &[u8], payload: &[u8]) {
        let len = key.len() + payload.len();
        let off = HEADER_LEN + self.count * len;
        self.buf[off..off + key.len()].copy_from_slice(key);
        self.buf[off + key.len()..off + len].copy_from_slice(payload);
        self.count += 1;
    }

    /// Fills in the header and checksum; the entries and trailing zeroes are already in place.
    fn seal(&mut self, key_len: u16) {
        // `count` is at most `capacity(KEY_LEN, level)` <= 8180 / 9.
        let count = u16::try_from(self.count).expect("node capacity fits in u16");
        self.buf[MAGIC_OFF..MAGIC_OFF + 2].copy_from_slice(&BTREE_MAGIC.to_be_bytes());
        self.buf[VERSION_OFF] = BTREE_FORMAT_VERSION;
        self.buf[LEVEL_OFF] = self.level;
        self.buf[COUNT_OFF..COUNT_OFF + 2].copy_from_slice(&count.to_be_bytes());
        self.buf[KEY_LEN_OFF..KEY_LEN_OFF + 2].copy_from_slice(&key_len.to_be_bytes());
        let checksum = node_checksum(&self.buf);
        self.buf[CHECKSUM_OFF..CHECKSUM_OFF + 4].copy_from_slice(&checksum.to_be_bytes());
    }

    /// Empties the node for reuse. Zeroing the whole block keeps the bytes after the last entry
    /// zero, as the format requires, whatever the previous node held there.
    fn reset(&mut self) {
        self.buf.fill(0);
        self.count = 0;
    }
}

impl<const KEY_LEN: usize, S: BlockSink> DiskBtreeBuilder<KEY_LEN, S> {
    pub fn new(sink: S) -> Self {
        const {
            assert!(
                KEY_LEN >= 1 && KEY_LEN <= MAX_KEY_LEN,
                "KEY_LEN must be between 1 and MAX_KEY_LEN"
            )
        };
        DiskBtreeBuilder {
            sink,
            levels: vec![OpenNode::new(0)],
            last_key: None,
            entries: 0,
            last_blk: None,
            leaf_limit: leaf_capacity(KEY_LEN),
            internal_limit: internal_capacity(KEY_LEN),
            poisoned: false,
        }
    }

    /// Lowers the number of entries per node, to build tall trees from few entries in tests.
    /// The result is a valid tree: the format allows partly filled nodes.
    #[cfg(test)]
    pub(crate) fn with_node_limits(mut self, leaf: usize, internal: usize) -> Self {
        assert!((1..=leaf_capacity(KEY_LEN)).contains(&leaf));
        // An internal node with one child would never shrink the top level.
        assert!((2..=internal_capacity(KEY_LEN)).contains(&internal));
        self.leaf_limit = leaf;
        self.internal_limit = internal;
        self
    }

    /// Entries appended so far.
    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// Appends an entry. `key` must be greater than every key appended before: a key out of
    /// order is refused with an error and leaves the builder as it was.
    pub fn append(&mut self, key: &[u8; KEY_LEN], value: u64) -> Result<(), BtreeBuildError> {
        if self.poisoned {
            return Err(BtreeBuildError::Poisoned);
        }
        if let Some(last) = &self.last_key {
            match key.cmp(last) {
                std::cmp::Ordering::Less => {
                    return Err(BtreeBuildError::KeyOutOfOrder {
                        index: self.entries,
                    })
                }
                std::cmp::Ordering::Equal => {
                    return Err(BtreeBuildError::DuplicateKey {
                        index: self.entries,
                    })
                }
                std::cmp::Ordering::Greater => {}
            }
        }
        self.push(0, key, &value.to_be_bytes())?;
        self.last_key = Some(*key);
        self.entries += 1;
        Ok(())
    }

    /// Adds an entry to the open node of `level`, first writing that node if it is full and
    /// passing its first key and block number up. Recursion is bounded by `MAX_HEIGHT`.
    ///
    /// A full node waits for the next entry before it is written: then the top level at
    /// `finish` always holds the root, whereas writing eagerly would give an exactly full top
    /// node a one-pointer parent, and a tree of exactly `MAX_HEIGHT` levels a level too many.
    fn push(
        &mut self,
        level: usize,
        key: &[u8; KEY_LEN],
        payload: &[u8],
    ) -> Result<(), BtreeBuildError> {
        if level == self.levels.len() {
            let Some(node_level) = u8::try_from(level).ok().filter(|_| level < MAX_HEIGHT) else {
                self.poisoned = true;
                return Err(BtreeBuildError::TooTall);
            };
            self.levels.push(OpenNode::new(node_level));
        }
        let limit = if level == 0 {
            self.leaf_limit
        } else {
            self.internal_limit
        };
        if self.levels[level].count == limit {
            let (first_key, blkno) = self.write_node(level)?;
            self.push(level + 1, &first_key, &blkno.to_be_bytes())?;
        }
        self.levels[level].push(key, payload);
        Ok(())
    }

    /// Writes the open node of `level` and empties it; returns its first key and block number.
    fn write_node(&mut self, level: usize) -> Result<([u8; KEY_LEN], u32), BtreeBuildError> {
        // Checked in `new`: KEY_LEN <= MAX_KEY_LEN < u16::MAX.
        let key_len = u16::try_from(KEY_LEN).expect("KEY_LEN fits in u16");
        let node = &mut self.levels[level];
        node.seal(key_len);
        let blkno = match self.sink.write_block(&node.buf) {
            Ok(blkno) => blkno,
            Err(e) => {
                self.poisoned = true;
                return Err(BtreeBuildError::Write(e));
            }
        };
        if let Some(previous) = self.last_blk.filter(|&p| p >= blkno) {
            self.poisoned = true;
            return Err(BtreeBuildError::SinkOrder {
                previous,
                got: blkno,
            });
        }
        self.last_blk = Some(blkno);
        // An empty node (only the empty tree's root leaf) has no first key; nobody asks for it.
        let first_key = array_at::<KEY_LEN>(&node.buf[..], HEADER_LEN);
        node.reset();
        Ok((first_key, blkno))
    }

    /// Writes the partly filled nodes, bottom-up, and returns where the root is, with the sink.
    pub fn finish(mut self) -> Result<(BtreeInfo, S), BtreeBuildError> {
        if self.poisoned {
            return Err(BtreeBuildError::Poisoned);
        }
        let mut level = 0;
        let (root_blk, height) = loop {
            // Passing a node up may fill and write the level above, even add a level: look at
            // the top afresh each time.
            if level + 1 == self.levels.len() {
                // The root. Below it a level always holds an entry once it exists, so the root
                // has at least two children; for the empty tree it is an empty leaf.
                let (_, blkno) = self.write_node(level)?;
                break (blkno, level + 1);
            }
            let (first_key, blkno) = self.write_node(level)?;
            self.push(level + 1, &first_key, &blkno.to_be_bytes())?;
            level += 1;
        };
        let info = BtreeInfo {
            root_blk,
            // At most MAX_HEIGHT: `push` refuses to open a level beyond it.
            height: u8::try_from(height).map_err(|_| BtreeBuildError::TooTall)?,
            entries: self.entries,
        };
        Ok((info, self.sink))
    }
}
