"""PostgreSQL timelines in the WAL stream: a receiver follows a primary promoted to a new
timeline (a failover to a standby), and a PostgreSQL started from a branch streams its own
timeline back into the branch. History files are stored, archived and served, and restores
across a switch start as the cluster was."""

from __future__ import annotations

import shutil

import requests

from fixtures.pageserver import Pageserver
from fixtures.plugin import PageserverFactory
from fixtures.postgres import PgCluster, PgEnv
from fixtures.remote_storage import RemoteStore
from fixtures.timeline import TimelineHandle
from fixtures.utils import Lsn, wait_until
from fixtures.wal_stream import connstr, primary_with_snapshot, receiver, wait_flushed

FIGURES = "SELECT (SELECT count(*) FROM pgbench_history), (SELECT sum(abalance) FROM pgbench_accounts)"


def figures_and_lsn(cluster: PgCluster) -> tuple[str, Lsn]:
    """The pgbench figures and the WAL insert position, read in one statement."""
    count, total, lsn = cluster.psql(f"{FIGURES}, pg_current_wal_insert_lsn()").split("|")
    return f"{count}|{total}", Lsn.parse(lsn)


def start_listening(cluster: PgCluster) -> None:
    """Starts a restored cluster on 127.0.0.1 and waits until its recovery ends and it is
    promoted; its log is in the error if it does not get there."""
    try:
        cluster.start("listen_addresses=127.0.0.1")
        wait_until(lambda: cluster.psql("SELECT pg_is_in_recovery()") == "f", timeout=60, what="recovery, then promotion")
    except Exception as e:
        raise AssertionError(f"{e}\n{cluster.log.read_text()[-3000:]}") from e


def current_timeline(cluster: PgCluster) -> int:
    """The timeline a cluster writes its WAL on: its current segment's (a promoted cluster's
    checkpoint in pg_control moves to it only with its first checkpoint after the promotion,
    which a fast promotion does not wait for)."""
    return int(cluster.psql("SELECT pg_walfile_name(pg_current_wal_lsn())")[:8], 16)


def check_restore(pg: PgEnv, timeline: TimelineHandle, name: str, lsn: Lsn, figures: str) -> PgCluster:
    restored, _ = pg.restore(timeline.url, name, lsn)
    start_listening(restored)
    assert restored.psql(FIGURES) == figures, (name, lsn, restored.log.read_text()[-2000:])
    return restored


def _stopped(timeline: TimelineHandle) -> dict:
    state = receiver(timeline).json()
    assert state["state"] == "stopped", state
    return state


def stream_then_write(timeline: TimelineHandle, cluster: PgCluster, tli: int = 2) -> tuple[str, Lsn]:
    """Points `timeline`'s receiver at `cluster` (on PostgreSQL timeline `tli`), runs pgbench
    there, and waits until its WAL is flushed on that timeline; the figures and their LSN."""
    r = requests.put(f"{timeline.url}/wal_receiver", json={"connstr": connstr(cluster)}, timeout=60)
    assert r.status_code == 200, r.text
    cluster.pgbench("-c", "2", "-t", "40")
    figures, lsn = figures_and_lsn(cluster)
    state = wait_flushed(timeline, lsn)
    assert state["timeline"] == tli, state
    return figures, lsn


def test_a_branch_started_from_its_basebackup_streams_its_timeline_back_into_the_branch(
    pg: PgEnv, pageserver: Pageserver, timeline: TimelineHandle
):
    # The PostgreSQL of the branch restarts, and the old primary is refused.
    pageserver.allowed_errors.append("WAL receiver: ")
    primary = primary_with_snapshot(pg, timeline)
    r = requests.put(f"{timeline.url}/wal_receiver", json={"connstr": connstr(primary)}, timeout=60)
    assert r.status_code == 200, r.text
    primary.pgbench("-c", "2", "-t", "40")
    at_branch, between = figures_and_lsn(primary)
    # The ancestor goes on after the branch point.
    primary.pgbench("-c", "2", "-t", "40")
    ancestor_figures, ancestor_end = figures_and_lsn(primary)
    wait_flushed(timeline, ancestor_end)

    branch = timeline.branch(between)
    # Past the ancestor's newest snapshot: its history is fixed up to the branch point now.
    assert Lsn.parse(timeline.info()["last_record_lsn"]) == between
    # A receiver on the branch before a PostgreSQL of the branch exists: the primary's
    # history is not the branch's (it went on past the branch point on timeline 1).
    r = requests.put(f"{branch.url}/wal_receiver", json={"connstr": connstr(primary)}, timeout=60)
    assert r.status_code == 409, r.text

    # A PostgreSQL started from the branch: it replays to the branch point and is promoted
    # to timeline 2, and it takes writes of its own.
    forked = check_restore(pg, branch, "forked", between, at_branch)
    assert current_timeline(forked) == 2
    forked.psql("CREATE TABLE on_the_branch AS SELECT generate_series(1, 1000) AS x")
    branch_figures, branch_end = stream_then_write(branch, forked)

    # The branch's history file is served as the PostgreSQL of the branch wrote it.
    history = (forked.datadir / "pg_wal" / "00000002.history").read_bytes()
    r = requests.get(f"{branch.url}/wal/00000002.history", timeout=30)
    assert r.status_code == 200 and r.content == history, (r.status_code, r.content, history)

    # The branch at its newest WAL: the branch's writes, on top of the ancestor's state at
    # the branch point; the ancestor is as it was.
    again = check_restore(pg, branch, "branch_again", branch_end, branch_figures)
    assert again.psql("SELECT count(*) FROM on_the_branch") == "1000"
    again.stop("immediate")
    ancestor = check_restore(pg, timeline, "ancestor", ancestor_end, ancestor_figures)
    assert ancestor.psql("SELECT to_regclass('on_the_branch') IS NULL") == "t"
    ancestor.stop("immediate")

    # The PostgreSQL of the branch restarts: streaming resumes on timeline 2, no gap.
    forked.stop("fast")
    forked.start("listen_addresses=127.0.0.1")
    forked.pgbench("-c", "1", "-t", "20")
    branch_figures, branch_end = figures_and_lsn(forked)
    wait_flushed(branch, branch_end, timeout=90)
    check_restore(pg, branch, "branch_later", branch_end, branch_figures).stop("immediate")

    # A second PostgreSQL from the same point (restored from the ancestor there): promoted to
    # timeline 2 at the same LSN, with the same history file, and WAL of its own after it.
    # Streaming it over the branch's would change the branch's history: the first byte that
    # differs from the WAL stored stops the receiver, and nothing is written.
    twin = check_restore(pg, timeline, "twin", between, at_branch)
    assert (twin.datadir / "pg_wal" / "00000002.history").read_bytes() == history
    twin.psql("CREATE TABLE only_on_the_twin AS SELECT 1 AS x")
    r = requests.put(f"{branch.url}/wal_receiver", json={"connstr": connstr(twin)}, timeout=60)
    if r.status_code == 409:
        assert "differs from the WAL stored" in r.text, r.text
    else:
        assert r.status_code == 200, r.text
        state = wait_until(lambda: _stopped(branch), timeout=60, what="the receiver stopped on the twin's WAL")
        assert "differs from the WAL stored" in state["last_error"], state
    check_restore(pg, branch, "branch_kept", branch_end, branch_figures).stop("immediate")


def wait_archived(timeline: TimelineHandle, lsn: Lsn) -> None:
    wait_until(
        lambda: Lsn.parse(receiver(timeline).json()["archived_lsn"] or "0/0") >= lsn,
        timeout=30,
        what=f"the WAL archived to {lsn}",
    )


def fail_over(pg: PgEnv, timeline: TimelineHandle) -> tuple[PgCluster, PgCluster, str, Lsn]:
    """A primary streaming into `timeline` and a stock standby of it; pgbench; then the
    failover: the primary stops (its last WAL reaches both) and the standby is promoted to
    timeline 2. The old primary, the new one, and the figures before the switch with their LSN."""
    primary = primary_with_snapshot(pg, timeline)
    r = requests.put(f"{timeline.url}/wal_receiver", json={"connstr": connstr(primary)}, timeout=60)
    assert r.status_code == 200, r.text
    standby_dir = pg.base / "standby"
    primary.run(
        "pg_basebackup", *primary.conn_args(), "-D", str(standby_dir), "-R", "-X", "stream", "-c", "fast",
    )
    standby = pg.cluster("standby").start("listen_addresses=127.0.0.1")
    primary.pgbench("-c", "2", "-t", "40")
    before_figures, before = figures_and_lsn(primary)
    wait_flushed(timeline, before)
    wait_until(
        lambda: Lsn.parse(standby.psql("SELECT pg_last_wal_replay_lsn()")) >= before,
        timeout=60,
        what="the standby replayed the primary's WAL",
    )
    primary.stop("fast")
    standby.run("pg_ctl", "-D", str(standby.datadir), "-w", "promote")
    wait_until(lambda: standby.psql("SELECT pg_is_in_recovery()") == "f", timeout=60, what="the promotion")
    return primary, standby, before_figures, before


def test_the_receiver_follows_a_standby_promoted_in_a_failover(pg: PgEnv, pageserver: Pageserver, timeline: TimelineHandle):
    # The primary stops, and the old primary is refused.
    pageserver.allowed_errors.append("WAL receiver: ")
    primary, standby, before_figures, before = fail_over(pg, timeline)
    # The receiver, pointed at the new primary, follows the switch.
    after_figures, after = stream_then_write(timeline, standby)
    wait_archived(timeline, after)
    r = requests.get(f"{timeline.url}/wal/00000002.history", timeout=30)
    assert r.status_code == 200 and r.content == (standby.datadir / "pg_wal" / "00000002.history").read_bytes()

    # Restores on both sides of the switch.
    check_restore(pg, timeline, "before_switch", before, before_figures).stop("immediate")
    after_switch = check_restore(pg, timeline, "after_switch", after, after_figures)

    # That restored cluster is promoted once more, to timeline 3, with the line's history files
    # (1 to 2 at the failover, 2 to 3 at the restore): it streams into a branch made there.
    assert current_timeline(after_switch) == 3
    branch = timeline.branch(after)
    third_figures, third = stream_then_write(branch, after_switch, tli=3)
    check_restore(pg, branch, "third", third, third_figures).stop("immediate")
    after_switch.stop("immediate")

    # The old primary, started again, is on timeline 1 past the switch: refused, clearly.
    primary.start("listen_addresses=127.0.0.1")
    primary.pgbench("-c", "1", "-t", "10")
    r = requests.put(f"{timeline.url}/wal_receiver", json={"connstr": connstr(primary)}, timeout=60)
    assert r.status_code == 409 and "timeline" in r.text, r.text


def test_after_a_failover_a_lost_disk_restores_across_the_switch_from_the_store(
    pg: PgEnv, pageserver_factory: PageserverFactory, remote_store: RemoteStore
):
    first = pageserver_factory.start(remote=remote_store)
    first.allowed_errors.append("WAL receiver: ")
    timeline = TimelineHandle.create(first)
    _, standby, before_figures, before = fail_over(pg, timeline)
    after_figures, after = stream_then_write(timeline, standby)
    wait_archived(timeline, after)
    history = (standby.datadir / "pg_wal" / "00000002.history").read_bytes()
    index = remote_store.check_consistent(timeline.tenant_id, timeline.timeline_id)
    assert index["wal"]["history"] == {"00000002.history": history.decode()}, index["wal"]
    # The tail is timeline 2's: the switch's segment moved there, and its old name is gone.
    tail = index["wal"]["partial"]
    assert tail is None or tail["name"].startswith("00000002"), index["wal"]

    # The machine and its disk are gone; another attaches the tenant and streams on, on
    # timeline 2, from where the archive ends.
    first.kill()
    shutil.rmtree(first.workdir)
    second = pageserver_factory.start(remote=remote_store, name="second")
    second.http.tenant_attach(timeline.tenant_id, generation=2)
    moved = TimelineHandle(second, timeline.tenant_id, timeline.timeline_id, timeline.model)
    wait_flushed(moved, after)
    assert receiver(moved).json()["timeline"] == 2
    r = requests.get(f"{moved.url}/wal/00000002.history", timeout=30)
    assert r.status_code == 200 and r.content == history
    # Both sides of the switch restore from the store.
    check_restore(pg, moved, "moved_before", before, before_figures).stop("immediate")
    check_restore(pg, moved, "moved_after", after, after_figures).stop("immediate")
    more_figures, more = stream_then_write(moved, standby)
    check_restore(pg, moved, "moved_more", more, more_figures).stop("immediate")
