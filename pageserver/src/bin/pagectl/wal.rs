//! `pagectl wal`: the records of WAL segment files, one line each, as the page server's decoder
//! reads and checks them (`postgres_wal`), in the fields `pg_waldump` prints, so the two can be
//! compared line by line. With `--blocks`, each record's block references follow it, one line
//! each in `pg_waldump --bkp-details`'s words; every full-page image is restored to its page
//! (decompressed, its hole filled) and checked against the page header it carries.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use postgres_wal::image::{restore_page, Compression};
use postgres_wal::page::{PageHeader, LONG_HEADER_LEN};
use postgres_wal::record::{parse_parts, rmgr_name, BlockRef};
use postgres_wal::xact::xact_end;
use postgres_wal::{segment, Lsn, WalDecoder, XLOG_PAGE_MAGIC};

use crate::Error;

#[derive(Args)]
pub struct WalArgs {
    /// Segment files, consecutive, in order (as `pg_wal/` holds them).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Each record's block references too, and every full-page image restored and checked.
    #[arg(long)]
    blocks: bool,
}

/// Prints every record of `args.files`, then where the WAL ends and why.
pub fn wal(args: WalArgs, out: &mut impl Write) -> Result<(), Error> {
    let mut decoder: Option<WalDecoder> = None;
    for path in &args.files {
        let bytes = std::fs::read(path).map_err(|e| Error::Path {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let decoder = match &mut decoder {
            Some(decoder) => decoder,
            None => {
                let bad = |message: String| Error::Path {
                    path: path.clone(),
                    message,
                };
                if bytes.len() < LONG_HEADER_LEN {
                    return Err(bad("too short for a WAL segment".to_owned()));
                }
                let start = Lsn(u64::from_le_bytes(
                    bytes[8..16].try_into().expect("8 bytes"),
                ));
                let size = u32::from_le_bytes(bytes[32..36].try_into().expect("4 bytes"));
                if !segment::is_valid_segment_size(size) {
                    return Err(bad(format!("segment size {size} in its header")));
                }
                PageHeader::decode(&bytes, start, size, XLOG_PAGE_MAGIC).map_err(bad)?;
                decoder.insert(WalDecoder::new(start, size))
            }
        };
        decoder.feed(&bytes);
        loop {
            match decoder.next_record() {
                Ok(Some(record)) => {
                    let h = &record.header;
                    let parts = parse_parts(&record.bytes).map_err(|e| Error::Path {
                        path: path.clone(),
                        message: format!("the record at {}: {e}", record.start),
                    })?;
                    let tot = record.bytes.len();
                    let mut line = format!(
                        "rmgr={} len={}/{} tx={} lsn={} prev={} info={:#04x} blocks={}",
                        rmgr_name(h.rmid),
                        tot - parts.image_bytes(),
                        tot,
                        h.xid,
                        record.start,
                        h.prev,
                        h.info,
                        parts.blocks.len()
                    );
                    if let Ok(Some(end)) = xact_end(&record) {
                        line.push_str(&format!(
                            " {} at={}",
                            if end.kind.is_commit() {
                                "commit"
                            } else {
                                "abort"
                            },
                            end.unix_micros()
                        ));
                    }
                    writeln!(out, "{line}")?;
                    if args.blocks {
                        for block in &parts.blocks {
                            let line =
                                block_line(block, &record.bytes).map_err(|e| Error::Path {
                                    path: path.clone(),
                                    message: format!("the record at {}: {e}", record.start),
                                })?;
                            writeln!(out, "{line}")?;
                        }
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    writeln!(out, "end={} ({e})", decoder.valid_end())?;
                    return Ok(());
                }
            }
        }
    }
    if let Some(decoder) = decoder {
        writeln!(out, "end={} (the end of the files)", decoder.valid_end())?;
    }
    Ok(())
}

/// PostgreSQL's fork names.
const FORKS: [&str; 4] = ["main", "fsm", "vm", "init"];

/// A block reference as `pg_waldump --bkp-details` prints it; its image restored and checked.
fn block_line(block: &BlockRef, record: &[u8]) -> Result<String, String> {
    let fork = FORKS
        .get(usize::from(block.fork))
        .ok_or_else(|| format!("block reference {}: fork {}", block.id, block.fork))?;
    let rel = block.rel;
    let mut line = format!(
        "\tblkref #{}: rel {}/{}/{} fork {fork} blk {}",
        block.id, rel.spcnode, rel.dbnode, rel.relnode, block.block
    );
    let Some(image) = block.image else {
        return Ok(line);
    };
    let bytes = record.get(block.image_range.clone()).ok_or_else(|| {
        format!(
            "block reference {}: its image is outside the record",
            block.id
        )
    })?;
    let page =
        restore_page(&image, bytes).map_err(|e| format!("block reference {}: {e}", block.id))?;
    // A standard page's hole is its free space: the header says where it is.
    let lower = u16::from_le_bytes([page[12], page[13]]);
    let upper = u16::from_le_bytes([page[14], page[15]]);
    if image.hole_len > 0
        && (lower, upper) != (image.hole_offset, image.hole_offset + image.hole_len)
    {
        return Err(format!(
            "block reference {}: the restored page's free space is {lower}..{upper}, the image's hole {}..{}",
            block.id,
            image.hole_offset,
            image.hole_offset + image.hole_len
        ));
    }
    let verification = if image.apply() {
        ""
    } else {
        " for WAL verification"
    };
    line.push_str(&format!(
        " (FPW{verification}); hole: offset: {}, length: {}",
        image.hole_offset, image.hole_len
    ));
    let method = Compression::of(&image);
    if method != Compression::None {
        // As PostgreSQL computes it, in 32 bits: an image that saved nothing wraps.
        let saved = (postgres_wal::BLCKSZ as u32)
            .wrapping_sub(u32::from(image.hole_len))
            .wrapping_sub(u32::from(image.len));
        line.push_str(&format!(
            ", compression saved: {saved}, method: {}",
            method.name()
        ));
    }
    Ok(line)
}
