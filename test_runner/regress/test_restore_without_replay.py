"""Full-image mode (`wal_consistency_checking = 'all'`) and page ingest make every page at
every LSN: `basebackup?lsn=X&replay=none` gives the pages at X with a shutdown checkpoint there
of the page server's making, and PostgreSQL starts on it with nothing to replay. At LSNs taken
while pgbench writes, the restored cluster's `pg_dump` equals that of a cluster stock
PostgreSQL recovered to the same LSN, and `amcheck` finds its indexes sound."""

from __future__ import annotations

import os
import re
import subprocess
import threading
from pathlib import Path

import pytest
import requests

from fixtures.pageserver import Pageserver
from fixtures.postgres import PgCluster, PgEnv
from fixtures.timeline import TimelineHandle
from fixtures.utils import Lsn
from fixtures.wal_stream import UPLOAD_BACKPRESSURE, connstr, start_promoted_quietly, wait_ingested

FULL_IMAGES = ("listen_addresses=127.0.0.1", "wal_consistency_checking=all", "wal_compression=lz4")
# LSNs restored both ways; PAGESERVER_TEST_RESTORE_POINTS=50 for the long run.
POINTS = int(os.environ.get("PAGESERVER_TEST_RESTORE_POINTS", "6"))


def dump(cluster: PgCluster) -> str:
    """`pg_dump` of the database, less the random key of its `\\restrict` lines."""
    done = cluster.run("pg_dump", *cluster.conn_args(), "--no-sync", "postgres", check=False)
    assert done.returncode == 0, (done.stderr, cluster.log.read_text()[-2000:])
    out = done.stdout
    return "\n".join(line for line in out.splitlines() if not line.startswith(("\\restrict", "\\unrestrict")))


def next_ids(cluster: PgCluster) -> tuple[int, int, int]:
    """The next transaction id (with its epoch), OID and multixact of a stopped cluster."""
    out = cluster.run("pg_controldata", "-D", str(cluster.datadir)).stdout
    epoch, xid = re.search(r"Latest checkpoint's NextXID:\s+(\d+):(\d+)", out).groups()
    oid = re.search(r"Latest checkpoint's NextOID:\s+(\d+)", out).group(1)
    multi = re.search(r"Latest checkpoint's NextMultiXactId:\s+(\d+)", out).group(1)
    return (int(epoch) << 32 | int(xid), int(oid), int(multi))


def start_quietly(cluster: PgCluster) -> None:
    with (Path(cluster.datadir) / "postgresql.conf").open("a") as conf:
        conf.write("autovacuum = off\n")
    cluster.start()


@pytest.mark.timeout(90 + 12 * POINTS)
def test_a_restore_at_any_lsn_replays_nothing_and_equals_a_replayed_one(
    pg: PgEnv, pageserver: Pageserver, timeline: TimelineHandle
):
    pageserver.allowed_errors.append(UPLOAD_BACKPRESSURE)
    # A stopped primary's snapshot: its counters are exact from its shutdown checkpoint on.
    primary = pg.new_cluster("primary").start(*FULL_IMAGES)
    primary.pgbench("-i", "-s", "1", "-q")
    primary.psql("SELECT pg_create_physical_replication_slot('old_slot')")
    primary.stop()
    pg.import_process(timeline.url, primary.tar_process())
    primary.start(*FULL_IMAGES)
    # Pages from the WAL alone: no background snapshots, though the WAL passes their distance.
    r = requests.put(f"{timeline.url}/wal_receiver", json={"connstr": connstr(primary), "ingest_pages": True, "snapshot_wal_distance": 0}, timeout=60)
    assert r.status_code == 200, r.text

    bench = primary.pgbench_background("-c", "2", "-T", str(max(6, POINTS)))
    points: list[Lsn] = []
    try:
        # Schema changes, new relations, truncation and row locks by two transactions
        # (multixacts) while pgbench writes.
        primary.psql("CREATE TABLE grown AS SELECT g AS id, md5(g::text) AS v FROM generate_series(1, 20000) g")
        primary.psql("CREATE INDEX grown_v ON grown (v)")
        primary.psql("CREATE UNLOGGED TABLE scratch AS SELECT g FROM generate_series(1, 1000) g")
        points.append(Lsn.parse(primary.psql("SELECT pg_current_wal_insert_lsn()")))
        # Row locks: share-locked, then updated in a subtransaction (a multixact each).
        for i in range(5):
            primary.psql(f"BEGIN; SELECT * FROM grown WHERE id < 50 FOR SHARE; SAVEPOINT s; "
                         f"UPDATE grown SET v = 'm{i}' WHERE id < 50; COMMIT")
        primary.psql("DELETE FROM grown WHERE id % 3 = 0; TRUNCATE pgbench_history")
        while len(points) < POINTS and bench.poll() is None:
            threading.Event().wait(0.8)  # spread over the run
            points.append(Lsn.parse(primary.psql("SELECT pg_current_wal_insert_lsn()")))
    finally:
        bench.wait(timeout=120)
    assert len(points) >= min(POINTS, 4), points
    wait_ingested(timeline, points[-1])

    for i, lsn in enumerate(points):
        ours, _ = pg.restore_at(timeline.url, f"without{i}", {"lsn": str(lsn), "replay": "none"})
        materialized = Lsn.parse(pg.last_headers["x-materialized-lsn"])
        assert materialized <= lsn and "x-replay-to" not in pg.last_headers, pg.last_headers
        assert not (ours.datadir / "recovery.signal").exists()
        # The snapshot's statistics and slots stay behind; the WAL directory is there.
        assert not (ours.datadir / "pg_replslot" / "old_slot").exists()
        assert not (ours.datadir / "pg_stat" / "pgstat.stat").exists()
        assert (ours.datadir / "pg_wal" / "archive_status").is_dir()
        ours_ids = next_ids(ours)
        start_quietly(ours)
        assert ours.psql("SELECT pg_is_in_recovery()") == "f"
        log = ours.log.read_text()
        assert "database system was shut down at" in log and "redo starts" not in log, log[-2000:]
        theirs, _ = pg.restore(timeline.url, f"with{i}", materialized)
        assert (theirs.datadir / "pg_replslot" / "old_slot").exists(), "the snapshot has the slot"
        start_promoted_quietly(theirs)
        a, b = dump(ours), dump(theirs)
        assert a == b, (lsn, [line for line in set(a.splitlines()) ^ set(b.splitlines())][:10])
        assert ours.check_indexes() >= 4
        assert ours.psql("SELECT count(*) FROM scratch") == "0", "unlogged tables start empty"
        theirs.stop()
        # Never an id the data may hold: at least what replay reached.
        theirs_ids = next_ids(theirs)
        assert all(o >= t for o, t in zip(ours_ids, theirs_ids)), (ours_ids, theirs_ids)
        if i > 0:
            assert theirs_ids[2] > 1, "multixacts were made before this LSN"
        if i == len(points) - 1:
            # The same from the shell.
            pagectl = str(pageserver.binary.pagectl)
            target = ["--endpoint", pageserver.base_url, "--tenant", timeline.tenant_id, "--timeline", timeline.timeline_id]
            into = pg.base / "by_pagectl"
            out = subprocess.run([pagectl, "basebackup", *target, "--lsn", str(lsn), "--no-replay", "--into", str(into)],
                                 capture_output=True, text=True, timeout=300)
            assert out.returncode == 0 and "nothing to replay" in out.stdout, (out.stdout, out.stderr)
            if os.geteuid() == 0:
                subprocess.run(["chown", "-R", "postgres:postgres", str(into)], check=True)
            by_pagectl = pg.cluster("by_pagectl")
            start_quietly(by_pagectl)
            assert dump(by_pagectl) == a
            by_pagectl.stop()
            # The restored cluster writes, and starts again after a stop as any other does.
            ours.pgbench("-c", "1", "-t", "50", "-n")
            before = ours.psql("SELECT sum(abalance) FROM pgbench_accounts")
            ours.stop()
            ours.start()
            assert ours.psql("SELECT sum(abalance) FROM pgbench_accounts") == before
            assert ours.check_indexes() >= 4
        ours.stop()

    # A bad `replay`, and an LSN page ingest has not reached.
    r = requests.get(f"{timeline.url}/basebackup", params={"lsn": str(points[0]), "replay": "some"}, timeout=60)
    assert r.status_code == 400 and "replay=none" in r.text, r.text
    beyond = Lsn(int(points[-1]) + (1 << 36))  # far past any WAL the run wrote
    r = requests.get(f"{timeline.url}/basebackup", params={"lsn": str(beyond), "replay": "none"}, timeout=60)
    assert r.status_code == 404 and "WAL ends" in r.text, r.text
    assert requests.delete(f"{timeline.url}/wal_receiver", timeout=60).status_code == 200
    primary.stop()
