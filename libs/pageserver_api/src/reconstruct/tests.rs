//! Redo against a reference model: patches, bases, limits and WAL records.

use super::*;
use crate::value::DEFAULT_MAX_VALUE_SIZE;
use proptest::prelude::*;

const MAX: usize = DEFAULT_MAX_VALUE_SIZE;

fn patch(offset: u32, data: &[u8]) -> Patch {
    Patch::new(offset, Bytes::copy_from_slice(data))
}

fn image(bytes: &[u8]) -> Value {
    Value::Image(Bytes::copy_from_slice(bytes))
}

fn delta(will_init: bool, patches: Vec<Patch>) -> Value {
    Value::Delta { will_init, patches }
}

#[test]
fn patches_overwrite_in_order() {
    let mut page = vec![1u8; 8];
    apply_delta(
        &mut page,
        &[patch(2, b"abcd"), patch(4, b"XY"), patch(0, b"")],
        MAX,
    )
    .unwrap();
    assert_eq!(page, [1, 1, b'a', b'b', b'X', b'Y', 1, 1]);
}

#[test]
fn patch_past_end_grows_with_zeroes() {
    let mut page = vec![7u8; 4];
    apply_delta(&mut page, &[patch(6, b"ab")], MAX).unwrap();
    assert_eq!(page, [7, 7, 7, 7, 0, 0, b'a', b'b']);

    // Straddling the end: the overlapping part is overwritten, the rest
    // appended.
    let mut page = vec![7u8; 4];
    apply_delta(&mut page, &[patch(2, b"abcd")], MAX).unwrap();
    assert_eq!(page, [7, 7, b'a', b'b', b'c', b'd']);

    // An empty patch past the end still grows the page to its offset.
    let mut page = vec![7u8; 2];
    apply_delta(&mut page, &[patch(5, b"")], MAX).unwrap();
    assert_eq!(page, [7, 7, 0, 0, 0]);

    // A short patch after a long one does not shrink the page.
    let mut page = Vec::new();
    apply_delta(&mut page, &[patch(8190, b"zz"), patch(0, b"a")], MAX).unwrap();
    assert_eq!(page.len(), ZERO_PAGE_SIZE);
    assert_eq!(page[0], b'a');
    assert!(page[1..8190].iter().all(|&b| b == 0));
    assert_eq!(&page[8190..], b"zz");
}

#[test]
fn page_may_reach_the_limit_exactly() {
    let mut page = Vec::new();
    apply_delta(&mut page, &[patch(8, b"xy")], 10).unwrap();
    assert_eq!(page.len(), 10);
}

#[test]
fn patch_past_limit_is_an_error_and_changes_nothing() {
    let mut page = vec![3u8; 4];
    let err = apply_delta(&mut page, &[patch(0, b"ok"), patch(9, b"xy")], 10).unwrap_err();
    assert_eq!(
        err,
        RedoError {
            record: None,
            kind: RedoErrorKind::PatchPastLimit {
                patch: 1,
                offset: 9,
                len: 2,
                end: 11,
                max_page_size: 10
            }
        }
    );
    assert_eq!(page, [3, 3, 3, 3]);
    let msg = err.to_string();
    assert!(
        msg.starts_with("cannot apply delta: patch 1 (offset 9, 2 bytes)")
            && msg.contains("11 bytes"),
        "{msg}"
    );

    // The largest offset with the default limit: refused, not a 4 GiB
    // allocation.
    let mut page = Vec::new();
    let err = apply_delta(&mut page, &[patch(u32::MAX, b"x")], MAX).unwrap_err();
    assert!(matches!(
        err.kind,
        RedoErrorKind::PatchPastLimit {
            offset: u32::MAX,
            ..
        }
    ));
    assert!(page.is_empty());
}

#[test]
fn page_already_past_limit_is_an_error() {
    let mut page = vec![0u8; 11];
    let err = apply_delta(&mut page, &[], 10).unwrap_err();
    assert_eq!(
        err.kind,
        RedoErrorKind::PagePastLimit {
            len: 11,
            max_page_size: 10
        }
    );
    assert_eq!(page.len(), 11);
}

#[test]
fn patch_end_overflow_is_an_error() {
    // Data of `usize::MAX` bytes cannot exist; check the rule that
    // `apply_delta` applies to every patch instead.
    assert_eq!(patch_range(0, 5, 3), Ok(5..8));
    let err = patch_range(2, 1, usize::MAX).unwrap_err();
    assert_eq!(
        err,
        RedoErrorKind::PatchEndOverflow {
            patch: 2,
            offset: 1,
            len: usize::MAX
        }
    );
    assert!(err.to_string().contains("patch 2 (offset 1"), "{err}");
}

#[test]
fn no_records_or_no_base_is_not_found() {
    assert_eq!(reconstruct_page::<u64, _>(&[], MAX), Ok(None));
    let records = [
        (30u64, delta(false, vec![patch(0, b"a")])),
        (20, delta(false, vec![patch(1, b"b")])),
    ];
    assert_eq!(reconstruct_page(&records, MAX), Ok(None));
}

#[test]
fn image_alone_is_returned_without_copying() {
    let page = Bytes::from(vec![9u8; ZERO_PAGE_SIZE]);
    let records = [(5u64, Value::Image(page.clone()))];
    let result = reconstruct_page(&records, MAX).unwrap().unwrap();
    assert_eq!(result, page);
    assert_eq!(result.as_ptr(), page.as_ptr());
}

#[test]
fn deltas_apply_oldest_first_onto_image() {
    let records = [
        (40u64, delta(false, vec![patch(1, b"C")])),
        (30, delta(false, vec![patch(0, b"BB")])),
        (20, image(b"AAAA")),
    ];
    let page = reconstruct_page(&records, MAX).unwrap().unwrap();
    assert_eq!(&page[..], b"BCAA");
}

#[test]
fn will_init_starts_from_zero_page_and_ignores_older_records() {
    let base = delta(true, vec![patch(2, b"ab")]);
    let newer = delta(false, vec![patch(0, b"Z")]);
    let mut expected = vec![0u8; ZERO_PAGE_SIZE];
    expected[0] = b'Z';
    expected[2..4].copy_from_slice(b"ab");

    let records = [(20u64, newer.clone()), (10, base.clone())];
    let page = reconstruct_page(&records, MAX).unwrap().unwrap();
    assert_eq!(&page[..], &expected[..]);

    // Whatever follows the base is never looked at: an older image, a
    // page too large for the limit, even LSNs out of order.
    let records = [
        (20u64, newer),
        (10, base),
        (5, image(b"ignored")),
        (50, image(&vec![1u8; MAX + 1])),
    ];
    let page = reconstruct_page(&records, MAX).unwrap().unwrap();
    assert_eq!(&page[..], &expected[..]);

    // An image base also hides everything older.
    let records = [(20u64, image(b"new")), (10, image(b"old"))];
    assert_eq!(
        reconstruct_page(&records, MAX).unwrap().as_deref(),
        Some(&b"new"[..])
    );
}

#[test]
fn will_init_alone_is_the_zero_page_with_its_patches() {
    let records = [(1u64, delta(true, Vec::new()))];
    let page = reconstruct_page(&records, MAX).unwrap().unwrap();
    assert_eq!(&page[..], &[0u8; ZERO_PAGE_SIZE][..]);

    // Its own patches may grow the zero page.
    let records = [(1u64, delta(true, vec![patch(8192, b"+")]))];
    let page = reconstruct_page(&records, MAX).unwrap().unwrap();
    assert_eq!(page.len(), ZERO_PAGE_SIZE + 1);
    assert_eq!(page[ZERO_PAGE_SIZE], b'+');
}

#[test]
fn works_with_utils_style_lsn_newtypes() {
    // Any `Ord` LSN type will do; this mirrors `utils::Lsn(pub u64)`.
    #[derive(PartialEq, Eq, PartialOrd, Ord)]
    struct Lsn(u64);
    let records = vec![
        (Lsn(0x20), delta(false, vec![patch(0, b"y")])),
        (Lsn(0x10), image(b"xx")),
    ];
    assert_eq!(
        reconstruct_page(&records, MAX).unwrap().as_deref(),
        Some(&b"yx"[..])
    );
}

#[test]
fn lsns_must_decrease() {
    for second in [30u64, 31] {
        let records = [(30u64, delta(false, vec![])), (second, image(b"x"))];
        let err = reconstruct_page(&records, MAX).unwrap_err();
        assert_eq!(
            err,
            RedoError {
                record: Some(1),
                kind: RedoErrorKind::LsnNotDecreasing
            }
        );
        assert!(err.to_string().contains("record 1"), "{err}");
    }
}

#[test]
fn errors_name_the_record() {
    // The delta at index 1 grows the page past the limit.
    let records = [
        (30u64, delta(false, vec![])),
        (20, delta(false, vec![patch(0, b"ok"), patch(99, b"x")])),
        (10, image(b"base")),
    ];
    let err = reconstruct_page(&records, 64).unwrap_err();
    assert_eq!(
        err,
        RedoError {
            record: Some(1),
            kind: RedoErrorKind::PatchPastLimit {
                patch: 1,
                offset: 99,
                len: 1,
                end: 100,
                max_page_size: 64
            }
        }
    );
    let msg = err.to_string();
    assert!(
        msg.starts_with("cannot reconstruct page: record 1"),
        "{msg}"
    );

    // An image base past the limit.
    let records = [(10u64, image(&[0u8; 65]))];
    assert_eq!(
        reconstruct_page(&records, 64),
        Err(RedoError {
            record: Some(0),
            kind: RedoErrorKind::PagePastLimit {
                len: 65,
                max_page_size: 64
            }
        })
    );

    // A will_init base when the limit is below the zero page's size.
    let records = [(20u64, delta(false, vec![])), (10, delta(true, vec![]))];
    assert_eq!(
        reconstruct_page(&records, ZERO_PAGE_SIZE - 1),
        Err(RedoError {
            record: Some(1),
            kind: RedoErrorKind::PagePastLimit {
                len: ZERO_PAGE_SIZE,
                max_page_size: ZERO_PAGE_SIZE - 1
            }
        })
    );
}

/// The reference model: the rules written as plainly as possible, one
/// patch at a time. Errors are reduced to the index of the failing
/// record.
fn reference(
    records_newest_first: &[(u64, Value)],
    max_page_size: usize,
) -> Result<Option<Vec<u8>>, usize> {
    let Some(base) = records_newest_first.iter().position(|(_, v)| v.will_init()) else {
        return Ok(None);
    };
    let mut page = Vec::new();
    for index in (0..=base).rev() {
        match &records_newest_first[index].1 {
            Value::Image(image) => page = image.to_vec(),
            Value::Delta { will_init, patches } => {
                if *will_init {
                    page = vec![0u8; ZERO_PAGE_SIZE];
                }
                if page.len() > max_page_size {
                    return Err(index);
                }
                for p in patches {
                    let start = usize::try_from(p.offset).unwrap();
                    let end = start + p.data.len();
                    if page.len() < end {
                        page.resize(end, 0);
                    }
                    page[start..end].copy_from_slice(&p.data);
                }
            }
            Value::WalRecord { .. } => unreachable!("reference_wal answers first"),
        }
        if page.len() > max_page_size {
            return Err(index);
        }
    }
    Ok(Some(page))
}

/// The reference model's answer for histories with WAL records between
/// the base and the top: the oldest of them, and the version below it.
fn reference_wal(records_newest_first: &[(u64, Value)]) -> Option<RedoError> {
    let base = records_newest_first.iter().position(|(_, v)| v.will_init());
    let end = base.map_or(records_newest_first.len(), |b| b + 1);
    let wal: Vec<usize> = (0..end)
        .filter(|i| records_newest_first[*i].1.is_wal_record())
        .collect();
    let oldest = *wal.last()?;
    let materialized = match base {
        Some(base) if base > oldest => Some(oldest + 1),
        _ => None,
    };
    Some(RedoError {
        record: Some(oldest),
        kind: RedoErrorKind::NeedsWalRedo {
            wal_records: wal.len(),
            materialized,
        },
    })
}

#[test]
fn wal_records_above_the_base_name_where_the_page_is_materialized() {
    let wal = |will_init| Value::WalRecord {
        will_init,
        record: Bytes::from_static(b"r"),
    };
    // image@10, delta@20, WAL@30, delta@40, WAL@50: materialized as of 20.
    let records = [
        (50u64, wal(false)),
        (40, delta(false, vec![patch(0, b"x")])),
        (30, wal(false)),
        (20, delta(false, vec![patch(1, b"y")])),
        (10, image(b"ab")),
    ];
    let err = reconstruct_page(&records, MAX).unwrap_err();
    assert_eq!(
        err.kind,
        RedoErrorKind::NeedsWalRedo {
            wal_records: 2,
            materialized: Some(3)
        }
    );
    assert_eq!(err.record, Some(2));
    // Read below the first WAL record: an ordinary page.
    assert_eq!(
        reconstruct_page(&records[3..], MAX).unwrap().unwrap(),
        Bytes::from_static(b"ay")
    );
    // A WAL record that builds the page: nothing below answers.
    let records = [(30u64, wal(true)), (10, image(b"ab"))];
    let err = reconstruct_page(&records, MAX).unwrap_err();
    assert_eq!(
        err.kind,
        RedoErrorKind::NeedsWalRedo {
            wal_records: 1,
            materialized: None
        }
    );
    // Below an image, a WAL record is history no read needs.
    let records = [(30u64, image(b"c")), (20, wal(false))];
    assert_eq!(
        reconstruct_page(&records, MAX).unwrap().unwrap(),
        Bytes::from_static(b"c")
    );
}

fn any_patch() -> impl Strategy<Value = Patch> {
    (
        0u32..=16 * 1024,
        proptest::collection::vec(any::<u8>(), 0..64),
    )
        .prop_map(|(offset, data)| Patch::new(offset, data))
}

fn any_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        1 => proptest::collection::vec(any::<u8>(), 0..10_000)
            .prop_map(|page| Value::Image(Bytes::from(page))),
        1 => proptest::collection::vec(any_patch(), 0..6)
            .prop_map(|patches| Value::Delta { will_init: true, patches }),
        4 => proptest::collection::vec(any_patch(), 0..6)
            .prop_map(|patches| Value::Delta { will_init: false, patches }),
        1 => any::<bool>().prop_map(|will_init| Value::WalRecord {
            will_init,
            record: Bytes::from_static(b"record"),
        }),
    ]
}

/// Records newest first with strictly decreasing LSNs.
fn any_records() -> impl Strategy<Value = Vec<(u64, Value)>> {
    proptest::collection::vec((1u64..1000, any_value()), 0..12).prop_map(|steps| {
        let mut lsn = 0u64;
        let mut records: Vec<(u64, Value)> = steps
            .into_iter()
            .map(|(step, value)| {
                lsn += step;
                (lsn, value)
            })
            .collect();
        records.reverse();
        records
    })
}

fn any_limit() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(MAX),
        Just(ZERO_PAGE_SIZE - 1),
        Just(ZERO_PAGE_SIZE),
        Just(12_000),
        Just(16 * 1024 + 64),
    ]
}

proptest! {
    #[test]
    fn matches_reference_model(records in any_records(), limit in any_limit()) {
        let ours = reconstruct_page(&records, limit);
        if let Some(expected) = reference_wal(&records) {
            prop_assert_eq!(ours, Err(expected));
            return Ok(());
        }
        match reference(&records, limit) {
            Ok(expected) => {
                prop_assert_eq!(ours.map(|page| page.map(|p| p.to_vec())), Ok(expected));
            }
            Err(record) => {
                let err = ours.unwrap_err();
                prop_assert_eq!(err.record, Some(record));
                let is_limit_error = matches!(
                    err.kind,
                    RedoErrorKind::PagePastLimit { .. } | RedoErrorKind::PatchPastLimit { .. }
                );
                prop_assert!(is_limit_error, "{}", err);
            }
        }
    }

    #[test]
    fn taking_gives_what_borrowing_gives(records in any_records(), limit in any_limit()) {
        let mut owned = records.clone();
        let taken = reconstruct_page_taking(&mut owned, limit);
        prop_assert_eq!(taken, reconstruct_page(&records, limit));
        // What is left still names the records.
        let lsns = |r: &[(u64, Value)]| r.iter().map(|(lsn, _)| *lsn).collect::<Vec<_>>();
        prop_assert_eq!(lsns(&owned), lsns(&records));
    }

    #[test]
    fn history_older_than_a_base_is_irrelevant(
        newer in any_records(),
        older in any_records(),
    ) {
        // Only the part up to the first base counts; replace everything
        // after it with different history (LSNs shifted below it).
        let Some(base) = newer.iter().position(|(_, v)| v.will_init()) else {
            return Ok(());
        };
        let floor = newer[base].0;
        let mut changed: Vec<(u64, Value)> = newer[..=base].to_vec();
        changed.extend(older.into_iter().filter(|(lsn, _)| *lsn < floor));
        prop_assert_eq!(reconstruct_page(&newer, MAX), reconstruct_page(&changed, MAX));
    }

    #[test]
    fn apply_delta_is_all_or_nothing(
        page in proptest::collection::vec(any::<u8>(), 0..10_000),
        patches in proptest::collection::vec(any_patch(), 0..6),
        limit in any_limit(),
    ) {
        let mut after = page.clone();
        match apply_delta(&mut after, &patches, limit) {
            Ok(()) => {
                prop_assert!(after.len() <= limit);
                prop_assert!(after.len() >= page.len());
            }
            Err(_) => prop_assert_eq!(after, page),
        }
    }
}

#[test]
fn taking_redoes_an_unshared_image_in_its_own_buffer() {
    let base: Vec<u8> = (0..8192).map(|i| i as u8).collect();
    let base_at = base.as_ptr();
    let mut records = vec![
        (20u64, delta(false, vec![patch(1, b"yz")])),
        (10u64, delta(false, vec![patch(0, b"x")])),
        (5u64, Value::Image(Bytes::from(base))),
    ];
    let page = reconstruct_page_taking(&mut records, MAX).unwrap().unwrap();
    assert_eq!(&page[..4], b"xyz\x03");
    assert_eq!(page.as_ptr(), base_at, "redone in the image's own buffer");
    assert_eq!(
        records[2].1,
        Value::Image(Bytes::new()),
        "the image was taken"
    );
}

#[test]
fn taking_copies_an_image_someone_else_holds() {
    let base = Bytes::from(vec![7u8; 8192]);
    let mut records = vec![
        (10u64, delta(false, vec![patch(0, b"x")])),
        (5u64, Value::Image(base.clone())),
    ];
    let page = reconstruct_page_taking(&mut records, MAX).unwrap().unwrap();
    assert_eq!(&page[..2], b"x\x07");
    assert_eq!(
        base,
        vec![7u8; 8192],
        "the other holder's bytes are unchanged"
    );
    assert_ne!(page.as_ptr(), base.as_ptr());
}

#[test]
fn taking_a_lone_image_returns_it_and_keeps_it() {
    let base = Bytes::from(vec![3u8; 8192]);
    let mut records = vec![(5u64, Value::Image(base.clone()))];
    assert_eq!(
        reconstruct_page_taking(&mut records, MAX),
        Ok(Some(base.clone()))
    );
    assert_eq!(records[0].1, Value::Image(base));
}

#[test]
fn taking_reports_an_lsn_out_of_order_as_borrowing_does() {
    // The image is taken before the walk finds the LSNs out of order above it.
    let records = vec![
        (10u64, delta(false, vec![patch(0, b"x")])),
        (20u64, delta(false, vec![patch(1, b"y")])),
        (5u64, Value::Image(Bytes::from(vec![1u8; 8192]))),
    ];
    let mut owned = records.clone();
    let err = reconstruct_page_taking(&mut owned, MAX).unwrap_err();
    assert_eq!(Err(err), reconstruct_page(&records, MAX));
    assert_eq!(owned.len(), records.len());
}
