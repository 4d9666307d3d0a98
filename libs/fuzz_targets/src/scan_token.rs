//! The page token of a paged key scan, which a client hands back: never panics, and a token
//! that decodes encodes to a token that decodes the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pageserver::tenant::timeline::scan::cursor_cache::ScanToken;

fuzz_target!(|input: &[u8]| {
    let Ok(text) = std::str::from_utf8(input) else {
        return;
    };
    if let Ok(token) = ScanToken::decode(text) {
        assert_eq!(ScanToken::decode(&token.encode()), Ok(token));
    }
});
