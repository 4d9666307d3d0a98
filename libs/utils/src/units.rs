//! Sizes and durations as the settings write them (`"64MiB"`, `8192`, `"10m"`), parsed and
//! printed in one place, and the serde functions that read them (`deserialize_with`).

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// A size in bytes: an integer, or a string with a unit (B, KiB, MiB, GiB, TiB, kB, MB, GB, TB).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a size (try 8192, \"64MiB\" or \"1GiB\")"))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        other => return Err(format!("unknown size unit `{other}` in `{text}`")),
    };
    number
        .checked_mul(scale)
        .ok_or_else(|| format!("`{text}` is too large"))
}

/// A size as it could be written in the settings: with the largest binary unit that divides it.
pub fn format_size(bytes: u64) -> String {
    for (unit, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if bytes != 0 && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    format!("{bytes}B")
}

#[derive(Deserialize)]
#[serde(untagged)]
enum SizeRepr {
    Bytes(u64),
    Text(String),
}

/// `deserialize_with` for a size ([`parse_size`]).
pub fn size<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    match SizeRepr::deserialize(d)? {
        SizeRepr::Bytes(n) => Ok(n),
        SizeRepr::Text(s) => parse_size(&s).map_err(serde::de::Error::custom),
    }
}

/// `deserialize_with` for a size held in a `usize`.
pub fn size_usize<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    let bytes = size(d)?;
    usize::try_from(bytes).map_err(|_| serde::de::Error::custom(format!("{bytes} is too large")))
}

/// `deserialize_with` for a duration written as humantime writes one (`"10m"`, `"500ms"`).
pub fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    humantime::parse_duration(&text).map_err(|e| {
        serde::de::Error::custom(format!(
            "`{text}` is not a duration ({e}; try \"10m\" or \"500ms\")"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(format_size(8 << 10), "8KiB");
        assert_eq!(format_size(3 << 40), "3TiB");
        assert_eq!(format_size(8223), "8223B");
        assert_eq!(parse_size("2TiB"), Ok(2 << 40));
        assert_eq!(parse_size("1TB"), Ok(1_000_000_000_000));
        assert_eq!(parse_size("8192"), Ok(8192));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1 GiB"), Ok(1 << 30));
        assert_eq!(parse_size("2kB"), Ok(2000));
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("99999999999999GiB")
            .unwrap_err()
            .contains("too large"));
    }
}
