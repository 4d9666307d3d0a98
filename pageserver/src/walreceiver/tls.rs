//! TLS to the primary, as libpq negotiates it: an `SSLRequest` on the fresh connection, one
//! byte of answer (`S` or `N`), then a TLS handshake (rustls, with ring) on the same socket.
//!
//! `sslmode` decides what is asked and what is checked:
//!
//! | sslmode | asks for TLS | without it | the server's certificate |
//! |---|---|---|---|
//! | `disable`, `allow` | no | - | - |
//! | `prefer` (default) | yes | goes on in the clear | not checked |
//! | `require` | yes | refused | not checked (checked as `verify-ca` with `sslrootcert`) |
//! | `verify-ca` | yes | refused | signed by a CA of `sslrootcert` |
//! | `verify-full` | yes | refused | that, and issued for `host` |
//!
//! The one byte of the answer is read from the socket before the handshake, and nothing
//! else: bytes a server (or a man in the middle) sends after it are TLS records to rustls,
//! never protocol messages read in the clear. Every read and write of the handshake waits at
//! most the socket's timeouts, and the whole of it ends by the setup's deadline: a primary that
//! trickles its handshake cannot hold the receiver.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, ClientConnection, DigitallySignedStruct, StreamOwned,
};

use super::connstr::{ConnString, SslMode};
use super::ReceiverError;

/// `SSLRequest`: length 8, code 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

/// The connection's byte stream: in the clear, or TLS over it.
pub(super) enum Transport {
    Plain(TcpStream),
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl Transport {
    /// The socket under it, for its timeouts.
    pub(super) fn tcp(&self) -> &TcpStream {
        match self {
            Transport::Plain(s) => s,
            Transport::Tls(s) => s.get_ref(),
        }
    }

    pub(super) fn is_tls(&self) -> bool {
        matches!(self, Transport::Tls(_))
    }
}

impl Transport {
    /// Appends what the connection has to `buf`, after at most one read of the socket (which
    /// waits at most its timeout): over TLS, a record that is not whole yet gives nothing now,
    /// and the caller's loop, with its deadlines and its stop flag, goes on (rustls' own reader
    /// would wait for the whole record, a read timeout at a time). `Ok(false)` at the end of
    /// the stream.
    pub(super) fn fill_into(&mut self, buf: &mut BytesMut) -> io::Result<bool> {
        match self {
            Transport::Plain(s) => {
                let mut chunk = [0u8; 64 << 10];
                let n = s.read(&mut chunk)?;
                buf.extend_from_slice(&chunk[..n]);
                Ok(n > 0)
            }
            Transport::Tls(s) => {
                let StreamOwned { conn, sock } = &mut **s;
                // Plaintext decrypted before: no read of the socket needed.
                match drain_plaintext(conn, buf)? {
                    Drained::Some => return Ok(true),
                    Drained::Closed => return Ok(false),
                    Drained::Nothing => {}
                }
                if conn.read_tls(sock)? == 0 {
                    return Ok(false);
                }
                conn.process_new_packets()
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                // Alerts, key updates: what reading asked to send.
                while conn.wants_write() {
                    conn.write_tls(sock)?;
                }
                Ok(drain_plaintext(conn, buf)? != Drained::Closed)
            }
        }
    }
}

#[derive(PartialEq, Eq)]
enum Drained {
    Some,
    Nothing,
    Closed,
}

/// Moves the plaintext rustls holds into `buf`.
fn drain_plaintext(conn: &mut ClientConnection, buf: &mut BytesMut) -> io::Result<Drained> {
    let mut chunk = [0u8; 16 << 10];
    let mut drained = Drained::Nothing;
    loop {
        match conn.reader().read(&mut chunk) {
            // The peer's close_notify: the end, once what came before it is taken.
            Ok(0) if drained == Drained::Nothing => return Ok(Drained::Closed),
            Ok(0) => return Ok(drained),
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                drained = Drained::Some;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(drained),
            Err(e) => return Err(e),
        }
    }
}

impl Write for Transport {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Transport::Plain(s) => s.write(buf),
            Transport::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Transport::Plain(s) => s.flush(),
            Transport::Tls(s) => s.flush(),
        }
    }
}

/// Asks for TLS on `tcp` as `conn.sslmode` says, and shakes hands if the primary agrees, by
/// `deadline`.
pub(super) fn negotiate(
    mut tcp: TcpStream,
    conn: &ConnString,
    deadline: Instant,
) -> Result<Transport, ReceiverError> {
    if matches!(conn.sslmode, SslMode::Disable | SslMode::Allow) {
        return Ok(Transport::Plain(tcp));
    }
    // Built before anything is sent: a CA file that cannot be read is a setting to fix.
    let config = client_config(conn)?;
    let server_name = ServerName::try_from(conn.host.clone()).map_err(|_| {
        ReceiverError::Settings(format!("host `{}` is not a name TLS can check", conn.host))
    })?;
    tcp.write_all(&SSL_REQUEST).map_err(ReceiverError::io)?;
    let mut answer = [0u8; 1];
    tcp.read_exact(&mut answer)
        .map_err(|e| ReceiverError::Connect(format!("asking the primary for TLS: {e}")))?;
    match answer[0] {
        b'S' => {}
        b'N' if conn.sslmode == SslMode::Prefer => return Ok(Transport::Plain(tcp)),
        b'N' => {
            return Err(ReceiverError::Refused(format!(
                "the primary does not accept TLS (its ssl is off), and sslmode={} asks for it",
                conn.sslmode
            )))
        }
        other => {
            return Err(ReceiverError::Protocol(format!(
                "the primary answered the TLS request with byte {other:#04x}, not S or N"
            )))
        }
    }
    let mut tls = ClientConnection::new(Arc::new(config), server_name)
        .map_err(|e| ReceiverError::Settings(format!("TLS: {e}")))?;
    // Driven a read at a time (rustls' own `complete_io` would go on reading for as long as
    // bytes trickle in), each read within the socket's timeout and the setup's deadline.
    let step = tcp.read_timeout().ok().flatten();
    while tls.is_handshaking() {
        while tls.wants_write() {
            tls.write_tls(&mut tcp)
                .map_err(|e| handshake_error(e, conn))?;
        }
        if !tls.is_handshaking() {
            break;
        }
        if !tls.wants_read() {
            // Neither to send nor to read while the handshake is not done: nothing would
            // move it on.
            return Err(ReceiverError::Protocol(
                "the TLS handshake stalled with nothing to send or read".to_owned(),
            ));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ReceiverError::Connect(
                "the primary did not finish the TLS handshake by the setup's deadline".to_owned(),
            ));
        }
        let wait = step.map_or(left, |s| s.min(left));
        tcp.set_read_timeout(Some(wait))
            .map_err(ReceiverError::io)?;
        let read = match tls.read_tls(&mut tcp) {
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(ReceiverError::Connect(if Instant::now() >= deadline {
                    "the primary did not finish the TLS handshake by the setup's deadline"
                        .to_owned()
                } else {
                    format!("the primary sent nothing for {wait:?} during the TLS handshake")
                }))
            }
            read => read.map_err(|e| handshake_error(e, conn))?,
        };
        if read == 0 {
            return Err(ReceiverError::Connect(
                "the primary closed the connection during the TLS handshake".to_owned(),
            ));
        }
        tls.process_new_packets().map_err(|e| {
            let what = format!(
                "the TLS handshake with the primary failed (sslmode={}): {e}",
                conn.sslmode
            );
            match e {
                // A certificate refused stays refused until the settings or the primary's
                // certificate change; anything else (a damaged record, an alert) is retried.
                rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented => {
                    ReceiverError::Refused(what)
                }
                _ => ReceiverError::Connect(what),
            }
        })?;
    }
    while tls.wants_write() {
        tls.write_tls(&mut tcp)
            .map_err(|e| handshake_error(e, conn))?;
    }
    tcp.set_read_timeout(step).map_err(ReceiverError::io)?;
    Ok(Transport::Tls(Box::new(StreamOwned::new(tls, tcp))))
}

/// The socket failed during the handshake: retried, as any lost connection.
fn handshake_error(e: io::Error, conn: &ConnString) -> ReceiverError {
    ReceiverError::Connect(format!(
        "the TLS handshake with the primary (sslmode={}): {e}",
        conn.sslmode
    ))
}

fn client_config(conn: &ConnString) -> Result<ClientConfig, ReceiverError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| ReceiverError::Settings(format!("TLS: {e}")))?;
    let verifier: Arc<dyn ServerCertVerifier> = match (&conn.sslmode, &conn.sslrootcert) {
        (SslMode::VerifyFull, Some(path)) => webpki_verifier(path, &provider)?,
        (SslMode::VerifyCa | SslMode::Require, Some(path)) => Arc::new(CaOnly {
            inner: webpki_verifier(path, &provider)?,
        }),
        (SslMode::VerifyCa | SslMode::VerifyFull, None) => {
            return Err(ReceiverError::Settings(format!(
                "sslmode={} needs sslrootcert=<a PEM file of the CA certificates to trust>",
                conn.sslmode
            )))
        }
        _ => Arc::new(Unchecked { provider }),
    };
    Ok(builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth())
}

/// libpq's `verify-full`: the chain up to a CA of `path`, and the name.
fn webpki_verifier(
    path: &str,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>, ReceiverError> {
    let settings = |what: String| ReceiverError::Settings(format!("sslrootcert `{path}`: {what}"));
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(path).map_err(|e| settings(e.to_string()))?;
    for cert in certs {
        let cert = cert.map_err(|e| settings(e.to_string()))?;
        roots.add(cert).map_err(|e| settings(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(settings("no certificate in it".to_owned()));
    }
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| settings(e.to_string()))
}

/// libpq's `verify-ca`: the chain, whatever name the certificate is for.
#[derive(Debug)]
struct CaOnly {
    inner: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for CaOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// libpq's `prefer` and `require`: encryption against a passive listener, no check of who
/// answers. The handshake's signatures are still checked against the certificate presented.
#[derive(Debug)]
struct Unchecked {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
