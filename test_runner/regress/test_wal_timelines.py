"""PostgreSQL timelines in the WAL stream: a receiver follows a primary promoted to a new
timeline (a failover to a standby), and a PostgreSQL started from a branch streams its own
timeline back into the branch. History files are stored, archived and served, and restores
across a switch start as the cluster was."""

from __future__ import annotations

import requests

from fixtures.pageserver import Pageserver
from fixtures.postgres import PgCluster, PgEnv
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


def check_restore(pg: PgEnv, timeline: TimelineHandle, name: str, lsn: Lsn, figures: str) -> PgCluster:
    restored, _ = pg.restore(timeline.url, name, lsn)
    start_listening(restored)
    assert restored.psql(FIGURES) == figures, (name, lsn, restored.log.read_text()[-2000:])
    return restored


def stream_then_write(timeline: TimelineHandle, cluster: PgCluster) -> tuple[str, Lsn]:
    """Points `timeline`'s receiver at `cluster` (on PostgreSQL timeline 2), runs pgbench
    there, and waits until its WAL is flushed on timeline 2; the figures and their LSN."""
    r = requests.put(f"{timeline.url}/wal_receiver", json={"connstr": connstr(cluster)}, timeout=60)
    assert r.status_code == 200, r.text
    cluster.pgbench("-c", "2", "-t", "40")
    figures, lsn = figures_and_lsn(cluster)
    state = wait_flushed(timeline, lsn)
    assert state["timeline"] == 2, state
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
    assert forked.psql("SELECT timeline_id FROM pg_control_checkpoint()") == "2"
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


def test_the_receiver_follows_a_standby_promoted_in_a_failover(pg: PgEnv, pageserver: Pageserver, timeline: TimelineHandle):
    # The primary stops, and the old primary is refused.
    pageserver.allowed_errors.append("WAL receiver: ")
    primary = primary_with_snapshot(pg, timeline)
    r = requests.put(f"{timeline.url}/wal_receiver", json={"connstr": connstr(primary)}, timeout=60)
    assert r.status_code == 200, r.text
    # A stock streaming standby of the same primary.
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

    # The failover: the primary stops (its last WAL reaches both), the standby is promoted to
    # timeline 2, and the receiver is pointed at it.
    primary.stop("fast")
    standby.run("pg_ctl", "-D", str(standby.datadir), "-w", "promote")
    wait_until(lambda: standby.psql("SELECT pg_is_in_recovery()") == "f", timeout=60, what="the promotion")
    after_figures, after = stream_then_write(timeline, standby)
    wait_until(
        lambda: Lsn.parse(receiver(timeline).json()["archived_lsn"] or "0/0") >= after,
        timeout=30,
        what="the WAL of timeline 2 archived",
    )
    r = requests.get(f"{timeline.url}/wal/00000002.history", timeout=30)
    assert r.status_code == 200 and r.content == (standby.datadir / "pg_wal" / "00000002.history").read_bytes()

    # Restores on both sides of the switch.
    check_restore(pg, timeline, "before_switch", before, before_figures).stop("immediate")
    check_restore(pg, timeline, "after_switch", after, after_figures).stop("immediate")

    # The old primary, started again, is on timeline 1 past the switch: refused, clearly.
    primary.start("listen_addresses=127.0.0.1")
    primary.pgbench("-c", "1", "-t", "10")
    r = requests.put(f"{timeline.url}/wal_receiver", json={"connstr": connstr(primary)}, timeout=60)
    assert r.status_code == 409 and "timeline" in r.text, r.text
