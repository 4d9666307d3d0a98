"""Reads at an LSN not yet ingested wait for it without holding a thread: hundreds of them on one
tenant leave another tenant's reads alone, a client that hangs up ends its wait, and waiters past
`max_lsn_waiters` are refused at once (SPEC §4.6, docs/http-api.md "Reading pages")."""

from __future__ import annotations

import socket

import pytest

from fixtures.http import PageserverApiError
from fixtures.ingest import Image, key, page_of
from fixtures.metrics import Metrics
from fixtures.pageserver import Pageserver
from fixtures.plugin import PageserverFactory
from fixtures.raw_http import connect, read_response
from fixtures.timeline import TimelineHandle
from fixtures.utils import Lsn, wait_until

FUTURE = 0x100


def start_waiting_read(ps: Pageserver, timeline: TimelineHandle, lsn: int) -> socket.socket:
    """Sends a GetPage at `lsn` on a connection of its own and leaves the answer unread."""
    s = connect(ps)
    s.sendall(
        f"GET /v1/tenant/{timeline.tenant_id}/timeline/{timeline.timeline_id}/page?key={key(1).hex()}&lsn={Lsn(lsn)} HTTP/1.1\r\n"
        f"Host: 127.0.0.1\r\n\r\n".encode()
    )
    return s


def status_and_body(s: socket.socket) -> tuple[int, bytes]:
    status, _, body = read_response(s)
    return status, body


def in_flight(ps: Pageserver) -> float:
    return Metrics(ps.http.metrics_text()).value("pageserver_wait_lsn_in_flight")


def server_threads(ps: Pageserver) -> int:
    for line in open(f"/proc/{ps.pid}/status"):
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


def test_waiting_reads_hold_no_thread_and_leave_other_tenants_alone(pageserver: Pageserver):
    ps = pageserver
    waited_on = TimelineHandle.create(ps)
    other = TimelineHandle.create(ps)
    for tl in (waited_on, other):
        tl.ingest([Image(key(1), 0x10, page_of(1))])
    threads_before = server_threads(ps)

    waiters = [start_waiting_read(ps, waited_on, FUTURE) for _ in range(600)]
    try:
        wait_until(lambda: in_flight(ps) == 600, timeout=30, what="600 reads waiting")
        # Each waiting read used to hold a blocking-pool thread (at most 512 of them): reads of
        # every other tenant then queued behind the waits.
        assert server_threads(ps) < threads_before + 16, (threads_before, server_threads(ps))
        assert other.http.get_page(other.tenant_id, other.timeline_id, key(1), 0x10) == page_of(1)
        other.ingest([Image(key(2), 0x20, page_of(2))])
        other.verify()

        # The awaited LSN arrives: every waiting read answers with the page as of it.
        waited_on.ingest([Image(key(1), FUTURE, page_of(7))])
        for s in waiters:
            assert status_and_body(s) == (200, page_of(7))
    finally:
        for s in waiters:
            s.close()
    wait_until(lambda: in_flight(ps) == 0, what="no read waiting")
    assert Metrics(ps.http.metrics_text()).value("pageserver_wait_lsn_seconds_count", outcome="ok") == 600


def test_waiters_past_the_bound_are_refused_and_hang_ups_free_their_place(pageserver_factory: PageserverFactory):
    ps = pageserver_factory.start({"max_lsn_waiters": 4, "wait_lsn_timeout": "10m"})
    timeline = TimelineHandle.create(ps)
    timeline.ingest([Image(key(1), 0x10, page_of(1))])
    waiters = [start_waiting_read(ps, timeline, FUTURE) for _ in range(4)]
    wait_until(lambda: in_flight(ps) == 4, what="4 reads waiting")

    with pytest.raises(PageserverApiError) as e:
        timeline.get(key(1), FUTURE)
    assert e.value.status_code == 503
    assert "4 reads already wait for an LSN on this timeline" in e.value.msg
    # Reads that need no wait are not limited.
    assert timeline.get(key(1), 0x10) == page_of(1)

    # Two clients hang up: their waits end at once (not after wait_lsn_timeout) and two more fit.
    for s in waiters[:2]:
        s.close()
    wait_until(lambda: in_flight(ps) == 2, what="the abandoned waits to end")
    waiters = waiters[2:] + [start_waiting_read(ps, timeline, FUTURE) for _ in range(2)]
    wait_until(lambda: in_flight(ps) == 4, what="4 reads waiting again")

    metrics = Metrics(ps.http.metrics_text())
    assert metrics.value("pageserver_wait_lsn_refused_total") == 1
    assert metrics.value("pageserver_wait_lsn_seconds_count", outcome="abandoned") == 2
    timeline.ingest([Image(key(1), FUTURE, page_of(3))])
    for s in waiters:
        assert status_and_body(s) == (200, page_of(3))
        s.close()


def test_shutdown_ends_waiting_reads(pageserver: Pageserver):
    ps = pageserver
    timeline = TimelineHandle.create(ps)
    waiters = [start_waiting_read(ps, timeline, FUTURE) for _ in range(3)]
    wait_until(lambda: in_flight(ps) == 3, what="3 reads waiting")
    ps.stop()
    for s in waiters:
        status, body = status_and_body(s)
        assert status == 503 and b"shutting down" in body, (status, body)
        s.close()
