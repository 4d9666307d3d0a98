"""The WAL a timeline receives reaches remote storage: whole segments as they fill and the
partial tail within `wal_upload_interval`, every byte the primary's own, listed in the remote
index with the receiver's settings. A pageserver whose disk is lost is replaced by another that
attaches the tenant: its receiver streams on by itself from where the archive ends, restores
read the WAL from the store, and what was restorable stays restorable. A detach uploads the
WAL to its last flushed byte first. Against both remote storage backends."""

from __future__ import annotations

import shutil

import requests

from fixtures.plugin import PageserverFactory
from fixtures.postgres import PgCluster, PgEnv
from fixtures.remote_storage import RemoteStore
from fixtures.timeline import TimelineHandle
from fixtures.utils import Lsn, wait_until
from fixtures.wal_stream import SEGMENT, connstr, primary_with_snapshot, receiver, start_promoted, wait_flushed

FIGURES = "SELECT (SELECT count(*) FROM pgbench_history), (SELECT sum(abalance) FROM pgbench_accounts), pg_current_wal_insert_lsn()"


def write_some(primary: PgCluster, transactions: int, switch: bool) -> tuple[str, Lsn]:
    """pgbench, then (with `switch`) the end of the current segment; the figures and the LSN
    they were read at."""
    primary.pgbench("-c", "2", "-t", str(transactions))
    count, total, lsn = primary.psql(FIGURES).split("|")
    if switch:
        primary.psql("SELECT pg_switch_wal()")
    return f"{count}|{total}", Lsn.parse(lsn)


def wait_archived(timeline: TimelineHandle, lsn: Lsn, timeout: float = 60) -> dict:
    def archived() -> dict:
        state = receiver(timeline).json()
        assert state["archived_lsn"] is not None and Lsn.parse(state["archived_lsn"]) >= lsn, state
        return state

    return wait_until(archived, timeout=timeout, interval=0.1, what=f"WAL archived to {lsn}")


def restored_figures(pg: PgEnv, timeline: TimelineHandle, name: str, lsn: Lsn) -> str:
    restored, _ = pg.restore(timeline.url, name, lsn)
    start_promoted(restored)
    got = restored.psql("SELECT (SELECT count(*) FROM pgbench_history), (SELECT sum(abalance) FROM pgbench_accounts)")
    restored.stop("immediate")
    return got


def check_archive_is_the_primarys_wal(store: RemoteStore, timeline: TimelineHandle, primary: PgCluster) -> dict:
    index = store.check_consistent(timeline.tenant_id, timeline.timeline_id)
    prefix = store.timeline_prefix(timeline.tenant_id, timeline.timeline_id)
    objects = store.wal_objects(index, prefix)
    assert index["wal"]["segment_size"] == SEGMENT
    assert len(index["wal"]["segments"]) >= 2, index["wal"]
    for key, (length, _) in objects.items():
        name = key[len(prefix) + len("wal/") :][:24]
        theirs = (primary.datadir / "pg_wal" / name).read_bytes()
        assert store.read(key)[:length] == theirs[:length], f"{key} is not the primary's {name}"
    return index


def test_wal_reaches_the_store_and_a_replacement_server_streams_on_from_it(
    pg: PgEnv, pageserver_factory: PageserverFactory, remote_store: RemoteStore
):
    first = pageserver_factory.start(remote=remote_store)
    timeline = TimelineHandle.create(first)
    primary = primary_with_snapshot(pg, timeline)
    settings = {"connstr": connstr(primary), "slot_name": "archive_slot"}
    r = requests.put(f"{timeline.url}/wal_receiver", json=settings, timeout=60)
    assert r.status_code == 200, r.text
    points = [write_some(primary, 60, switch=True) for _ in range(2)]
    points.append(write_some(primary, 60, switch=False))
    end = points[-1][1]
    wait_flushed(timeline, end)
    # The tail too, within the upload interval: nothing of it is waited for otherwise.
    state = wait_archived(timeline, end)
    assert Lsn.parse(state["archived_lsn"]) <= Lsn.parse(state["flushed_lsn"]), state
    index = check_archive_is_the_primarys_wal(remote_store, timeline, primary)
    assert index["wal"]["partial"] is not None and index["wal"]["partial"]["len"] > 0, index["wal"]
    assert index["wal"]["receiver"]["slot_name"] == "archive_slot", index["wal"]

    # The machine and its disk are gone; another attaches the tenant.
    first.kill()
    shutil.rmtree(first.workdir)
    second = pageserver_factory.start(remote=remote_store, name="second")
    second.http.tenant_attach(timeline.tenant_id, generation=2)
    moved = TimelineHandle(second, timeline.tenant_id, timeline.timeline_id, timeline.model)
    # Its receiver runs by itself, with the settings the index carried, from the archive's end.
    state = wait_until(lambda: receiver(moved).json(), timeout=30, what="the receiver after the attach")
    assert (state["slot_name"], state["application_name"]) == ("archive_slot", "archive_slot"), state
    wait_flushed(moved, end)
    # Everything restorable before is restorable here, the WAL read from the store.
    for i, (figures, lsn) in enumerate(points[:2]):
        assert restored_figures(pg, moved, f"moved{i}", lsn) == figures, f"restore at {lsn}"
    # And what the primary writes now streams in here.
    figures, lsn = write_some(primary, 40, switch=False)
    wait_flushed(moved, lsn)
    wait_archived(moved, lsn)
    assert restored_figures(pg, moved, "moved_new", lsn) == figures
    index = check_archive_is_the_primarys_wal(remote_store, moved, primary)
    assert index["generation"] == 2
    # Segments the first server archived stay its objects; nothing is uploaded twice.
    assert any(f["generation"] == 1 for f in index["wal"]["segments"].values()), index["wal"]


def test_a_detach_archives_every_flushed_byte_and_the_attach_streams_on(
    pg: PgEnv, pageserver_factory: PageserverFactory, remote_store: RemoteStore
):
    # A long upload interval: only the detach's drain can archive the tail in time.
    slow = {"wal_upload_interval": "1h"}
    first = pageserver_factory.start(slow, remote=remote_store)
    timeline = TimelineHandle.create(first)
    primary = primary_with_snapshot(pg, timeline)
    r = requests.put(f"{timeline.url}/wal_receiver", json={"connstr": connstr(primary)}, timeout=60)
    assert r.status_code == 200, r.text
    figures, lsn = write_some(primary, 80, switch=False)
    state = wait_flushed(timeline, lsn)
    flushed = Lsn.parse(state["flushed_lsn"])
    first.http.tenant_detach(timeline.tenant_id)
    index = remote_store.check_consistent(timeline.tenant_id, timeline.timeline_id)
    wal = index["wal"]
    archived = (int(wal["partial"]["name"][8:16], 16) << 32) + int(wal["partial"]["name"][16:], 16) * SEGMENT + wal["partial"]["len"]
    assert archived >= int(flushed), (wal, flushed)

    second = pageserver_factory.start(slow, remote=remote_store, name="second")
    second.http.tenant_attach(timeline.tenant_id, generation=2)
    moved = TimelineHandle(second, timeline.tenant_id, timeline.timeline_id, timeline.model)
    wait_flushed(moved, lsn)
    assert restored_figures(pg, moved, "after_detach", lsn) == figures
    # Removing the receiver there removes it from the index: a later attach does not bring it back.
    r = requests.delete(f"{moved.url}/wal_receiver", timeout=60)
    assert r.status_code == 200, r.text
    second.http.tenant_detach(timeline.tenant_id)
    index = remote_store.newest_index(timeline.tenant_id, timeline.timeline_id)
    assert index is not None and "receiver" not in (index.get("wal") or {}), index.get("wal")
    third = pageserver_factory.start(slow, remote=remote_store, name="third")
    third.http.tenant_attach(timeline.tenant_id, generation=3)
    again = TimelineHandle(third, timeline.tenant_id, timeline.timeline_id, timeline.model)
    assert receiver(again).status_code == 404
    # Its WAL is still served, from the store.
    name = wal["partial"]["name"]
    r = requests.get(f"{again.url}/wal/{name}", timeout=60)
    assert r.status_code == 200, r.text
    theirs = (primary.datadir / "pg_wal" / name).read_bytes()
    assert r.content[: wal["partial"]["len"]] == theirs[: wal["partial"]["len"]]


def segment_of(lsn: Lsn) -> int:
    return int(lsn) // SEGMENT


def segno(name: str) -> int:
    """The segment number of a WAL file name (`.partial` or not)."""
    return int(name[8:16], 16) * (0x100000000 // SEGMENT) + int(name[16:24], 16)


def test_gc_removes_the_wal_no_restore_needs_and_keeps_the_rest(
    pg: PgEnv, pageserver_factory: PageserverFactory, remote_store: RemoteStore
):
    """Three snapshots with WAL between them. With `pitr_interval` (7 days by default) GC keeps
    all of it; a lease keeps what a restore at its LSN needs; without either GC moves its cutoff
    to the newest snapshot, and the segments before the snapshot its cutoff restores from leave
    the local disk, the index and the store, while every LSN at or above the cutoff still
    restores."""
    ps = pageserver_factory.start({"gc_horizon": 0}, remote=remote_store)
    timeline = TimelineHandle.create(ps)
    primary = primary_with_snapshot(pg, timeline)
    r = requests.put(f"{timeline.url}/wal_receiver", json={"connstr": connstr(primary)}, timeout=60)
    assert r.status_code == 200, r.text
    snapshots = []
    for _ in range(2):
        for _ in range(2):
            write_some(primary, 30, switch=True)
        snapshots.append(Lsn.parse(pg.import_process(timeline.url, primary.basebackup_process())["lsn"]))
    figures, end = write_some(primary, 30, switch=False)
    wait_flushed(timeline, end)
    wait_archived(timeline, end)
    prefix = remote_store.timeline_prefix(timeline.tenant_id, timeline.timeline_id)
    before = remote_store.check_consistent(timeline.tenant_id, timeline.timeline_id)
    first_segment = min(segno(n) for n in before["wal"]["segments"])
    assert first_segment < segment_of(snapshots[0]), before["wal"]
    ps.http.checkpoint(timeline.tenant_id, timeline.timeline_id)
    ps.http.compact(timeline.tenant_id, timeline.timeline_id)

    def gc() -> Lsn:
        return Lsn.parse(ps.http.gc(timeline.tenant_id, timeline.timeline_id)["gc"]["cutoff"])

    def trimmed_to(floor: Lsn) -> dict:
        index = remote_store.check_consistent(timeline.tenant_id, timeline.timeline_id)
        partial = index["wal"].get("partial")
        segnos = [segno(n) for n in index["wal"]["segments"]] + ([segno(partial["name"])] if partial else [])
        assert min(segnos) == segment_of(floor), (segnos, floor)
        stored = set(remote_store.objects(prefix + "wal/"))
        assert stored == set(remote_store.wal_objects(index, prefix)), stored
        local = [p.name for p in (ps.timeline_dir(timeline.tenant_id, timeline.timeline_id) / "wal").iterdir()]
        assert min(segno(n) for n in local) == segment_of(floor), local
        return index

    # Everything is younger than pitr_interval: the cutoff stays where the WAL's commits begin.
    cutoff = gc()
    assert cutoff < snapshots[0], (cutoff, snapshots)
    # (Read while the upload queue goes on: a layer GC removed may vanish between the listing
    # and the read, so each check is tried again.)
    wait_until(lambda: trimmed_to(Lsn(first_segment * SEGMENT)), timeout=60, what="all of the WAL kept")

    # Retention by time off; a lease at the first snapshot keeps what a restore there needs.
    ps.restart(overrides={"pitr_interval": "0s"})
    r = requests.post(f"{timeline.url}/lsn_lease", json={"lsn": str(snapshots[0])}, timeout=60)
    assert r.status_code == 200 and r.json()["lsn"] == str(snapshots[0]), r.text
    assert gc() == snapshots[0]
    wait_until(lambda: trimmed_to(snapshots[0]), timeout=60, what=f"the WAL below the leased snapshot at {snapshots[0]} removed")
    r = requests.post(f"{timeline.url}/lsn_lease", json={"lsn": str(first_segment * SEGMENT)}, timeout=60)
    assert r.status_code == 410, r.text

    # Leases end with the server: the cutoff moves on.
    ps.restart(overrides={"pitr_interval": "0s"})
    cutoff = gc()
    assert cutoff > snapshots[0], (cutoff, snapshots)
    floor = max(s for s in snapshots if s <= cutoff)
    wait_until(lambda: trimmed_to(floor), timeout=60, what=f"the WAL below the snapshot at {floor} removed")
    # Restorable as before: the end, replayed from the snapshot GC kept.
    assert restored_figures(pg, timeline, "after_gc", end) == figures
