//! Generation numbers: which attachment of a tenant wrote an object to remote storage.
//!
//! Each attachment of a tenant to a pageserver has a generation, given by whoever attaches it
//! and growing with every attachment. Objects a pageserver writes carry its generation in
//! their names (`<name>-<generation as 8 hex digits>`), so two attachments never write the
//! same object, and one that finds a newer generation's index knows it is stale and stops
//! deleting (fencing). Generation 0 is never used, so the text form always names a real one.

use std::fmt;
use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Generation(u32);

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid generation {0:?}: expected 8 hex digits naming a generation above 0")]
pub struct GenerationParseError(String);

impl Generation {
    /// The generation of a tenant created on this pageserver, before any attach.
    pub const FIRST: Generation = Generation(1);

    /// `None` for 0, which names no generation.
    pub fn new(n: u32) -> Option<Generation> {
        (n > 0).then_some(Generation(n))
    }

    pub fn get(self) -> u32 {
        self.0
    }

    /// The suffix of an object name this generation wrote: `-0000000a`.
    pub fn suffix(self) -> String {
        format!("-{self}")
    }

    /// Splits `name-0000000a` into `name` and its generation.
    pub fn split_suffix(object: &str) -> Option<(&str, Generation)> {
        let (name, generation) = object.rsplit_once('-')?;
        Some((name, generation.parse().ok()?))
    }
}

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:08x}", self.0)
    }
}

impl FromStr for Generation {
    type Err = GenerationParseError;

    fn from_str(s: &str) -> Result<Generation, GenerationParseError> {
        let err = || GenerationParseError(crate::quote::bounded(s));
        if s.len() != 8
            || !s
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        {
            return Err(err());
        }
        let n = u32::from_str_radix(s, 16).map_err(|_| err())?;
        Generation::new(n).ok_or_else(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_form_round_trips_and_refuses_junk() {
        let g = Generation::new(0xab).unwrap();
        assert_eq!(g.to_string(), "000000ab");
        assert_eq!("000000ab".parse::<Generation>().unwrap(), g);
        for bad in [
            "",
            "ab",
            "000000AB",
            "00000000",
            "0000000g",
            "+0000001",
            "000000001",
        ] {
            assert!(bad.parse::<Generation>().is_err(), "{bad:?}");
        }
        assert_eq!(
            Generation::split_suffix("a-b__0-1-000000ab"),
            Some(("a-b__0-1", g))
        );
        assert_eq!(Generation::split_suffix("index_part.json"), None);
        assert!(Generation::new(0).is_none());
        assert!(Generation::FIRST < g);
    }
}
