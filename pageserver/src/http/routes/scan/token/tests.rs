//! Tokens round-trip, any damage to one is refused, and a token continues only the scan it was
//! issued for.

use super::*;
use crate::tenant::test_support::rel_key;

const TENANT: TenantId = TenantId::from_bytes([5; 16]);
const TIMELINE: TimelineId = TimelineId::from_bytes([6; 16]);

fn position() -> ScanPosition {
    ScanPosition {
        cursor_id: 0x0123_4567_89AB_CDEF,
        tenant_id: TENANT,
        timeline_id: TIMELINE,
        lsn: Lsn(0x1_0000_0010),
        end: rel_key(100),
        last: rel_key(7),
    }
}

#[test]
fn tokens_round_trip_and_any_damage_is_refused() {
    let text = encode(&position());
    assert_eq!(text.len(), TOKEN_CHARS);
    assert!(text
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
    assert_eq!(decode(&text), Ok(position()));

    // Every character changed to every other base64 character: never a different token.
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    for at in 0..text.len() {
        for c in alphabet {
            let mut bytes = text.clone().into_bytes();
            if bytes[at] == *c {
                continue;
            }
            bytes[at] = *c;
            let mangled = String::from_utf8(bytes).unwrap();
            assert!(decode(&mangled).is_err(), "{mangled}");
        }
    }
    assert_eq!(
        decode(&text[..text.len() - 1]),
        Err(TokenError::WrongLength {
            chars: TOKEN_CHARS - 1
        })
    );
    assert_eq!(decode(""), Err(TokenError::WrongLength { chars: 0 }));
    let long = "A".repeat(100_000);
    assert!(matches!(decode(&long), Err(TokenError::WrongLength { .. })));
    let not_base64: String = "!".repeat(TOKEN_CHARS);
    assert_eq!(decode(&not_base64), Err(TokenError::NotBase64));
    // Standard base64's characters are not the URL-safe ones.
    let plus = format!("+{}", &text[1..]);
    assert_eq!(decode(&plus), Err(TokenError::NotBase64));

    // A well-formed token with a version or fields this server never issues.
    let mut raw = URL_SAFE_NO_PAD.decode(&text).unwrap();
    let reseal = |raw: &mut Vec<u8>| {
        let crc = utils::crc32c::crc32c(&raw[..token_off::CHECKSUM]);
        raw[token_off::CHECKSUM..].copy_from_slice(&crc.to_be_bytes());
        URL_SAFE_NO_PAD.encode(&raw)
    };
    raw[token_off::VERSION] = 2;
    assert_eq!(
        decode(&reseal(&mut raw)),
        Err(TokenError::UnknownVersion { version: 2 })
    );
    let inverted = ScanPosition {
        last: rel_key(100),
        ..position()
    };
    assert!(matches!(
        decode(&encode(&inverted)),
        Err(TokenError::Inconsistent { .. })
    ));
}

#[test]
fn a_token_continues_only_the_scan_it_came_from() {
    let t = position();
    let other_tenant = TenantId::from_bytes([9; 16]);
    let other_timeline = TimelineId::from_bytes([9; 16]);
    let ok = |lsn| check_request(&t, TENANT, TIMELINE, lsn, rel_key(0), rel_key(100));
    assert_eq!(ok(Some(t.lsn)), Ok(()));
    assert_eq!(ok(None), Ok(()), "`latest` means the token's LSN");
    assert!(matches!(ok(Some(Lsn(5))), Err(TokenMismatch::Lsn { .. })));
    assert!(matches!(
        check_request(&t, other_tenant, TIMELINE, None, rel_key(0), rel_key(100)),
        Err(TokenMismatch::Tenant { .. })
    ));
    assert!(matches!(
        check_request(&t, TENANT, other_timeline, None, rel_key(0), rel_key(100)),
        Err(TokenMismatch::Timeline { .. })
    ));
    assert!(matches!(
        check_request(&t, TENANT, TIMELINE, None, rel_key(0), rel_key(99)),
        Err(TokenMismatch::End { .. })
    ));
    assert!(matches!(
        check_request(&t, TENANT, TIMELINE, None, rel_key(8), rel_key(100)),
        Err(TokenMismatch::Start { .. })
    ));
    let message = check_request(&t, TENANT, TIMELINE, Some(Lsn(5)), rel_key(0), rel_key(100))
        .unwrap_err()
        .to_string();
    assert_eq!(
        message,
        "page_token was issued for a scan at LSN 1/10, not 0/5"
    );
}
