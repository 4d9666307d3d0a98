//! `pagectl wal`: the records of WAL segment files, one line each, as the page server's decoder
//! reads and checks them (`postgres_wal`), in the fields `pg_waldump` prints, so the two can be
//! compared line by line.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use postgres_wal::page::{PageHeader, LONG_HEADER_LEN};
use postgres_wal::record::{parse_parts, rmgr_name};
use postgres_wal::xact::xact_end;
use postgres_wal::{segment, Lsn, WalDecoder, XLOG_PAGE_MAGIC};

use crate::Error;

#[derive(Args)]
pub struct WalArgs {
    /// Segment files, consecutive, in order (as `pg_wal/` holds them).
    #[arg(required = true)]
    files: Vec<PathBuf>,
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
