//! The replication client against a hostile "primary": a fake server on 127.0.0.1 that lies in
//! the ways a broken or malicious peer can. Each lie ends in a clear error within its bound,
//! never an allocation the peer chose, a hang or a half-imported timeline.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use utils::{TenantId, TimelineId};

use super::base_backup::take_base_backup;
use super::connection::ReplicationConnection;
use super::connstr::ConnString;
use super::ReceiverError;
use crate::tenant::test_support::small_cache;
use crate::tenant::timeline::{Timeline, TimelineConf};

/// A backend message: its type byte, its length, its body.
fn message(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![kind];
    out.extend_from_slice(&(4 + body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
    out
}

fn auth_ok_and_ready() -> Vec<u8> {
    let mut out = message(b'R', &0u32.to_be_bytes());
    out.extend(message(b'Z', b"I"));
    out
}

/// Reads the client's startup message (a length, then that many bytes less four), after
/// declining its request for TLS (`sslmode=prefer`, the default, asks first).
fn read_startup(stream: &mut TcpStream) {
    loop {
        let mut len = [0u8; 4];
        stream.read_exact(&mut len).unwrap();
        let mut rest = vec![0u8; u32::from_be_bytes(len) as usize - 4];
        stream.read_exact(&mut rest).unwrap();
        if rest != [0x04, 0xd2, 0x16, 0x2f] {
            return;
        }
        stream.write_all(b"N").unwrap();
    }
}

/// A fake primary that answers the client's request for TLS with `answer`, then runs `then`.
fn tls_answer(
    answer: &'static [u8],
    sslmode: &str,
) -> Result<ReplicationConnection, ReceiverError> {
    let conn = fake_primary(move |mut s| {
        let mut request = [0u8; 8];
        s.read_exact(&mut request).unwrap();
        assert_eq!(request, [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]);
        let _ = s.write_all(answer);
        std::thread::sleep(Duration::from_secs(3));
    });
    let conn = ConnString::parse(&format!("{conn} sslmode={sslmode}")).unwrap();
    ReplicationConnection::connect(&conn, "test", Duration::from_secs(2))
}

#[test]
fn a_primary_that_trickles_its_tls_handshake_is_given_up_at_the_deadline() {
    let conn = fake_primary(|mut s| {
        let mut request = [0u8; 8];
        s.read_exact(&mut request).unwrap();
        // S, then the head of a 16 KiB handshake record, then a byte at a time.
        let _ = s.write_all(b"S\x16\x03\x03\x40\x00");
        for _ in 0..100 {
            std::thread::sleep(Duration::from_millis(100));
            if s.write_all(b"\x02").is_err() {
                return;
            }
        }
    });
    let conn = ConnString::parse(&format!("{conn} sslmode=require")).unwrap();
    let tcp = TcpStream::connect((conn.host.as_str(), conn.port)).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let started = Instant::now();
    let Err(e) = super::tls::negotiate(tcp, &conn, started + Duration::from_secs(2)) else {
        panic!("a handshake that never ends ended");
    };
    assert!(e.to_string().contains("deadline"), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn tls_is_asked_for_and_a_refusal_or_a_lie_is_an_error_not_the_clear() {
    // sslmode=require: a primary without TLS is refused, never spoken to in the clear.
    let Err(e) = tls_answer(b"N", "require") else {
        panic!("went on without TLS");
    };
    assert!(e.to_string().contains("does not accept TLS"), "{e}");
    assert!(e.is_permanent());
    // An answer that is neither S nor N.
    let Err(e) = tls_answer(b"E", "prefer") else {
        panic!("took a wrong answer");
    };
    assert!(matches!(e, ReceiverError::Protocol(_)), "{e}");
    // S, then bytes that are no TLS: the handshake fails at once, whatever they claim.
    let started = Instant::now();
    let Err(e) = tls_answer(
        b"SR\x00\x00\x00\x08\x00\x00\x00\x00Z\x00\x00\x00\x05I",
        "require",
    ) else {
        panic!("handshook with plaintext");
    };
    assert!(e.to_string().contains("TLS handshake"), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

/// Reads one frontend message (a query).
fn read_query(stream: &mut TcpStream) -> String {
    let mut head = [0u8; 5];
    stream.read_exact(&mut head).unwrap();
    let mut body = vec![0u8; u32::from_be_bytes(head[1..5].try_into().unwrap()) as usize - 4];
    stream.read_exact(&mut body).unwrap();
    String::from_utf8_lossy(&body).into_owned()
}

/// A fake primary running `script` on the first connection; the connection string to it.
fn fake_primary(script: impl FnOnce(TcpStream) + Send + 'static) -> ConnString {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        if let Ok((stream, _)) = listener.accept() {
            script(stream);
        }
    });
    ConnString::parse(&format!("host=127.0.0.1 port={port} user=postgres")).unwrap()
}

#[test]
fn a_message_claiming_gigabytes_is_refused_before_anything_is_allocated() {
    let conn = fake_primary(|mut s| {
        read_startup(&mut s);
        // An ErrorResponse of 2 GiB, by its length.
        s.write_all(&[b'E', 0x7f, 0xff, 0xff, 0xff]).unwrap();
        std::thread::sleep(Duration::from_secs(5));
    });
    let started = Instant::now();
    let Err(e) = ReplicationConnection::connect(&conn, "test", Duration::from_secs(5)) else {
        panic!("connected to a liar");
    };
    assert!(matches!(e, ReceiverError::Protocol(_)), "{e}");
    assert!(e.to_string().contains("the most accepted"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[test]
fn a_primary_that_goes_silent_is_given_up_within_the_timeout() {
    let conn = fake_primary(|mut s| {
        read_startup(&mut s);
        std::thread::sleep(Duration::from_secs(10));
    });
    let started = Instant::now();
    let Err(e) = ReplicationConnection::connect(&conn, "test", Duration::from_millis(300)) else {
        panic!("connected to a silent server");
    };
    assert!(started.elapsed() < Duration::from_secs(5), "{e}");
    assert!(e.to_string().contains("sent nothing for 300ms"), "{e}");
}

/// A fake primary that logs in, then answers BASE_BACKUP with the start row, the tablespace
/// list (`tablespaces` rows with an OID), a CopyOutResponse and `stream`.
fn base_backup_primary(tablespaces: usize, stream: Vec<Vec<u8>>) -> ConnString {
    fake_primary(move |mut s| {
        read_startup(&mut s);
        s.write_all(&auth_ok_and_ready()).unwrap();
        let query = read_query(&mut s);
        assert!(query.starts_with("BASE_BACKUP"), "{query}");
        let mut out = Vec::new();
        // The start position: a row description with no fields is enough for the client.
        out.extend(message(b'T', &0u16.to_be_bytes()));
        out.extend(message(b'C', b"SELECT\0"));
        out.extend(message(b'T', &0u16.to_be_bytes()));
        for i in 0..=tablespaces {
            let mut row = 1u16.to_be_bytes().to_vec();
            if i == 0 {
                row.extend((-1i32).to_be_bytes()); // the data directory: a NULL OID
            } else {
                row.extend(5u32.to_be_bytes());
                row.extend(b"16385");
            }
            out.extend(message(b'D', &row));
        }
        out.extend(message(b'C', b"SELECT\0"));
        out.extend(message(b'H', &[0, 0, 0]));
        for piece in stream {
            out.extend(message(b'd', &piece));
        }
        let _ = s.write_all(&out);
        std::thread::sleep(Duration::from_secs(2));
    })
}

fn empty_timeline(dir: &std::path::Path) -> Arc<Timeline> {
    std::fs::create_dir_all(dir).unwrap();
    Arc::new(
        Timeline::create(
            dir,
            TenantId::generate(),
            TimelineId::generate(),
            small_cache(64),
            TimelineConf::default(),
        )
        .unwrap(),
    )
}

fn base_backup_from(conn: &ConnString, dir: &std::path::Path) -> ReceiverError {
    let timeline = empty_timeline(dir);
    let mut c = ReplicationConnection::connect(conn, "test", Duration::from_secs(5)).unwrap();
    let e = take_base_backup(&mut c, &timeline).expect_err("a lying base backup imported");
    // Nothing of it was imported.
    assert_eq!(timeline.last_record_lsn(), utils::Lsn(0));
    e
}

#[test]
fn a_base_backup_with_a_tablespace_or_a_second_archive_or_data_out_of_place_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let conn = base_backup_primary(1, Vec::new());
    let e = base_backup_from(&conn, &dir.path().join("a"));
    assert!(e.to_string().contains("tablespace"), "{e}");

    let archive = |name: &str| {
        let mut p = b"n".to_vec();
        p.extend(name.as_bytes());
        p.extend(b"\0\0");
        p
    };
    // A second archive (a tablespace the listing did not name), after junk data.
    let conn = base_backup_primary(
        0,
        vec![archive("base.tar"), b"d0123".to_vec(), archive("16385.tar")],
    );
    let e = base_backup_from(&conn, &dir.path().join("b"));
    assert!(
        e.to_string().contains("second archive") || e.to_string().contains("import"),
        "{e}"
    );

    // Data before any archive began.
    let conn = base_backup_primary(0, vec![b"dsurprise".to_vec()]);
    let e = base_backup_from(&conn, &dir.path().join("c"));
    assert!(
        e.to_string().contains("where archive data was expected"),
        "{e}"
    );
}
