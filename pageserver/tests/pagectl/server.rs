//! A real page server for the commands that talk to one (`import`, `basebackup`, `getpage`):
//! the crate's own `pageserver` binary in a temporary work directory, on free ports of
//! 127.0.0.1 or ::1, stopped with SIGTERM when the test is done. Its ports are read from its
//! startup log, so nothing guesses a free port; its log is kept for failure messages.
//!
//! Requests the tests make themselves (create a tenant, ingest a page) are plain HTTP/1.1 over
//! a socket: the server answers them as it answers curl.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use super::*;

/// How long a server may take to start, or to stop after SIGTERM.
const PATIENCE: Duration = Duration::from_secs(60);

pub struct Server {
    child: Child,
    /// `http://host:port` of the HTTP API and of the page service.
    pub http: String,
    pub grpc: String,
    log: Arc<Mutex<String>>,
    _workdir: tempfile::TempDir,
}

/// The address after `marker` in a log line, up to the next space, comma or parenthesis.
fn address_after<'a>(line: &'a str, marker: &str) -> Option<&'a str> {
    let rest = &line[line.find(marker)? + marker.len()..];
    Some(rest.split([' ', ',', ')', ';']).next().unwrap_or(rest))
}

impl Server {
    /// Starts a server listening on `host` (`127.0.0.1` or `[::1]`), ports chosen by the OS.
    pub fn start(host: &str) -> Server {
        let workdir = tempfile::tempdir().unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_pageserver"))
            .arg("-D")
            .arg(workdir.path())
            .args(["-c", &format!("listen_http_addr={host}:0")])
            .args(["-c", &format!("listen_grpc_addr={host}:0")])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the pageserver binary starts");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (lines, started) = mpsc::channel();
        let kept = log.clone();
        // Reads the log to its end, so the server never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { return };
                kept.lock().unwrap().push_str(&format!("{line}\n"));
                let _ = lines.send(line);
            }
        });
        let deadline = Instant::now() + PATIENCE;
        let (http, grpc) = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = started.recv_timeout(left).unwrap_or_else(|_| {
                let _ = child.kill();
                panic!("the server did not start: {}", log.lock().unwrap())
            });
            if let (Some(http), Some(grpc)) = (
                address_after(&line, "listening on "),
                address_after(&line, "page service (gRPC) on "),
            ) {
                break (http.to_owned(), format!("http://{grpc}"));
            }
        };
        Server {
            child,
            http,
            grpc,
            log,
            _workdir: workdir,
        }
    }

    /// What the server logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// One request; returns the status and the body (the server sends a length with every
    /// answer these tests ask for).
    pub fn request(&self, method: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
        let authority = self.http.strip_prefix("http://").unwrap();
        // "127.0.0.1:port" and "[::1]:port" alike are socket addresses as written.
        let mut stream = TcpStream::connect(authority).unwrap();
        stream.set_read_timeout(Some(PATIENCE)).unwrap();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Length: {}\r\n\
             Content-Type: application/octet-stream\r\nConnection: close\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).unwrap();
        stream.write_all(body).unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).unwrap();
        let split = answer
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a response head");
        let head = String::from_utf8_lossy(&answer[..split]).to_lowercase();
        assert!(!head.contains("transfer-encoding: chunked"), "{head}");
        let status = head[9..12].parse().unwrap();
        (status, answer[split + 4..].to_vec())
    }

    /// A tenant and a timeline of the given ids.
    pub fn create_timeline(&self, tenant: TenantId, timeline: TimelineId) {
        let (status, body) = self.request(
            "POST",
            "/v1/tenant",
            format!("{{\"new_tenant_id\": \"{tenant}\"}}").as_bytes(),
        );
        assert!(
            status == 201 || status == 409,
            "{status} {}\n{}",
            String::from_utf8_lossy(&body),
            self.log()
        );
        let (status, body) = self.request(
            "POST",
            &format!("/v1/tenant/{tenant}/timeline"),
            format!("{{\"new_timeline_id\": \"{timeline}\"}}").as_bytes(),
        );
        assert_eq!(
            status,
            201,
            "{}\n{}",
            String::from_utf8_lossy(&body),
            self.log()
        );
    }

    /// Ingests one record: `value`, an image of `key`, at `lsn`.
    pub fn ingest_image(
        &self,
        tenant: TenantId,
        timeline: TimelineId,
        key: Key,
        lsn: Lsn,
        value: &[u8],
    ) {
        let mut record = key.to_bytes().to_vec();
        record.extend_from_slice(&lsn.0.to_be_bytes());
        record.push(0);
        record.extend_from_slice(&(value.len() as u32).to_be_bytes());
        record.extend_from_slice(value);
        let (status, body) = self.request(
            "POST",
            &format!("/v1/tenant/{tenant}/timeline/{timeline}/ingest"),
            &record,
        );
        assert_eq!(
            status,
            200,
            "{}\n{}",
            String::from_utf8_lossy(&body),
            self.log()
        );
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SIGTERM, as an operator stops it; SIGKILL only if it does not stop in time.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + PATIENCE;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
