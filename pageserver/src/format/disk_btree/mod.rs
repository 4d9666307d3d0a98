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
//!
//! # Files
//!
//! This file holds the node format: its constants, capacities, checksum and key order, which
//! the writer and the readers share. [`builder`] writes a tree ([`DiskBtreeBuilder`], and the
//! [`BlockSink`]s it writes to); [`reader`] checks nodes and answers point lookups
//! ([`DiskBtreeReader`]); [`iterator`] walks entries in key order ([`DiskBtreeIter`]). Only
//! this file knows byte offsets within a node; the others go through it.

mod builder;
mod iterator;
mod reader;

pub use builder::{BlockSink, BtreeBuildError, BtreeInfo, DiskBtreeBuilder, VecBlockSink};
pub use iterator::DiskBtreeIter;
pub use reader::{node_is_valid, BtreeReadError, Corruption, DiskBtreeReader};

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
    utils::crc32c::crc32c_append(
        utils::crc32c::crc32c(&block[..CHECKSUM_OFF]),
        &block[HEADER_LEN..],
    )
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

#[cfg(test)]
mod tests;
