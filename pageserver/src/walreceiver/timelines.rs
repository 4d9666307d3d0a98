//! The primary's timelines (PostgreSQL's TLIs: a promotion starts a new one), and which of
//! them a receiver streams.
//!
//! A primary on timeline `N > 1` has a history file (`TIMELINE_HISTORY N`): the timelines it
//! descends from and where each one ended. Before streaming, the receiver stores the history
//! files of the primary's line (restores and `restore_command` read them) and checks that the
//! WAL the pageserver's timeline holds is on that line:
//!
//! - WAL stored here (or archived) ends at `E` on timeline `T`: `T` must be on the primary's
//!   line, and not have ended there before `E` (else the primary's history left ours before
//!   our WAL ends: a standby promoted before it received all of it, or another cluster's line);
//! - a branch with no WAL of its own continues its ancestor's WAL at the branch point `X`,
//!   whose last record ends at `E` on timeline `T`: the primary (typically a PostgreSQL started
//!   from the branch's basebackup, promoted at `E`) must have left `T` between `E` and `X`,
//!   or still be on it.
//!
//! Streaming starts on the timeline the primary's line holds at the start point (as a standby
//! does): at the end of a timeline that is not the primary's newest, the primary ends the
//! stream and names the next timeline and its start; the receiver stores its history file,
//! moves the segment being filled to the new timeline's name (`WalStore::switch_timeline`), and
//! streams on. The WAL decoder goes on across the switch: the new timeline's first record
//! names the old one's last.

use bytes::Bytes;
use postgres_wal::history::TimelineHistory;
use postgres_wal::segment;
use utils::Lsn;

use super::connection::ReplicationConnection;
use super::replay_plan::{replay_of, ReplayError};
use super::wal_store::{StoredEnd, WalStore};
use super::ReceiverError;
use crate::tenant::timeline::Timeline;

/// The WAL the pageserver's timeline holds already: the timeline (TLI) of its newest byte, and
/// where its last record ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct KnownWal {
    pub tli: u32,
    pub end: Lsn,
    /// The branch point, when the WAL is the ancestor's up to it.
    pub branch_lsn: Option<Lsn>,
    /// Whether that ancestor's WAL goes on past the branch point.
    pub ancestor_goes_on: bool,
}

/// The history of the primary's timeline `tli` (which names the whole line), with the history
/// files of the line it could read: its own, required, and its ancestors', where the primary
/// still has them (a cluster restored from a basebackup has its target's alone). Stored only
/// once checked ([`store_history`]).
pub(super) fn primary_line(
    conn: &mut ReplicationConnection,
    tli: u32,
) -> Result<(TimelineHistory, Vec<(u32, Bytes)>), ReceiverError> {
    if tli <= 1 {
        return Ok((TimelineHistory::first(tli), Vec::new()));
    }
    let (history, bytes) = fetch_history(conn, tli)?;
    let mut files = vec![(tli, bytes)];
    for earlier in history.timelines().filter(|t| *t > 1 && *t < tli) {
        // One the primary no longer has answers an error, and the connection goes on.
        if let Ok((_, bytes)) = fetch_history(conn, earlier) {
            files.push((earlier, bytes));
        }
    }
    Ok((history, files))
}

/// Timeline `tli`'s history file from the primary, checked.
pub(super) fn fetch_history(
    conn: &mut ReplicationConnection,
    tli: u32,
) -> Result<(TimelineHistory, Bytes), ReceiverError> {
    let bytes = conn.timeline_history(tli)?;
    let history = TimelineHistory::parse(tli, &bytes)
        .map_err(|e| ReceiverError::Protocol(format!("TIMELINE_HISTORY {tli}: {e}")))?;
    Ok((history, bytes))
}

/// Stores history files from the primary with the WAL. One stored already must be the same:
/// two histories of one timeline are two clusters (each restored from the same point and
/// promoted), and the WAL here is the other's.
pub(super) fn store_history(store: &WalStore, files: &[(u32, Bytes)]) -> Result<(), ReceiverError> {
    for (tli, bytes) in files {
        let name = segment::history_file_name(*tli);
        match std::fs::read(store.dir().join(&name)) {
            Ok(stored) if stored[..] != bytes[..] => {
                return Err(ReceiverError::Refused(format!(
                    "the primary's history file {name} differs from the one stored with this \
                     timeline's WAL: the primary is another cluster promoted to the same \
                     timeline"
                )))
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => store
                .store_history(*tli, bytes)
                .map_err(ReceiverError::io)?,
            Err(e) => return Err(ReceiverError::Io(e)),
        }
    }
    Ok(())
}

/// What the timeline holds already (see [`KnownWal`]): its own stored WAL, else its archive,
/// else, for a branch, its ancestor's WAL at the branch point. `None` when it has no WAL at
/// all (a timeline of snapshots alone).
pub(super) fn known_wal(
    timeline: &std::sync::Arc<Timeline>,
    stored: Option<StoredEnd>,
    segment_size: u32,
) -> Result<Option<KnownWal>, ReceiverError> {
    if let Some(stored) = stored {
        return Ok(Some(KnownWal {
            tli: stored.segment.tli,
            end: stored.valid_end,
            branch_lsn: None,
            ancestor_goes_on: false,
        }));
    }
    let remote = timeline.remote_copy();
    if let (Some(end), Some(archived)) = (
        remote.and_then(|r| r.archived_lsn()),
        remote.and_then(|r| r.archived_wal_segments()),
    ) {
        let tli = archived
            .segments
            .iter()
            .filter_map(|(_, name, _)| segment::SegmentName::parse(name, archived.segment_size))
            .max_by_key(|s| (s.segno, s.tli))
            .map(|s| s.tli);
        if let Some(tli) = tli {
            return Ok(Some(KnownWal {
                tli,
                end,
                branch_lsn: None,
                ancestor_goes_on: false,
            }));
        }
    }
    let Some((_, branch_lsn)) = timeline.ancestor() else {
        return Ok(None);
    };
    let from = segment::segment_start(segment::segno_of(branch_lsn, segment_size), segment_size);
    match replay_of(timeline, from, branch_lsn) {
        Ok(Some(replay)) => Ok(Some(KnownWal {
            tli: replay.tli,
            end: replay.end,
            branch_lsn: Some(branch_lsn),
            ancestor_goes_on: replay.goes_on,
        })),
        Ok(None) => Ok(None),
        Err(ReplayError::Fetch(e)) => Err(ReceiverError::Connect(e)),
        // The ancestor's WAL does not reach the branch point (a branch at a snapshot of a
        // timeline that streams nothing): nothing to check against.
        Err(ReplayError::Missing(_)) => Ok(None),
    }
}

/// Checks that `known` is on the primary's line `primary` (see the module documentation), and
/// so is `fixed`, the newest point the timeline's WAL is read to besides (a branch point).
pub(super) fn check_line(
    primary: &TimelineHistory,
    known: &KnownWal,
    fixed: Lsn,
) -> Result<(), ReceiverError> {
    let refuse = |why: String| Err(ReceiverError::Refused(why));
    let known = &KnownWal {
        end: if known.branch_lsn.is_none() {
            known.end.max(fixed)
        } else {
            known.end
        },
        ..*known
    };
    match (primary.end_of(known.tli), known.branch_lsn) {
        (None, _) => refuse(format!(
            "the primary is on timeline {}, which does not descend from timeline {} that this \
             timeline's WAL is on (up to {}): another cluster's history, or a sibling's",
            primary.tli, known.tli, known.end
        )),
        // The primary is on the timeline the ancestor went on with past the branch point:
        // its WAL from there is the ancestor's, or a copy's that shares its timeline.
        (Some(None), Some(branch)) if known.ancestor_goes_on => refuse(format!(
            "the primary is on timeline {}, as the branch's ancestor is at the branch point \
             {branch} and after it: the primary is the ancestor's, or a copy that was not \
             promoted; start a PostgreSQL from the branch's basebackup at a point between two \
             snapshots (it replays to there and is promoted to a new timeline)",
            known.tli
        )),
        (Some(None), _) => Ok(()),
        (Some(Some(switch)), None) if switch < known.end => refuse(format!(
            "the primary's history left timeline {} at {switch}, before this timeline's WAL \
             on it ends ({}): the primary was promoted without all of that WAL; branch at \
             {switch} and stream the primary into the branch",
            known.tli, known.end
        )),
        (Some(Some(switch)), Some(branch)) if switch < known.end || switch > branch => {
            refuse(format!(
                "the primary left timeline {} at {switch}, and the branch continues it from \
                 {} (its branch point {branch}): the primary was not started from this branch",
                known.tli, known.end
            ))
        }
        (Some(Some(_)), _) => Ok(()),
    }
}

/// The next timeline the primary named at the end of one, checked: its history must say the
/// timeline streamed so far ended where the primary says the next one begins.
pub(super) fn check_switch(
    next: &TimelineHistory,
    from_tli: u32,
    at: Lsn,
) -> Result<(), ReceiverError> {
    match next.end_of(from_tli) {
        Some(Some(switch)) if switch == at => Ok(()),
        other => Err(ReceiverError::Protocol(format!(
            "the primary switched from timeline {from_tli} to {} at {at}, and that timeline's \
             history says {other:?}",
            next.tli
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(tli: u32, file: &str) -> TimelineHistory {
        TimelineHistory::parse(tli, file.as_bytes()).unwrap()
    }

    #[test]
    fn stored_wal_must_not_reach_past_where_the_primary_left_its_timeline() {
        let primary = line(2, "1\t0/5000100\tpromoted\n");
        let known = |tli, end| KnownWal {
            tli,
            end: Lsn(end),
            branch_lsn: None,
            ancestor_goes_on: false,
        };
        check_line(&primary, &known(1, 0x5000100), Lsn(0)).unwrap();
        check_line(&primary, &known(1, 0x4000000), Lsn(0)).unwrap();
        check_line(&primary, &known(2, 0x6000000), Lsn(0)).unwrap();
        let e = check_line(&primary, &known(1, 0x5000200), Lsn(0)).unwrap_err();
        assert!(e.to_string().contains("without all of that WAL"), "{e}");
        let e = check_line(&primary, &known(3, 0x5000200), Lsn(0)).unwrap_err();
        assert!(e.to_string().contains("does not descend"), "{e}");
        // A branch point past the switch: the branch read another history there.
        let e = check_line(&primary, &known(1, 0x4000000), Lsn(0x5000108)).unwrap_err();
        assert!(e.to_string().contains("without all of that WAL"), "{e}");
        assert!(e.is_permanent());
    }

    #[test]
    fn a_branch_takes_a_primary_promoted_between_its_last_record_and_its_branch_point() {
        let branch = |end, at| KnownWal {
            tli: 1,
            end: Lsn(end),
            branch_lsn: Some(Lsn(at)),
            ancestor_goes_on: true,
        };
        let promoted_at = |s: &str| line(2, &format!("1\t{s}\tno recovery target specified\n"));
        check_line(
            &promoted_at("0/5000100"),
            &branch(0x5000100, 0x5000118),
            Lsn(0),
        )
        .unwrap();
        check_line(
            &promoted_at("0/5000118"),
            &branch(0x5000100, 0x5000118),
            Lsn(0),
        )
        .unwrap();
        // Left before the branch's WAL ends, or after the branch point: another history.
        for s in ["0/50000F0", "0/5000120"] {
            let e = check_line(&promoted_at(s), &branch(0x5000100, 0x5000118), Lsn(0)).unwrap_err();
            assert!(
                e.to_string().contains("not started from this branch"),
                "{e}"
            );
        }
        // On the ancestor's timeline, which went on past the branch point: the ancestor's
        // primary itself, or a copy never promoted.
        let e = check_line(
            &TimelineHistory::first(1),
            &branch(0x5000100, 0x5000118),
            Lsn(0),
        )
        .unwrap_err();
        assert!(e.to_string().contains("not promoted"), "{e}");
        // The ancestor's WAL ends at the branch point: nothing tells the two apart.
        let at_the_end = KnownWal {
            ancestor_goes_on: false,
            ..branch(0x5000100, 0x5000118)
        };
        check_line(&TimelineHistory::first(1), &at_the_end, Lsn(0)).unwrap();
    }

    #[test]
    fn a_switch_must_be_where_the_next_history_says() {
        let next = line(3, "1\t0/3000000\tx\n2\t0/5000100\ty\n");
        check_switch(&next, 2, Lsn(0x5000100)).unwrap();
        assert!(check_switch(&next, 2, Lsn(0x5000108)).is_err());
        assert!(check_switch(&next, 1, Lsn(0x5000100)).is_err());
    }
}
