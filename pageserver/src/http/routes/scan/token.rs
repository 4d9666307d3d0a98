//! The `page_token` of a paged key scan: the wire form of the [`ScanPosition`] a page ends at,
//! which the client hands back to get the next page.
//!
//! Each page but the last comes with a `next_page_token`: an opaque string naming the cursor
//! kept for the next page, and everything needed to continue without it. URL-safe base64 (no
//! padding) of 89 bytes, integers big-endian:
//!
//! ```text
//! offset size field
//!      0    1 version        1
//!      1    8 cursor id      random; the cache key
//!      9   16 tenant id
//!     25   16 timeline id
//!     41    8 lsn            the scan's LSN
//!     49   18 end            the scan's exclusive end key
//!     67   18 last key       the scan continues after it
//!     85    4 CRC-32C of bytes 0..85
//! ```
//!
//! The checksum makes a mangled token an error rather than a different scan. It does not make a
//! token unforgeable, and need not: a token only ever continues a scan of the tenant and
//! timeline its request already names ([`check_request`], against the path, which auth
//! checks), and the cursor cache uses a cursor only if it agrees with every field of the
//! position, so the most a forged cursor id can do is make another client's next page a miss
//! that re-seeks to the same answer.
//!
//! [`decode`] takes any string at all, and never panics (the `scan_token` fuzz target).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use pageserver_api::Key;
use utils::{Lsn, TenantId, TimelineId};

use crate::format::array_at;
use crate::tenant::timeline::scan::cursor_cache::ScanPosition;

const TOKEN_VERSION: u8 = 1;
const KEY_LEN: usize = 18;
/// The length of a token's text: base64 of `token_off::LEN` bytes, without padding.
const TOKEN_CHARS: usize = (token_off::LEN * 4).div_ceil(3);

mod token_off {
    pub const VERSION: usize = 0;
    pub const CURSOR_ID: usize = 1;
    pub const TENANT: usize = 9;
    pub const TIMELINE: usize = 25;
    pub const LSN: usize = 41;
    pub const END: usize = 49;
    pub const LAST: usize = 67;
    pub const CHECKSUM: usize = 85;
    /// The whole token.
    pub const LEN: usize = 89;
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("page_token is not URL-safe base64 without padding")]
    NotBase64,
    #[error("page_token is {chars} characters long; a token is {TOKEN_CHARS}")]
    WrongLength { chars: usize },
    #[error("page_token has version {version}, this server issues version {TOKEN_VERSION}")]
    UnknownVersion { version: u8 },
    #[error("page_token is damaged: its checksum does not match")]
    Checksum,
    #[error("page_token is damaged: its last key {last} is not below its end key {end}")]
    Inconsistent { last: Key, end: Key },
}

/// The token of `position`.
pub fn encode(position: &ScanPosition) -> String {
    use token_off::*;
    let mut b = [0u8; LEN];
    b[VERSION] = TOKEN_VERSION;
    b[CURSOR_ID..CURSOR_ID + 8].copy_from_slice(&position.cursor_id.to_be_bytes());
    b[TENANT..TENANT + 16].copy_from_slice(position.tenant_id.as_bytes());
    b[TIMELINE..TIMELINE + 16].copy_from_slice(position.timeline_id.as_bytes());
    b[LSN..LSN + 8].copy_from_slice(&position.lsn.0.to_be_bytes());
    b[END..END + KEY_LEN].copy_from_slice(&position.end.to_bytes());
    b[LAST..LAST + KEY_LEN].copy_from_slice(&position.last.to_bytes());
    let crc = utils::crc32c::crc32c(&b[..CHECKSUM]);
    b[CHECKSUM..CHECKSUM + 4].copy_from_slice(&crc.to_be_bytes());
    URL_SAFE_NO_PAD.encode(b)
}

/// Parses and checks a token from a client: any string at all.
pub fn decode(text: &str) -> Result<ScanPosition, TokenError> {
    use token_off::*;
    if text.len() != TOKEN_CHARS {
        return Err(TokenError::WrongLength { chars: text.len() });
    }
    let b: [u8; LEN] = URL_SAFE_NO_PAD
        .decode(text)
        .ok()
        .and_then(|bytes| bytes.try_into().ok())
        .ok_or(TokenError::NotBase64)?;
    if b[VERSION] != TOKEN_VERSION {
        return Err(TokenError::UnknownVersion {
            version: b[VERSION],
        });
    }
    let stored = u32::from_be_bytes(array_at(&b, CHECKSUM));
    if utils::crc32c::crc32c(&b[..CHECKSUM]) != stored {
        return Err(TokenError::Checksum);
    }
    let u64_at = |o: usize| u64::from_be_bytes(array_at(&b, o));
    let id = |o: usize| array_at::<16>(&b, o);
    let key = |o: usize| Key::from_bytes(array_at(&b, o));
    let position = ScanPosition {
        cursor_id: u64_at(CURSOR_ID),
        tenant_id: TenantId::from_bytes(id(TENANT)),
        timeline_id: TimelineId::from_bytes(id(TIMELINE)),
        lsn: Lsn(u64_at(LSN)),
        end: key(END),
        last: key(LAST),
    };
    // The scan continues at the key after `last`, which must exist.
    if position.last >= position.end {
        return Err(TokenError::Inconsistent {
            last: position.last,
            end: position.end,
        });
    }
    Ok(position)
}

/// Why a token cannot continue the scan a request asks for.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenMismatch {
    #[error("page_token was issued for tenant {token}, not {request}")]
    Tenant { token: TenantId, request: TenantId },
    #[error("page_token was issued for timeline {token}, not {request}")]
    Timeline {
        token: TimelineId,
        request: TimelineId,
    },
    #[error("page_token was issued for a scan at LSN {token}, not {request}")]
    Lsn { token: Lsn, request: Lsn },
    #[error("page_token was issued for a scan ending at key {token}, not {request}")]
    End { token: Key, request: Key },
    #[error("page_token continues after key {last}, which is below start {start}")]
    Start { last: Key, start: Key },
}

/// Checks that a token's `position` continues the scan a request describes: a token is only
/// good for the tenant, timeline, LSN and end it was issued for. `lsn` is `None` for
/// `latest`, which then means the token's LSN.
pub fn check_request(
    position: &ScanPosition,
    tenant_id: TenantId,
    timeline_id: TimelineId,
    lsn: Option<Lsn>,
    start: Key,
    end: Key,
) -> Result<(), TokenMismatch> {
    if position.tenant_id != tenant_id {
        return Err(TokenMismatch::Tenant {
            token: position.tenant_id,
            request: tenant_id,
        });
    }
    if position.timeline_id != timeline_id {
        return Err(TokenMismatch::Timeline {
            token: position.timeline_id,
            request: timeline_id,
        });
    }
    if let Some(lsn) = lsn.filter(|l| *l != position.lsn) {
        return Err(TokenMismatch::Lsn {
            token: position.lsn,
            request: lsn,
        });
    }
    if position.end != end {
        return Err(TokenMismatch::End {
            token: position.end,
            request: end,
        });
    }
    if position.last < start {
        return Err(TokenMismatch::Start {
            last: position.last,
            start,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
