"""Every endpoint of the HTTP API, the happy path and the ways to get it wrong: malformed ids,
unknown tenants and timelines, bad bodies, unknown routes and methods. Every error must be
JSON `{"msg": ...}` (the client checks that on each one)."""

from __future__ import annotations

import socket
import time

import pytest

from fixtures.http import PageserverApiError, api_error
from fixtures.ingest import Image, encode_batch, key, page_of
from fixtures.pageserver import Pageserver
from fixtures.timeline import TimelineHandle

TENANT = "0123456789abcdef0123456789abcdef"
TIMELINE = "fedcba9876543210fedcba9876543210"
MISSING = "00000000000000000000000000000bad"

MALFORMED_IDS = [
    ("short", "0123"),
    ("long", TENANT + "00"),
    ("not_hex", "0123456789abcdef0123456789abcdeg"),
    ("unicode", "0123456789abcdef0123456789abcdé"),
]


def expect_error(status: int, fn, *args, contains: str = "", **kwargs) -> PageserverApiError:
    with pytest.raises(PageserverApiError) as e:
        fn(*args, **kwargs)
    assert e.value.status_code == status, e.value
    assert contains.lower() in e.value.msg.lower(), e.value.msg
    return e.value


def test_status(pageserver: Pageserver):
    before = time.time()
    status = pageserver.http.status()
    assert status["id"] == pageserver.server_id
    assert status["version"] == "0.1.0"
    assert status["testing"] == pageserver.binary.testing
    # The server started just now (allow for a coarse clock).
    assert before - 120 <= status["started_at"] <= time.time() + 1
    assert set(status) >= {"id", "version", "testing", "started_at"}


def test_tenant_lifecycle(pageserver: Pageserver):
    http = pageserver.http
    assert http.tenant_list() == []

    created = http.tenant_create(TENANT)
    assert created == {
        "id": TENANT,
        "generation": 1,
        "state": "Active",
        "broken_reason": None,
        "timelines": 0,
        "resident_layers": 0,
        "layers_total": 0,
        "resident_bytes": 0,
        "layer_bytes_total": 0,
    }
    generated = http.tenant_create()
    assert len(generated["id"]) == 32 and generated["id"] != TENANT
    int(generated["id"], 16)

    assert sorted(t["id"] for t in http.tenant_list()) == sorted([TENANT, generated["id"]])
    assert http.tenant_info(TENANT)["state"] == "Active"
    # Upper-case hex names the same tenant.
    assert http.tenant_info(TENANT.upper())["id"] == TENANT

    expect_error(409, http.tenant_create, TENANT, contains="already exists")
    expect_error(409, http.tenant_create, TENANT.upper(), contains="already exists")
    expect_error(404, http.tenant_info, MISSING, contains=MISSING)

    http.tenant_delete(generated["id"])
    expect_error(404, http.tenant_info, generated["id"])
    expect_error(404, http.tenant_delete, generated["id"])
    assert [t["id"] for t in http.tenant_list()] == [TENANT]
    # The id can be used again after deletion.
    assert http.tenant_create(generated["id"])["id"] == generated["id"]


@pytest.mark.parametrize("what,bad_id", MALFORMED_IDS, ids=[m[0] for m in MALFORMED_IDS])
def test_malformed_ids(pageserver: Pageserver, what: str, bad_id: str):
    http = pageserver.http
    http.tenant_create(TENANT)
    http.timeline_create(TENANT, TIMELINE)
    expect_error(400, http.tenant_create, bad_id, contains="tenant id")
    expect_error(400, http.tenant_info, bad_id, contains="tenant id")
    expect_error(400, http.tenant_delete, bad_id, contains="tenant id")
    expect_error(400, http.timeline_list, bad_id, contains="tenant id")
    expect_error(400, http.timeline_create, TENANT, bad_id, contains="timeline id")
    expect_error(400, http.timeline_info, TENANT, bad_id, contains="timeline id")
    expect_error(400, http.timeline_info, bad_id, TIMELINE, contains="tenant id")
    expect_error(400, http.timeline_delete, TENANT, bad_id, contains="timeline id")
    expect_error(400, http.checkpoint, TENANT, bad_id, contains="timeline id")
    expect_error(400, http.layers, bad_id, TIMELINE, contains="tenant id")
    expect_error(400, http.ingest, TENANT, bad_id, b"", contains="timeline id")
    expect_error(400, http.get_page, bad_id, TIMELINE, key(0), 1, contains="tenant id")
    # Nothing was created or deleted by the refused requests.
    assert [t["id"] for t in http.tenant_list()] == [TENANT]
    assert [t["timeline_id"] for t in http.timeline_list(TENANT)] == [TIMELINE]


@pytest.mark.parametrize(
    "body,contains",
    [
        (b"{", "invalid request body"),
        (b"[]", "invalid request body"),
        (b'{"new_tenant_id": 5}', "invalid request body"),
        (b'{"tenant_id": "0123456789abcdef0123456789abcdef"}', "unknown field"),
        (b'{"new_tenant_id": "xyz"}', "tenant id"),
        (b"\xff\xfe", "invalid request body"),
    ],
    ids=["truncated", "array", "wrong_type", "unknown_field", "bad_id", "not_utf8"],
)
def test_tenant_create_bad_body(pageserver: Pageserver, body: bytes, contains: str):
    r = pageserver.http.request("POST", "/v1/tenant", data=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert contains in api_error(r).msg
    assert pageserver.http.tenant_list() == []


def test_create_with_empty_or_null_body(pageserver: Pageserver):
    http = pageserver.http
    for body in (b"", b"{}"):
        r = http.request("POST", "/v1/tenant", data=body)
        assert r.status_code == 201, r.text
        tenant = r.json()["id"]
        r = http.request("POST", f"/v1/tenant/{tenant}/timeline", data=body)
        assert r.status_code == 201, r.text
        assert r.json()["tenant_id"] == tenant
    r = http.request("POST", "/v1/tenant", json={"new_tenant_id": None})
    assert r.status_code == 201, r.text
    # A body of only whitespace is not JSON: refused, as docs/openapi.yaml says, and nothing made.
    before = len(http.tenant_list())
    for path in ("/v1/tenant", f"/v1/tenant/{tenant}/timeline"):
        r = http.request("POST", path, data=b"\r\n")
        assert r.status_code == 400 and "invalid request body" in r.json()["msg"], r.text
    assert len(http.tenant_list()) == before


def test_timeline_lifecycle(pageserver: Pageserver):
    http = pageserver.http
    expect_error(404, http.timeline_list, TENANT)
    expect_error(404, http.timeline_create, TENANT, TIMELINE)
    http.tenant_create(TENANT)
    assert http.timeline_list(TENANT) == []

    info = http.timeline_create(TENANT, TIMELINE)
    assert info == {
        "tenant_id": TENANT,
        "timeline_id": TIMELINE,
        "last_record_lsn": "0/0",
        "disk_consistent_lsn": "0/0",
        "gc_cutoff_lsn": "0/0",
        "ancestor_timeline_id": None,
        "ancestor_lsn": None,
        "remote_consistent_lsn": "0/0",
        "state": "Active",
        "broken_reason": None,
        "layers": {"open": 0, "frozen": 0, "delta": 0, "l0": 0, "l1": 0, "image": 0},
        "in_memory_bytes": 0,
        "delta_layer_bytes": 0,
        "image_layer_bytes": 0,
        "resident_layers": 0,
        "layers_total": 0,
        "resident_bytes": 0,
        "layer_bytes_total": 0,
    }
    other = http.timeline_create(TENANT)["timeline_id"]
    assert len(other) == 32 and other != TIMELINE
    assert sorted(t["timeline_id"] for t in http.timeline_list(TENANT)) == sorted([TIMELINE, other])
    assert http.tenant_info(TENANT)["timelines"] == 2
    assert http.timeline_info(TENANT, TIMELINE) == info

    expect_error(409, http.timeline_create, TENANT, TIMELINE, contains="already exists")
    expect_error(404, http.timeline_info, TENANT, MISSING, contains=MISSING)
    expect_error(404, http.timeline_info, MISSING, TIMELINE, contains=MISSING)
    expect_error(404, http.timeline_delete, TENANT, MISSING)
    expect_error(404, http.checkpoint, TENANT, MISSING)
    expect_error(404, http.layers, TENANT, MISSING)
    expect_error(404, http.one_shot().ingest, TENANT, MISSING, [Image(key(0), 1, page_of(0))])
    expect_error(404, http.get_page, TENANT, MISSING, key(0), "latest")

    http.timeline_delete(TENANT, other)
    expect_error(404, http.timeline_info, TENANT, other)
    assert [t["timeline_id"] for t in http.timeline_list(TENANT)] == [TIMELINE]
    # The same timeline id under another tenant is a different timeline.
    http.tenant_create(MISSING)
    http.timeline_create(MISSING, TIMELINE)
    assert http.timeline_info(MISSING, TIMELINE)["tenant_id"] == MISSING


@pytest.mark.parametrize(
    "body,contains",
    [
        (b'{"new_timeline_id": "nope"}', "timeline id"),
        (b'{"timeline_id": "fedcba9876543210fedcba9876543210"}', "unknown field"),
        (b"null", "invalid type: null"),
        (b"not json", "invalid request body"),
    ],
    ids=["bad_id", "unknown_field", "null", "not_json"],
)
def test_timeline_create_bad_body(pageserver: Pageserver, body: bytes, contains: str):
    pageserver.http.tenant_create(TENANT)
    r = pageserver.http.request("POST", f"/v1/tenant/{TENANT}/timeline", data=body)
    # JSON null is not a request object (an empty body is the way to send none): refused, with
    # nothing created, like any other body that does not parse.
    assert r.status_code == 400, r.text
    assert contains in api_error(r).msg
    assert pageserver.http.timeline_list(TENANT) == []


@pytest.mark.parametrize(
    "method,path",
    [
        ("GET", "/"),
        ("GET", "/v2/status"),
        ("GET", "/v1/tenants"),
        ("POST", "/v1/tenant/x/y/z"),
        ("GET", f"/v1/tenant/{TENANT}/timeline/{TIMELINE}/pages"),
        ("GET", "/metrics/extra"),
    ],
)
def test_unknown_route_is_404_json(pageserver: Pageserver, method: str, path: str):
    r = pageserver.http.request(method, path)
    assert r.status_code == 404, r.text
    assert path in api_error(r).msg


@pytest.mark.parametrize(
    "method,path",
    [
        ("POST", "/v1/status"),
        ("DELETE", "/v1/tenant"),
        ("PUT", f"/v1/tenant/{TENANT}"),
        ("PATCH", f"/v1/tenant/{TENANT}/timeline"),
        ("GET", f"/v1/tenant/{TENANT}/timeline/{TIMELINE}/ingest"),
        ("POST", f"/v1/tenant/{TENANT}/timeline/{TIMELINE}/page"),
        ("GET", f"/v1/tenant/{TENANT}/timeline/{TIMELINE}/checkpoint"),
        ("POST", f"/v1/tenant/{TENANT}/timeline/{TIMELINE}/layer"),
        ("POST", "/v1/page_cache"),
        ("GET", "/v1/page_cache/drop"),
        ("POST", "/metrics"),
        ("GET", "/v1/failpoints"),
    ],
)
def test_wrong_method_is_405_json(pageserver: Pageserver, method: str, path: str):
    r = pageserver.http.request(method, path)
    assert r.status_code == 405, r.text
    msg = api_error(r).msg
    assert method in msg and path in msg
    assert r.headers.get("allow"), r.headers


def test_page_cache_endpoints(timeline: TimelineHandle):
    http = timeline.http
    stats = http.page_cache()
    assert stats["capacity_bytes"] == 16 << 20
    for kind in ("file_pages", "index_pages", "materialized_pages"):
        assert set(stats[kind]) >= {"hits", "misses", "inserts", "evictions", "bytes_resident"}
    assert stats["miss_waits"] == 0
    # Values big enough to fill ephemeral blocks, which are pre-warmed into the cache.
    batch = [Image(key(i), 0x10 + i, page_of(i)) for i in range(16)]
    timeline.ingest(batch)
    timeline.checkpoint()
    for r in batch:
        timeline.check_read(r.key, r.lsn)
    stats = http.page_cache()
    assert stats["file_pages"]["inserts"] > 0
    assert stats["file_pages"]["bytes_resident"] > 0
    dropped = http.page_cache_drop()
    assert set(dropped) == {"file_pages", "index_pages", "materialized_pages"}
    assert dropped["file_pages"] > 0
    assert dropped["index_pages"] > 0, "the reads walked the delta layer's index"
    after = http.page_cache()
    for kind in ("file_pages", "index_pages", "materialized_pages"):
        assert after[kind]["bytes_resident"] == 0
    # Reads still work after a drop, from the layer files.
    for r in batch:
        timeline.check_read(r.key, r.lsn)
    again = http.page_cache()
    assert again["file_pages"]["misses"] > after["file_pages"]["misses"]
    assert again["index_pages"]["misses"] > after["index_pages"]["misses"]


def test_layer_listing(timeline: TimelineHandle):
    http = timeline.http
    assert http.layers(timeline.tenant_id, timeline.timeline_id) == []
    timeline.ingest([Image(key(1), 0x10, page_of(1)), Image(key(2), 0x10, page_of(2))])
    timeline.ingest([Image(key(1), 0x20, page_of(3))])
    (open_layer,) = http.layers(timeline.tenant_id, timeline.timeline_id)
    assert open_layer["kind"] == "open"
    assert open_layer["lsn_start"] == "0/1"
    assert open_layer["lsn_end"] is None
    assert open_layer["file_name"] is None and open_layer["level"] is None
    assert open_layer["values"] == 3
    assert open_layer["size_bytes"] >= 3 * 8192

    info = timeline.checkpoint()
    assert info["layers"] == {"open": 0, "frozen": 0, "delta": 1, "l0": 1, "l1": 0, "image": 0}
    assert info["in_memory_bytes"] == 0
    (delta,) = http.layers(timeline.tenant_id, timeline.timeline_id)
    assert (delta["kind"], delta["level"]) == ("delta", "L0")
    assert (delta["lsn_start"], delta["lsn_end"]) == ("0/1", "0/21")
    assert delta["values"] == 3
    path = timeline.ps.timeline_dir(timeline.tenant_id, timeline.timeline_id) / delta["file_name"]
    assert path.stat().st_size == delta["size_bytes"] == info["delta_layer_bytes"]
    assert delta["file_name"].endswith("__0000000000000001-0000000000000021")

    timeline.ingest([Image(key(3), 0x30, page_of(4))])
    kinds = [layer["kind"] for layer in http.layers(timeline.tenant_id, timeline.timeline_id)]
    assert kinds == ["open", "delta"]  # newest first
    assert http.layers(timeline.tenant_id, timeline.timeline_id)[0]["lsn_start"] == "0/21"


def test_checkpoint_of_empty_timeline(timeline: TimelineHandle):
    info = timeline.checkpoint()
    assert info["disk_consistent_lsn"] == "0/0"
    assert info["layers"] == {"open": 0, "frozen": 0, "delta": 0, "l0": 0, "l1": 0, "image": 0}
    assert timeline.dir_files() == ["metadata"]


@pytest.mark.needs_testing
def test_failpoints_endpoint(pageserver: Pageserver):
    http = pageserver.http
    http.configure_failpoints(("flush-loop", "off"), ("ephemeral-write", "off"))
    for body, contains in [
        (b"{", "invalid request body"),
        (b'{"name": "x", "actions": "off"}', "invalid request body"),
        (b'[{"name": "x"}]', "invalid request body"),
        (b'[{"name": "x", "actions": "off", "extra": 1}]', "invalid request body"),
        (b'[{"name": "", "actions": "off"}]', "name"),
        (b'[{"name": "flush-loop", "actions": "explode(now)"}]', "flush-loop"),
    ]:
        r = http.request("PUT", "/v1/failpoints", data=body)
        assert r.status_code == 400, (body, r.text)
        assert contains in api_error(r).msg, (body, r.text)


def test_connection_survives_a_refused_ingest(pageserver: Pageserver):
    tenant = pageserver.http.tenant_create()["id"]
    body = encode_batch([Image(key(0), 5, page_of(i)) for i in range(4)])
    with socket.create_connection(("127.0.0.1", pageserver.port), timeout=5.0) as s:
        reader = s.makefile("rb")
        s.sendall(
            f"POST /v1/tenant/{tenant}/timeline/{MISSING}/ingest HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
        )
        status, headers = read_head(reader)
        assert status == 404
        reader.read(int(headers["content-length"]))
        if headers.get("connection", "").lower() == "close":
            return  # said so: the client knows not to reuse the connection
        try:
            s.sendall(b"GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            status, _ = read_head(reader)
        except (ConnectionError, ValueError) as e:
            raise AssertionError(f"the connection was closed without `Connection: close`: {e!r}")
        assert status == 200


def read_head(reader) -> tuple[int, dict[str, str]]:
    """The status and headers of one HTTP/1.1 response."""
    line = reader.readline()
    if not line:
        raise ValueError("connection closed")
    status = int(line.split()[1])
    headers = {}
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers
