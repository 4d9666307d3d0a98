//! Redo: turning a page's history of [`Value`]s into the page.
//!
//! To produce page K as of LSN L, the read path walks the layers from the
//! newest down, collecting K's records at or below L, newest first, and
//! stops at the first record that does not depend on older ones (an image,
//! or a delta with `will_init`; see [`Value::will_init`]). That record is
//! the *base*. [`reconstruct_page`] then starts from the base and applies
//! the newer deltas oldest to newest:
//!
//! - an image base starts from the image's bytes;
//! - a `will_init` delta base starts from [`ZERO_PAGE_SIZE`] zero bytes and
//!   applies its own patches onto them;
//! - if the records run out without a base, the page does not exist as of
//!   L ("not found"), which is `Ok(None)`, not an error.
//!
//! A PostgreSQL WAL record ([`Value::WalRecord`]) is a version only
//! PostgreSQL's redo can apply. A history that holds one between the base and
//! L is not redone here: [`RedoErrorKind::NeedsWalRedo`] says which record is
//! the oldest that would have to be redone, and which version below it the
//! page is materialized at (so a reader can name the nearest LSN that
//! answers). A WAL record below the base is never looked at, like any record
//! there.
//!
//! Records after the base are never looked at, so a walk may hand over more
//! history than needed without changing the result.
//!
//! # Applying a delta
//!
//! [`apply_delta`] applies a delta's patches in order, each one copying its
//! data to its offset, so a later patch wins where two overlap. A patch
//! that ends past the end of the page first grows the page with zero bytes
//! to end exactly where the patch ends (this includes an empty patch whose
//! offset is past the end). Pages never shrink.
//!
//! # Limits
//!
//! A patch offset can be up to 4 GiB, so redo bounds every page it builds
//! by a caller-given `max_page_size` (normally
//! [`DEFAULT_MAX_VALUE_SIZE`](crate::value::DEFAULT_MAX_VALUE_SIZE)): a
//! delta that would grow the page past it, or a base already larger than
//! it, is a [`RedoError`], as is arithmetic overflow. Nothing here panics
//! on bad input. `apply_delta` checks a whole delta before changing the
//! page, so on error the page is left as it was.

use std::fmt;
use std::ops::Range;

use bytes::Bytes;

use crate::value::{Patch, Value};

/// The size of the page a `will_init` delta is applied onto: a Postgres
/// block of 8192 zero bytes.
pub const ZERO_PAGE_SIZE: usize = 8192;

/// Why redo failed: what went wrong and, from [`reconstruct_page`], in
/// which record.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {kind}", Context(*.record))]
pub struct RedoError {
    /// The position of the failing record in the newest-first sequence
    /// given to [`reconstruct_page`] (0 = newest), or `None` from
    /// [`apply_delta`], which knows nothing of records.
    pub record: Option<usize>,
    /// What went wrong.
    pub kind: RedoErrorKind,
}

/// What went wrong in redo; see [`RedoError`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RedoErrorKind {
    /// `offset + data length` of a patch does not fit in `usize`.
    #[error("patch {patch} (offset {offset}, {len} bytes) ends past the largest possible offset")]
    PatchEndOverflow {
        /// Which patch of the delta, counted from zero.
        patch: usize,
        /// Its offset.
        offset: u32,
        /// Its data length.
        len: usize,
    },
    /// A patch would grow the page past `max_page_size`.
    #[error(
        "patch {patch} (offset {offset}, {len} bytes) would grow the page to {end} bytes, past the limit of {max_page_size}"
    )]
    PatchPastLimit {
        /// Which patch of the delta, counted from zero.
        patch: usize,
        /// Its offset.
        offset: u32,
        /// Its data length.
        len: usize,
        /// Where it ends: the page length it needs.
        end: usize,
        /// The limit.
        max_page_size: usize,
    },
    /// The page to start from (the page given to [`apply_delta`], an image
    /// base, or the zero page of a `will_init` base) is already larger than
    /// `max_page_size`.
    #[error("the page is {len} bytes, past the limit of {max_page_size}")]
    PagePastLimit {
        /// The page's length.
        len: usize,
        /// The limit.
        max_page_size: usize,
    },
    /// The record's LSN is not below the LSN of the record before it, so
    /// the records are not newest first (or an LSN is repeated).
    #[error("its LSN is not below the previous record's; records must be newest first with distinct LSNs")]
    LsnNotDecreasing,
    /// The history holds PostgreSQL WAL records above its base: the page at
    /// this LSN needs PostgreSQL's redo. [`RedoError::record`] is the oldest
    /// of them.
    #[error("it is one of {wal_records} PostgreSQL WAL records only PostgreSQL's redo applies (the oldest of them)")]
    NeedsWalRedo {
        /// WAL records between the base and the LSN read at.
        wal_records: usize,
        /// The record just older than the oldest WAL record, if the history
        /// holds one that leads down to a base: the page is materialized as
        /// of its LSN.
        materialized: Option<usize>,
    },
}

/// The start of a [`RedoError`] message: where the error happened.
struct Context(Option<usize>);

impl fmt::Display for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(record) => write!(
                f,
                "cannot reconstruct page: record {record} (counting from the newest, from 0)"
            ),
            None => f.write_str("cannot apply delta"),
        }
    }
}

impl RedoError {
    fn in_record(record: usize, kind: RedoErrorKind) -> RedoError {
        RedoError {
            record: Some(record),
            kind,
        }
    }
}

/// Applies `patches`, in order, to `page`; see the [module
/// documentation](self) for the rules.
///
/// Fails if a patch's end overflows or would make the page longer than
/// `max_page_size`, or if `page` is already longer than that. On failure
/// `page` is unchanged.
pub fn apply_delta(
    page: &mut Vec<u8>,
    patches: &[Patch],
    max_page_size: usize,
) -> Result<(), RedoError> {
    let new_len = checked_len_after(page.len(), patches, max_page_size)
        .map_err(|kind| RedoError { record: None, kind })?;

    // Growing once to the final length and then copying every patch gives
    // the same bytes as growing patch by patch: the gaps are zero either
    // way, and every patch lands where it would have.
    if new_len > page.len() {
        page.resize(new_len, 0);
    }
    for patch in patches {
        // Within the page: `checked_len_after` computed every patch's end
        // without overflow and the page is now at least that long.
        let start = offset_to_usize(patch.offset);
        page[start..start + patch.data.len()].copy_from_slice(&patch.data);
    }
    Ok(())
}

/// The page length after applying `patches` to a page of `len` bytes, or
/// why they cannot be applied within `max_page_size`.
fn checked_len_after(
    len: usize,
    patches: &[Patch],
    max_page_size: usize,
) -> Result<usize, RedoErrorKind> {
    if len > max_page_size {
        return Err(RedoErrorKind::PagePastLimit { len, max_page_size });
    }
    let mut new_len = len;
    for (index, patch) in patches.iter().enumerate() {
        let range = patch_range(index, patch.offset, patch.data.len())?;
        if range.end > max_page_size {
            return Err(RedoErrorKind::PatchPastLimit {
                patch: index,
                offset: patch.offset,
                len: patch.data.len(),
                end: range.end,
                max_page_size,
            });
        }
        new_len = new_len.max(range.end);
    }
    Ok(new_len)
}

/// The bytes of the page that patch `index`, writing `len` bytes at
/// `offset`, covers.
fn patch_range(index: usize, offset: u32, len: usize) -> Result<Range<usize>, RedoErrorKind> {
    let start = offset_to_usize(offset);
    let end = start
        .checked_add(len)
        .ok_or(RedoErrorKind::PatchEndOverflow {
            patch: index,
            offset,
            len,
        })?;
    Ok(start..end)
}

/// A patch offset as a page index. Every platform this builds for has a
/// `usize` of at least 32 bits (see the assertion below).
fn offset_to_usize(offset: u32) -> usize {
    usize::try_from(offset).unwrap_or(usize::MAX)
}

// `offset_to_usize` never saturates on the platforms we build for.
const _: () = assert!(usize::BITS >= u32::BITS);

/// Reconstructs a page from the records a layer walk collected for it.
///
/// `records_newest_first` are `(lsn, value)` pairs with strictly decreasing
/// LSNs, ending at (and including) the first image or `will_init` delta;
/// anything after that base is ignored, not even read from the iterator.
/// `L` is any ordered LSN type (`utils::Lsn`, or a plain `u64`).
///
/// Returns `Ok(None)` if the records hold no base (the page does not exist
/// at that LSN), otherwise the page: the base with every newer delta
/// applied oldest to newest, as described in the [module
/// documentation](self). A lone image base is returned without copying.
///
/// Fails if the LSNs do not decrease or a page would be longer than
/// `max_page_size`; [`RedoError::record`] says which record.
pub fn reconstruct_page<'a, L, I>(
    records_newest_first: I,
    max_page_size: usize,
) -> Result<Option<Bytes>, RedoError>
where
    L: Ord + 'a,
    I: IntoIterator<Item = &'a (L, Value)>,
{
    reconstruct_with(records_newest_first, max_page_size, |_, image| {
        image.to_vec()
    })
}

/// [`reconstruct_page`] of records the caller owns and gives up: an image that deltas are
/// redone onto is taken out of `records_newest_first` (left empty there) and, when nothing else
/// shares its bytes, redone in its own buffer instead of a copy. A hot read's 8 KiB base is
/// then copied once, out of the page cache, and never again.
///
/// The same result and errors as [`reconstruct_page`]; what is left in the records serves to
/// name them in an error (their LSNs), not to reconstruct again.
pub fn reconstruct_page_taking<L: Ord>(
    records_newest_first: &mut [(L, Value)],
    max_page_size: usize,
) -> Result<Option<Bytes>, RedoError> {
    // The image a redo starts from: the first record that needs no older one, below newer
    // records that are all plain deltas (anything else there, the walk below decides).
    let base = records_newest_first.iter().position(|(_, value)| {
        !matches!(
            value,
            Value::Delta {
                will_init: false,
                ..
            }
        )
    });
    let mut taken = None;
    if let Some(at) = base.filter(|&at| at > 0) {
        if let Value::Image(image) = &mut records_newest_first[at].1 {
            if image.len() <= max_page_size {
                taken = Some((at, std::mem::take(image)));
            }
        }
    }
    reconstruct_with(
        records_newest_first.iter(),
        max_page_size,
        |at, image| match taken {
            // No copy when the bytes are a whole buffer of their own (as a hot layer read hands
            // out); a slice further into its buffer is moved to the front of it, in place.
            Some((taken_at, bytes)) if taken_at == at => Vec::from(bytes),
            _ => image.to_vec(),
        },
    )
}

/// The walk of [`reconstruct_page`]; `base_page(index, image)` is the buffer a redo onto the
/// image of record `index` starts from.
fn reconstruct_with<'a, L, I>(
    records_newest_first: I,
    max_page_size: usize,
    base_page: impl FnOnce(usize, &Bytes) -> Vec<u8>,
) -> Result<Option<Bytes>, RedoError>
where
    L: Ord + 'a,
    I: IntoIterator<Item = &'a (L, Value)>,
{
    // Deltas newer than the base, newest first, with their record index.
    let mut deltas: Vec<(usize, &[Patch])> = Vec::new();
    let mut previous_lsn: Option<&L> = None;
    // WAL records seen so far, and the index of the oldest of them.
    let mut wal_records = 0;
    let mut oldest_wal_record = 0;

    for (index, (lsn, value)) in records_newest_first.into_iter().enumerate() {
        if previous_lsn.is_some_and(|previous| lsn >= previous) {
            return Err(RedoError::in_record(index, RedoErrorKind::LsnNotDecreasing));
        }
        previous_lsn = Some(lsn);
        if wal_records > 0 && value.will_init() && !value.is_wal_record() {
            // The base below the WAL records: the page is materialized up to the version
            // below the oldest of them (the base itself, or a delta above it).
            return Err(needs_wal_redo(
                wal_records,
                oldest_wal_record,
                Some(oldest_wal_record + 1),
            ));
        }

        match value {
            Value::Image(image) => {
                if image.len() > max_page_size {
                    return Err(RedoError::in_record(
                        index,
                        RedoErrorKind::PagePastLimit {
                            len: image.len(),
                            max_page_size,
                        },
                    ));
                }
                if deltas.is_empty() {
                    return Ok(Some(image.clone()));
                }
                return redo(base_page(index, image), &deltas, max_page_size).map(Some);
            }
            Value::Delta {
                will_init: true,
                patches,
            } => {
                if ZERO_PAGE_SIZE > max_page_size {
                    return Err(RedoError::in_record(
                        index,
                        RedoErrorKind::PagePastLimit {
                            len: ZERO_PAGE_SIZE,
                            max_page_size,
                        },
                    ));
                }
                deltas.push((index, patches));
                return redo(vec![0; ZERO_PAGE_SIZE], &deltas, max_page_size).map(Some);
            }
            Value::Delta {
                will_init: false,
                patches,
            } => deltas.push((index, patches)),
            Value::WalRecord { will_init, .. } => {
                wal_records += 1;
                oldest_wal_record = index;
                if *will_init {
                    // Built from nothing by PostgreSQL's redo: no version below answers.
                    return Err(needs_wal_redo(wal_records, index, None));
                }
            }
        }
    }
    if wal_records > 0 {
        // No base below: a page that does not exist yet is not materialized either.
        return Err(needs_wal_redo(wal_records, oldest_wal_record, None));
    }
    Ok(None)
}

fn needs_wal_redo(wal_records: usize, oldest: usize, materialized: Option<usize>) -> RedoError {
    RedoError::in_record(
        oldest,
        RedoErrorKind::NeedsWalRedo {
            wal_records,
            materialized,
        },
    )
}

/// Applies `deltas_newest_first` to `page`, oldest first. The caller has
/// checked that `page` is within `max_page_size`.
fn redo(
    mut page: Vec<u8>,
    deltas_newest_first: &[(usize, &[Patch])],
    max_page_size: usize,
) -> Result<Bytes, RedoError> {
    for (index, patches) in deltas_newest_first.iter().rev() {
        apply_delta(&mut page, patches, max_page_size).map_err(|e| RedoError {
            record: Some(*index),
            kind: e.kind,
        })?;
    }
    Ok(Bytes::from(page))
}

#[cfg(test)]
mod tests;
