"""Local faults under remote transfers, against both remote storage backends: a download whose
write tears on the local disk is refused by the check of what the disk holds and downloaded
again; an upload whose reads of the local file fail, or return other bytes, never leaves a bad
object or an index listing one, and completes once the reads are right. Every read is checked
against the reference model."""

from __future__ import annotations

from fixtures.ingest import Workload, key
from fixtures.metrics import Metrics
from fixtures.plugin import PageserverFactory
from fixtures.remote_storage import RemoteStore, crc32c
from fixtures.timeline import TimelineHandle
from fixtures.uploads import history, wait_evicted, wait_uploaded
from fixtures.utils import Lsn, wait_until

KEYS = [key(i) for i in range(48)]
ON_REQUEST = {"compaction_threshold": 0, "compaction_target_size": "64KiB"}


def upload_errors(ps) -> float:
    return Metrics(ps.http.metrics_text()).value("pageserver_remote_operations_total", op="upload_layer", result="error")


def test_a_torn_download_is_refused_and_downloaded_again(pageserver_factory: PageserverFactory, remote_store: RemoteStore):
    ps = pageserver_factory.start({**ON_REQUEST, "max_local_layer_bytes": "64KiB"}, remote=remote_store)
    timeline = TimelineHandle.create(ps)
    history(timeline, Workload(31, KEYS))
    wait_uploaded(remote_store, timeline)

    wait_evicted(timeline)
    ps.allowed_errors.append("as written to disk is")
    # The next write of a download writes half of its bytes and says it wrote them all.
    ps.http.configure_failpoints(("remote-download-torn-write", "1*return"))
    ps.http.page_cache_drop()
    path = f"/v1/tenant/{timeline.tenant_id}/timeline/{timeline.timeline_id}/page"
    refused = []
    for k in timeline.model.keys():
        r = ps.http.request("GET", path, params={"key": k.hex(), "lsn": "latest"})
        if r.status_code != 200:
            refused.append(r.text)
    # The torn file was found by reading it back, before it was renamed into place: a read
    # was refused with what the disk held, and none answered from the torn file.
    assert any("as written to disk is" in text for text in refused), refused
    ps.wait_for_log("as written to disk is", timeout=10)
    # A read after the failure's short sharing window downloads the layer again, whole.
    wait_until(timeline.verify, timeout=60, interval=0.2, what="reads right after a new download")
    tl_dir = ps.timeline_dir(timeline.tenant_id, timeline.timeline_id)
    for layer in timeline.http.layers(timeline.tenant_id, timeline.timeline_id):
        if layer["file_name"] and layer["resident"]:
            assert (tl_dir / layer["file_name"]).stat().st_size == layer["size_bytes"], layer
    assert not list(tl_dir.glob("*.___temp")), "a refused download left its file"


def test_an_upload_whose_reads_fail_or_lie_leaves_no_bad_object_and_completes(
    pageserver_factory: PageserverFactory, remote_store: RemoteStore
):
    ps = pageserver_factory.start(ON_REQUEST, remote=remote_store)
    timeline = TimelineHandle.create(ps)
    work = Workload(32, KEYS)
    history(timeline, work, flushes=2)
    before = wait_uploaded(remote_store, timeline)
    ps.allowed_errors.append("remote upload queue step failed: upload of remote object")

    for action in ("return", "return(corrupt)"):
        errors = upload_errors(ps)
        ps.http.configure_failpoints(("remote-upload-read", action))
        for _ in range(3):
            timeline.ingest(work.batch(max_records=12))
        timeline.checkpoint()
        disk_consistent = Lsn.parse(timeline.info()["disk_consistent_lsn"])
        assert disk_consistent > before
        wait_until(lambda: upload_errors(ps) >= errors + 2, timeout=60, what=f"uploads failing ({action})", fatal=(AssertionError,))
        # Every read of a layer file fails or lies: no new layer is in the store, the index
        # still describes what it had, and everything it lists is whole.
        index = remote_store.check_consistent(timeline.tenant_id, timeline.timeline_id)
        local = {layer["file_name"]: layer for layer in timeline.http.layers(timeline.tenant_id, timeline.timeline_id) if layer["file_name"]}
        new = set(local) - set(index["layers"])
        assert new, "the flush made no new layer"
        prefix = remote_store.timeline_prefix(timeline.tenant_id, timeline.timeline_id)
        stored = remote_store.objects(prefix)
        assert not [o for o in stored if any(o.startswith(prefix + name) for name in new)], stored
        assert Lsn.parse(timeline.info()["remote_consistent_lsn"]) == before

        # The reads are right again: the queue's retries upload the layers as the files are.
        ps.http.configure_failpoints(("remote-upload-read", "off"))
        before = wait_uploaded(remote_store, timeline)
        assert before == disk_consistent
        index = remote_store.check_consistent(timeline.tenant_id, timeline.timeline_id)
        tl_dir = ps.timeline_dir(timeline.tenant_id, timeline.timeline_id)
        for name in new:
            assert crc32c((tl_dir / name).read_bytes()) == index["layers"][name]["crc32c"], name
    timeline.verify()
