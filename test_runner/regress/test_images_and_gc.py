"""Image creation and GC over HTTP: images end a read's walk, GC removes what they cover below
the cutoff and refuses reads there with a 410, the cutoff survives a restart, a crash at every
step of either leaves the model's answers, and the background loop does both on its own."""

from __future__ import annotations

import pytest
import requests

from fixtures.http import PageserverApiError
from fixtures.ingest import Workload, key
from fixtures.layers import l0_rounds, layer_files, two_runs
from fixtures.plugin import PageserverFactory
from fixtures.timeline import TimelineHandle
from fixtures.utils import Lsn, wait_until

CONNECTION_LOST = (requests.exceptions.ConnectionError, requests.exceptions.ChunkedEncodingError)
KEYS = [key(i) for i in range(24)]
# Compaction, image creation and GC only when asked for; images once two runs of L1s stack;
# GC keeps no history past the images.
ON_REQUEST = {
    "compaction_target_size": "64KiB",
    "compaction_threshold": 0,
    "image_creation_threshold": 2,
    "gc_horizon": 0,
}


def read_layers(timeline: TimelineHandle, k: bytes) -> int:
    response = timeline.http.get_page_response(timeline.tenant_id, timeline.timeline_id, k, "latest")
    return int(response.headers["X-Read-Cost"].split("layers=")[1].split()[0])


def test_images_and_gc_over_http(pageserver_factory: PageserverFactory):
    ps = pageserver_factory.start(ON_REQUEST)
    timeline = TimelineHandle.create(ps)
    work = Workload(5, KEYS)
    l0_rounds(timeline, work, 3)
    first = timeline.http.compact(timeline.tenant_id, timeline.timeline_id)
    # One run of L1s: under the threshold of two.
    assert first["image_creation"]["layers_written"] == 0, first
    l0_rounds(timeline, work, 2)
    info = timeline.http.compact(timeline.tenant_id, timeline.timeline_id)
    images = info["image_creation"]
    assert images["pieces_imaged"] == 1 and images["layers_written"] >= 2, images
    # Every key with a page (a key whose versions hold no base has none).
    assert 0 < images["images"] <= len(KEYS)
    assert info["layers"]["image"] == images["layers_written"]
    image_lsn = Lsn(images["lsn"])
    layers = timeline.http.layers(timeline.tenant_id, timeline.timeline_id)
    image_layers = [layer for layer in layers if layer["kind"] == "image"]
    assert {layer["level"] for layer in image_layers} == {"image"}
    assert {Lsn(layer["lsn_start"]) for layer in image_layers} == {image_lsn}
    timeline.verify()
    timeline.http.page_cache_drop()
    assert read_layers(timeline, KEYS[3]) == 1
    metrics = ps.http.metrics_text()
    assert f"pageserver_image_layers_created_total {images['layers_written']}" in metrics
    assert f'level="image"}} {images["layers_written"]}' in metrics
    assert images["bytes_read"] > 0
    # The read above visited one layer: it is in the histogram's first bucket.
    assert 'pageserver_getpage_layers_visited_bucket{le="1"} 0' not in metrics

    # GC: the cutoff moves to the images, the L1s under them go, reads below are refused.
    l1 = info["layers"]["l1"]
    gc = timeline.http.gc(timeline.tenant_id, timeline.timeline_id)
    assert Lsn(gc["gc"]["cutoff"]) == image_lsn == Lsn(gc["gc_cutoff_lsn"])
    assert gc["gc"]["layers_removed"] == l1 and gc["gc"]["bytes_removed"] > 0, gc
    assert (gc["layers"]["l1"], gc["layers"]["image"]) == (0, images["layers_written"])
    listed = timeline.http.layers(timeline.tenant_id, timeline.timeline_id)
    assert sorted(layer_files(timeline)) == sorted(layer["file_name"] for layer in listed)
    with pytest.raises(PageserverApiError) as refused:
        timeline.get(KEYS[0], image_lsn - 1)
    assert refused.value.status_code == 410
    assert f"below the GC cutoff {image_lsn}" in refused.value.msg
    timeline.verify()

    ps.restart()
    assert Lsn(timeline.info()["gc_cutoff_lsn"]) == image_lsn
    timeline.verify()
    # Ingest goes on above the images.
    l0_rounds(timeline, work, 1)
    timeline.verify()


def test_compact_refuses_a_bad_force_images(pageserver_factory: PageserverFactory):
    ps = pageserver_factory.start(ON_REQUEST)
    timeline = TimelineHandle.create(ps)
    with pytest.raises(PageserverApiError) as refused:
        timeline.http.json("PUT", f"/v1/tenant/{timeline.tenant_id}/timeline/{timeline.timeline_id}/compact?force_images=yes")
    assert refused.value.status_code == 400 and "force_images" in refused.value.msg


IMAGE_CRASH_POINTS = [
    # An image layer is written and fsynced, not yet renamed.
    "image-layer-before-rename",
    # Every image is durable, the manifest not yet stored.
    "image-creation-before-manifest",
    # The manifest lists them; the layer map does not hold them yet.
    "image-creation-after-manifest",
]


@pytest.mark.needs_testing
@pytest.mark.parametrize("failpoint", IMAGE_CRASH_POINTS)
def test_crash_during_image_creation(pageserver_factory: PageserverFactory, failpoint: str):
    ps = pageserver_factory.start({**ON_REQUEST, "image_creation_threshold": 100})
    timeline = TimelineHandle.create(ps)
    work = Workload(6, KEYS)
    two_runs(timeline, work)
    before = sorted(layer_files(timeline))
    ps.http.configure_failpoints((failpoint, "exit"))
    with pytest.raises(CONNECTION_LOST):
        timeline.http.compact(timeline.tenant_id, timeline.timeline_id, force_images=True)
    assert ps.wait_for_exit() == 1

    ps.start()
    info = timeline.info()
    if failpoint == "image-creation-after-manifest":
        assert info["layers"]["image"] >= 2, info
    else:
        assert info["layers"]["image"] == 0, info
        # Images of the uncommitted creation (renamed or not) were removed at startup.
        assert sorted(layer_files(timeline)) == before
    timeline.verify()
    again = timeline.http.compact(timeline.tenant_id, timeline.timeline_id, force_images=True)
    assert again["layers"]["image"] >= 2
    timeline.verify()
    ps.restart()
    timeline.verify()


GC_CRASH_POINTS = [
    # The cutoff and the retired layers are about to be stored.
    "gc-before-manifest",
    # The manifest is renamed into place, its directory not fsynced.
    "metadata-after-rename",
    # The manifest is durable; the layer map still holds the removed layers.
    "gc-after-manifest",
]


@pytest.mark.needs_testing
@pytest.mark.parametrize("failpoint", GC_CRASH_POINTS)
def test_crash_during_gc(pageserver_factory: PageserverFactory, failpoint: str):
    ps = pageserver_factory.start(ON_REQUEST)
    timeline = TimelineHandle.create(ps)
    work = Workload(7, KEYS)
    info = two_runs(timeline, work)
    image_lsn = Lsn(info["image_creation"]["lsn"])
    l1_files = [layer["file_name"] for layer in timeline.http.layers(timeline.tenant_id, timeline.timeline_id) if layer["level"] == "L1"]
    ps.http.configure_failpoints((failpoint, "exit"))
    with pytest.raises(CONNECTION_LOST):
        timeline.http.gc(timeline.tenant_id, timeline.timeline_id)
    assert ps.wait_for_exit() == 1

    ps.start()
    info = timeline.info()
    if failpoint == "gc-before-manifest":
        assert Lsn(info["gc_cutoff_lsn"]) == 0 and info["layers"]["l1"] == len(l1_files), info
    else:
        # Committed: the new cutoff holds, and startup removed the retired files.
        assert Lsn(info["gc_cutoff_lsn"]) == image_lsn and info["layers"]["l1"] == 0, info
        assert not set(l1_files) & set(layer_files(timeline))
    timeline.verify()
    timeline.http.gc(timeline.tenant_id, timeline.timeline_id)
    assert timeline.info()["layers"]["l1"] == 0
    timeline.verify()


BACKGROUND = {
    "checkpoint_distance": "32KiB",
    "compaction_target_size": "64KiB",
    "compaction_threshold": 2,
    "image_creation_threshold": 2,
    # LSNs here advance by one per record: keep no history past the images.
    "gc_horizon": 0,
}


def test_background_images_and_gc(pageserver_factory: PageserverFactory):
    ps = pageserver_factory.start(BACKGROUND)
    timeline = TimelineHandle.create(ps)
    work = Workload(8, KEYS)
    removed = 0

    def images_made_and_gc_ran() -> bool:
        nonlocal removed
        for _ in range(4):
            timeline.ingest(work.batch(max_records=8))
        metrics = ps.http.metrics_text()
        removed = int(next(line.split()[1] for line in metrics.splitlines() if line.startswith("pageserver_gc_layers_removed_total ")))
        info = timeline.info()
        assert info["layers"]["image"] > 0 and Lsn(info["gc_cutoff_lsn"]) > 0 and removed > 0, info
        return True

    wait_until(images_made_and_gc_ran, timeout=60)
    # What GC removed is gone from the directory (once no read holds it), and the answers
    # above the cutoff stand.
    def no_unlisted_layer_files() -> bool:
        listed = {layer["file_name"] for layer in timeline.http.layers(timeline.tenant_id, timeline.timeline_id)}
        return set(layer_files(timeline)) <= listed

    wait_until(no_unlisted_layer_files, timeout=10)
    timeline.verify()
    ps.restart()
    timeline.verify()
