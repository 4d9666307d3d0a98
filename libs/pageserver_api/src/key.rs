//! Keys: the addresses of everything the page server stores.
//!
//! Every page and every piece of metadata has an 18-byte key. Storage
//! (layer files, indexes, range scans) sorts and compares keys as raw bytes,
//! so the in-memory order must be the byte order of the serialized form.
//! That holds because the fields are serialized big-endian, in declaration
//! order, each at its full width, and `Ord` is derived in that same order.
//! It also means every 18-byte string is a valid key, so the key space is
//! dense: [`Key::next`] is "add one" and nothing sorts between a key and
//! its successor.
//!
//! The text form (file names, logs) is the 36 lower-case hex characters of
//! the serialized bytes, which keeps the same order when compared as strings.

use std::fmt;
use std::mem::size_of;
use std::str::FromStr;

use utils::quote::bounded;

/// Bytes in a serialized key.
pub const KEY_SIZE: usize = 18;

/// Characters in a key's text form (two hex digits per byte).
pub const KEY_HEX_LEN: usize = KEY_SIZE * 2;

// Where each field sits in the serialized form. Each starts where the one
// before it ends, so there are no gaps and no padding.
const FIELD1_OFFSET: usize = 0;
const FIELD2_OFFSET: usize = FIELD1_OFFSET + size_of::<u8>();
const FIELD3_OFFSET: usize = FIELD2_OFFSET + size_of::<u32>();
const FIELD4_OFFSET: usize = FIELD3_OFFSET + size_of::<u32>();
const FIELD5_OFFSET: usize = FIELD4_OFFSET + size_of::<u32>();
const FIELD6_OFFSET: usize = FIELD5_OFFSET + size_of::<u8>();
const FIELDS_END: usize = FIELD6_OFFSET + size_of::<u32>();

// The fields fill the serialized form exactly.
const _: () = assert!(FIELDS_END == KEY_SIZE);

/// The address of one page or piece of metadata.
///
/// For relation data (see [`Key::rel_block`]) the fields are: `field1`
/// the kind of key (0 for relation blocks), `field2` the tablespace,
/// `field3` the database, `field4` the relation, `field5` the fork number
/// and `field6` the block number.
///
/// Field order matters: the derived `Ord` compares fields in declaration
/// order, which is what makes it agree with the byte order of
/// [`Key::to_bytes`].
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct Key {
    pub field1: u8,
    pub field2: u32,
    pub field3: u32,
    pub field4: u32,
    pub field5: u8,
    pub field6: u32,
}

/// Why bytes or text could not be turned into a [`Key`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// [`Key::from_slice`] was given the wrong number of bytes.
    #[error("a serialized key is {KEY_SIZE} bytes, but got {len} bytes")]
    WrongByteLength {
        /// How many bytes there were.
        len: usize,
    },
    /// The text form is not exactly [`KEY_HEX_LEN`] characters long.
    #[error(
        "invalid key {input:?}: expected {KEY_HEX_LEN} hex characters, found {len} characters"
    )]
    WrongTextLength {
        /// A bounded prefix of the rejected text.
        input: String,
        /// How many characters (not bytes) the text had.
        len: usize,
    },
    /// The text form has a character that is not a hex digit.
    #[error("invalid key {input:?}: character {ch:?} at position {position} is not a hex digit")]
    NotHex {
        /// A bounded prefix of the rejected text.
        input: String,
        /// The first offending character.
        ch: char,
        /// Its index, counted in characters from zero.
        position: usize,
    },
}

impl Key {
    /// The smallest key: every field zero.
    pub const MIN: Key = Key {
        field1: 0,
        field2: 0,
        field3: 0,
        field4: 0,
        field5: 0,
        field6: 0,
    };

    /// The largest key: every field at its maximum.
    pub const MAX: Key = Key {
        field1: u8::MAX,
        field2: u32::MAX,
        field3: u32::MAX,
        field4: u32::MAX,
        field5: u8::MAX,
        field6: u32::MAX,
    };

    /// The key of block `blknum` of fork `forknum` of the Postgres relation
    /// identified by tablespace, database and relation oids.
    pub const fn rel_block(
        spcnode: u32,
        dbnode: u32,
        relnode: u32,
        forknum: u8,
        blknum: u32,
    ) -> Key {
        Key {
            field1: 0,
            field2: spcnode,
            field3: dbnode,
            field4: relnode,
            field5: forknum,
            field6: blknum,
        }
    }

    /// The serialized form: each field big-endian, in declaration order.
    pub fn to_bytes(&self) -> [u8; KEY_SIZE] {
        let mut out = [0u8; KEY_SIZE];
        out[FIELD1_OFFSET] = self.field1;
        out[FIELD2_OFFSET..FIELD3_OFFSET].copy_from_slice(&self.field2.to_be_bytes());
        out[FIELD3_OFFSET..FIELD4_OFFSET].copy_from_slice(&self.field3.to_be_bytes());
        out[FIELD4_OFFSET..FIELD5_OFFSET].copy_from_slice(&self.field4.to_be_bytes());
        out[FIELD5_OFFSET] = self.field5;
        out[FIELD6_OFFSET..FIELDS_END].copy_from_slice(&self.field6.to_be_bytes());
        out
    }

    /// The key whose serialized form is `bytes`. Every byte string of the
    /// right length is a key, so this cannot fail.
    pub fn from_bytes(bytes: [u8; KEY_SIZE]) -> Key {
        Key {
            field1: bytes[FIELD1_OFFSET],
            field2: read_u32_be(&bytes, FIELD2_OFFSET),
            field3: read_u32_be(&bytes, FIELD3_OFFSET),
            field4: read_u32_be(&bytes, FIELD4_OFFSET),
            field5: bytes[FIELD5_OFFSET],
            field6: read_u32_be(&bytes, FIELD6_OFFSET),
        }
    }

    /// The key serialized in `bytes`, which must be exactly [`KEY_SIZE`]
    /// bytes long.
    pub fn from_slice(bytes: &[u8]) -> Result<Key, KeyError> {
        <[u8; KEY_SIZE]>::try_from(bytes)
            .map(Key::from_bytes)
            .map_err(|_| KeyError::WrongByteLength { len: bytes.len() })
    }

    /// The smallest key greater than this one, or [`Key::MAX`] for
    /// [`Key::MAX`] itself.
    ///
    /// This adds one to the last field; a field that wraps round to zero
    /// carries one into the field before it, as in adding one to a number
    /// written in mixed-radix digits.
    pub fn next(&self) -> Key {
        let mut key = *self;
        let mut carry;
        (key.field6, carry) = key.field6.overflowing_add(1);
        if carry {
            (key.field5, carry) = key.field5.overflowing_add(1);
        }
        if carry {
            (key.field4, carry) = key.field4.overflowing_add(1);
        }
        if carry {
            (key.field3, carry) = key.field3.overflowing_add(1);
        }
        if carry {
            (key.field2, carry) = key.field2.overflowing_add(1);
        }
        if carry {
            (key.field1, carry) = key.field1.overflowing_add(1);
        }
        if carry {
            // Every field wrapped, so `self` was the largest key.
            Key::MAX
        } else {
            key
        }
    }
}

/// The big-endian `u32` at `at`; every caller passes a field offset that
/// the layout constants place wholly inside the array.
fn read_u32_be(bytes: &[u8; KEY_SIZE], at: usize) -> u32 {
    u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buf = [0u8; KEY_HEX_LEN];
        hex::encode_to_slice(self.to_bytes(), &mut buf).map_err(|_| fmt::Error)?;
        // Hex output is always ASCII, so this conversion cannot fail.
        f.write_str(std::str::from_utf8(&buf).map_err(|_| fmt::Error)?)
    }
}

impl FromStr for Key {
    type Err = KeyError;

    /// Parses the 36 hex characters printed by `Display`; upper case is
    /// accepted too.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let len = s.chars().count();
        let wrong_length = || KeyError::WrongTextLength {
            input: bounded(s),
            len,
        };
        if len != KEY_HEX_LEN {
            return Err(wrong_length());
        }
        let mut chars = s.chars().enumerate();
        let mut bytes = [0u8; KEY_SIZE];
        for byte in &mut bytes {
            let mut value = 0u8;
            for _ in 0..2 {
                // The length check above means `next()` always has a character.
                let (position, ch) = chars.next().ok_or_else(wrong_length)?;
                let nibble = utils::hex::digit(ch).ok_or_else(|| KeyError::NotHex {
                    input: bounded(s),
                    ch,
                    position,
                })?;
                value = (value << 4) | nibble;
            }
            *byte = value;
        }
        Ok(Key::from_bytes(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_key() -> impl Strategy<Value = Key> {
        any::<[u8; KEY_SIZE]>().prop_map(Key::from_bytes)
    }

    /// Keys whose fields are often at or next to their limits, so that
    /// carries in `next()` are exercised, not just the last field.
    fn edgy_key() -> impl Strategy<Value = Key> {
        fn edgy_u32() -> impl Strategy<Value = u32> {
            prop_oneof![Just(0), Just(u32::MAX), Just(u32::MAX - 1), any::<u32>()]
        }
        fn edgy_u8() -> impl Strategy<Value = u8> {
            prop_oneof![Just(0), Just(u8::MAX), Just(u8::MAX - 1), any::<u8>()]
        }
        (
            edgy_u8(),
            edgy_u32(),
            edgy_u32(),
            edgy_u32(),
            edgy_u8(),
            edgy_u32(),
        )
            .prop_map(|(field1, field2, field3, field4, field5, field6)| Key {
                field1,
                field2,
                field3,
                field4,
                field5,
                field6,
            })
    }

    /// Adds one to the bytes as one big-endian number: an oracle for
    /// `next()` that shares no code with it. `None` on overflow.
    fn increment_bytes(mut bytes: [u8; KEY_SIZE]) -> Option<[u8; KEY_SIZE]> {
        for b in bytes.iter_mut().rev() {
            let (v, overflow) = b.overflowing_add(1);
            *b = v;
            if !overflow {
                return Some(bytes);
            }
        }
        None
    }

    #[test]
    fn layout_is_big_endian_in_field_order() {
        let key = Key {
            field1: 0x01,
            field2: 0x0203_0405,
            field3: 0x0607_0809,
            field4: 0x0a0b_0c0d,
            field5: 0x0e,
            field6: 0x0f10_1112,
        };
        let bytes = key.to_bytes();
        assert_eq!(
            bytes,
            [
                0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e,
                0x0f, 0x10, 0x11, 0x12
            ]
        );
        assert_eq!(key.to_string(), "0102030405060708090a0b0c0d0e0f101112");
        assert_eq!(Key::from_bytes(bytes), key);
    }

    #[test]
    fn min_and_max() {
        assert_eq!(Key::MIN.to_bytes(), [0u8; KEY_SIZE]);
        assert_eq!(Key::MAX.to_bytes(), [0xffu8; KEY_SIZE]);
        assert_eq!(Key::MIN, Key::default());
        assert_eq!(Key::MIN.to_string(), "0".repeat(KEY_HEX_LEN));
        assert_eq!(Key::MAX.to_string(), "f".repeat(KEY_HEX_LEN));
        assert!(Key::MIN < Key::MAX);
    }

    #[test]
    fn rel_block_fills_fields() {
        let key = Key::rel_block(1663, 5, 16384, 0, 42);
        assert_eq!(
            key,
            Key {
                field1: 0,
                field2: 1663,
                field3: 5,
                field4: 16384,
                field5: 0,
                field6: 42,
            }
        );
        // Blocks of one relation fork are adjacent and in block order.
        assert_eq!(key.next(), Key::rel_block(1663, 5, 16384, 0, 43));
    }

    #[test]
    fn next_carries_across_fields() {
        assert_eq!(
            Key::MIN.next(),
            Key {
                field6: 1,
                ..Key::MIN
            }
        );
        // field6 wraps and carries into field5.
        let key = Key {
            field5: 3,
            field6: u32::MAX,
            ..Key::MIN
        };
        assert_eq!(
            key.next(),
            Key {
                field5: 4,
                field6: 0,
                ..Key::MIN
            }
        );
        // field6 and field5 wrap and carry into field4.
        let key = Key {
            field4: 7,
            field5: u8::MAX,
            field6: u32::MAX,
            ..Key::MIN
        };
        assert_eq!(
            key.next(),
            Key {
                field4: 8,
                ..Key::MIN
            }
        );
        // Everything after field1 wraps.
        let key = Key {
            field1: 0,
            ..Key::MAX
        };
        assert_eq!(
            key.next(),
            Key {
                field1: 1,
                ..Key::MIN
            }
        );
        // MAX saturates.
        assert_eq!(Key::MAX.next(), Key::MAX);
    }

    #[test]
    fn from_slice_rejects_wrong_lengths() {
        for len in [0, 1, KEY_SIZE - 1, KEY_SIZE + 1, 100] {
            let bytes = vec![0u8; len];
            assert_eq!(
                Key::from_slice(&bytes),
                Err(KeyError::WrongByteLength { len })
            );
        }
        assert_eq!(Key::from_slice(&[0u8; KEY_SIZE]), Ok(Key::MIN));
        let msg = Key::from_slice(&[1, 2, 3]).unwrap_err().to_string();
        assert!(msg.contains("18 bytes") && msg.contains("got 3"), "{msg}");
    }

    #[test]
    fn parses_upper_case() {
        let key = Key::rel_block(0xABCD, 1, 2, 3, 0xDEAD_BEEF);
        assert_eq!(key.to_string().to_uppercase().parse::<Key>(), Ok(key));
    }

    #[test]
    fn rejects_malformed_text() {
        let good = Key::rel_block(1, 2, 3, 4, 5).to_string();

        for (input, len) in [
            (String::new(), 0),
            (good[1..].to_owned(), KEY_HEX_LEN - 1),
            (format!("{good}0"), KEY_HEX_LEN + 1),
            // Counted in characters: 36 bytes of two-byte characters.
            ("é".repeat(18), 18),
        ] {
            let err = input.parse::<Key>().unwrap_err();
            assert_eq!(
                err,
                KeyError::WrongTextLength {
                    input: input.clone(),
                    len
                }
            );
            let msg = err.to_string();
            assert!(msg.contains(&format!("{input:?}")), "{msg}");
            assert!(msg.contains(&format!("found {len} characters")), "{msg}");
        }

        let mut bad = good.clone();
        bad.replace_range(7..8, "x");
        let err = bad.parse::<Key>().unwrap_err();
        assert_eq!(
            err,
            KeyError::NotHex {
                input: bad.clone(),
                ch: 'x',
                position: 7
            }
        );
        assert!(err.to_string().contains("not a hex digit"), "{err}");

        let bad = format!("{}é", &good[..KEY_HEX_LEN - 1]);
        assert!(matches!(
            bad.parse::<Key>(),
            Err(KeyError::NotHex {
                ch: 'é',
                position: 35,
                ..
            })
        ));
        let bad = format!("+{}", &good[1..]);
        assert!(matches!(
            bad.parse::<Key>(),
            Err(KeyError::NotHex { ch: '+', .. })
        ));
    }

    #[test]
    fn error_quotes_only_a_prefix_of_long_input() {
        let long = "z".repeat(100_000);
        let err = long.parse::<Key>().unwrap_err();
        assert!(err.to_string().len() < 300, "{err}");
    }

    proptest! {
        #[test]
        fn bytes_round_trip(bytes in any::<[u8; KEY_SIZE]>()) {
            let key = Key::from_bytes(bytes);
            prop_assert_eq!(key.to_bytes(), bytes);
            prop_assert_eq!(Key::from_slice(&bytes), Ok(key));
        }

        #[test]
        fn key_round_trips_through_bytes(key in edgy_key()) {
            prop_assert_eq!(Key::from_bytes(key.to_bytes()), key);
        }

        #[test]
        fn text_round_trips(key in any_key()) {
            let text = key.to_string();
            prop_assert_eq!(text.len(), KEY_HEX_LEN);
            prop_assert_eq!(text.parse::<Key>(), Ok(key));
        }

        #[test]
        fn order_is_byte_order(a in any_key(), b in any_key()) {
            prop_assert_eq!(a.cmp(&b), a.to_bytes().cmp(&b.to_bytes()));
            prop_assert_eq!(a.cmp(&b), a.to_string().cmp(&b.to_string()));
        }

        #[test]
        fn order_is_byte_order_near_limits(a in edgy_key(), b in edgy_key()) {
            prop_assert_eq!(a.cmp(&b), a.to_bytes().cmp(&b.to_bytes()));
        }

        #[test]
        fn next_is_byte_increment(key in prop_oneof![any_key(), edgy_key()]) {
            let next = key.next();
            match increment_bytes(key.to_bytes()) {
                Some(bytes) => {
                    prop_assert!(next > key);
                    prop_assert_eq!(next.to_bytes(), bytes);
                }
                None => {
                    prop_assert_eq!(key, Key::MAX);
                    prop_assert_eq!(next, Key::MAX);
                }
            }
        }

        #[test]
        fn nothing_lies_between_key_and_next(
            key in prop_oneof![any_key(), edgy_key()],
            other in prop_oneof![any_key(), edgy_key()],
        ) {
            // `next_is_byte_increment` together with `order_is_byte_order`
            // already implies this; here it is checked directly, with
            // near-limit keys making a close `other` likely.
            let next = key.next();
            prop_assert!(!(key < other && other < next));
        }

        #[test]
        fn arbitrary_strings_never_panic(s in ".*") {
            let _ = s.parse::<Key>();
        }

        #[test]
        fn near_miss_strings_never_panic(s in "[0-9a-fA-Fx+ é]{34,38}") {
            let _ = s.parse::<Key>();
        }

        #[test]
        fn arbitrary_byte_slices_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            match Key::from_slice(&bytes) {
                Ok(key) => prop_assert_eq!(&key.to_bytes()[..], &bytes[..]),
                Err(e) => prop_assert_eq!(e, KeyError::WrongByteLength { len: bytes.len() }),
            }
        }
    }
}
