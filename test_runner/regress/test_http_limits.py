"""Slow and greedy clients: the header read timeout (which also closes idle keep-alive
connections), the stall timeout of request bodies, the response write timeout, the connection
cap, the budget of request body bytes being read, and the JSON bodies of the answers hyper gives
by itself.

Raw sockets throughout, on loopback: these tests are about what a misbehaving client sends, which
an HTTP library would not."""

from __future__ import annotations

import gc
import json
import select
import socket
import threading
import time
from typing import Optional

import pytest

from fixtures.http import api_error
from fixtures.ingest import Image, encode_batch, key, page_of
from fixtures.metrics import Metrics
from fixtures.pageserver import Pageserver
from fixtures.plugin import PageserverFactory
from fixtures.raw_http import SOCKET_TIMEOUT, connect, read_response
from fixtures.timeline import TimelineHandle
from fixtures.utils import wait_until

def json_msg(headers: dict[str, str], body: bytes) -> str:
    assert headers.get("content-type", "").startswith("application/json"), headers
    parsed = json.loads(body)
    assert list(parsed) == ["msg"], parsed
    return parsed["msg"]


def closed_by_server(s: socket.socket) -> float:
    """Waits for the server to close `s` without a response; returns how long that took."""
    started = time.monotonic()
    try:
        data = s.recv(4096)
    except ConnectionResetError:
        data = b""
    except socket.timeout:
        raise AssertionError(f"the server kept the connection open for {SOCKET_TIMEOUT}s")
    assert data == b"", f"expected the connection to close without a response, got {data[:200]!r}"
    return time.monotonic() - started


def status_request() -> bytes:
    return b"GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def metrics(ps: Pageserver) -> Metrics:
    return Metrics(ps.http.metrics_text())


def open_connections(ps: Pageserver) -> float:
    """`pageserver_http_connections`, scraped over a connection of its own (closed after), so
    that no kept-alive connection of the test's client counts."""
    with connect(ps) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        status, _, body = read_response(s)
        assert status == 200
    return Metrics(body.decode()).value("pageserver_http_connections")


def test_slow_heads_and_idle_connections_are_closed(pageserver_factory: PageserverFactory):
    ps = pageserver_factory.start({"http_header_read_timeout": "1s"})
    # Half a request head, then nothing; a connection that never sends a byte; a kept-alive
    # connection idle after one request. Each is closed about a timeout after it started
    # waiting, with no response (hyper does not answer a head that never completed).
    half = connect(ps)
    half.sendall(b"GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    silent = connect(ps)
    idle = connect(ps)
    idle.sendall(status_request())
    status, _, _ = read_response(idle)
    assert status == 200
    for s in (half, silent, idle):
        with s:
            assert closed_by_server(s) < 5.0
    # A client that keeps its head coming slower than the timeout is cut off too: the clock runs
    # from when the connection started waiting, not from the last byte.
    with connect(ps) as trickle:
        started = time.monotonic()
        trickle.sendall(b"GET /v1/status HTTP/1.1\r\n")
        closed = False
        while not closed and time.monotonic() - started < 10.0:
            readable, _, _ = select.select([trickle], [], [], 0.3)
            if readable:
                closed_by_server(trickle)
                closed = True
                continue
            try:
                trickle.sendall(b"X-Drip: 1\r\n")
            except (BrokenPipeError, ConnectionResetError):
                closed = True
        assert closed and time.monotonic() - started < 5.0
    # The server itself is fine.
    assert ps.http.status()["id"] == ps.server_id


def test_stalled_body_is_cut_off_and_its_budget_freed(pageserver_factory: PageserverFactory):
    ps = pageserver_factory.start({"http_body_read_timeout": "1s"})
    timeline = TimelineHandle.create(ps)
    body = encode_batch([Image(key(i), 0x10, page_of(i)) for i in range(8)])
    path = f"/v1/tenant/{timeline.tenant_id}/timeline/{timeline.timeline_id}/ingest"
    with connect(ps) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n\r\n".encode())
        s.sendall(body[: len(body) // 2])
        # The reservation for the whole body is held while the client stalls...
        wait_until(lambda: metrics(ps).value("pageserver_http_request_body_bytes") >= len(body), what="body reserved")
        started = time.monotonic()
        status, headers, reply = read_response(s)
        assert status == 408, reply
        assert "http_body_read_timeout" in json_msg(headers, reply)
        assert headers.get("connection") == "close"
        assert time.monotonic() - started < 5.0
        assert closed_by_server(s) < 5.0
    # ...and given back once the request is cut off. Nothing of the half batch was stored.
    wait_until(lambda: metrics(ps).value("pageserver_http_request_body_bytes") == 0, what="budget released")
    assert timeline.info()["last_record_lsn"] == "0/0"
    m = metrics(ps)
    assert m.value("pageserver_http_requests_total", method="POST", route="/v1/tenant/{tenant_id}/timeline/{timeline_id}/ingest", status="408") == 1
    timeline.ingest([Image(key(1), 0x10, page_of(1))])


def test_a_trickling_body_is_cut_off_at_the_minimum_rate(pageserver_factory: PageserverFactory):
    """A body that sends a byte every 0.3 s never pauses for http_body_read_timeout, yet would
    hold its reservation for hours: past the first timeout it must keep 1 MiB/s."""
    ps = pageserver_factory.start({"http_body_read_timeout": "1s"})
    timeline = TimelineHandle.create(ps)
    body = encode_batch([Image(key(i), 0x10, page_of(i)) for i in range(8)])
    path = f"/v1/tenant/{timeline.tenant_id}/timeline/{timeline.timeline_id}/ingest"
    with connect(ps) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n\r\n".encode())
        stop = threading.Event()

        def trickle() -> None:
            for i in range(60):
                # Pacing the client under test, not waiting for the server.
                if stop.wait(0.3):
                    return
                try:
                    s.sendall(body[i : i + 1])
                except OSError:
                    return

        sender = threading.Thread(target=trickle)
        sender.start()
        try:
            status, headers, reply = read_response(s)
        finally:
            stop.set()
            sender.join()
        assert status == 408, reply
        assert "minimum rate of 1 MiB/s" in json_msg(headers, reply)
    wait_until(lambda: metrics(ps).value("pageserver_http_request_body_bytes") == 0, what="budget released")
    assert timeline.info()["last_record_lsn"] == "0/0"


def test_json_routes_reserve_no_more_than_they_read(pageserver_factory: PageserverFactory):
    """POST /v1/tenant reads at most 64 KiB of JSON: a large declared length reserves no more
    of the budget than that, so such requests cannot take the budget ingest needs."""
    ps = pageserver_factory.start({"max_request_body_size": "1MiB", "max_buffered_request_bytes": "1MiB"})
    with connect(ps) as s:
        s.sendall(b"POST /v1/tenant HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1048576\r\n\r\n{")
        wait_until(lambda: metrics(ps).value("pageserver_http_request_body_bytes") > 0, what="body reserved")
        assert metrics(ps).value("pageserver_http_request_body_bytes") == 64 * 1024
        # Ingest still finds its budget meanwhile.
        timeline = TimelineHandle.create(ps)
        timeline.ingest([Image(key(1), 0x10, page_of(1))])


def test_connections_over_the_cap_wait_for_a_free_one(pageserver_factory: PageserverFactory):
    cap = 3
    ps = pageserver_factory.start({"max_connections": cap, "http_header_read_timeout": "30s"})
    # Start from no other connection: the readiness check's may not have been closed yet
    # (its socket can wait for Python's garbage collector).
    gc.collect()
    wait_until(lambda: open_connections(ps) == 1, what="only the scraping connection open")
    holders = []
    for _ in range(cap):
        s = connect(ps)
        s.sendall(status_request())
        assert read_response(s)[0] == 200  # accepted, and now an idle keep-alive connection
        holders.append(s)
    waiting = connect(ps, timeout=1.0)
    waiting.sendall(status_request())
    # Over the cap, the connection is not accepted: no answer while every slot is taken.
    with pytest.raises(socket.timeout):
        waiting.recv(1)
    holders.pop().close()
    waiting.settimeout(SOCKET_TIMEOUT)
    status, _, _ = read_response(waiting)
    assert status == 200
    waiting.close()
    for s in holders:
        s.close()
    # With the holders gone, fresh connections are served, and the server counts only the one
    # scraping it.
    wait_until(lambda: open_connections(ps) == 1, what="connections closed")
    assert metrics(ps).value("pageserver_http_connections_max") == cap
    assert ps.http.status()["id"] == ps.server_id


def server_rss(ps: Pageserver) -> int:
    """The server's resident memory in bytes, from /proc/<pid>/status."""
    with open(f"/proc/{ps.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def unread_bytes(server_port: int, client_ports: set[int]) -> Optional[int]:
    """The bytes the server has not yet read from the connections of `client_ports`, from the
    receive queues in /proc/net/tcp; None until every such connection is listed."""
    seen: dict[int, int] = {}
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            local, remote, queues = fields[1], fields[2], fields[4]
            if int(local.split(":")[1], 16) != server_port:
                continue
            port = int(remote.split(":")[1], 16)
            if port in client_ports:
                seen[port] = int(queues.split(":")[1], 16)
    if set(seen) != client_ports:
        return None
    return sum(seen.values())


MiB = 1 << 20


def test_body_flood_stays_within_the_budget(pageserver_factory: PageserverFactory):
    """Ten clients each send 30 MiB of a 32 MiB ingest body and stop. Only as many as the 64 MiB
    budget covers are read; the others get 503 before their body is read, so the server's memory
    grows by about the budget, not by 300 MiB."""
    budget, body_size, sent, clients = 64 * MiB, 32 * MiB, 30 * MiB, 10
    ps = pageserver_factory.start(
        {
            "max_request_body_size": body_size,
            "max_buffered_request_bytes": budget,
            "http_body_read_timeout": "60s",
        }
    )
    timeline = TimelineHandle.create(ps)
    path = f"/v1/tenant/{timeline.tenant_id}/timeline/{timeline.timeline_id}/ingest"
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {body_size}\r\n\r\n".encode()
    chunk = b"\0" * (256 * 1024)
    baseline = server_rss(ps)

    sockets = [connect(ps) for _ in range(clients)]
    accepted: list[socket.socket] = []
    lock = threading.Lock()

    def flood(s: socket.socket) -> None:
        try:
            s.sendall(head)
            for _ in range(sent // len(chunk)):
                s.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            return  # refused: the server answered and closed the connection
        with lock:
            accepted.append(s)

    threads = [threading.Thread(target=flood, args=(s,)) for s in sockets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive(), "a client could not send its body within 60 s"
    # Wait until the server has read everything the accepted clients sent (their receive
    # queues on the server's side are empty), then look at its memory.
    ports = {s.getsockname()[1] for s in accepted}
    wait_until(lambda: unread_bytes(ps.port, ports) == 0, timeout=30, what="the server read every accepted body")
    grown = server_rss(ps) - baseline
    print(f"RSS grew by {grown / MiB:.1f} MiB with {len(accepted)} of {clients} bodies read")
    assert grown < budget + 40 * MiB, f"RSS grew by {grown / MiB:.1f} MiB, over the {budget // MiB} MiB budget"
    assert len(accepted) == budget // body_size

    # While the budget is taken, a further body is refused before it is sent, with a reason.
    with connect(ps) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {MiB}\r\n\r\n".encode())
        status, headers, reply = read_response(s)
        assert status == 503
        assert "max_buffered_request_bytes" in json_msg(headers, reply)
        assert headers.get("connection") == "close" and headers.get("retry-after") == "1"
    m = metrics(ps)
    assert m.value("pageserver_http_request_body_bytes") == budget
    assert m.value("pageserver_http_requests_total", method="POST", route="/v1/tenant/{tenant_id}/timeline/{timeline_id}/ingest", status="503") == clients - len(accepted) + 1

    # The accepted clients give up: their bodies are dropped, the budget is free again.
    for s in sockets:
        s.close()
    wait_until(lambda: metrics(ps).value("pageserver_http_request_body_bytes") == 0, what="budget released")
    timeline.ingest([Image(key(1), 0x10, page_of(1))])


def test_unread_response_is_abandoned(pageserver_factory: PageserverFactory):
    """A client asks for a scan page of a thousand pages (about 11 MiB of JSON, more than the
    socket buffers hold) and reads none of it: once the socket has taken nothing for
    http_response_write_timeout the server drops the connection and the response."""
    # A short header timeout: keep-alive connections the setup left idle close well within the
    # wait below, whichever client they belonged to.
    ps = pageserver_factory.start({"http_response_write_timeout": "1s", "http_header_read_timeout": "2s"})
    timeline = TimelineHandle.create(ps)
    timeline.ingest([Image(key(i), 0x10, page_of(i)) for i in range(1000)])
    gc.collect()
    wait_until(lambda: open_connections(ps) == 1, what="only the scraping connection open")
    path = (
        f"/v1/tenant/{timeline.tenant_id}/timeline/{timeline.timeline_id}/keys"
        f"?start={key(0).hex()}&end={key(1000).hex()}&lsn=latest&limit=1000"
    )
    greedy = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    greedy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    greedy.settimeout(SOCKET_TIMEOUT)
    greedy.connect(("127.0.0.1", ps.port))
    with greedy:
        greedy.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        started = time.monotonic()
        # The response is being written and stalls; then the connection is gone on the server.
        wait_until(lambda: open_connections(ps) == 1, timeout=SOCKET_TIMEOUT, what="the stalled connection dropped")
        assert time.monotonic() - started < 10.0
        # What the client gets is a cut-off response: its head, part of the body, then the end.
        status, headers, body = read_partial(greedy)
        assert status == 200
        assert len(body) < int(headers["content-length"])
    m = metrics(ps)
    assert m.value("pageserver_http_requests_total", method="GET", route="/v1/tenant/{tenant_id}/timeline/{timeline_id}/keys", status="200") == 1


def read_partial(s: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """A response that may end early: status, headers, and as much of the body as came."""
    data = b""
    while chunk := s.recv(1 << 16):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(lines[0].split()[1]), headers, body


def test_the_default_connection_cap_leaves_descriptors_for_files(pageserver_factory: PageserverFactory):
    # Under a process limit of 256 open files with 64 of them for our files and 64 kept, 128 are
    # left for connections.
    ps = pageserver_factory.create({"max_file_descriptors": 64})
    ps.open_files_limit = 256
    ps.start()
    m = metrics(ps)
    assert m.value("process_max_fds") == 256
    assert m.value("pageserver_http_connections_max") == 128
    ps.stop()
    # A cap set above what the limit leaves is taken as set, with a warning.
    ps.allowed_errors.append(r"WARN .*max_connections 500 with max_file_descriptors 64 may need more descriptors than the process's limit of 256")
    ps.start(overrides={"max_connections": 500})
    assert metrics(ps).value("pageserver_http_connections_max") == 500
    assert ps.log_contains(r"WARN .*max_connections 500 with max_file_descriptors 64")


def test_hyper_refusals_have_json_bodies(pageserver: Pageserver):
    cases = [
        (431, b"GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * (200 * 1024) + b"\r\n\r\n", "too large"),
        (414, b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", "65534"),
        (400, b"GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Header: x\r\n\r\n", "could not be parsed"),
        (400, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 a TLS hello\r\n\r\n", "could not be parsed"),
    ]
    for expected, request, contains in cases:
        with connect(pageserver) as s:
            try:
                s.sendall(request)
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused before all of it was sent; the answer is still there to read
            status, headers, body = read_response(s)
            assert status == expected, (request[:40], body)
            assert contains in json_msg(headers, body), body
            assert closed_by_server(s) < 5.0
    assert pageserver.http.status()["id"] == pageserver.server_id


def test_nonsense_limits_are_refused_at_startup(pageserver_factory: PageserverFactory):
    for setting, value, says in [
        ("max_connections", 0, "max_connections 0 is out of range: from 1 to"),
        ("http_header_read_timeout", "0s", "http_header_read_timeout must be above zero"),
        ("http_body_read_timeout", "0s", "http_body_read_timeout must be above zero"),
        ("http_response_write_timeout", "0s", "http_response_write_timeout must be above zero"),
        ("max_buffered_request_bytes", "1MiB", "below max_request_body_size"),
    ]:
        ps = pageserver_factory.create({setting: value})
        ps.allowed_errors.append("pageserver: error: settings:")
        code, output = ps.run_to_exit()
        assert code == 1, output
        assert says in output, output


def test_idle_connections_do_not_hold_up_shutdown(pageserver_factory: PageserverFactory):
    ps = pageserver_factory.start({"http_header_read_timeout": "60s"})
    idle = connect(ps)
    idle.sendall(status_request())
    assert read_response(idle)[0] == 200
    silent = connect(ps)
    wait_until(lambda: open_connections(ps) == 3, what="the two connections and the scrape open")
    started = time.monotonic()
    ps.stop()  # SIGTERM, expects exit 0
    assert time.monotonic() - started < 10.0
    for s in (idle, silent):
        with s:
            closed_by_server(s)
