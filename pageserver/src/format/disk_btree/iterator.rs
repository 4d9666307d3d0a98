//! Walking a tree's entries in key order, forward or backward: [`DiskBtreeIter`].
//!
//! The tree has no sibling links (a leaf is written before its successor's block number is
//! known), so the iterator keeps the root-to-leaf path, one `Frame` per level (at most
//! [`MAX_HEIGHT`](super::MAX_HEIGHT)), and at the end of a leaf climbs to the nearest ancestor
//! with another child that way and goes down its edge. Every node on the way is read once and checked by the
//! reader as on a lookup, so entries come out strictly increasing (or decreasing) and no node
//! is read twice. After an error the iteration ends.

use super::reader::{BtreeReadError, DiskBtreeReader, Frame};
use crate::format::block_io::BlockReader;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Direction {
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
/// path (at most [`MAX_HEIGHT`](super::MAX_HEIGHT)) and reads each node once. After an error
/// it ends.
pub struct DiskBtreeIter<'a, const KEY_LEN: usize, R: BlockReader + ?Sized> {
    tree: DiskBtreeReader<'a, KEY_LEN, R>,
    direction: Direction,
    state: IterState<KEY_LEN>,
    /// Root first. Empty when there is nothing (more) to yield.
    path: Vec<Frame<'a, KEY_LEN>>,
}

impl<'a, const KEY_LEN: usize, R: BlockReader + ?Sized> DiskBtreeIter<'a, KEY_LEN, R> {
    pub(super) fn new(
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

/// The reader's walks in key order, here beside the iterator they use.
impl<'a, const KEY_LEN: usize, R: BlockReader + ?Sized> DiskBtreeReader<'a, KEY_LEN, R> {
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
