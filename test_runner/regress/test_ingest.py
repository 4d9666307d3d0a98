"""Ingest: the body format, the batch rules, and that a refused batch changes nothing.

A batch is validated whole before any of it is applied: LSNs never decrease within it, its
first LSN is above last_record_lsn (409 otherwise), one version per key and LSN, values within
max_value_size, the body well formed (400 naming the record and byte offset) and within
max_request_body_size (413)."""

from __future__ import annotations

import socket
import struct
import time

import pytest
import requests

from fixtures.http import PageserverApiError, api_error
from fixtures.ingest import (
    KIND_DELTA,
    KIND_IMAGE,
    RECORD_HEADER,
    Image,
    delta,
    encode_batch,
    encode_raw,
    key,
    page_of,
)
from fixtures.plugin import PageserverFactory
from fixtures.timeline import TimelineHandle
from fixtures.utils import Lsn

# What a client sees when the server closes the connection under its request.
CONNECTION_LOST = (requests.exceptions.ConnectionError, requests.exceptions.ChunkedEncodingError)

HEADER = RECORD_HEADER.size  # 31 bytes: key 18, lsn 8, kind 1, len 4
KIND_OFFSET = 26
LEN_OFFSET = 27


def seeded(timeline: TimelineHandle) -> None:
    """Two acknowledged batches, so refusals can be checked against existing state."""
    timeline.ingest([Image(key(1), 0x10, page_of(1)), delta(key(2), 0x10, (0, b"abc"), will_init=True)])
    timeline.ingest([delta(key(1), 0x20, (100, b"patched"))])


def refused(timeline: TimelineHandle, body: bytes, status: int, *contains: str) -> str:
    """Sends `body`, expects `status` with every string of `contains` in the message, and checks
    that nothing changed: LSNs, and every page at every LSN."""
    before = timeline.info()
    r = timeline.http.request(
        "POST",
        f"/v1/tenant/{timeline.tenant_id}/timeline/{timeline.timeline_id}/ingest",
        data=body,
        headers={"Content-Type": "application/octet-stream"},
    )
    assert r.status_code == status, r.text
    msg = api_error(r).msg
    for c in contains:
        assert c in msg, f"{c!r} not in {msg!r}"
    after = timeline.info()
    assert (after["last_record_lsn"], after["disk_consistent_lsn"]) == (before["last_record_lsn"], before["disk_consistent_lsn"])
    assert after["state"] == "Active"
    timeline.verify()
    for k in (key(1), key(2), key(3)):
        for lsn in (0x21, 0x30, 0x40):
            if lsn <= timeline.model.last_lsn:
                timeline.check_read(k, lsn)
    return msg


def test_ingest_response_and_read_back(timeline: TimelineHandle):
    batch = [Image(key(1), 0x10, page_of(1)), Image(key(2), 0x10, page_of(2)), Image(key(1), 0x18, page_of(3))]
    resp = timeline.ingest(batch)
    assert resp == {"records": 3, "last_record_lsn": "0/18", "disk_consistent_lsn": "0/0"}
    assert timeline.get(key(1), 0x10) == page_of(1)
    assert timeline.get(key(1), 0x17) == page_of(1)
    assert timeline.get(key(1), 0x18) == page_of(3)
    assert timeline.get(key(1), "latest") == page_of(3)
    assert timeline.get(key(2), "latest") == page_of(2)
    assert timeline.get(key(1), 0xF) is None
    info = timeline.info()
    assert info["last_record_lsn"] == "0/18" and info["layers"]["open"] == 1
    assert info["in_memory_bytes"] > 3 * 8192


def test_empty_body_is_an_empty_batch(timeline: TimelineHandle):
    seeded(timeline)
    resp = timeline.http.ingest(timeline.tenant_id, timeline.timeline_id, b"")
    assert resp == {"records": 0, "last_record_lsn": "0/20", "disk_consistent_lsn": "0/0"}


def test_same_lsn_for_many_keys_and_many_lsns_for_one_key(timeline: TimelineHandle):
    batch = [Image(key(k), 0x10, page_of(k)) for k in range(5)]
    batch += [delta(key(0), 0x11 + i, (i, bytes([i]))) for i in range(5)]
    timeline.ingest(batch)
    timeline.verify()


@pytest.mark.parametrize(
    "name,body,contains",
    [
        ("truncated_header", b"\x00" * 10, ["record 0 at byte 0", "header"]),
        ("unknown_kind", encode_raw(key(3), 0x30, 7, b"xyz"), [f"record 0 at byte {KIND_OFFSET}", "kind 7"]),
        ("truncated_payload", encode_raw(key(3), 0x30, KIND_IMAGE, b"x" * 10, length=100), [f"record 0 at byte {LEN_OFFSET}", "100"]),
        ("payload_over_limit", encode_raw(key(3), 0x30, KIND_IMAGE, b"", length=0xFFFFFFFF), [f"record 0 at byte {LEN_OFFSET}", "4294967295"]),
        ("delta_without_header", encode_raw(key(3), 0x30, KIND_DELTA, b"\x00"), [f"record 0 at byte {HEADER}", "delta"]),
        ("delta_bad_will_init", encode_raw(key(3), 0x30, KIND_DELTA, b"\x02\x00\x00"), [f"record 0 at byte {HEADER}", "delta"]),
        (
            "delta_count_too_high",
            encode_raw(key(3), 0x30, KIND_DELTA, struct.pack(">BHII", 0, 2, 0, 1) + b"x"),
            [f"record 0 at byte {HEADER}", "delta"],
        ),
        (
            "delta_patch_data_truncated",
            encode_raw(key(3), 0x30, KIND_DELTA, struct.pack(">BHII", 0, 1, 0, 50) + b"x"),
            [f"record 0 at byte {HEADER}", "delta"],
        ),
        (
            "delta_trailing_bytes",
            encode_raw(key(3), 0x30, KIND_DELTA, struct.pack(">BHII", 0, 1, 0, 1) + b"xEXTRA"),
            [f"record 0 at byte {HEADER}", "trailing"],
        ),
    ],
)
def test_malformed_body(timeline: TimelineHandle, name: str, body: bytes, contains: list[str]):
    seeded(timeline)
    refused(timeline, body, 400, "ingest body", *contains)


def test_malformed_second_record_names_it(timeline: TimelineHandle):
    """A good record followed by a bad one: the error names record 1 and where it starts, and
    the good record is not applied either."""
    seeded(timeline)
    good = encode_batch([Image(key(3), 0x30, page_of(3))])
    refused(timeline, good + b"\x01\x02\x03", 400, f"record 1 at byte {len(good)}")
    refused(timeline, good + encode_raw(key(3), 0x31, 9, b""), 400, f"record 1 at byte {len(good) + KIND_OFFSET}", "kind 9")
    assert timeline.get(key(3), "latest") is None


def test_lsn_backwards_within_batch(timeline: TimelineHandle):
    seeded(timeline)
    body = encode_batch([Image(key(3), 0x40, page_of(3)), Image(key(1), 0x41, page_of(4)), Image(key(2), 0x30, page_of(5))])
    refused(timeline, body, 400, "record 2", "backwards")
    assert timeline.get(key(3), "latest") is None


@pytest.mark.parametrize("first", [0x20, 0x1F, 0x10, 0x1, 0x0], ids=lambda x: f"lsn_{x:x}")
def test_batch_not_above_last_record_lsn_is_409(timeline: TimelineHandle, first: int):
    seeded(timeline)
    body = encode_batch([Image(key(3), first, page_of(3)), Image(key(3), 0x50, page_of(4))])
    refused(timeline, body, 409, str(Lsn(first)))
    assert timeline.get(key(3), "latest") is None
    # The next LSN up is fine.
    timeline.ingest([Image(key(3), 0x21, page_of(3))])
    timeline.verify()


def test_batch_at_or_below_durable_lsn_is_409(timeline: TimelineHandle):
    seeded(timeline)
    timeline.checkpoint()
    msg = refused(timeline, encode_batch([Image(key(3), 0x20, page_of(3))]), 409, "0/20")
    assert "durable" in msg


def test_duplicate_key_at_one_lsn(timeline: TimelineHandle):
    seeded(timeline)
    body = encode_batch([Image(key(3), 0x30, page_of(3)), Image(key(4), 0x30, page_of(4)), delta(key(3), 0x30, (0, b"x"))])
    refused(timeline, body, 400, "record 2", key(3).hex(), "twice")
    # The same key at two LSNs of one batch is fine.
    timeline.ingest([Image(key(3), 0x30, page_of(3)), delta(key(3), 0x31, (0, b"x"))])
    timeline.verify()


def test_batch_spanning_too_many_lsns(timeline: TimelineHandle):
    seeded(timeline)
    body = encode_batch([Image(key(3), 0x30, page_of(3)), Image(key(3), 0x30 + (1 << 32), page_of(4))])
    refused(timeline, body, 400, "spans")


def test_lsns_far_apart_across_batches(timeline: TimelineHandle):
    """Batches may jump far ahead; the layers still tile the LSN range and read back."""
    seeded(timeline)
    timeline.ingest([Image(key(3), 5 << 32, page_of(3))])
    timeline.ingest([delta(key(3), (9 << 32) + 7, (0, b"far"))])
    timeline.verify()
    timeline.checkpoint()
    timeline.verify()


def test_value_too_large(pageserver_factory: PageserverFactory):
    ps = pageserver_factory.start({"max_value_size": "16KiB"})
    timeline = TimelineHandle.create(ps)
    timeline.model.max_value_size = 16 << 10
    seeded(timeline)
    # Refused by the body decoder (the payload alone is too long) ...
    refused(timeline, encode_batch([Image(key(3), 0x30, bytes(17 << 10))]), 400, "record 0", "over the")
    refused(timeline, encode_batch([Image(key(3), 0x30, page_of(3)), Image(key(4), 0x31, bytes(1 << 20))]), 400, "record 1", "over the")
    big_delta = delta(key(1), 0x30, *[(i * 1000, bytes(1000)) for i in range(17)])
    refused(timeline, encode_batch([big_delta]), 400, "over the")
    # ... or by the batch check, which counts the stored form (kind byte and patch headers).
    refused(timeline, encode_batch([Image(key(3), 0x30, bytes((16 << 10) + 64))]), 400, "record 0", "over the limit")
    # Exactly the limit is fine.
    timeline.ingest([Image(key(3), 0x30, page_of(3, 16 << 10))])
    timeline.checkpoint()
    timeline.verify()


@pytest.mark.parametrize("over", [1, 63])
def test_image_just_over_max_value_size_is_refused(pageserver_factory: PageserverFactory, over: int):
    """Not only what the body decoder refuses: an image a few bytes over the limit fits the
    stored form's slack, but no read could return it, so it is refused too."""
    ps = pageserver_factory.start({"max_value_size": "16KiB"})
    timeline = TimelineHandle.create(ps)
    seeded(timeline)
    refused(timeline, encode_batch([Image(key(3), 0x30, bytes((16 << 10) + over))]), 400, "over the limit")


@pytest.mark.parametrize("will_init", [True, False], ids=["will_init", "on_image"])
def test_delta_past_max_value_size_is_refused(timeline: TimelineHandle, will_init: bool):
    """A small delta whose patch would grow the page past max_value_size could never be
    applied by a read: refused at ingest."""
    seeded(timeline)
    refused(timeline, encode_batch([delta(key(1), 0x30, (1 << 30, b"x"), will_init=will_init)]), 400, "record 0", "over the limit")
    # Up to the limit is fine.
    timeline.ingest([delta(key(1), 0x30, ((1 << 20) - 1, b"x"), will_init=will_init)])
    timeline.verify()


def post_over_limit(timeline: TimelineHandle, data, limit: int) -> None:
    """Sends a body over max_request_body_size: the answer is 413, or the connection is reset
    before the client can read it. The server answers once it has read `limit` bytes and
    closes the connection with the rest of the body unread, which makes the kernel reset it
    (see test_body_over_limit_refused_from_its_length). Either way nothing is applied."""
    before = timeline.info()
    try:
        r = timeline.http.one_shot().request("POST", f"/v1/tenant/{timeline.tenant_id}/timeline/{timeline.timeline_id}/ingest", data=data)
    except CONNECTION_LOST:
        pass
    else:
        assert r.status_code == 413, r.text
        assert str(limit) in api_error(r).msg
    after = timeline.info()
    assert (after["last_record_lsn"], after["disk_consistent_lsn"]) == (before["last_record_lsn"], before["disk_consistent_lsn"])


def test_body_over_max_request_body_size_is_413(pageserver_factory: PageserverFactory):
    ps = pageserver_factory.start({"max_request_body_size": "64KiB"})
    timeline = TimelineHandle.create(ps)
    seeded(timeline)
    batch = [Image(key(10 + i), 0x30, page_of(i)) for i in range(7)]  # just under 64 KiB
    assert len(encode_batch(batch)) < 64 << 10
    big = batch + [Image(key(30), 0x30, page_of(30)), Image(key(31), 0x30, page_of(31))]
    post_over_limit(timeline, encode_batch(big), 65536)
    timeline.verify()
    timeline.ingest(batch)
    timeline.verify()


def test_body_over_limit_refused_from_its_length(pageserver_factory: PageserverFactory):
    ps = pageserver_factory.start({"max_request_body_size": "64KiB"})
    timeline = TimelineHandle.create(ps)
    with socket.create_connection(("127.0.0.1", ps.port), timeout=2.0) as s:
        s.sendall(
            f"POST /v1/tenant/{timeline.tenant_id}/timeline/{timeline.timeline_id}/ingest HTTP/1.1\r\n"
            f"Host: 127.0.0.1\r\nContent-Type: application/octet-stream\r\nContent-Length: {1 << 20}\r\n\r\n".encode()
        )
        # Only the headers are sent: the answer must not wait for a body it will refuse.
        answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413"), answer


def test_largest_lsn_is_reserved_and_the_one_below_works(timeline: TimelineHandle):
    """LSN FFFFFFFF/FFFFFFFF is the exclusive end of every layer's LSN range, so it cannot hold a
    version: a batch naming it is refused whole. The LSN below it is an ordinary LSN, through a
    flush and a restart."""
    seeded(timeline)
    top = (1 << 64) - 1
    refused(timeline, encode_batch([Image(key(3), top, page_of(3))]), 400, "record 0 of the batch: LSN FFFFFFFF/FFFFFFFF is reserved")
    timeline.ingest([Image(key(3), top - 1, page_of(3))])
    timeline.verify()
    timeline.checkpoint()
    timeline.verify()
    timeline.ps.restart()
    timeline.verify()


def test_read_waits_for_lsn_then_times_out(pageserver_factory: PageserverFactory):
    ps = pageserver_factory.start({"wait_lsn_timeout": "300ms"})
    ps.allowed_errors.append("request failed: timed out after 300ms waiting for LSN")
    timeline = TimelineHandle.create(ps)
    seeded(timeline)
    started = time.monotonic()
    with pytest.raises(PageserverApiError) as e:
        timeline.get(key(1), 0x21)
    assert time.monotonic() - started >= 0.3
    assert e.value.status_code == 503
    assert "0/21" in e.value.msg and "0/20" in e.value.msg
    # `latest` and LSNs already ingested never wait.
    timeline.check_read(key(1), 0x20)
    assert timeline.get(key(1), "latest") == timeline.model.get(key(1), 0x20)


def test_large_batch_and_streamed_body(pageserver_factory: PageserverFactory):
    """Bodies larger than a web framework's usual default limit (2 MB) are fine up to
    max_request_body_size, whether sent with a length or streamed in chunks; past it, 413."""
    ps = pageserver_factory.start({"max_request_body_size": "4MiB"})
    timeline = TimelineHandle.create(ps)
    batch = [Image(key(i), 0x10, page_of(i)) for i in range(400)]  # 3.2 MiB
    timeline.ingest(batch)
    body = encode_batch([Image(key(i), 0x20, page_of(i)) for i in range(600)])  # 4.8 MiB

    def chunks():
        for i in range(0, len(body), 1 << 16):
            yield body[i : i + (1 << 16)]

    for data in (body, chunks()):
        post_over_limit(timeline, data, 4194304)
    small = encode_batch([Image(key(i), 0x20, page_of(1000 + i)) for i in range(300)])
    r = timeline.http.request(
        "POST",
        f"/v1/tenant/{timeline.tenant_id}/timeline/{timeline.timeline_id}/ingest",
        data=(small[i : i + 1000] for i in range(0, len(small), 1000)),
    )
    assert r.status_code == 200 and r.json()["records"] == 300, r.text
    timeline.model.apply([Image(key(i), 0x20, page_of(1000 + i)) for i in range(300)])
    # Chunks that cut records anywhere: tiny ones (gathered by the server), one of 100 KiB
    # (kept as it came), then tiny ones again.
    mixed = [Image(key(i), 0x30, page_of(2000 + i)) for i in range(40)]
    body = encode_batch(mixed)
    pieces = [body[i : min(i + 7, 30_000)] for i in range(0, 30_000, 7)] + [body[30_000:132_400]]
    pieces += [body[i : i + 13] for i in range(132_400, len(body), 13)]
    assert b"".join(pieces) == body
    r = timeline.http.request(
        "POST",
        f"/v1/tenant/{timeline.tenant_id}/timeline/{timeline.timeline_id}/ingest",
        data=iter(pieces),
    )
    assert r.status_code == 200 and r.json()["records"] == 40, r.text
    timeline.model.apply(mixed)
    timeline.checkpoint()
    timeline.verify(keys=[key(i) for i in range(0, 400, 37)])
