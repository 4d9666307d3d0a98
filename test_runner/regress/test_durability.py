"""Durability across restarts and crashes (SPEC §4.6).

After a graceful stop everything ingested reads back. After a crash (`kill -9`, or a failpoint
that exits the process in the middle of a flush) the timeline restarts at its
disk_consistent_lsn: nothing at or below the highest one ever reported is lost, no temporary or
ephemeral file survives startup, no layer beyond it is kept, and the client re-sends the rest."""

from __future__ import annotations

import random
import signal
import threading

import pytest
import requests

from fixtures.http import PageserverApiError
from fixtures.ingest import Image, Workload, key, page_of
from fixtures.pageserver import Pageserver
from fixtures.plugin import NO_BACKGROUND_COMPACTION, PageserverFactory
from fixtures.timeline import TimelineHandle
from fixtures.utils import Lsn

# What a client sees when the server dies under its request.
CONNECTION_LOST = (requests.exceptions.ConnectionError, requests.exceptions.ChunkedEncodingError)


def ingest_some(timeline: TimelineHandle, work: Workload, batches: int) -> None:
    for _ in range(batches):
        timeline.ingest(work.batch())


def assert_clean_startup(ps: Pageserver) -> None:
    leftovers = ps.leftovers()
    assert not leftovers, f"left behind after startup: {leftovers}"


def delta_files(timeline: TimelineHandle) -> list[str]:
    """The finished layer files (not ones being written)."""
    return [n for n in timeline.dir_files() if n != "metadata" and not n.startswith("ephemeral-") and not n.endswith(".___temp")]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_graceful_shutdown_flushes_everything(pageserver_factory: PageserverFactory, sig: int):
    ps = pageserver_factory.start()
    timeline = TimelineHandle.create(ps)
    work = Workload(7, [key(i) for i in range(8)])
    ingest_some(timeline, work, 20)
    last, durable = timeline.lsns()
    assert durable == 0 and last == work.lsn
    ps.signal(sig)
    assert ps.wait_for_exit() == 0
    assert "shut down cleanly" in ps.log_since_start()
    ps.start()
    assert timeline.lsns() == (last, last)
    assert_clean_startup(ps)
    timeline.verify()
    # Ingest continues where it stopped.
    ingest_some(timeline, work, 3)
    timeline.verify()


def test_checkpoint_then_restart(pageserver_factory: PageserverFactory):
    ps = pageserver_factory.start({"checkpoint_distance": "64KiB", **NO_BACKGROUND_COMPACTION})
    timelines = [TimelineHandle.create(ps) for _ in range(2)]
    # A second timeline of the first tenant, too.
    tl_id = ps.http.timeline_create(timelines[0].tenant_id)["timeline_id"]
    timelines.append(TimelineHandle(ps, timelines[0].tenant_id, tl_id))
    for n, timeline in enumerate(timelines):
        work = Workload(n, [key(i) for i in range(10)])
        ingest_some(timeline, work, 15)
        timeline.checkpoint()
        ingest_some(timeline, work, 5)
    files_before = {t.timeline_id: delta_files(t) for t in timelines}
    ps.restart()
    assert_clean_startup(ps)
    for timeline in timelines:
        last, durable = timeline.lsns()
        assert last == durable == timeline.model.last_lsn
        timeline.verify()
        # The layer files written before the stop are all still there, plus the shutdown flush.
        assert set(files_before[timeline.timeline_id]) <= set(delta_files(timeline))
    assert len(ps.http.tenant_list()) == 2
    assert ps.log_contains(r"load_tenants done .* 2 tenants \(0 broken\), 3 timelines")


def test_kill9_loses_nothing_durable(pageserver_factory: PageserverFactory):
    """Crash with some versions flushed and some only in memory: the flushed ones survive,
    the rest is re-sent from disk_consistent_lsn."""
    ps = pageserver_factory.start()
    timeline = TimelineHandle.create(ps)
    work = Workload(11, [key(i) for i in range(8)])
    ingest_some(timeline, work, 10)
    durable = Lsn.parse(timeline.checkpoint()["disk_consistent_lsn"])
    ingest_some(timeline, work, 10)
    assert timeline.lsns() == (work.lsn, durable)
    # Ephemeral files exist while the server runs...
    assert any(n.startswith("ephemeral-") for n in timeline.dir_files())
    ps.kill()
    ps.start()
    # ... and not after a restart.
    assert_clean_startup(ps)
    assert timeline.lsns() == (durable, durable)
    # Reads above the durable LSN wait for the re-sent versions; a re-sent batch that starts at
    # or below it is refused as a whole.
    lost = [b for b in timeline.model.batches if b[-1].lsn > durable]
    with pytest.raises(PageserverApiError) as e:
        ps.http.ingest(timeline.tenant_id, timeline.timeline_id, [Image(key(0), durable, page_of(0))])
    assert e.value.status_code == 409
    assert timeline.recover() == durable
    assert len(lost) == 10
    timeline.verify()
    timeline.checkpoint()
    ps.restart()
    timeline.verify()


def test_kill9_during_ingest(pageserver_factory: PageserverFactory):
    """A writer streams batches while flushes happen in the background (small layers); the
    process is killed mid-stream. The batch in flight is wholly durable or wholly lost."""
    ps = pageserver_factory.start({"checkpoint_distance": "48KiB"})
    timeline = TimelineHandle.create(ps)
    work = Workload(5, [key(i) for i in range(16)])
    in_flight: list = []
    writer_error: list = []
    stop = threading.Event()
    sent = threading.Event()

    def writer() -> None:
        client = ps.http_client()
        try:
            while not stop.is_set():
                batch = work.batch()
                in_flight[:] = [batch]
                try:
                    timeline.ingest(batch, http=client)
                except CONNECTION_LOST:
                    return
                in_flight.clear()
                if timeline.reported_durable > 0 and len(timeline.model.batches) > 40:
                    sent.set()
        except Exception as e:  # noqa: BLE001 - surfaced by the main thread
            writer_error.append(e)
        finally:
            sent.set()
            client.close()

    thread = threading.Thread(target=writer)
    thread.start()
    assert sent.wait(60)
    ps.kill()
    stop.set()
    thread.join(30)
    assert not writer_error, writer_error
    reported = timeline.reported_durable
    assert reported > 0
    ps.start()
    assert_clean_startup(ps)
    # recover() checks the durable LSN against the highest reported, then re-sends the rest.
    assert timeline.recover(in_flight=in_flight) >= reported
    timeline.verify()


FLUSH_CRASH_POINTS = ["layer-before-rename", "layer-after-rename", "flush-before-metadata"]
# Inside the manifest's atomic replacement. Creating a timeline stores a manifest too, so this
# one is armed only once the timeline exists.
MANIFEST_CRASH_POINTS = ["metadata-before-rename", "metadata-after-rename"]


@pytest.mark.needs_testing
@pytest.mark.parametrize("failpoint", FLUSH_CRASH_POINTS + MANIFEST_CRASH_POINTS)
def test_crash_during_checkpoint(pageserver_factory: PageserverFactory, failpoint: str):
    """The process dies at a point of a flush (armed over HTTP; the checkpoint call never
    answers). The layer being written is not kept, whatever state it reached on disk."""
    ps = pageserver_factory.start()
    timeline = TimelineHandle.create(ps)
    work = Workload(3, [key(i) for i in range(8)])
    ingest_some(timeline, work, 8)
    durable = Lsn.parse(timeline.checkpoint()["disk_consistent_lsn"])
    layers_before = delta_files(timeline)
    ingest_some(timeline, work, 8)
    ps.http.configure_failpoints((failpoint, "exit"))
    with pytest.raises(CONNECTION_LOST):
        ps.http.checkpoint(timeline.tenant_id, timeline.timeline_id)
    assert ps.wait_for_exit() == 1
    assert f"failpoint {failpoint}: exiting the process" in ps.log_since_start()
    on_disk = timeline.dir_files()
    if failpoint == "layer-before-rename":
        assert any(n.endswith(".___temp") for n in on_disk), on_disk
    else:
        assert len(delta_files(timeline)) == len(layers_before) + 1, on_disk
    if failpoint == "metadata-before-rename":
        assert "metadata.___temp" in on_disk, on_disk

    ps.start()
    assert_clean_startup(ps)
    if failpoint == "metadata-after-rename":
        # The process died, not the machine: the rename had reached the kernel, so the flush
        # committed (only a power loss before the directory fsync could still undo it).
        last, now_durable = timeline.lsns()
        assert now_durable == last > durable
        assert len(delta_files(timeline)) == len(layers_before) + 1
    else:
        assert timeline.lsns() == (durable, durable)
        assert delta_files(timeline) == layers_before
    timeline.recover()
    timeline.verify()
    timeline.checkpoint()
    ps.restart()
    timeline.verify()


@pytest.mark.needs_testing
@pytest.mark.parametrize("failpoint", FLUSH_CRASH_POINTS)
def test_crash_during_background_flush(pageserver_factory: PageserverFactory, failpoint: str):
    """The same crash, armed from the start with FAILPOINTS, hit by the background flush that a
    small checkpoint_distance triggers while the client ingests."""
    ps = pageserver_factory.create({"checkpoint_distance": "64KiB"})
    ps.start(env={"FAILPOINTS": f"{failpoint}=exit"})
    assert ps.log_contains(f"started with failpoints: {failpoint}=exit")
    timeline = TimelineHandle.create(ps)
    work = Workload(9, [key(i) for i in range(8)])
    in_flight: list = []
    for _ in range(200):
        batch = work.batch()
        try:
            timeline.ingest(batch)
        except CONNECTION_LOST:
            in_flight = [batch]
            break
        if not ps.running:
            break
    assert ps.wait_for_exit() == 1
    ps.start()
    assert_clean_startup(ps)
    assert timeline.lsns()[1] == 0, "no flush ever completed"
    assert delta_files(timeline) == []
    timeline.recover(in_flight=in_flight)
    timeline.verify()


@pytest.mark.needs_testing
def test_repeated_crashes(pageserver_factory: PageserverFactory):
    """Rounds of ingest with background flushes, each ended by `kill -9` at a random moment
    or by a crash inside a flush; after each restart the history is whole up to
    disk_consistent_lsn and the client re-sends the rest."""
    ps = pageserver_factory.start({"checkpoint_distance": "32KiB", "checkpoint_timeout": "300ms"})
    timeline = TimelineHandle.create(ps)
    rng = random.Random(42)
    work = Workload(42, [key(i) for i in range(12)])
    for round_no in range(6):
        crash_point = FLUSH_CRASH_POINTS[round_no % 3] if round_no % 2 else None
        if crash_point:
            try:
                ps.http.configure_failpoints((crash_point, "exit"))
            except CONNECTION_LOST:
                # A background flush (checkpoint_timeout is 300 ms) reached the failpoint
                # before the answer was written: the crash this round is for.
                pass
        in_flight: list = []
        for _ in range(rng.randint(5, 40)):
            batch = work.batch()
            try:
                timeline.ingest(batch)
            except CONNECTION_LOST:
                in_flight = [batch]
                break
        if crash_point and ps.running:
            # Still alive: the next flush is the one that dies.
            try:
                ps.http.checkpoint(timeline.tenant_id, timeline.timeline_id)
            except CONNECTION_LOST:
                pass
        if ps.running and not crash_point:
            ps.kill()
        else:
            assert ps.wait_for_exit() == 1
        ps.start()
        assert_clean_startup(ps)
        timeline.recover(in_flight=in_flight)
    timeline.verify()
    assert timeline.reported_durable > 0


def test_delete_then_crash_leaves_nothing(pageserver_factory: PageserverFactory):
    """Deleted tenants and timelines stay deleted after a crash, and their ids are free."""
    ps = pageserver_factory.start()
    keep = TimelineHandle.create(ps)
    gone = TimelineHandle.create(ps)
    keep.ingest([Image(key(1), 0x10, page_of(1))])
    gone.ingest([Image(key(1), 0x10, page_of(2))])
    keep.checkpoint()
    gone.checkpoint()
    other_tl = ps.http.timeline_create(keep.tenant_id)["timeline_id"]
    ps.http.checkpoint(keep.tenant_id, other_tl)
    ps.http.timeline_delete(keep.tenant_id, other_tl)
    ps.http.tenant_delete(gone.tenant_id)
    ps.kill()
    ps.start()
    assert [t["id"] for t in ps.http.tenant_list()] == [keep.tenant_id]
    assert [t["timeline_id"] for t in ps.http.timeline_list(keep.tenant_id)] == [keep.timeline_id]
    assert not ps.tenant_dir(gone.tenant_id).exists()
    assert not ps.timeline_dir(keep.tenant_id, other_tl).exists()
    keep.verify()
    assert ps.http.tenant_create(gone.tenant_id)["id"] == gone.tenant_id


def test_leftover_directories_removed_at_startup(pageserver_factory: PageserverFactory):
    """What an interrupted create or delete leaves (`<id>.___temp`, `<id>.___deleted`) is
    removed at startup; anything else unexpected is left alone, with a warning."""
    ps = pageserver_factory.start()
    timeline = TimelineHandle.create(ps)
    timeline.ingest([Image(key(1), 0x10, page_of(1))])
    ps.stop()
    tenants = ps.tenants_dir
    half_created = tenants / ("ab" * 16 + ".___temp")
    half_deleted = tenants / ("cd" * 16 + ".___deleted")
    half_timeline = ps.tenant_dir(timeline.tenant_id) / "timelines" / ("ef" * 16 + ".___temp")
    for d in (half_created / "timelines", half_deleted / "timelines", half_timeline):
        d.mkdir(parents=True)
    (half_timeline / "metadata").write_bytes(b"partial")
    (tenants / "README").write_text("not a tenant")
    ps.allowed_errors.append(r"WARN .*ignoring an entry that is not an id.*README")
    ps.start()
    assert not half_created.exists() and not half_deleted.exists() and not half_timeline.exists()
    assert (tenants / "README").exists()
    assert [t["id"] for t in ps.http.tenant_list()] == [timeline.tenant_id]
    timeline.verify()


def test_created_tenants_and_timelines_survive_a_crash(pageserver_factory: PageserverFactory):
    ps = pageserver_factory.start()
    tenant = ps.http.tenant_create()["id"]
    timelines = sorted(ps.http.timeline_create(tenant)["timeline_id"] for _ in range(3))
    empty_tenant = ps.http.tenant_create()["id"]
    ps.kill()
    ps.start()
    assert sorted(t["id"] for t in ps.http.tenant_list()) == sorted([tenant, empty_tenant])
    assert sorted(t["timeline_id"] for t in ps.http.timeline_list(tenant)) == timelines
    assert ps.http.timeline_info(tenant, timelines[0])["disk_consistent_lsn"] == "0/0"
