//! Whether a layer set holds the whole history it claims: the check a manifest passes before
//! it is stored and when it is loaded, and an attached remote index with it.
//!
//! A layer file that a manifest (or a remote index) fails to list is worse than a missing
//! file: nothing refuses to load, and a read walks past the hole. Reads of its keys answer with
//! an older version, a wrong page, or a 404 where a page exists. The names alone say where
//! every layer lies, so the set can be checked without opening a file.
//!
//! ```text
//!   LSN ^
//!  D+1  |  [ L0 ][ L0 ]...                 <- flushes: each starts where the last ended
//!       |  [ L0 group: an import ........]  <- starts where the last ended, versions at its top
//!       |  [ L1 ][ L1 ][ L1 ]  one compaction: one LSN range, cut by key, listed as a group
//!       |  [ image ][ image ][ image ]      one image creation, where the L1s below end
//!       |  [ L1 ][ L1 ]
//!  F+1  +-------------------------------------------------> key
//! ```
//!
//! # What holds for every layer set this server writes
//!
//! 1. **The LSN ranges of the delta layers meet.** From `contiguous_from + 1` (F+1: the start
//!    of the timeline's own history) to `disk_consistent_lsn + 1` (D+1), every LSN lies in
//!    exactly one delta range: a flush's layer starts where the one before ended, also after
//!    an LSN jump; an import's group starts there too, its versions all at its last LSN; a
//!    compaction's outputs span exactly the L0s they replace. Two distinct ranges never
//!    overlap, and the L0s lie above the L1s and images.
//! 2. **Only GC leaves holes, and only where images answer instead.** GC removes a layer only
//!    when its whole range is at or below the cutoff C and newer images at or below C cover
//!    its keys. So a hole `[a, b)` must end at or below C + 1, and images between `a - 1` and
//!    C must together cover every key.
//! 3. **Groups are whole above the cutoff.** Every entry records how many files the change
//!    that wrote it wrote at its LSN range. GC is the only change that removes part of a
//!    group, and never one whose last LSN is above C: such a group is listed whole.
//! 4. **Images cover every key.** Image creation cuts the key space into pieces, each imaged
//!    whole, and GC keeps the newest image of every key: the image layers together cover
//!    `[Key::MIN, Key::MAX)`, two images of one LSN never overlap, and an image above C lies
//!    where a delta range ends (images are made where the L1 layers end).
//!
//! A set that breaks one of these lost a layer (or was never written by this server), and is
//! refused with the first break found, named by LSNs and layer files.
//!
//! # What the check cannot see
//!
//! Below the cutoff, a missing piece of a group that GC could have removed looks like GC's
//! work: a hole is accepted there when images cover every key, even if one of the images
//! that covers some keys is older than the lost versions. A missing image whose keys an older
//! image still covers is accepted too: above the cutoff that is harmless (GC removed nothing on
//! its account, so reads walk down to the layers it was made from), at or below it the reads
//! of its keys may miss what GC removed. Manifests older than format 4 have no group sizes, and
//! their history below `contiguous_from` (their `disk_consistent_lsn` when upgraded) is not
//! checked for holes, since servers then left gaps where nothing was written.

use std::collections::BTreeMap;
use std::ops::Range;

use pageserver_api::Key;
use utils::Lsn;

use super::{LayerLevel, Manifest};
use crate::tenant::storage_layer::LayerName;

/// Why a layer set does not hold the history it claims; each says which LSNs or layers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HistoryError {
    #[error("layer {name:?} is not a layer file name")]
    BadName { name: String },
    #[error("{what} {lsn} is above disk_consistent_lsn {disk_consistent_lsn}")]
    AboveDurable {
        what: &'static str,
        lsn: Lsn,
        disk_consistent_lsn: Lsn,
    },
    #[error("layer {name:?} reaches beyond disk_consistent_lsn {disk_consistent_lsn}")]
    LayerAboveDurable {
        name: String,
        disk_consistent_lsn: Lsn,
    },
    #[error("layers {first:?} and {second:?} overlap in {what}")]
    Overlap {
        first: String,
        second: String,
        what: &'static str,
    },
    #[error("{upper} layer {upper_name:?} lies below {lower} layer {lower_name:?}")]
    OutOfOrder {
        upper: &'static str,
        upper_name: String,
        lower: &'static str,
        lower_name: String,
    },
    #[error(
        "no layer holds LSNs {from}..{to} (below: {below}; above: {above}), and {why}: a layer is missing"
    )]
    Gap {
        from: Lsn,
        to: Lsn,
        below: String,
        above: String,
        why: String,
    },
    #[error(
        "{listed} layer(s) at LSNs {from}..{to}, but {example:?} was written in a group of {group_size}: a layer is missing"
    )]
    IncompleteGroup {
        from: Lsn,
        to: Lsn,
        listed: usize,
        group_size: u32,
        example: String,
    },
    #[error("no image layer holds keys {from}..{to}, though image layers cover the rest: an image layer is missing")]
    ImagesLeaveKeys { from: Key, to: Key },
    #[error(
        "image layer {name:?} is above the GC cutoff {gc_cutoff}, but no delta layers end where it lies (images are made where the L1 layers end): a layer is missing"
    )]
    ImageWithoutDeltas { name: String, gc_cutoff: Lsn },
}

/// One listed layer, its name parsed.
struct Listed<'a> {
    name: &'a str,
    level: LayerLevel,
    group_size: u32,
    parsed: LayerName,
}

/// Checks that `manifest`'s layers hold the whole history it claims (see the module
/// documentation); the error names the first break found.
pub fn check(manifest: &Manifest) -> Result<(), HistoryError> {
    let durable = manifest.disk_consistent_lsn;
    let cutoff = manifest.gc_cutoff_lsn;
    for (what, lsn) in [
        ("the GC cutoff", cutoff),
        ("contiguous_from", manifest.contiguous_from),
    ] {
        if lsn > durable {
            return Err(HistoryError::AboveDurable {
                what,
                lsn,
                disk_consistent_lsn: durable,
            });
        }
    }
    let mut deltas: BTreeMap<(Lsn, Lsn), Vec<Listed>> = BTreeMap::new();
    let mut images: Vec<Listed> = Vec::new();
    for entry in &manifest.layers {
        let parsed: LayerName = entry.name.parse().map_err(|_| HistoryError::BadName {
            name: entry.name.clone(),
        })?;
        let lsns = parsed.lsn_range();
        if lsns.end.0 - 1 > durable.0 {
            return Err(HistoryError::LayerAboveDurable {
                name: entry.name.clone(),
                disk_consistent_lsn: durable,
            });
        }
        let listed = Listed {
            name: &entry.name,
            level: entry.level,
            group_size: entry.group_size,
            parsed,
        };
        match listed.parsed {
            LayerName::Delta(_) => deltas
                .entry((lsns.start, lsns.end))
                .or_default()
                .push(listed),
            LayerName::Image(_) => images.push(listed),
        }
    }
    check_delta_order(&deltas, &images)?;
    check_contiguous(manifest, &deltas, &images)?;
    check_groups(cutoff, &deltas, &images)?;
    check_images(cutoff, &deltas, &images)
}

/// Distinct delta ranges never overlap, and L0s lie above every L1 and image.
fn check_delta_order(
    deltas: &BTreeMap<(Lsn, Lsn), Vec<Listed>>,
    images: &[Listed],
) -> Result<(), HistoryError> {
    let mut previous: Option<(&(Lsn, Lsn), &Listed)> = None;
    for (range, layers) in deltas {
        if let Some((before, below)) = previous {
            if range.0 < before.1 {
                return Err(HistoryError::Overlap {
                    first: below.name.to_owned(),
                    second: layers[0].name.to_owned(),
                    what: "LSN ranges",
                });
            }
        }
        previous = Some((range, &layers[0]));
    }
    let lowest_l0 = deltas
        .values()
        .flatten()
        .filter(|l| l.level == LayerLevel::L0)
        .min_by_key(|l| l.parsed.lsn_range().start);
    let Some(lowest_l0) = lowest_l0 else {
        return Ok(());
    };
    let l0_start = lowest_l0.parsed.lsn_range().start;
    let not_below = deltas
        .values()
        .flatten()
        .filter(|l| l.level != LayerLevel::L0)
        .chain(images)
        .find(|l| l.parsed.lsn_range().end > l0_start);
    match not_below {
        Some(l) => Err(HistoryError::OutOfOrder {
            upper: if l.parsed.is_image() { "image" } else { "L1" },
            upper_name: l.name.to_owned(),
            lower: "L0",
            lower_name: lowest_l0.name.to_owned(),
        }),
        None => Ok(()),
    }
}

/// The delta ranges meet from `contiguous_from + 1` to `disk_consistent_lsn + 1`, but for holes
/// GC may have made.
fn check_contiguous(
    manifest: &Manifest,
    deltas: &BTreeMap<(Lsn, Lsn), Vec<Listed>>,
    images: &[Listed],
) -> Result<(), HistoryError> {
    let cutoff = manifest.gc_cutoff_lsn;
    // Saturating: the LSNs of a manifest on disk are untrusted.
    let top = Lsn(manifest.disk_consistent_lsn.0.saturating_add(1));
    let mut reached = Lsn(manifest.contiguous_from.0.saturating_add(1));
    let mut below = "the start of the timeline's history".to_owned();
    let hole = |from: Lsn, to: Lsn, below: &str, above: String| {
        // GC's hole: it removes only whole ranges at or below the cutoff, and only layers
        // whose keys images between the hole and the cutoff answer for.
        if to.0 <= cutoff.0.saturating_add(1) {
            let lowest = Lsn(from.0.saturating_sub(1));
            if let Some(uncovered) = uncovered(images, lowest, cutoff) {
                return Err(HistoryError::Gap {
                    from,
                    to,
                    below: below.to_owned(),
                    above,
                    why: format!(
                        "no image layer from {lowest} to the GC cutoff {cutoff} holds keys {}..{}",
                        uncovered.start, uncovered.end
                    ),
                });
            }
            return Ok(());
        }
        Err(HistoryError::Gap {
            from,
            to,
            below: below.to_owned(),
            above,
            why: format!("it ends above the GC cutoff {cutoff}"),
        })
    };
    for (&(start, end), layers) in deltas {
        if start > reached {
            hole(reached, start, &below, format!("{:?}", layers[0].name))?;
        }
        if end > reached {
            reached = end;
            below = format!("{:?}", layers[0].name);
        }
    }
    if top > reached {
        hole(reached, top, &below, "disk_consistent_lsn".to_owned())?;
    }
    Ok(())
}

/// The first key range no image layer between `from` and `to` (inclusive) holds, if images
/// of that span do not cover every key.
fn uncovered(images: &[Listed], from: Lsn, to: Lsn) -> Option<Range<Key>> {
    let ranges = images.iter().filter_map(|l| match &l.parsed {
        LayerName::Image(i) if i.lsn >= from && i.lsn <= to => Some(i.key_range.clone()),
        _ => None,
    });
    first_uncovered(ranges.collect())
}

/// The first part of `[Key::MIN, Key::MAX)` that none of `ranges` holds.
fn first_uncovered(mut ranges: Vec<Range<Key>>) -> Option<Range<Key>> {
    ranges.sort_unstable_by_key(|r| r.start);
    let mut reached = Key::MIN;
    for r in ranges {
        if r.start > reached {
            return Some(reached..r.start);
        }
        reached = reached.max(r.end);
    }
    (reached < Key::MAX).then_some(reached..Key::MAX)
}

/// Groups whose last LSN is above the cutoff are listed whole.
fn check_groups(
    cutoff: Lsn,
    deltas: &BTreeMap<(Lsn, Lsn), Vec<Listed>>,
    images: &[Listed],
) -> Result<(), HistoryError> {
    for (&(from, to), layers) in deltas {
        if to.0 - 1 <= cutoff.0 {
            continue;
        }
        // One change writes one delta range: every member names the same group.
        if let Some(l) = layers
            .iter()
            .find(|l| l.group_size != 0 && l.group_size as usize != layers.len())
        {
            return Err(HistoryError::IncompleteGroup {
                from,
                to,
                listed: layers.len(),
                group_size: l.group_size,
                example: l.name.to_owned(),
            });
        }
    }
    // Two image creations may write at one LSN: those of one group size come in multiples.
    let mut by_lsn: BTreeMap<(Lsn, u32), Vec<&Listed>> = BTreeMap::new();
    for image in images.iter().filter(|l| l.group_size != 0) {
        let lsn = image.parsed.lsn_range().start;
        if lsn > cutoff {
            by_lsn
                .entry((lsn, image.group_size))
                .or_default()
                .push(image);
        }
    }
    for ((lsn, group_size), members) in by_lsn {
        if members.len() % group_size as usize != 0 {
            return Err(HistoryError::IncompleteGroup {
                from: lsn,
                to: Lsn(lsn.0 + 1),
                listed: members.len(),
                group_size,
                example: members[0].name.to_owned(),
            });
        }
    }
    Ok(())
}

/// Images cover every key, never overlap at one LSN, and above the cutoff lie where delta
/// ranges end.
fn check_images(
    cutoff: Lsn,
    deltas: &BTreeMap<(Lsn, Lsn), Vec<Listed>>,
    images: &[Listed],
) -> Result<(), HistoryError> {
    if images.is_empty() {
        return Ok(());
    }
    let mut by_lsn: Vec<&Listed> = images.iter().collect();
    by_lsn.sort_unstable_by_key(|l| (l.parsed.lsn_range().start, l.parsed.key_range().start));
    for pair in by_lsn.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if a.parsed.lsn_range() == b.parsed.lsn_range()
            && b.parsed.key_range().start < a.parsed.key_range().end
        {
            return Err(HistoryError::Overlap {
                first: a.name.to_owned(),
                second: b.name.to_owned(),
                what: "keys at one LSN",
            });
        }
    }
    let all = images
        .iter()
        .map(|l| l.parsed.key_range().clone())
        .collect();
    if let Some(keys) = first_uncovered(all) {
        return Err(HistoryError::ImagesLeaveKeys {
            from: keys.start,
            to: keys.end,
        });
    }
    let delta_ends: std::collections::BTreeSet<Lsn> = deltas.keys().map(|r| r.1).collect();
    for image in images {
        let lsn = image.parsed.lsn_range().start;
        if lsn > cutoff && !delta_ends.contains(&Lsn(lsn.0 + 1)) {
            return Err(HistoryError::ImageWithoutDeltas {
                name: image.name.to_owned(),
                gc_cutoff: cutoff,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
