//! `pg_multixact/` from multixact records (`RM_MULTIXACT_ID`), on the SLRU pages of
//! `wal_files.rs`, as PostgreSQL 15's `multixact.c` lays them out.
//!
//! - `offsets/`: a 4-byte member offset per multixact, 2,048 a page.
//! - `members/`: groups of 20 bytes, 409 a page (the rest of a page unused): four flag bytes
//!   (each member's lock status), then four transaction ids.
//!
//! | record | what it changes |
//! |---|---|
//! | `XLOG_MULTIXACT_ZERO_OFF_PAGE`, `XLOG_MULTIXACT_ZERO_MEM_PAGE` | a page of zeros (a new segment file at a segment's first) |
//! | `XLOG_MULTIXACT_CREATE_ID` | the multixact's offset and the next one's (where its members end), and each member's xid and status from its offset on |
//! | `XLOG_MULTIXACT_TRUNCATE_ID` | the segments before the new oldest, of both directories, as `PerformMembersTruncation` and `PerformOffsetsTruncation` remove them |

use super::wal_files::{u32_at, FileChanges, Files, ReadCurrent, Slru, PAGES_PER_SEGMENT};

const XLOG_MULTIXACT_ZERO_OFF_PAGE: u8 = 0x00;
const XLOG_MULTIXACT_ZERO_MEM_PAGE: u8 = 0x10;
pub const XLOG_MULTIXACT_CREATE_ID: u8 = 0x20;
pub const XLOG_MULTIXACT_TRUNCATE_ID: u8 = 0x30;

/// Multixacts one offsets page holds.
pub const OFFSETS_PER_PAGE: u32 = 8192 / 4;
/// Bytes of one member group: four flag bytes, four xids.
const MEMBER_GROUP_SIZE: u32 = 4 + 4 * 4;
/// Member groups one members page holds.
const MEMBER_GROUPS_PER_PAGE: u32 = 8192 / MEMBER_GROUP_SIZE;
/// Members one members page holds.
pub const MEMBERS_PER_PAGE: u32 = MEMBER_GROUPS_PER_PAGE * 4;
/// `FirstMultiXactId`.
const FIRST_MULTIXACT_ID: u32 = 1;
/// The most members one record may name (PostgreSQL's own limit is far lower in practice:
/// one per backend locking a row).
const MAX_MEMBERS: u32 = 1 << 20;

pub const OFFSETS: Slru = Slru {
    dir: "pg_multixact/offsets",
    max_page: u32::MAX / OFFSETS_PER_PAGE,
};
pub const MEMBERS: Slru = Slru {
    dir: "pg_multixact/members",
    max_page: u32::MAX / MEMBERS_PER_PAGE,
};

/// What multixact record `info` with main data `main` changes, into `files`.
/// `xl_multixact_create`: the multixact, its first member's offset and its member count,
/// checked against the main data holding that many (xid, status) members after them.
pub fn multixact_create(main: &[u8]) -> Result<(u32, u32, u32), String> {
    let (multi, offset, count) = (u32_at(main, 0)?, u32_at(main, 4)?, u32_at(main, 8)?);
    if count > MAX_MEMBERS || main.len() < 12 + 8 * count as usize {
        return Err(format!(
            "a multixact of {count} members in {} bytes of main data",
            main.len()
        ));
    }
    Ok((multi, offset, count))
}

pub fn multixact_record(
    files: &mut Files,
    info: u8,
    main: &[u8],
    read: &mut ReadCurrent<'_>,
    changes: &mut FileChanges,
) -> Result<(), String> {
    match info {
        XLOG_MULTIXACT_ZERO_OFF_PAGE => {
            files.zero_slru_page(OFFSETS, u32_at(main, 0)?, read, changes)
        }
        XLOG_MULTIXACT_ZERO_MEM_PAGE => {
            files.zero_slru_page(MEMBERS, u32_at(main, 0)?, read, changes)
        }
        XLOG_MULTIXACT_CREATE_ID => {
            let (multi, offset, count) = multixact_create(main)?;
            set_offset(files, multi, offset, read, changes)?;
            // The next multixact's offset too, where this one's members end (skipping 0), as
            // current minor versions of PostgreSQL 15 write it (older ones left it to the next
            // multixact, which writes the same).
            let next = match multi.wrapping_add(1) {
                0 => FIRST_MULTIXACT_ID,
                next => next,
            };
            let next_offset = match offset.wrapping_add(count) {
                0 => 1,
                end => end,
            };
            set_offset(files, next, next_offset, read, changes)?;
            for i in 0..count {
                let member = offset.wrapping_add(i);
                let (xid, status) = (
                    u32_at(main, 12 + 8 * i as usize)?,
                    main[16 + 8 * i as usize],
                );
                let page = files.slru_page(MEMBERS, member / MEMBERS_PER_PAGE, read, changes)?;
                let group = (member / 4 % MEMBER_GROUPS_PER_PAGE * MEMBER_GROUP_SIZE) as usize;
                let slot = (member % 4) as usize;
                page[group + slot] = status;
                let xid_at = group + 4 + slot * 4;
                page[xid_at..xid_at + 4].copy_from_slice(&xid.to_le_bytes());
            }
            Ok(())
        }
        XLOG_MULTIXACT_TRUNCATE_ID => {
            // xl_multixact_truncate: oldestMultiDB, startTruncOff, endTruncOff, startTruncMemb,
            // endTruncMemb.
            let end_multi = u32_at(main, 8)?;
            let (start_member, end_member) = (u32_at(main, 12)?, u32_at(main, 16)?);
            // Members: every segment from the old oldest's up to, not including, the new's.
            let segment_of = |member: u32| member / MEMBERS_PER_PAGE / PAGES_PER_SEGMENT;
            let (first, last) = (segment_of(start_member), segment_of(end_member));
            let max = segment_of(u32::MAX);
            let goes = |segment: u32| {
                if first <= last {
                    (first..last).contains(&segment)
                } else {
                    segment >= first && segment <= max || segment < last
                }
            };
            files.remove_slru_segments(MEMBERS, goes, read, changes)?;
            // Offsets: as SimpleLruTruncate, up to the page of the multixact before the new
            // oldest.
            let previous = if end_multi == FIRST_MULTIXACT_ID {
                u32::MAX
            } else {
                end_multi.wrapping_sub(1)
            };
            files.truncate_slru(
                OFFSETS,
                previous / OFFSETS_PER_PAGE,
                OFFSETS_PER_PAGE,
                FIRST_MULTIXACT_ID,
                read,
                changes,
            )
        }
        _ => Ok(()),
    }
}

/// Multixact `multi`'s entry of the offsets: `offset`.
fn set_offset(
    files: &mut Files,
    multi: u32,
    offset: u32,
    read: &mut ReadCurrent<'_>,
    changes: &mut FileChanges,
) -> Result<(), String> {
    let page = files.slru_page(OFFSETS, multi / OFFSETS_PER_PAGE, read, changes)?;
    let at = (multi % OFFSETS_PER_PAGE * 4) as usize;
    page[at..at + 4].copy_from_slice(&offset.to_le_bytes());
    Ok(())
}

#[cfg(test)]
mod tests;
