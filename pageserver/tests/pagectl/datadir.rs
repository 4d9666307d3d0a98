//! `pagectl import` and `pagectl basebackup` against a real server (`server.rs`): a synthetic
//! stopped cluster (a real `pg_control` layout with its CRC, relation files, directories) goes in
//! and comes back byte for byte; a failed basebackup leaves no directory it made and empties
//! one it was given; the progress line goes to a terminal and nowhere else; the endpoint may be
//! an IPv6 address; and the exit codes are the documented ones: 0, 1 for a problem, 2 for a
//! usage error.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;

use super::server::Server;
use super::*;

const BLCKSZ: usize = 8192;
const SYSID: u64 = 0x6a5b_4c3d_2e1f_0011;
/// The checkpoint the synthetic cluster stopped at: the snapshot's LSN.
const CHECKPOINT: u64 = 0x1000;
const TL: TimelineId = TimelineId::from_bytes([0x33; 16]);

/// A `pg_control` of format 1300, cleanly shut down at `checkpoint`, with a valid CRC.
fn pg_control(checkpoint: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; BLCKSZ];
    bytes[0..8].copy_from_slice(&SYSID.to_le_bytes());
    bytes[8..12].copy_from_slice(&1300u32.to_le_bytes());
    bytes[12..16].copy_from_slice(&202209061u32.to_le_bytes());
    bytes[16..20].copy_from_slice(&1u32.to_le_bytes());
    bytes[32..40].copy_from_slice(&checkpoint.to_le_bytes());
    bytes[40..48].copy_from_slice(&checkpoint.to_le_bytes());
    bytes[48..52].copy_from_slice(&1u32.to_le_bytes());
    let crc = utils::crc32c::crc32c(&bytes[..288]);
    bytes[288..292].copy_from_slice(&crc.to_le_bytes());
    bytes
}

/// A small stopped cluster's files, by path (directories map to `None`).
fn cluster() -> BTreeMap<&'static str, Option<Vec<u8>>> {
    let mut files = BTreeMap::new();
    for dir in [
        "base",
        "base/1",
        "base/5",
        "global",
        "pg_wal",
        "pg_xact",
        "pg_tblspc",
    ] {
        files.insert(dir, None);
    }
    let blocks = |fill: u8, n: usize| -> Vec<u8> {
        (0..n * BLCKSZ)
            .map(|i| fill.wrapping_add((i / 61) as u8))
            .collect()
    };
    files.insert("PG_VERSION", Some(b"15\n".to_vec()));
    files.insert("postgresql.conf", Some(vec![b'#'; 20_000]));
    files.insert("pg_xact/0000", Some(blocks(9, 1)));
    files.insert("base/5/PG_VERSION", Some(b"15\n".to_vec()));
    files.insert("base/5/pg_filenode.map", Some(vec![7; 512]));
    files.insert("global/pg_control", Some(pg_control(CHECKPOINT)));
    files.insert("base/5/16384", Some(blocks(1, 3)));
    files.insert("base/5/16384_fsm", Some(blocks(2, 1)));
    files.insert("base/1/1259", Some(blocks(3, 2)));
    files.insert("global/1262", Some(blocks(4, 1)));
    files
}

fn write_cluster(root: &Path) {
    std::fs::create_dir(root).unwrap();
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700)).unwrap();
    for (path, bytes) in cluster() {
        let path = root.join(path);
        match bytes {
            None => std::fs::create_dir(&path).unwrap(),
            Some(bytes) => std::fs::write(&path, bytes).unwrap(),
        }
        let mode = if path.is_dir() { 0o700 } else { 0o600 };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
}

/// Every file and directory under `root`, by relative path, with its mode and contents.
fn tree(root: &Path) -> BTreeMap<String, (u32, Option<Vec<u8>>)> {
    let mut found = BTreeMap::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.strip_prefix(root).unwrap().display().to_string();
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
            if path.is_dir() {
                found.insert(name, (mode, None));
                pending.push(path);
            } else {
                found.insert(name, (mode, Some(std::fs::read(&path).unwrap())));
            }
        }
    }
    found
}

fn target(server: &Server, timeline: TimelineId) -> Vec<String> {
    vec![
        "--endpoint".into(),
        server.http.clone(),
        "--tenant".into(),
        TENANT.to_string(),
        "--timeline".into(),
        timeline.to_string(),
    ]
}

/// `pagectl <command> <target> <extra>`.
fn run(command: &str, server: &Server, timeline: TimelineId, extra: &[&OsStr]) -> Output {
    let mut args: Vec<&OsStr> = vec![OsStr::new(command)];
    let target = target(server, timeline);
    args.extend(target.iter().map(OsStr::new));
    args.extend_from_slice(extra);
    pagectl(args)
}

/// Asserts exit code 1 and one line on stderr that says `says`; returns the line.
fn failure_of(out: Output, says: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "pagectl panicked: {stderr}");
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line expected: {stderr}");
    assert!(
        stderr.starts_with("pagectl: ") && stderr.contains(says),
        "{stderr}"
    );
    stderr
}

/// Asserts exit code 2 (clap's usage error) mentioning `says`.
fn usage_error_of(out: Output, says: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert!(stderr.contains(says), "{stderr}");
    assert!(out.stdout.is_empty());
}

#[test]
fn a_cluster_goes_in_and_comes_back_byte_for_byte() {
    let server = Server::start("127.0.0.1");
    server.create_timeline(TENANT, TL);
    let dir = tempfile::tempdir().unwrap();
    let pgdata = dir.path().join("pgdata");
    write_cluster(&pgdata);

    // stderr is a pipe here, not a terminal: no progress line, only the report on stdout.
    let report = stdout_of(run("import", &server, TL, &[pgdata.as_os_str()]));
    assert!(report.contains("\"kind\":\"stopped\""), "{report}");
    assert!(report.contains("\"lsn\":\"0/1000\""), "{report}");
    assert!(report.contains("\"blocks_new\":7"), "{report}");

    let restored = dir.path().join("restored");
    let out = run(
        "basebackup",
        &server,
        TL,
        &[OsStr::new("--into"), restored.as_os_str()],
    );
    assert_eq!(
        stdout_of(out),
        format!("the snapshot at 0/1000 is in {}\n", restored.display())
    );
    let mode = std::fs::metadata(&restored).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    assert_eq!(tree(&restored), tree(&pgdata));

    // At an LSN, and at one below the snapshot: none there, so the directory goes again.
    let at = dir.path().join("at");
    let out = run(
        "basebackup",
        &server,
        TL,
        &[
            OsStr::new("--into"),
            at.as_os_str(),
            OsStr::new("--lsn"),
            OsStr::new("0/1000"),
        ],
    );
    assert!(stdout_of(out).starts_with("the snapshot at 0/1000 is in"));
    let below = dir.path().join("below");
    let out = run(
        "basebackup",
        &server,
        TL,
        &[
            OsStr::new("--into"),
            below.as_os_str(),
            OsStr::new("--lsn"),
            OsStr::new("0/FFF"),
        ],
    );
    let err = failure_of(out, "404");
    assert!(
        err.contains("no snapshot") && err.contains("removed"),
        "{err}"
    );
    assert!(!below.exists());
}

#[test]
fn a_failed_basebackup_leaves_no_directory_it_made_and_empties_one_it_was_given() {
    let server = Server::start("127.0.0.1");
    server.create_timeline(TENANT, TL);
    let dir = tempfile::tempdir().unwrap();

    // A timeline with no snapshot: 404, and the directory pagectl made is gone.
    let made = dir.path().join("made");
    let err = failure_of(
        run(
            "basebackup",
            &server,
            TL,
            &[OsStr::new("--into"), made.as_os_str()],
        ),
        "404 Not Found",
    );
    assert!(
        err.contains(&format!("{} removed", made.display())),
        "{err}"
    );
    assert!(!made.exists());

    // A timeline that does not exist, into an empty directory of the caller's, mode 0755:
    // the directory stays, empty, with its mode.
    let given = dir.path().join("given");
    std::fs::create_dir(&given).unwrap();
    std::fs::set_permissions(&given, std::fs::Permissions::from_mode(0o755)).unwrap();
    let missing = TimelineId::from_bytes([0x44; 16]);
    let err = failure_of(
        run(
            "basebackup",
            &server,
            missing,
            &[OsStr::new("--into"), given.as_os_str()],
        ),
        "404 Not Found",
    );
    assert!(err.contains("emptied again"), "{err}");
    assert_eq!(std::fs::read_dir(&given).unwrap().count(), 0);
    let mode = std::fs::metadata(&given).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o755);

    // A directory that is not empty is refused before anything is fetched, and left as it is.
    std::fs::write(given.join("mine"), b"keep").unwrap();
    failure_of(
        run(
            "basebackup",
            &server,
            TL,
            &[OsStr::new("--into"), given.as_os_str()],
        ),
        "is not empty",
    );
    assert_eq!(std::fs::read(given.join("mine")).unwrap(), b"keep");

    // No server there: connecting fails, and the directory goes too.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nobody = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let out = pagectl([
        "basebackup",
        "--endpoint",
        &nobody,
        "--tenant",
        &TENANT.to_string(),
        "--timeline",
        &TL.to_string(),
        "--into",
        made.to_str().unwrap(),
    ]);
    let err = failure_of(out, "connecting to");
    assert!(err.contains("removed"), "{err}");
    assert!(!made.exists());
}

#[test]
fn the_endpoint_may_be_an_ipv6_address() {
    let server = Server::start("[::1]");
    assert!(server.http.starts_with("http://[::1]:"), "{}", server.http);
    server.create_timeline(TENANT, TL);
    let dir = tempfile::tempdir().unwrap();
    let pgdata = dir.path().join("pgdata");
    write_cluster(&pgdata);
    let report = stdout_of(run("import", &server, TL, &[pgdata.as_os_str()]));
    assert!(report.contains("\"lsn\":\"0/1000\""), "{report}");
    let restored = dir.path().join("restored");
    stdout_of(run(
        "basebackup",
        &server,
        TL,
        &[OsStr::new("--into"), restored.as_os_str()],
    ));
    assert_eq!(tree(&restored), tree(&pgdata));
}

#[test]
fn exit_codes_are_0_done_1_a_problem_2_a_usage_error() {
    let server = Server::start("127.0.0.1");
    server.create_timeline(TENANT, TL);
    let dir = tempfile::tempdir().unwrap();
    let into = dir.path().join("restored");
    let tenant = TENANT.to_string();
    let timeline = TL.to_string();
    let into_arg = into.to_str().unwrap();

    // 0: help, and done (the import of a stream on stdin is covered by the test suite's
    // PostgreSQL round trip).
    for help in [
        &["--help"][..],
        &["import", "--help"],
        &["getpage", "--help"],
    ] {
        let out = pagectl(help);
        assert_eq!(out.status.code(), Some(0), "{help:?}");
    }

    // 2: what clap refuses, each naming what is wrong; nothing is created.
    let base = |endpoint: &str| {
        vec![
            "basebackup".to_owned(),
            "--endpoint".to_owned(),
            endpoint.to_owned(),
            "--tenant".to_owned(),
            tenant.clone(),
            "--timeline".to_owned(),
            timeline.clone(),
            "--into".to_owned(),
            into_arg.to_owned(),
        ]
    };
    usage_error_of(pagectl(base("https://127.0.0.1:9898")), "only http://");
    usage_error_of(pagectl(base("127.0.0.1:9898")), "no scheme");
    usage_error_of(pagectl(base("http://127.0.0.1:9898/v1")), "has a path");
    usage_error_of(pagectl(base("http://[::1")), "--endpoint");
    let mut bad_id = base(&server.http);
    bad_id[4] = "not-a-tenant".into();
    usage_error_of(pagectl(&bad_id), "--tenant");
    let mut bad_lsn = base(&server.http);
    bad_lsn.extend(["--lsn".into(), "0/G".into()]);
    usage_error_of(pagectl(&bad_lsn), "--lsn");
    usage_error_of(pagectl(&base(&server.http)[..7]), "--into");
    usage_error_of(pagectl(["import", "--tenant", &tenant]), "--timeline");
    usage_error_of(pagectl(["no-such-command"]), "no-such-command");
    assert!(!into.exists());

    // 1: a problem, on one line.
    failure_of(
        run(
            "import",
            &server,
            TL,
            &[dir.path().join("nothing").as_os_str()],
        ),
        "no such directory",
    );
    let missing = TimelineId::from_bytes([0x55; 16]);
    let pgdata = dir.path().join("pgdata");
    write_cluster(&pgdata);
    failure_of(
        run("import", &server, missing, &[pgdata.as_os_str()]),
        "404 Not Found",
    );
    // 0 once more, then 1 for the same snapshot again: the server refuses an LSN it has.
    stdout_of(run("import", &server, TL, &[pgdata.as_os_str()]));
    failure_of(
        run("import", &server, TL, &[pgdata.as_os_str()]),
        "the server answered 4",
    );
}

/// A pseudo-terminal: the master end to read, the slave end to give a child as stderr.
fn pty() -> (std::fs::File, Stdio) {
    use std::os::fd::FromRawFd;
    let (mut master, mut slave) = (0, 0);
    let made = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(made, 0, "openpty: {}", std::io::Error::last_os_error());
    unsafe {
        (
            std::fs::File::from_raw_fd(master),
            Stdio::from(std::os::fd::OwnedFd::from_raw_fd(slave)),
        )
    }
}

/// Runs pagectl with stderr on a terminal; returns its exit status, stdout and what the
/// terminal showed.
fn on_a_terminal(args: &[&OsStr]) -> (std::process::ExitStatus, String, String) {
    let (mut master, slave) = pty();
    let child = Command::new(env!("CARGO_BIN_EXE_pagectl"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(slave)
        .spawn()
        .unwrap();
    // Until every copy of the slave end is closed (the child's, at its exit), the master reads.
    let screen = std::thread::spawn(move || {
        let mut shown = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match master.read(&mut buf) {
                Ok(0) | Err(_) => return String::from_utf8_lossy(&shown).into_owned(),
                Ok(n) => shown.extend_from_slice(&buf[..n]),
            }
        }
    });
    let out = child.wait_with_output().unwrap();
    let shown = screen.join().unwrap();
    (out.status, String::from_utf8(out.stdout).unwrap(), shown)
}

/// The progress line as it was last drawn: after the last carriage return that starts one (the
/// terminal shows the final new line as "\r\n").
fn final_line(shown: &str) -> &str {
    let shown = shown.strip_suffix("\r\n").unwrap_or(shown);
    shown.rsplit('\r').next().unwrap()
}

#[test]
fn progress_is_drawn_on_a_terminal_with_the_total_when_known() {
    let server = Server::start("127.0.0.1");
    server.create_timeline(TENANT, TL);
    let dir = tempfile::tempdir().unwrap();
    let pgdata = dir.path().join("pgdata");
    write_cluster(&pgdata);
    let target = target(&server, TL);
    let mut args: Vec<&OsStr> = vec![OsStr::new("import")];
    args.extend(target.iter().map(OsStr::new));
    args.push(pgdata.as_os_str());
    let (status, stdout, shown) = on_a_terminal(&args);
    assert!(status.success(), "{shown}");
    assert!(stdout.contains("\"kind\":\"stopped\""), "{stdout}");
    // The line ends complete: every byte of the reckoned total, then a new line.
    let last = final_line(&shown);
    assert!(last.starts_with("import: "), "{shown:?}");
    assert!(last.contains(" MiB (100%) in "), "{shown:?}");
    assert!(last.ends_with("MiB/s\u{1b}[K"), "{shown:?}");

    // A basebackup does not know its total: bytes, time and rate.
    let restored = dir.path().join("restored");
    let mut args: Vec<&OsStr> = vec![OsStr::new("basebackup")];
    args.extend(target.iter().map(OsStr::new));
    args.extend([OsStr::new("--into"), restored.as_os_str()]);
    let (status, stdout, shown) = on_a_terminal(&args);
    assert!(status.success(), "{shown}");
    assert!(stdout.starts_with("the snapshot at 0/1000"), "{stdout}");
    let last = final_line(&shown);
    assert!(last.starts_with("basebackup: "), "{shown:?}");
    assert!(
        last.contains(" MiB in ") && last.ends_with("MiB/s\u{1b}[K"),
        "{shown:?}"
    );
    assert!(!last.contains(" of "), "{shown:?}");
}
