//! Reading a tree: [`DiskBtreeReader`] answers point lookups and starts iterations, and
//! every node it reads is checked against the parent module's *Invariants* first.
//!
//! A node is checked in two steps: by itself when its block is read (`Node::parse`: magic,
//! version, checksum, key length, level, count, key order), then against its parent when it is
//! reached from one (`DiskBtreeReader::child`: level, block number below the parent's, first
//! key equal to the parent's separator, last key below the parent's next key). A `Frame` is a
//! node that passed both, with the lease that keeps its block readable; the iterator builds its
//! root-to-leaf path out of them. A corrupt node is a [`BtreeReadError::Corrupt`], never a
//! panic.

use super::{
    capacity, entry_len, key_less, node_checksum, BTREE_FORMAT_VERSION, BTREE_MAGIC, CHECKSUM_OFF,
    COUNT_OFF, HEADER_LEN, KEY_LEN_OFF, LEVEL_OFF, MAGIC_OFF, MAX_HEIGHT, MAX_KEY_LEN, VERSION_OFF,
};
use crate::format::array_at;
use crate::format::block_io::{BlockLease, BlockReadError, BlockReader};
use crate::PAGE_SZ;

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
pub(super) struct Node<'b, const KEY_LEN: usize> {
    pub(super) level: u8,
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
    pub(super) fn parse(blkno: u32, block: &'b [u8; PAGE_SZ]) -> Result<Self, BtreeReadError> {
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

    pub(super) fn count(&self) -> usize {
        self.entries.len() / self.entry_len()
    }

    /// The key of entry `i < count`.
    pub(super) fn key(&self, i: usize) -> &'b [u8] {
        let off = i * self.entry_len();
        &self.entries[off..off + KEY_LEN]
    }

    pub(super) fn key_array(&self, i: usize) -> [u8; KEY_LEN] {
        array_at(self.entries, i * self.entry_len())
    }

    /// The value of leaf entry `i < count`.
    pub(super) fn value(&self, i: usize) -> u64 {
        u64::from_be_bytes(array_at(self.entries, i * self.entry_len() + KEY_LEN))
    }

    /// The child block of internal entry `i < count`.
    pub(super) fn child(&self, i: usize) -> u32 {
        u32::from_be_bytes(array_at(self.entries, i * self.entry_len() + KEY_LEN))
    }

    /// How many entries have a key `<= key` (with `inclusive`) or `< key`: a binary search,
    /// valid because `parse` checked the keys are sorted.
    pub(super) fn rank(&self, key: &[u8; KEY_LEN], inclusive: bool) -> usize {
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
pub(super) struct Frame<'a, const KEY_LEN: usize> {
    blkno: u32,
    lease: BlockLease<'a>,
    pub(super) level: u8,
    pub(super) count: usize,
    /// Every key of this subtree is below this (invariant 7); `None` on the tree's right edge.
    upper: Option<[u8; KEY_LEN]>,
    /// Internal node: the child on the path. Leaf, scanning forward: the next entry to yield;
    /// backward: one past it.
    pub(super) pos: usize,
}

impl<const KEY_LEN: usize> Frame<'_, KEY_LEN> {
    pub(super) fn node(&self) -> Node<'_, KEY_LEN> {
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

    pub(super) fn root(&self) -> Result<Frame<'a, KEY_LEN>, BtreeReadError> {
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
    pub(super) fn child(
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
