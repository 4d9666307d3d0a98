//! The value format pinned byte for byte, serialization's refusals, every way a buffer can be
//! malformed, and property tests: values round-trip, and no bytes at all make decoding panic.

use super::*;
use proptest::prelude::*;

fn delta(will_init: bool, patches: Vec<Patch>) -> Value {
    Value::Delta { will_init, patches }
}

fn ser(value: &Value) -> Vec<u8> {
    value.serialize().expect("value fits the format")
}

#[test]
fn image_format_is_pinned() {
    let value = Value::Image(Bytes::from_static(b"\xAA\xBB\xCC"));
    assert_eq!(ser(&value), [0x00, 0xAA, 0xBB, 0xCC]);
    assert_eq!(value.serialized_len(), 4);

    let empty = Value::Image(Bytes::new());
    assert_eq!(ser(&empty), [0x00]);
    assert_eq!(Value::deserialize(&[0x00]), Ok(empty));
}

#[test]
fn delta_format_is_pinned() {
    let value = delta(
        true,
        vec![
            Patch::new(0x0102_0304, &b"xy"[..]),
            Patch::new(0x1FFF, Bytes::new()),
        ],
    );
    #[rustfmt::skip]
    let expected = [
        0x01,                   // kind: delta
        0x01,                   // will_init: true
        0x00, 0x02,             // count: 2
        0x01, 0x02, 0x03, 0x04, // patch 0 offset
        0x00, 0x00, 0x00, 0x02, // patch 0 dlen
        b'x', b'y',             // patch 0 data
        0x00, 0x00, 0x1F, 0xFF, // patch 1 offset
        0x00, 0x00, 0x00, 0x00, // patch 1 dlen (no data)
    ];
    assert_eq!(ser(&value), expected);
    assert_eq!(value.serialized_len(), expected.len());
    assert_eq!(Value::deserialize(&expected), Ok(value));

    let empty = delta(false, Vec::new());
    assert_eq!(ser(&empty), [0x01, 0x00, 0x00, 0x00]);
    assert_eq!(Value::deserialize(&[0x01, 0x00, 0x00, 0x00]), Ok(empty));
}

#[test]
fn wal_record_format_is_pinned() {
    let value = Value::WalRecord {
        will_init: true,
        record: Bytes::from_static(b"\x2a\x00rec"),
    };
    let expected = [0x02, 0x01, 0x2a, 0x00, b'r', b'e', b'c'];
    assert_eq!(ser(&value), expected);
    assert_eq!(value.serialized_len(), expected.len());
    assert_eq!(Value::check_serialized(&expected), Ok(true));
    assert_eq!(Value::deserialize(&expected), Ok(value.clone()));
    assert!(value.is_wal_record() && value.will_init());
}

#[test]
fn a_wal_record_without_bytes_is_refused_both_ways() {
    assert_eq!(
        Value::deserialize(&[KIND_WAL_RECORD, 0]),
        Err(ValueDecodeError::EmptyWalRecord { offset: 2 })
    );
    assert!(matches!(
        Value::deserialize(&[KIND_WAL_RECORD, 2, 7]),
        Err(ValueDecodeError::InvalidWillInit {
            found: 2,
            offset: 1
        })
    ));
    assert!(matches!(
        Value::deserialize(&[KIND_WAL_RECORD]),
        Err(ValueDecodeError::Truncated {
            field: ValueField::WillInit,
            ..
        })
    ));
    let empty = Value::WalRecord {
        will_init: false,
        record: Bytes::new(),
    };
    assert_eq!(
        empty.check_encodable(),
        Err(ValueEncodeError::EmptyWalRecord)
    );
    let mut out = vec![9];
    assert_eq!(
        empty.serialize_into(&mut out),
        Err(ValueEncodeError::EmptyWalRecord)
    );
    assert_eq!(out, [9], "a refused value writes nothing");
}

#[test]
fn serialize_into_appends() {
    let mut out = vec![0xEE];
    Value::Image(Bytes::from_static(b"p"))
        .serialize_into(&mut out)
        .unwrap();
    delta(false, vec![Patch::new(7, &b"q"[..])])
        .serialize_into(&mut out)
        .unwrap();
    assert_eq!(
        out,
        [0xEE, 0x00, b'p', 0x01, 0x00, 0x00, 0x01, 0, 0, 0, 7, 0, 0, 0, 1, b'q']
    );
}

#[test]
fn will_init_by_kind() {
    assert!(Value::Image(Bytes::new()).will_init());
    assert!(delta(true, Vec::new()).will_init());
    assert!(!delta(false, Vec::new()).will_init());
}

#[test]
fn too_many_patches_is_refused_without_writing() {
    let max = usize::from(MAX_PATCHES);
    let fits = delta(false, vec![Patch::new(0, Bytes::new()); max]);
    let bytes = ser(&fits);
    assert_eq!(&bytes[2..4], &[0xFF, 0xFF]);
    assert_eq!(Value::deserialize(&bytes).as_ref(), Ok(&fits));

    let too_many = delta(false, vec![Patch::new(0, Bytes::new()); max + 1]);
    let mut out = vec![1, 2, 3];
    let err = too_many.serialize_into(&mut out).unwrap_err();
    assert_eq!(err, ValueEncodeError::TooManyPatches { count: max + 1 });
    assert_eq!(too_many.check_encodable(), Err(err.clone()));
    assert_eq!(fits.check_encodable(), Ok(()));
    assert_eq!(out, [1, 2, 3]);
    let msg = err.to_string();
    assert!(msg.contains("65535") && msg.contains("65536"), "{msg}");
}

#[test]
fn overlong_patch_data_is_refused() {
    // A real 4 GiB patch is too big for a unit test; check the length
    // rule that `serialize_into` applies to every patch instead.
    let max = usize::try_from(MAX_PATCH_DATA_LEN).unwrap();
    assert_eq!(encodable_data_len(3, max), Ok(MAX_PATCH_DATA_LEN));
    if let Some(over) = max.checked_add(1) {
        let err = encodable_data_len(3, over).unwrap_err();
        assert_eq!(
            err,
            ValueEncodeError::PatchTooLong {
                index: 3,
                len: over
            }
        );
        assert!(err.to_string().contains("patch 3"), "{err}");
    }
}

#[test]
fn rejects_empty_buffer() {
    let err = Value::deserialize(&[]).unwrap_err();
    assert_eq!(
        err,
        ValueDecodeError::Truncated {
            field: ValueField::Kind,
            offset: 0,
            needed: 1,
            available: 0
        }
    );
    assert!(err.to_string().contains("the kind byte"), "{err}");
}

#[test]
fn rejects_unknown_kind() {
    for kind in [3u8, 0x7F, 0xFF] {
        let err = Value::deserialize(&[kind, 0, 0, 0]).unwrap_err();
        assert_eq!(err, ValueDecodeError::UnknownKind { kind, offset: 0 });
        let msg = err.to_string();
        assert!(msg.contains(&format!("kind {kind} at byte 0")), "{msg}");
    }
}

#[test]
fn rejects_invalid_will_init() {
    for found in [2u8, 0x80, 0xFF] {
        let err = Value::deserialize(&[KIND_DELTA, found, 0, 0]).unwrap_err();
        assert_eq!(err, ValueDecodeError::InvalidWillInit { found, offset: 1 });
        assert!(err.to_string().contains("at byte 1"), "{err}");
    }
}

#[test]
fn rejects_truncated_delta_header() {
    assert_eq!(
        Value::deserialize(&[KIND_DELTA]),
        Err(ValueDecodeError::Truncated {
            field: ValueField::WillInit,
            offset: 1,
            needed: 1,
            available: 0
        })
    );
    assert_eq!(
        Value::deserialize(&[KIND_DELTA, 0, 0]),
        Err(ValueDecodeError::Truncated {
            field: ValueField::PatchCount,
            offset: 2,
            needed: 2,
            available: 1
        })
    );
}

#[test]
fn rejects_truncated_patches() {
    let value = delta(
        false,
        vec![Patch::new(5, &b"abc"[..]), Patch::new(9, &b"defg"[..])],
    );
    let full = ser(&value);
    // Layout: header 0..4, patch 0 header 4..12, data 12..15,
    // patch 1 header 15..23, data 23..27.
    assert_eq!(full.len(), 27);

    // Every proper prefix from the first patch on is rejected, with the
    // field and offset of the first missing byte.
    for cut in DELTA_HEADER_LEN..full.len() {
        let err = Value::deserialize(&full[..cut]).unwrap_err();
        let (field, offset, needed) = match cut {
            4..=11 => (ValueField::PatchHeader { index: 0 }, 4, 8),
            12..=14 => (ValueField::PatchData { index: 0 }, 12, 3),
            15..=22 => (ValueField::PatchHeader { index: 1 }, 15, 8),
            _ => (ValueField::PatchData { index: 1 }, 23, 4),
        };
        assert_eq!(
            err,
            ValueDecodeError::Truncated {
                field,
                offset,
                needed,
                available: cut - offset
            },
            "cut at {cut}"
        );
    }

    let err = Value::deserialize(&full[..20]).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("at byte 15: the header of patch 1 needs 8 bytes but only 5 remain"),
        "{msg}"
    );
}

#[test]
fn rejects_data_length_past_the_end() {
    // Claims 4 GiB - 1 of data with 2 bytes present.
    let bytes = [
        KIND_DELTA, 0, 0, 1, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 1, 2,
    ];
    assert_eq!(
        Value::deserialize(&bytes),
        Err(ValueDecodeError::Truncated {
            field: ValueField::PatchData { index: 0 },
            offset: 12,
            needed: 0xFFFF_FFFF,
            available: 2
        })
    );
}

#[test]
fn rejects_trailing_bytes() {
    let mut bytes = ser(&delta(true, vec![Patch::new(1, &b"z"[..])]));
    let end = bytes.len();
    bytes.extend_from_slice(&[0, 0, 0]);
    let err = Value::deserialize(&bytes).unwrap_err();
    assert_eq!(
        err,
        ValueDecodeError::TrailingBytes {
            offset: end,
            count: 3,
            patches: 1
        }
    );
    assert!(
        err.to_string()
            .contains(&format!("3 trailing bytes at byte {end}")),
        "{err}"
    );

    // A delta that declares no patches must end after its header.
    assert_eq!(
        Value::deserialize(&[KIND_DELTA, 0, 0, 0, 9]),
        Err(ValueDecodeError::TrailingBytes {
            offset: 4,
            count: 1,
            patches: 0
        })
    );
}

#[test]
fn huge_declared_count_without_patches_is_truncation() {
    // 65535 patches declared, none present: rejected as truncated at
    // the first patch header. (`parse` sizes its patch list by the bytes
    // present, not by this count.)
    let bytes = [KIND_DELTA, 0, 0xFF, 0xFF];
    assert_eq!(
        Value::deserialize(&bytes),
        Err(ValueDecodeError::Truncated {
            field: ValueField::PatchHeader { index: 0 },
            offset: 4,
            needed: 8,
            available: 0
        })
    );
}

#[test]
fn deserialize_bytes_does_not_copy() {
    let value = delta(
        false,
        vec![Patch::new(1, &b"hello"[..]), Patch::new(2, &b"world"[..])],
    );
    let buf = Bytes::from(ser(&value));
    let range = buf.as_ptr_range();
    let decoded = Value::deserialize_bytes(buf.clone()).unwrap();
    assert_eq!(decoded, value);
    let Value::Delta { patches, .. } = decoded else {
        panic!("decoded a delta as an image")
    };
    for patch in &patches {
        assert!(range.contains(&patch.data.as_ptr()));
    }

    let image = Bytes::from(ser(&Value::Image(Bytes::from_static(b"page"))));
    let Value::Image(page) = Value::deserialize_bytes(image.clone()).unwrap() else {
        panic!("decoded an image as a delta")
    };
    assert_eq!(page.as_ptr(), image[1..].as_ptr());
}

fn any_bytes(max_len: usize) -> impl Strategy<Value = Bytes> {
    proptest::collection::vec(any::<u8>(), 0..max_len).prop_map(Bytes::from)
}

fn any_patch() -> impl Strategy<Value = Patch> {
    (0u32..=16 * 1024, any_bytes(300)).prop_map(|(offset, data)| Patch { offset, data })
}

fn any_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        any_bytes(20_000).prop_map(Value::Image),
        (any::<bool>(), proptest::collection::vec(any_patch(), 0..20))
            .prop_map(|(will_init, patches)| Value::Delta { will_init, patches }),
        (
            any::<bool>(),
            proptest::collection::vec(any::<u8>(), 1..400)
        )
            .prop_map(|(will_init, record)| Value::WalRecord {
                will_init,
                record: Bytes::from(record)
            }),
    ]
}

proptest! {
    #[test]
    fn round_trip(value in any_value()) {
        let bytes = ser(&value);
        prop_assert_eq!(bytes.len(), value.serialized_len());
        prop_assert_eq!(Value::check_serialized(&bytes), Ok(value.will_init()));
        prop_assert_eq!(&Value::deserialize(&bytes), &Ok(value.clone()));
        prop_assert_eq!(Value::deserialize_bytes(Bytes::from(bytes)), Ok(value));
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        // Whatever is accepted is canonical: it encodes back to the input.
        if let Ok(value) = Value::deserialize(&bytes) {
            prop_assert_eq!(ser(&value), bytes.clone());
        }
        // The check without building accepts exactly what decoding accepts.
        let checked = Value::check_serialized(&bytes);
        match Value::deserialize(&bytes) {
            Ok(value) => prop_assert_eq!(checked, Ok(value.will_init())),
            Err(e) => prop_assert_eq!(checked, Err(e)),
        }
    }

    #[test]
    fn arbitrary_delta_like_bytes_never_panic(
        will_init in 0u8..3,
        count in 0u16..4,
        rest in proptest::collection::vec(prop_oneof![Just(0u8), any::<u8>()], 0..64),
    ) {
        // Mostly-valid headers so decoding gets past the first bytes.
        let mut bytes = vec![KIND_DELTA, will_init];
        bytes.extend_from_slice(&count.to_be_bytes());
        bytes.extend_from_slice(&rest);
        if let Ok(value) = Value::deserialize(&bytes) {
            prop_assert_eq!(ser(&value), bytes);
        }
    }

    #[test]
    fn damaged_values_never_panic(
        value in any_value(),
        cut in any::<prop::sample::Index>(),
        flip in any::<prop::sample::Index>(),
        xor in 1u8..,
    ) {
        let bytes = ser(&value);
        // Truncated anywhere: a delta is then always rejected (an image
        // just gets shorter).
        let truncated = &bytes[..cut.index(bytes.len())];
        let decoded = Value::deserialize(truncated);
        if matches!(value, Value::Delta { .. }) {
            prop_assert!(decoded.is_err());
        }
        // One byte changed: either rejected or a different value.
        let mut damaged = bytes.clone();
        let at = flip.index(damaged.len());
        damaged[at] ^= xor;
        if let Ok(other) = Value::deserialize(&damaged) {
            prop_assert_ne!(&other, &value);
            prop_assert_eq!(ser(&other), damaged);
        }
    }
}
