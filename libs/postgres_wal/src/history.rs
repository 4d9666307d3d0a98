//! Timeline history files (`00000002.history`): the line of timelines a timeline descends
//! from, and where each one ended.
//!
//! PostgreSQL writes one when a server is promoted (or a recovery ends) and starts a new
//! timeline: a line per earlier timeline, `<tli>\t<switch LSN>\t<reason>`, oldest first, each
//! switch LSN where the WAL of that timeline stops being this timeline's. The WAL of timeline
//! `N` from its switch point on is a different history than the WAL of its parent past the
//! same point, though both live under the same LSNs.
//!
//! A history file comes from a primary (`TIMELINE_HISTORY`) or a store: it is parsed as
//! untrusted text, by PostgreSQL's own reader's rules: blank and comment lines are skipped,
//! every other line starts with a timeline and a switch point, timelines increase and are all
//! below the file's own. Switch points may go back (a cluster restored to a point before a
//! later switch of its parent's line writes them so); [`TimelineHistory::tli_of`] reads them
//! as PostgreSQL does. A file over [`MAX_HISTORY_LEN`] is refused.

use utils::Lsn;

/// The most bytes a history file may have here: a line per promotion, so a history of this
/// size has about a thousand of them.
pub const MAX_HISTORY_LEN: usize = 64 << 10;

/// One earlier timeline of a history: its WAL is this line's below `switch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryEntry {
    pub tli: u32,
    pub switch: Lsn,
}

/// The line of timelines that ends in `tli`: its ancestors with their switch points, oldest
/// first. Timeline 1 has no file and no ancestors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimelineHistory {
    pub tli: u32,
    pub ancestors: Vec<HistoryEntry>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("the history file of timeline {tli}: {what}")]
pub struct HistoryError {
    pub tli: u32,
    pub what: String,
}

impl TimelineHistory {
    /// The history of timeline 1 (or of a timeline whose file says nothing).
    pub fn first(tli: u32) -> TimelineHistory {
        TimelineHistory {
            tli,
            ancestors: Vec::new(),
        }
    }

    /// Parses the history file of timeline `tli`.
    pub fn parse(tli: u32, bytes: &[u8]) -> Result<TimelineHistory, HistoryError> {
        let err = |what: String| HistoryError { tli, what };
        if bytes.len() > MAX_HISTORY_LEN {
            return Err(err(format!(
                "{} bytes, more than the {MAX_HISTORY_LEN} accepted",
                bytes.len()
            )));
        }
        let text = std::str::from_utf8(bytes)
            .map_err(|_| err("it is not text (invalid UTF-8)".to_owned()))?;
        let mut ancestors: Vec<HistoryEntry> = Vec::new();
        for (i, line) in text.lines().enumerate() {
            // PostgreSQL skips blank and comment lines, and reads the others from their first
            // non-blank character.
            let line = line.trim_start();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut fields = line.split(['\t', ' ']).filter(|f| !f.is_empty());
            let line_err = |what: &str| err(format!("line {}: {what}", i + 1));
            let id: u32 = fields
                .next()
                .and_then(|f| f.parse().ok())
                .ok_or_else(|| line_err("the timeline is not a number"))?;
            let switch: Lsn = fields
                .next()
                .and_then(|f| f.parse().ok())
                .ok_or_else(|| line_err("the switch point is not an LSN"))?;
            if ancestors.last().is_some_and(|last| id <= last.tli) {
                return Err(line_err("the timelines do not increase"));
            }
            if id >= tli {
                return Err(line_err(&format!(
                    "timeline {id} is not an ancestor of timeline {tli}"
                )));
            }
            ancestors.push(HistoryEntry { tli: id, switch });
        }
        Ok(TimelineHistory { tli, ancestors })
    }

    /// The timeline whose WAL this line holds at `lsn`, as PostgreSQL's `tliOfPointInHistory`
    /// reads a history: each timeline spans from the switch point before it (0 for the first)
    /// to its own, the line's own from the last one on, newest first (a switch point belongs to
    /// the timeline after it).
    pub fn tli_of(&self, lsn: Lsn) -> u32 {
        if self.ancestors.last().is_none_or(|last| lsn >= last.switch) {
            return self.tli;
        }
        for (i, entry) in self.ancestors.iter().enumerate().rev() {
            let begin = if i == 0 {
                Lsn(0)
            } else {
                self.ancestors[i - 1].switch
            };
            if begin <= lsn && lsn < entry.switch {
                return entry.tli;
            }
        }
        // A point no span holds (switch points that went back leave such gaps): PostgreSQL
        // answers the first timeline then.
        self.ancestors.first().map_or(self.tli, |e| e.tli)
    }

    /// Where timeline `tli` stops being this line's: `Some(None)` for the line's own timeline
    /// (it goes on), `None` if `tli` is not on the line.
    pub fn end_of(&self, tli: u32) -> Option<Option<Lsn>> {
        if tli == self.tli {
            return Some(None);
        }
        self.ancestors
            .iter()
            .find(|e| e.tli == tli)
            .map(|e| Some(e.switch))
    }

    /// Every timeline of the line, oldest first, with the own one last.
    pub fn timelines(&self) -> impl Iterator<Item = u32> + '_ {
        self.ancestors
            .iter()
            .map(|e| e.tli)
            .chain(std::iter::once(self.tli))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_file_postgres_wrote_parses() {
        let file = b"1\t0/3000158\tno recovery target specified\n\n\
                     2\t0/5000000\tat restore point \"before upgrade\"\n";
        let h = TimelineHistory::parse(3, file).unwrap();
        assert_eq!(
            h.ancestors,
            vec![
                HistoryEntry {
                    tli: 1,
                    switch: Lsn(0x3000158)
                },
                HistoryEntry {
                    tli: 2,
                    switch: Lsn(0x5000000)
                }
            ]
        );
        assert_eq!(h.tli_of(Lsn(0x3000157)), 1);
        assert_eq!(h.tli_of(Lsn(0x3000158)), 2);
        assert_eq!(h.tli_of(Lsn(0x5000000)), 3);
        assert_eq!(h.end_of(1), Some(Some(Lsn(0x3000158))));
        assert_eq!(h.end_of(3), Some(None));
        assert_eq!(h.end_of(4), None);
        assert_eq!(h.timelines().collect::<Vec<_>>(), vec![1, 2, 3]);
    }

    #[test]
    fn a_file_that_breaks_the_rules_is_refused_with_its_line() {
        for (file, what) in [
            (&b"2\t0/100\tx\n1\t0/200\tx\n"[..], "do not increase"),
            (b"one\t0/200\n", "not a number"),
            (b"1\tsoon\n", "not an LSN"),
            (b"1\n", "not an LSN"),
            (b"5\t0/100\n", "not an ancestor"),
            (b"1\t0/100\t\xff\n", "UTF-8"),
        ] {
            let e = TimelineHistory::parse(3, file).unwrap_err();
            assert!(e.to_string().contains(what), "{e} for {file:?}");
        }
        let huge = vec![b'#'; MAX_HISTORY_LEN + 1];
        assert!(TimelineHistory::parse(3, &huge).is_err());
    }

    #[test]
    fn a_restore_before_its_parents_switch_reads_as_postgres_reads_it() {
        // Timeline 2 left 1 at 0/5000100; a restore of timeline 2's line at 0/5000080 (before
        // that switch: on timeline 1 still) was promoted to 3.
        let h = TimelineHistory::parse(3, b"1\t0/5000100\tx\n  2\t0/5000080\ty\n").unwrap();
        assert_eq!(h.tli_of(Lsn(0x5000000)), 1);
        assert_eq!(h.tli_of(Lsn(0x5000080)), 3);
        assert_eq!(h.tli_of(Lsn(0x5000100)), 3);
    }

    proptest! {
        #[test]
        fn any_bytes_parse_or_fail_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(h) = TimelineHistory::parse(9, &bytes) {
                prop_assert!(h.ancestors.windows(2).all(|w| w[0].tli < w[1].tli));
                for lsn in [0u64, 1, 0x100, u64::MAX] {
                    prop_assert!(h.timelines().any(|t| t == h.tli_of(Lsn(lsn))));
                }
                prop_assert!(h.ancestors.iter().all(|e| e.tli < 9));
            }
        }
    }
}
