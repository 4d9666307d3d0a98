//! Tenant and timeline ids.
//!
//! Both are 16 random bytes: enough that independently generated ids never
//! collide in practice, so no central allocator is needed. They appear in
//! file and directory names, URLs and logs, so the one text form is 32
//! lower-case hex characters, which sorts the same way the bytes do and
//! needs no escaping anywhere. Parsing also takes upper-case hex, but
//! printing always gives lower case, so printed ids compare as strings.
//!
//! The two types are kept distinct so a tenant id can never be passed where
//! a timeline id is wanted; their code is shared through `define_id!`.

use std::fmt;
use std::str::FromStr;

use crate::quote;

/// Bytes in an id.
pub const ID_LEN: usize = 16;

/// Characters in an id's text form (two hex digits per byte).
pub const ID_HEX_LEN: usize = ID_LEN * 2;

/// What was wrong with a string that did not parse as an id.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IdParseErrorKind {
    /// The string is not exactly [`ID_HEX_LEN`] characters long.
    #[error("expected {ID_HEX_LEN} hex characters, found {len} characters")]
    WrongLength {
        /// How many characters (not bytes) the input had.
        len: usize,
    },
    /// The string has a character that is not a hex digit.
    #[error("character {ch:?} at position {position} is not a hex digit")]
    NotHex {
        /// The first offending character.
        ch: char,
        /// Its index, counted in characters from zero.
        position: usize,
    },
}

/// A string that is not a tenant or timeline id; the message names the id
/// type, quotes (a bounded prefix of) the input and says what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {input:?}: {kind}")]
pub struct IdParseError {
    what: &'static str,
    input: String,
    kind: IdParseErrorKind,
}

impl IdParseError {
    /// What was wrong with the input.
    pub fn kind(&self) -> &IdParseErrorKind {
        &self.kind
    }

    /// The rejected input, cut short if it was long.
    pub fn input(&self) -> &str {
        &self.input
    }
}

/// Parses the text form shared by every id type.
fn parse_id(s: &str, what: &'static str) -> Result<[u8; ID_LEN], IdParseError> {
    decode_hex(s).map_err(|kind| IdParseError {
        what,
        input: quote::bounded(s),
        kind,
    })
}

fn decode_hex(s: &str) -> Result<[u8; ID_LEN], IdParseErrorKind> {
    let len = s.chars().count();
    if len != ID_HEX_LEN {
        return Err(IdParseErrorKind::WrongLength { len });
    }
    let mut chars = s.chars().enumerate();
    let mut out = [0u8; ID_LEN];
    for byte in &mut out {
        let mut value = 0u8;
        for _ in 0..2 {
            // The length check above means `next()` always has a character.
            let (position, ch) = chars.next().ok_or(IdParseErrorKind::WrongLength { len })?;
            let nibble = crate::hex::digit(ch).ok_or(IdParseErrorKind::NotHex { ch, position })?;
            value = (value << 4) | nibble;
        }
        *byte = value;
    }
    Ok(out)
}

/// Writes the text form shared by every id type.
fn fmt_id(bytes: &[u8; ID_LEN], f: &mut fmt::Formatter<'_>) -> fmt::Result {
    let mut buf = [0u8; ID_HEX_LEN];
    hex::encode_to_slice(bytes, &mut buf).map_err(|_| fmt::Error)?;
    // Hex output is always ASCII, so this conversion cannot fail.
    f.write_str(std::str::from_utf8(&buf).map_err(|_| fmt::Error)?)
}

/// Fresh random bytes for a new id.
fn random_bytes() -> [u8; ID_LEN] {
    let mut bytes = [0u8; ID_LEN];
    // This is the one place an id panics. `fill` fails only when the OS has
    // no usable entropy source at all; ids made without randomness would
    // collide, and no caller could recover by trying something else.
    if let Err(e) = getrandom::fill(&mut bytes) {
        panic!("cannot generate an id: no operating system randomness: {e}");
    }
    bytes
}

/// Defines one id type; every id type has the same representation, text
/// form and API, and differs only in name.
macro_rules! define_id {
    ($(#[$meta:meta])* $name:ident, $what:literal) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name([u8; ID_LEN]);

        impl $name {
            #[doc = concat!("A new random ", $what, ".")]
            ///
            /// # Panics
            ///
            /// Only if the operating system cannot supply random bytes.
            pub fn generate() -> Self {
                Self(random_bytes())
            }

            #[doc = concat!("The ", $what, " with these bytes.")]
            pub const fn from_bytes(bytes: [u8; ID_LEN]) -> Self {
                Self(bytes)
            }

            /// The raw bytes, in the order they print.
            pub const fn as_bytes(&self) -> &[u8; ID_LEN] {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt_id(&self.0, f)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt_id(&self.0, f)
            }
        }

        impl FromStr for $name {
            type Err = IdParseError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                parse_id(s, $what).map(Self)
            }
        }
    };
}

define_id!(
    /// Identifies a tenant: one customer's set of timelines.
    TenantId,
    "tenant id"
);

define_id!(
    /// Identifies a timeline: one branch of a tenant's WAL history.
    TimelineId,
    "timeline id"
);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SAMPLE: &str = "0123456789abcdef0011223344556677";
    const SAMPLE_BYTES: [u8; ID_LEN] = [
        0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66,
        0x77,
    ];

    #[test]
    fn prints_lowercase_hex_in_display_and_debug() {
        let t = TenantId::from_bytes(SAMPLE_BYTES);
        assert_eq!(t.to_string(), SAMPLE);
        assert_eq!(format!("{t:?}"), SAMPLE);
        let tl = TimelineId::from_bytes(SAMPLE_BYTES);
        assert_eq!(tl.to_string(), SAMPLE);
        assert_eq!(format!("{tl:?}"), SAMPLE);
    }

    #[test]
    fn parses_both_cases() {
        assert_eq!(
            SAMPLE.parse::<TenantId>(),
            Ok(TenantId::from_bytes(SAMPLE_BYTES))
        );
        assert_eq!(
            SAMPLE.to_uppercase().parse::<TimelineId>(),
            Ok(TimelineId::from_bytes(SAMPLE_BYTES))
        );
        assert_eq!(TenantId::from_bytes(SAMPLE_BYTES).as_bytes(), &SAMPLE_BYTES);
    }

    #[test]
    fn rejects_wrong_length() {
        let too_long = "0".repeat(33);
        for (input, len) in [("", 0), ("abc", 3), (&SAMPLE[1..], 31), (&too_long, 33)] {
            let err = input.parse::<TenantId>().unwrap_err();
            assert_eq!(
                err.kind(),
                &IdParseErrorKind::WrongLength { len },
                "{input:?}"
            );
        }
        // Length is counted in characters: 32 bytes of two-byte characters
        // is 16 characters.
        let err = "é".repeat(16).parse::<TimelineId>().unwrap_err();
        assert_eq!(err.kind(), &IdParseErrorKind::WrongLength { len: 16 });
    }

    #[test]
    fn rejects_non_hex() {
        let mut s = SAMPLE.to_owned();
        s.replace_range(5..6, "g");
        let err = s.parse::<TimelineId>().unwrap_err();
        assert_eq!(
            err.kind(),
            &IdParseErrorKind::NotHex {
                ch: 'g',
                position: 5
            }
        );
        let s = format!("{}é", &SAMPLE[..31]);
        let err = s.parse::<TenantId>().unwrap_err();
        assert_eq!(
            err.kind(),
            &IdParseErrorKind::NotHex {
                ch: 'é',
                position: 31
            }
        );
        let s = format!("+{}", &SAMPLE[1..]);
        assert!(s.parse::<TenantId>().is_err());
    }

    #[test]
    fn error_message_names_type_quotes_input_and_says_what_is_wrong() {
        let msg = "xyz".parse::<TenantId>().unwrap_err().to_string();
        assert!(msg.contains("tenant id"), "{msg}");
        assert!(msg.contains("\"xyz\""), "{msg}");
        assert!(msg.contains("found 3 characters"), "{msg}");

        let bad = format!("{}z", &SAMPLE[..31]);
        let msg = bad.parse::<TimelineId>().unwrap_err().to_string();
        assert!(msg.contains("timeline id"), "{msg}");
        assert!(msg.contains(&bad), "{msg}");
        assert!(msg.contains("not a hex digit"), "{msg}");
    }

    #[test]
    fn error_quotes_only_a_prefix_of_long_input() {
        let long = "a".repeat(100_000);
        let err = long.parse::<TenantId>().unwrap_err();
        assert_eq!(err.kind(), &IdParseErrorKind::WrongLength { len: 100_000 });
        assert!(err.to_string().len() < 300);
    }

    #[test]
    fn generated_ids_differ_and_round_trip() {
        let a = TenantId::generate();
        let b = TenantId::generate();
        assert_ne!(a, b);
        assert_eq!(a.to_string().parse::<TenantId>(), Ok(a));
        let t = TimelineId::generate();
        assert_eq!(t.to_string().parse::<TimelineId>(), Ok(t));
    }

    proptest! {
        #[test]
        fn tenant_id_round_trips(bytes in any::<[u8; ID_LEN]>()) {
            let id = TenantId::from_bytes(bytes);
            let text = id.to_string();
            prop_assert_eq!(text.len(), ID_HEX_LEN);
            prop_assert_eq!(text.parse::<TenantId>(), Ok(id));
            prop_assert_eq!(id.as_bytes(), &bytes);
        }

        #[test]
        fn timeline_id_round_trips(bytes in any::<[u8; ID_LEN]>()) {
            let id = TimelineId::from_bytes(bytes);
            let text = id.to_string();
            prop_assert_eq!(text.len(), ID_HEX_LEN);
            prop_assert_eq!(text.parse::<TimelineId>(), Ok(id));
        }

        #[test]
        fn text_order_is_id_order(a in any::<[u8; ID_LEN]>(), b in any::<[u8; ID_LEN]>()) {
            let (a, b) = (TenantId::from_bytes(a), TenantId::from_bytes(b));
            prop_assert_eq!(a.to_string().cmp(&b.to_string()), a.cmp(&b));
        }

        #[test]
        fn arbitrary_strings_never_panic(s in ".*") {
            let _ = s.parse::<TenantId>();
            let _ = s.parse::<TimelineId>();
        }

        #[test]
        fn near_miss_strings_never_panic(s in "[0-9a-fA-Fg+ é]{30,34}") {
            if let Err(e) = s.parse::<TenantId>() {
                let msg = e.to_string();
                let quoted = format!("{:?}", e.input());
                prop_assert!(msg.contains(&quoted), "{} lacks {}", msg, quoted);
            }
            let _ = s.parse::<TimelineId>();
        }
    }
}
