"""The page service (gRPC, docs/grpc-api.md) against the real server: every call, its errors
(the HTTP API's messages under gRPC codes), auth, and pipelined GetPages batches checked
against the reference model whatever order their answers come back in."""

from __future__ import annotations

import gc
import queue
import random
import socket
import struct
import threading
from http.client import HTTPConnection

import grpc
import pytest

from fixtures.auth import AuthKeys, start_with_auth
from fixtures.http import PageserverApiError
from fixtures.ingest import Image, Workload, key, page_of, rel_key
from fixtures.metrics import Metrics
from fixtures.page_service import PageServiceError, pb, pb_grpc
from fixtures.plugin import PageserverFactory
from fixtures.timeline import TimelineHandle
from fixtures.utils import Lsn, wait_until


def http_message(call) -> str:
    """The HTTP API's message for the same request."""
    with pytest.raises(PageserverApiError) as e:
        call()
    return e.value.msg


def fill(timeline: TimelineHandle, seed: int = 1, keys: int = 24, batches: int = 60) -> None:
    """A random history of images and deltas, partly flushed to layer files."""
    workload = Workload(seed, [key(n) for n in range(keys)])
    for i in range(batches):
        timeline.ingest(workload.batch())
        if i in (batches // 3, 2 * batches // 3):
            timeline.checkpoint()


def test_ping_needs_no_tenant(pageserver):
    with pageserver.page_service() as client:
        assert client.ping(42).id == 42


def test_get_page_matches_the_model_and_http(timeline: TimelineHandle):
    fill(timeline)
    model = timeline.model
    rng = random.Random(3)
    with timeline.ps.page_service(timeline.tenant_id, timeline.timeline_id) as client:
        for k in model.keys():
            for lsn in rng.sample(model.lsns(k), k=min(6, len(model.lsns(k)))) + [model.last_lsn]:
                want = model.get(k, lsn)
                assert client.get_page_or_none(k, lsn) == want, f"{k.hex()} at {Lsn(lsn)}"
                assert timeline.get(k, lsn) == want
        # LSN 0 is the latest, and the answer says which LSN that was.
        k = model.keys()[0]
        answer = client.get_page_response(k, 0)
        assert answer.lsn == model.last_lsn
        assert answer.page == model.get(k, model.last_lsn)
        assert answer.cost.layers >= 1


def test_get_page_errors_carry_the_http_messages(timeline: TimelineHandle):
    timeline.ingest([Image(key(1), 0x10, page_of(1))])
    ps, http = timeline.ps, timeline.http
    tenant, tl = timeline.tenant_id, timeline.timeline_id

    def code_and_message(client, k=key(1), lsn=0):
        with pytest.raises(grpc.RpcError) as e:
            client.get_page(k, lsn)
        return e.value.code(), e.value.details()

    # The key has no version at or below the LSN: NOT_FOUND, in HTTP's words.
    with ps.page_service(tenant, tl) as client:
        code, message = code_and_message(client, key(2), 0x10)
        assert code == grpc.StatusCode.NOT_FOUND
        assert message == http_message(lambda: http.get_page(tenant, tl, key(2), 0x10))
        code, message = code_and_message(client, key(1)[:17])
        assert code == grpc.StatusCode.INVALID_ARGUMENT and message == "key: 17 bytes, expected 18"

    other = "0" * 31 + "9"
    with ps.page_service(tenant, other) as client:
        code, message = code_and_message(client)
        assert code == grpc.StatusCode.NOT_FOUND
        assert message == http_message(lambda: http.get_page(tenant, other, key(1), 0x10))
    with ps.page_service(tenant, "not-an-id") as client:
        code, message = code_and_message(client)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and message.startswith("metadata `timeline-id`: ")
    with ps.page_service(None, tl) as client:
        assert code_and_message(client) == (grpc.StatusCode.INVALID_ARGUMENT, "missing metadata `tenant-id`")
    with ps.page_service(tenant, None) as client:
        assert code_and_message(client) == (grpc.StatusCode.INVALID_ARGUMENT, "missing metadata `timeline-id`")


def test_lsn_waits_time_out_and_gc_refusals(pageserver_factory: PageserverFactory):
    settings = {"wait_lsn_timeout": "300ms", "compaction_threshold": 0, "image_creation_threshold": 2, "gc_horizon": 0}
    ps = pageserver_factory.create(settings).start()
    timeline = TimelineHandle.create(ps)
    # Two L0 layers, which compaction merges and images.
    timeline.ingest([Image(key(1), 0x10, page_of(1))])
    timeline.checkpoint()
    timeline.ingest([Image(key(1), 0x20, page_of(2))])
    with ps.page_service(timeline.tenant_id, timeline.timeline_id) as client:
        with pytest.raises(grpc.RpcError) as e:
            client.get_page(key(1), 0x1000)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert e.value.details() == http_message(lambda: timeline.get(key(1), 0x1000))
        # Below the GC cutoff (moved up to an image layer): gone for good.
        timeline.checkpoint()
        ps.http.compact(timeline.tenant_id, timeline.timeline_id, force_images=True)
        ps.http.gc(timeline.tenant_id, timeline.timeline_id)
        assert 0x10 < Lsn(timeline.info()["gc_cutoff_lsn"]) <= 0x20
        with pytest.raises(grpc.RpcError) as e:
            client.get_page(key(1), 0x10)
        assert e.value.code() == grpc.StatusCode.OUT_OF_RANGE
        assert e.value.details() == http_message(lambda: timeline.get(key(1), 0x10))
        # A batch with one page below the cutoff fails whole, and the stream goes on.
        answers = client.get_pages([(1, [(key(1), 0x20), (key(1), 0x10)]), (2, [(key(1), 0x20)])])
        assert answers[1].error.code == grpc.StatusCode.OUT_OF_RANGE.value[0]
        assert "below the GC cutoff" in answers[1].error.message
        assert [p.page for p in answers[2].pages] == [page_of(2)]


def test_pipelined_batches_match_the_model(timeline: TimelineHandle):
    """Many batches on one stream, all sent before any answer is read: every batch is answered
    once, by id, each page as the model says (absent keys as not found), in whatever order."""
    fill(timeline, seed=7, keys=40, batches=80)
    model = timeline.model
    keys = model.keys() + [key(1000), key(1001)]
    lsns = sorted({lsn for k in model.keys() for lsn in model.lsns(k)})
    rng = random.Random(11)
    batches = []
    for id in range(60):
        size = rng.choice((1, 2, 8, 32, 64))
        pages = [(rng.choice(keys), rng.choice(lsns + [0])) for _ in range(size)]
        batches.append((1000 + id, pages))
    with timeline.ps.page_service(timeline.tenant_id, timeline.timeline_id) as client:
        answers = client.get_pages(batches)
    for id, pages in batches:
        answer = answers[id]
        assert not answer.HasField("error"), answer.error
        assert len(answer.pages) == len(pages)
        for (k, lsn), got in zip(pages, answer.pages):
            at = lsn or model.last_lsn
            assert got.lsn == at
            want = model.get(k, at)
            assert (got.page if got.found else None) == want, f"batch {id}: {k.hex()} at {Lsn(at)}"
        assert answer.cost.layers >= 1


def test_batch_errors_fail_their_batch_only(timeline: TimelineHandle):
    timeline.ingest([Image(key(1), 0x10, page_of(1))])
    good = [(key(1), 0)]
    batches = [
        (1, good),
        (2, [(key(1), 0), (key(1)[:10], 0)]),
        (3, []),
        (4, good * 1025),
        (5, good * 1024),
    ]
    with timeline.ps.page_service(timeline.tenant_id, timeline.timeline_id) as client:
        answers = client.get_pages(batches)
    invalid = grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert [p.page for p in answers[1].pages] == [page_of(1)]
    assert (answers[2].error.code, answers[2].error.message) == (invalid, "pages[1].key: 10 bytes, expected 18")
    assert answers[2].pages == []
    assert (answers[3].error.code, answers[3].error.message) == (invalid, "pages: a batch asks for 1 to 1024 pages, this one for 0")
    assert answers[4].error.code == invalid and "this one for 1025" in answers[4].error.message
    assert len(answers[5].pages) == 1024 and not answers[5].HasField("error")


def test_a_batch_waits_for_its_lsn(timeline: TimelineHandle):
    """A batch at an LSN not yet ingested is answered once it is, while a later batch on the
    same stream that needs no wait is answered first."""
    timeline.ingest([Image(key(1), 0x10, page_of(1))])
    requests_sent = threading.Event()
    first_answer: list[int] = []

    def requests():
        yield pb.GetPagesRequest(id=1, pages=[pb.PageRef(key=key(1), lsn=0x50)])
        yield pb.GetPagesRequest(id=2, pages=[pb.PageRef(key=key(1), lsn=0x10)])
        requests_sent.set()
        # Keep the stream open until the waiting batch is answered.
        wait_until(lambda: len(first_answer) == 2 or None, timeout=30, what="both answers")

    with timeline.ps.page_service(timeline.tenant_id, timeline.timeline_id) as client:
        stream = client.get_pages_stream(requests())
        answer = next(stream)
        first_answer.append(answer.id)
        assert answer.id == 2 and answer.pages[0].page == page_of(1)
        timeline.ingest([Image(key(1), 0x50, page_of(5))])
        answer = next(stream)
        first_answer.append(answer.id)
        assert answer.id == 1 and answer.pages[0].page == page_of(5)
        assert list(stream) == []


def test_rel_size_and_exists(timeline: TimelineHandle):
    """Relation sizes from the data directory key space (here ingested directly: kind 1, the
    size as a big-endian u32)."""
    size_key = struct.pack(">BIIIBI", 1, 1663, 5, 16384, 0, 0)
    timeline.ingest([Image(size_key, 0x10, struct.pack(">I", 7))])
    timeline.ingest([Image(size_key, 0x20, struct.pack(">I", 9))])
    bad_key = struct.pack(">BIIIBI", 1, 1663, 5, 16385, 0, 0)
    timeline.ingest([Image(bad_key, 0x30, b"\x00\x01")])
    rel = (1663, 5, 16384, 0)
    with timeline.ps.page_service(timeline.tenant_id, timeline.timeline_id) as client:
        assert client.get_rel_size(rel, 0x10) == 7
        assert client.get_rel_size(rel, 0x1f) == 7
        assert client.get_rel_size(rel) == 9
        assert client.rel_exists(rel, 0x10) and client.rel_exists(rel)
        assert not client.rel_exists((1663, 5, 16384, 1))
        with pytest.raises(grpc.RpcError) as e:
            client.get_rel_size((1663, 5, 16384, 2), 0x10)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        assert e.value.details() == "relation 1663/5/16384 fork 2 does not exist at 0/10"
        with pytest.raises(grpc.RpcError) as e:
            client.get_rel_size((1663, 5, 16384, 4))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "rel.fork: 4 is not a fork number" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            client.stub.RelExists(pb.RelExistsRequest(lsn=0), metadata=client.metadata)
        assert (e.value.code(), e.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "rel: missing")
        # A stored size that is not four bytes is our corruption, said as such.
        timeline.ps.allowed_errors.append(".*page service call failed: the stored size of relation 1663/5/16385.*")
        with pytest.raises(grpc.RpcError) as e:
            client.get_rel_size((1663, 5, 16385, 0))
        assert e.value.code() == grpc.StatusCode.INTERNAL
        assert "the stored size of relation 1663/5/16385 fork 0" in e.value.details()
    # A rel block key still reads as a page.
    assert timeline.get(rel_key(), 0x30) is None


@pytest.fixture
def auth_server(pageserver_factory: PageserverFactory):
    keys = AuthKeys()
    ps = start_with_auth(pageserver_factory, keys)
    t1 = ps.http.tenant_create()["id"]
    tl1 = ps.http.timeline_create(t1)["timeline_id"]
    t2 = ps.http.tenant_create()["id"]
    ps.http.ingest(t1, tl1, [Image(key(1), 0x10, page_of(1))])
    return ps, keys, t1, tl1, t2


def test_auth_scopes(auth_server):
    ps, keys, t1, tl1, t2 = auth_server

    def refused(token, expect):
        with ps.page_service(t1, tl1, token=token) as client:
            with pytest.raises(grpc.RpcError) as e:
                client.get_page(key(1))
            assert (e.value.code(), e.value.details()) == expect
            # A stream is refused when it opens, with the same status.
            with pytest.raises(grpc.RpcError) as e:
                client.get_batch([(key(1), 0)])
            assert (e.value.code(), e.value.details()) == expect

    # The token option of the fixture falls back to the admin token: send an empty header.
    with ps.page_service(t1, tl1) as client:
        client.metadata = [m for m in client.metadata if m[0] != "authorization"]
        with pytest.raises(grpc.RpcError) as e:
            client.get_page(key(1))
        assert (e.value.code(), e.value.details()) == (grpc.StatusCode.UNAUTHENTICATED, "missing authorization header")
        # Ping needs no token.
        assert client.ping(3).id == 3
    refused(keys.tenant_token(t2), (grpc.StatusCode.PERMISSION_DENIED, "tenant id mismatch: permission denied"))
    refused(keys.token("safekeeperdata"), (grpc.StatusCode.PERMISSION_DENIED, "the token's scope grants nothing on this server"))
    with ps.page_service(t1, tl1, token="Bearer nonsense") as client:
        with pytest.raises(grpc.RpcError) as e:
            client.get_page(key(1))
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED and e.value.details().startswith("invalid token")
    for token in (keys.tenant_token(t1), keys.admin_token()):
        with ps.page_service(t1, tl1, token=token) as client:
            assert client.get_page(key(1)) == page_of(1)
            assert client.get_batch([(key(1), 0)]) == [page_of(1)]


def test_shutdown_ends_open_streams(timeline: TimelineHandle):
    """A stream that stays open does not hold up a graceful shutdown: it ends UNAVAILABLE, and
    the server exits cleanly."""
    timeline.ingest([Image(key(1), 0x10, page_of(1))])
    stop_sending = threading.Event()

    def requests():
        yield pb.GetPagesRequest(id=1, pages=[pb.PageRef(key=key(1), lsn=0)])
        stop_sending.wait(60)

    with timeline.ps.page_service(timeline.tenant_id, timeline.timeline_id) as client:
        stream = client.get_pages_stream(requests())
        assert next(stream).pages[0].page == page_of(1)
        timeline.ps.stop()
        with pytest.raises(grpc.RpcError) as e:
            next(stream)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        stop_sending.set()


def test_calls_are_counted(timeline: TimelineHandle):
    timeline.ingest([Image(key(1), 0x10, page_of(1))])
    with timeline.ps.page_service(timeline.tenant_id, timeline.timeline_id) as client:
        client.get_page(key(1))
        client.get_page_or_none(key(2))
        client.get_pages([(1, [(key(1), 0)] * 3), (2, [])])
    metrics = Metrics(timeline.http.metrics_text())

    def calls(method: str, code: str) -> float:
        return metrics.value("pageserver_grpc_requests_total", method=method, code=code)

    assert calls("GetPage", "OK") == 1
    assert calls("GetPage", "NOT_FOUND") == 1
    assert calls("GetPages", "OK") == 1
    assert calls("GetPages", "INVALID_ARGUMENT") == 1
    assert metrics.value("pageserver_grpc_batch_pages_count") == 2


def test_a_cold_batch_of_neighbours_reads_in_few_ios(timeline: TimelineHandle):
    """32 neighbouring pages of a layer file, none cached: the batch's read cost shows their
    value blocks read in one run, where one page at a time takes a read each."""
    timeline.ingest([Image(key(n), 0x10, page_of(n)) for n in range(64)])
    timeline.checkpoint()
    batch = [(key(n), 0x10) for n in range(16, 48)]
    with timeline.ps.page_service(timeline.tenant_id, timeline.timeline_id) as client:
        timeline.http.page_cache_drop()
        answer = client.get_pages([(1, batch)])[1]
        assert [p.page for p in answer.pages] == [page_of(n) for n in range(16, 48)]
        cost = answer.cost
        assert cost.val_miss >= 32 and cost.ios == cost.idx_miss + 1, cost
        timeline.http.page_cache_drop()
        ios = sum(client.get_page_response(k, lsn).cost.ios for k, lsn in batch)
        assert ios >= 32


class Requests:
    """A GetPages request stream fed from the test: `send` a batch, `close` to half-close."""

    def __init__(self):
        self.queue: "queue.Queue[object]" = queue.Queue()

    def send(self, id: int, pages) -> None:
        self.queue.put(pb.GetPagesRequest(id=id, pages=[pb.PageRef(key=k, lsn=lsn) for k, lsn in pages]))

    def close(self) -> None:
        self.queue.put(None)

    def __iter__(self):
        while (request := self.queue.get()) is not None:
            yield request


def test_a_stream_follows_its_timeline_through_detach_and_attach(timeline: TimelineHandle):
    """A stream opened before a detach does not go on reading the detached timeline: its
    batches fail while the tenant is away, and read the new attachment once it is back."""
    ps = timeline.ps
    timeline.ingest([Image(key(1), 0x10, page_of(1))])
    requests = Requests()
    with ps.page_service(timeline.tenant_id, timeline.timeline_id) as client:
        answers = client.get_pages_stream(requests)
        requests.send(1, [(key(1), 0)])
        assert next(answers).pages[0].page == page_of(1)

        ps.http.tenant_detach(timeline.tenant_id)
        requests.send(2, [(key(1), 0)])
        away = next(answers)
        assert away.id == 2 and away.error.code == grpc.StatusCode.NOT_FOUND.value[0], away

        ps.http.tenant_attach(timeline.tenant_id, generation=2)
        timeline.ingest([Image(key(1), 0x20, page_of(2))])
        requests.send(3, [(key(1), 0)])
        back = next(answers)
        assert back.id == 3 and back.pages[0].page == page_of(2) and back.pages[0].lsn == 0x20
        requests.close()
        assert list(answers) == []


def test_a_client_that_reads_nothing_cannot_hold_up_the_shutdown(timeline: TimelineHandle):
    """Batches of 1024 pages sent and no answer read, by a client whose receive window stays
    at 64 KiB: the stream's answers back up into flow control. A graceful stop still ends: the
    stream stops (whether it is waiting for its next request or for room for its answers, the
    answer budget decides), what is still open 30 s later is cut off, and the server flushes
    and exits 0."""
    timeline.ingest([Image(key(n), 0x10, page_of(n)) for n in range(64)])
    requests = Requests()
    big = [(key(n % 64), 0) for n in range(1024)]
    ps = timeline.ps
    options = [
        ("grpc.max_receive_message_length", 64 << 20),
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.http2.bdp_probe", 0),
        ("grpc.http2.lookahead_bytes", 65536),
    ]
    metadata = [("tenant-id", timeline.tenant_id), ("timeline-id", timeline.timeline_id)]
    with grpc.insecure_channel(ps.grpc_addr, options=options) as channel:
        answers = pb_grpc.PageServiceStub(channel).GetPages(iter(requests), metadata=metadata, timeout=120)
        for id in range(40):
            requests.send(id, big)
        # The first answer proves the stream is being served; the rest are left unread.
        assert next(answers).id in range(40)
        ps.allowed_errors.append(".*page service: calls still open 30 s after shutdown began were cut off.*")
        assert ps.stop(timeout=90) == 0
        assert ps.log_contains("shut down cleanly")
        requests.close()


def test_page_service_connections_count_under_the_connection_cap(pageserver_factory: PageserverFactory):
    """`max_connections` caps both doors together: with the cap taken, a new channel's call
    waits until a connection closes. The HTTP accept loop keeps one place for its next
    connection, so with a cap of 3 and no HTTP connection open, two channels take the rest."""
    cap = 3
    ps = pageserver_factory.start({"max_connections": cap})
    gc.collect()

    def open_connections() -> float:
        """Scraped over a connection of its own, closed after: no kept-alive one counts."""
        conn = HTTPConnection("127.0.0.1", ps.port, timeout=10)
        try:
            conn.request("GET", "/metrics", headers={"Connection": "close"})
            return Metrics(conn.getresponse().read().decode()).value("pageserver_http_connections")
        finally:
            conn.close()

    # Only the scraping connection, then two channels: the cap is reached.
    wait_until(lambda: open_connections() == 1, what="only the scraping connection open")
    first, second = ps.page_service(), ps.page_service()
    assert first.ping(1).id == 1 and second.ping(2).id == 2
    wait_until(lambda: open_connections() == 1 + 2, what="the scrape and two channels open")
    third = ps.page_service()
    with pytest.raises(grpc.RpcError) as e:
        third.stub.Ping(pb.PingRequest(id=3), timeout=1.0)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # The page service's connections never take the places kept for HTTP.
    conn = HTTPConnection("127.0.0.1", ps.port, timeout=10)
    conn.request("GET", "/v1/status", headers={"Connection": "close"})
    assert conn.getresponse().status == 200
    conn.close()
    first.close()
    assert third.stub.Ping(pb.PingRequest(id=3), timeout=20, wait_for_ready=True).id == 3
    second.close()
    third.close()


def test_a_slow_reader_sees_the_shutdown_after_its_queued_answers(timeline: TimelineHandle):
    """Batches in flight, answers read slowly: at a graceful stop the stream ends with
    UNAVAILABLE after the answers already sent, never as if it had succeeded, and the server
    has no need to cut anything off."""
    timeline.ingest([Image(key(n), 0x10, page_of(n)) for n in range(64)])
    requests = Requests()
    batch = [(key(n), 0) for n in range(64)]
    ps = timeline.ps
    with ps.page_service(timeline.tenant_id, timeline.timeline_id) as client:
        answers = client.get_pages_stream(requests)
        for id in range(20):
            requests.send(id, batch)
        assert next(answers).id in range(20)
        stopping = threading.Thread(target=lambda: ps.stop(timeout=60))
        stopping.start()
        seen = 1
        with pytest.raises(grpc.RpcError) as e:
            for answer in answers:
                assert [p.page for p in answer.pages] == [page_of(n) for n in range(64)]
                seen += 1
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value
        assert e.value.details() == "the pageserver is shutting down"
        assert seen <= 20
        stopping.join()
        requests.close()
    assert "were cut off" not in ps.log_since_start()


H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def h2_frame(kind: int, flags: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + b"\0\0\0\0" + payload


def read_h2_frame(sock: socket.socket) -> tuple[int, int, bytes]:
    """The next frame's type, flags and payload."""

    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            assert chunk, "the server closed the connection"
            data += chunk
        return data

    header = exactly(9)
    length = int.from_bytes(header[:3], "big")
    return header[3], header[4], exactly(length)


def closed_by_server(sock: socket.socket) -> bool:
    """Reads until the server closes the connection (within the socket's timeout)."""
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return True


def test_a_connection_without_its_handshake_gives_its_place_back(pageserver_factory: PageserverFactory):
    """A page service connection holds a place under the cap from the moment it is accepted:
    one that sends nothing, or stalls inside its HTTP/2 handshake, is closed after
    `grpc_handshake_timeout`, and the channel waiting for its place gets it. A connection
    that finished its handshake stays open, however long it is idle."""
    cap = 4  # one place kept for HTTP, three for the page service
    ps = pageserver_factory.start({"max_connections": cap, "grpc_handshake_timeout": "1s"})
    gc.collect()
    # A complete handshake (the preface and a SETTINGS frame), first of all.
    complete = socket.create_connection(("127.0.0.1", ps.grpc_port), timeout=20)
    complete.sendall(H2_PREFACE + h2_frame(0x4, 0, b""))
    # Then one that sends nothing and one that stops inside its first frame.
    silent = socket.create_connection(("127.0.0.1", ps.grpc_port), timeout=20)
    stalled = socket.create_connection(("127.0.0.1", ps.grpc_port), timeout=20)
    stalled.sendall(H2_PREFACE + h2_frame(0x4, 0, b"\0\x03\0\0\0\x10")[:12])
    # The cap is reached: a channel waits, and gets a place once the two are closed.
    waiting = ps.page_service()
    assert waiting.stub.Ping(pb.PingRequest(id=7), timeout=20, wait_for_ready=True).id == 7
    assert closed_by_server(silent) and closed_by_server(stalled)
    # The complete one is still HTTP/2's, though it has been open longer than the timeout.
    complete.sendall(h2_frame(0x6, 0, b"stillhere"[:8]))
    while True:
        kind, flags, payload = read_h2_frame(complete)
        if kind == 0x6 and flags & 0x1:
            assert payload == b"stillher"
            break
    for sock in (complete, silent, stalled):
        sock.close()
    waiting.close()
