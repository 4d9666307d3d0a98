//! The page token of a paged key scan, which a client hands back: never panics, and a token
//! that decodes encodes to a token that decodes the same.

use pageserver::http::routes::scan::token::{decode, encode};

/// Checks one input; panics where the decoder breaks its contract.
pub fn check(input: &[u8]) {
    let Ok(text) = std::str::from_utf8(input) else {
        return;
    };
    if let Ok(position) = decode(text) {
        assert_eq!(decode(&encode(&position)), Ok(position));
    }
}
