"""No tenant starves another: one tenant's floods of slow imports and of reads waiting for
layer downloads from a stalled store hold no thread of the shared pool, are bounded per tenant
and per server (503 with Retry-After past the bound), and another tenant's cold read, ingest and
checkpoint answer at once meanwhile."""

from __future__ import annotations

import socket
import tarfile
import time

from fixtures.ingest import Workload, key
from fixtures.metrics import Metrics
from fixtures.plugin import PageserverFactory
from fixtures.raw_http import connect, read_response
from fixtures.timeline import TimelineHandle
from fixtures.utils import wait_until

KEYS = [key(i) for i in range(64)]
SETTINGS = {
    "compaction_threshold": 0,
    "compaction_target_size": "16KiB",
    "max_local_layer_bytes": "16KiB",
    "max_concurrent_imports_per_tenant": 2,
    "max_concurrent_downloads_per_tenant": 4,
    # The floods' connections, and room for the other tenant's.
    "max_connections": 1000,
}
# Together more than the shared blocking pool's 512 threads, as the floods that starved other
# tenants before imports and downloads had threads of their own.
SLOW_IMPORTS = 40
WAITING_READS = 600


def slow_import(ps, tenant_id: str, timeline_id: str) -> socket.socket:
    """An import whose client sends the header of a 1 MiB member and then nothing."""
    s = connect(ps, timeout=60)
    request = (
        f"PUT /v1/tenant/{tenant_id}/timeline/{timeline_id}/import HTTP/1.1\r\n"
        f"Host: 127.0.0.1\r\nContent-Type: application/x-tar\r\nContent-Length: {1 << 30}\r\n\r\n"
    )
    member = tarfile.TarInfo("base/1/1259")
    member.size = 1 << 20
    s.sendall(request.encode() + member.tobuf(format=tarfile.USTAR_FORMAT))
    return s


def waiting_read(ps, tenant_id: str, timeline_id: str, k: bytes) -> socket.socket:
    s = connect(ps, timeout=60)
    path = f"/v1/tenant/{tenant_id}/timeline/{timeline_id}/page?key={k.hex()}&lsn=latest"
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    return s


def answered(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        return s.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return False
    finally:
        s.setblocking(True)


def timed(what: str, action) -> float:
    started = time.monotonic()
    action()
    elapsed = time.monotonic() - started
    assert elapsed < 1.0, f"{what} took {elapsed:.2f} s while the other tenant floods the server"
    return elapsed


def test_one_tenants_floods_leave_another_tenant_served(pageserver_factory: PageserverFactory):
    ps = pageserver_factory.start(SETTINGS)
    ps.allowed_errors.extend([r"request refused: too many", r"failpoint on-demand-download"])
    # Tenant A: a history of L1 and image layers only, uploaded and then evicted.
    flooded = TimelineHandle.create(ps)
    work = Workload(31, KEYS)
    for _ in range(6):
        for _ in range(3):
            flooded.ingest(work.batch(max_records=24))
        flooded.checkpoint()
    compacted = ps.http.compact(flooded.tenant_id, flooded.timeline_id, force_images=True)
    assert compacted["compaction"]["outputs"] > 1, compacted

    def evicted() -> list[dict]:
        # Every layer, the images the reads below need included: each is larger than the
        # budget. An eviction pass takes only layers already uploaded, so the images of the
        # compaction go a pass or more after the older deltas; reads sent while they are still
        # resident would need no download at all.
        layers = ps.http.layers(flooded.tenant_id, flooded.timeline_id)
        assert all(layer["level"] != "L0" for layer in layers), layers
        assert layers and not any(layer["resident"] for layer in layers), layers
        return layers

    wait_until(evicted, timeout=60, what="the flooded tenant's layers evicted")
    # Tenant B: a few resident L0s.
    other = TimelineHandle.create(ps)
    other_work = Workload(32, KEYS[:8])
    other.ingest(other_work.batch(max_records=8))
    other.checkpoint()

    # The store stalls: every download waits until the failpoint is turned off.
    ps.http.configure_failpoints(("on-demand-download", "pause"))
    timelines = [flooded.timeline_id] + [ps.http.timeline_create(flooded.tenant_id)["timeline_id"] for _ in range(2)]
    imports = [slow_import(ps, flooded.tenant_id, timelines[i % 3]) for i in range(SLOW_IMPORTS)]
    reads = [waiting_read(ps, flooded.tenant_id, flooded.timeline_id, KEYS[i % len(KEYS)]) for i in range(WAITING_READS)]

    def floods_in_place() -> Metrics:
        m = Metrics(ps.http.metrics_text())
        assert m.value("pageserver_work_running", kind="import") == 2, "two imports run"
        assert m.value("pageserver_work_running", kind="download") == 4, "four downloads run"
        refused_imports = m.value("pageserver_work_refused_total", kind="import", scope="tenant")
        assert refused_imports >= SLOW_IMPORTS - 3, refused_imports
        return m

    wait_until(floods_in_place, timeout=30, what="the floods running at their bounds")
    # Past the bounds: 503 at once, with Retry-After and the setting that bounds them.
    refused = [s for s in imports if answered(s)]
    assert len(refused) >= SLOW_IMPORTS - 3
    status, headers, body = read_response(refused[0])
    assert status == 503 and headers["retry-after"] == "1", (status, headers, body)
    assert b"max_concurrent_imports_per_tenant" in body, body
    # Reads of resident layers are answered; of evicted ones past the download bound, refused.
    done_reads = [s for s in reads if answered(s)]
    answers = [read_response(s) for s in done_reads]
    busy = [(headers, body) for status, headers, body in answers if status == 503]
    assert busy and all(status in (200, 404, 503) for status, _, _ in answers), sorted({a[0] for a in answers})
    assert all(h["retry-after"] == "1" and b"max_concurrent_downloads_per_tenant" in b for h, b in busy), busy[0]

    # Meanwhile tenant B is served at once: a read from disk (nothing in the page cache), a
    # batch, a checkpoint.
    ps.http.page_cache_drop()
    timed("a cold read", lambda: other.verify(samples_per_key=1))
    timed("an ingest", lambda: other.ingest(other_work.batch(max_records=8)))
    timed("a checkpoint", other.checkpoint)

    # The store comes back: the reads that waited are answered, from the downloaded layers.
    ps.http.configure_failpoints(("on-demand-download", "off"))
    waiting = [s for s in reads if s not in done_reads]
    assert len(waiting) > 4, "reads of the layers being downloaded wait for them"
    statuses = [read_response(s)[0] for s in waiting]
    assert statuses and all(code in (200, 404, 503) for code in statuses), sorted(set(statuses))
    assert 200 in statuses, statuses
    for s in imports + reads:
        s.close()
    wait_until(
        lambda: Metrics(ps.http.metrics_text()).value("pageserver_work_running", kind="import") == 0,
        timeout=30,
        what="the imports whose clients left ended",
    )
    flooded.verify()
