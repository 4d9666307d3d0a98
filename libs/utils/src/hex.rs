//! Hex digits, read one at a time: the text forms of ids and keys parse them so that an error
//! can name the character that is not one and where it stands.

/// The value of one hex digit, either case; `None` for any other character.
pub fn digit(ch: char) -> Option<u8> {
    let b = u8::try_from(ch).ok()?;
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_char_below_256_is_a_digit_exactly_when_it_is_hex() {
        for b in 0..=255u8 {
            let ch = char::from(b);
            assert_eq!(digit(ch), ch.to_digit(16).map(|d| d as u8), "{ch:?}");
        }
        assert_eq!(digit('é'), None);
        assert_eq!(digit('٣'), None);
    }
}
