//! A base backup taken over the replication connection (`BASE_BACKUP`, PostgreSQL 15's form),
//! for a timeline that has no snapshot yet: the primary's tar archive of its data directory,
//! with the WAL that makes it consistent (`WAL true`, what `pg_basebackup -X fetch` asks for),
//! read as the server sends it into the import (`datadir::import`), which takes it all or
//! nothing.
//!
//! The answer: a row with the start position, the tablespaces, then one COPY stream whose
//! messages each begin with a kind byte (`n` a new archive with its name and tablespace, `d`
//! its data, `p` progress, `m` a manifest, not asked for), then a row with the end position.
//! Only the main data directory is taken: a cluster with tablespaces of its own is refused.
//! No read may wait longer than [`IDLE_TIMEOUT`]; the slot, created before, keeps the WAL from
//! the backup's start until streaming starts there.

use std::io::{self, Read};
use std::time::Duration;

use bytes::Bytes;
use postgres_protocol::message::backend;
use utils::Lsn;

use super::connection::{fallible_next, protocol, server_error, Backend, ReplicationConnection};
use super::ReceiverError;
use crate::datadir::{import_archive, ImportReport};
use crate::tenant::timeline::Timeline;

/// The longest the primary may send nothing while it takes the backup (its checkpoint is
/// asked to be fast).
const IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// Takes a base backup of the primary into `timeline` (see the module documentation).
pub fn take_base_backup(
    conn: &mut ReplicationConnection,
    timeline: &Timeline,
) -> Result<ImportReport, ReceiverError> {
    conn.send_query(
        "BASE_BACKUP (LABEL 'pageserver', CHECKPOINT 'fast', WAL true, WAIT false, MANIFEST 'no')",
    )?;
    let tablespaces = read_until_copy(conn)?;
    if tablespaces > 0 {
        return Err(ReceiverError::Refused(format!(
            "the primary has {tablespaces} tablespace(s) outside its data directory, which a base backup into a timeline does not take"
        )));
    }
    let mut stream = ArchiveStream {
        conn,
        current: Bytes::new(),
        archives: 0,
        done: false,
        failure: None,
    };
    // On an error the connection is dropped: nothing more is read of the backup.
    let imported = import_archive(timeline, &mut stream, None);
    if let Some(e) = stream.failure.take() {
        return Err(e);
    }
    let report = imported.map_err(|e| {
        ReceiverError::Refused(format!("the primary's base backup did not import: {e}"))
    })?;
    // What the import did not read (the archive's last zero blocks), and the end position.
    stream.finish()?;
    Ok(report)
}

/// Reads the answer up to its COPY stream; the number of tablespaces besides the data
/// directory.
fn read_until_copy(conn: &mut ReplicationConnection) -> Result<usize, ReceiverError> {
    let mut result_sets = 0;
    let mut tablespaces = 0;
    loop {
        match conn.next_message_idle(IDLE_TIMEOUT)? {
            // The second result set lists the tablespaces, the data directory as a row whose
            // OID is NULL.
            Backend::Parsed(backend::Message::DataRow(row)) if result_sets == 1 => {
                let mut ranges = row.ranges();
                if fallible_next(&mut ranges)?.flatten().is_some() {
                    tablespaces += 1;
                }
            }
            Backend::Parsed(backend::Message::CommandComplete(_)) => result_sets += 1,
            Backend::Parsed(backend::Message::CopyOutResponse(_)) => return Ok(tablespaces),
            Backend::Parsed(backend::Message::ErrorResponse(e)) => return Err(server_error(&e)),
            Backend::Parsed(backend::Message::ReadyForQuery(_)) => {
                return Err(protocol("BASE_BACKUP ended before its archive"))
            }
            Backend::CopyBothResponse => {
                return Err(protocol("a COPY BOTH stream in answer to BASE_BACKUP"))
            }
            _ => {}
        }
    }
}

/// The data of the backup's one archive, as `Read`.
struct ArchiveStream<'c> {
    conn: &'c mut ReplicationConnection,
    current: Bytes,
    archives: usize,
    done: bool,
    /// Why the stream failed, for the caller (the import only sees an I/O error).
    failure: Option<ReceiverError>,
}

impl ArchiveStream<'_> {
    /// The next bytes of the archive; `None` at the end of the COPY stream.
    fn next_data(&mut self) -> Result<Option<Bytes>, ReceiverError> {
        loop {
            if self.done {
                return Ok(None);
            }
            match self.conn.next_message_idle(IDLE_TIMEOUT)? {
                Backend::Parsed(backend::Message::CopyData(body)) => {
                    let data = body.into_bytes();
                    match data.first() {
                        Some(b'n') => {
                            self.archives += 1;
                            if self.archives > 1 {
                                return Err(ReceiverError::Refused(
                                    "the base backup has a second archive (a tablespace), which a timeline does not take".to_owned(),
                                ));
                            }
                        }
                        Some(b'd') if self.archives == 1 => return Ok(Some(data.slice(1..))),
                        Some(b'p') => {}
                        Some(kind) => {
                            return Err(protocol(&format!(
                            "a base backup message of kind {:?} where archive data was expected",
                            *kind as char
                        )))
                        }
                        None => return Err(protocol("an empty base backup message")),
                    }
                }
                Backend::Parsed(backend::Message::CopyDone) => self.done = true,
                Backend::Parsed(backend::Message::ErrorResponse(e)) => {
                    return Err(server_error(&e))
                }
                Backend::Parsed(backend::Message::NoticeResponse(_)) => {}
                _ => return Err(protocol("a message other than COPY data in a base backup")),
            }
        }
    }

    /// Reads what is left of the stream and the answer after it, up to ReadyForQuery.
    fn finish(&mut self) -> Result<(), ReceiverError> {
        while self.next_data()?.is_some() {}
        let mut end: Option<Lsn> = None;
        loop {
            match self.conn.next_message_idle(IDLE_TIMEOUT)? {
                Backend::Parsed(backend::Message::DataRow(row)) => {
                    let buf = row.buffer();
                    let mut ranges = row.ranges();
                    if let Some(Some(r)) = fallible_next(&mut ranges)? {
                        end = String::from_utf8_lossy(&buf[r]).parse().ok();
                    }
                }
                Backend::Parsed(backend::Message::ErrorResponse(e)) => {
                    return Err(server_error(&e))
                }
                Backend::Parsed(backend::Message::ReadyForQuery(_)) => break,
                _ => {}
            }
        }
        tracing::info!(
            end = %end.map_or_else(|| "unknown".to_owned(), |l| l.to_string()),
            "the base backup ended"
        );
        Ok(())
    }
}

impl Read for ArchiveStream<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            if self.failure.is_some() {
                return Err(io::Error::other("the base backup stream failed"));
            }
            match self.next_data() {
                Ok(Some(data)) => self.current = data,
                Ok(None) => return Ok(0),
                Err(e) => {
                    let message = e.to_string();
                    self.failure = Some(e);
                    return Err(io::Error::other(message));
                }
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        let _ = self.current.split_to(n);
        Ok(n)
    }
}
