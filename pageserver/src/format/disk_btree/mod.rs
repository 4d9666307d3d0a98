//! An on-disk B-tree mapping fixed-length keys to `u64` values: the index of a layer file (an
//! image layer's maps the 18-byte page key to where its image lies).
//!
//! A delta layer stores its page versions as blobs and, after them, this tree mapping
//! `page key ++ big-endian LSN` (18 + 8 = 26 bytes) to the blob's offset. Comparing those keys
//! bytewise orders them by (page, LSN), so "the newest version of page K at or below LSN L" is
//! [`DiskBtreeReader::find_at_or_below`]`(K ++ L)` followed by a check that the first 18 bytes of
//! the found key are K.
//!
//! # Design
//!
//! * **Written once, bottom-up.** A layer's entries are produced in key order, so
//!   [`DiskBtreeBuilder`] fills a leaf, writes it once it is full (when the next entry arrives),
//!   and pushes `(first key, block number)` into the level above, which is written the same way.
//!   Only one open node per level is in memory: O(height × 8 KiB), however many entries. Nodes
//!   are packed completely (there are no later inserts to leave room for); only the last node
//!   of each level may be partly filled.
//! * **Children before parents.** Every node is written before the node that points at it, and a
//!   [`BlockSink`] numbers blocks in increasing order, so a child's block number is always below
//!   its parent's and the root is the last block written. The reader relies on this: following a
//!   pointer always moves to a smaller block number, so no corrupt pointer can make it loop.
//! * **No sibling links.** A leaf is written before the next leaf's block number is known, so a
//!   leaf cannot point at its successor. A scan instead keeps the root-to-leaf path (at most
//!   [`MAX_HEIGHT`] block leases) and climbs to the nearest ancestor with a next child, which
//!   reads every node exactly once.
//! * **Every block is untrusted.** Each node is checksummed, and every read checks the checksum,
//!   the header, the order of the node's keys, and that the node fits where its parent says it
//!   is (see *Invariants*). A corrupt tree yields [`BtreeReadError::Corrupt`], never a panic, a
//!   loop, or an answer taken from the wrong part of the tree. The checks cost about as much as
//!   the checksum: one pass over a block that is already in the CPU cache. A block reader may
//!   promise that the blocks it serves from the page cache passed these checks before they were
//!   cached ([`BlockReader::cached_blocks_verified`]; delta layers' index readers do): then a
//!   hit skips the checksum and the key-order pass, and only the O(1) header bounds are checked.
//!
//! # Node format
//!
//! Every node is one `PAGE_SZ` (8192-byte) block. Integers are big-endian.
//!
//! ```text
//! offset  size  field
//!      0     2  magic          0xB7EE
//!      2     1  version        1
//!      3     1  level          0 = leaf; a parent is one level above its children
//!      4     2  count          number of entries
//!      6     2  key_len        KEY_LEN, so a reader of another key length refuses the tree
//!      8     4  checksum       CRC-32C of bytes 0..8 followed by bytes 12..8192
//!     12        entries        count × entry, back to back
//!      …        zeroes         up to the end of the block
//!
//! leaf entry      (KEY_LEN + 8 bytes):  key[KEY_LEN]  value: u64
//! internal entry  (KEY_LEN + 4 bytes):  key[KEY_LEN]  child block number: u32
//! ```
//!
//! The checksum covers every byte of the block except its own four, including the unused
//! zeroes, so any change to a block is seen. Child pointers are `u32` because block numbers are
//! (`BlockReader::read_blk` takes a `u32`); that buys about 13 % more fan-out than a `u64`.
//!
//! Fan-out for `KEY_LEN = 26` (delta layers): 240 entries per leaf ((8192 − 12) / 34) and 272
//! per internal node ((8192 − 12) / 30), so two levels index up to 65 280 entries and three
//! levels about 17.7 million. See [`leaf_capacity`] and [`internal_capacity`].
//!
//! # Invariants
//!
//! Checked by the reader on every node it reads:
//!
//! 1. Magic, version, key length and checksum are as above.
//! 2. `count` entries fit in the block for the node's level, and the level is below
//!    [`MAX_HEIGHT`].
//! 3. Keys within a node are strictly increasing.
//! 4. Only the root may be empty, and only if it is a leaf (the empty tree).
//! 5. A child's level is exactly its parent's level minus one (so a path is at most
//!    [`MAX_HEIGHT`] nodes long).
//! 6. A child's block number is below its parent's and at or above the tree's first block
//!    ([`DiskBtreeReader::with_first_blk`], 0 by default).
//! 7. An internal entry's key is the smallest key of its child: the child's first key equals it,
//!    and the child's last key is below the parent's next key (or below the bound the parent
//!    inherited from its own parent, on the right edge). So every subtree's keys lie in
//!    `[its key in the parent, the next key)`, a misdirected pointer is caught where it lands,
//!    and a scan yields strictly increasing keys and reads no node twice.

use std::io;
use std::path::PathBuf;

use crate::format::block_io::{BlockLease, BlockReadError, BlockReader};
// Only called with offsets inside the header or inside an entry that `Node::parse` has
// bounds-checked, so the slice always has the bytes.
use crate::format::array_at;
use crate::PAGE_SZ;

/// The first two bytes of every B-tree node; distinct from other block kinds.
pub const BTREE_MAGIC: u16 = 0xB7EE;
/// The node format described in the module docs.
pub const BTREE_FORMAT_VERSION: u8 = 1;
/// The most levels a tree may have: a reader refuses a deeper path as corrupt. With the smallest
/// fan-out (2, for the largest keys) this still allows 32 768 leaves.
pub const MAX_HEIGHT: usize = 16;
/// The longest key with room for two entries in every node.
pub const MAX_KEY_LEN: usize = ENTRY_SPACE / 2 - VALUE_LEN;

const MAGIC_OFF: usize = 0;
const VERSION_OFF: usize = 2;
const LEVEL_OFF: usize = 3;
const COUNT_OFF: usize = 4;
const KEY_LEN_OFF: usize = 6;
const CHECKSUM_OFF: usize = 8;
/// Bytes before the first entry.
pub const HEADER_LEN: usize = 12;
const ENTRY_SPACE: usize = PAGE_SZ - HEADER_LEN;
/// A leaf entry's value.
const VALUE_LEN: usize = 8;
/// An internal entry's child block number.
const CHILD_LEN: usize = 4;

/// Entries per leaf for keys of `key_len` bytes.
pub const fn leaf_capacity(key_len: usize) -> usize {
    ENTRY_SPACE / (key_len + VALUE_LEN)
}

/// Entries (children) per internal node for keys of `key_len` bytes.
pub const fn internal_capacity(key_len: usize) -> usize {
    ENTRY_SPACE / (key_len + CHILD_LEN)
}

const fn entry_len(key_len: usize, level: u8) -> usize {
    key_len + if level == 0 { VALUE_LEN } else { CHILD_LEN }
}

const fn capacity(key_len: usize, level: u8) -> usize {
    ENTRY_SPACE / entry_len(key_len, level)
}

/// The checksum of a node: CRC-32C over the whole block except the checksum field itself.
fn node_checksum(block: &[u8; PAGE_SZ]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&block[..CHECKSUM_OFF]), &block[HEADER_LEN..])
}

/// `a < b` for keys of equal length, eight bytes at a time: the same as comparing the slices,
/// but it saves a `memcmp` call per key when checking a node's order, which is most of the cost
/// of reading a node after its checksum.
fn key_less(a: &[u8], b: &[u8]) -> bool {
    let mut a_words = a.chunks_exact(8);
    let mut b_words = b.chunks_exact(8);
    for (x, y) in (&mut a_words).zip(&mut b_words) {
        let (x, y) = (
            u64::from_be_bytes(array_at(x, 0)),
            u64::from_be_bytes(array_at(y, 0)),
        );
        if x != y {
            return x < y;
        }
    }
    a_words.remainder() < b_words.remainder()
}

// ---------------------------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------------------------

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
    levels: Vec<OpenNode>,
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
struct OpenNode {
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

// ---------------------------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------------------------

#[derive(Debug, thiserror::Error)]
pub enum BtreeReadError {
    #[error(transparent)]
    Block(#[from] BlockReadError),
    #[error("B-tree block {blkno} is corrupt: {reason}")]
    Corrupt { blkno: u32, reason: Corruption },
}

/// What is wrong with a corrupt node; see the module docs' *Invariants*.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Corruption {
    #[error("bad magic {found:#06x}, expected {BTREE_MAGIC:#06x}")]
    BadMagic { found: u16 },
    #[error("unknown format version {found}")]
    UnknownVersion { found: u8 },
    #[error("checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum { stored: u32, computed: u32 },
    #[error("key length {found}, but this reader expects {expected}")]
    KeyLen { found: u16, expected: usize },
    #[error("level {level} is not below the maximum height {MAX_HEIGHT}")]
    LevelTooHigh { level: u8 },
    #[error("{count} entries do not fit in a level-{level} node (at most {capacity})")]
    CountTooLarge {
        level: u8,
        count: usize,
        capacity: usize,
    },
    #[error("entry {index} is not greater than the entry before it")]
    Unsorted { index: usize },
    #[error("a level-{level} node has no entries, and only an empty root leaf may")]
    EmptyNode { level: u8 },
    #[error("level {found}, but its parent at level {parent_level} requires {expected}")]
    Level {
        found: u8,
        parent_level: u8,
        expected: u8,
    },
    #[error("entry {index} points to block {child}, outside {first_blk}..{parent_blk} (children are written before their parent)")]
    ChildOutOfRange {
        index: usize,
        child: u32,
        first_blk: u32,
        parent_blk: u32,
    },
    #[error("the root is below the tree's first block {first_blk}")]
    RootOutOfRange { first_blk: u32 },
    #[error("its first key differs from the key of entry {index} in parent block {parent_blk}")]
    SeparatorMismatch { parent_blk: u32, index: usize },
    #[error("its last key is not below the next key of its parent block {parent_blk}")]
    KeyAboveBound { parent_blk: u32 },
}

/// A validated view of one node's entries.
struct Node<'b, const KEY_LEN: usize> {
    level: u8,
    /// Exactly `count` entries.
    entries: &'b [u8],
}

/// Whether `block` passes the checks a reader makes on every node by itself (invariants 1–3):
/// for a block reader that verifies index blocks before caching them (see
/// [`BlockReader::cached_blocks_verified`]).
pub fn node_is_valid<const KEY_LEN: usize>(block: &[u8; PAGE_SZ]) -> bool {
    Node::<KEY_LEN>::parse(0, block).is_ok()
}

impl<'b, const KEY_LEN: usize> Node<'b, KEY_LEN> {
    /// A node whose block passed [`Node::parse`] before (it came from a cache that holds only
    /// verified nodes): the checksum and the key order are not checked again, which is most of
    /// the work of a hot lookup. The header is still bounds-checked, so even a broken promise
    /// cannot make a read go out of the block.
    fn parse_verified(blkno: u32, block: &'b [u8; PAGE_SZ]) -> Result<Self, BtreeReadError> {
        let level = block[LEVEL_OFF];
        let count = usize::from(u16::from_be_bytes(array_at(block, COUNT_OFF)));
        let entries = (usize::from(level) < MAX_HEIGHT && count <= capacity(KEY_LEN, level))
            .then(|| block.get(HEADER_LEN..HEADER_LEN + count * entry_len(KEY_LEN, level)))
            .flatten();
        match entries {
            Some(entries) => Ok(Node { level, entries }),
            // Not a verified node after all: check it in full to say what is wrong.
            None => Self::parse(blkno, block),
        }
    }

    /// Checks invariants 1–3 of block `blkno`; the checks that need the parent are in
    /// [`DiskBtreeReader::child`].
    fn parse(blkno: u32, block: &'b [u8; PAGE_SZ]) -> Result<Self, BtreeReadError> {
        let corrupt = |reason| BtreeReadError::Corrupt { blkno, reason };
        let magic = u16::from_be_bytes(array_at(block, MAGIC_OFF));
        if magic != BTREE_MAGIC {
            return Err(corrupt(Corruption::BadMagic { found: magic }));
        }
        // Before the checksum, so a node of a future format is reported as such, not as damage.
        let version = block[VERSION_OFF];
        if version != BTREE_FORMAT_VERSION {
            return Err(corrupt(Corruption::UnknownVersion { found: version }));
        }
        let stored = u32::from_be_bytes(array_at(block, CHECKSUM_OFF));
        let computed = node_checksum(block);
        if stored != computed {
            return Err(corrupt(Corruption::Checksum { stored, computed }));
        }
        let key_len = u16::from_be_bytes(array_at(block, KEY_LEN_OFF));
        if usize::from(key_len) != KEY_LEN {
            return Err(corrupt(Corruption::KeyLen {
                found: key_len,
                expected: KEY_LEN,
            }));
        }
        let level = block[LEVEL_OFF];
        if usize::from(level) >= MAX_HEIGHT {
            return Err(corrupt(Corruption::LevelTooHigh { level }));
        }
        let count = usize::from(u16::from_be_bytes(array_at(block, COUNT_OFF)));
        let capacity = capacity(KEY_LEN, level);
        let too_many = || {
            corrupt(Corruption::CountTooLarge {
                level,
                count,
                capacity,
            })
        };
        if count > capacity {
            return Err(too_many());
        }
        // In bounds after the capacity check; `get` keeps it so without relying on that.
        let entries = block
            .get(HEADER_LEN..HEADER_LEN + count * entry_len(KEY_LEN, level))
            .ok_or_else(too_many)?;
        let node = Node { level, entries };
        for index in 1..count {
            if !key_less(node.key(index - 1), node.key(index)) {
                return Err(corrupt(Corruption::Unsorted { index }));
            }
        }
        Ok(node)
    }

    fn entry_len(&self) -> usize {
        entry_len(KEY_LEN, self.level)
    }

    fn count(&self) -> usize {
        self.entries.len() / self.entry_len()
    }

    /// The key of entry `i < count`.
    fn key(&self, i: usize) -> &'b [u8] {
        let off = i * self.entry_len();
        &self.entries[off..off + KEY_LEN]
    }

    fn key_array(&self, i: usize) -> [u8; KEY_LEN] {
        array_at(self.entries, i * self.entry_len())
    }

    /// The value of leaf entry `i < count`.
    fn value(&self, i: usize) -> u64 {
        u64::from_be_bytes(array_at(self.entries, i * self.entry_len() + KEY_LEN))
    }

    /// The child block of internal entry `i < count`.
    fn child(&self, i: usize) -> u32 {
        u32::from_be_bytes(array_at(self.entries, i * self.entry_len() + KEY_LEN))
    }

    /// How many entries have a key `<= key` (with `inclusive`) or `< key`: a binary search,
    /// valid because `parse` checked the keys are sorted.
    fn rank(&self, key: &[u8; KEY_LEN], inclusive: bool) -> usize {
        let (mut lo, mut hi) = (0, self.count());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let k = self.key(mid);
            let below = if inclusive {
                !key_less(key, k)
            } else {
                key_less(k, key)
            };
            if below {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }
}

/// One node on a root-to-leaf path, with the lease that keeps its block readable.
struct Frame<'a, const KEY_LEN: usize> {
    blkno: u32,
    lease: BlockLease<'a>,
    level: u8,
    count: usize,
    /// Every key of this subtree is below this (invariant 7); `None` on the tree's right edge.
    upper: Option<[u8; KEY_LEN]>,
    /// Internal node: the child on the path. Leaf, scanning forward: the next entry to yield;
    /// backward: one past it.
    pos: usize,
}

impl<const KEY_LEN: usize> Frame<'_, KEY_LEN> {
    fn node(&self) -> Node<'_, KEY_LEN> {
        // These bytes were bounds-checked by `Node::parse` when the frame was made.
        Node {
            level: self.level,
            entries: &self.lease
                [HEADER_LEN..HEADER_LEN + self.count * entry_len(KEY_LEN, self.level)],
        }
    }
}

/// Reads a tree written by [`DiskBtreeBuilder`]; see the module docs.
///
/// Point lookups read exactly the blocks on one root-to-leaf path, through the given
/// [`BlockReader`]; the reader keeps no state of its own, so it is cheap to create per lookup.
pub struct DiskBtreeReader<'a, const KEY_LEN: usize, R: BlockReader + ?Sized> {
    root_blk: u32,
    first_blk: u32,
    reader: &'a R,
}

impl<const KEY_LEN: usize, R: BlockReader + ?Sized> Clone for DiskBtreeReader<'_, KEY_LEN, R> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<const KEY_LEN: usize, R: BlockReader + ?Sized> Copy for DiskBtreeReader<'_, KEY_LEN, R> {}

impl<'a, const KEY_LEN: usize, R: BlockReader + ?Sized> DiskBtreeReader<'a, KEY_LEN, R> {
    pub fn new(root_blk: u32, reader: &'a R) -> Self {
        const {
            assert!(
                KEY_LEN >= 1 && KEY_LEN <= MAX_KEY_LEN,
                "KEY_LEN must be between 1 and MAX_KEY_LEN"
            )
        };
        DiskBtreeReader {
            root_blk,
            first_blk: 0,
            reader,
        }
    }

    /// Refuse pointers below `first_blk` as corrupt: in a file where the tree follows other
    /// data, nothing below the tree's first block is a node of it.
    #[must_use]
    pub fn with_first_blk(mut self, first_blk: u32) -> Self {
        self.first_blk = first_blk;
        self
    }

    pub fn root_blk(&self) -> u32 {
        self.root_blk
    }

    /// The value stored under `key`.
    pub fn get(&self, key: &[u8; KEY_LEN]) -> Result<Option<u64>, BtreeReadError> {
        Ok(self
            .find_at_or_below(key)?
            .filter(|(found, _)| found == key)
            .map(|(_, value)| value))
    }

    /// The entry with the greatest key `<= key`, if any. Reads one block per level.
    pub fn find_at_or_below(
        &self,
        key: &[u8; KEY_LEN],
    ) -> Result<Option<([u8; KEY_LEN], u64)>, BtreeReadError> {
        let mut frame = self.root()?;
        // Each step goes down one level (invariant 5), so this ends within MAX_HEIGHT steps.
        loop {
            let node = frame.node();
            // Below the root a node's first key is the key that led here, so it is `<= key` and
            // `rank` is at least 1; 0 means `key` is below the whole tree.
            let Some(i) = node.rank(key, true).checked_sub(1) else {
                return Ok(None);
            };
            if node.level == 0 {
                return Ok(Some((node.key_array(i), node.value(i))));
            }
            frame = self.child(&frame, i)?;
        }
    }

    /// Entries with keys `>= start`, in increasing key order.
    pub fn iter_from(&self, start: &[u8; KEY_LEN]) -> DiskBtreeIter<'a, KEY_LEN, R> {
        DiskBtreeIter::new(*self, *start, Direction::Forward)
    }

    /// Entries with keys `<= start`, in decreasing key order: for a delta layer, the versions of
    /// a page from the newest at or below an LSN back to the oldest, then the pages before it.
    pub fn iter_backward_from(&self, start: &[u8; KEY_LEN]) -> DiskBtreeIter<'a, KEY_LEN, R> {
        DiskBtreeIter::new(*self, *start, Direction::Backward)
    }

    /// Calls `visitor` with every entry whose key is `>= start`, in increasing key order, until
    /// it returns `false`. Returns `Ok(true)` if every such entry was visited, `Ok(false)` if the
    /// visitor stopped early. Entries visited before an error have been visited.
    pub fn visit_from(
        &self,
        start: &[u8; KEY_LEN],
        visitor: impl FnMut(&[u8; KEY_LEN], u64) -> bool,
    ) -> Result<bool, BtreeReadError> {
        visit(self.iter_from(start), visitor)
    }

    /// [`Self::visit_from`] in decreasing key order, from the greatest key `<= start`.
    pub fn visit_backward_from(
        &self,
        start: &[u8; KEY_LEN],
        visitor: impl FnMut(&[u8; KEY_LEN], u64) -> bool,
    ) -> Result<bool, BtreeReadError> {
        visit(self.iter_backward_from(start), visitor)
    }

    fn root(&self) -> Result<Frame<'a, KEY_LEN>, BtreeReadError> {
        if self.root_blk < self.first_blk {
            return Err(BtreeReadError::Corrupt {
                blkno: self.root_blk,
                reason: Corruption::RootOutOfRange {
                    first_blk: self.first_blk,
                },
            });
        }
        let frame = self.load(self.root_blk, None)?;
        if frame.count == 0 && frame.level > 0 {
            return Err(BtreeReadError::Corrupt {
                blkno: frame.blkno,
                reason: Corruption::EmptyNode { level: frame.level },
            });
        }
        Ok(frame)
    }

    /// Reads the child of entry `index` of `parent`, checking invariants 4–7.
    fn child(
        &self,
        parent: &Frame<'a, KEY_LEN>,
        index: usize,
    ) -> Result<Frame<'a, KEY_LEN>, BtreeReadError> {
        let pnode = parent.node();
        let child_blk = pnode.child(index);
        if child_blk < self.first_blk || child_blk >= parent.blkno {
            return Err(BtreeReadError::Corrupt {
                blkno: parent.blkno,
                reason: Corruption::ChildOutOfRange {
                    index,
                    child: child_blk,
                    first_blk: self.first_blk,
                    parent_blk: parent.blkno,
                },
            });
        }
        let upper = if index + 1 < pnode.count() {
            Some(pnode.key_array(index + 1))
        } else {
            parent.upper
        };
        let frame = self.load(child_blk, upper)?;
        let corrupt = |reason| BtreeReadError::Corrupt {
            blkno: child_blk,
            reason,
        };
        // A parent is at level >= 1 (only internal nodes have children).
        let expected = parent.level - 1;
        if frame.level != expected {
            return Err(corrupt(Corruption::Level {
                found: frame.level,
                parent_level: parent.level,
                expected,
            }));
        }
        let node = frame.node();
        if frame.count == 0 {
            return Err(corrupt(Corruption::EmptyNode { level: frame.level }));
        }
        if node.key(0) != pnode.key(index) {
            return Err(corrupt(Corruption::SeparatorMismatch {
                parent_blk: parent.blkno,
                index,
            }));
        }
        if let Some(upper) = &upper {
            if node.key(frame.count - 1) >= &upper[..] {
                return Err(corrupt(Corruption::KeyAboveBound {
                    parent_blk: parent.blkno,
                }));
            }
        }
        Ok(frame)
    }

    /// Reads and parses block `blkno`.
    fn load(
        &self,
        blkno: u32,
        upper: Option<[u8; KEY_LEN]>,
    ) -> Result<Frame<'a, KEY_LEN>, BtreeReadError> {
        let lease = self.reader.read_blk(blkno)?;
        let verified =
            matches!(lease, BlockLease::Cached(_)) && self.reader.cached_blocks_verified();
        let (level, count) = {
            let node = if verified {
                Node::<KEY_LEN>::parse_verified(blkno, &lease)?
            } else {
                Node::<KEY_LEN>::parse(blkno, &lease)?
            };
            (node.level, node.count())
        };
        Ok(Frame {
            blkno,
            lease,
            level,
            count,
            upper,
            pos: 0,
        })
    }
}

fn visit<const KEY_LEN: usize, R: BlockReader + ?Sized>(
    iter: DiskBtreeIter<'_, KEY_LEN, R>,
    mut visitor: impl FnMut(&[u8; KEY_LEN], u64) -> bool,
) -> Result<bool, BtreeReadError> {
    for entry in iter {
        let (key, value) = entry?;
        if !visitor(&key, value) {
            return Ok(false);
        }
    }
    Ok(true)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Forward,
    Backward,
}

enum IterState<const KEY_LEN: usize> {
    /// Nothing read yet: the first `next` descends towards this key.
    Unstarted([u8; KEY_LEN]),
    Running,
    Done,
}

/// An iterator over a tree's entries in key order (forward or backward); see
/// [`DiskBtreeReader::iter_from`]. It holds a lease on each block of the current root-to-leaf
/// path (at most [`MAX_HEIGHT`]) and reads each node once. After an error it ends.
pub struct DiskBtreeIter<'a, const KEY_LEN: usize, R: BlockReader + ?Sized> {
    tree: DiskBtreeReader<'a, KEY_LEN, R>,
    direction: Direction,
    state: IterState<KEY_LEN>,
    /// Root first. Empty when there is nothing (more) to yield.
    path: Vec<Frame<'a, KEY_LEN>>,
}

impl<'a, const KEY_LEN: usize, R: BlockReader + ?Sized> DiskBtreeIter<'a, KEY_LEN, R> {
    fn new(
        tree: DiskBtreeReader<'a, KEY_LEN, R>,
        start: [u8; KEY_LEN],
        direction: Direction,
    ) -> Self {
        DiskBtreeIter {
            tree,
            direction,
            state: IterState::Unstarted(start),
            path: Vec::new(),
        }
    }

    /// Builds the path to the first entry to yield.
    fn seek(&mut self, key: &[u8; KEY_LEN]) -> Result<(), BtreeReadError> {
        let mut frame = self.tree.root()?;
        loop {
            let node = frame.node();
            if node.level == 0 {
                frame.pos = match self.direction {
                    Direction::Forward => node.rank(key, false),
                    Direction::Backward => node.rank(key, true),
                };
                self.path.push(frame);
                return Ok(());
            }
            // Descend into the last child whose key is <= `key`: the only one that can hold the
            // greatest key <= `key`, and the one before the first key >= `key`.
            let index = match (node.rank(key, true).checked_sub(1), self.direction) {
                (Some(i), _) => i,
                // `key` is below every key here: forward, start at the leftmost entry...
                (None, Direction::Forward) => 0,
                // ...backward, there is nothing to yield.
                (None, Direction::Backward) => {
                    self.path.clear();
                    return Ok(());
                }
            };
            frame.pos = index;
            let child = self.tree.child(&frame, index)?;
            self.path.push(frame);
            frame = child;
        }
    }

    /// The next entry, moving to the next leaf when this one is used up.
    fn step(&mut self) -> Result<Option<([u8; KEY_LEN], u64)>, BtreeReadError> {
        loop {
            let Some(leaf) = self.path.last_mut() else {
                return Ok(None);
            };
            let index = match self.direction {
                Direction::Forward if leaf.pos < leaf.count => {
                    leaf.pos += 1;
                    Some(leaf.pos - 1)
                }
                Direction::Backward if leaf.pos > 0 => {
                    leaf.pos -= 1;
                    Some(leaf.pos)
                }
                _ => None,
            };
            if let Some(i) = index {
                let node = leaf.node();
                return Ok(Some((node.key_array(i), node.value(i))));
            }
            // The leaf is used up: climb to the nearest ancestor with another child this way...
            self.path.pop();
            loop {
                let Some(parent) = self.path.last_mut() else {
                    return Ok(None);
                };
                match self.direction {
                    Direction::Forward if parent.pos + 1 < parent.count => {
                        parent.pos += 1;
                        break;
                    }
                    Direction::Backward if parent.pos > 0 => {
                        parent.pos -= 1;
                        break;
                    }
                    _ => {
                        self.path.pop();
                    }
                }
            }
            // ...and go down its edge to a leaf, which is not empty (invariant 4).
            self.descend_edge()?;
        }
    }

    /// From the last frame (an internal node at its `pos`), descends along the leftmost
    /// (forward) or rightmost (backward) children to a leaf.
    fn descend_edge(&mut self) -> Result<(), BtreeReadError> {
        while let Some(parent) = self.path.last().filter(|f| f.level > 0) {
            let mut child = self.tree.child(parent, parent.pos)?;
            child.pos = match self.direction {
                Direction::Forward => 0,
                Direction::Backward if child.level == 0 => child.count,
                Direction::Backward => child.count.saturating_sub(1),
            };
            self.path.push(child);
        }
        Ok(())
    }
}

impl<const KEY_LEN: usize, R: BlockReader + ?Sized> Iterator for DiskBtreeIter<'_, KEY_LEN, R> {
    type Item = Result<([u8; KEY_LEN], u64), BtreeReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        let result = match std::mem::replace(&mut self.state, IterState::Running) {
            IterState::Unstarted(start) => self.seek(&start).and_then(|()| self.step()),
            IterState::Running => self.step(),
            IterState::Done => {
                self.state = IterState::Done;
                return None;
            }
        };
        match result {
            Ok(Some(entry)) => Some(Ok(entry)),
            Ok(None) => {
                self.finish();
                None
            }
            Err(e) => {
                self.finish();
                Some(Err(e))
            }
        }
    }
}

impl<const KEY_LEN: usize, R: BlockReader + ?Sized> std::iter::FusedIterator
    for DiskBtreeIter<'_, KEY_LEN, R>
{
}

impl<const KEY_LEN: usize, R: BlockReader + ?Sized> DiskBtreeIter<'_, KEY_LEN, R> {
    /// Ends the iteration and releases the leases.
    fn finish(&mut self) {
        self.state = IterState::Done;
        self.path.clear();
    }
}

#[cfg(test)]
mod tests;
