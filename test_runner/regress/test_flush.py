"""When in-memory layers reach the disk: by size (checkpoint_distance), by age
(checkpoint_timeout), with backpressure past max_frozen_layers; and what a failing flush or a
failing ephemeral write does to a timeline."""

from __future__ import annotations

import re

import pytest

from fixtures.http import PageserverApiError
from fixtures.ingest import Image, Workload, key, page_of
from fixtures.plugin import NO_BACKGROUND_COMPACTION, PageserverFactory
from fixtures.timeline import TimelineHandle
from fixtures.utils import Lsn, wait_until


def test_flush_by_checkpoint_distance(pageserver_factory: PageserverFactory):
    ps = pageserver_factory.start({"checkpoint_distance": "64KiB", **NO_BACKGROUND_COMPACTION})
    timeline = TimelineHandle.create(ps)
    # Under the distance: nothing is frozen.
    timeline.ingest([Image(key(i), 0x10, page_of(i)) for i in range(4)])
    info = timeline.info()
    assert info["layers"] == {"open": 1, "frozen": 0, "delta": 0, "l0": 0, "l1": 0, "image": 0}
    # Crossing it: the open layer is frozen by the batch and written by the flush loop, with
    # no checkpoint call.
    timeline.ingest([Image(key(i), 0x20, page_of(10 + i)) for i in range(6)])

    def flushed() -> bool:
        _, durable = timeline.lsns()
        return durable == 0x20

    wait_until(flushed, timeout=10, what="disk_consistent_lsn reaches 0/20")
    info = timeline.info()
    assert info["layers"]["delta"] == 1 and info["layers"]["frozen"] == 0
    assert info["delta_layer_bytes"] > 64 << 10
    timeline.verify()
    # Each later crossing adds one more layer.
    for n in range(3):
        timeline.ingest([Image(key(i), 0x30 + n * 0x10, page_of(20 + i)) for i in range(9)])
    wait_until(lambda: timeline.lsns()[1] == 0x50, timeout=10, what="disk_consistent_lsn reaches 0/50")
    assert timeline.info()["layers"]["delta"] == 4
    timeline.verify()


def test_flush_by_checkpoint_timeout(pageserver_factory: PageserverFactory):
    ps = pageserver_factory.start({"checkpoint_timeout": "200ms"})
    timeline = TimelineHandle.create(ps)
    timeline.ingest([Image(key(1), 0x10, b"small")])
    wait_until(lambda: timeline.lsns()[1] == 0x10, timeout=10, what="aged layer flushed")
    assert timeline.info()["layers"] == {"open": 0, "frozen": 0, "delta": 1, "l0": 1, "l1": 0, "image": 0}
    # An idle timeline is left alone: no empty layers pile up.
    timeline.ingest([Image(key(1), 0x20, b"again")])
    wait_until(lambda: timeline.lsns()[1] == 0x20, timeout=10, what="second aged layer flushed")
    assert timeline.info()["layers"]["delta"] == 2
    timeline.verify()


@pytest.mark.needs_testing
def test_backpressure_past_max_frozen_layers(pageserver_factory: PageserverFactory):
    """With the flush loop stuck, ingest flushes frozen layers itself once more than
    max_frozen_layers wait, so memory stays bounded and nothing is lost."""
    ps = pageserver_factory.start({"checkpoint_distance": "32KiB", "max_frozen_layers": 2})
    timeline = TimelineHandle.create(ps)
    ps.http.configure_failpoints(("flush-loop", "pause"))
    try:
        for n in range(12):
            timeline.ingest([Image(key(i), 0x10 * (n + 1), page_of(n * 10 + i)) for i in range(5)])
            layers = timeline.info()["layers"]
            assert layers["frozen"] <= 2, layers
        info = timeline.info()
        assert info["layers"]["delta"] >= 3, info
        assert Lsn.parse(info["disk_consistent_lsn"]) > 0
        timeline.verify()
    finally:
        ps.http.configure_failpoints(("flush-loop", "off"))
    timeline.checkpoint()
    timeline.verify()


@pytest.mark.needs_testing
@pytest.mark.parametrize("failpoint", ["layer-before-rename", "layer-after-rename", "flush-before-metadata"])
def test_failed_flush_keeps_layer_and_retries(pageserver_factory: PageserverFactory, failpoint: str):
    ps = pageserver_factory.start()
    ps.allowed_errors.extend([rf"request failed: .*failpoint {failpoint}", rf"background flush failed, will retry: .*failpoint {failpoint}"])
    timeline = TimelineHandle.create(ps)
    work = Workload(1, [key(i) for i in range(6)])
    for _ in range(10):
        timeline.ingest(work.batch())
    ps.http.configure_failpoints((failpoint, "return"))
    for _ in range(2):
        with pytest.raises(PageserverApiError) as e:
            ps.http.checkpoint(timeline.tenant_id, timeline.timeline_id)
        assert e.value.status_code == 500
        assert failpoint in e.value.msg
    info = timeline.info()
    assert info["disk_consistent_lsn"] == "0/0"
    assert info["layers"]["frozen"] == 1 and info["layers"]["delta"] == 0, info
    # A failed attempt leaves no temporary file; the background flush loop retries every
    # second, and a retry in progress has one of its own for a moment.
    wait_until(lambda: not any(n.endswith(".___temp") for n in timeline.dir_files()), what="no temporary file")
    # Reads and writes go on meanwhile.
    timeline.verify()
    for _ in range(3):
        timeline.ingest(work.batch())
    timeline.verify()
    ps.http.configure_failpoints((failpoint, "off"))
    timeline.checkpoint()
    info = timeline.info()
    assert info["layers"]["frozen"] == 0 and info["layers"]["delta"] >= 1, info
    timeline.verify()
    ps.restart()
    assert not ps.leftovers()
    timeline.verify()


@pytest.mark.needs_testing
def test_ephemeral_write_failure_breaks_timeline_until_restart(pageserver_factory: PageserverFactory):
    ps = pageserver_factory.start()
    ps.allowed_errors.extend(["failpoint ephemeral-write", "the timeline takes no more writes", "flush at shutdown failed", "shut down with data not flushed"])
    timeline = TimelineHandle.create(ps)
    healthy = TimelineHandle.create(ps)
    timeline.ingest([Image(key(1), 0x10, page_of(1))])
    timeline.checkpoint()
    timeline.ingest([Image(key(2), 0x20, page_of(2))])
    healthy.ingest([Image(key(1), 0x10, page_of(3))])
    ps.http.configure_failpoints(("ephemeral-write", "return"))
    # Nine full pages fill the ephemeral file's first run of eight blocks, so a write is attempted.
    failed_batch = [Image(key(3 + i), 0x30, page_of(4 + i)) for i in range(9)]
    with pytest.raises(PageserverApiError) as e:
        timeline.http.ingest(timeline.tenant_id, timeline.timeline_id, failed_batch)
    assert e.value.status_code == 500
    ps.http.configure_failpoints(("ephemeral-write", "off"))

    info = timeline.info()
    assert info["state"] == "Broken" and "failpoint ephemeral-write" in info["broken_reason"], info
    assert info["last_record_lsn"] == "0/20", "the failed batch must stay invisible"
    # The broken timeline refuses writes and checkpoints, but serves what it acknowledged.
    with pytest.raises(PageserverApiError) as e:
        timeline.http.ingest(timeline.tenant_id, timeline.timeline_id, [Image(key(5), 0x40, page_of(6))])
    assert e.value.status_code == 503 and "no more writes" in e.value.msg
    with pytest.raises(PageserverApiError) as e:
        timeline.http.checkpoint(timeline.tenant_id, timeline.timeline_id)
    assert e.value.status_code == 503
    timeline.verify()
    assert timeline.get(key(3), "latest") is None
    # Its tenant and the other timelines carry on.
    assert ps.http.tenant_info(timeline.tenant_id)["state"] == "Active"
    healthy.ingest([Image(key(2), 0x20, page_of(7))])
    healthy.verify()

    # A graceful stop cannot flush the broken timeline: it says so and exits 1.
    assert ps.stop(expect_code=1) == 1
    assert ps.log_contains("flush at shutdown failed")
    stop_log = ps.log_since_start()
    assert "shut down cleanly" not in stop_log
    assert re.search(r"ERROR .*shut down with data not flushed .*takes no more writes.*must be re-sent.*exiting with status 1", stop_log), stop_log[-2000:]
    ps.start()
    assert timeline.info()["state"] == "Active"
    timeline.recover()
    timeline.ingest(failed_batch)
    timeline.verify()
    healthy.verify()


@pytest.mark.needs_testing
def test_broken_reason_names_where_a_reload_resumes_now(pageserver_factory: PageserverFactory):
    """A layer frozen before the timeline broke still flushes afterwards and moves
    disk_consistent_lsn: the reason names the LSN a reload resumes after as it is when asked,
    not as it was when the timeline broke."""
    ps = pageserver_factory.start({"checkpoint_timeout": "200ms"})
    ps.allowed_errors.extend(["failpoint ephemeral-write", "failpoint flush-before-metadata", "the timeline takes no more writes", "flush .*failed", "flush at shutdown failed"])
    timeline = TimelineHandle.create(ps)
    timeline.ingest([Image(key(1), 0x10, page_of(1))])
    timeline.checkpoint()
    timeline.ingest([Image(key(2), 0x20, page_of(2))])
    # The checkpoint freezes 0/20's layer, and its flush fails: the layer stays queued.
    ps.http.configure_failpoints(("flush-before-metadata", "return"))
    with pytest.raises(PageserverApiError):
        timeline.http.checkpoint(timeline.tenant_id, timeline.timeline_id)
    ps.http.configure_failpoints(("ephemeral-write", "return"))
    with pytest.raises(PageserverApiError):
        timeline.http.ingest(timeline.tenant_id, timeline.timeline_id, [Image(key(3 + i), 0x30, page_of(4 + i)) for i in range(9)])
    info = timeline.info()
    assert info["state"] == "Broken" and info["disk_consistent_lsn"] == "0/10", info
    assert "resume after 0/10" in info["broken_reason"], info
    # The flush loop retries the queued layer once the fault is gone.
    ps.http.configure_failpoints(("flush-before-metadata", "off"), ("ephemeral-write", "off"))
    wait_until(lambda: timeline.info()["disk_consistent_lsn"] == "0/20", timeout=10, what="the queued layer to flush")
    assert "resume after 0/20" in timeline.info()["broken_reason"]
    ps.stop(expect_code=1)


@pytest.mark.needs_testing
def test_flush_loop_survives_a_panic(pageserver_factory: PageserverFactory):
    ps = pageserver_factory.start({"checkpoint_timeout": "100ms"})
    ps.allowed_errors.extend(["panicked at", "a flush-loop pass panicked"])
    timeline = TimelineHandle.create(ps)
    ps.http.configure_failpoints(("flush-loop", "1*panic"))
    timeline.ingest([Image(key(1), 0x10, page_of(1))])
    wait_until(lambda: ps.log_contains("panicked at"), what="the flush loop hit the failpoint")
    timeline.ingest([Image(key(1), 0x20, page_of(2))])
    wait_until(lambda: timeline.lsns()[1] == 0x20, timeout=3, what="background flush after the panic")
