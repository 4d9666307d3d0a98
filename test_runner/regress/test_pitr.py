"""Point-in-time recovery by time: the WAL archive indexes the commit times of the WAL streamed
in, `lsn_by_timestamp` finds the state after the last commit at or before a time, and a
basebackup (or `pagectl basebackup --time`) at a time starts as the cluster was then."""

from __future__ import annotations

import os
import subprocess

import requests

from fixtures.pageserver import Pageserver
from fixtures.postgres import PgEnv
from fixtures.timeline import TimelineHandle
from fixtures.utils import Lsn, wait_until
from fixtures.wal_stream import connstr, primary_with_snapshot, receiver, start_promoted, wait_flushed

FIGURES = "SELECT (SELECT count(*) FROM pgbench_history), (SELECT sum(abalance) FROM pgbench_accounts)"
NOW_UTC = """SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'), pg_current_wal_insert_lsn()"""


def test_any_time_after_the_snapshot_comes_back_as_a_cluster(pg: PgEnv, pageserver: Pageserver, timeline: TimelineHandle):
    primary = primary_with_snapshot(pg, timeline)
    r = requests.put(f"{timeline.url}/wal_receiver", json={"connstr": connstr(primary)}, timeout=60)
    assert r.status_code == 200, r.text
    points = []
    for round_ in range(5):
        primary.pgbench("-c", "2", "-t", str(20 + 10 * round_))
        if round_ == 2:
            primary.psql("SELECT pg_switch_wal()")  # one search spans a segment's end
        figures = primary.psql(FIGURES)
        at, lsn = primary.psql(NOW_UTC).split("|")
        points.append((at, figures, Lsn.parse(lsn)))
    end = points[-1][2]
    wait_flushed(timeline, end)
    wait_until(
        lambda: Lsn.parse(receiver(timeline).json()["archived_lsn"] or "0/0") >= end,
        timeout=30,
        what="the WAL archived with its commit times",
    )

    previous = Lsn(0)
    for i, (at, figures, lsn) in enumerate(points):
        r = requests.get(f"{timeline.url}/lsn_by_timestamp", params={"timestamp": at}, timeout=60)
        assert r.status_code == 200, r.text
        found = r.json()
        assert found["kind"] in (("present",) if i < len(points) - 1 else ("present", "future")), found
        found_lsn = Lsn.parse(found["lsn"])
        # The last commit of the round: at or before the time, after the round before it.
        assert previous < found_lsn <= lsn, (i, found, lsn)
        assert found["commit_time"] <= at, (found, at)
        previous = found_lsn
        restored, _ = pg.restore_at(timeline.url, f"at{i}", {"timestamp": at})
        start_promoted(restored)
        assert restored.psql(FIGURES) == figures, (i, at)
        restored.stop("immediate")

    # Before every commit, in the future, not a time.
    r = requests.get(f"{timeline.url}/lsn_by_timestamp", params={"timestamp": "2001-01-01T00:00:00Z"}, timeout=60)
    assert r.status_code == 200 and r.json()["kind"] == "past", r.text
    r = requests.get(f"{timeline.url}/basebackup", params={"timestamp": "2001-01-01T00:00:00Z"}, timeout=60)
    assert r.status_code == 404 and "before the first commit" in r.text, r.text
    r = requests.get(f"{timeline.url}/basebackup", params={"timestamp": "2999-01-01T00:00:00Z"}, timeout=60)
    assert r.status_code == 400 and "in the future" in r.text, r.text
    r = requests.get(f"{timeline.url}/basebackup", params={"timestamp": "yesterday"}, timeout=60)
    assert r.status_code == 400 and "RFC 3339" in r.text, r.text
    r = requests.get(f"{timeline.url}/basebackup", params={"timestamp": points[0][0], "lsn": "0/0"}, timeout=60)
    assert r.status_code == 400, r.text

    # The same from the shell.
    at, figures, _ = points[1]
    pagectl = str(pageserver.binary.pagectl)
    target = ["--endpoint", pageserver.base_url, "--tenant", timeline.tenant_id, "--timeline", timeline.timeline_id]
    into = pg.base / "by_pagectl"
    out = subprocess.run([pagectl, "basebackup", *target, "--time", at, "--into", str(into)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "replayed when PostgreSQL starts" in out.stdout and "the last commit at or before the time" in out.stdout, out.stdout
    if os.geteuid() == 0:
        subprocess.run(["chown", "-R", "postgres:postgres", str(into)], check=True)
    restored = pg.cluster("by_pagectl")
    start_promoted(restored)
    assert restored.psql(FIGURES) == figures
    restored.stop("immediate")


def test_a_branch_between_two_snapshots_starts_as_the_cluster_was_there(pg: PgEnv, pageserver: Pageserver, timeline: TimelineHandle):
    """A branch made at an LSN between two snapshots of a timeline that streams its WAL: its
    basebackup is the snapshot below the branch point with the ancestor's WAL up to it, and
    PostgreSQL starts from it as the primary was at that LSN."""
    primary = primary_with_snapshot(pg, timeline)
    r = requests.put(f"{timeline.url}/wal_receiver", json={"connstr": connstr(primary)}, timeout=60)
    assert r.status_code == 200, r.text
    primary.pgbench("-c", "2", "-t", "60")
    figures = primary.psql(FIGURES)
    between = Lsn.parse(primary.psql("SELECT pg_current_wal_insert_lsn()"))
    primary.pgbench("-c", "2", "-t", "60")
    second = Lsn.parse(pg.import_process(timeline.url, primary.basebackup_process())["lsn"])
    assert between < second
    wait_flushed(timeline, second)

    branch = timeline.branch(between)
    assert Lsn.parse(branch.info()["last_record_lsn"]) == between
    restored, snapshot = pg.restore(branch.url, "branch")
    assert snapshot < between
    start_promoted(restored)
    assert restored.psql(FIGURES) == figures
    # Its own cluster from there: it takes writes, and the ancestor is as it was.
    restored.psql("CREATE TABLE on_the_branch AS SELECT 1 AS x")
    restored.stop("immediate")
    again, _ = pg.restore(timeline.url, "ancestor_again", between)
    start_promoted(again)
    assert again.psql(FIGURES) == figures
    again.stop("immediate")
