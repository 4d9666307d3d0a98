//! The history check on layer sets built by hand: the shapes the server writes pass, and each
//! kind of missing layer is named.

use pageserver_api::Key;
use utils::{Lsn, TenantId, TimelineId};

use super::{check, HistoryError};
use crate::tenant::storage_layer::layer_name::{DeltaLayerName, ImageLayerName};
use crate::tenant::storage_layer::LayerName;
use crate::tenant::timeline::layer_set::manifest::{LayerFileEntry, LayerLevel, Manifest};

fn key(i: u32) -> Key {
    Key::rel_block(1663, 5, 16384, 0, i)
}

/// A layer set under construction: `disk_consistent_lsn` follows the layers added.
struct Set(Manifest);

impl Set {
    fn new() -> Set {
        let mut m = Manifest::empty(
            TenantId::from_bytes([1; 16]),
            TimelineId::from_bytes([2; 16]),
        );
        m.contiguous_from = Lsn(0);
        Set(m)
    }

    fn add(&mut self, name: LayerName, level: LayerLevel, group_size: u32) -> String {
        let end = Lsn(name.lsn_range().end.0 - 1);
        self.0.disk_consistent_lsn = self.0.disk_consistent_lsn.max(end);
        let name = name.to_string();
        self.0.add_layer(LayerFileEntry {
            name: name.clone(),
            size: 8192,
            crc32c: 0,
            level,
            group_size,
        });
        name
    }

    /// A flush's L0 over keys 0..100 at `[from, to)`.
    fn l0(&mut self, from: u64, to: u64) -> String {
        self.delta(0, 100, from, to, LayerLevel::L0, 1)
    }

    fn delta(
        &mut self,
        k0: u32,
        k1: u32,
        from: u64,
        to: u64,
        level: LayerLevel,
        group: u32,
    ) -> String {
        let name = LayerName::Delta(DeltaLayerName {
            key_range: key(k0)..key(k1),
            lsn_range: Lsn(from)..Lsn(to),
        });
        self.add(name, level, group)
    }

    /// A compaction's outputs at `[from, to)`, cut at `cuts`.
    fn l1_run(&mut self, from: u64, to: u64, cuts: &[(u32, u32)]) -> Vec<String> {
        let n = cuts.len() as u32;
        cuts.iter()
            .map(|&(k0, k1)| self.delta(k0, k1, from, to, LayerLevel::L1, n))
            .collect()
    }

    /// One image creation at `lsn` of the pieces `cuts` (`Key::MAX` for `u32::MAX`).
    fn images(&mut self, lsn: u64, cuts: &[(u32, u32)]) -> Vec<String> {
        let n = cuts.len() as u32;
        let k = |i: u32| {
            if i == u32::MAX {
                Key::MAX
            } else if i == 0 {
                Key::MIN
            } else {
                key(i)
            }
        };
        cuts.iter()
            .map(|&(k0, k1)| {
                let name = LayerName::Image(ImageLayerName {
                    key_range: k(k0)..k(k1),
                    lsn: Lsn(lsn),
                });
                self.add(name, LayerLevel::Image, n)
            })
            .collect()
    }

    fn without(&self, name: &str) -> Manifest {
        let mut m = self.0.clone();
        assert!(m.retire_layer(name), "{name} is listed");
        m.retired.clear();
        m
    }
}

const ALL: (u32, u32) = (0, u32::MAX);

/// Flushes, a compaction into three L1s, images over two pieces, more flushes, an import.
fn history() -> (Set, Vec<String>, Vec<String>, Vec<String>) {
    let mut s = Set::new();
    s.l1_run(1, 0x30, &[(0, 10), (10, 20), (30, 40)]);
    let images = s.images(0x2f, &[(0, 20), (20, u32::MAX)]);
    let l1 = s.l1_run(0x30, 0x50, &[(0, 5), (7, 9)]);
    let mut l0 = vec![s.l0(0x50, 0x60), s.l0(0x60, 0x70)];
    // An import whose base was 0x6f, at 0x90: two files, versions at 0x90.
    l0.push(s.delta(0, 50, 0x70, 0x91, LayerLevel::L0, 2));
    l0.push(s.delta(20, 90, 0x70, 0x91, LayerLevel::L0, 2));
    l0.push(s.l0(0x91, 0xa0));
    (s, l0, l1, images)
}

#[test]
fn the_shapes_the_server_writes_pass() {
    let (s, ..) = history();
    check(&s.0).unwrap();
    check(&Set::new().0).unwrap();
    // A branch at 0x40: its history starts there.
    let mut branch = Set::new();
    branch.0.contiguous_from = Lsn(0x40);
    branch.0.disk_consistent_lsn = Lsn(0x40);
    check(&branch.0).unwrap();
    branch.l0(0x41, 0x50);
    check(&branch.0).unwrap();
}

#[test]
fn a_missing_layer_of_any_kind_above_the_cutoff_is_named() {
    let (s, l0, l1, images) = history();
    for name in l0.iter().chain(&l1).chain(&images) {
        let err = check(&s.without(name)).expect_err(name);
        assert!(err.to_string().contains("missing"), "{name}: {err}");
    }
    // The lowest L1 run has three members: any one of them.
    let lowest: Vec<String> =
        s.0.layers
            .iter()
            .filter(|l| l.name.ends_with("-0000000000000030") && l.level == LayerLevel::L1)
            .map(|l| l.name.clone())
            .collect();
    assert_eq!(lowest.len(), 3);
    for name in &lowest {
        assert!(
            matches!(
                check(&s.without(name)),
                Err(HistoryError::IncompleteGroup { .. })
            ),
            "{name}"
        );
    }
    let gap = check(&s.without(&l0[1])).unwrap_err();
    assert!(
        matches!(
            gap,
            HistoryError::Gap {
                from: Lsn(0x60),
                to: Lsn(0x70),
                ..
            }
        ),
        "{gap}"
    );
}

#[test]
fn the_newest_layer_must_reach_disk_consistent_lsn() {
    let (mut s, ..) = history();
    s.0.disk_consistent_lsn = Lsn(0xb0);
    let err = check(&s.0).unwrap_err();
    assert!(
        matches!(
            err,
            HistoryError::Gap {
                from: Lsn(0xa0),
                to: Lsn(0xb1),
                ..
            }
        ),
        "{err}"
    );
    // Nothing at all, with a history claimed.
    let mut empty = Set::new();
    empty.0.disk_consistent_lsn = Lsn(0x10);
    assert!(matches!(check(&empty.0), Err(HistoryError::Gap { .. })));
    // A layer beyond it.
    let (mut s, ..) = history();
    s.0.disk_consistent_lsn = Lsn(0x90);
    assert!(matches!(
        check(&s.0),
        Err(HistoryError::LayerAboveDurable { .. })
    ));
}

#[test]
fn gc_holes_pass_where_images_answer_instead() {
    let mut s = Set::new();
    let old = s.l1_run(1, 0x30, &[(0, 10)]);
    s.images(0x2f, &[ALL]);
    let hot = s.l1_run(0x30, 0x50, &[(0, 10)]);
    // Only the piece 0..20 imaged again at 0x4f; the rest keeps its image at 0x2f.
    s.images(0x4f, &[(0, 20)]);
    s.l1_run(0x50, 0x70, &[(0, 90)]);
    s.0.gc_cutoff_lsn = Lsn(0x60);
    check(&s.0).unwrap();
    // GC removed both lower runs (images at or below the cutoff cover their keys).
    let mut gc = s.0.clone();
    for name in old.iter().chain(&hot) {
        gc.retire_layer(name);
    }
    gc.retired.clear();
    check(&gc).unwrap();
    // The same hole with the cutoff below it: a missing layer.
    gc.gc_cutoff_lsn = Lsn(0x40);
    let err = check(&gc).unwrap_err();
    assert!(
        err.to_string().contains("above the GC cutoff 0/40"),
        "{err}"
    );
    // A hole at or below the cutoff that no images cover.
    let mut uncovered = Set::new();
    let lost = uncovered.l1_run(1, 0x30, &[(0, 10)]);
    uncovered.l1_run(0x30, 0x50, &[(0, 10)]);
    uncovered.0.gc_cutoff_lsn = Lsn(0x40);
    let err = check(&uncovered.without(&lost[0])).unwrap_err();
    assert!(
        err.to_string()
            .contains("no image layer from 0/0 to the GC cutoff 0/40"),
        "{err}"
    );
    // Below the cutoff a group may be partly gone: GC removes layer by layer.
    let mut partly = Set::new();
    let run = partly.l1_run(1, 0x30, &[(0, 10), (10, 20)]);
    partly.images(0x2f, &[ALL]);
    partly.l0(0x30, 0x40);
    partly.0.gc_cutoff_lsn = Lsn(0x2f);
    check(&partly.without(&run[0])).unwrap();
}

#[test]
fn images_cover_every_key_and_lie_where_deltas_end() {
    let mut s = Set::new();
    s.l1_run(1, 0x30, &[(0, 10)]);
    let pieces = s.images(0x2f, &[(0, 20), (20, 40), (40, u32::MAX)]);
    check(&s.0).unwrap();
    let mut lost = s.without(&pieces[1]);
    // The group's count would name it; without group sizes (format 3) the coverage does.
    for l in &mut lost.layers {
        l.group_size = 0;
    }
    let err = check(&lost).unwrap_err();
    assert_eq!(
        err,
        HistoryError::ImagesLeaveKeys {
            from: key(20),
            to: key(40)
        }
    );
    // Two images of one LSN over the same keys.
    let mut twice = Set::new();
    twice.l1_run(1, 0x30, &[(0, 10)]);
    twice.images(0x2f, &[ALL]);
    twice.images(0x2f, &[(0, 5)]);
    assert!(matches!(check(&twice.0), Err(HistoryError::Overlap { .. })));
    // An image where no deltas end.
    let mut floating = Set::new();
    floating.l1_run(1, 0x30, &[(0, 10)]);
    floating.images(0x20, &[ALL]);
    assert!(matches!(
        check(&floating.0),
        Err(HistoryError::ImageWithoutDeltas { .. })
    ));
}

#[test]
fn overlapping_ranges_and_levels_out_of_order_are_refused() {
    let mut s = Set::new();
    s.l0(1, 0x20);
    s.l0(0x10, 0x30);
    assert!(matches!(check(&s.0), Err(HistoryError::Overlap { .. })));
    let mut s = Set::new();
    s.l0(1, 0x20);
    s.l1_run(0x20, 0x30, &[(0, 10)]);
    assert!(matches!(check(&s.0), Err(HistoryError::OutOfOrder { .. })));
    let mut s = Set::new();
    s.l0(1, 0x20);
    s.0.gc_cutoff_lsn = Lsn(0x30);
    assert!(matches!(
        check(&s.0),
        Err(HistoryError::AboveDurable { .. })
    ));
}

#[test]
fn older_manifests_are_checked_from_where_they_were_upgraded() {
    // A format 3 manifest: an import at 0x80 left 0x20..0x80 empty, group sizes unknown.
    let mut s = Set::new();
    s.l0(1, 0x20);
    s.delta(0, 10, 0x80, 0x81, LayerLevel::L0, 0);
    s.0.contiguous_from = Lsn(0x80);
    check(&s.0).unwrap();
    // What the upgraded timeline flushes next starts at 0x81.
    s.l0(0x81, 0x90);
    check(&s.0).unwrap();
    s.0.contiguous_from = Lsn(0);
    assert!(matches!(
        check(&s.0),
        Err(HistoryError::Gap {
            from: Lsn(0x20),
            to: Lsn(0x80),
            ..
        })
    ));
}
