"""Slow and greedy clients: the header read timeout (which also closes idle keep-alive
connections), the connection cap, and the JSON bodies of the answers hyper gives by itself.

Raw sockets throughout, on loopback: these tests are about what a misbehaving client sends, which
an HTTP library would not."""

from __future__ import annotations

import gc
import json
import select
import socket
import time

import pytest

from fixtures.metrics import Metrics
from fixtures.pageserver import Pageserver
from fixtures.plugin import PageserverFactory
from fixtures.utils import wait_until

# The longest any socket operation of these tests may block: far above every timeout the
# servers here are given, so a server that never answers fails the test instead of hanging it.
SOCKET_TIMEOUT = 15.0


def connect(ps: Pageserver, timeout: float = SOCKET_TIMEOUT) -> socket.socket:
    return socket.create_connection(("127.0.0.1", ps.port), timeout=timeout)


def read_response(s: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length body: status, headers, body."""
    reader = s.makefile("rb")
    line = reader.readline()
    if not line:
        raise ConnectionError("the connection closed without a response")
    status = int(line.split()[1])
    headers = {}
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    body = reader.read(int(headers.get("content-length", "0")))
    return status, headers, body


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
