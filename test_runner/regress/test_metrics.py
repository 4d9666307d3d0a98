"""GET /metrics: valid Prometheus text (parsed with prometheus_client's parser), every family
the server promises, and values that agree with what the test did and with the API."""

from __future__ import annotations

import pytest

from fixtures.ingest import Image, Workload, key, page_of
from fixtures.metrics import Metrics
from fixtures.pageserver import Pageserver
from fixtures.plugin import PageserverFactory
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
    assert m.value("pageserver_http_requests_total", method="POST", status="201") == 4
    assert m.value("pageserver_http_requests_total", method="GET", status="404") >= missing
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
    assert m.value("pageserver_http_requests_total", method="DELETE", status="200") == 1
    pageserver.restart()
    m = metrics(pageserver)
    # Counters start again with the process; state gauges come from what was loaded.
    assert m.value_or("pageserver_ingest_records_total", 0) == 0
    assert m.value("pageserver_disk_consistent_lsn", tenant_id=a.tenant_id, timeline_id=a.timeline_id) == 0x10
    assert m.value("pageserver_layers", kind="delta", tenant_id=a.tenant_id, timeline_id=a.timeline_id) == 1
