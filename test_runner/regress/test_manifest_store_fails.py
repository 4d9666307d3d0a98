"""A manifest store that fails after its rename, the server still running: the new manifest has
its name but its directory was not fsynced, so whether the change survives a crash is unknown.
Compaction, image creation and GC then keep every file either manifest lists, the timeline
refuses changes, batches and branches until it is loaded again, reads stay right meanwhile, and
the restart loads the timeline whole (with the change: the rename did happen) and answers every
read as before.

Before, compaction and image creation removed the files of their change as "uncommitted" while
the manifest on disk listed them, and the next start refused the timeline."""

from __future__ import annotations

import pytest

from fixtures.http import PageserverApiError
from fixtures.ingest import Workload, key
from fixtures.layers import l0_rounds
from fixtures.plugin import PageserverFactory
from fixtures.timeline import TimelineHandle
from fixtures.utils import Lsn

KEYS = [key(i) for i in range(24)]
# Each step only when asked for; images only when forced; GC keeps no history past the images.
ON_REQUEST = {
    "compaction_target_size": "64KiB",
    "compaction_threshold": 0,
    "image_creation_threshold": 100,
    "gc_horizon": 0,
}
FAILPOINT = "metadata-after-rename"


def layer_counts(timeline: TimelineHandle) -> dict:
    return timeline.info()["layers"]


def step(timeline: TimelineHandle, name: str) -> dict:
    http, t, tl = timeline.http, timeline.tenant_id, timeline.timeline_id
    if name == "compaction":
        return http.compact(t, tl)
    if name == "image_creation":
        return http.compact(t, tl, force_images=True)
    return http.gc(t, tl)


def prepare(timeline: TimelineHandle, work: Workload, name: str) -> None:
    """Leaves the timeline where `name`'s manifest store is the next one: L0s to compact; L1s
    (and no L0s) to cover with images; images for GC to remove the L1s below."""
    l0_rounds(timeline, work, 3)
    if name != "compaction":
        step(timeline, "compaction")
    if name == "gc":
        step(timeline, "image_creation")


def changed(before: dict, after: dict, name: str) -> bool:
    """Whether the layer counts show `name`'s change."""
    if name == "compaction":
        return before["l0"] > 0 and after["l0"] == 0 and after["l1"] > 0
    if name == "image_creation":
        return after["image"] > before["image"]
    return after["l1"] < before["l1"]


@pytest.mark.needs_testing
@pytest.mark.parametrize("name", ["compaction", "image_creation", "gc"])
def test_a_manifest_store_failing_after_its_rename_keeps_every_file(pageserver_factory: PageserverFactory, name: str):
    ps = pageserver_factory.start(ON_REQUEST)
    timeline = TimelineHandle.create(ps)
    work = Workload(11, KEYS)
    prepare(timeline, work, name)
    before = layer_counts(timeline)
    files_before = set(timeline.dir_files())

    ps.allowed_errors.append(FAILPOINT)
    ps.allowed_errors.append("may or may not be stored")
    ps.http.configure_failpoints((FAILPOINT, "1*return"))
    with pytest.raises(PageserverApiError) as failed:
        step(timeline, name)
    ps.http.configure_failpoints((FAILPOINT, "off"))
    assert failed.value.status_code == 500 and FAILPOINT in failed.value.msg, failed.value
    assert "may or may not be stored" in failed.value.msg, failed.value

    # Nothing was removed: not the change's new files, not the ones it retires.
    assert files_before <= set(timeline.dir_files())
    # The timeline takes no more changes until it is loaded again; reads are right meanwhile.
    with pytest.raises(PageserverApiError) as refused:
        step(timeline, name)
    assert refused.value.status_code == 503 and "reload the timeline" in refused.value.msg, refused.value
    with pytest.raises(PageserverApiError) as refused:
        timeline.ingest(work.batch(max_records=8))
    assert refused.value.status_code == 503 and "reload the timeline" in refused.value.msg, refused.value
    # Nor a branch: the manifest a load finds may have a GC cutoff above its point.
    with pytest.raises(PageserverApiError) as refused:
        timeline.branch()
    assert refused.value.status_code == 503 and "reload the timeline" in refused.value.msg, refused.value
    timeline.verify()

    # Its shutdown flush is refused too, and the exit code says so.
    ps.stop(expect_code=None)
    ps.start()
    after = layer_counts(timeline)
    assert changed(before, after, name), (before, after)
    assert ps.leftovers() == []
    timeline.verify()
    # The timeline takes changes again.
    l0_rounds(timeline, work, 1)
    step(timeline, "compaction")
    assert Lsn.parse(timeline.info()["disk_consistent_lsn"]) == Lsn.parse(timeline.info()["last_record_lsn"])
    timeline.verify()
