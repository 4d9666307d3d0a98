//! The choices' building blocks on key ranges alone: pieces by the newest image, how ranges
//! stack over one key, and coverage. The choices themselves are tested through the writers
//! that follow them (`compaction/tests.rs`, `image_creation/tests.rs`, `gc/tests.rs`).

use super::*;
use crate::tenant::test_support::rel_key;

fn piece(keys: Range<Key>, image: Option<usize>) -> Piece {
    Piece { keys, image }
}

#[test]
fn pieces_tile_the_key_space_by_the_newest_image_over_each_key() {
    let k = rel_key;
    assert_eq!(pieces(&[]), vec![piece(Key::MIN..Key::MAX, None)]);
    let images = [
        (Key::MIN..k(5), Lsn(10)),
        (k(5)..Key::MAX, Lsn(10)),
        (k(3)..k(7), Lsn(20)),
    ];
    assert_eq!(
        pieces(&images),
        vec![
            piece(Key::MIN..k(3), Some(0)),
            piece(k(3)..k(7), Some(2)),
            piece(k(7)..Key::MAX, Some(1)),
        ]
    );
    // Where no image reaches, a piece without one.
    assert_eq!(
        pieces(&[(k(2)..k(4), Lsn(5))]),
        vec![
            piece(Key::MIN..k(2), None),
            piece(k(2)..k(4), Some(0)),
            piece(k(4)..Key::MAX, None),
        ]
    );
    // Images that tile a range side by side are pieces of their own.
    assert_eq!(
        pieces(&[(Key::MIN..k(4), Lsn(5)), (k(4)..Key::MAX, Lsn(5))]),
        vec![
            piece(Key::MIN..k(4), Some(0)),
            piece(k(4)..Key::MAX, Some(1))
        ]
    );
}

#[test]
fn max_stack_counts_the_ranges_over_one_key() {
    let k = rel_key;
    assert_eq!(max_stack(&[]), 0);
    // Ranges that touch do not stack.
    assert_eq!(max_stack(&[k(1)..k(3), k(3)..k(5)]), 1);
    assert_eq!(
        max_stack(&[k(1)..k(5), k(2)..k(3), k(2)..k(4), k(4)..k(9)]),
        3
    );
}

#[test]
fn covered_needs_every_key_of_the_range() {
    let k = rel_key;
    assert!(covered(&(k(1)..k(5)), vec![k(0)..k(3), k(3)..k(9)]));
    assert!(covered(&(k(1)..k(5)), vec![k(2)..k(9), k(1)..k(2)]));
    assert!(!covered(&(k(1)..k(5)), vec![k(0)..k(3), k(4)..k(9)]));
    assert!(!covered(&(k(1)..k(5)), vec![k(1)..k(4)]));
    assert!(!covered(&(k(1)..k(5)), vec![]));
}
