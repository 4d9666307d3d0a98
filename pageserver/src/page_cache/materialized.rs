//! The version directory for materialized pages: which LSNs of a page are (probably) cached.
//!
//! Materialized pages are looked up as "the newest cached version of (tenant, timeline, key) at
//! or below LSN L", which an exact-key hash table cannot answer by itself. The directory maps
//! each page key to a small sorted list of the newest LSNs memorized for it (at most
//! `versions_per_key`) and to a directory id; the pages themselves live in ordinary cache slots
//! under the exact 16-byte key `(MATERIALIZED_BIT | id, lsn)`.
//!
//! A lookup reads the candidate LSNs under a shard's read lock, drops the lock, and then probes
//! the slots lock-free, newest candidate first. The directory is a hint, never the truth: a
//! candidate whose slot was evicted is simply skipped, and the slot key is verified on every hit,
//! so a stale or lost directory update costs a miss and never a wrong page.
//!
//! Ids are never reused, so a page key whose directory entry was dropped and recreated cannot
//! reach slots of its previous life; those age out of the clock like any cold page.
//!
//! Lock order: a directory shard lock is never held while acquiring or claiming a slot. The
//! evictor, which owns a slot in Construction, may take a shard lock to forget that version.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

use pageserver_api::Key;
use utils::{Lsn, TenantId, TimelineId};

/// Marks a slot key as a materialized page rather than a file page (file ids stay below it).
pub(super) const MATERIALIZED_BIT: u64 = 1 << 63;

const SHARD_BITS: u32 = 6;
const SHARDS: usize = 1 << SHARD_BITS;

/// Most versions a directory entry can list; `materialized_versions_per_key` is capped to it.
pub const MAX_VERSIONS_PER_KEY: usize = 8;

/// The identity of a materialized page, without its LSN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaterializedPageKey {
    pub tenant_id: TenantId,
    pub timeline_id: TimelineId,
    pub key: Key,
}

impl MaterializedPageKey {
    /// A well-mixed 64-bit hash of all 50 bytes. One hash serves both the shard choice and the
    /// shard's map, which uses it as is (the default SipHash over each field cost more than the
    /// rest of a lookup).
    fn fingerprint(&self) -> u64 {
        let word = |b: &[u8]| {
            let mut w = [0u8; 8];
            w[..b.len()].copy_from_slice(b);
            u64::from_le_bytes(w)
        };
        let tenant = self.tenant_id.as_bytes();
        let timeline = self.timeline_id.as_bytes();
        let key = self.key.to_bytes();
        let words = [
            word(&tenant[..8]),
            word(&tenant[8..]),
            word(&timeline[..8]),
            word(&timeline[8..]),
            word(&key[..8]),
            word(&key[8..16]),
            word(&key[16..]),
        ];
        words
            .iter()
            .fold(0x243f_6a88_85a3_08d3, |h, w| super::mix(h ^ w))
    }
}

impl Hash for MaterializedPageKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.fingerprint());
    }
}

/// Passes a [`MaterializedPageKey::fingerprint`] through unchanged.
#[derive(Default)]
struct FingerprintHasher(u64);

impl Hasher for FingerprintHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is expected; stay correct (if slower) for anything else.
        for b in bytes {
            self.0 = super::mix(self.0 ^ u64::from(*b));
        }
    }

    fn write_u64(&mut self, fingerprint: u64) {
        self.0 = fingerprint;
    }
}

type FingerprintMap<V> = HashMap<MaterializedPageKey, V, BuildHasherDefault<FingerprintHasher>>;

struct Entry {
    id: u64,
    /// Ascending, at most `versions_per_key`.
    lsns: Vec<Lsn>,
}

#[derive(Default)]
struct Shard {
    by_key: FingerprintMap<Entry>,
    key_of_id: HashMap<u64, MaterializedPageKey>,
}

pub(super) struct Directory {
    shards: Box<[RwLock<Shard>]>,
    next_id: AtomicU64,
    versions_per_key: usize,
}

/// Candidate versions for one lookup, newest first.
pub(super) struct Candidates {
    pub id: u64,
    lsns: [Lsn; MAX_VERSIONS_PER_KEY],
    len: usize,
}

impl Candidates {
    pub(super) fn newest_first(&self) -> &[Lsn] {
        &self.lsns[..self.len]
    }
}

impl Directory {
    pub(super) fn new(versions_per_key: usize) -> Self {
        Directory {
            shards: (0..SHARDS).map(|_| RwLock::new(Shard::default())).collect(),
            next_id: AtomicU64::new(1),
            versions_per_key: versions_per_key.min(MAX_VERSIONS_PER_KEY),
        }
    }

    pub(super) fn enabled(&self) -> bool {
        self.versions_per_key > 0
    }

    fn shard_index(key: &MaterializedPageKey) -> usize {
        // The shard's hash map takes bucket positions from the low bits of the same fingerprint
        // and its control tags from the top 7, so the shard comes from bits in between: keys of
        // one shard must still differ in the bits the map uses.
        ((key.fingerprint() >> 32) as usize) & (SHARDS - 1)
    }

    fn shard_of_key(&self, key: &MaterializedPageKey) -> &RwLock<Shard> {
        &self.shards[Self::shard_index(key)]
    }

    fn shard_of_id(&self, id: u64) -> &RwLock<Shard> {
        &self.shards[(id as usize) & (SHARDS - 1)]
    }

    /// The cached LSNs of `key` at or below `lsn`, newest first.
    pub(super) fn candidates(&self, key: &MaterializedPageKey, lsn: Lsn) -> Option<Candidates> {
        let shard = self
            .shard_of_key(key)
            .read()
            .unwrap_or_else(|e| e.into_inner());
        let entry = shard.by_key.get(key)?;
        let below = entry.lsns.partition_point(|l| *l <= lsn);
        if below == 0 {
            return None;
        }
        let mut candidates = Candidates {
            id: entry.id,
            lsns: [Lsn::INVALID; MAX_VERSIONS_PER_KEY],
            len: below,
        };
        for (dst, src) in candidates
            .lsns
            .iter_mut()
            .zip(entry.lsns[..below].iter().rev())
        {
            *dst = *src;
        }
        Some(candidates)
    }

    /// Records that version `lsn` of `key` is being cached; returns the directory id to store it
    /// under, or `None` when the key already lists `versions_per_key` newer versions (caching it
    /// would fill a slot no lookup can reach).
    pub(super) fn remember(&self, key: &MaterializedPageKey, lsn: Lsn) -> Option<u64> {
        let mut shard = self
            .shard_of_key(key)
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let shard = &mut *shard;
        let entry = shard.by_key.entry(*key).or_insert_with(|| {
            // The shard travels in the id so that eviction finds it without the key's hash.
            let serial = self.next_id.fetch_add(1, Ordering::Relaxed);
            let id = (serial << SHARD_BITS) | Self::shard_index(key) as u64;
            shard.key_of_id.insert(id, *key);
            Entry {
                id,
                lsns: Vec::with_capacity(self.versions_per_key + 1),
            }
        });
        match entry.lsns.binary_search(&lsn) {
            Ok(_) => Some(entry.id),
            Err(0) if entry.lsns.len() >= self.versions_per_key => None,
            Err(pos) => {
                entry.lsns.insert(pos, lsn);
                if entry.lsns.len() > self.versions_per_key {
                    // Forget the oldest version; its slot ages out unreachable.
                    entry.lsns.remove(0);
                }
                Some(entry.id)
            }
        }
    }

    /// Forgets version `lsn` of directory id `id` (its slot was evicted or never filled).
    pub(super) fn forget(&self, id: u64, lsn: Lsn) {
        let mut shard = self
            .shard_of_id(id)
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let shard = &mut *shard;
        let Some(key) = shard.key_of_id.get(&id).copied() else {
            return;
        };
        let Some(entry) = shard.by_key.get_mut(&key) else {
            return;
        };
        if let Ok(pos) = entry.lsns.binary_search(&lsn) {
            entry.lsns.remove(pos);
        }
        if entry.lsns.is_empty() {
            shard.by_key.remove(&key);
            shard.key_of_id.remove(&id);
        }
    }

    /// Number of page keys with a directory entry (tests: the directory must not outgrow the cache).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.read().unwrap_or_else(|e| e.into_inner()).by_key.len())
            .sum()
    }
}
