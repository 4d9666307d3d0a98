//! Branches: a timeline that starts at an LSN of another one.
//!
//! A branch is created in constant time: an empty timeline whose `disk_consistent_lsn` and
//! `last_record_lsn` start at the branch LSN, and a link to its ancestor. Every version of its
//! own is above the branch LSN, so a read at LSN L first walks its own layers; if they hold no
//! base for the key (an image or a `will_init` delta), the page as of min(L, branch LSN) comes
//! from the ancestor (which may itself be a branch) and the branch's own versions are applied
//! on top. Nothing is copied.
//!
//! ```text
//!   ancestor  ──────────●──────────────────►   (its own history goes on)
//!                       │ branch LSN
//!   branch              └──────────────────►   reads at or below the branch LSN: the ancestor's
//! ```
//!
//! The link lives in the file `ancestor` of the branch's directory, written with the directory
//! (so a timeline never exists without it) and never changed: one line, `<ancestor timeline
//! id> <branch LSN>`. The ancestor keeps its branch points: its GC retains what reads at them
//! need, and a read the branch makes at its branch point is allowed below the ancestor's GC
//! cutoff. A timeline with branches cannot be deleted (`tenant::mgr`).

use std::path::Path;

use super::*;

/// The file in a branch's directory that names its ancestor.
pub const ANCESTOR_FILE: &str = "ancestor";

/// Where a branch starts: its ancestor and the LSN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ancestry {
    pub timeline_id: TimelineId,
    pub lsn: Lsn,
}

impl Ancestry {
    /// The link in `dir`, if the timeline is a branch.
    pub fn read(dir: &Path) -> Result<Option<Ancestry>, TimelineError> {
        let path = dir.join(ANCESTOR_FILE);
        let text = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(TimelineError::Io { path, source }),
        };
        let invalid = |reason: &str| TimelineError::Io {
            path: path.clone(),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("not `<timeline id> <lsn>`: {reason}"),
            ),
        };
        let text = std::str::from_utf8(&text).map_err(|_| invalid("not UTF-8"))?;
        let line = text
            .strip_suffix('\n')
            .ok_or_else(|| invalid("no newline"))?;
        let (id, lsn) = line.split_once(' ').ok_or_else(|| invalid("no space"))?;
        Ok(Some(Ancestry {
            timeline_id: id.parse().map_err(|_| invalid("the id"))?,
            lsn: lsn.parse().map_err(|_| invalid("the LSN"))?,
        }))
    }

    /// Writes the link into `dir`, a directory being built (`crashsafe::write_in_new_dir`).
    pub fn write(&self, dir: &Path) -> Result<(), TimelineError> {
        let text = format!("{} {}\n", self.timeline_id, self.lsn);
        crate::io::crashsafe::write_in_new_dir(dir, ANCESTOR_FILE, text.as_bytes()).map_err(|e| {
            TimelineError::Io {
                path: e.path,
                source: e.source,
            }
        })
    }
}

impl Timeline {
    /// Links this timeline (a branch, not shared yet) to its loaded ancestor, whose branch
    /// point at `lsn` is registered already ([`Timeline::reserve_branch_point`], or
    /// [`Timeline::add_branch_point`] for a branch loaded from disk).
    pub fn set_ancestor(&self, ancestor: Arc<Timeline>, lsn: Lsn) -> Result<(), TimelineError> {
        self.ancestor
            .set((ancestor, lsn))
            .map_err(|_| TimelineError::Broken {
                reason: "the timeline's ancestor was set twice".to_owned(),
            })
    }

    /// The ancestor and the branch LSN, for a branch.
    pub fn ancestor(&self) -> Option<(&Arc<Timeline>, Lsn)> {
        self.ancestor.get().map(|(t, lsn)| (t, *lsn))
    }

    /// The LSNs branches of this timeline start at (one per branch, repeats kept).
    pub fn branch_points(&self) -> Vec<Lsn> {
        self.branch_points
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Registers a branch point at `lsn` for a new branch, refused below the GC cutoff
    /// ([`TimelineError::BelowGcCutoff`]) and while the layer set on disk is unknown (a GC's
    /// manifest with a higher cutoff may be the one a load finds). Under the lock GC holds for
    /// its whole pass: GC either ran before, and the check sees its cutoff, or runs after, and
    /// retains the point.
    pub fn reserve_branch_point(&self, lsn: Lsn) -> Result<(), TimelineError> {
        let _gc = self.image_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.check_layer_set_known()?;
        let cutoff = self.gc_cutoff_lsn();
        if lsn < cutoff {
            return Err(TimelineError::BelowGcCutoff { lsn, cutoff });
        }
        self.add_branch_point(lsn);
        Ok(())
    }

    /// Registers the branch point of a branch that exists (loaded from disk): retained
    /// whatever the cutoff, since GC has retained it all along.
    pub fn add_branch_point(&self, lsn: Lsn) {
        let mut points = self.branch_points.lock().unwrap_or_else(|e| e.into_inner());
        points.push(lsn);
        points.sort();
    }

    /// Forgets one branch point at `lsn` (its branch is gone, or was never made).
    pub fn remove_branch_point(&self, lsn: Lsn) {
        let mut points = self.branch_points.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = points.iter().position(|p| *p == lsn) {
            points.remove(i);
        }
    }

    /// Where a read at `lsn` of this timeline continues when its own layers hold no base: the
    /// ancestor, read as of min(`lsn`, branch LSN), and whether the ancestor's GC cutoff applies
    /// there (not at a branch point, which GC retains). The one step from a branch to its
    /// ancestor that GetPage and scans both take; `None` for a timeline that is no branch.
    pub(super) fn ancestor_read(&self, lsn: Lsn) -> Option<AncestorRead<'_>> {
        let (ancestor, branch_lsn) = self.ancestor()?;
        let lsn = lsn.min(branch_lsn);
        Some(AncestorRead {
            timeline: ancestor,
            lsn,
            check_cutoff: !ancestor.branch_points().contains(&lsn),
        })
    }
}

/// See [`Timeline::ancestor_read`].
pub(super) struct AncestorRead<'a> {
    pub timeline: &'a Arc<Timeline>,
    pub lsn: Lsn,
    pub check_cutoff: bool,
}
