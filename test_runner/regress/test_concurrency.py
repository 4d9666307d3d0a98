"""Ingest, reads and checkpoints at the same time, from several client threads. Readers only
ask for LSNs already acknowledged (or `latest`), whose answers can no longer change, and
compare them with the model; layers freeze and flush underneath all along."""

from __future__ import annotations

import random
import threading
import time

import pytest

from fixtures.http import PageserverApiError
from fixtures.ingest import Image, Workload, key, page_of
from fixtures.plugin import PageserverFactory
from fixtures.timeline import TimelineHandle
from fixtures.threads import Failures
from fixtures.utils import Lsn, wait_until

DURATION = 4.0  # seconds of concurrent traffic per test


def test_concurrent_ingest_reads_and_checkpoints(pageserver_factory: PageserverFactory):
    ps = pageserver_factory.start({"checkpoint_distance": "64KiB", "page_cache_size": "256KiB"})
    timelines = [TimelineHandle.create(ps) for _ in range(2)]
    failures = Failures()
    counts = {"reads": 0, "batches": 0, "checkpoints": 0}
    lock = threading.Lock()

    def writer(tl: TimelineHandle, seed: int) -> None:
        client = ps.http_client()
        work = Workload(seed, [key(i) for i in range(10)])
        while not failures.stop.is_set():
            tl.ingest(work.batch(), http=client)
            with lock:
                counts["batches"] += 1

    def reader(tl: TimelineHandle, seed: int) -> None:
        client = ps.http_client()
        rng = random.Random(seed)
        while not failures.stop.is_set():
            acked = tl.model.last_lsn
            if acked == 0:
                continue
            k = key(rng.randrange(10))
            lsn = rng.choice([acked, rng.randint(1, acked)])
            tl.check_read(k, lsn, http=client)
            with lock:
                counts["reads"] += 1

    def checkpointer() -> None:
        client = ps.http_client()
        rng = random.Random(99)
        while not failures.stop.is_set():
            tl = rng.choice(timelines)
            acked = tl.model.last_lsn
            info = client.checkpoint(tl.tenant_id, tl.timeline_id)
            # Everything acknowledged before the call is durable after it (ingest goes on
            # meanwhile, so more may be).
            assert Lsn.parse(info["disk_consistent_lsn"]) >= acked, (acked, info)
            with lock:
                counts["checkpoints"] += 1
            failures.stop.wait(0.2)

    threads = []
    for n, tl in enumerate(timelines):
        threads.append(failures.run(writer, tl, n))
        threads += [failures.run(reader, tl, 10 * n + r) for r in range(2)]
    threads.append(failures.run(checkpointer))
    failures.stop.wait(DURATION)
    failures.stop.set()
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "a client thread is stuck"
    failures.check()
    assert counts["batches"] > 20 and counts["reads"] > 100 and counts["checkpoints"] > 2, counts
    for tl in timelines:
        assert tl.info()["layers"]["delta"] >= 2
        # With the writers stopped, a checkpoint makes everything durable.
        info = tl.checkpoint()
        assert info["disk_consistent_lsn"] == info["last_record_lsn"] == str(Lsn(tl.model.last_lsn)), info
        tl.verify()
    ps.restart()
    for tl in timelines:
        tl.verify()


@pytest.mark.needs_testing
def test_reads_do_not_wait_for_a_batch_paused_in_a_file_write(pageserver_factory: PageserverFactory):
    """A batch stalls inside an ephemeral file write (the failpoint pauses it). Meanwhile the
    layer listing and GetPage answer at once, from the versions the batch has not touched, and
    none of the stalled batch's versions is visible; the batch completes once released."""
    ps = pageserver_factory.start()
    tl = TimelineHandle.create(ps)
    tl.ingest([Image(key(1), 0x10, page_of(1))])
    tl.checkpoint()
    ps.http.configure_failpoints(("ephemeral-write", "pause"))
    # A small first version is stored in the file's in-memory tail (no write); the full pages
    # after it fill the file's first run of eight blocks, whose write pauses.
    batch = [Image(key(2), 0x20, b"small")] + [Image(key(3 + i), 0x20, page_of(3 + i)) for i in range(9)]
    failures = Failures()
    done = threading.Event()

    def ingest() -> None:
        tl.ingest(batch, http=ps.http_client())
        done.set()

    t = failures.run(ingest)
    client = ps.http_client(timeout=10)

    def open_layer_has_a_value() -> bool:
        layers = client.layers(tl.tenant_id, tl.timeline_id)
        return any(layer["kind"] == "open" and layer["values"] >= 1 for layer in layers)

    wait_until(open_layer_has_a_value, what="the batch's first version stored in the open layer")
    for _ in range(20):
        assert tl.get(key(1), 0x10, http=client) == page_of(1)
        assert tl.get(key(2), 0x10, http=client) is None
    assert tl.get(key(1), "latest", http=client) == page_of(1)
    assert not done.is_set() and not failures.errors, "the batch went through a paused write"
    ps.http.configure_failpoints(("ephemeral-write", "off"))
    t.join(30)
    failures.check()
    assert done.is_set()
    tl.verify()


def test_read_waiting_for_lsn_is_woken_by_ingest(timeline: TimelineHandle):
    """A read at an LSN not yet ingested waits for it (wait_lsn_timeout is 60 s by default) and
    answers as soon as a batch brings it."""
    timeline.ingest([Image(key(1), 0x10, page_of(1))])
    result: dict = {}
    failures = Failures()
    client = timeline.ps.http_client()

    def read_ahead() -> None:
        started = time.monotonic()
        result["page"] = timeline.get(key(1), 0x30, http=client)
        result["waited"] = time.monotonic() - started

    t = failures.run(read_ahead)
    timeline.ingest([Image(key(1), 0x20, page_of(2))])
    # 0/30 is not there yet: the read cannot have answered.
    assert "page" not in result and not failures.errors
    timeline.ingest([Image(key(1), 0x30, page_of(3)), Image(key(2), 0x30, page_of(4))])
    t.join(30)
    failures.check()
    assert result["page"] == page_of(3)
    assert result["waited"] < 30


def test_delete_timeline_and_tenant_under_traffic(pageserver_factory: PageserverFactory):
    """Deleting a timeline, then its tenant, while clients ingest and read it and layers flush
    in the background: the clients get 404 or 503 (never a 500 or a hang), the directories are
    gone for good, and the other tenant is untouched."""
    ps = pageserver_factory.start({"checkpoint_distance": "32KiB", "checkpoint_timeout": "100ms"})
    victim = TimelineHandle.create(ps)
    sibling = TimelineHandle(ps, victim.tenant_id, ps.http.timeline_create(victim.tenant_id)["timeline_id"])
    bystander = TimelineHandle.create(ps)
    # A request that races with the deletion gets 503, which the server logs as an error.
    ps.allowed_errors.append(r"request failed: the timeline is shutting down status=503")
    failures = Failures()
    statuses: set[int] = set()

    def hammer(tl: TimelineHandle, seed: int) -> None:
        client = ps.http_client()
        work = Workload(seed, [key(i) for i in range(8)])
        while not failures.stop.is_set():
            try:
                tl.ingest(work.batch(), http=client)
                tl.get(key(0), "latest", http=client)
            except PageserverApiError as e:
                assert e.status_code in (404, 503), e
                statuses.add(e.status_code)
                return

    def bystander_traffic() -> None:
        client = ps.http_client()
        work = Workload(77, [key(i) for i in range(8)])
        while not failures.stop.is_set():
            bystander.ingest(work.batch(), http=client)

    threads = [failures.run(hammer, victim, 1), failures.run(hammer, sibling, 2), failures.run(bystander_traffic)]
    wait_until(lambda: victim.model.last_lsn > 0 and sibling.model.last_lsn > 0 and victim.reported_durable > 0, timeout=20, what="traffic flowing")
    ps.http.timeline_delete(victim.tenant_id, victim.timeline_id)
    assert not ps.timeline_dir(victim.tenant_id, victim.timeline_id).exists()
    wait_until(lambda: not threads[0].is_alive(), timeout=20, what="victim's client refused")
    ps.http.tenant_delete(victim.tenant_id)
    wait_until(lambda: not threads[1].is_alive(), timeout=20, what="sibling's client refused")
    failures.stop.set()
    for t in threads:
        t.join(30)
    failures.check()
    assert statuses <= {404, 503} and statuses
    assert not ps.tenant_dir(victim.tenant_id).exists()
    # Nothing comes back: not after the flush loop's next passes, not after a restart.
    bystander.checkpoint()
    ps.restart()
    assert [t["id"] for t in ps.http.tenant_list()] == [bystander.tenant_id]
    assert not ps.tenant_dir(victim.tenant_id).exists()
    bystander.verify()


@pytest.mark.needs_testing
def test_deleting_a_flushing_tenant_does_not_stall_others(pageserver_factory: PageserverFactory):
    ps = pageserver_factory.start()
    busy = TimelineHandle.create(ps)
    other = TimelineHandle.create(ps)
    busy.ingest([Image(key(1), 0x10, page_of(1))])
    other.ingest([Image(key(1), 0x10, page_of(2))])
    failures = Failures()
    ps.http.configure_failpoints(("layer-before-rename", "pause"))
    try:
        failures.run(ps.http_client().checkpoint, busy.tenant_id, busy.timeline_id)
        # The flush holds its lock from before it creates the temporary file until it is done.
        tl_dir = ps.timeline_dir(busy.tenant_id, busy.timeline_id)
        wait_until(lambda: any(p.name.endswith(".___temp") for p in tl_dir.iterdir()), what="flush in progress")
        failures.run(ps.http_client().tenant_delete, busy.tenant_id)
        # For a while, the other tenant answers promptly (one request at a time, so that a
        # stalled one cannot take the whole server with it).
        quick = ps.http_client(timeout=1.0)
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            assert quick.tenant_info(other.tenant_id)["state"] == "Active"
    finally:
        # The paused flush never ends by itself, and unpausing it needs a server that answers.
        ps.kill()
