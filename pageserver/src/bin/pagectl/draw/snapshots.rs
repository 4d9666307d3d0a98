//! The snapshots a timeline lists, for `pagectl draw --contents`: the newest version of the
//! snapshot list's key among the layers on the local disk, decoded, and each snapshot a dashed
//! line across the plot at its LSN, labelled with its kind and, when a restore from it replays
//! from an earlier point (a background snapshot's checkpoint record), that point.
//!
//! The list is one value rewritten whole at every snapshot (an image), so the newest version
//! in any layer is the whole list as the flushed layers know it. Snapshots only in the
//! in-memory layer (not flushed yet) are not drawn, as the layers they are in are not.

use pageserver_api::datadir::{snapshot_list_key, Snapshot, SnapshotList};

use super::*;

/// The colour of a snapshot's line and label.
pub(super) const SNAPSHOT_COLOUR: &str = "#c2185b";

/// The snapshots the newest stored list names, oldest first; none if no layer on the local disk
/// holds the list.
pub(super) fn stored_snapshots(dir: &Path, layers: &[Drawn<'_>]) -> Result<Vec<Snapshot>, Error> {
    let key = snapshot_list_key();
    let mut newest: Option<(Lsn, Value, &str)> = None;
    for l in layers.iter().filter(|l| l.keys.contains(&key)) {
        // A layer entirely below the newest version found holds nothing newer.
        if newest.as_ref().is_some_and(|(lsn, ..)| l.lsns.end <= *lsn) {
            continue;
        }
        let on_disk = dir.join(l.name);
        if !on_disk.exists() {
            continue;
        }
        let found = match layer::open_layer(&on_disk, DEFAULT_MAX_VALUE_SIZE)? {
            layer::LayerFile::Delta(d) => d.get(key, Lsn(u64::MAX))?,
            layer::LayerFile::Image(i) => i.get(key, Lsn(u64::MAX))?,
        };
        if let Some((lsn, value)) = found.records.into_iter().next() {
            if newest.as_ref().is_none_or(|(n, ..)| lsn > *n) {
                newest = Some((lsn, value, l.name));
            }
        }
    }
    let Some((lsn, value, name)) = newest else {
        return Ok(Vec::new());
    };
    let corrupt = |message: String| Error::Path {
        path: dir.join(name),
        message,
    };
    let Value::Image(bytes) = value else {
        return Err(corrupt(format!(
            "the snapshot list at {lsn} is stored as a delta, not whole"
        )));
    };
    let list = SnapshotList::decode(&bytes)
        .map_err(|e| corrupt(format!("the snapshot list at {lsn}: {e}")))?;
    Ok(list.snapshots)
}

/// Each snapshot inside the plot's LSNs as a dashed line across it, with its label at the right
/// end; the legend counts them.
pub(super) fn snapshot_lines(svg: &mut String, plot: &Plot, snapshots: &[Snapshot]) {
    let (left, right) = (LEFT, LEFT + Plot::width());
    let mut drawn = 0;
    for s in snapshots {
        if s.lsn < plot.lsns.lo || s.lsn > plot.lsns.hi {
            continue;
        }
        drawn += 1;
        let y = plot.lsns.y(s.lsn);
        let replay = if s.wal_from < s.lsn {
            format!(", restores replay from {}", s.wal_from)
        } else {
            String::new()
        };
        let _ = writeln!(
            svg,
            "<line class=\"snapshot\" x1=\"{left:.1}\" y1=\"{y:.1}\" x2=\"{right:.1}\" \
             y2=\"{y:.1}\" stroke=\"{SNAPSHOT_COLOUR}\" stroke-width=\"1.5\" \
             stroke-dasharray=\"6 3\"/>"
        );
        let _ = writeln!(
            svg,
            "<text class=\"snapshot-label\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" \
             fill=\"{SNAPSHOT_COLOUR}\" {FONT}>snapshot ({}) at {}{replay}</text>",
            right - 4.0,
            y - 3.0,
            s.kind,
            s.lsn
        );
    }
    // In the legend, after the three levels.
    let x = LEFT + 3.0 * LEGEND_STEP;
    let _ = writeln!(
        svg,
        "<line class=\"legend snapshot\" x1=\"{x}\" y1=\"63\" x2=\"{}\" y2=\"63\" \
         stroke=\"{SNAPSHOT_COLOUR}\" stroke-width=\"1.5\" stroke-dasharray=\"6 3\"/>",
        x + 14.0
    );
    let _ = writeln!(
        svg,
        "<text class=\"snapshot-caption\" x=\"{}\" y=\"67\" {FONT}>snapshot ({drawn} of {} \
         listed)</text>",
        x + 20.0,
        snapshots.len()
    );
}
