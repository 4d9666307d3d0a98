//! The JSON body of a `GET .../keys` page, written straight into one buffer.
//!
//! A page holds up to 1,000 pages of 8 KiB, about 11 MiB of base64. Built as a
//! `serde_json::Value` and serialized, each page's base64 would be a `String` of its own, then
//! scanned byte by byte for characters to escape and copied into the body: in a build without
//! optimizations (the one the regression suite runs) that escape scan alone was about 80 % of a
//! 1,000-entry scan page's time, several times the scan's own. Nothing in this body ever needs
//! escaping (keys are hex, pages standard base64, the token URL-safe base64), so it is written
//! as it is, each page's base64 appended to the one buffer sized for the whole body.
//!
//! The bytes are exactly what `serde_json` writes for the same `json!` value (no whitespace,
//! object keys in sorted order, as everywhere in the API), which a test checks.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use bytes::Bytes;
use pageserver_api::Key;

/// The body of a scan page: `{"entries":[{"key":K,"page":P},...],"next_page_token":T|null}`.
pub fn scan_page_body(entries: &[(Key, Bytes)], next_page_token: Option<&str>) -> Vec<u8> {
    const ENTRY: &[u8] = br#"{"key":""#;
    const PAGE: &[u8] = br#"","page":""#;
    let base64_len = |n: usize| n.div_ceil(3) * 4;
    let size = 64
        + next_page_token.map_or(0, str::len)
        + entries
            .iter()
            .map(|(_, page)| ENTRY.len() + 36 + PAGE.len() + base64_len(page.len()) + 3)
            .sum::<usize>();
    let mut body = Vec::with_capacity(size);
    // Each page is encoded here and copied into the body: zeroing its place in the body
    // instead would cost more than the copy (a byte at a time, without optimizations).
    let longest = entries
        .iter()
        .map(|(_, page)| page.len())
        .max()
        .unwrap_or(0);
    let mut encoded = vec![0u8; base64_len(longest)];
    body.extend_from_slice(br#"{"entries":["#);
    for (i, (key, page)) in entries.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(ENTRY);
        body.extend_from_slice(key.to_string().as_bytes());
        body.extend_from_slice(PAGE);
        let written = BASE64
            .encode_slice(page, &mut encoded)
            .expect("sized for the longest page's base64");
        body.extend_from_slice(&encoded[..written]);
        body.extend_from_slice(br#""}"#);
    }
    body.extend_from_slice(br#"],"next_page_token":"#);
    match next_page_token {
        Some(token) => {
            debug_assert!(token
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
            body.push(b'"');
            body.extend_from_slice(token.as_bytes());
            body.push(b'"');
        }
        None => body.extend_from_slice(b"null"),
    }
    body.push(b'}');
    body
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn as_serde_writes_it(entries: &[(Key, Bytes)], token: Option<&str>) -> Vec<u8> {
        let entries: Vec<_> = entries
            .iter()
            .map(|(key, page)| json!({ "key": key.to_string(), "page": BASE64.encode(page) }))
            .collect();
        serde_json::to_vec(&json!({ "entries": entries, "next_page_token": token })).unwrap()
    }

    #[test]
    fn the_body_is_what_serde_json_writes() {
        let key = |n| Key::rel_block(1663, 5, 16384, 0, n);
        let full = Bytes::from((0..8192u32).map(|i| (i * 7) as u8).collect::<Vec<u8>>());
        // Every length modulo 3 (base64 padding), an empty page, a full one.
        let entries: Vec<(Key, Bytes)> = vec![
            (key(1), Bytes::from_static(b"one")),
            (key(2), Bytes::from_static(b"TWO!")),
            (key(3), Bytes::from_static(b"three")),
            (Key::MIN, Bytes::new()),
            (key(u32::MAX), full),
        ];
        let token = "Ac1V-qq-rzwbASNFZ4mrze8BI0VniavN7_7cuph2VDIQ_ty6mHZUMhA";
        for n in 0..=entries.len() {
            for token in [None, Some(token)] {
                let body = scan_page_body(&entries[..n], token);
                assert_eq!(
                    String::from_utf8(body).unwrap(),
                    String::from_utf8(as_serde_writes_it(&entries[..n], token)).unwrap(),
                    "{n} entries, token {token:?}"
                );
            }
        }
    }

    #[test]
    fn the_body_is_sized_once() {
        let page = Bytes::from(vec![7u8; 8192]);
        let entries: Vec<(Key, Bytes)> = (0..1000)
            .map(|n| (Key::rel_block(1663, 5, 16384, 0, n), page.clone()))
            .collect();
        let body = scan_page_body(&entries, Some("token"));
        assert!(body.capacity() >= body.len() && body.capacity() < body.len() + 128);
    }
}
