//! What one read cost: layers visited, index and value blocks found in the page cache or not,
//! and the I/O done for the misses.
//!
//! A read runs on one thread from start to end (GetPage is synchronous storage code), so the
//! tally lives in a thread-local that [`measure`] sets up around the read and the block readers
//! add to as they go: no parameter threads through every layer, and code outside a `measure`
//! (flushes, background work) pays one thread-local check per block and records nothing.
//!
//! The text form, what the HTTP API returns in the `X-Read-Cost` header:
//! `layers=2 idx_hit=3 idx_miss=0 val_hit=0 val_miss=1 ios=1 bytes=8192 waits=0 downloads=0`.

use std::cell::Cell;
use std::fmt;

/// Which part of a layer a block belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    /// A B-tree node of a layer's index.
    Index,
    /// Value bytes: a delta layer's value blocks or an ephemeral file's.
    Value,
}

/// See the module documentation.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReadCost {
    pub layers: u32,
    pub idx_hit: u32,
    pub idx_miss: u32,
    pub val_hit: u32,
    pub val_miss: u32,
    /// Read calls issued to files.
    pub ios: u32,
    /// Bytes those calls read.
    pub bytes: u64,
    /// Missed blocks that another reader was already reading: this read waited for that I/O
    /// instead of issuing its own (counted as misses, with no I/O).
    pub waits: u32,
    /// Layer files the read needed that were not on the local disk: downloaded from remote
    /// storage by this read, or by another one it waited for.
    pub downloads: u32,
}

thread_local! {
    static CURRENT: Cell<Option<ReadCost>> = const { Cell::new(None) };
    /// Downloads done for this read before it ran (see [`carry_downloads`]).
    static CARRIED: Cell<u32> = const { Cell::new(0) };
}

/// Runs `read` and returns what it cost. Nested calls each see their own part only.
pub fn measure<T>(read: impl FnOnce() -> T) -> (T, ReadCost) {
    let carried = CARRIED.with(|c| c.replace(0));
    let start = ReadCost {
        downloads: carried,
        ..ReadCost::default()
    };
    let outer = CURRENT.with(|c| c.replace(Some(start)));
    let result = read();
    let cost = CURRENT.with(|c| c.replace(outer)).unwrap_or_default();
    (result, cost)
}

/// Counts `downloads` into the next [`measure`] on this thread: the layer downloads a read
/// waited for before it ran again (`tenant::admission`), which happened on other threads.
pub fn carry_downloads(downloads: u32) {
    CARRIED.with(|c| c.set(downloads));
}

fn update(change: impl FnOnce(&mut ReadCost)) {
    CURRENT.with(|current| {
        if let Some(mut cost) = current.get() {
            change(&mut cost);
            current.set(Some(cost));
        }
    });
}

/// A layer was asked for the key's versions.
pub(crate) fn layer_visited() {
    update(|c| c.layers += 1);
}

/// A block was needed; `hit` if the page cache (or an ephemeral file's tail) had it.
pub(crate) fn block(kind: BlockKind, hit: bool) {
    update(|c| match (kind, hit) {
        (BlockKind::Index, true) => c.idx_hit += 1,
        (BlockKind::Index, false) => c.idx_miss += 1,
        (BlockKind::Value, true) => c.val_hit += 1,
        (BlockKind::Value, false) => c.val_miss += 1,
    });
}

/// A missed block was read by another reader, and this one waited for it.
pub(crate) fn waited() {
    update(|c| c.waits += 1);
}

/// A layer file was downloaded (or its download waited for) for this read.
pub(crate) fn downloaded() {
    update(|c| c.downloads += 1);
}

/// A read call of `bytes` bytes went to a file.
pub(crate) fn io(bytes: u64) {
    update(|c| {
        c.ios += 1;
        c.bytes += bytes;
    });
}

impl fmt::Display for ReadCost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "layers={} idx_hit={} idx_miss={} val_hit={} val_miss={} ios={} bytes={} waits={} downloads={}",
            self.layers,
            self.idx_hit,
            self.idx_miss,
            self.val_hit,
            self.val_miss,
            self.ios,
            self.bytes,
            self.waits,
            self.downloads
        )
    }
}

/// Adds the cost of a read of `pages` pages to the server's totals (the `pageserver_read_*`
/// metrics); the layers-visited histogram gets the mean per page.
pub fn record(cost: &ReadCost, pages: usize) {
    let blocks = [
        ("index", "hit", cost.idx_hit),
        ("index", "miss", cost.idx_miss),
        ("value", "hit", cost.val_hit),
        ("value", "miss", cost.val_miss),
    ];
    for (kind, result, n) in blocks {
        crate::metrics::READ_BLOCKS
            .with_label_values(&[kind, result])
            .inc_by(u64::from(n));
    }
    crate::metrics::READ_IOS.inc_by(u64::from(cost.ios));
    crate::metrics::READ_BYTES.inc_by(cost.bytes);
    crate::metrics::READ_LAYERS.inc_by(u64::from(cost.layers));
    if pages > 0 {
        crate::metrics::GETPAGE_LAYERS_VISITED.observe(f64::from(cost.layers) / pages as f64);
    }
    crate::metrics::READ_WAITS.inc_by(u64::from(cost.waits));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_only_inside_measure_and_nests() {
        block(BlockKind::Index, false);
        let ((), outer) = measure(|| {
            layer_visited();
            block(BlockKind::Index, true);
            let ((), inner) = measure(|| {
                block(BlockKind::Value, false);
                io(8192);
            });
            assert_eq!(
                inner.to_string(),
                "layers=0 idx_hit=0 idx_miss=0 val_hit=0 val_miss=1 ios=1 bytes=8192 waits=0 downloads=0"
            );
            block(BlockKind::Value, true);
        });
        assert_eq!(
            outer.to_string(),
            "layers=1 idx_hit=1 idx_miss=0 val_hit=1 val_miss=0 ios=0 bytes=0 waits=0 downloads=0"
        );
    }
}
