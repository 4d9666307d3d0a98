//! The cluster's counters: what a checkpoint record carries besides the redo point (the next
//! transaction id, OID and multixact, and the oldest ones still in use), as of an LSN.
//!
//! Page ingest keeps them as the WAL moves them, so that a basebackup at any LSN can start
//! PostgreSQL from a checkpoint of its own making there (a shutdown checkpoint, as
//! `pg_resetwal` writes one), with no WAL to replay. A next id that is too low would hand out
//! an id the data already holds; one that is too high is harmless, so every rule here only
//! moves a counter forward (with the wraparound comparison PostgreSQL uses), except where a
//! record sets it outright.
//!
//! ```text
//! counters: u8 version=1 | u8 exact | u64 next_xid (epoch << 32 | xid) | u32 next_oid
//!           | u32 next_multi | u32 next_multi_offset | u32 oldest_xid | u32 oldest_xid_db
//!           | u32 oldest_multi | u32 oldest_multi_db
//! ```
//!
//! `exact` says the counters were taken from a shutdown checkpoint (a stopped primary's
//! `pg_control`, or the record) and followed every record since: a backup's `pg_control`
//! holds the counters of the checkpoint the backup started from, and the records between it
//! and the backup's end were never seen.

use super::{DatadirDecodeError, Reader, FORMAT_VERSION};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClusterCounters {
    pub exact: bool,
    /// `FullTransactionId`: the epoch in the high 32 bits.
    pub next_xid: u64,
    pub next_oid: u32,
    pub next_multi: u32,
    pub next_multi_offset: u32,
    pub oldest_xid: u32,
    pub oldest_xid_db: u32,
    pub oldest_multi: u32,
    pub oldest_multi_db: u32,
}

/// The encoded length.
const ENCODED_LEN: usize = 2 + 8 + 7 * 4;
/// The first normal transaction id: 0 to 2 are special and never assigned.
const FIRST_NORMAL_XID: u32 = 3;

impl ClusterCounters {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(ENCODED_LEN);
        out.push(FORMAT_VERSION);
        out.push(u8::from(self.exact));
        out.extend_from_slice(&self.next_xid.to_be_bytes());
        for v in [
            self.next_oid,
            self.next_multi,
            self.next_multi_offset,
            self.oldest_xid,
            self.oldest_xid_db,
            self.oldest_multi,
            self.oldest_multi_db,
        ] {
            out.extend_from_slice(&v.to_be_bytes());
        }
        out
    }

    pub fn decode(buf: &[u8]) -> Result<ClusterCounters, DatadirDecodeError> {
        let mut r = Reader::new(buf, "cluster counters");
        r.version()?;
        let exact = match r.u8()? {
            0 => false,
            1 => true,
            other => return Err(r.error(format!("exact flag {other}, expected 0 or 1"))),
        };
        let counters = ClusterCounters {
            exact,
            next_xid: r.u64()?,
            next_oid: r.u32()?,
            next_multi: r.u32()?,
            next_multi_offset: r.u32()?,
            oldest_xid: r.u32()?,
            oldest_xid_db: r.u32()?,
            oldest_multi: r.u32()?,
            oldest_multi_db: r.u32()?,
        };
        r.finish()?;
        Ok(counters)
    }

    /// Moves the next transaction id past `xid`, a 32-bit id assigned at most 2^31 ids from
    /// it either way (as every id in use is); the epoch follows a wraparound.
    pub fn saw_xid(&mut self, xid: u32) -> bool {
        if xid < FIRST_NORMAL_XID {
            return false;
        }
        let next = self.next_xid as u32;
        let ahead = xid.wrapping_sub(next) as i32;
        if ahead < 0 {
            return false;
        }
        let mut new = self.next_xid + u64::from(ahead as u32) + 1;
        // Ids 0 to 2 are skipped after a wraparound, as GetNewTransactionId does.
        if (new as u32) < FIRST_NORMAL_XID {
            new = (new & !0xffff_ffff) | u64::from(FIRST_NORMAL_XID);
        }
        self.next_xid = new;
        true
    }

    /// Moves the next multixact past `multi` and the next member offset to at least
    /// `offset_end` (both wrap; multixact 0 is never assigned).
    pub fn saw_multi(&mut self, multi: u32, offset_end: u32) -> bool {
        let mut changed = false;
        let next = multi.wrapping_add(1).max(1);
        if follows(next, self.next_multi) {
            self.next_multi = next;
            changed = true;
        }
        if follows(offset_end, self.next_multi_offset) {
            self.next_multi_offset = offset_end;
            changed = true;
        }
        changed
    }

    /// An online checkpoint's counters are lower bounds (OIDs are followed by `NEXTOID`
    /// records, which name more than any checkpoint does, but a higher one is harmless).
    pub fn saw_online_checkpoint(&mut self, c: &ClusterCounters) -> bool {
        let before = *self;
        // Both carry their epoch: compared whole.
        self.next_xid = self.next_xid.max(c.next_xid);
        if follows(c.next_oid, self.next_oid) {
            self.next_oid = c.next_oid;
        }
        self.saw_multi(c.next_multi.wrapping_sub(1), c.next_multi_offset);
        if follows(c.oldest_xid, self.oldest_xid) {
            (self.oldest_xid, self.oldest_xid_db) = (c.oldest_xid, c.oldest_xid_db);
        }
        if follows(c.oldest_multi, self.oldest_multi) {
            (self.oldest_multi, self.oldest_multi_db) = (c.oldest_multi, c.oldest_multi_db);
        }
        *self != before
    }
}

/// `a` is after `b` in 32-bit circular order (PostgreSQL's `TransactionIdFollows`).
fn follows(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn some() -> ClusterCounters {
        ClusterCounters {
            exact: true,
            next_xid: (2 << 32) | 1000,
            next_oid: 24_576,
            next_multi: 5,
            next_multi_offset: 40,
            oldest_xid: 716,
            oldest_xid_db: 1,
            oldest_multi: 1,
            oldest_multi_db: 1,
        }
    }

    #[test]
    fn the_format_is_pinned() {
        let bytes = some().encode();
        assert_eq!(bytes.len(), ENCODED_LEN);
        assert_eq!(&bytes[..10], &[1, 1, 0, 0, 0, 2, 0, 0, 0x03, 0xe8]);
        assert_eq!(ClusterCounters::decode(&bytes).unwrap(), some());
    }

    #[test]
    fn a_damaged_value_is_refused() {
        let bytes = some().encode();
        for len in 0..bytes.len() {
            assert!(ClusterCounters::decode(&bytes[..len]).is_err(), "{len}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(ClusterCounters::decode(&longer).is_err());
        let mut flag = bytes.clone();
        flag[1] = 2;
        assert!(ClusterCounters::decode(&flag)
            .unwrap_err()
            .to_string()
            .contains("exact flag 2"));
    }

    #[test]
    fn the_next_xid_moves_past_what_was_seen_and_never_back() {
        let mut c = some();
        assert!(!c.saw_xid(999), "an older id");
        assert!(!c.saw_xid(2), "a special id");
        assert!(c.saw_xid(1000));
        assert_eq!(c.next_xid, (2 << 32) | 1001);
        assert!(c.saw_xid(5000));
        assert_eq!(c.next_xid, (2 << 32) | 5001);
    }

    #[test]
    fn the_epoch_follows_a_wraparound_and_skips_the_special_ids() {
        let mut c = ClusterCounters {
            next_xid: (7 << 32) | 0xffff_fff0,
            ..some()
        };
        assert!(c.saw_xid(0xffff_ffff));
        assert_eq!(c.next_xid, (8 << 32) | 3);
        assert!(c.saw_xid(10));
        assert_eq!(c.next_xid, (8 << 32) | 11);
    }

    #[test]
    fn multixacts_wrap_past_zero() {
        let mut c = ClusterCounters {
            next_multi: u32::MAX,
            next_multi_offset: u32::MAX - 2,
            ..some()
        };
        assert!(c.saw_multi(u32::MAX, 4));
        assert_eq!((c.next_multi, c.next_multi_offset), (1, 4));
        assert!(!c.saw_multi(u32::MAX - 5, 2), "older");
    }

    #[test]
    fn an_online_checkpoint_only_raises() {
        let mut c = some();
        let older = ClusterCounters {
            next_xid: (2 << 32) | 10,
            next_oid: 16_384,
            ..some()
        };
        assert!(!c.saw_online_checkpoint(&older));
        let newer = ClusterCounters {
            next_xid: (2 << 32) | 2000,
            next_oid: 32_768,
            next_multi: 9,
            next_multi_offset: 90,
            oldest_xid: 800,
            ..some()
        };
        assert!(c.saw_online_checkpoint(&newer));
        assert_eq!(
            c,
            ClusterCounters {
                exact: true,
                ..newer
            }
        );
    }

    proptest! {
        #[test]
        fn every_value_round_trips(exact: bool, xid: u64, v in proptest::array::uniform7(any::<u32>())) {
            let c = ClusterCounters {
                exact,
                next_xid: xid,
                next_oid: v[0],
                next_multi: v[1],
                next_multi_offset: v[2],
                oldest_xid: v[3],
                oldest_xid_db: v[4],
                oldest_multi: v[5],
                oldest_multi_db: v[6],
            };
            prop_assert_eq!(ClusterCounters::decode(&c.encode()).unwrap(), c);
        }

        #[test]
        fn any_bytes_decode_or_are_refused(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(c) = ClusterCounters::decode(&bytes) {
                prop_assert_eq!(c.encode(), bytes);
            }
        }
    }
}
