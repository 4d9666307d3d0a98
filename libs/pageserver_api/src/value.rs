//! Values: the page versions the page server stores, and their byte format.
//!
//! For every key the page server keeps a history of versions, one per LSN
//! at which the page changed. A version is a [`Value`], which is either
//!
//! - an **image**: the whole page as it was at that LSN (normally
//!   [`ZERO_PAGE_SIZE`](crate::reconstruct::ZERO_PAGE_SIZE) = 8192 bytes,
//!   but any length is representable; callers cap it with a limit such as
//!   [`DEFAULT_MAX_VALUE_SIZE`]), or
//! - a **delta**: a list of [`Patch`]es, each "write these bytes at this
//!   offset", to be applied in order onto the previous version of the page.
//!   A delta with `will_init` set does not need a previous version: it is
//!   applied onto a page of 8192 zero bytes, so history older than it is
//!   never read; or
//! - a **WAL record**: a PostgreSQL WAL record, whole (its header included),
//!   that changed the page and that only PostgreSQL's redo can apply. The
//!   page server stores it so the page's history is complete, and answers a
//!   read that would need it with the nearest LSN where the page is
//!   materialized (see [`crate::reconstruct`]). `will_init` as for a delta:
//!   the record builds the page from nothing (`BKPBLOCK_WILL_INIT`).
//!
//! Turning a history into a page is [`crate::reconstruct`]'s job; this
//! module only defines the values and how they are written down.
//!
//! # Byte format
//!
//! This is how values are stored inside ephemeral files and delta layer
//! files, so it is a file format: changing it means changing every file
//! written before, and must come with a format version bump. The tests pin
//! it byte for byte. Integers are big-endian; there is no padding and no
//! alignment.
//!
//! ```text
//! Image (kind 0):
//!   +------+---------------------------------+
//!   | 0x00 | page bytes (the rest of buffer) |
//!   +------+---------------------------------+
//!     1 B    any length, including zero
//!
//! Delta (kind 1):
//!   +------+-----------+-------+---------+---------+---------+-----+
//!   | 0x01 | will_init | count | patch 0 | patch 1 |   ...   |     |
//!   +------+-----------+-------+---------+---------+---------+-----+
//!     1 B     1 B (0/1)  u16 BE   `count` patches, then nothing
//!
//! Patch:
//!   +------------+------------+------------------+
//!   | offset     | dlen       | data[dlen]       |
//!   +------------+------------+------------------+
//!     u32 BE       u32 BE       dlen bytes
//!
//! WAL record (kind 2):
//!   +------+-----------+------------------------------------------+
//!   | 0x02 | will_init | the record's bytes (the rest of buffer)  |
//!   +------+-----------+------------------------------------------+
//!     1 B     1 B (0/1)  at least one byte
//! ```
//!
//! | byte offset | size | field | meaning |
//! |---|---|---|---|
//! | 0 | 1 | `kind` | [`KIND_IMAGE`] (0), [`KIND_DELTA`] (1) or [`KIND_WAL_RECORD`] (2); anything else is rejected |
//! | 1 | rest | image bytes | (image) the page; the value ends where the buffer ends |
//! | 1 | 1 | `will_init` | (delta, WAL record) 0 = false, 1 = true; anything else is rejected |
//! | 2 | 2 | `count` | (delta) number of patches, 0 to [`MAX_PATCHES`] |
//! | 4 | 8 + dlen each | patches | (delta) `count` patches back to back |
//! | 2 | rest | record | (WAL record) the record; empty is rejected |
//!
//! Within a patch: `offset` (u32) is the page offset the data is written
//! at, `dlen` (u32) the number of data bytes that follow. The delta must end
//! exactly after its last patch: trailing bytes are rejected, so a value
//! cannot hide data that a reader would ignore.
//!
//! The leading kind byte followed by a kind-specific payload is the same
//! shape as a record of the HTTP ingest API, on purpose: an ingested record
//! and a stored value are one format.
//!
//! Every accepted buffer decodes to exactly one value and that value
//! encodes back to exactly the same bytes (the encoding is canonical).
//!
//! # Decoding untrusted bytes
//!
//! [`Value::deserialize`] and [`Value::deserialize_bytes`] treat their input
//! as untrusted (a file may be corrupt or truncated): every problem is a
//! [`ValueDecodeError`] naming what is wrong and the byte offset where it
//! is, never a panic. Decoding allocates no more than a small constant
//! times the input length, whatever the header claims.
//!
//! # Encoding limits
//!
//! The format cannot express more than [`MAX_PATCHES`] patches in a delta,
//! or a patch with more than [`MAX_PATCH_DATA_LEN`] data bytes. [`Value`]
//! has public fields, so such a value can be built; it is then refused by
//! [`Value::serialize_into`] with a [`ValueEncodeError`] rather than being
//! written in a form that would read back differently.

use std::fmt;
use std::mem::size_of;

use bytes::Bytes;

/// The `kind` byte of an image.
pub const KIND_IMAGE: u8 = 0;

/// The `kind` byte of a delta.
pub const KIND_DELTA: u8 = 1;

/// The `kind` byte of a WAL record.
pub const KIND_WAL_RECORD: u8 = 2;

/// The most patches one delta can hold: the largest value of its `count`
/// field.
pub const MAX_PATCHES: u16 = u16::MAX;

/// The most data bytes one patch can hold: the largest value of its `dlen`
/// field.
pub const MAX_PATCH_DATA_LEN: u32 = u32::MAX;

/// The default limit on the size of one value (1 MiB), used for the
/// largest accepted image and the largest page redo may produce, unless the
/// caller configures another.
pub const DEFAULT_MAX_VALUE_SIZE: usize = 1024 * 1024;

// Field sizes and positions of the byte format (see the module doc).
const KIND_LEN: usize = size_of::<u8>();
const WILL_INIT_LEN: usize = size_of::<u8>();
const COUNT_LEN: usize = size_of::<u16>();
const PATCH_OFFSET_LEN: usize = size_of::<u32>();
const PATCH_DLEN_LEN: usize = size_of::<u32>();

/// Bytes before an image's page bytes.
const IMAGE_HEADER_LEN: usize = KIND_LEN;
/// Bytes before a delta's first patch.
const DELTA_HEADER_LEN: usize = KIND_LEN + WILL_INIT_LEN + COUNT_LEN;
/// Bytes before a WAL record's bytes.
const WAL_RECORD_HEADER_LEN: usize = KIND_LEN + WILL_INIT_LEN;
/// Bytes before a patch's data.
const PATCH_HEADER_LEN: usize = PATCH_OFFSET_LEN + PATCH_DLEN_LEN;

// The layout the module doc promises.
const _: () = assert!(IMAGE_HEADER_LEN == 1);
const _: () = assert!(DELTA_HEADER_LEN == 4);
const _: () = assert!(PATCH_HEADER_LEN == 8);

/// `will_init` as stored.
const WILL_INIT_FALSE: u8 = 0;
const WILL_INIT_TRUE: u8 = 1;

/// One version of a page: a full image, a delta against the version before
/// it, or a PostgreSQL WAL record to be redone onto it.
///
/// See the [module documentation](self) for the meaning and the byte format.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// The whole page.
    Image(Bytes),
    /// Changes to the previous version of the page.
    Delta {
        /// If set, the previous version is taken to be 8192 zero bytes and
        /// nothing older is read.
        will_init: bool,
        /// Applied in order; a later patch overwrites an earlier one where
        /// they overlap. At most [`MAX_PATCHES`] for the value to be
        /// serializable.
        patches: Vec<Patch>,
    },
    /// A PostgreSQL WAL record that changed the page; only PostgreSQL's redo
    /// applies it.
    WalRecord {
        /// If set, the record builds the page from nothing: no older version
        /// is read.
        will_init: bool,
        /// The whole record, header included; never empty.
        record: Bytes,
    },
}

/// "Write `data` at byte `offset` of the page."
///
/// If `offset + data.len()` is past the end of the page, the page first
/// grows, with zero bytes, to end exactly there (see
/// [`apply_delta`](crate::reconstruct::apply_delta)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Patch {
    /// Where in the page the data goes.
    pub offset: u32,
    /// The bytes to write; at most [`MAX_PATCH_DATA_LEN`] for the patch to
    /// be serializable.
    pub data: Bytes,
}

impl Patch {
    /// A patch writing `data` at `offset`.
    pub fn new(offset: u32, data: impl Into<Bytes>) -> Patch {
        Patch {
            offset,
            data: data.into(),
        }
    }
}

/// A field of the byte format, named in [`ValueDecodeError::Truncated`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueField {
    /// The leading kind byte.
    Kind,
    /// A delta's `will_init` byte.
    WillInit,
    /// A delta's patch count.
    PatchCount,
    /// The 8-byte header (`offset` then `dlen`) of patch `index` (counted
    /// from zero).
    PatchHeader {
        /// Which patch.
        index: u16,
    },
    /// The data bytes of patch `index` (counted from zero).
    PatchData {
        /// Which patch.
        index: u16,
    },
}

impl fmt::Display for ValueField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ValueField::Kind => f.write_str("the kind byte"),
            ValueField::WillInit => f.write_str("the will_init byte"),
            ValueField::PatchCount => f.write_str("the patch count"),
            ValueField::PatchHeader { index } => write!(f, "the header of patch {index}"),
            ValueField::PatchData { index } => write!(f, "the data of patch {index}"),
        }
    }
}

/// Why bytes could not be decoded as a [`Value`]. Every variant carries the
/// byte offset, from the start of the buffer, where the problem is.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ValueDecodeError {
    /// The buffer ended inside a field.
    #[error(
        "value truncated at byte {offset}: {field} needs {needed} bytes but only {available} remain"
    )]
    Truncated {
        /// The field that did not fit.
        field: ValueField,
        /// Where that field starts.
        offset: usize,
        /// How many bytes the field needs.
        needed: usize,
        /// How many bytes were left from `offset` on.
        available: usize,
    },
    /// The kind byte is not [`KIND_IMAGE`], [`KIND_DELTA`] or [`KIND_WAL_RECORD`].
    #[error(
        "unknown value kind {kind} at byte {offset} (expected {KIND_IMAGE} for an image, {KIND_DELTA} for a delta or {KIND_WAL_RECORD} for a WAL record)"
    )]
    UnknownKind {
        /// The kind byte found.
        kind: u8,
        /// Where it is (always 0).
        offset: usize,
    },
    /// A delta's or WAL record's `will_init` byte is neither 0 nor 1.
    #[error("invalid will_init byte {found} at byte {offset} (expected 0 or 1)")]
    InvalidWillInit {
        /// The byte found.
        found: u8,
        /// Where it is (always 1).
        offset: usize,
    },
    /// A delta has bytes after its last patch.
    #[error(
        "{count} trailing bytes at byte {offset}, after the last of the delta's {patches} patches"
    )]
    TrailingBytes {
        /// Where the delta should have ended.
        offset: usize,
        /// How many bytes follow.
        count: usize,
        /// How many patches the delta declared (and had).
        patches: u16,
    },
    /// A WAL record value holds no record bytes.
    #[error("a WAL record value without a record at byte {offset}")]
    EmptyWalRecord {
        /// Where the record should have started (always 2).
        offset: usize,
    },
}

/// Why a [`Value`] could not be serialized: it does not fit the format.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ValueEncodeError {
    /// The delta has more patches than the `count` field can hold.
    #[error("a delta holds at most {MAX_PATCHES} patches, but this one has {count}")]
    TooManyPatches {
        /// How many patches the delta has.
        count: usize,
    },
    /// A patch has more data than its `dlen` field can hold.
    #[error("patch {index} has {len} data bytes, but a patch holds at most {MAX_PATCH_DATA_LEN}")]
    PatchTooLong {
        /// Which patch, counted from zero.
        index: usize,
        /// Its data length.
        len: usize,
    },
    /// A WAL record value with no record bytes.
    #[error("a WAL record value must hold the record's bytes")]
    EmptyWalRecord,
}

impl Value {
    /// True if this version does not depend on older ones: an image, or a
    /// delta with `will_init` set. Page reconstruction stops at the newest
    /// such value.
    pub fn will_init(&self) -> bool {
        match self {
            Value::Image(_) => true,
            Value::Delta { will_init, .. } | Value::WalRecord { will_init, .. } => *will_init,
        }
    }

    /// True for a WAL record: a version only PostgreSQL's redo applies.
    pub fn is_wal_record(&self) -> bool {
        matches!(self, Value::WalRecord { .. })
    }

    /// How many bytes [`Value::serialize_into`] appends for this value.
    ///
    /// Saturates at `usize::MAX` rather than overflowing; that can only
    /// happen for a value that cannot be serialized anyway.
    pub fn serialized_len(&self) -> usize {
        match self {
            Value::Image(page) => IMAGE_HEADER_LEN.saturating_add(page.len()),
            Value::Delta { patches, .. } => patches.iter().fold(DELTA_HEADER_LEN, |len, patch| {
                len.saturating_add(PATCH_HEADER_LEN)
                    .saturating_add(patch.data.len())
            }),
            Value::WalRecord { record, .. } => WAL_RECORD_HEADER_LEN.saturating_add(record.len()),
        }
    }

    /// Checks that [`Value::serialize_into`] would succeed, without
    /// serializing: lets a caller validate a whole batch before storing any
    /// of it.
    pub fn check_encodable(&self) -> Result<(), ValueEncodeError> {
        match self {
            Value::Delta { patches, .. } => {
                encodable_count(patches.len())?;
                for (index, patch) in patches.iter().enumerate() {
                    encodable_data_len(index, patch.data.len())?;
                }
            }
            Value::WalRecord { record, .. } if record.is_empty() => {
                return Err(ValueEncodeError::EmptyWalRecord)
            }
            _ => {}
        }
        Ok(())
    }

    /// Appends the byte format of this value (see the module doc) to `out`,
    /// after whatever `out` already holds.
    ///
    /// Fails, leaving `out` unchanged, if a delta has more than
    /// [`MAX_PATCHES`] patches or a patch more than [`MAX_PATCH_DATA_LEN`]
    /// data bytes.
    pub fn serialize_into(&self, out: &mut Vec<u8>) -> Result<(), ValueEncodeError> {
        match self {
            Value::Image(page) => {
                out.reserve(self.serialized_len());
                out.push(KIND_IMAGE);
                out.extend_from_slice(page);
            }
            Value::Delta { will_init, patches } => {
                // Check everything before writing anything, so a failure
                // leaves `out` as it was.
                let count = encodable_count(patches.len())?;
                let dlens = patches
                    .iter()
                    .enumerate()
                    .map(|(index, patch)| encodable_data_len(index, patch.data.len()))
                    .collect::<Result<Vec<u32>, _>>()?;

                out.reserve(self.serialized_len());
                out.push(KIND_DELTA);
                out.push(will_init_byte(*will_init));
                out.extend_from_slice(&count.to_be_bytes());
                for (patch, dlen) in patches.iter().zip(dlens) {
                    out.extend_from_slice(&patch.offset.to_be_bytes());
                    out.extend_from_slice(&dlen.to_be_bytes());
                    out.extend_from_slice(&patch.data);
                }
            }
            Value::WalRecord { will_init, record } => {
                if record.is_empty() {
                    return Err(ValueEncodeError::EmptyWalRecord);
                }
                out.reserve(self.serialized_len());
                out.push(KIND_WAL_RECORD);
                out.push(will_init_byte(*will_init));
                out.extend_from_slice(record);
            }
        }
        Ok(())
    }

    /// The byte format of this value in a new buffer; see
    /// [`Value::serialize_into`].
    pub fn serialize(&self) -> Result<Vec<u8>, ValueEncodeError> {
        let mut out = Vec::new();
        self.serialize_into(&mut out)?;
        Ok(out)
    }

    /// Decodes a whole buffer holding exactly one value.
    ///
    /// The payloads of the result share one copy of `buf`. Use
    /// [`Value::deserialize_bytes`] to avoid even that copy when the bytes
    /// are already in a [`Bytes`].
    pub fn deserialize(buf: &[u8]) -> Result<Value, ValueDecodeError> {
        // Validate before copying, so that rejected input costs no copy.
        let layout = parse(buf)?;
        Ok(layout.build(&Bytes::copy_from_slice(buf)))
    }

    /// Checks that `buf` holds exactly one value in the byte format, as
    /// [`Value::deserialize`] does, without building it; and says whether
    /// it will init ([`Value::will_init`]). What a copy of a value's bytes
    /// as they are needs to know.
    pub fn check_serialized(buf: &[u8]) -> Result<bool, ValueDecodeError> {
        Ok(match parse(buf)? {
            Layout::Image { .. } => true,
            Layout::Delta { will_init, .. } | Layout::WalRecord { will_init, .. } => will_init,
        })
    }

    /// Like [`Value::deserialize`], but the payloads of the result are
    /// slices of `buf` (no bytes are copied). They keep `buf`'s memory
    /// alive for as long as they live.
    pub fn deserialize_bytes(buf: Bytes) -> Result<Value, ValueDecodeError> {
        let layout = parse(&buf)?;
        Ok(layout.build(&buf))
    }
}

// The limits are exactly what the fields can hold, so a conversion to the
// field's type is the whole check.
const _: () = assert!(MAX_PATCHES == u16::MAX);
const _: () = assert!(MAX_PATCH_DATA_LEN == u32::MAX);

/// `will_init` as stored.
fn will_init_byte(will_init: bool) -> u8 {
    if will_init {
        WILL_INIT_TRUE
    } else {
        WILL_INIT_FALSE
    }
}

/// `len` as the `count` field, or why it does not fit.
fn encodable_count(len: usize) -> Result<u16, ValueEncodeError> {
    u16::try_from(len).map_err(|_| ValueEncodeError::TooManyPatches { count: len })
}

/// `len` as the `dlen` field of patch `index`, or why it does not fit.
fn encodable_data_len(index: usize, len: usize) -> Result<u32, ValueEncodeError> {
    u32::try_from(len).map_err(|_| ValueEncodeError::PatchTooLong { index, len })
}

/// Where the parts of a validated value lie in its buffer.
enum Layout {
    Image {
        page: std::ops::Range<usize>,
    },
    Delta {
        will_init: bool,
        patches: Vec<(u32, std::ops::Range<usize>)>,
    },
    WalRecord {
        will_init: bool,
        record: std::ops::Range<usize>,
    },
}

impl Layout {
    /// The value, with payloads sliced out of `buf`, the buffer this
    /// layout was parsed from (so every range lies inside it).
    fn build(self, buf: &Bytes) -> Value {
        match self {
            Layout::Image { page } => Value::Image(buf.slice(page)),
            Layout::Delta { will_init, patches } => Value::Delta {
                will_init,
                patches: patches
                    .into_iter()
                    .map(|(offset, data)| Patch {
                        offset,
                        data: buf.slice(data),
                    })
                    .collect(),
            },
            Layout::WalRecord { will_init, record } => Value::WalRecord {
                will_init,
                record: buf.slice(record),
            },
        }
    }
}

/// Checks `buf` against the byte format and says where each part is.
fn parse(buf: &[u8]) -> Result<Layout, ValueDecodeError> {
    let mut reader = Reader { buf, pos: 0 };

    let kind_offset = reader.pos;
    let [kind] = reader.array(ValueField::Kind)?;
    match kind {
        KIND_IMAGE => Ok(Layout::Image {
            page: reader.rest(),
        }),
        KIND_WAL_RECORD => {
            let will_init = reader.will_init()?;
            let record = reader.rest();
            if record.is_empty() {
                return Err(ValueDecodeError::EmptyWalRecord {
                    offset: record.start,
                });
            }
            Ok(Layout::WalRecord { will_init, record })
        }
        KIND_DELTA => {
            let will_init = reader.will_init()?;
            let count = u16::from_be_bytes(reader.array(ValueField::PatchCount)?);

            // `count` is untrusted: reserve no more entries than the
            // remaining bytes could possibly hold.
            let room = reader.remaining() / PATCH_HEADER_LEN;
            let mut patches = Vec::with_capacity(usize::from(count).min(room));
            for index in 0..count {
                let header: [u8; PATCH_HEADER_LEN] =
                    reader.array(ValueField::PatchHeader { index })?;
                let (offset, dlen) = split_patch_header(header);
                // A length that does not fit in usize cannot fit in the
                // buffer either; saturating makes `take` report it as
                // truncation.
                let dlen = usize::try_from(dlen).unwrap_or(usize::MAX);
                let data = reader.take(dlen, ValueField::PatchData { index })?;
                patches.push((offset, data));
            }

            if reader.remaining() != 0 {
                return Err(ValueDecodeError::TrailingBytes {
                    offset: reader.pos,
                    count: reader.remaining(),
                    patches: count,
                });
            }
            Ok(Layout::Delta { will_init, patches })
        }
        _ => Err(ValueDecodeError::UnknownKind {
            kind,
            offset: kind_offset,
        }),
    }
}

/// The `offset` and `dlen` fields of a patch header.
fn split_patch_header(header: [u8; PATCH_HEADER_LEN]) -> (u32, u32) {
    let [o0, o1, o2, o3, d0, d1, d2, d3] = header;
    (
        u32::from_be_bytes([o0, o1, o2, o3]),
        u32::from_be_bytes([d0, d1, d2, d3]),
    )
}

/// A position in a buffer being decoded. Invariant: `pos <= buf.len()`.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    /// Bytes left after `pos`.
    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    /// The next `len` bytes' range, for `field`; moves past them.
    fn take(
        &mut self,
        len: usize,
        field: ValueField,
    ) -> Result<std::ops::Range<usize>, ValueDecodeError> {
        let available = self.remaining();
        if len > available {
            return Err(ValueDecodeError::Truncated {
                field,
                offset: self.pos,
                needed: len,
                available,
            });
        }
        // `len <= remaining`, so this stays within the buffer.
        let start = self.pos;
        self.pos = start + len;
        Ok(start..self.pos)
    }

    /// The next `N` bytes, for `field`; moves past them.
    fn array<const N: usize>(&mut self, field: ValueField) -> Result<[u8; N], ValueDecodeError> {
        let range = self.take(N, field)?;
        let mut out = [0u8; N];
        // `take` returned an in-bounds range of exactly N bytes.
        out.copy_from_slice(&self.buf[range]);
        Ok(out)
    }

    /// A `will_init` byte; moves past it.
    fn will_init(&mut self) -> Result<bool, ValueDecodeError> {
        let offset = self.pos;
        match self.array(ValueField::WillInit)? {
            [WILL_INIT_FALSE] => Ok(false),
            [WILL_INIT_TRUE] => Ok(true),
            [found] => Err(ValueDecodeError::InvalidWillInit { found, offset }),
        }
    }

    /// Everything after `pos`; moves to the end.
    fn rest(&mut self) -> std::ops::Range<usize> {
        let start = self.pos;
        self.pos = self.buf.len();
        start..self.pos
    }
}

#[cfg(test)]
mod tests;
