//! Which of its WAL a timeline keeps: a restore at LSN X replays the WAL from the newest
//! snapshot at or below X (`http::routes::datadir`), so the WAL from a snapshot on is needed
//! while some LSN that restores from that snapshot is still restorable (from its `wal_from`,
//! for a background snapshot, whose `pg_wal/` is that WAL: just below it). Those are every LSN
//! at or above the GC cutoff, and every LSN GC retains (branch points) or a read leases. WAL
//! below the oldest such snapshot serves no restore, and a GC pass lets the WAL archive remove
//! its segments (`remote_timeline_client::wal_archive`), locally and in the store.

use pageserver_api::datadir::{snapshot_list_key, Snapshot, SnapshotList};
use utils::Lsn;

use crate::tenant::timeline::Timeline;

/// The oldest LSN whose WAL a restore may still read, given the snapshots (oldest first), the
/// GC cutoff and the LSNs kept beyond it: where the WAL of the snapshot the oldest restorable
/// LSN replays from begins (a background snapshot's at its `wal_from`); `None`
/// without snapshots (nothing is known, so nothing goes).
pub fn wal_floor(snapshots: &[Snapshot], cutoff: Lsn, kept: &[Lsn]) -> Option<Lsn> {
    let oldest = *snapshots.first()?;
    // An LSN below every snapshot restores from none; an LSN at or above the cutoff but
    // before the first snapshot has nothing to replay from either, and the oldest is the
    // first any later one can use.
    let base = |lsn: Lsn| {
        snapshots
            .iter()
            .rev()
            .find(|s| s.lsn <= lsn)
            .copied()
            .unwrap_or(oldest)
    };
    std::iter::once(cutoff)
        .chain(kept.iter().copied())
        .map(|lsn| base(lsn).wal_from)
        .min()
}

impl Timeline {
    /// Tells the WAL archive where the WAL the timeline still needs begins (see the module
    /// documentation). Without a remote copy (tests) the WAL stays.
    pub(super) fn retain_wal(&self, cutoff: Lsn, kept: &[Lsn]) {
        let Some(remote) = self.remote.get() else {
            return;
        };
        let list = match self.get_page(snapshot_list_key(), self.last_record_lsn()) {
            Ok(Some(bytes)) => SnapshotList::decode(&bytes),
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(tenant = %self.tenant_id, timeline = %self.timeline_id,
                    "the WAL's GC skips this pass: reading the snapshot list: {e}");
                return;
            }
        };
        match list {
            Ok(list) => {
                if let Some(floor) = wal_floor(&list.snapshots, cutoff, kept) {
                    remote.retain_wal_from(floor);
                }
            }
            Err(e) => {
                tracing::warn!(tenant = %self.tenant_id, timeline = %self.timeline_id,
                    "the WAL's GC skips this pass: the snapshot list: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_is_the_snapshot_the_oldest_restorable_lsn_replays_from() {
        use pageserver_api::datadir::SnapshotKind;
        let snapshots =
            [100, 200, 300].map(|lsn| Snapshot::imported(Lsn(lsn), SnapshotKind::Stopped));
        assert_eq!(wal_floor(&[], Lsn(500), &[]), None);
        // Everything at or above the cutoff: from the snapshot below it.
        assert_eq!(wal_floor(&snapshots, Lsn(250), &[]), Some(Lsn(200)));
        assert_eq!(wal_floor(&snapshots, Lsn(300), &[]), Some(Lsn(300)));
        assert_eq!(wal_floor(&snapshots, Lsn(0), &[]), Some(Lsn(100)));
        // A branch point or a lease below the cutoff keeps its snapshot's WAL.
        assert_eq!(
            wal_floor(&snapshots, Lsn(350), &[Lsn(150), Lsn(320)]),
            Some(Lsn(100))
        );
        assert_eq!(wal_floor(&snapshots, Lsn(350), &[Lsn(50)]), Some(Lsn(100)));
    }

    #[test]
    fn a_background_snapshot_keeps_the_wal_from_its_checkpoints_redo_point() {
        use pageserver_api::datadir::SnapshotKind;
        let background = |lsn, wal_from| Snapshot {
            lsn: Lsn(lsn),
            kind: SnapshotKind::Stopped,
            wal_from: Lsn(wal_from),
        };
        let snapshots = [
            Snapshot::imported(Lsn(100), SnapshotKind::Backup),
            background(300, 250),
            background(500, 420),
        ];
        assert_eq!(wal_floor(&snapshots, Lsn(350), &[]), Some(Lsn(250)));
        assert_eq!(wal_floor(&snapshots, Lsn(500), &[]), Some(Lsn(420)));
        assert_eq!(wal_floor(&snapshots, Lsn(600), &[Lsn(200)]), Some(Lsn(100)));
    }
}
