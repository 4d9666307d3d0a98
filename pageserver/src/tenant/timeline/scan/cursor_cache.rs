//! The scan cursor cache: the state of paged key-range scans kept between pages, so the next
//! page resumes from its cursor's buffered version streams instead of seeking every layer
//! again.
//! The idea is Scylla's querier cache, fitted to layers.
//!
//! # Tokens
//!
//! Each page but the last comes with a `next_page_token`: an opaque string naming the cursor
//! kept for the next page, and everything needed to continue without it. URL-safe base64 (no
//! padding) of 89 bytes, integers big-endian:
//!
//! ```text
//! offset size field
//!      0    1 version        1
//!      1    8 cursor id      random; the cache key
//!      9   16 tenant id
//!     25   16 timeline id
//!     41    8 lsn            the scan's LSN
//!     49   18 end            the scan's exclusive end key
//!     67   18 last key       the scan continues after it
//!     85    4 CRC-32C of bytes 0..85
//! ```
//!
//! The checksum makes a mangled token an error rather than a different scan. It does not make a
//! token unforgeable, and need not: a token only ever continues a scan of the tenant and
//! timeline its request already names (checked against the path, which auth checks), and a
//! cursor is used only if it agrees with every field of the token, so the most a forged cursor
//! id can do is make another client's next page a miss that re-seeks to the same answer.
//!
//! # Lookup, drops, eviction
//!
//! A lookup *removes* the cursor (one request uses it at a time), and a page that leaves keys
//! stores its cursor again under a new id, returned in the new token: an old token never finds
//! a cursor that has moved on. Outcomes, counted as Scylla counts them:
//!
//! * **miss**: no cursor under the id (never kept, evicted, or expired): the page re-seeks from
//!   the token's last key. Same answer, more index reads.
//! * **hit**: the cursor was found. It is a **drop** too if it cannot be used: it disagrees with
//!   the token, or its layer set is gone (a freeze or flush happened), and the page re-seeks.
//!   Hits minus drops are the pages that really resumed.
//!
//! Cursors leave the cache when idle for `scan_cursor_idle_timeout` (evicted as *expired*) or
//! when the cached cursors together pass `scan_cursor_cache_size` bytes (as *size*, least
//! recently stored first: the newest cursors are the ones about to be used). A cursor's weight
//! is [`ScanCursor::approximate_bytes`] plus the cache's own per-entry overhead. moka's LRU
//! policy is used rather than its default TinyLFU, because every cursor is stored once and
//! looked up once: a frequency sketch would only ever refuse the newcomers.
//!
//! A cursor holds no lease, lock, file or layer (see `timeline::scan`), so an idle one costs
//! memory only, and dropping one at any time is always safe.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use bytes::Bytes;
use moka::notification::RemovalCause;
use moka::policy::EvictionPolicy;
use pageserver_api::Key;
use utils::{Lsn, TenantId, TimelineId};

use crate::format::array_at;
use crate::tenant::timeline::scan::ScanCursor;
use crate::tenant::timeline::{Timeline, TimelineError};

const TOKEN_VERSION: u8 = 1;
const KEY_LEN: usize = 18;
/// The length of a token's text: base64 of `token_off::LEN` bytes, without padding.
const TOKEN_CHARS: usize = (token_off::LEN * 4).div_ceil(3);

mod token_off {
    pub const VERSION: usize = 0;
    pub const CURSOR_ID: usize = 1;
    pub const TENANT: usize = 9;
    pub const TIMELINE: usize = 25;
    pub const LSN: usize = 41;
    pub const END: usize = 49;
    pub const LAST: usize = 67;
    pub const CHECKSUM: usize = 85;
    /// The whole token.
    pub const LEN: usize = 89;
}

/// What moka itself keeps per entry (key, timestamps, links), charged on top of the cursor.
const ENTRY_OVERHEAD: usize = 128;

/// A decoded `next_page_token`; see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanToken {
    pub cursor_id: u64,
    pub tenant_id: TenantId,
    pub timeline_id: TimelineId,
    pub lsn: Lsn,
    pub end: Key,
    pub last: Key,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("page_token is not URL-safe base64 without padding")]
    NotBase64,
    #[error("page_token is {chars} characters long; a token is {TOKEN_CHARS}")]
    WrongLength { chars: usize },
    #[error("page_token has version {version}, this server issues version {TOKEN_VERSION}")]
    UnknownVersion { version: u8 },
    #[error("page_token is damaged: its checksum does not match")]
    Checksum,
    #[error("page_token is damaged: its last key {last} is not below its end key {end}")]
    Inconsistent { last: Key, end: Key },
}

impl ScanToken {
    pub fn encode(&self) -> String {
        use token_off::*;
        let mut b = [0u8; LEN];
        b[VERSION] = TOKEN_VERSION;
        b[CURSOR_ID..CURSOR_ID + 8].copy_from_slice(&self.cursor_id.to_be_bytes());
        b[TENANT..TENANT + 16].copy_from_slice(self.tenant_id.as_bytes());
        b[TIMELINE..TIMELINE + 16].copy_from_slice(self.timeline_id.as_bytes());
        b[LSN..LSN + 8].copy_from_slice(&self.lsn.0.to_be_bytes());
        b[END..END + KEY_LEN].copy_from_slice(&self.end.to_bytes());
        b[LAST..LAST + KEY_LEN].copy_from_slice(&self.last.to_bytes());
        let crc = crc32c::crc32c(&b[..CHECKSUM]);
        b[CHECKSUM..CHECKSUM + 4].copy_from_slice(&crc.to_be_bytes());
        URL_SAFE_NO_PAD.encode(b)
    }

    /// Parses and checks a token from a client: any string at all.
    pub fn decode(text: &str) -> Result<ScanToken, TokenError> {
        use token_off::*;
        if text.len() != TOKEN_CHARS {
            return Err(TokenError::WrongLength { chars: text.len() });
        }
        let b: [u8; LEN] = URL_SAFE_NO_PAD
            .decode(text)
            .ok()
            .and_then(|bytes| bytes.try_into().ok())
            .ok_or(TokenError::NotBase64)?;
        if b[VERSION] != TOKEN_VERSION {
            return Err(TokenError::UnknownVersion {
                version: b[VERSION],
            });
        }
        let stored = u32::from_be_bytes(array_at(&b, CHECKSUM));
        if crc32c::crc32c(&b[..CHECKSUM]) != stored {
            return Err(TokenError::Checksum);
        }
        let u64_at = |o: usize| u64::from_be_bytes(array_at(&b, o));
        let id = |o: usize| array_at::<16>(&b, o);
        let key = |o: usize| Key::from_bytes(array_at(&b, o));
        let token = ScanToken {
            cursor_id: u64_at(CURSOR_ID),
            tenant_id: TenantId::from_bytes(id(TENANT)),
            timeline_id: TimelineId::from_bytes(id(TIMELINE)),
            lsn: Lsn(u64_at(LSN)),
            end: key(END),
            last: key(LAST),
        };
        // The scan continues at the key after `last`, which must exist.
        if token.last >= token.end {
            return Err(TokenError::Inconsistent {
                last: token.last,
                end: token.end,
            });
        }
        Ok(token)
    }
}

/// Why a token cannot continue the scan a request asks for.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenMismatch {
    #[error("page_token was issued for tenant {token}, not {request}")]
    Tenant { token: TenantId, request: TenantId },
    #[error("page_token was issued for timeline {token}, not {request}")]
    Timeline {
        token: TimelineId,
        request: TimelineId,
    },
    #[error("page_token was issued for a scan at LSN {token}, not {request}")]
    Lsn { token: Lsn, request: Lsn },
    #[error("page_token was issued for a scan ending at key {token}, not {request}")]
    End { token: Key, request: Key },
    #[error("page_token continues after key {last}, which is below start {start}")]
    Start { last: Key, start: Key },
}

impl ScanToken {
    /// Checks that the token continues the scan a request describes: a token is only good for
    /// the tenant, timeline, LSN and end it was issued for. `lsn` is `None` for `latest`,
    /// which then means the token's LSN.
    pub fn check_request(
        &self,
        tenant_id: TenantId,
        timeline_id: TimelineId,
        lsn: Option<Lsn>,
        start: Key,
        end: Key,
    ) -> Result<(), TokenMismatch> {
        if self.tenant_id != tenant_id {
            return Err(TokenMismatch::Tenant {
                token: self.tenant_id,
                request: tenant_id,
            });
        }
        if self.timeline_id != timeline_id {
            return Err(TokenMismatch::Timeline {
                token: self.timeline_id,
                request: timeline_id,
            });
        }
        if let Some(lsn) = lsn.filter(|l| *l != self.lsn) {
            return Err(TokenMismatch::Lsn {
                token: self.lsn,
                request: lsn,
            });
        }
        if self.end != end {
            return Err(TokenMismatch::End {
                token: self.end,
                request: end,
            });
        }
        if self.last < start {
            return Err(TokenMismatch::Start {
                last: self.last,
                start,
            });
        }
        Ok(())
    }
}

/// The cursor cache's settings.
#[derive(Debug, Clone, Copy)]
pub struct CursorCacheConfig {
    /// The most bytes the cached cursors may weigh together.
    pub capacity_bytes: u64,
    /// A cursor not used for this long is evicted.
    pub idle_timeout: Duration,
}

/// The counters, as `/metrics` reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CursorCacheStats {
    pub lookups: u64,
    pub hits: u64,
    pub misses: u64,
    pub drops: u64,
    pub inserts: u64,
    pub evictions_expired: u64,
    pub evictions_size: u64,
    /// Cursors held now.
    pub cursors: u64,
    /// What they weigh together.
    pub bytes: u64,
    pub capacity_bytes: u64,
}

#[derive(Default)]
struct Counters {
    lookups: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    drops: AtomicU64,
    inserts: AtomicU64,
    evictions_expired: AtomicU64,
    evictions_size: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// A kept cursor. moka hands out clones of its values, so the cursor itself sits behind a
/// lock that the lookup empties: exactly one request takes it.
struct CachedCursor {
    tenant_id: TenantId,
    timeline_id: TimelineId,
    cursor: Mutex<Option<ScanCursor>>,
    weight: u32,
    /// Set by the eviction listener when moka finds the cursor expired. A lookup can still
    /// remove an expired cursor that moka has not evicted yet; moka then reports the removal
    /// as an expiry, and the lookup, seeing this, counts a miss rather than use it.
    expired: AtomicBool,
}

/// Where a page starts.
#[derive(Debug, Clone, Copy)]
pub enum ScanFrom {
    /// The first page of a scan, from this key.
    Start(Key),
    /// A later page: after the token's last key, with its cursor if it is still cached.
    Token(ScanToken),
}

/// One page's request, already checked against the path (tenant, timeline) and itself.
#[derive(Debug, Clone, Copy)]
pub struct ScanRequest {
    pub lsn: Lsn,
    pub end: Key,
    pub from: ScanFrom,
    pub limit: usize,
}

/// One page's answer.
#[derive(Debug)]
pub struct ScanResult {
    pub entries: Vec<(Key, Bytes)>,
    /// `None` on the last page.
    pub next_page_token: Option<String>,
}

/// See the module documentation.
pub struct CursorCache {
    cursors: moka::sync::Cache<u64, Arc<CachedCursor>>,
    counters: Arc<Counters>,
    capacity_bytes: u64,
}

impl CursorCache {
    pub fn new(config: CursorCacheConfig) -> CursorCache {
        let counters = Arc::new(Counters::default());
        let evicted = counters.clone();
        let cursors = moka::sync::Cache::builder()
            .max_capacity(config.capacity_bytes)
            .weigher(|_id: &u64, cached: &Arc<CachedCursor>| cached.weight)
            .time_to_idle(config.idle_timeout)
            .eviction_policy(EvictionPolicy::lru())
            .eviction_listener(move |_id, cached: Arc<CachedCursor>, cause| match cause {
                RemovalCause::Expired => {
                    cached.expired.store(true, Ordering::Release);
                    bump(&evicted.evictions_expired);
                }
                RemovalCause::Size => bump(&evicted.evictions_size),
                // Our own lookups, and (with random 64-bit ids, practically never) an id
                // stored twice.
                RemovalCause::Explicit | RemovalCause::Replaced => {}
            })
            .build();
        CursorCache {
            cursors,
            counters,
            capacity_bytes: config.capacity_bytes,
        }
    }

    /// The next page of a scan of `timeline`. `request.lsn` must be ingested (the caller waits
    /// for it as a point read does).
    pub fn page(
        &self,
        timeline: &Timeline,
        request: ScanRequest,
    ) -> Result<ScanResult, TimelineError> {
        let (mut cursor, found) = match request.from {
            ScanFrom::Start(start) => (ScanCursor::new(start, request.end, request.lsn), false),
            ScanFrom::Token(token) => match self.take(&token) {
                Some(cursor) => (cursor, true),
                None => (ScanCursor::after(token.last, token.end, token.lsn), false),
            },
        };
        let page = timeline.scan_page(&mut cursor, request.limit)?;
        if found && !page.resumed {
            bump(&self.counters.drops);
        }
        let next_page_token = match (page.more, cursor.last()) {
            (true, Some(last)) => {
                let token = ScanToken {
                    cursor_id: self.keep(timeline, cursor),
                    tenant_id: timeline.tenant_id(),
                    timeline_id: timeline.timeline_id(),
                    lsn: request.lsn,
                    end: request.end,
                    last,
                };
                Some(token.encode())
            }
            _ => None,
        };
        Ok(ScanResult {
            entries: page.entries,
            next_page_token,
        })
    }

    /// Takes the cursor `token` names out of the cache, if it is there and agrees with the
    /// token. One that disagrees (only a forged token can find one) is dropped.
    fn take(&self, token: &ScanToken) -> Option<ScanCursor> {
        bump(&self.counters.lookups);
        let found = self
            .cursors
            .remove(&token.cursor_id)
            .filter(|cached| !cached.expired.load(Ordering::Acquire))
            .and_then(|cached| {
                // Removal hands the entry to one caller, so the cursor is still inside.
                let cursor = cached
                    .cursor
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take()?;
                Some((cached, cursor))
            });
        let Some((cached, cursor)) = found else {
            bump(&self.counters.misses);
            return None;
        };
        bump(&self.counters.hits);
        let agrees = cached.tenant_id == token.tenant_id
            && cached.timeline_id == token.timeline_id
            && cursor.lsn() == token.lsn
            && cursor.end() == token.end
            && cursor.last() == Some(token.last);
        if !agrees {
            bump(&self.counters.drops);
            return None;
        }
        Some(cursor)
    }

    /// Stores `cursor` under a new id, which it returns.
    fn keep(&self, timeline: &Timeline, mut cursor: ScanCursor) -> u64 {
        cursor.compact();
        let weight = u32::try_from(cursor.approximate_bytes() + ENTRY_OVERHEAD).unwrap_or(u32::MAX);
        let id = fastrand::u64(..);
        self.cursors.insert(
            id,
            Arc::new(CachedCursor {
                tenant_id: timeline.tenant_id(),
                timeline_id: timeline.timeline_id(),
                cursor: Mutex::new(Some(cursor)),
                weight,
                expired: AtomicBool::new(false),
            }),
        );
        bump(&self.counters.inserts);
        id
    }

    /// The counters, after moka has done its pending evictions (it does them lazily, so an
    /// expired cursor is counted once something looks).
    pub fn stats(&self) -> CursorCacheStats {
        self.cursors.run_pending_tasks();
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CursorCacheStats {
            lookups: get(&c.lookups),
            hits: get(&c.hits),
            misses: get(&c.misses),
            drops: get(&c.drops),
            inserts: get(&c.inserts),
            evictions_expired: get(&c.evictions_expired),
            evictions_size: get(&c.evictions_size),
            cursors: self.cursors.entry_count(),
            bytes: self.cursors.weighted_size(),
            capacity_bytes: self.capacity_bytes,
        }
    }
}

#[cfg(test)]
mod tests;
