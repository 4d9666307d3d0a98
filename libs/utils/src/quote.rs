//! Bounded copies of rejected input for error messages.
//!
//! Parse errors quote what they were given so that a log line is enough to
//! see the mistake, but the input may come from a client and be arbitrarily
//! long; only a prefix is kept so an error never grows with its input.

/// How many bytes of rejected input an error keeps, at most.
pub const MAX_QUOTED_BYTES: usize = 64;

/// Returns at most [`MAX_QUOTED_BYTES`] of `input`, cut on a character
/// boundary, with `…` appended when something was cut off.
pub fn bounded(input: &str) -> String {
    if input.len() <= MAX_QUOTED_BYTES {
        return input.to_owned();
    }
    let mut end = MAX_QUOTED_BYTES;
    while !input.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = String::with_capacity(end + '…'.len_utf8());
    out.push_str(&input[..end]);
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_input_is_kept_whole() {
        assert_eq!(bounded("abc"), "abc");
        assert_eq!(bounded(""), "");
    }

    #[test]
    fn long_input_is_cut_on_a_char_boundary() {
        let long = "é".repeat(100);
        let out = bounded(&long);
        assert!(out.ends_with('…'));
        assert!(out.len() <= MAX_QUOTED_BYTES + '…'.len_utf8());
        assert!(long.starts_with(out.trim_end_matches('…')));
    }
}
