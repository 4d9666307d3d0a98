//! B-tree nodes as a layer's index holds them, given whole to the reader: lookups and walks in
//! both directions over any blocks end with an answer or an error, never a panic or a hang
//! (a node that points back up the tree must not make a walk go round forever).

use pageserver::format::disk_btree::{DiskBtreeReader, VecBlockSink};
use pageserver::PAGE_SZ;

/// A delta layer's index key: the 18-byte key and the 8-byte LSN.
const KEY_LEN: usize = 26;
/// More entries than a walk is allowed to visit here: a walk that would go on is a loop.
const MAX_VISITS: usize = 100_000;

/// Checks one input; panics where the decoder breaks its contract.
pub fn check(input: &[u8]) {
    let [root, probe @ .., _] = input else {
        return;
    };
    let mut key = [0u8; KEY_LEN];
    let n = probe.len().min(KEY_LEN);
    key[..n].copy_from_slice(&probe[..n]);
    let mut sink = VecBlockSink::new();
    for chunk in input.chunks(PAGE_SZ).take(64) {
        let mut block = [0u8; PAGE_SZ];
        block[..chunk.len()].copy_from_slice(chunk);
        sink.blocks_mut().push(block);
    }
    let blocks = sink.blocks().len() as u32;
    let reader = DiskBtreeReader::<KEY_LEN, _>::new(u32::from(*root) % blocks, &sink);
    let _ = reader.get(&key);
    let _ = reader.find_at_or_below(&key);
    let mut visits = 0;
    let _ = reader.visit_from(&key, |_, _| {
        visits += 1;
        visits < MAX_VISITS
    });
    let mut visits = 0;
    let _ = reader.visit_backward_from(&key, |_, _| {
        visits += 1;
        visits < MAX_VISITS
    });
}
