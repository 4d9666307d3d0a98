"""GET /metrics: valid Prometheus text (parsed with prometheus_client's parser), every family
the server promises, and values that agree with what the test did and with the API."""

from __future__ import annotations

import os

import pytest

from fixtures.http import PageserverApiError
from fixtures.ingest import Image, Workload, key, page_of
from fixtures.metrics import Metrics
from fixtures.pageserver import Pageserver
from fixtures.plugin import PageserverFactory
from fixtures.remote_storage import RemoteStore
from fixtures.timeline import TimelineHandle
from fixtures.utils import Lsn, wait_until

PROMISED = [
    "pageserver_page_cache_hits_total",
    "pageserver_page_cache_misses_total",
    "pageserver_page_cache_inserts_total",
    "pageserver_page_cache_evictions_total",
    "pageserver_page_cache_resident_bytes",
    "pageserver_ephemeral_bytes_written_total",
    "pageserver_ephemeral_writes_total",
    "pageserver_layer_flushes_total",
    "pageserver_layer_flush_seconds_bucket",
    "pageserver_layer_flush_bytes_total",
    "pageserver_getpage_seconds_bucket",
    "pageserver_ingest_seconds_bucket",
    "pageserver_ingest_records_total",
    "pageserver_http_requests_total",
    "pageserver_last_record_lsn",
    "pageserver_disk_consistent_lsn",
    "pageserver_layers",
    "pageserver_startup_duration_seconds",
    "pageserver_scan_cursor_cache_lookups_total",
    "pageserver_scan_cursor_cache_evictions_total",
    "pageserver_scan_cursor_cache_cursors",
    "pageserver_http_request_duration_seconds_bucket",
    "pageserver_build_info",
    "process_open_fds",
    "process_max_fds",
    "process_resident_memory_bytes",
    "process_cpu_seconds_total",
    "process_start_time_seconds",
    "pageserver_http_connections",
    "pageserver_http_connections_max",
    "pageserver_http_request_body_bytes",
    "pageserver_http_request_body_budget_bytes",
]


PER_TIMELINE = {"pageserver_last_record_lsn", "pageserver_disk_consistent_lsn", "pageserver_layers"}


def metrics(ps: Pageserver) -> Metrics:
    return Metrics(ps.http.metrics_text())


def test_metrics_families_and_values(pageserver_factory: PageserverFactory):
    ps = pageserver_factory.start({"checkpoint_distance": "64KiB", "page_cache_size": "1MiB"})
    fresh = metrics(ps)
    for phase in ("config", "lock", "page_cache", "load_tenants", "http"):
        assert fresh.value("pageserver_startup_duration_seconds", phase=phase) >= 0
    assert fresh.value_or("pageserver_ingest_records_total", 0) == 0
    assert fresh.value_or("pageserver_layer_flushes_total", 0) == 0

    timeline = TimelineHandle.create(ps)
    other = TimelineHandle.create(ps)
    work = Workload(3, [key(i) for i in range(10)])
    records = 0
    for _ in range(30):
        batch = work.batch()
        timeline.ingest(batch)
        records += len(batch)
    other.ingest([Image(key(1), 0x10, page_of(1))])
    other.checkpoint()
    reads = timeline.verify(samples_per_key=5)
    timeline.verify(samples_per_key=5)  # again: now some reads hit the cache
    missing = 3
    for _ in range(missing):
        assert timeline.get(key(99), "latest") is None
    # Let the background flushes finish, so that nothing changes under the comparisons below.
    wait_until(lambda: timeline.info()["layers"]["frozen"] == 0, what="frozen layers flushed")

    m = metrics(ps)
    for name in PROMISED:
        assert m.samples(name), f"no samples of {name}"
    assert m.value("pageserver_ingest_records_total") == records + 1
    ingest_ok = m.value("pageserver_ingest_seconds_count", outcome="ok")
    assert ingest_ok == 31
    assert m.value("pageserver_getpage_seconds_count", outcome="ok") + m.value("pageserver_getpage_seconds_count", outcome="not_found") == 2 * reads + missing
    assert m.value("pageserver_getpage_seconds_count", outcome="not_found") >= missing
    assert m.sum("pageserver_http_requests_total", method="POST", status="201") == 4
    assert m.value("pageserver_http_requests_total", method="POST", route="/v1/tenant", status="201") == 2
    assert m.value("pageserver_http_requests_total", method="POST", route="/v1/tenant/{tenant_id}/timeline", status="201") == 2
    assert m.value("pageserver_http_requests_total", method="GET", route="/v1/tenant/{tenant_id}/timeline/{timeline_id}/page", status="404") >= missing
    # Histograms are cumulative and end at +Inf with the count.
    buckets = m.samples("pageserver_ingest_seconds_bucket", outcome="ok")
    values = [s.value for s in buckets]
    assert values == sorted(values) and buckets[-1].labels["le"] == "+Inf" and values[-1] == ingest_ok

    # Flushes: by distance in the background and by the checkpoint of the other timeline.
    flushes = m.value("pageserver_layer_flushes_total")
    assert flushes >= 2
    assert m.value("pageserver_layer_flush_seconds_count") == flushes
    assert m.value("pageserver_layer_flush_bytes_total") >= 8192 * 2
    assert m.value("pageserver_ephemeral_writes_total") > 0
    assert m.value("pageserver_ephemeral_bytes_written_total") >= 8192 * m.value("pageserver_ephemeral_writes_total")
    # Page cache: inserts and hits happened; residency fits the 1 MiB cache; a small cache
    # under this much data evicts.
    assert m.value("pageserver_page_cache_inserts_total", kind="file") > 0
    assert m.sum("pageserver_page_cache_hits_total") > 0
    assert m.sum("pageserver_page_cache_resident_bytes") <= 1 << 20
    assert m.value("pageserver_page_cache_evictions_total", kind="file") > 0

    # Per-timeline gauges agree with the API.
    for tl in (timeline, other):
        labels = {"tenant_id": tl.tenant_id, "timeline_id": tl.timeline_id}
        info = tl.info()
        assert m.value("pageserver_last_record_lsn", **labels) == Lsn.parse(info["last_record_lsn"])
        assert m.value("pageserver_disk_consistent_lsn", **labels) == Lsn.parse(info["disk_consistent_lsn"])
        for kind in ("open", "frozen", "delta"):
            assert m.value("pageserver_layers", kind=kind, **labels) == info["layers"][kind], kind
    assert m.value("pageserver_layers", kind="delta", tenant_id=other.tenant_id, timeline_id=other.timeline_id) == 1


def test_every_family_is_exported_from_startup(pageserver: Pageserver):
    m = metrics(pageserver)
    missing = [name for name in PROMISED if not m.samples(name) and name not in PER_TIMELINE and "_bucket" not in name]
    missing += [name for name in PROMISED if "_bucket" in name and name.replace("_bucket", "") not in m.families]
    assert not missing, f"missing from a fresh server: {missing}"


def test_metrics_follow_deletion_and_restart(pageserver: Pageserver):
    a = TimelineHandle.create(pageserver)
    b = TimelineHandle.create(pageserver)
    a.ingest([Image(key(1), 0x10, page_of(1))])
    b.ingest([Image(key(1), 0x20, page_of(2))])
    m = metrics(pageserver)
    assert len(m.samples("pageserver_last_record_lsn")) == 2
    pageserver.http.tenant_delete(b.tenant_id)
    m = metrics(pageserver)
    assert [s.labels["tenant_id"] for s in m.samples("pageserver_last_record_lsn")] == [a.tenant_id]
    assert m.value("pageserver_http_requests_total", method="DELETE", route="/v1/tenant/{tenant_id}", status="200") == 1
    pageserver.restart()
    m = metrics(pageserver)
    # Counters start again with the process; state gauges come from what was loaded.
    assert m.value_or("pageserver_ingest_records_total", 0) == 0
    assert m.value("pageserver_disk_consistent_lsn", tenant_id=a.tenant_id, timeline_id=a.timeline_id) == 0x10
    assert m.value("pageserver_layers", kind="delta", tenant_id=a.tenant_id, timeline_id=a.timeline_id) == 1


# Every family with a series per timeline (labels tenant_id and timeline_id), remote storage's
# included.
TIMELINE_FAMILIES = [
    "pageserver_last_record_lsn",
    "pageserver_disk_consistent_lsn",
    "pageserver_remote_consistent_lsn",
    "pageserver_upload_queue_bytes",
    "pageserver_layers",
    "pageserver_layer_files",
    "pageserver_layer_bytes",
]


def timelines_named(m: Metrics) -> dict[str, set[tuple[str, str]]]:
    """For each per-timeline family, the (tenant, timeline) pairs its series name."""
    return {name: {(s.labels["tenant_id"], s.labels["timeline_id"]) for s in m.samples(name)} for name in TIMELINE_FAMILIES}


@pytest.mark.parametrize("remote_store", ["local"], indirect=True)
def test_timeline_series_go_with_their_timeline(pageserver_factory: PageserverFactory, remote_store: RemoteStore):
    """The per-timeline values are read at scrape time: every family has a series for each
    timeline the server holds, and none left behind for a timeline deleted, or one whose tenant
    was deleted or detached; a tenant attached again has its series back."""
    ps = pageserver_factory.start(remote=remote_store)
    kept = TimelineHandle.create(ps)
    sibling = TimelineHandle(ps, kept.tenant_id, ps.http.timeline_create(kept.tenant_id)["timeline_id"])
    in_deleted_tenant = TimelineHandle.create(ps)
    moved = TimelineHandle.create(ps)
    everyone = (kept, sibling, in_deleted_tenant, moved)
    for i, tl in enumerate(everyone):
        tl.ingest([Image(key(1), 0x10 * (i + 1), page_of(i))])
        tl.checkpoint()

    def ids(*timelines: TimelineHandle) -> dict[str, set[tuple[str, str]]]:
        return {name: {(t.tenant_id, t.timeline_id) for t in timelines} for name in TIMELINE_FAMILIES}

    assert timelines_named(metrics(ps)) == ids(*everyone)
    ps.http.timeline_delete(sibling.tenant_id, sibling.timeline_id)
    ps.http.tenant_delete(in_deleted_tenant.tenant_id)
    ps.http.tenant_detach(moved.tenant_id)
    m = metrics(ps)
    assert timelines_named(m) == ids(kept)
    for gone in (sibling, in_deleted_tenant, moved):
        assert gone.timeline_id not in m.text

    ps.http.tenant_attach(moved.tenant_id, generation=2)
    m = metrics(ps)
    assert timelines_named(m) == ids(kept, moved)
    labels = {"tenant_id": moved.tenant_id, "timeline_id": moved.timeline_id}
    assert m.value("pageserver_disk_consistent_lsn", **labels) == 0x40
    assert m.value("pageserver_remote_consistent_lsn", **labels) == 0x40


STANDARD_METHODS = {"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE", "CONNECT"}


def test_request_labels_are_bounded(pageserver: Pageserver):
    """Whatever method and path a client sends, the labels are a standard method or `other`
    and a route template or `unmatched`: a client cannot add series."""
    http = pageserver.http
    tenant = http.tenant_create()["id"]
    odd_methods = ["ZZZ1", "ZZZ2", "PROPFIND", "BREW"]
    for method in odd_methods:
        assert http.request(method, "/v1/status").status_code == 405
        assert http.request(method, f"/nothing/here/{method}").status_code == 404
    for i in range(3):
        assert http.request("GET", f"/no/such/path/{i}").status_code == 404
    http.tenant_info(tenant)
    m = metrics(pageserver)
    for name in ("pageserver_http_requests_total", "pageserver_http_request_duration_seconds_count"):
        for s in m.samples(name):
            assert s.labels["method"] in STANDARD_METHODS | {"other"}, s
            assert s.labels["route"] == "unmatched" or s.labels["route"].startswith(("/v1/", "/metrics")), s
    assert "/no/such/path" not in m.text and "ZZZ1" not in m.text and tenant not in m.text
    assert m.value("pageserver_http_requests_total", method="other", route="/v1/status", status="405") == len(odd_methods)
    assert m.value("pageserver_http_requests_total", method="other", route="unmatched", status="404") == len(odd_methods)
    assert m.value("pageserver_http_requests_total", method="GET", route="unmatched", status="404") == 3
    # The route is the template, and every request's latency is counted under it.
    assert m.value("pageserver_http_requests_total", method="GET", route="/v1/tenant/{tenant_id}", status="200") == 1
    assert m.value("pageserver_http_request_duration_seconds_count", method="GET", route="/v1/tenant/{tenant_id}") == 1
    assert m.value("pageserver_http_request_duration_seconds_count", method="other", route="unmatched") == len(odd_methods)


def test_every_endpoint_has_a_latency_series_from_startup(pageserver: Pageserver):
    m = metrics(pageserver)
    routes = {(s.labels["method"], s.labels["route"]) for s in m.samples("pageserver_http_request_duration_seconds_count")}
    for expected in [("GET", "/v1/status"), ("POST", "/v1/tenant/{tenant_id}/timeline/{timeline_id}/ingest"), ("GET", "/v1/tenant/{tenant_id}/timeline/{timeline_id}/page"), ("GET", "/metrics")]:
        assert expected in routes, routes
    assert len(routes) >= 18


def finite_buckets(m: Metrics, name: str, **labels: str) -> list[float]:
    return sorted(float(s.labels["le"]) for s in m.samples(name, **labels) if s.labels["le"] != "+Inf")


def bucket(m: Metrics, name: str, le: float, **labels: str) -> float:
    (value,) = [s.value for s in m.samples(name, **labels) if s.labels["le"] != "+Inf" and float(s.labels["le"]) == le]
    return value


def test_latency_buckets_reach_wait_lsn_timeout(pageserver_factory: PageserverFactory):
    # A long wait_lsn_timeout: the top buckets follow it.
    ps = pageserver_factory.start({"wait_lsn_timeout": "300s"})
    m = metrics(ps)
    for name, labels in [
        ("pageserver_http_request_duration_seconds_bucket", {"method": "GET", "route": "/v1/tenant/{tenant_id}/timeline/{timeline_id}/page"}),
        ("pageserver_getpage_seconds_bucket", {"outcome": "error"}),
        ("pageserver_wait_lsn_seconds_bucket", {"outcome": "timeout"}),
    ]:
        buckets = finite_buckets(m, name, **labels)
        assert 300.0 in buckets and buckets[-1] > 300.0, (name, buckets)
    assert finite_buckets(m, "pageserver_http_request_duration_seconds_bucket", method="GET", route="/v1/status")[0] <= 0.0001
    ps.stop()

    # A short one: a read that times out lands above the bucket at wait_lsn_timeout, in a finite
    # bucket, not in +Inf.
    ps.start(overrides={"wait_lsn_timeout": "500ms"})
    timeline = TimelineHandle.create(ps)
    try:
        timeline.http.get_page(timeline.tenant_id, timeline.timeline_id, key(1), 0x100)
        raise AssertionError("the read should have timed out")
    except PageserverApiError as e:
        assert e.status_code == 503, e
    m = metrics(ps)
    route = {"method": "GET", "route": "/v1/tenant/{tenant_id}/timeline/{timeline_id}/page"}
    buckets = finite_buckets(m, "pageserver_http_request_duration_seconds_bucket", **route)
    assert buckets[-2:] == [0.5, 1.0], buckets
    assert bucket(m, "pageserver_http_request_duration_seconds_bucket", 0.5, **route) == 0
    assert bucket(m, "pageserver_http_request_duration_seconds_bucket", 1.0, **route) == 1
    assert bucket(m, "pageserver_getpage_seconds_bucket", 0.5, outcome="error") == 0
    assert bucket(m, "pageserver_getpage_seconds_bucket", 1.0, outcome="error") == 1
    assert bucket(m, "pageserver_wait_lsn_seconds_bucket", 0.5, outcome="timeout") == 0
    assert bucket(m, "pageserver_wait_lsn_seconds_bucket", 1.0, outcome="timeout") == 1


def test_build_info_and_process_metrics(pageserver: Pageserver):
    status = pageserver.http.status()
    m = metrics(pageserver)
    features = "testing" if status["testing"] else ""
    assert m.value("pageserver_build_info", version=status["version"], features=features) == 1
    assert len(m.samples("pageserver_build_info")) == 1
    with open(f"/proc/{pageserver.pid}/status") as f:
        rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    fds = len(os.listdir(f"/proc/{pageserver.pid}/fd"))
    assert 0.5 * rss <= m.value("process_resident_memory_bytes") <= 2 * rss
    assert m.value("process_virtual_memory_bytes") >= m.value("process_resident_memory_bytes")
    assert abs(m.value("process_open_fds") - fds) <= 3, fds
    assert m.value("process_open_fds") < m.value("process_max_fds")
    assert m.value("process_threads") >= 2
    assert abs(m.value("process_start_time_seconds") - status["started_at"]) < 2
    # CPU time is counted in 10 ms ticks: a fresh server may not have used one yet, but two
    # hundred scrapes take several.
    before = m.value("process_cpu_seconds_total")
    assert before >= 0
    for _ in range(200):
        pageserver.http.metrics_text()
    assert metrics(pageserver).value("process_cpu_seconds_total") > before
