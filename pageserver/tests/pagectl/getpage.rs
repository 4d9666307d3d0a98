//! `pagectl getpage` against a real server's page service (`server.rs`): a page ingested over
//! HTTP reads back over gRPC, found or not per LSN, with its length, CRC-32C, the LSN it was read
//! at and the batch's cost; a missing timeline and a closed port are errors (exit code 1), a
//! batch over the protocol's size a usage error (2).

use super::server::Server;
use super::*;

const TL: TimelineId = TimelineId::from_bytes([0x66; 16]);

fn getpage(server: &Server, timeline: TimelineId, extra: &[&str]) -> Output {
    let mut args = vec![
        "getpage".to_owned(),
        "--grpc-endpoint".to_owned(),
        server.grpc.clone(),
        "--tenant".to_owned(),
        TENANT.to_string(),
        "--timeline".to_owned(),
        timeline.to_string(),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    pagectl(args)
}

fn serving_one_page(host: &str) -> Server {
    let server = Server::start(host);
    server.create_timeline(TENANT, TL);
    server.ingest_image(TENANT, TL, key(1), Lsn(0x10), &[7; PAGE_SZ]);
    server
}

#[test]
fn getpage_reads_pages_through_the_page_service() {
    let server = serving_one_page("127.0.0.1");
    let page = crc(7, PAGE_SZ);
    let k = k1();

    // One page, at its LSN: found.
    let got = lines(getpage(&server, TL, &["--key", &k, "--lsn", "0/10"]));
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(
        got[0],
        format!("{k} 0/10 page len=8192 crc={page} read_at=0/10")
    );
    // Read from the open in-memory layer: one layer asked, no file read.
    assert!(got[1].starts_with("cost layers=1 "), "{got:?}");
    assert!(got[1].ends_with(" waits=0 downloads=0"), "{got:?}");

    // A batch: the page, before its first version, and at the latest LSN; another key.
    let got = lines(getpage(
        &server,
        TL,
        &[
            "--key",
            &k,
            "--key",
            &k2(),
            "--lsn",
            "0/10",
            "--lsn",
            "0/F",
            "--lsn",
            "latest",
        ],
    ));
    assert_eq!(
        got[..6],
        [
            format!("{k} 0/10 page len=8192 crc={page} read_at=0/10"),
            format!("{k} 0/F not found read_at=0/F"),
            format!("{k} latest page len=8192 crc={page} read_at=0/10"),
            format!("{} 0/10 not found read_at=0/10", k2()),
            format!("{} 0/F not found read_at=0/F", k2()),
            format!("{} latest not found read_at=0/10", k2()),
        ]
    );
    assert!(got[6].starts_with("cost "), "{got:?}");
    assert_eq!(got.len(), 7);

    // The page's bytes, as many as asked for; the default LSN is the latest.
    let got = lines(getpage(
        &server,
        TL,
        &["--key", &k, "--raw", "--raw-bytes", "16"],
    ));
    assert_eq!(
        got[0],
        format!("{k} latest page len=8192 crc={page} read_at=0/10")
    );
    assert_eq!(
        got[1],
        "    00000000  07 07 07 07 07 07 07 07 07 07 07 07 07 07 07 07  |................|"
    );
    assert_eq!(got[2], "    ... 8176 more bytes (--raw-bytes shows more)");
}

#[test]
fn getpage_over_ipv6() {
    let server = serving_one_page("[::1]");
    assert!(server.grpc.starts_with("http://[::1]:"), "{}", server.grpc);
    let got = lines(getpage(&server, TL, &["--key", &k1(), "--lsn", "0/10"]));
    assert_eq!(
        got[0],
        format!(
            "{} 0/10 page len=8192 crc={} read_at=0/10",
            k1(),
            crc(7, PAGE_SZ)
        )
    );
}

#[test]
fn getpage_errors_say_what_failed() {
    let server = serving_one_page("127.0.0.1");
    let k = k1();

    // A timeline the server does not have: the stream is refused whole.
    let out = getpage(&server, TimelineId::from_bytes([0x77; 16]), &["--key", &k]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("pagectl: the page service answered NotFound: "),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");

    // Nothing listening.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nobody = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let out = pagectl([
        "getpage",
        "--grpc-endpoint",
        &nobody,
        "--tenant",
        &TENANT.to_string(),
        "--timeline",
        &TL.to_string(),
        "--key",
        &k,
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with(&format!("pagectl: connecting to {nobody}")),
        "{stderr}"
    );

    // Usage errors: a malformed key, no key, a batch past 1024 pages.
    for (args, says) in [
        (vec!["--key", "0001"], "--key"),
        (vec![], "--key"),
        (vec!["--key", &k, "--lsn", "0/0"], "latest"),
    ] {
        let out = getpage(&server, TL, &args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{stderr}");
    }
    let mut many = Vec::new();
    for _ in 0..513 {
        many.extend(["--key", k.as_str()]);
    }
    many.extend(["--lsn", "0/10", "--lsn", "0/F"]);
    let out = getpage(&server, TL, &many);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("1026 pages; one batch holds at most 1024"),
        "{stderr}"
    );
}
