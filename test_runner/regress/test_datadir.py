"""Real PostgreSQL in and out: a cluster imported into a timeline (a stopped cluster's
directory, or a pg_basebackup of a running one under load), basebackups at any LSN that a second
PostgreSQL starts from and answers exactly as the original did at that snapshot, imports that
store only what changed, refusals that store nothing, hostile archives refused within the
import's memory budget (measured from the server's RSS), and a crash during an import."""

from __future__ import annotations

import io
import json
import os
import select
import struct
import subprocess
import tarfile
import threading
from collections.abc import Iterator

import pytest
import requests

from fixtures.pageserver import Pageserver
from fixtures.plugin import PageserverFactory
from fixtures.postgres import PgCluster, PgEnv
from fixtures.raw_http import connect, read_response
from fixtures.timeline import TimelineHandle
from fixtures.utils import Lsn, wait_until

MiB = 1 << 20
# The most an import may grow the server's memory by, while it runs and after it
# (docs/http-api.md, "Memory").
IMPORT_MEMORY_BUDGET = 256 * MiB


def import_stopped(pg: PgEnv, timeline: TimelineHandle, cluster: PgCluster) -> dict:
    return pg.import_process(timeline.url, cluster.tar_process())


def restored_state(pg: PgEnv, timeline: TimelineHandle, name: str, lsn: Lsn | None = None) -> tuple[dict, Lsn]:
    """The state a cluster restored from the basebackup at `lsn` answers with."""
    cluster, snapshot = pg.restore(timeline.url, name, lsn)
    cluster.start()
    try:
        return cluster.state(), snapshot
    finally:
        cluster.stop()


def scan_all(timeline: TimelineHandle, lsn: Lsn) -> dict[str, str]:
    """Every key of the timeline with its page (base64) as of `lsn`, by paged scans."""
    pages: dict[str, str] = {}
    token = None
    while True:
        page = timeline.http.scan_keys(
            timeline.tenant_id, timeline.timeline_id, bytes(18), b"\xff" * 18, lsn, limit=1000, page_token=token
        )
        pages.update((e["key"], e["page"]) for e in page["entries"])
        token = page["next_page_token"]
        if token is None:
            return pages


def test_pgbench_database_round_trip(pg: PgEnv, timeline: TimelineHandle):
    original = pg.new_cluster("original").start()
    original.pgbench("-i", "-s", "5", "-q")
    expected = original.state()
    assert expected["pgbench_accounts"][0] == 500_000
    db = int(original.psql("SELECT oid FROM pg_database WHERE datname = 'postgres'"))
    node = original.relfilenode("pgbench_accounts")
    # Segments switched and checkpointed past: PostgreSQL recycles them ahead, under names
    # past the end of its WAL.
    for _ in range(3):
        original.psql("SELECT pg_switch_wal()")
        original.psql("CHECKPOINT")
    original.stop()

    # A recycled segment's first page header gives another segment's address (or none).
    def recycled_segments(datadir) -> list[str]:
        names = []
        for name in sorted(n for n in os.listdir(datadir / "pg_wal") if len(n) == 24):
            with open(datadir / "pg_wal" / name, "rb") as f:
                (page_addr,) = struct.unpack_from("<Q", f.read(16), 8)
            if page_addr != (int(name[8:16], 16) << 32) + (int(name[16:24], 16) << 24):
                names.append(name)
        return names

    recycled = recycled_segments(original.datadir)
    assert recycled, "PostgreSQL recycled no segment ahead"
    report = import_stopped(pg, timeline, original)
    assert report["kind"] == "stopped"
    assert report["blocks_new"] > 8000 and report["blocks_changed"] == 0
    assert report["wal_segments_recycled"] == len(recycled), (report, recycled)
    lsn = Lsn.parse(report["lsn"])
    info = timeline.info()
    assert Lsn.parse(info["last_record_lsn"]) == lsn
    assert Lsn.parse(info["disk_consistent_lsn"]) == lsn, "durable when the answer comes"

    state, snapshot = restored_state(pg, timeline, "restored")
    assert snapshot == lsn
    assert state == expected
    # The archive's pg_wal/ holds the checkpoint's segment, and none of those recycled past it
    # (the cluster above started without them).
    def segments(datadir) -> list[str]:
        return sorted(n for n in os.listdir(datadir / "pg_wal") if len(n) == 24)

    checkpoint_segment = "%08X%08X%08X" % (1, int(lsn) >> 32, (int(lsn) & 0xFFFFFFFF) >> 24)
    unpacked, _ = pg.restore(timeline.url, "unpacked", lsn)
    assert segments(unpacked.datadir) == [checkpoint_segment], segments(unpacked.datadir)

    # The blocks are what GetPage@LSN serves: a block of pgbench_accounts, by its key
    # (kind 0, spcnode 1663, dbnode, relnode, fork 0, block).
    block = 100
    key = struct.pack(">BIIIBI", 0, 1663, db, node, 0, block)
    with open(original.datadir / "base" / str(db) / str(node), "rb") as f:
        f.seek(block * 8192)
        on_disk = f.read(8192)
    assert timeline.http.get_page(timeline.tenant_id, timeline.timeline_id, key, str(lsn)) == on_disk


def test_time_travel_across_snapshots(pg: PgEnv, timeline: TimelineHandle):
    cluster = pg.new_cluster("source").start()
    cluster.pgbench("-i", "-s", "1", "-q")
    cluster.psql("CREATE TABLE doomed AS SELECT g AS id FROM generate_series(1, 1000) g")
    states = []
    lsns = []

    def snapshot() -> None:
        states.append(cluster.state())
        cluster.stop()
        lsns.append(Lsn.parse(import_stopped(pg, timeline, cluster)["lsn"]))
        cluster.start()

    snapshot()
    cluster.pgbench("-t", "300", "-c", "2", "-n")
    old_node = cluster.relfilenode("pgbench_branches")
    cluster.psql("DROP TABLE doomed")
    cluster.psql("VACUUM FULL pgbench_branches")
    assert cluster.relfilenode("pgbench_branches") != old_node
    cluster.psql("TRUNCATE pgbench_history")
    snapshot()
    cluster.pgbench("-t", "300", "-c", "2", "-n")
    snapshot()
    cluster.stop()
    assert lsns == sorted(lsns) and len(set(lsns)) == 3
    assert "doomed" in states[0] and "doomed" not in states[1]

    for i, (lsn, state) in enumerate(zip(lsns, states)):
        restored, at = restored_state(pg, timeline, f"at{i}", lsn)
        assert at == lsn
        assert restored == state, f"snapshot {i} at {lsn}"
    # Between two snapshots: the older one.
    restored, at = restored_state(pg, timeline, "between", Lsn(lsns[1] - 1))
    assert at == lsns[0]
    assert restored == states[0]
    # Before the first: nothing to give.
    r = requests.get(f"{timeline.url}/basebackup", params={"lsn": str(Lsn(lsns[0] - 1))})
    assert r.status_code == 404, r.text
    assert "no snapshot" in r.json()["msg"]
    # Beyond the last record: not known yet (a later import may land below it).
    r = requests.get(f"{timeline.url}/basebackup", params={"lsn": str(Lsn(lsns[-1] + 1))})
    assert r.status_code == 404, r.text
    assert "beyond" in r.json()["msg"]


def test_incremental_snapshot_stores_what_changed(pg: PgEnv, timeline: TimelineHandle):
    cluster = pg.new_cluster("source").start()
    cluster.pgbench("-i", "-s", "2", "-q")
    cluster.stop()
    first = import_stopped(pg, timeline, cluster)
    cluster.start()
    cluster.pgbench("-t", "200", "-n")
    cluster.stop()
    second = import_stopped(pg, timeline, cluster)
    assert second["blocks_unchanged"] > 10 * (second["blocks_changed"] + second["blocks_new"]), second
    assert second["bytes_stored"] < first["bytes_stored"] / 3, (first, second)
    # The same directory again is refused: its LSN is not above the last snapshot's.
    r = pg.import_stream(timeline.url, cluster.tar_process().stdout)
    assert r.status_code == 409, r.text


def test_pg_basebackup_under_load_restores_and_passes_amcheck(pg: PgEnv, timeline: TimelineHandle):
    cluster = pg.new_cluster("source").start()
    cluster.pgbench("-i", "-s", "2", "-q")
    load = cluster.pgbench_background("-T", "600", "-c", "2", "-n")
    try:
        # Under way: the history table grows.
        wait_until(lambda: int(cluster.psql("SELECT count(*) FROM pgbench_history")) > 100 or None, timeout=60, what="pgbench running")
        report = pg.import_process(timeline.url, cluster.basebackup_process())
    finally:
        load.terminate()
        load.wait(timeout=60)
    cluster.stop()
    assert report["kind"] == "backup"

    restored, at = pg.restore(timeline.url, "restored")
    assert at == Lsn.parse(report["lsn"])
    restored.start()
    try:
        assert restored.check_indexes() > 5
        # pgbench's invariant: every transaction adds the same delta to one account, teller and
        # branch and logs it in the history; a consistent state has equal sums.
        sums = restored.psql(
            "SELECT (SELECT sum(abalance) FROM pgbench_accounts), (SELECT sum(bbalance) FROM pgbench_branches), "
            "(SELECT sum(tbalance) FROM pgbench_tellers), (SELECT coalesce(sum(delta), 0) FROM pgbench_history)"
        ).split("|")
        assert len(set(sums)) == 1, sums
        assert int(restored.psql("SELECT count(*) FROM pgbench_history")) > 100
    finally:
        restored.stop()


def tar_bytes(members: dict[str, bytes | None], symlinks: dict[str, str] | None = None, modes: dict[str, int] | None = None) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                info.mode = (modes or {}).get(name, 0o700)
                tar.addfile(info)
            else:
                info.size = len(data)
                info.mode = (modes or {}).get(name, 0o600)
                tar.addfile(info, io.BytesIO(data))
        for name, target in (symlinks or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    return out.getvalue()


def directory_tar(cluster: PgCluster) -> bytes:
    proc = cluster.tar_process()
    data, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0
    return data


def with_setgid_directories(archive: bytes) -> bytes:
    """The archive with the setgid bit on every directory, as a cluster created under a setgid
    directory has it."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(archive)) as src, tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as dst:
        for info in src:
            if info.isdir():
                info.mode |= 0o2000
            dst.addfile(info, src.extractfile(info) if info.isfile() else None)
    return out.getvalue()


def test_refused_imports_store_nothing(pg: PgEnv, pageserver: Pageserver, timeline: TimelineHandle):
    cluster = pg.new_cluster("source").start()
    cluster.pgbench("-i", "-s", "1", "-q")
    cluster.stop()
    good = directory_tar(cluster)
    first = requests.put(f"{timeline.url}/import", data=good)
    assert first.status_code == 200, first.text
    before = timeline.info()["last_record_lsn"]

    def refused(body: bytes, status: int, text: str, **params: str) -> None:
        r = requests.put(f"{timeline.url}/import", data=body, params=params or None)
        assert r.status_code == status, r.text
        assert text in r.json()["msg"], r.json()
        assert timeline.info()["last_record_lsn"] == before

    # The same directory again: its LSN is not above the timeline's.
    refused(good, 409, "not above")
    # A running cluster's directory.
    cluster.start()
    running = directory_tar(cluster)
    refused(running, 400, "postmaster.pid")
    cluster.pgbench("-t", "50", "-n")
    # Killed, not stopped: pg_control says so.
    cluster.stop("immediate")
    refused(directory_tar(cluster), 400, "not stopped cleanly")
    # Another cluster.
    other = pg.new_cluster("other")
    refused(directory_tar(other), 409, "another cluster")
    # A tablespace: pg_tblspc holds a link to a directory elsewhere.
    refused(tar_bytes({"./PG_VERSION": b"15\n", "./pg_tblspc": None}, {"./pg_tblspc/16500": "/srv/space"}), 400, "tablespaces")
    # Cut short, at a member boundary and inside one; not tar at all; empty.
    refused(good[: 512 * 3], 400, "")
    refused(good[: len(good) // 2], 400, "")
    refused(b"this is not a tar archive" * 100, 400, "tar")
    refused(b"", 400, "empty")
    refused(tar_bytes({"./PG_VERSION": b"15\n"}), 400, "pg_control")
    # Setuid, setgid or sticky: PostgreSQL writes none, and a basebackup restored as root would
    # give them back.
    refused(tar_bytes({"./PG_VERSION": b"15\n"}, modes={"./PG_VERSION": 0o4755}), 400, 'archive member "PG_VERSION" has the setuid bit (mode 04755)')
    refused(tar_bytes({"./pg_stat": None}, modes={"./pg_stat": 0o1777}), 400, 'archive member "pg_stat" has the sticky bit (mode 01777)')
    pageserver.assert_no_errors()

    # The timeline still gives the first snapshot, and still takes a good import.
    _, at = restored_state(pg, timeline, "restored")
    assert at == Lsn.parse(before)
    cluster.start()
    cluster.stop()
    # Every directory setgid (inherited from where the cluster was made): taken, and given back
    # without the bit.
    r = requests.put(f"{timeline.url}/import", data=with_setgid_directories(directory_tar(cluster)))
    assert r.status_code == 200, r.text
    backup = requests.get(f"{timeline.url}/basebackup")
    assert backup.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(backup.content)) as tar:
        modes = {info.name: info.mode for info in tar if info.isdir()}
    assert len(modes) > 5 and set(modes.values()) == {0o700}, modes


def a_snapshot_then_more_work(pg: PgEnv, timeline: TimelineHandle) -> tuple[Lsn, dict, bytes]:
    """A pgbench cluster imported, then more work on it: the first snapshot's LSN and state,
    and the later directory's archive."""
    cluster = pg.new_cluster("source").start()
    cluster.pgbench("-i", "-s", "1", "-q")
    first_state = cluster.state()
    cluster.stop()
    first = Lsn.parse(import_stopped(pg, timeline, cluster)["lsn"])
    cluster.start()
    cluster.pgbench("-t", "100", "-n")
    cluster.stop()
    return first, first_state, directory_tar(cluster)


def assert_back_at_the_first_snapshot(
    pg: PgEnv, pageserver: Pageserver, timeline: TimelineHandle, first: Lsn, first_state: dict, body: bytes
) -> None:
    """After an import that did not happen: the timeline ends at the first snapshot, which
    restores as it was, nothing is left behind, and the import then goes through."""
    assert Lsn.parse(timeline.info()["last_record_lsn"]) == first
    state, at = restored_state(pg, timeline, "restored")
    assert at == first and state == first_state
    assert pageserver.leftovers() == []
    r = requests.put(f"{timeline.url}/import", data=body)
    assert r.status_code == 200, r.text


def test_crash_during_import_leaves_the_previous_snapshot(pg: PgEnv, pageserver: Pageserver, timeline: TimelineHandle):
    first, first_state, body = a_snapshot_then_more_work(pg, timeline)

    def metric() -> float:
        for line in pageserver.http.metrics_text().splitlines():
            if line.startswith("pageserver_datadir_import_bytes_total "):
                return float(line.split()[1])
        raise AssertionError("no import bytes metric")

    read_before = metric()
    half = len(body) // 2

    def sender():
        yield body[:half]
        # Hold the rest back until the server has been killed.
        killed.wait(timeout=120)
        yield body[half:]

    killed = threading.Event()
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["response"] = requests.put(f"{timeline.url}/import", data=sender(), timeout=120)
        except requests.RequestException as e:
            outcome["error"] = e

    client = threading.Thread(target=run)
    client.start()
    wait_until(lambda: metric() >= read_before + half or None, timeout=60, what="half the archive read")
    pageserver.kill()
    killed.set()
    client.join(timeout=120)
    assert "error" in outcome, outcome
    pageserver.start()

    assert_back_at_the_first_snapshot(pg, pageserver, timeline, first, first_state, body)


@pytest.mark.needs_testing
def test_crash_before_an_imports_manifest_leaves_the_previous_snapshot(
    pg: PgEnv, pageserver: Pageserver, timeline: TimelineHandle
):
    """The process dies once an import's layer files (runs of its large members written straight
    to disk, and the rest) are durable under their final names, before the manifest that lists
    them: the restart removes every one, and the timeline is at its previous snapshot."""
    first, first_state, body = a_snapshot_then_more_work(pg, timeline)
    files_before = timeline.dir_files()

    pageserver.http.configure_failpoints(("import-before-manifest", "exit"))
    with pytest.raises(requests.RequestException):
        requests.put(f"{timeline.url}/import", data=body, timeout=120)
    assert pageserver.wait_for_exit() == 1
    # The new WAL segments went to a run file, the rest (changed blocks too) to one more.
    new_layers = [f for f in timeline.dir_files() if f not in files_before and "__" in f]
    assert len(new_layers) >= 2, timeline.dir_files()
    pageserver.start()

    assert timeline.dir_files() == files_before
    assert_back_at_the_first_snapshot(pg, pageserver, timeline, first, first_state, body)


@pytest.mark.needs_testing
def test_a_failed_manifest_store_keeps_the_import_for_the_restart_to_judge(
    pg: PgEnv, pageserver: Pageserver, timeline: TimelineHandle
):
    """Storing the import's manifest fails after its rename (the directory's fsync): the manifest
    on disk lists the import's files, so they are kept, the timeline takes no more writes, and
    the restart finds the import whole."""
    cluster = pg.new_cluster("source").start()
    cluster.pgbench("-i", "-s", "1", "-q")
    state = cluster.state()
    cluster.stop()
    body = directory_tar(cluster)
    pageserver.allowed_errors.append("failpoint metadata-after-rename")
    pageserver.http.configure_failpoints(("metadata-after-rename", "return"))
    r = requests.put(f"{timeline.url}/import", data=body, timeout=120)
    pageserver.http.configure_failpoints(("metadata-after-rename", "off"))
    assert r.status_code == 500, r.text
    assert "metadata-after-rename" in r.text
    refused = requests.put(f"{timeline.url}/import", data=body, timeout=120)
    assert refused.status_code != 200 and "reload the timeline" in refused.text, refused.text
    # The broken timeline's shutdown flush fails: the exit code says so.
    pageserver.stop(expect_code=None)
    pageserver.start()

    lsn = Lsn.parse(timeline.info()["last_record_lsn"])
    restored, at = restored_state(pg, timeline, "restored")
    assert at == lsn and restored == state
    assert pageserver.leftovers() == []


@pytest.mark.needs_testing
def test_a_layer_commit_failing_after_its_rename_leaves_no_file_of_the_import(
    pg: PgEnv, pageserver: Pageserver, timeline: TimelineHandle
):
    """A run's file gets its final name and then its directory's fsync fails: the import fails,
    and no file of it is left, under any name; the next import goes through."""
    cluster = pg.new_cluster("source").start()
    cluster.pgbench("-i", "-s", "1", "-q")
    state = cluster.state()
    cluster.stop()
    body = directory_tar(cluster)
    before = timeline.dir_files()
    pageserver.allowed_errors.append("failpoint layer-after-rename")
    pageserver.http.configure_failpoints(("layer-after-rename", "return"))
    r = requests.put(f"{timeline.url}/import", data=body, timeout=120)
    pageserver.http.configure_failpoints(("layer-after-rename", "off"))
    assert r.status_code == 500 and "layer-after-rename" in r.text, r.text
    assert timeline.dir_files() == before
    r = requests.put(f"{timeline.url}/import", data=body, timeout=120)
    assert r.status_code == 200, r.text
    restored, _ = restored_state(pg, timeline, "restored")
    assert restored == state


def test_branch_at_a_snapshot_diverges_from_its_parent(pg: PgEnv, timeline: TimelineHandle):
    cluster = pg.new_cluster("source").start()
    cluster.pgbench("-i", "-s", "1", "-q")
    cluster.stop()
    first = Lsn.parse(import_stopped(pg, timeline, cluster)["lsn"])
    cluster.start()
    cluster.pgbench("-t", "200", "-n")
    second_state = cluster.state()
    cluster.stop()
    second = Lsn.parse(import_stopped(pg, timeline, cluster)["lsn"])
    # The parent goes on after the branch point.
    cluster.start()
    cluster.pgbench("-t", "200", "-n")
    third_state = cluster.state()
    cluster.stop()
    third = Lsn.parse(import_stopped(pg, timeline, cluster)["lsn"])

    branch = timeline.branch(second)
    info = branch.info()
    assert info["ancestor_timeline_id"] == timeline.timeline_id
    assert Lsn.parse(info["ancestor_lsn"]) == second
    assert Lsn.parse(info["last_record_lsn"]) == second
    # The branch gives the parent's snapshots at and below its LSN, to point reads, scans and
    # basebackups alike.
    state, at = restored_state(pg, branch, "branch_at_second")
    assert at == second and state == second_state
    parent_pages = scan_all(timeline, second)
    assert len(parent_pages) > 100
    assert scan_all(branch, second) == parent_pages

    # New work on a cluster restored from the branch, imported into the branch.
    work, _ = pg.restore(branch.url, "work", second)
    work.start()
    work.psql("CREATE TABLE branch_only AS SELECT g AS id FROM generate_series(1, 500) g")
    work.pgbench("-t", "100", "-n")
    work_state = work.state()
    work.stop()
    report = import_stopped(pg, branch, work)
    assert report["blocks_unchanged"] > report["blocks_changed"] + report["blocks_new"], report
    state, _ = restored_state(pg, branch, "branch_latest")
    assert state == work_state and "branch_only" in state
    # More work, a second snapshot on the branch (two L0 layers, so compaction makes L1s), then
    # images on the branch: they hold its pages, the parent's included, so the scan and the
    # restore after them are the same as before.
    work.start()
    work.pgbench("-t", "50", "-n")
    work_state = work.state()
    work.stop()
    import_stopped(pg, branch, work)
    latest = branch.info()["last_record_lsn"]
    branch_pages = scan_all(branch, Lsn.parse(latest))
    imaged = branch.http.compact(branch.tenant_id, branch.timeline_id, force_images=True)["image_creation"]
    assert imaged["images"] >= len(branch_pages) > len(parent_pages), imaged
    assert scan_all(branch, Lsn.parse(latest)) == branch_pages
    state, _ = restored_state(pg, branch, "branch_imaged")
    assert state == work_state

    # The parent is unchanged, at every snapshot.
    for lsn, expected in [(second, second_state), (third, third_state)]:
        state, at = restored_state(pg, timeline, f"parent_{lsn:x}", lsn)
        assert at == lsn and state == expected
    assert "branch_only" not in third_state
    # A timeline with a branch is not deleted; the branch is, then the parent.
    r = requests.delete(f"{timeline.url}")
    assert r.status_code == 409 and "branches" in r.json()["msg"], r.text
    assert requests.delete(branch.url).status_code == 200
    assert requests.delete(timeline.url).status_code == 200
    assert first < second < third


def test_pagectl_round_trip(pg: PgEnv, pageserver: Pageserver, timeline: TimelineHandle):
    """`pagectl import` of a directory and of a pg_basebackup on stdin, `pagectl basebackup`
    into a new directory that PostgreSQL starts from, and a refusal that exits 1."""
    pagectl = str(pageserver.binary.pagectl)
    target = ["--endpoint", pageserver.base_url, "--tenant", timeline.tenant_id, "--timeline", timeline.timeline_id]
    cluster = pg.new_cluster("source").start()
    cluster.pgbench("-i", "-s", "1", "-q")
    expected = cluster.state()
    cluster.stop()

    out = subprocess.run([pagectl, "import", *target, str(cluster.datadir)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["kind"] == "stopped" and report["blocks_new"] > 0
    # stderr is a pipe, not a terminal: no progress line (pageserver/tests/pagectl/datadir.rs
    # draws it on a pseudo-terminal).
    assert out.stderr == "", out.stderr

    restored_dir = pg.base / "restored"
    out = subprocess.run([pagectl, "basebackup", *target, "--into", str(restored_dir)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert report["lsn"] in out.stdout
    assert oct(restored_dir.stat().st_mode & 0o777) == oct(0o700)
    if os.geteuid() == 0:
        subprocess.run(["chown", "-R", "postgres:postgres", str(restored_dir)], check=True)
    restored = pg.cluster("restored").start()
    assert restored.state() == expected
    restored.psql("CREATE TABLE later AS SELECT 1 AS x")
    # A pg_basebackup of the running restored cluster, through stdin.
    backup = restored.basebackup_process()
    out = subprocess.run([pagectl, "import", *target, "-"], stdin=backup.stdout, capture_output=True, text=True, timeout=300)
    assert backup.wait(timeout=300) == 0
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["kind"] == "backup"
    # A running cluster's directory: the server's refusal, exit 1.
    out = subprocess.run([pagectl, "import", *target, str(restored.datadir)], capture_output=True, text=True, timeout=300)
    restored.stop()
    assert out.returncode == 1, out
    assert "400" in out.stderr and "postmaster.pid" in out.stderr, out.stderr
    # Into a directory that is not empty: refused before anything is fetched.
    out = subprocess.run([pagectl, "basebackup", *target, "--into", str(restored_dir)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "not empty" in out.stderr, out.stderr


def test_gc_does_not_pass_a_basebackup_in_progress(pg: PgEnv, pageserver_factory: PageserverFactory):
    """A basebackup leases its snapshot's LSN: a GC pass while the archive streams (cutoff
    wanted past it, the layers it reads removable) stops at that LSN, and the archive comes out
    whole, byte for byte the one taken before. Once it is done, GC goes on."""
    ps = pageserver_factory.start({"gc_horizon": 0, "compaction_threshold": 0})
    timeline = TimelineHandle.create(ps)
    cluster = pg.new_cluster("source").start()
    cluster.pgbench("-i", "-s", "3", "-q")
    cluster.stop()
    first = Lsn.parse(import_stopped(pg, timeline, cluster)["lsn"])
    cluster.start()
    cluster.pgbench("-t", "200", "-n")
    cluster.stop()
    second = Lsn.parse(import_stopped(pg, timeline, cluster)["lsn"])
    url = f"{timeline.url}/basebackup"
    whole = requests.get(url, params={"lsn": str(first)}).content
    assert len(whole) > 16 << 20

    with requests.get(url, params={"lsn": str(first)}, stream=True) as r:
        assert r.status_code == 200 and r.headers["x-snapshot-lsn"] == str(first)
        chunks = r.iter_content(64 << 10)
        got = bytearray(next(chunks))
        # Compaction and images at the second snapshot make everything below it removable.
        compacted = ps.http.compact(timeline.tenant_id, timeline.timeline_id, force_images=True)
        assert compacted["image_creation"]["layers_written"] > 0, compacted
        outcome = ps.http.gc(timeline.tenant_id, timeline.timeline_id)["gc"]
        assert Lsn.parse(outcome["cutoff"]) == first, outcome
        for chunk in chunks:
            got += chunk
    assert bytes(got) == whole
    with tarfile.open(fileobj=io.BytesIO(got)) as archive:
        assert "global/pg_control" in archive.getnames()

    # The lease ended with the archive: the next pass moves the cutoff to the images, and the
    # first snapshot is gone.
    outcome = ps.http.gc(timeline.tenant_id, timeline.timeline_id)["gc"]
    assert Lsn.parse(outcome["cutoff"]) == second and outcome["layers_removed"] > 0, outcome
    r = requests.get(url, params={"lsn": str(first)})
    assert r.status_code == 410, r.text


def server_rss(ps: Pageserver) -> int:
    """The server's resident memory in bytes, from /proc/<pid>/status."""
    with open(f"/proc/{ps.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def tar_header(name: bytes, size: int, typeflag: bytes, mode: int = 0o600) -> bytes:
    """One GNU tar header block (a name of at most 100 bytes; longer ones go in a long name
    member before it), uid, gid and mtime 0."""
    head = name[:100].ljust(100, b"\0") + b"%07o\0" % mode + b"0000000\0" * 2 + b"%011o\0" % size + b"%011o\0" % 0
    tail = typeflag + bytes(100) + b"ustar  \0" + bytes(247)
    # The checksum counts its own field as eight spaces.
    checksum = sum(head) + sum(tail) + 8 * ord(" ")
    return head + b"%06o\0 " % checksum + tail


def long_named_empty_files(count: int, name_len: int) -> Iterator[bytes]:
    """`count` empty files, each named by a `././@LongLink` member of `name_len` bytes."""
    for i in range(count):
        name = f"./hostile/{i:07d}-".encode().ljust(name_len, b"x")
        data = name + b"\0"
        yield tar_header(b"././@LongLink", len(data), b"L") + data.ljust(-(-len(data) // 512) * 512, b"\0")
        yield tar_header(name, 0, b"0")


def empty_relation_files(count: int) -> Iterator[bytes]:
    """`count` empty relation files `base/1/<n>`, a fork each (headers made from one template:
    only the name and the checksum differ)."""
    template = tar_header(b"", 0, b"0")
    unnamed = int(template[148:154], 8)
    middle, tail = template[100:148], template[156:]
    for relnode in range(1, count + 1):
        name = b"base/1/%d" % relnode
        yield name.ljust(100, b"\0") + middle + b"%06o\0 " % (unnamed + sum(name)) + tail


def import_within_budget(ps: Pageserver, timeline: TimelineHandle, pieces: Iterator[bytes], length: int) -> str:
    """Streams an archive of `length` bytes, made as it is sent, into an import, checking the
    server's memory after every 256 KiB: it must grow by at most the import budget while the
    import reads and after its answer, which must be a refusal that stores nothing. Returns
    the refusal's message."""
    baseline = server_rss(ps)
    peak = 0
    sent = 0
    path = f"/v1/tenant/{timeline.tenant_id}/timeline/{timeline.timeline_id}/import"
    with connect(ps, timeout=60) as s:
        s.sendall(f"PUT {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {length}\r\n\r\n".encode())
        while sent < length:
            # The answer may come before the body is all sent: then stop sending and read it.
            if select.select([s], [], [], 0)[0]:
                break
            batch = bytearray()
            for piece in pieces:
                batch += piece
                if len(batch) >= 256 * 1024:
                    break
            else:
                batch += bytes(1024)  # the end-of-archive marker
            try:
                s.sendall(batch)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(batch)
            peak = max(peak, server_rss(ps) - baseline)
            assert peak <= IMPORT_MEMORY_BUDGET, f"the server grew by {peak / MiB:.0f} MiB after {sent / MiB:.0f} MiB of the archive"
        status, _, body = read_response(s)
    after = server_rss(ps) - baseline
    print(f"sent {sent / MiB:.1f} MiB of {length / MiB:.1f}; growth: peak {peak / MiB:.1f} MiB, after {after / MiB:.1f} MiB")
    assert status == 400, body
    assert after <= IMPORT_MEMORY_BUDGET, f"the server kept {after / MiB:.0f} MiB after the import"
    assert timeline.info()["last_record_lsn"] == "0/0"
    assert ps.leftovers() == []
    return json.loads(body)["msg"]


def test_an_archive_of_long_names_stays_within_the_memory_budget(pageserver: Pageserver, timeline: TimelineHandle):
    """200,000 empty files with 4,000-byte GNU long names, about 1 GB of archive: refused once
    their entries pass what the file directory holds, within the memory budget."""
    count, name_len = 200_000, 4000
    length = count * (512 + -(-(name_len + 1) // 512) * 512 + 512) + 1024
    msg = import_within_budget(pageserver, timeline, long_named_empty_files(count, name_len), length)
    assert "max_value_size (1048576 bytes)" in msg and "file directory" in msg, msg


def test_an_archive_past_the_member_limit_stays_within_the_memory_budget(pageserver: Pageserver, timeline: TimelineHandle):
    """One member more than an import takes, 2,000,001 empty relation files (a fork each, the
    cheapest member to send and the one that leaves the most state behind), about 1 GB of
    archive: refused at the last one, within the memory budget."""
    count = 2_000_001
    msg = import_within_budget(pageserver, timeline, empty_relation_files(count), count * 512 + 1024)
    assert "more than 2000000 members" in msg, msg
