"""L0 -> L1 compaction over HTTP: answers unchanged, fewer layers per read, crash-safe at every
step (the process killed at each failpoint of a compaction restarts with the model's answers)."""

from __future__ import annotations

import threading

import pytest
import requests

from fixtures.ingest import Workload, key
from fixtures.layers import l0_rounds, layer_files
from fixtures.plugin import PageserverFactory
from fixtures.timeline import TimelineHandle
from fixtures.threads import Failures
from fixtures.utils import wait_until

CONNECTION_LOST = (requests.exceptions.ConnectionError, requests.exceptions.ChunkedEncodingError)
KEYS = [key(i) for i in range(24)]
# Compaction only when asked for (PUT .../compact), never in the background.
ON_REQUEST = {"compaction_target_size": "64KiB", "compaction_threshold": 0}


def test_compaction_over_http(pageserver_factory: PageserverFactory):
    ps = pageserver_factory.start(ON_REQUEST)
    timeline = TimelineHandle.create(ps)
    work = Workload(5, KEYS)
    l0_rounds(timeline, work, 6)
    assert timeline.info()["layers"]["l0"] == 6
    before = timeline.http.get_page_response(timeline.tenant_id, timeline.timeline_id, KEYS[3], "latest")
    reads_before = int(before.headers["X-Read-Cost"].split("layers=")[1].split()[0])

    info = timeline.http.compact(timeline.tenant_id, timeline.timeline_id)
    assert info["compaction"]["inputs"] == 6, info
    assert info["compaction"]["outputs"] >= 2, info
    assert info["compaction"]["bytes_written"] > 0
    assert (info["layers"]["l0"], info["layers"]["l1"]) == (0, info["compaction"]["outputs"])
    layers = timeline.http.layers(timeline.tenant_id, timeline.timeline_id)
    assert {(layer["kind"], layer["level"]) for layer in layers} == {("delta", "L1")}
    # The L0 files are gone; what is left is exactly the listing.
    assert sorted(layer_files(timeline)) == sorted(layer["file_name"] for layer in layers)
    timeline.verify()
    timeline.http.page_cache_drop()
    after = timeline.http.get_page_response(timeline.tenant_id, timeline.timeline_id, KEYS[3], "latest")
    assert "layers=1 " in after.headers["X-Read-Cost"], (reads_before, after.headers["X-Read-Cost"])
    assert reads_before >= 2
    assert "pageserver_compactions_total 1" in ps.http.metrics_text()

    # Nothing to compact now.
    again = timeline.http.compact(timeline.tenant_id, timeline.timeline_id)
    assert again["compaction"]["inputs"] == 0
    ps.restart()
    assert timeline.info()["layers"]["l1"] == info["layers"]["l1"]
    timeline.verify()


COMPACTION_CRASH_POINTS = [
    # An output is written and fsynced, not yet renamed.
    "layer-before-rename",
    # Every output is durable, the manifest not yet stored.
    "compaction-before-manifest",
    # The manifest is renamed into place, its directory not fsynced.
    "metadata-after-rename",
    # The manifest is durable; the layer map still holds the L0s.
    "compaction-after-manifest",
]


@pytest.mark.needs_testing
@pytest.mark.parametrize("failpoint", COMPACTION_CRASH_POINTS)
def test_crash_during_compaction(pageserver_factory: PageserverFactory, failpoint: str):
    ps = pageserver_factory.start(ON_REQUEST)
    timeline = TimelineHandle.create(ps)
    work = Workload(6, KEYS)
    l0_rounds(timeline, work, 4)
    l0_before = sorted(layer_files(timeline))
    ps.http.configure_failpoints((failpoint, "exit"))
    with pytest.raises(CONNECTION_LOST):
        timeline.http.compact(timeline.tenant_id, timeline.timeline_id)
    assert ps.wait_for_exit() == 1

    ps.start()
    committed = failpoint in ("metadata-after-rename", "compaction-after-manifest")
    info = timeline.info()
    if committed:
        assert info["layers"]["l0"] == 0 and info["layers"]["l1"] >= 1, info
        # The retired L0s were removed at startup.
        assert not set(l0_before) & set(layer_files(timeline))
    else:
        assert info["layers"]["l0"] == 4 and info["layers"]["l1"] == 0, info
        # Outputs of the uncommitted compaction (renamed or not) were removed at startup.
        assert sorted(layer_files(timeline)) == l0_before
    timeline.verify()
    # Compaction works from either state, and the answers stay.
    timeline.http.compact(timeline.tenant_id, timeline.timeline_id)
    assert timeline.info()["layers"]["l0"] == 0
    timeline.verify()
    ps.restart()
    timeline.verify()


BACKGROUND = {
    "checkpoint_distance": "32KiB",
    "compaction_target_size": "64KiB",
    "compaction_threshold": 2,
    "l0_slowdown_threshold": 3,
    "l0_stop_threshold": 5,
}


def test_background_compaction_keeps_l0_bounded(pageserver_factory: PageserverFactory):
    """Ingest that flushes by size on its own: the background loop compacts as L0s appear, the
    L0 count never passes l0_stop_threshold, and every answer stays the model's.

    On a slow machine compaction can fall behind this writer; then the stop at
    l0_stop_threshold is what holds the bound, so its WARN is allowed here, and when it fired
    the held batch must have resumed once compaction ran."""
    ps = pageserver_factory.start(BACKGROUND)
    ps.allowed_errors.append("ingest stopped: an L0 depth of ")
    timeline = TimelineHandle.create(ps)
    work = Workload(7, KEYS)
    most_l0 = 0
    for _ in range(150):
        timeline.ingest(work.batch())
        most_l0 = max(most_l0, timeline.info()["layers"]["l0"])
    assert most_l0 <= BACKGROUND["l0_stop_threshold"], most_l0
    if ps.log_contains("ingest stopped: an L0 depth of "):
        assert ps.log_contains("ingest resumed after waiting for compaction")
    info = wait_until(
        lambda: (i := timeline.info())["layers"]["l1"] > 0 and i["layers"]["l0"] < 2 and i,
        what="background compaction below compaction_threshold",
    )
    assert info["layers"]["l1"] >= 1
    timeline.verify()
    metrics = ps.http.metrics_text()
    assert "pageserver_compactions_total 0" not in metrics
    ps.restart()
    timeline.verify()


@pytest.mark.needs_testing
def test_ingest_stops_at_the_l0_limit_until_compaction_runs(pageserver_factory: PageserverFactory):
    """With the compaction loop failing (a failpoint panics each pass), L0s pile up to
    l0_stop_threshold; the next batch waits, with a log line, and goes through as soon as
    compaction runs again."""
    ps = pageserver_factory.start(BACKGROUND, env={"FAILPOINTS": "compaction-loop=panic"})
    ps.allowed_errors.extend(["a compaction-loop pass panicked", "panicked at", "ingest stopped: "])
    timeline = TimelineHandle.create(ps)
    work = Workload(8, KEYS)
    while timeline.info()["layers"]["l0"] < BACKGROUND["l0_stop_threshold"]:
        timeline.ingest(work.batch())
        timeline.checkpoint()
    failures = Failures()
    done = threading.Event()

    def held_batch() -> None:
        timeline.ingest(work.batch(), http=ps.http_client())
        done.set()

    t = failures.run(held_batch)
    wait_until(lambda: ps.log_contains("ingest stopped: an L0 depth of 5"), what="the stop logged")
    assert not done.is_set() and not failures.errors
    # Reads and the layer listing are not held.
    assert timeline.info()["layers"]["l0"] == BACKGROUND["l0_stop_threshold"]
    timeline.verify()
    ps.http.configure_failpoints(("compaction-loop", "off"))
    t.join(60)
    failures.check()
    assert done.is_set()
    assert ps.log_contains("ingest resumed after waiting for compaction")
    assert 'pageserver_ingest_l0_wait_seconds_count{reason="stop"} 1' in ps.http.metrics_text()
    timeline.verify()


@pytest.mark.needs_testing
def test_kill_during_background_compaction(pageserver_factory: PageserverFactory):
    """The process dies inside a background compaction, right after its manifest is durable;
    the restart finishes it (retired L0s removed) and loses nothing."""
    ps = pageserver_factory.start(BACKGROUND, env={"FAILPOINTS": "compaction-after-manifest=exit"})
    timeline = TimelineHandle.create(ps)
    work = Workload(9, KEYS)
    for _ in range(200):
        try:
            timeline.ingest(work.batch())
        except CONNECTION_LOST:
            break
    assert ps.wait_for_exit() == 1
    ps.start()
    timeline.recover()
    assert timeline.info()["layers"]["l1"] >= 1
    timeline.verify()
