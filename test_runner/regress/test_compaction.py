"""L0 -> L1 compaction over HTTP: answers unchanged, fewer layers per read, crash-safe at every
step (the process killed at each failpoint of a compaction restarts with the model's answers)."""

from __future__ import annotations

import pytest
import requests

from fixtures.ingest import Workload, key
from fixtures.plugin import PageserverFactory
from fixtures.timeline import TimelineHandle

CONNECTION_LOST = (requests.exceptions.ConnectionError, requests.exceptions.ChunkedEncodingError)
KEYS = [key(i) for i in range(24)]


def l0_rounds(timeline: TimelineHandle, work: Workload, rounds: int) -> None:
    """`rounds` flushes, each one L0 layer of updates to every key."""
    for _ in range(rounds):
        for _ in range(3):
            timeline.ingest(work.batch(max_records=8))
        timeline.checkpoint()


def layer_files(timeline: TimelineHandle) -> list[str]:
    return [n for n in timeline.dir_files() if "__" in n and not n.endswith(".___temp")]


def test_compaction_over_http(pageserver_factory: PageserverFactory):
    ps = pageserver_factory.start({"compaction_target_size": "64KiB"})
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
    ps = pageserver_factory.start({"compaction_target_size": "64KiB"})
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
