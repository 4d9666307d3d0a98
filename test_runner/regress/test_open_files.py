"""More layer files than the process may open: at most `max_file_descriptors` of them are open
at once, the others reopen on use, and ingest, checkpoints, reads, restarts and the HTTP API
keep working under a process limit of open files far below the number of layers."""

from __future__ import annotations

import os

from fixtures.ingest import Image, key, page_of
from fixtures.metrics import Metrics
from fixtures.pageserver import Pageserver
from fixtures.plugin import NO_BACKGROUND_COMPACTION, PageserverFactory
from fixtures.timeline import TimelineHandle

PROCESS_LIMIT = 128
LAYERS = 300


def open_descriptors(ps: Pageserver) -> int:
    return len(os.listdir(f"/proc/{ps.pid}/fd"))


def test_more_layers_than_the_process_may_open(pageserver_factory: PageserverFactory):
    ps = pageserver_factory.create({"max_file_descriptors": 32, **NO_BACKGROUND_COMPACTION})
    ps.open_files_limit = PROCESS_LIMIT
    ps.start()
    timeline = TimelineHandle.create(ps)
    for i in range(LAYERS):
        timeline.ingest([Image(key(i % 20), 0x10 * (i + 1), page_of(i))])
        timeline.checkpoint()
    layers = [n for n in timeline.dir_files() if n != "metadata"]
    assert len(layers) == LAYERS, "one layer per checkpoint, each kept"
    assert open_descriptors(ps) < PROCESS_LIMIT

    # Reads at random LSNs reach into every layer; each answer checked against the model.
    timeline.verify(samples_per_key=60)
    metrics = Metrics(ps.http.metrics_text())
    assert metrics.value("pageserver_open_files") <= 32
    assert metrics.value("pageserver_max_file_descriptors") == 32
    assert metrics.value("pageserver_file_opens_total", kind="reopen") > 0
    assert metrics.value("pageserver_file_evictions_total") > 0
    assert ps.http.status()["id"] == ps.server_id

    # A restart loads all of them under the same limit, and serves the same pages.
    ps.restart()
    assert ps.http.tenant_info(timeline.tenant_id)["state"] == "Active"
    assert ps.log_contains(rf"1 timelines, {LAYERS} delta layers")
    timeline.verify(samples_per_key=60)
    timeline.ingest([Image(key(1), 0x10 * (LAYERS + 1), page_of(1))])
    timeline.checkpoint()
    timeline.verify(keys=[key(1)])
    assert open_descriptors(ps) < PROCESS_LIMIT


def test_the_setting_is_checked_against_the_limit_at_startup(pageserver_factory: PageserverFactory):
    ps = pageserver_factory.create({"max_file_descriptors": 100})
    ps.open_files_limit = PROCESS_LIMIT
    ps.allowed_errors.append(r"WARN .*max_file_descriptors 100 leaves too few")
    ps.start()
    assert ps.log_contains(r"at most 100 files open at once \(of 128 the process may open\)")
    assert ps.log_contains(r"WARN .*max_file_descriptors 100 leaves too few of the process's limit of 128")
