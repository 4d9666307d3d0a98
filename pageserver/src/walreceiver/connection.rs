//! A physical replication connection to a PostgreSQL primary, over a blocking socket on the
//! receiver's own thread: startup with `replication=true`, authentication (trust, cleartext,
//! MD5, SCRAM-SHA-256), the simple queries of the replication protocol, and the CopyBoth
//! stream of `START_REPLICATION`.
//!
//! Messages are framed here, and every length is bounded before anything is allocated for it
//! ([`MAX_MESSAGE_LEN`]): a primary (or whatever answers at its address) cannot make us hold
//! more. `postgres-protocol` encodes what we send and runs SCRAM.

use std::io::{self, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{BufMut, Bytes, BytesMut};
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256, SCRAM_SHA_256};
use postgres_protocol::message::{backend, frontend};
use utils::Lsn;

use super::connstr::ConnString;
use super::tls::{self, Transport};
use super::ReceiverError;

/// The longest the setup (login and the commands before streaming) may take.
const SETUP_DEADLINE: Duration = Duration::from_secs(30);

/// The longest message accepted: an XLogData message carries at most 128 KiB of WAL; other
/// answers of the replication protocol are small.
pub const MAX_MESSAGE_LEN: usize = 1 << 20;

/// What `IDENTIFY_SYSTEM` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SystemIdentity {
    pub system_id: u64,
    pub timeline: u32,
    pub xlogpos: Lsn,
}

/// A message of the CopyBoth stream.
pub enum StreamMessage {
    /// `w`: WAL from `start`; the primary's WAL ends at `wal_end`.
    XLogData {
        start: Lsn,
        wal_end: Lsn,
        data: Bytes,
    },
    /// `k`: the primary's WAL end, and whether it wants an answer now.
    Keepalive { wal_end: Lsn, reply_requested: bool },
    /// `c`: the primary ended the stream (a timeline switch, or a shutdown).
    CopyDone,
}

pub struct ReplicationConnection {
    stream: Transport,
    read_buf: BytesMut,
    write_buf: BytesMut,
    /// Until streaming starts, every answer must come before this: a primary (or whatever
    /// answers at its address) that trickles bytes, or sends notices without end, cannot keep
    /// the receiver in its setup, where it does not look at its stop flag.
    setup_deadline: Instant,
    /// ...and each read of the setup waits at most this long (`connect`'s timeout).
    step_timeout: Duration,
}

impl ReplicationConnection {
    /// Connects and authenticates as `application_name`, within `timeout` for each step.
    pub fn connect(
        conn: &ConnString,
        application_name: &str,
        timeout: Duration,
    ) -> Result<ReplicationConnection, ReceiverError> {
        let addr = (conn.host.as_str(), conn.port)
            .to_socket_addrs()
            .map_err(|e| ReceiverError::Connect(format!("{}:{}: {e}", conn.host, conn.port)))?
            .next()
            .ok_or_else(|| ReceiverError::Connect(format!("{} has no address", conn.host)))?;
        let tcp = TcpStream::connect_timeout(&addr, timeout)
            .map_err(|e| ReceiverError::Connect(format!("{addr}: {e}")))?;
        tcp.set_nodelay(true).map_err(ReceiverError::io)?;
        tcp.set_read_timeout(Some(timeout))
            .map_err(ReceiverError::io)?;
        tcp.set_write_timeout(Some(timeout))
            .map_err(ReceiverError::io)?;
        let setup_deadline = Instant::now() + SETUP_DEADLINE;
        let stream = tls::negotiate(tcp, conn, setup_deadline)?;
        let mut c = ReplicationConnection {
            stream,
            read_buf: BytesMut::with_capacity(64 << 10),
            write_buf: BytesMut::new(),
            setup_deadline,
            step_timeout: timeout,
        };
        let mut params = vec![
            ("user", conn.user.as_str()),
            ("replication", "true"),
            ("application_name", application_name),
        ];
        if let Some(db) = &conn.dbname {
            params.push(("database", db.as_str()));
        }
        frontend::startup_message(params.iter().copied(), &mut c.write_buf)
            .map_err(ReceiverError::io)?;
        c.send()?;
        c.authenticate(conn)?;
        // Parameter statuses and the key data, up to ReadyForQuery.
        loop {
            match c.read_message()? {
                Backend::Parsed(backend::Message::ReadyForQuery(_)) => return Ok(c),
                Backend::Parsed(backend::Message::ErrorResponse(e)) => {
                    return Err(server_error(&e))
                }
                _ => {}
            }
        }
    }

    fn authenticate(&mut self, conn: &ConnString) -> Result<(), ReceiverError> {
        let password = || {
            conn.password.as_deref().ok_or_else(|| {
                ReceiverError::Auth(
                    "the primary asks for a password; the connection string has none".to_owned(),
                )
            })
        };
        let mut scram: Option<ScramSha256> = None;
        loop {
            match self.read_message()? {
                Backend::Parsed(backend::Message::AuthenticationOk) => return Ok(()),
                Backend::Parsed(backend::Message::AuthenticationCleartextPassword) => {
                    frontend::password_message(password()?.as_bytes(), &mut self.write_buf)
                        .map_err(ReceiverError::io)?;
                    self.send()?;
                }
                Backend::Parsed(backend::Message::AuthenticationMd5Password(body)) => {
                    let hash = postgres_protocol::authentication::md5_hash(
                        conn.user.as_bytes(),
                        password()?.as_bytes(),
                        body.salt(),
                    );
                    frontend::password_message(hash.as_bytes(), &mut self.write_buf)
                        .map_err(ReceiverError::io)?;
                    self.send()?;
                }
                Backend::Parsed(backend::Message::AuthenticationSasl(body)) => {
                    let mut mechanisms = body.mechanisms();
                    let mut offered = false;
                    while let Some(m) = fallible_next(&mut mechanisms)? {
                        offered |= m == SCRAM_SHA_256;
                    }
                    if !offered {
                        return Err(ReceiverError::Auth(
                            "the primary offers no SASL mechanism we speak (SCRAM-SHA-256)".to_owned(),
                        ));
                    }
                    let s = ScramSha256::new(password()?.as_bytes(), ChannelBinding::unsupported());
                    frontend::sasl_initial_response(SCRAM_SHA_256, s.message(), &mut self.write_buf)
                        .map_err(ReceiverError::io)?;
                    self.send()?;
                    scram = Some(s);
                }
                Backend::Parsed(backend::Message::AuthenticationSaslContinue(body)) => {
                    let s = scram.as_mut().ok_or_else(|| protocol("SASL continue before SASL"))?;
                    s.update(body.data())
                        .map_err(|e| ReceiverError::Auth(format!("SCRAM: {e}")))?;
                    frontend::sasl_response(s.message(), &mut self.write_buf)
                        .map_err(ReceiverError::io)?;
                    self.send()?;
                }
                Backend::Parsed(backend::Message::AuthenticationSaslFinal(body)) => {
                    let s = scram.as_mut().ok_or_else(|| protocol("SASL final before SASL"))?;
                    s.finish(body.data())
                        .map_err(|e| ReceiverError::Auth(format!("SCRAM: the primary's proof does not check: {e}")))?;
                }
                Backend::Parsed(backend::Message::ErrorResponse(e)) => return Err(server_error(&e)),
                Backend::Parsed(_) | Backend::CopyBothResponse => {
                    return Err(ReceiverError::Auth(
                        "the primary asks for an authentication method we do not speak (GSSAPI or SSPI)".to_owned(),
                    ))
                }
            }
        }
    }

    /// Runs `sql` (a replication command); its rows, each column as text or NULL.
    pub fn simple_query(&mut self, sql: &str) -> Result<Vec<Vec<Option<String>>>, ReceiverError> {
        Ok(self
            .raw_query(sql)?
            .into_iter()
            .map(|row| {
                row.into_iter()
                    .map(|v| v.map(|b| String::from_utf8_lossy(&b).into_owned()))
                    .collect()
            })
            .collect())
    }

    /// Runs `sql`; its rows, each column's bytes as sent, or NULL.
    fn raw_query(&mut self, sql: &str) -> Result<Vec<Vec<Option<Bytes>>>, ReceiverError> {
        frontend::query(sql, &mut self.write_buf).map_err(ReceiverError::io)?;
        self.send()?;
        self.read_rows()
    }

    /// The rows of an answer, up to its ReadyForQuery.
    fn read_rows(&mut self) -> Result<Vec<Vec<Option<Bytes>>>, ReceiverError> {
        let mut rows = Vec::new();
        let mut error = None;
        loop {
            match self.read_message()? {
                Backend::Parsed(backend::Message::DataRow(row)) => {
                    let buf = row.buffer();
                    let mut values = Vec::new();
                    let mut ranges = row.ranges();
                    while let Some(range) = fallible_next(&mut ranges)? {
                        values.push(range.map(|r| Bytes::copy_from_slice(&buf[r])));
                    }
                    rows.push(values);
                }
                Backend::Parsed(backend::Message::ErrorResponse(e)) => {
                    error = Some(server_error(&e))
                }
                Backend::Parsed(backend::Message::ReadyForQuery(_)) => {
                    return match error {
                        Some(e) => Err(e),
                        None => Ok(rows),
                    }
                }
                Backend::CopyBothResponse => {
                    return Err(protocol("a COPY stream in answer to a plain command"))
                }
                _ => {}
            }
        }
    }

    /// Whether the connection is encrypted.
    pub fn is_tls(&self) -> bool {
        self.stream.is_tls()
    }

    /// `TIMELINE_HISTORY`: the history file of timeline `tli`, as the primary has it.
    pub fn timeline_history(&mut self, tli: u32) -> Result<Bytes, ReceiverError> {
        let rows = self.raw_query(&format!("TIMELINE_HISTORY {tli}"))?;
        let row = rows
            .first()
            .ok_or_else(|| protocol("TIMELINE_HISTORY answered no row"))?;
        let expected = postgres_wal::segment::history_file_name(tli);
        match (row.first(), row.get(1)) {
            (Some(Some(name)), Some(Some(content))) if name[..] == *expected.as_bytes() => {
                if content.len() > postgres_wal::history::MAX_HISTORY_LEN {
                    return Err(protocol(&format!(
                        "a history file of {} bytes for timeline {tli}",
                        content.len()
                    )));
                }
                Ok(content.clone())
            }
            (Some(Some(name)), Some(Some(_))) => Err(protocol(&format!(
                "TIMELINE_HISTORY {tli} answered the file {:?}",
                String::from_utf8_lossy(name)
            ))),
            _ => Err(protocol("TIMELINE_HISTORY answered too few columns")),
        }
    }

    /// The primary ended the stream of a timeline that is not its newest (it sent CopyDone):
    /// ends ours, and reads which timeline comes next and where it begins.
    pub fn end_of_timeline(&mut self) -> Result<(u32, Lsn), ReceiverError> {
        frontend::copy_done(&mut self.write_buf);
        self.send()?;
        // A setup again, as bounded as the first one.
        self.setup_deadline = Instant::now() + SETUP_DEADLINE;
        let rows = self.read_rows()?;
        let row = rows.first().ok_or_else(|| {
            protocol("the stream of a timeline ended without naming the next timeline")
        })?;
        let field = |i: usize| {
            row.get(i)
                .and_then(|v| v.as_deref())
                .and_then(|b| std::str::from_utf8(b).ok())
                .ok_or_else(|| protocol("the next timeline's row has too few columns"))
        };
        let tli = field(0)?
            .parse()
            .map_err(|_| protocol("the next timeline is not a number"))?;
        let start = field(1)?
            .parse()
            .map_err(|_| protocol("the next timeline's start is not an LSN"))?;
        Ok((tli, start))
    }

    pub fn identify_system(&mut self) -> Result<SystemIdentity, ReceiverError> {
        let rows = self.simple_query("IDENTIFY_SYSTEM")?;
        let row = rows
            .first()
            .ok_or_else(|| protocol("IDENTIFY_SYSTEM answered no row"))?;
        let field = |i: usize| {
            row.get(i)
                .and_then(|v| v.as_deref())
                .ok_or_else(|| protocol("IDENTIFY_SYSTEM answered too few columns"))
        };
        Ok(SystemIdentity {
            system_id: field(0)?
                .parse()
                .map_err(|_| protocol("IDENTIFY_SYSTEM: the system identifier is not a number"))?,
            timeline: field(1)?
                .parse()
                .map_err(|_| protocol("IDENTIFY_SYSTEM: the timeline is not a number"))?,
            xlogpos: field(2)?
                .parse()
                .map_err(|_| protocol("IDENTIFY_SYSTEM: the WAL position is not an LSN"))?,
        })
    }

    /// Creates physical slot `name`, reserving WAL from now; `false` if it exists.
    pub fn create_slot(&mut self, name: &str) -> Result<bool, ReceiverError> {
        match self.simple_query(&format!(
            "CREATE_REPLICATION_SLOT {name} PHYSICAL RESERVE_WAL"
        )) {
            Ok(_) => Ok(true),
            Err(ReceiverError::Server { code, .. }) if code == "42710" => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub fn drop_slot(&mut self, name: &str) -> Result<(), ReceiverError> {
        match self.simple_query(&format!("DROP_REPLICATION_SLOT {name}")) {
            Ok(_) => Ok(()),
            // Already gone.
            Err(ReceiverError::Server { code, .. }) if code == "42704" => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// `START_REPLICATION` from `start` on timeline `tli`, through `slot`.
    pub fn start_replication(
        &mut self,
        slot: &str,
        start: Lsn,
        tli: u32,
    ) -> Result<(), ReceiverError> {
        let sql = format!("START_REPLICATION SLOT {slot} PHYSICAL {start} TIMELINE {tli}");
        frontend::query(&sql, &mut self.write_buf).map_err(ReceiverError::io)?;
        self.send()?;
        loop {
            match self.read_message()? {
                Backend::CopyBothResponse => return Ok(()),
                Backend::Parsed(backend::Message::ErrorResponse(e)) => {
                    let e = server_error(&e);
                    // The ReadyForQuery that follows an error is left unread: the connection
                    // is dropped.
                    return Err(e);
                }
                _ => {}
            }
        }
    }

    /// The next message of the stream; `Ok(None)` when nothing came within `wait`.
    pub fn next_stream_message(
        &mut self,
        wait: Duration,
    ) -> Result<Option<StreamMessage>, ReceiverError> {
        let Some(message) = self.read_message_within(wait)? else {
            return Ok(None);
        };
        match message {
            Backend::Parsed(backend::Message::CopyData(body)) => {
                let data = body.into_bytes();
                match data.first() {
                    Some(b'w') if data.len() >= 25 => Ok(Some(StreamMessage::XLogData {
                        start: Lsn(u64::from_be_bytes(data[1..9].try_into().expect("8 bytes"))),
                        wal_end: Lsn(u64::from_be_bytes(data[9..17].try_into().expect("8 bytes"))),
                        data: data.slice(25..),
                    })),
                    Some(b'k') if data.len() >= 18 => Ok(Some(StreamMessage::Keepalive {
                        wal_end: Lsn(u64::from_be_bytes(data[1..9].try_into().expect("8 bytes"))),
                        reply_requested: data[17] != 0,
                    })),
                    _ => Err(protocol(
                        "a stream message that is neither WAL ('w') nor a keepalive ('k')",
                    )),
                }
            }
            Backend::Parsed(backend::Message::CopyDone) => Ok(Some(StreamMessage::CopyDone)),
            // A walsender that shuts down ends the command at once, with no CopyDone.
            Backend::Parsed(backend::Message::CommandComplete(_)) => Err(ReceiverError::Connect(
                "the primary ended the stream: it shuts down".to_owned(),
            )),
            Backend::Parsed(backend::Message::ErrorResponse(e)) => Err(server_error(&e)),
            // Asynchronous: a notice, or a setting the server reports changed (a reload).
            Backend::Parsed(
                backend::Message::NoticeResponse(_) | backend::Message::ParameterStatus(_),
            ) => Ok(None),
            Backend::Parsed(other) => Err(protocol(&format!(
                "an unexpected message in the WAL stream ({})",
                message_name(&other)
            ))),
            Backend::CopyBothResponse => Err(protocol(
                "an unexpected message in the WAL stream (CopyBothResponse)",
            )),
        }
    }

    /// Sends a standby status update: `write`, `flush` and `apply` LSNs (each just past the
    /// last byte), and asks for no reply.
    pub fn send_status(
        &mut self,
        write: Lsn,
        flush: Lsn,
        apply: Lsn,
        reply_requested: bool,
    ) -> Result<(), ReceiverError> {
        let mut body = BytesMut::with_capacity(34);
        body.put_u8(b'r');
        body.put_u64(write.0);
        body.put_u64(flush.0);
        body.put_u64(apply.0);
        body.put_i64(postgres_now());
        body.put_u8(u8::from(reply_requested));
        self.write_buf.put_u8(b'd');
        self.write_buf.put_i32(4 + body.len() as i32);
        self.write_buf.extend_from_slice(&body);
        self.send()
    }

    fn send(&mut self) -> Result<(), ReceiverError> {
        self.stream
            .write_all(&self.write_buf)
            .and_then(|()| self.stream.flush())
            .map_err(ReceiverError::io)?;
        self.write_buf.clear();
        Ok(())
    }

    fn read_message(&mut self) -> Result<Backend, ReceiverError> {
        loop {
            if let Some(m) = self.parse_buffered()? {
                return Ok(m);
            }
            let left = self
                .setup_deadline
                .saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ReceiverError::Connect(format!(
                    "the primary did not get through the setup within {SETUP_DEADLINE:?}"
                )));
            }
            let wait = left.min(self.step_timeout);
            self.stream
                .tcp()
                .set_read_timeout(Some(wait))
                .map_err(ReceiverError::io)?;
            let filled = self.fill();
            if timed_out(&filled) {
                return Err(ReceiverError::Connect(format!(
                    "the primary sent nothing for {wait:?} while setting up"
                )));
            }
            filled?;
        }
    }

    /// Sends `sql` (a replication command) without reading its answer.
    pub(super) fn send_query(&mut self, sql: &str) -> Result<(), ReceiverError> {
        frontend::query(sql, &mut self.write_buf).map_err(ReceiverError::io)?;
        self.send()
    }

    /// The next message, however long the whole answer takes, as long as no read waits
    /// longer than `idle` (a base backup: the primary sends as it reads its files).
    pub(super) fn next_message_idle(&mut self, idle: Duration) -> Result<Backend, ReceiverError> {
        self.stream
            .tcp()
            .set_read_timeout(Some(idle))
            .map_err(ReceiverError::io)?;
        loop {
            if let Some(m) = self.parse_buffered()? {
                return Ok(m);
            }
            let filled = self.fill();
            if timed_out(&filled) {
                return Err(ReceiverError::Connect(format!(
                    "the primary sent nothing for {idle:?}"
                )));
            }
            filled?;
        }
    }

    /// A message, or `None` if none came within `wait`.
    fn read_message_within(&mut self, wait: Duration) -> Result<Option<Backend>, ReceiverError> {
        if let Some(m) = self.parse_buffered()? {
            return Ok(Some(m));
        }
        // Nothing to wait for: only what the socket already holds (a read timeout of zero is
        // not allowed, and the smallest one would cost every burst that much latency).
        let nonblocking = wait.is_zero();
        if nonblocking {
            self.stream
                .tcp()
                .set_nonblocking(true)
                .map_err(ReceiverError::io)?;
        } else {
            self.stream
                .tcp()
                .set_read_timeout(Some(wait))
                .map_err(ReceiverError::io)?;
        }
        let filled = self.fill();
        if nonblocking {
            self.stream
                .tcp()
                .set_nonblocking(false)
                .map_err(ReceiverError::io)?;
        }
        if timed_out(&filled) {
            return Ok(None);
        }
        filled?;
        self.parse_buffered()
    }

    fn fill(&mut self) -> Result<(), ReceiverError> {
        if !self
            .stream
            .fill_into(&mut self.read_buf)
            .map_err(ReceiverError::Io)?
        {
            return Err(ReceiverError::Connect(
                "the primary closed the connection".to_owned(),
            ));
        }
        Ok(())
    }

    /// One whole message from the buffer, if one is in it; its length checked first.
    fn parse_buffered(&mut self) -> Result<Option<Backend>, ReceiverError> {
        if self.read_buf.len() < 5 {
            return Ok(None);
        }
        let len = u32::from_be_bytes(self.read_buf[1..5].try_into().expect("4 bytes")) as usize;
        if !(4..=MAX_MESSAGE_LEN).contains(&len) {
            return Err(protocol(&format!(
                "a message of {len} bytes (the most accepted is {MAX_MESSAGE_LEN})"
            )));
        }
        if self.read_buf.len() < len + 1 {
            return Ok(None);
        }
        if self.read_buf[0] == b'W' {
            let _ = self.read_buf.split_to(len + 1);
            return Ok(Some(Backend::CopyBothResponse));
        }
        match backend::Message::parse(&mut self.read_buf) {
            Ok(Some(m)) => Ok(Some(Backend::Parsed(m))),
            Ok(None) => Ok(None),
            Err(e) => Err(protocol(&format!("a message that does not parse: {e}"))),
        }
    }
}

pub(super) enum Backend {
    Parsed(backend::Message),
    /// `W`, which `postgres-protocol` does not know.
    CopyBothResponse,
}

pub(super) fn fallible_next<I: fallible_iterator::FallibleIterator<Error = io::Error>>(
    iter: &mut I,
) -> Result<Option<I::Item>, ReceiverError> {
    iter.next().map_err(|e| protocol(&e.to_string()))
}

/// Whether a read came back empty because its timeout passed (or, non-blocking, because the
/// socket held nothing).
fn timed_out(result: &Result<(), ReceiverError>) -> bool {
    matches!(result, Err(ReceiverError::Io(e))
        if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut))
}

/// The name of a message, for errors.
fn message_name(message: &backend::Message) -> &'static str {
    match message {
        backend::Message::AuthenticationOk => "AuthenticationOk",
        backend::Message::BackendKeyData(_) => "BackendKeyData",
        backend::Message::CommandComplete(_) => "CommandComplete",
        backend::Message::CopyInResponse(_) => "CopyInResponse",
        backend::Message::CopyOutResponse(_) => "CopyOutResponse",
        backend::Message::DataRow(_) => "DataRow",
        backend::Message::EmptyQueryResponse => "EmptyQueryResponse",
        backend::Message::NotificationResponse(_) => "NotificationResponse",
        backend::Message::ReadyForQuery(_) => "ReadyForQuery",
        backend::Message::RowDescription(_) => "RowDescription",
        _ => "another message",
    }
}

pub(super) fn protocol(what: &str) -> ReceiverError {
    ReceiverError::Protocol(what.to_owned())
}

pub(super) fn server_error(body: &backend::ErrorResponseBody) -> ReceiverError {
    let mut code = String::new();
    let mut message = String::new();
    let mut fields = body.fields();
    while let Ok(Some(field)) = fallible_iterator::FallibleIterator::next(&mut fields) {
        match field.type_() {
            b'C' => code = String::from_utf8_lossy(field.value_bytes()).into_owned(),
            b'M' => message = String::from_utf8_lossy(field.value_bytes()).into_owned(),
            _ => {}
        }
    }
    ReceiverError::Server { code, message }
}

/// Microseconds since 2000-01-01 UTC, the replication protocol's clock.
fn postgres_now() -> i64 {
    let unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64);
    unix - postgres_wal::xact::POSTGRES_EPOCH_UNIX_MICROS
}
