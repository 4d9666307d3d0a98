//! The names of layer files, parsed and printed in one place.
//!
//! ```text
//!   delta:  <key start>-<key end>__<lsn start>-<lsn end>     keys [start, end), LSNs [start, end)
//!   image:  <key start>-<key end>__<lsn>                     keys [start, end), at one LSN
//! ```
//!
//! Keys are 36 lower-case hex digits (`Key`'s text form), LSNs 16 upper-case hex digits. A name
//! has exactly one spelling: [`LayerName::from_str`] accepts only what [`LayerName`]'s `Display`
//! prints, so two different names never describe the same layer. A name only claims: the
//! layer's summary inside the file is the authority, and loading checks that the two agree.

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use pageserver_api::Key;
use utils::Lsn;

/// A layer file's name: what kind of layer it is and the ranges it covers.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum LayerName {
    Delta(DeltaLayerName),
    Image(ImageLayerName),
}

/// A delta layer: versions of keys in `key_range` with LSNs in `lsn_range`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DeltaLayerName {
    pub key_range: Range<Key>,
    pub lsn_range: Range<Lsn>,
}

/// An image layer: the page of every key in `key_range` that has one, as of `lsn`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ImageLayerName {
    pub key_range: Range<Key>,
    pub lsn: Lsn,
}

impl LayerName {
    pub fn key_range(&self) -> &Range<Key> {
        match self {
            LayerName::Delta(d) => &d.key_range,
            LayerName::Image(i) => &i.key_range,
        }
    }

    /// The LSNs the layer's versions lie in; an image layer's is its one LSN.
    pub fn lsn_range(&self) -> Range<Lsn> {
        match self {
            LayerName::Delta(d) => d.lsn_range.clone(),
            LayerName::Image(i) => i.lsn..Lsn(i.lsn.0 + 1),
        }
    }

    pub fn is_image(&self) -> bool {
        matches!(self, LayerName::Image(_))
    }
}

impl fmt::Display for LayerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LayerName::Delta(d) => d.fmt(f),
            LayerName::Image(i) => i.fmt(f),
        }
    }
}

impl fmt::Display for DeltaLayerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}-{}__{:016X}-{:016X}",
            self.key_range.start, self.key_range.end, self.lsn_range.start.0, self.lsn_range.end.0
        )
    }
}

impl fmt::Display for ImageLayerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}-{}__{:016X}",
            self.key_range.start, self.key_range.end, self.lsn.0
        )
    }
}

/// Why a file name is not a layer's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name:?} is not a layer file name: {reason}")]
pub struct LayerNameError {
    pub name: String,
    pub reason: &'static str,
}

impl FromStr for LayerName {
    type Err = LayerNameError;

    fn from_str(name: &str) -> Result<LayerName, LayerNameError> {
        let err = |reason| LayerNameError {
            name: name.chars().take(200).collect(),
            reason,
        };
        let (keys, lsns) = name.split_once("__").ok_or_else(|| err("no `__`"))?;
        let (start, end) = keys
            .split_once('-')
            .ok_or_else(|| err("no `-` between the keys"))?;
        let key = |s: &str| {
            s.parse::<Key>()
                .map_err(|_| err("a key is not 36 hex digits"))
        };
        let key_range = key(start)?..key(end)?;
        if key_range.start >= key_range.end {
            return Err(err("the key range is empty"));
        }
        let lsn = |s: &str| {
            (s.len() == 16)
                .then(|| u64::from_str_radix(s, 16).ok())
                .flatten()
                .map(Lsn)
                .ok_or_else(|| err("an LSN is not 16 hex digits"))
        };
        let parsed = match lsns.split_once('-') {
            Some((start, end)) => {
                let lsn_range = lsn(start)?..lsn(end)?;
                if lsn_range.start >= lsn_range.end {
                    return Err(err("the LSN range is empty"));
                }
                LayerName::Delta(DeltaLayerName {
                    key_range,
                    lsn_range,
                })
            }
            None => {
                let lsn = lsn(lsns)?;
                if lsn == Lsn::MAX {
                    return Err(err("the LSN is reserved"));
                }
                LayerName::Image(ImageLayerName { key_range, lsn })
            }
        };
        // One spelling per layer: upper-case keys or lower-case LSNs are someone else's file.
        if parsed.to_string() != name {
            return Err(err("not in the canonical spelling"));
        }
        Ok(parsed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const K1: &str = "000000067f00000005000040000000000001";
    const K2: &str = "000000067f00000005000040000000000002";

    #[test]
    fn parses_both_kinds() {
        let delta: LayerName = format!("{K1}-{K2}__0000000000000001-0000000000000011")
            .parse()
            .unwrap();
        assert_eq!(delta.lsn_range(), Lsn(1)..Lsn(0x11));
        assert!(!delta.is_image());
        let image: LayerName = format!("{K1}-{K2}__00000000000000A0").parse().unwrap();
        assert_eq!(image.lsn_range(), Lsn(0xA0)..Lsn(0xA1));
        assert!(image.is_image());
        assert_eq!(image.key_range().start.to_string(), K1);
    }

    #[test]
    fn refuses_what_is_not_a_layer_name() {
        for (name, why) in [
            ("metadata".to_owned(), "no `__`"),
            ("x__1-2".to_owned(), "no `-` between the keys"),
            (format!("{K1}-{K2}__00000000000000zz"), "16 hex"),
            (format!("{K1}-{K2}__0000000000000001"), ""),
            (format!("{K2}-{K1}__0000000000000001"), "key range is empty"),
            (
                format!("{K1}-{K2}__0000000000000002-0000000000000002"),
                "LSN range is empty",
            ),
            (format!("{K1}-{K2}__00000000000000a0"), "canonical"),
            (format!("{K1}-{K2}__00000000000000A0.___temp"), "16 hex"),
            (format!("{K1}-{K2}__FFFFFFFFFFFFFFFF"), "reserved"),
        ] {
            let parsed = name.parse::<LayerName>();
            if why.is_empty() {
                assert!(parsed.is_ok(), "{name}");
            } else {
                let e = parsed.unwrap_err();
                assert!(e.to_string().contains(why), "{name}: {e}");
            }
        }
    }

    fn any_key() -> impl Strategy<Value = Key> {
        any::<[u8; 18]>().prop_map(Key::from_bytes)
    }

    proptest! {
        #[test]
        fn printing_then_parsing_gives_the_same_name(
            a in any_key(), b in any_key(), l1 in 0..u64::MAX - 1, l2 in 0..u64::MAX - 1,
            image in any::<bool>(),
        ) {
            prop_assume!(a != b && l1 != l2);
            let key_range = a.min(b)..a.max(b);
            let name = if image {
                LayerName::Image(ImageLayerName { key_range, lsn: Lsn(l1) })
            } else {
                LayerName::Delta(DeltaLayerName { key_range, lsn_range: Lsn(l1.min(l2))..Lsn(l1.max(l2)) })
            };
            let text = name.to_string();
            prop_assert_eq!(text.parse::<LayerName>().unwrap(), name);
        }
    }
}
