//! Log sequence numbers: positions in the Postgres write-ahead log.
//!
//! An LSN is a byte offset into the WAL stream, so it is a plain `u64` and
//! ordering LSNs is ordering offsets. Zero is never a real WAL position,
//! which is why it doubles as "no LSN" ([`Lsn::INVALID`]).
//!
//! The text form is the one Postgres prints (`pg_current_wal_lsn()` and
//! friends): the high and low 32 bits in upper-case hex, separated by `/`,
//! so values can be pasted between our logs and `psql` unchanged. Parsing
//! also takes a plain decimal `u64`, which is what tools and configuration
//! files tend to produce. Parsing never panics: every malformed input gets a
//! [`LsnParseError`] that names the problem.

use std::fmt;
use std::str::FromStr;

use crate::quote;

/// A position in the write-ahead log (a byte offset into the WAL stream).
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Lsn(pub u64);

impl Lsn {
    /// "No LSN": zero is never a valid WAL position.
    pub const INVALID: Lsn = Lsn(0);

    /// The largest representable LSN.
    pub const MAX: Lsn = Lsn(u64::MAX);

    /// True unless this is [`Lsn::INVALID`].
    pub const fn is_valid(self) -> bool {
        self.0 != Self::INVALID.0
    }

    /// `self + bytes`, or `None` if that would pass [`Lsn::MAX`].
    pub const fn checked_add(self, bytes: u64) -> Option<Lsn> {
        match self.0.checked_add(bytes) {
            Some(v) => Some(Lsn(v)),
            None => None,
        }
    }

    /// `self - bytes`, or `None` if that would go below zero.
    pub const fn checked_sub(self, bytes: u64) -> Option<Lsn> {
        match self.0.checked_sub(bytes) {
            Some(v) => Some(Lsn(v)),
            None => None,
        }
    }

    /// The high 32 bits (the part before the `/`).
    const fn high(self) -> u32 {
        // Shifting a u64 right by 32 leaves at most 32 significant bits.
        (self.0 >> 32) as u32
    }

    /// The low 32 bits (the part after the `/`).
    const fn low(self) -> u32 {
        // Deliberate truncation to the low half.
        (self.0 & 0xFFFF_FFFF) as u32
    }
}

impl From<u64> for Lsn {
    fn from(value: u64) -> Self {
        Lsn(value)
    }
}

impl From<Lsn> for u64 {
    fn from(lsn: Lsn) -> Self {
        lsn.0
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.high(), self.low())
    }
}

/// Which half of the `HI/LO` text form a problem was found in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LsnHalf {
    /// The part before the `/`.
    High,
    /// The part after the `/`.
    Low,
}

impl fmt::Display for LsnHalf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LsnHalf::High => "high (before `/`)",
            LsnHalf::Low => "low (after `/`)",
        })
    }
}

/// What was wrong with a string that did not parse as an [`Lsn`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LsnParseErrorKind {
    /// The input was the empty string.
    #[error("the string is empty")]
    Empty,
    /// Not all decimal digits, and no `/` for the hex form either.
    #[error("expected hex `HI/LO` or a decimal number, but there is no `/` and it is not decimal")]
    MissingSlash,
    /// The hex form has more than one `/`.
    #[error("more than one `/`")]
    ExtraSlash,
    /// One half of the hex form has no digits.
    #[error("the {0} half is empty")]
    EmptyHalf(LsnHalf),
    /// One half of the hex form has a character that is not a hex digit.
    #[error("the {half} half has {ch:?}, which is not a hex digit")]
    NotHex {
        /// Where the character was found.
        half: LsnHalf,
        /// The first offending character.
        ch: char,
    },
    /// One half of the hex form is larger than `FFFFFFFF`.
    #[error("the {0} half does not fit in 32 bits")]
    HalfTooWide(LsnHalf),
    /// The decimal form is larger than `u64::MAX`.
    #[error("the decimal number does not fit in 64 bits")]
    DecimalTooLarge,
}

/// A string that is not an [`Lsn`]; the message quotes (a bounded prefix of)
/// the input and says what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid LSN {input:?}: {kind}")]
pub struct LsnParseError {
    input: String,
    kind: LsnParseErrorKind,
}

impl LsnParseError {
    /// What was wrong with the input.
    pub fn kind(&self) -> &LsnParseErrorKind {
        &self.kind
    }

    /// The rejected input, cut short if it was long.
    pub fn input(&self) -> &str {
        &self.input
    }
}

impl FromStr for Lsn {
    type Err = LsnParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse(s).map_err(|kind| LsnParseError {
            input: quote::bounded(s),
            kind,
        })
    }
}

fn parse(s: &str) -> Result<Lsn, LsnParseErrorKind> {
    if s.is_empty() {
        return Err(LsnParseErrorKind::Empty);
    }
    let Some((high, low)) = s.split_once('/') else {
        // No `/`: the only other accepted form is a plain decimal u64. Check
        // the digits ourselves because `u64::from_str` also accepts a `+`.
        if !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(LsnParseErrorKind::MissingSlash);
        }
        return s
            .parse::<u64>()
            .map(Lsn)
            .map_err(|_| LsnParseErrorKind::DecimalTooLarge);
    };
    if low.contains('/') {
        return Err(LsnParseErrorKind::ExtraSlash);
    }
    let high = parse_half(high, LsnHalf::High)?;
    let low = parse_half(low, LsnHalf::Low)?;
    Ok(Lsn((u64::from(high) << 32) | u64::from(low)))
}

fn parse_half(part: &str, half: LsnHalf) -> Result<u32, LsnParseErrorKind> {
    if part.is_empty() {
        return Err(LsnParseErrorKind::EmptyHalf(half));
    }
    // Checked by hand: `from_str_radix` would also take a leading `+`.
    if let Some(ch) = part.chars().find(|c| !c.is_ascii_hexdigit()) {
        return Err(LsnParseErrorKind::NotHex { half, ch });
    }
    // Only hex digits remain, so overflow is the one way this can fail.
    u32::from_str_radix(part, 16).map_err(|_| LsnParseErrorKind::HalfTooWide(half))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn kind_of(s: &str) -> LsnParseErrorKind {
        match s.parse::<Lsn>() {
            Ok(lsn) => panic!("{s:?} unexpectedly parsed as {lsn}"),
            Err(e) => e.kind().clone(),
        }
    }

    #[test]
    fn displays_in_postgres_form() {
        assert_eq!(Lsn(0x16B5A50).to_string(), "0/16B5A50");
        assert_eq!(Lsn(1 << 32).to_string(), "1/0");
        assert_eq!(Lsn(0).to_string(), "0/0");
        assert_eq!(Lsn::MAX.to_string(), "FFFFFFFF/FFFFFFFF");
        assert_eq!(Lsn(0xAB_0000_00CD).to_string(), "AB/CD");
    }

    #[test]
    fn parses_hex_form() {
        assert_eq!("1/0".parse::<Lsn>(), Ok(Lsn(1 << 32)));
        assert_eq!("0/16B5A50".parse::<Lsn>(), Ok(Lsn(0x16B5A50)));
        // Lower case and leading zeros are accepted too.
        assert_eq!("0/16b5a50".parse::<Lsn>(), Ok(Lsn(0x16B5A50)));
        assert_eq!("00000001/00000002".parse::<Lsn>(), Ok(Lsn((1 << 32) | 2)));
        assert_eq!("FFFFFFFF/FFFFFFFF".parse::<Lsn>(), Ok(Lsn::MAX));
    }

    #[test]
    fn parses_decimal_form() {
        assert_eq!("12345".parse::<Lsn>(), Ok(Lsn(12345)));
        assert_eq!("0".parse::<Lsn>(), Ok(Lsn::INVALID));
        assert_eq!(u64::MAX.to_string().parse::<Lsn>(), Ok(Lsn::MAX));
    }

    #[test]
    fn rejects_each_malformed_class() {
        assert_eq!(kind_of(""), LsnParseErrorKind::Empty);
        assert_eq!(kind_of("16B5A50"), LsnParseErrorKind::MissingSlash);
        assert_eq!(kind_of("+5"), LsnParseErrorKind::MissingSlash);
        assert_eq!(kind_of("-5"), LsnParseErrorKind::MissingSlash);
        assert_eq!(kind_of(" 5"), LsnParseErrorKind::MissingSlash);
        assert_eq!(kind_of("0/1/2"), LsnParseErrorKind::ExtraSlash);
        assert_eq!(kind_of("//"), LsnParseErrorKind::ExtraSlash);
        assert_eq!(kind_of("/1"), LsnParseErrorKind::EmptyHalf(LsnHalf::High));
        assert_eq!(kind_of("1/"), LsnParseErrorKind::EmptyHalf(LsnHalf::Low));
        assert_eq!(kind_of("/"), LsnParseErrorKind::EmptyHalf(LsnHalf::High));
        assert_eq!(
            kind_of("G/0"),
            LsnParseErrorKind::NotHex {
                half: LsnHalf::High,
                ch: 'G'
            }
        );
        assert_eq!(
            kind_of("0/+1"),
            LsnParseErrorKind::NotHex {
                half: LsnHalf::Low,
                ch: '+'
            }
        );
        assert_eq!(
            kind_of("0/1 "),
            LsnParseErrorKind::NotHex {
                half: LsnHalf::Low,
                ch: ' '
            }
        );
        assert_eq!(
            kind_of("100000000/0"),
            LsnParseErrorKind::HalfTooWide(LsnHalf::High)
        );
        assert_eq!(
            kind_of("0/1FFFFFFFF"),
            LsnParseErrorKind::HalfTooWide(LsnHalf::Low)
        );
        assert_eq!(
            kind_of("18446744073709551616"),
            LsnParseErrorKind::DecimalTooLarge
        );
    }

    #[test]
    fn error_message_quotes_input_and_says_what_is_wrong() {
        let err = "0/xyz".parse::<Lsn>().unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("\"0/xyz\""), "{msg}");
        assert!(msg.contains("not a hex digit"), "{msg}");
        assert_eq!(err.input(), "0/xyz");

        let err = "1/2/3".parse::<Lsn>().unwrap_err();
        assert!(err.to_string().contains("more than one `/`"), "{err}");
    }

    #[test]
    fn error_quotes_only_a_prefix_of_long_input() {
        let long = "9".repeat(10_000);
        let err = long.parse::<Lsn>().unwrap_err();
        assert_eq!(err.kind(), &LsnParseErrorKind::DecimalTooLarge);
        assert!(err.to_string().len() < 200, "{err}");
    }

    #[test]
    fn validity_and_arithmetic() {
        assert!(!Lsn::INVALID.is_valid());
        assert!(!Lsn::default().is_valid());
        assert!(Lsn(1).is_valid());
        assert!(Lsn::MAX.is_valid());
        assert_eq!(Lsn(10).checked_add(5), Some(Lsn(15)));
        assert_eq!(Lsn::MAX.checked_add(1), None);
        assert_eq!(Lsn(10).checked_sub(10), Some(Lsn(0)));
        assert_eq!(Lsn(10).checked_sub(11), None);
    }

    #[test]
    fn converts_to_and_from_u64() {
        assert_eq!(Lsn::from(42u64), Lsn(42));
        let raw: u64 = Lsn(42).into();
        assert_eq!(raw, 42);
    }

    proptest! {
        #[test]
        fn display_round_trips(v in any::<u64>()) {
            let text = Lsn(v).to_string();
            prop_assert_eq!(text.parse::<Lsn>(), Ok(Lsn(v)));
        }

        #[test]
        fn decimal_round_trips(v in any::<u64>()) {
            prop_assert_eq!(v.to_string().parse::<Lsn>(), Ok(Lsn(v)));
        }

        #[test]
        fn hex_halves_compose(high in any::<u32>(), low in any::<u32>()) {
            let expected = Lsn((u64::from(high) << 32) | u64::from(low));
            prop_assert_eq!(format!("{high:x}/{low:x}").parse::<Lsn>(), Ok(expected));
            prop_assert_eq!(format!("{high:08X}/{low:08X}").parse::<Lsn>(), Ok(expected));
        }

        #[test]
        fn ordering_is_offset_ordering(a in any::<u64>(), b in any::<u64>()) {
            prop_assert_eq!(Lsn(a).cmp(&Lsn(b)), a.cmp(&b));
        }

        #[test]
        fn arbitrary_strings_never_panic(s in ".*") {
            let _ = s.parse::<Lsn>();
        }

        #[test]
        fn near_miss_strings_never_panic(s in "[0-9a-fA-FgG/+ -]{0,24}") {
            if let Err(e) = s.parse::<Lsn>() {
                // Every error renders and quotes its input.
                let msg = e.to_string();
                let quoted = format!("{:?}", e.input());
                prop_assert!(msg.contains(&quoted), "{} lacks {}", msg, quoted);
            }
        }
    }
}
