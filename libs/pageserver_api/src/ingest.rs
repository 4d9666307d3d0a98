//! The ingest body: a batch of page versions as one HTTP request carries it.
//!
//! ```text
//! body   := record*
//! record := key[18] lsn:u64 kind:u8 len:u32 payload[len]        (integers big-endian)
//!   kind 0  image: payload = the page bytes
//!   kind 1  delta: payload = will_init:u8 count:u16 { offset:u32 dlen:u32 data[dlen] }*count
//! ```
//!
//! `kind` and `payload` together are exactly a [`Value`] in its stable byte format, so an image
//! decodes without copying its page and a delta through the same validating parser the layer
//! files use. Decoding checks every length against what is left of the body and against the
//! configured largest value before trusting it; an error names the record and the byte offset
//! where it went wrong.

use bytes::{BufMut, Bytes, BytesMut};
use utils::Lsn;

use crate::key::KEY_SIZE;
use crate::value::{KIND_DELTA, KIND_IMAGE};
use crate::{Key, Value, ValueDecodeError, ValueEncodeError};

/// Bytes before each record's payload: key, LSN, kind, length.
pub const RECORD_HEADER_LEN: usize = KEY_SIZE + 8 + 1 + 4;

/// One version of one page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PutRecord {
    pub key: Key,
    pub lsn: Lsn,
    pub value: Value,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ingest body: record {record} at byte {offset}: {reason}")]
pub struct IngestDecodeError {
    /// Which record, counted from zero.
    pub record: usize,
    /// Where in the body the problem was found.
    pub offset: usize,
    pub reason: IngestDecodeReason,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IngestDecodeReason {
    #[error("the body ends inside the record header ({have} of {RECORD_HEADER_LEN} bytes)")]
    TruncatedHeader { have: usize },
    #[error("unknown record kind {kind} (0 is an image, 1 a delta)")]
    UnknownKind { kind: u8 },
    #[error("payload length {len} is more than the {left} bytes left in the body")]
    TruncatedPayload { len: u64, left: usize },
    #[error("payload length {len} is over the largest value accepted, {max} bytes")]
    TooLarge { len: u64, max: usize },
    #[error("malformed delta payload: {0}")]
    Delta(ValueDecodeError),
}

/// Appends `record` in the body format.
pub fn encode_record(out: &mut Vec<u8>, record: &PutRecord) -> Result<(), ValueEncodeError> {
    let mut value = Vec::with_capacity(record.value.serialized_len());
    record.value.serialize_into(&mut value)?;
    let (kind, payload) = value.split_first().expect("a value has a kind byte");
    out.reserve(RECORD_HEADER_LEN + payload.len());
    out.extend_from_slice(&record.key.to_bytes());
    out.put_u64(record.lsn.0);
    out.put_u8(*kind);
    out.put_u32(
        u32::try_from(payload.len()).map_err(|_| ValueEncodeError::PatchTooLong {
            index: 0,
            len: payload.len(),
        })?,
    );
    out.extend_from_slice(payload);
    Ok(())
}

/// A whole body for `records`.
pub fn encode_batch(records: &[PutRecord]) -> Result<Vec<u8>, ValueEncodeError> {
    let mut out = Vec::new();
    for record in records {
        encode_record(&mut out, record)?;
    }
    Ok(out)
}

/// Decodes a whole body. Payloads longer than `max_payload_len` bytes are refused before
/// anything is allocated for them; images share `body`'s memory.
pub fn decode_batch(
    body: Bytes,
    max_payload_len: usize,
) -> Result<Vec<PutRecord>, IngestDecodeError> {
    let mut decoder = BatchDecoder::new(max_payload_len);
    decoder.feed(body)?;
    decoder.finish()
}

/// Decodes a body as it arrives, in chunks cut anywhere, with the same checks, results and
/// errors as [`decode_batch`] of the whole body. A record that lies within one chunk is decoded
/// in place, its image sharing the chunk's memory; only a record cut by a chunk boundary is
/// copied, into a buffer that holds at most that one record (its length checked against
/// `max_payload_len` as soon as its header is in).
pub struct BatchDecoder {
    max_payload_len: usize,
    records: Vec<PutRecord>,
    /// The first bytes of a record cut by a chunk boundary.
    partial: BytesMut,
    /// Where in the body the record being decoded (the one in `partial`, or the next) starts.
    record_start: usize,
}

/// A record's header, its lengths checked.
struct RecordHeader {
    key: Key,
    lsn: Lsn,
    kind: u8,
    /// The payload's length, at most the decoder's `max_payload_len`.
    len: usize,
}

impl BatchDecoder {
    pub fn new(max_payload_len: usize) -> Self {
        BatchDecoder {
            max_payload_len,
            records: Vec::new(),
            partial: BytesMut::new(),
            record_start: 0,
        }
    }

    /// Decodes the records `chunk` completes, and keeps the start of the one it cuts.
    pub fn feed(&mut self, mut chunk: Bytes) -> Result<(), IngestDecodeError> {
        if !self.partial.is_empty() {
            let Some(whole) = self.complete_partial(&mut chunk)? else {
                return Ok(());
            };
            self.decode_record(whole)?;
        }
        while chunk.len() >= RECORD_HEADER_LEN {
            let header = self.header(&chunk[..RECORD_HEADER_LEN])?;
            if chunk.len() - RECORD_HEADER_LEN < header.len {
                break;
            }
            let whole = chunk.split_to(RECORD_HEADER_LEN + header.len);
            self.decode_record(whole)?;
        }
        if !chunk.is_empty() {
            self.partial.extend_from_slice(&chunk);
        }
        Ok(())
    }

    /// The decoded records, once the whole body was fed.
    pub fn finish(self) -> Result<Vec<PutRecord>, IngestDecodeError> {
        let have = self.partial.len();
        if have == 0 {
            return Ok(self.records);
        }
        if have < RECORD_HEADER_LEN {
            return Err(self.error(0, IngestDecodeReason::TruncatedHeader { have }));
        }
        // Its length was checked against the largest value when its header came in.
        let header = self.header(&self.partial[..RECORD_HEADER_LEN])?;
        Err(self.error(
            LEN_AT,
            IngestDecodeReason::TruncatedPayload {
                len: header.len as u64,
                left: have - RECORD_HEADER_LEN,
            },
        ))
    }

    /// Moves bytes from `chunk` into `partial` until the record there is whole, and returns it.
    fn complete_partial(&mut self, chunk: &mut Bytes) -> Result<Option<Bytes>, IngestDecodeError> {
        if self.partial.len() < RECORD_HEADER_LEN {
            let take = (RECORD_HEADER_LEN - self.partial.len()).min(chunk.len());
            self.partial.extend_from_slice(&chunk.split_to(take));
            if self.partial.len() < RECORD_HEADER_LEN {
                return Ok(None);
            }
        }
        let header = self.header(&self.partial[..RECORD_HEADER_LEN])?;
        let whole_len = RECORD_HEADER_LEN + header.len;
        let take = (whole_len - self.partial.len()).min(chunk.len());
        self.partial.extend_from_slice(&chunk.split_to(take));
        if self.partial.len() < whole_len {
            return Ok(None);
        }
        Ok(Some(self.partial.split().freeze()))
    }

    /// Reads a record's header; refuses a payload over the largest value.
    fn header(&self, header: &[u8]) -> Result<RecordHeader, IngestDecodeError> {
        let key = Key::from_slice(&header[..KEY_SIZE]).expect("KEY_SIZE bytes");
        let lsn = Lsn(u64::from_be_bytes(
            header[KEY_SIZE..KIND_AT].try_into().expect("8 bytes"),
        ));
        let kind = header[KIND_AT];
        let len = u32::from_be_bytes(header[LEN_AT..].try_into().expect("4 bytes"));
        match usize::try_from(len) {
            Ok(len) if len <= self.max_payload_len => Ok(RecordHeader {
                key,
                lsn,
                kind,
                len,
            }),
            _ => Err(self.error(
                LEN_AT,
                IngestDecodeReason::TooLarge {
                    len: u64::from(len),
                    max: self.max_payload_len,
                },
            )),
        }
    }

    /// Decodes one whole record: its header and exactly its payload.
    fn decode_record(&mut self, whole: Bytes) -> Result<(), IngestDecodeError> {
        let header = self.header(&whole[..RECORD_HEADER_LEN])?;
        let payload = whole.slice(RECORD_HEADER_LEN..);
        let value = match header.kind {
            KIND_IMAGE => Value::Image(payload),
            KIND_DELTA => {
                let mut encoded = Vec::with_capacity(1 + payload.len());
                encoded.push(KIND_DELTA);
                encoded.extend_from_slice(&payload);
                Value::deserialize_bytes(Bytes::from(encoded))
                    .map_err(|e| self.error(RECORD_HEADER_LEN, IngestDecodeReason::Delta(e)))?
            }
            kind => return Err(self.error(KIND_AT, IngestDecodeReason::UnknownKind { kind })),
        };
        self.records.push(PutRecord {
            key: header.key,
            lsn: header.lsn,
            value,
        });
        self.record_start += whole.len();
        Ok(())
    }

    /// An error in the record being decoded, `at` bytes into it.
    fn error(&self, at: usize, reason: IngestDecodeReason) -> IngestDecodeError {
        IngestDecodeError {
            record: self.records.len(),
            offset: self.record_start + at,
            reason,
        }
    }
}

/// Where in a record's header its kind byte is, and its length.
const KIND_AT: usize = KEY_SIZE + 8;
const LEN_AT: usize = KIND_AT + 1;

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::Patch;

    fn record(n: u8, lsn: u64, value: Value) -> PutRecord {
        PutRecord {
            key: Key::rel_block(1663, 5, 16384, 0, u32::from(n)),
            lsn: Lsn(lsn),
            value,
        }
    }

    fn value() -> impl Strategy<Value = Value> {
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..300).prop_map(|b| Value::Image(Bytes::from(b))),
            (
                any::<bool>(),
                prop::collection::vec(
                    (any::<u32>(), prop::collection::vec(any::<u8>(), 0..40)),
                    0..5
                )
            )
                .prop_map(|(will_init, patches)| Value::Delta {
                    will_init,
                    patches: patches
                        .into_iter()
                        .map(|(offset, data)| Patch::new(offset, data))
                        .collect(),
                }),
        ]
    }

    #[test]
    fn the_layout_is_the_documented_one() {
        let body = encode_batch(&[
            record(1, 0x10, Value::Image(Bytes::from_static(b"abc"))),
            record(
                2,
                0x11,
                Value::Delta {
                    will_init: true,
                    patches: vec![Patch::new(7, &b"xy"[..])],
                },
            ),
        ])
        .unwrap();
        let key1 = record(1, 0, Value::Image(Bytes::new())).key.to_bytes();
        let mut expected = key1.to_vec();
        expected.extend_from_slice(&0x10u64.to_be_bytes());
        expected.extend_from_slice(&[0, 0, 0, 0, 3, b'a', b'b', b'c']);
        assert_eq!(&body[..expected.len()], &expected[..]);
        let delta = &body[expected.len() + KEY_SIZE + 8..];
        assert_eq!(
            delta,
            [1, 0, 0, 0, 13, 1, 0, 1, 0, 0, 0, 7, 0, 0, 0, 2, b'x', b'y']
        );
    }

    #[test]
    fn errors_name_the_record_and_offset() {
        let one = encode_batch(&[record(1, 1, Value::Image(Bytes::from_static(b"page")))]).unwrap();
        let mut body = one.clone();
        body.extend_from_slice(&one[..10]);
        let err = decode_batch(Bytes::from(body), 100).unwrap_err();
        assert_eq!((err.record, err.offset), (1, one.len()));
        assert!(matches!(
            err.reason,
            IngestDecodeReason::TruncatedHeader { have: 10 }
        ));

        let mut body = one.clone();
        body[KEY_SIZE + 8] = 9;
        let err = decode_batch(Bytes::from(body), 100).unwrap_err();
        assert_eq!(err.reason, IngestDecodeReason::UnknownKind { kind: 9 });
        assert_eq!(err.offset, KEY_SIZE + 8);

        let err = decode_batch(Bytes::from(one.clone()), 3).unwrap_err();
        assert_eq!(err.reason, IngestDecodeReason::TooLarge { len: 4, max: 3 });

        let err = decode_batch(Bytes::from(one[..one.len() - 1].to_vec()), 100).unwrap_err();
        assert_eq!(
            err.reason,
            IngestDecodeReason::TruncatedPayload { len: 4, left: 3 }
        );
        assert!(err.to_string().contains("record 0 at byte 27"), "{err}");

        let mut delta = encode_batch(&[record(
            1,
            1,
            Value::Delta {
                will_init: false,
                patches: vec![Patch::new(0, &b"z"[..])],
            },
        )])
        .unwrap();
        delta[RECORD_HEADER_LEN] = 2; // will_init must be 0 or 1
        let err = decode_batch(Bytes::from(delta), 100).unwrap_err();
        assert!(matches!(err.reason, IngestDecodeReason::Delta(_)), "{err}");
        assert!(decode_batch(Bytes::new(), 100).unwrap().is_empty());
    }

    proptest! {
        #[test]
        fn round_trips(values in prop::collection::vec(value(), 0..8)) {
            let records: Vec<PutRecord> = values
                .into_iter()
                .enumerate()
                .map(|(i, v)| record(i as u8, i as u64 + 1, v))
                .collect();
            let body = encode_batch(&records).unwrap();
            prop_assert_eq!(decode_batch(Bytes::from(body), 1 << 20).unwrap(), records);
        }

        /// Any body, valid or not, cut into chunks anywhere, decodes to what the whole body
        /// decodes to: the same records, or the same error.
        #[test]
        fn chunked_decoding_matches_whole_decoding(
            values in prop::collection::vec(value(), 0..6),
            damage in prop::option::of((any::<prop::sample::Index>(), any::<u8>())),
            cut_short in 0usize..3,
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
            max in prop_oneof![Just(1usize << 20), 0usize..64],
        ) {
            let records: Vec<PutRecord> = values
                .into_iter()
                .enumerate()
                .map(|(i, v)| record(i as u8, i as u64 + 1, v))
                .collect();
            let mut body = encode_batch(&records).unwrap();
            if let Some((at, byte)) = damage.filter(|_| !body.is_empty()) {
                let at = at.index(body.len());
                body[at] = byte;
            }
            body.truncate(body.len().saturating_sub(cut_short));
            let body = Bytes::from(body);
            let whole = decode_batch(body.clone(), max);

            let mut at: Vec<usize> = cuts.iter().map(|i| i.index(body.len() + 1)).collect();
            at.push(0);
            at.push(body.len());
            at.sort_unstable();
            let mut decoder = BatchDecoder::new(max);
            let mut chunked = Ok(());
            for pair in at.windows(2) {
                chunked = decoder.feed(body.slice(pair[0]..pair[1]));
                if chunked.is_err() {
                    break;
                }
            }
            let chunked = chunked.and_then(|()| decoder.finish());
            prop_assert_eq!(chunked, whole);
        }

        #[test]
        fn arbitrary_bytes_never_panic(body in prop::collection::vec(any::<u8>(), 0..200), max in 0usize..100) {
            let _ = decode_batch(Bytes::from(body), max);
        }
    }
}
