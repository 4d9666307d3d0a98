"""Remote storage, against both backends (a local directory, and a real S3 API server): every
committed layer and then the index reach the store, in an order that keeps the newest index
listing only objects the store holds, through injected failures and `kill -9` at every step of
an upload; deletions settle to exactly what the index lists."""

from __future__ import annotations

import pytest

from fixtures.ingest import Workload, key
from fixtures.pageserver import Pageserver
from fixtures.plugin import PageserverFactory
from fixtures.remote_storage import RemoteStore, TomlInline
from fixtures.timeline import TimelineHandle
from fixtures.utils import Lsn, wait_until

KEYS = [key(i) for i in range(32)]
# Compaction only on request, layers small enough for a test to make a few of them.
ON_REQUEST = {"compaction_threshold": 0, "compaction_target_size": "64KiB"}


def rounds(timeline: TimelineHandle, work: Workload, n: int) -> None:
    """`n` flushes of a few batches each: `n` L0 layers."""
    for _ in range(n):
        for _ in range(3):
            timeline.ingest(work.batch(max_records=10))
        timeline.checkpoint()


def wait_uploaded(store: RemoteStore, timeline: TimelineHandle, exact: bool = True, timeout: float = 60.0) -> dict:
    """Waits until remote_consistent_lsn reaches disk_consistent_lsn and the store's newest
    index lists exactly the timeline's layer files (with `exact`, the store holds nothing else of
    the timeline); returns that index."""

    def uploaded() -> dict:
        info = timeline.info()
        assert info["remote_consistent_lsn"] == info["disk_consistent_lsn"], info
        index = store.check_consistent(timeline.tenant_id, timeline.timeline_id, exact=exact)
        assert index["disk_consistent_lsn"] == info["disk_consistent_lsn"], index
        files = {layer["file_name"] for layer in timeline.http.layers(timeline.tenant_id, timeline.timeline_id) if layer["file_name"]}
        assert set(index["layers"]) == files, (sorted(index["layers"]), sorted(files))
        return index

    return wait_until(uploaded, timeout=timeout, interval=0.05, what="uploads settled")


def local_layers(timeline: TimelineHandle) -> dict[str, bytes]:
    d = timeline.ps.timeline_dir(timeline.tenant_id, timeline.timeline_id)
    return {p.name: p.read_bytes() for p in d.iterdir() if "__" in p.name and not p.name.endswith(".___temp")}


def test_layers_then_index_reach_the_store(pageserver_factory: PageserverFactory, remote_store: RemoteStore):
    ps = pageserver_factory.start(ON_REQUEST, remote=remote_store)
    timeline = TimelineHandle.create(ps)
    # Created: an empty index at generation 1 already.
    index = wait_uploaded(remote_store, timeline)
    assert (index["generation"], index["layers"], index["version"], index["contiguous_from"]) == (1, {}, 2, "0/0")

    work = Workload(1, KEYS)
    rounds(timeline, work, 4)
    index = wait_uploaded(remote_store, timeline)
    assert len(index["layers"]) == 4 and {layer["level"] for layer in index["layers"].values()} == {"L0"}
    assert {layer["group_size"] for layer in index["layers"].values()} == {1}, index
    # Each object is a byte copy of the local layer file, named with its generation.
    prefix = remote_store.timeline_prefix(timeline.tenant_id, timeline.timeline_id)
    for name, data in local_layers(timeline).items():
        assert remote_store.read(f"{prefix}{name}-00000001") == data, name
    metrics = ps.http.metrics_text()
    durable = Lsn.parse(timeline.info()["disk_consistent_lsn"])
    assert f'pageserver_remote_consistent_lsn{{tenant_id="{timeline.tenant_id}",timeline_id="{timeline.timeline_id}"}} {int(durable)}' in metrics
    assert 'pageserver_remote_operations_total{op="upload_layer",result="ok"} 4' in metrics

    # Compaction retires the L0s: once an index without them is durable, their objects go, and
    # the store holds exactly the new index and its L1s.
    ps.http.compact(timeline.tenant_id, timeline.timeline_id)
    index = wait_uploaded(remote_store, timeline)
    assert {layer["level"] for layer in index["layers"].values()} == {"L1"}
    assert set(index["layers"]) == set(local_layers(timeline))
    timeline.verify()


def test_injected_failures_are_retried_on_every_operation(pageserver_factory: PageserverFactory, remote_store: RemoteStore):
    # A small disk budget, so that layers are evicted and reads download them too.
    ps = pageserver_factory.start({**ON_REQUEST, "test_remote_failures": 2, "max_local_layer_bytes": "64KiB"}, remote=remote_store)
    ps.allowed_errors.append("remote operation failed: .*injected failure")
    timeline = TimelineHandle.create(ps)
    work = Workload(2, KEYS)
    rounds(timeline, work, 3)
    wait_uploaded(remote_store, timeline)
    ps.http.compact(timeline.tenant_id, timeline.timeline_id)
    wait_uploaded(remote_store, timeline)
    wait_until(
        lambda: any(not layer["resident"] for layer in ps.http.layers(timeline.tenant_id, timeline.timeline_id)),
        timeout=60,
        what="an eviction",
    )
    ps.http.page_cache_drop()
    timeline.verify()
    # Every kind of operation failed first, and went through on a retry.
    log = ps.log_text()
    for op in ("upload", "put", "create", "delete", "list", "get", "download"):
        assert f'op="{op}"' in log or f"op={op}" in log, f"no injected failure of {op}"
    assert ps.http.metrics_text().count('result="error"} 0') >= 4, "a step failed for good"
    ps.restart()
    timeline.verify()


@pytest.mark.needs_testing
@pytest.mark.parametrize("failpoint", ["remote-after-layer-upload", "remote-before-index-upload"])
def test_crash_during_uploads_loses_nothing_remote(pageserver_factory: PageserverFactory, remote_store: RemoteStore, failpoint: str):
    ps = pageserver_factory.start(ON_REQUEST, remote=remote_store)
    timeline = TimelineHandle.create(ps)
    work = Workload(3, KEYS)
    rounds(timeline, work, 2)
    before = wait_uploaded(remote_store, timeline)
    remote_before = Lsn.parse(before["disk_consistent_lsn"])

    ps.http.configure_failpoints((failpoint, "exit"))
    rounds(timeline, work, 1)
    assert ps.wait_for_exit() == 1
    # The crash came between an upload and its index: the store's newest index is still the one
    # before, and lists only what the store holds.
    index = remote_store.check_consistent(timeline.tenant_id, timeline.timeline_id)
    assert Lsn.parse(index["disk_consistent_lsn"]) == remote_before

    ps.start()
    timeline.recover()
    assert Lsn.parse(timeline.info()["remote_consistent_lsn"]) >= remote_before
    # The restart uploads what was left, and the sweep removes what the crash orphaned.
    wait_uploaded(remote_store, timeline)
    timeline.verify()


def test_deleting_a_timeline_deletes_its_objects(pageserver_factory: PageserverFactory, remote_store: RemoteStore):
    ps = pageserver_factory.start(ON_REQUEST, remote=remote_store)
    timeline = TimelineHandle.create(ps)
    rounds(timeline, Workload(4, KEYS), 2)
    wait_uploaded(remote_store, timeline)
    ps.http.timeline_delete(timeline.tenant_id, timeline.timeline_id)
    assert remote_store.objects(remote_store.timeline_prefix(timeline.tenant_id, timeline.timeline_id)) == {}
    # The same id again starts empty, from an empty store.
    ps.http.timeline_create(timeline.tenant_id, timeline.timeline_id)
    fresh = TimelineHandle(ps, timeline.tenant_id, timeline.timeline_id)
    assert fresh.get(KEYS[0], "latest") is None
    wait_uploaded(remote_store, fresh)




def test_large_layers_upload_in_parts_and_download_whole(pageserver_factory: PageserverFactory, remote_store: RemoteStore):
    """Layers over the part size (8 MiB to S3, 1 MiB to a directory): multipart uploads, and downloads of them
    (streamed from S3, copied from a directory) after an eviction."""
    ps = pageserver_factory.start({**ON_REQUEST, "compaction_target_size": "64MiB", "max_local_layer_bytes": "1MiB"}, remote=remote_store)
    timeline = TimelineHandle.create(ps)
    keys = [key(i) for i in range(700)]
    work = Workload(5, keys)
    for _ in range(2):
        for _ in range(24):
            timeline.ingest(work.batch(max_records=100))
        timeline.checkpoint()
    ps.http.compact(timeline.tenant_id, timeline.timeline_id)
    index = wait_uploaded(remote_store, timeline)
    assert max(layer["size"] for layer in index["layers"].values()) > 8 << 20, index
    wait_until(
        lambda: all(not layer["resident"] for layer in ps.http.layers(timeline.tenant_id, timeline.timeline_id) if layer["level"] == "L1"),
        timeout=60,
        what="the L1 evicted",
    )
    ps.http.page_cache_drop()
    timeline.verify(samples_per_key=2)


def test_hard_linked_uploads_are_the_layer_files_and_outlive_them(pageserver_factory: PageserverFactory):
    """`hard_links = true` on a directory in the work directory (so on its file system): every
    object is its layer file's inode (no second write); compaction's deletions and evictions
    remove only their own names; an evicted layer is downloaded back as a copy, and every read
    answers as before."""
    linked = {"remote_storage": TomlInline({"local_path": "linked-remote", "hard_links": True})}
    ps = pageserver_factory.start({**ON_REQUEST, **linked})
    store = RemoteStore("local", root=ps.workdir / "linked-remote")
    timeline = TimelineHandle.create(ps)
    work = Workload(6, KEYS)
    tl_dir = ps.timeline_dir(timeline.tenant_id, timeline.timeline_id)
    prefix = store.timeline_prefix(timeline.tenant_id, timeline.timeline_id)

    def shared(index: dict) -> None:
        for name in index["layers"]:
            local, remote = (tl_dir / name).stat(), (store.root / f"{prefix}{name}-00000001").stat()
            assert (local.st_dev, local.st_ino, local.st_nlink) == (remote.st_dev, remote.st_ino, 2), name

    rounds(timeline, work, 4)
    shared(wait_uploaded(store, timeline))
    ps.http.compact(timeline.tenant_id, timeline.timeline_id)
    index = wait_uploaded(store, timeline)
    assert {layer["level"] for layer in index["layers"].values()} == {"L1"}
    shared(index)
    assert not [p for p in store.root.rglob("*") if "#" in p.name], "a staging name was left"

    # A small local budget evicts the L1s: their objects keep the bytes, now the only name.
    ps.stop()
    ps.config["max_local_layer_bytes"] = "1KiB"
    ps.start()
    wait_until(
        lambda: all(not (tl_dir / name).exists() for name in index["layers"]),
        timeout=60,
        what="the L1s evicted",
    )
    for name in index["layers"]:
        assert (store.root / f"{prefix}{name}-00000001").stat().st_nlink == 1, name
    # Reads download them back, as copies: the objects are not written through.
    ps.http.page_cache_drop()
    timeline.verify()
    assert any((tl_dir / name).exists() for name in index["layers"])
    for name in index["layers"]:
        assert (store.root / f"{prefix}{name}-00000001").stat().st_nlink == 1, name
    store.check_consistent(timeline.tenant_id, timeline.timeline_id)
    assert not [p for p in store.root.rglob("*") if "#" in p.name], "a staging name was left"
