"""Tenants that move: lost local disks, detach from one pageserver and attach to another that
shares the store, eviction under a small disk budget with reads that download, damaged local
layers downloaded again, and a stale generation fenced. Against both remote storage backends;
every read is checked against the reference model."""

from __future__ import annotations

import json
import shutil

from fixtures.ingest import Workload, key
from fixtures.metrics import Metrics
from fixtures.plugin import PageserverFactory
from fixtures.remote_storage import RemoteStore
from fixtures.timeline import TimelineHandle
from fixtures.uploads import history, wait_evicted, wait_uploaded
from fixtures.utils import Lsn, wait_until

KEYS = [key(i) for i in range(48)]
ON_REQUEST = {"compaction_threshold": 0, "compaction_target_size": "64KiB"}


def read_cost(timeline: TimelineHandle, k: bytes, lsn: int | str) -> dict[str, int]:
    """The X-Read-Cost of reading page `k` at `lsn` (a page with no version there too)."""
    path = f"/v1/tenant/{timeline.tenant_id}/timeline/{timeline.timeline_id}/page"
    r = timeline.http.request("GET", path, params={"key": k.hex(), "lsn": str(lsn)})
    assert r.status_code in (200, 404), r.text
    return {f.split("=")[0]: int(f.split("=")[1]) for f in r.headers["X-Read-Cost"].split()}


def test_a_lost_disk_comes_back_from_the_store_at_remote_consistent_lsn(pageserver_factory: PageserverFactory, remote_store: RemoteStore):
    first = pageserver_factory.start(ON_REQUEST, remote=remote_store)
    timeline = TimelineHandle.create(first)
    work = Workload(11, KEYS)
    history(timeline, work)
    remote = wait_uploaded(remote_store, timeline)
    # More arrives, then the machine and its disk are gone.
    timeline.ingest(work.batch(max_records=12))
    first.kill()
    shutil.rmtree(first.workdir)

    second = pageserver_factory.start(ON_REQUEST, remote=remote_store, name="second")
    info = second.http.tenant_attach(timeline.tenant_id, generation=2)
    assert (info["generation"], info["state"], info["timelines"]) == (2, "Active", 1)
    moved = TimelineHandle(second, timeline.tenant_id, timeline.timeline_id, timeline.model)
    lsns = moved.lsns()
    assert lsns == (remote, remote), lsns
    assert Lsn.parse(moved.info()["remote_consistent_lsn"]) == remote
    moved.model.truncate(remote)
    moved.verify()
    # It goes on from there: clients re-send what came after remote_consistent_lsn.
    moved.ingest(work.batch(max_records=12))
    moved.checkpoint()
    index = wait_uploaded(remote_store, moved)
    assert remote_store.newest_index(moved.tenant_id, moved.timeline_id)["generation"] == 2
    assert index > remote
    moved.verify()


def test_detach_from_one_server_and_attach_to_another(pageserver_factory: PageserverFactory, remote_store: RemoteStore):
    first = pageserver_factory.start(ON_REQUEST, remote=remote_store)
    timeline = TimelineHandle.create(first)
    work = Workload(12, KEYS)
    history(timeline, work)
    timeline.ingest(work.batch(max_records=12))  # not flushed: detach flushes and uploads it
    last = timeline.model.last_lsn
    first.http.tenant_detach(timeline.tenant_id)
    assert not first.tenant_dir(timeline.tenant_id).exists()
    assert first.http.tenant_list() == []

    second = pageserver_factory.start(ON_REQUEST, remote=remote_store, name="second")
    second.http.tenant_attach(timeline.tenant_id, generation=2)
    moved = TimelineHandle(second, timeline.tenant_id, timeline.timeline_id, timeline.model)
    assert moved.lsns() == (Lsn(last), Lsn(last))
    moved.verify()
    # Attaching again, or with an old generation elsewhere, is refused.
    first_err = first.http.request("POST", f"/v1/tenant/{timeline.tenant_id}/attach", json={"generation": 1})
    assert first_err.status_code == 409 and "not newer" in first_err.json()["msg"], first_err.text
    again = second.http.request("POST", f"/v1/tenant/{timeline.tenant_id}/attach", json={"generation": 3})
    assert again.status_code == 409, again.text
    missing = second.http.request("POST", f"/v1/tenant/{'ab' * 16}/attach", json={"generation": 1})
    assert missing.status_code == 404, missing.text


def hydration(info: dict) -> tuple[int, int, int, int]:
    """Tenant or timeline info's layer files on the local disk, against all of them."""
    return (info["resident_layers"], info["layers_total"], info["resident_bytes"], info["layer_bytes_total"])


def test_info_and_the_log_show_the_prefetch_filling_the_disk(pageserver_factory: PageserverFactory, remote_store: RemoteStore):
    """Tenant and timeline info count the layer files on the local disk against all of them:
    all of them where they were written; after an attach, those the prefetch has downloaded,
    until it has them all, with a log line per file and a last line that says it is done; under
    a disk budget, what fits, and the last line says why it stopped."""
    first = pageserver_factory.start(ON_REQUEST, remote=remote_store)
    timeline = TimelineHandle.create(first)
    history(timeline, Workload(14, KEYS))
    wait_uploaded(remote_store, timeline)
    before = timeline.info()
    files = before["layers"]["delta"] + before["layers"]["image"]
    size = before["delta_layer_bytes"] + before["image_layer_bytes"]
    assert files >= 4 and before["layers"]["image"] >= 1, before
    assert hydration(before) == (files, files, size, size)
    assert hydration(first.http.tenant_info(timeline.tenant_id)) == (files, files, size, size)
    first.http.tenant_detach(timeline.tenant_id)

    second = pageserver_factory.start(ON_REQUEST, remote=remote_store, name="second")
    attached = second.http.tenant_attach(timeline.tenant_id, generation=2)
    # Only the indexes came before the answer; the prefetch may have begun since.
    assert (attached["layers_total"], attached["layer_bytes_total"]) == (files, size), attached
    assert attached["resident_layers"] < files, attached

    def filled() -> dict:
        info = second.http.timeline_info(timeline.tenant_id, timeline.timeline_id)
        assert hydration(info) == (files, files, size, size), hydration(info)
        return info

    wait_until(filled, timeout=60, what="the prefetch to download every layer")
    assert hydration(second.http.tenant_info(timeline.tenant_id)) == (files, files, size, size)
    second.wait_for_log(rf"prefetching {files} layer files \({size} bytes\) of the attached tenant")
    for n in range(1, files + 1):
        assert second.log_contains(rf"prefetched layer {n} of {files}, \d+ of {size} bytes"), n
    second.wait_for_log(rf"prefetched {files} of {files} layer files, {size} of {size} bytes; done")
    moved = TimelineHandle(second, timeline.tenant_id, timeline.timeline_id, timeline.model)
    moved.verify()
    second.http.tenant_detach(timeline.tenant_id)

    # Room for about half: the prefetch stops at the budget and says so; reads download the rest.
    budget = size // 2
    third = pageserver_factory.start({**ON_REQUEST, "max_local_layer_bytes": budget}, remote=remote_store, name="third")
    third.http.tenant_attach(timeline.tenant_id, generation=3)
    third.wait_for_log(r"prefetched \d+ of \d+ layer files, \d+ of \d+ bytes; stopped: the rest would not fit in max_local_layer_bytes", timeout=60)
    resident, total, resident_bytes, total_bytes = hydration(third.http.timeline_info(timeline.tenant_id, timeline.timeline_id))
    assert (total, total_bytes) == (files, size)
    assert 0 < resident < files and 0 < resident_bytes <= budget, (resident, resident_bytes, budget)
    TimelineHandle(third, timeline.tenant_id, timeline.timeline_id, timeline.model).verify()


def test_eviction_keeps_the_disk_budget_and_reads_download(pageserver_factory: PageserverFactory, remote_store: RemoteStore):
    ps = pageserver_factory.start({**ON_REQUEST, "max_local_layer_bytes": "64KiB"}, remote=remote_store)
    timeline = TimelineHandle.create(ps)
    history(timeline, Workload(13, KEYS))
    wait_uploaded(remote_store, timeline)

    gone = wait_evicted(timeline)
    assert all(layer["level"] in ("L1", "image") for layer in gone)
    for layer in gone:
        assert not (ps.timeline_dir(timeline.tenant_id, timeline.timeline_id) / layer["file_name"]).exists()
    # Each layer file no longer on the disk was evicted at least once, and counted: a counter
    # that is missing fails at once rather than passing as "not 0".
    wait_until(
        lambda: Metrics(ps.http.metrics_text()).value("pageserver_layer_evictions_total") >= len(gone),
        timeout=60,
        what="evictions counted",
        fatal=(AssertionError,),
    )
    # Reads download what they need, and answer as before.
    ps.http.page_cache_drop()
    downloads = sum(read_cost(timeline, k, "latest")["downloads"] for k in timeline.model.keys())
    assert downloads >= 1
    timeline.verify()


def test_a_damaged_local_layer_is_downloaded_again_at_startup(pageserver_factory: PageserverFactory, remote_store: RemoteStore):
    ps = pageserver_factory.start(ON_REQUEST, remote=remote_store)
    timeline = TimelineHandle.create(ps)
    history(timeline, Workload(14, KEYS))
    wait_uploaded(remote_store, timeline)
    layers = [layer for layer in timeline.http.layers(timeline.tenant_id, timeline.timeline_id) if layer["file_name"]]
    ps.stop()
    tl_dir = ps.timeline_dir(timeline.tenant_id, timeline.timeline_id)
    for layer in layers[:3]:
        path = tl_dir / layer["file_name"]
        path.write_bytes(path.read_bytes()[: layer["size_bytes"] // 2])
    # Another layer's bytes under a fourth one's name: not that layer, whatever its size.
    (tl_dir / layers[4]["file_name"]).write_bytes((tl_dir / layers[3]["file_name"]).read_bytes())
    ps.allowed_errors.append("downloading it again")
    ps.start()
    for layer in layers[:3] + layers[4:5]:
        path = tl_dir / layer["file_name"]
        assert not path.exists() or path.stat().st_size == layer["size_bytes"], layer
    timeline.verify()


def test_a_stale_generation_cannot_delete_what_a_newer_one_lists(pageserver_factory: PageserverFactory, remote_store: RemoteStore):
    old = pageserver_factory.start(ON_REQUEST, remote=remote_store)
    timeline = TimelineHandle.create(old)
    work = Workload(15, KEYS)
    for _ in range(4):
        timeline.ingest(work.batch(max_records=12))
        timeline.checkpoint()
    wait_uploaded(remote_store, timeline)

    # Another server attaches the tenant at generation 2 while the old one still runs.
    new = pageserver_factory.start(ON_REQUEST, remote=remote_store, name="new")
    new.http.tenant_attach(timeline.tenant_id, generation=2)
    moved = TimelineHandle(new, timeline.tenant_id, timeline.timeline_id, timeline.model)

    def claimed() -> dict:
        index = remote_store.newest_index(timeline.tenant_id, timeline.timeline_id)
        assert index is not None and index["generation"] == 2
        return index

    newest = wait_until(claimed, timeout=60, what="generation 2's index")
    # The stale one compacts: its L0s are in generation 2's index, so it must not delete them.
    old.allowed_errors.append("this attachment is stale")
    old.http.compact(timeline.tenant_id, timeline.timeline_id)
    old.wait_for_log("this attachment is stale", timeout=60)
    remote_store.check_consistent(timeline.tenant_id, timeline.timeline_id)
    assert remote_store.newest_index(timeline.tenant_id, timeline.timeline_id) == newest
    moved.verify()


def test_a_branch_moves_with_its_tenant(pageserver_factory: PageserverFactory, remote_store: RemoteStore):
    """A branch's link to its ancestor is in its remote index: after detach and attach
    elsewhere, its reads below the branch point still come from the ancestor."""
    first = pageserver_factory.start(ON_REQUEST, remote=remote_store)
    main = TimelineHandle.create(first)
    work = Workload(21, KEYS)
    history(main, work)
    branch_lsn = main.lsns()[0]
    branch = main.branch()
    assert Lsn.parse(branch.info()["ancestor_lsn"]) == branch_lsn
    # The parent and the branch diverge.
    main.ingest(work.batch(max_records=12))
    main.checkpoint()
    branch_work = Workload(22, KEYS, start_lsn=int(branch_lsn))
    for _ in range(3):
        branch.ingest(branch_work.batch(max_records=12))
    branch.checkpoint()
    wait_uploaded(remote_store, main)
    wait_uploaded(remote_store, branch)
    first.http.tenant_detach(main.tenant_id)

    second = pageserver_factory.start(ON_REQUEST, remote=remote_store, name="second")
    second.http.tenant_attach(main.tenant_id, generation=2)
    moved = TimelineHandle(second, branch.tenant_id, branch.timeline_id, branch.model)
    info = moved.info()
    assert info["ancestor_timeline_id"] == main.timeline_id
    assert Lsn.parse(info["ancestor_lsn"]) == branch_lsn
    assert moved.verify() > 0
    TimelineHandle(second, main.tenant_id, main.timeline_id, main.model).verify()


def test_an_index_that_lost_a_middle_layer_attaches_broken(pageserver_factory: PageserverFactory, remote_store: RemoteStore):
    """An index whose history has a hole (a middle L0 gone from it) is refused at attach: the
    tenant stays listed, broken with a reason that names the missing LSNs, and serves nothing,
    instead of answering reads of those LSNs with older pages. The whole index attaches again."""
    first = pageserver_factory.start(ON_REQUEST, remote=remote_store)
    timeline = TimelineHandle.create(first)
    work = Workload(23, KEYS)
    for _ in range(4):
        timeline.ingest(work.batch(max_records=24))
        timeline.checkpoint()
    wait_uploaded(remote_store, timeline)
    first.http.tenant_detach(timeline.tenant_id)

    index = remote_store.newest_index(timeline.tenant_id, timeline.timeline_id)
    assert index is not None
    l0 = sorted((name for name, layer in index["layers"].items() if layer["level"] == "L0"), key=lambda n: n.split("__")[1])
    assert len(l0) == 4, l0
    lost = l0[1]
    lost_from, lost_to = (Lsn(int(x, 16)) for x in lost.split("__")[1].split("-"))
    damaged = {**index, "generation": 2, "layers": {n: layer for n, layer in index["layers"].items() if n != lost}}
    prefix = remote_store.timeline_prefix(timeline.tenant_id, timeline.timeline_id)
    remote_store.write(f"{prefix}index_part.json-00000002", json.dumps(damaged).encode())

    second = pageserver_factory.start(ON_REQUEST, remote=remote_store, name="second")
    second.allowed_errors.extend([r"attached tenant is broken", r"request failed: tenant .* is broken", r"cannot be served"])
    r = second.http.request("POST", f"/v1/tenant/{timeline.tenant_id}/attach", json={"generation": 3})
    assert r.status_code == 502, r.text
    msg = r.json()["msg"]
    assert timeline.timeline_id in msg and "a layer is missing" in msg, msg
    assert f"LSNs {lost_from}..{lost_to}" in msg, msg
    info = second.http.tenant_info(timeline.tenant_id)
    assert info["state"] == "Broken" and "a layer is missing" in info["broken_reason"], info
    # Nothing is served from it: not a page, older or not.
    page = second.http.request(
        "GET",
        f"/v1/tenant/{timeline.tenant_id}/timeline/{timeline.timeline_id}/page",
        params={"key": KEYS[0].hex(), "lsn": "latest"},
    )
    assert page.status_code == 503 and "broken" in page.json()["msg"], page.text

    # The whole index, newest again: a fresh server attaches it and reads match the model.
    remote_store.write(f"{prefix}index_part.json-00000004", json.dumps({**index, "generation": 4}).encode())
    third = pageserver_factory.start(ON_REQUEST, remote=remote_store, name="third")
    third.http.tenant_attach(timeline.tenant_id, generation=5)
    TimelineHandle(third, timeline.tenant_id, timeline.timeline_id, timeline.model).verify()
