"""A stock PostgreSQL 15 streams its WAL into a timeline over the replication protocol, as it would
to a replica: the primary names the pageserver in `synchronous_standby_names` and its commits
complete; every byte stored is the primary's own WAL, byte for byte; a `kill -9` of the
pageserver loses nothing and the receiver resumes by itself; WAL files are served by name;
another cluster, an unreachable primary, wrong settings and a wrong password get clear
refusals; SCRAM authentication works."""

from __future__ import annotations

import threading

import pytest
import requests

from fixtures.pageserver import Pageserver
from fixtures.plugin import PageserverFactory
from fixtures.postgres import PgCluster, PgEnv, make_owned_dir
from fixtures.timeline import TimelineHandle
from fixtures.utils import Lsn, wait_until
from fixtures.wal_stream import check_wal_equal, connstr, primary_with_snapshot, receiver, start_promoted, wait_flushed


def test_a_synchronous_primary_streams_into_the_timeline_and_survives_kill_9(
    pg: PgEnv, pageserver_factory: PageserverFactory
):
    ps = pageserver_factory.start()
    timeline = TimelineHandle.create(ps)
    primary = primary_with_snapshot(pg, timeline)
    r = requests.put(f"{timeline.url}/wal_receiver", json={"connstr": connstr(primary)}, timeout=60)
    assert r.status_code == 200, r.text
    state = r.json()
    slot = f"pageserver_{timeline.timeline_id}"
    assert (state["state"], state["slot_name"], state["application_name"]) == ("streaming", slot, slot)
    assert state["system_id"] == primary.psql("SELECT system_identifier FROM pg_control_system()")
    assert "password" not in state["connstr"] and state["timeline"] == 1
    assert primary.psql("SELECT slot_type FROM pg_replication_slots WHERE slot_name = '" + slot + "'") == "physical"

    # Commits now wait for the pageserver's flush.
    primary.psql(f"ALTER SYSTEM SET synchronous_standby_names = '{slot}'")
    primary.psql("SELECT pg_reload_conf()")
    wait_until(
        lambda: primary.psql(f"SELECT sync_state FROM pg_stat_replication WHERE application_name = '{slot}'") == "sync",
        timeout=30,
        what="the pageserver as the synchronous standby",
    )
    primary.pgbench("-c", "2", "-t", "200")
    committed = Lsn.parse(primary.psql("SELECT pg_current_wal_flush_lsn()"))
    # Acknowledged commits are flushed here: nothing to wait for.
    state = receiver(timeline).json()
    assert Lsn.parse(state["flushed_lsn"]) >= committed, state
    assert check_wal_equal(primary, timeline, committed) >= 1

    # The pageserver dies; the primary's commits wait for it, and go on once it is back.
    ps.kill()
    done = threading.Event()
    writer = threading.Thread(target=lambda: (primary.pgbench("-c", "1", "-t", "50"), done.set()))
    writer.start()
    ps.start()
    writer.join(timeout=120)
    assert done.is_set(), "commits did not complete after the pageserver came back"
    committed = Lsn.parse(primary.psql("SELECT pg_current_wal_flush_lsn()"))
    wait_flushed(timeline, committed)
    assert check_wal_equal(primary, timeline, committed) >= 1

    # Stopped: the primary no longer waits for it once it no longer names it.
    primary.psql("ALTER SYSTEM RESET synchronous_standby_names")
    primary.psql("SELECT pg_reload_conf()")
    r = requests.delete(f"{timeline.url}/wal_receiver", params={"drop_slot": "true"}, timeout=60)
    assert r.status_code == 200, r.text
    assert receiver(timeline).status_code == 404
    assert primary.psql("SELECT count(*) FROM pg_replication_slots") == "0"
    assert requests.delete(f"{timeline.url}/wal_receiver", timeout=60).status_code == 404
    # The WAL stays, and is served; a segment it never had is not.
    assert check_wal_equal(primary, timeline, committed) >= 1
    r = requests.get(f"{timeline.url}/wal/0000000100000000000000FF", timeout=60)
    assert r.status_code == 404 and "no WAL file" in r.text, r.text
    r = requests.get(f"{timeline.url}/wal/not-a-wal-file", timeout=60)
    assert r.status_code == 400 and "not a WAL file name" in r.text


def test_refusals_say_what_is_wrong(pg: PgEnv, pageserver: Pageserver, timeline: TimelineHandle):
    url = f"{timeline.url}/wal_receiver"
    lonely = pg.new_cluster("lonely").start("listen_addresses=127.0.0.1")
    primary = primary_with_snapshot(pg, timeline)
    # Another cluster than the one the timeline holds.
    r = requests.put(url, json={"connstr": connstr(lonely)}, timeout=60)
    assert r.status_code == 409 and "another cluster" in r.text, r.text
    # Nothing listens there.
    r = requests.put(url, json={"connstr": "host=127.0.0.1 port=1 user=postgres"}, timeout=60)
    assert r.status_code == 502 and "cannot reach the primary" in r.text, r.text
    for body, says in [
        ({}, "needs connstr"),
        ({"connstr": "host=127.0.0.1"}, "needs user="),
        ({"connstr": connstr(primary), "slot_name": "Bad-Name"}, "slot_name"),
        ({"connstr": connstr(primary, "sslmode=verify-full")}, "needs sslrootcert"),
        ({"connstr": connstr(primary), "colour": "blue"}, "unknown field"),
    ]:
        r = requests.put(url, json=body, timeout=60)
        assert r.status_code == 400 and says in r.text, (body, r.text)
    assert receiver(timeline).status_code == 404

    # SCRAM: a role with a password, required by pg_hba for replication from 127.0.0.1.
    primary.psql("SET password_encryption = 'scram-sha-256'; CREATE ROLE rep WITH REPLICATION LOGIN PASSWORD 'rep secret'")
    hba = primary.datadir / "pg_hba.conf"
    hba.write_text("host replication rep 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
    primary.psql("SELECT pg_reload_conf()")
    wrong = f"host=127.0.0.1 port={primary.port} user=rep password='wrong' sslmode=disable"
    r = requests.put(url, json={"connstr": wrong}, timeout=60)
    assert r.status_code == 409 and "password authentication failed" in r.text, r.text
    right = f"host=127.0.0.1 port={primary.port} user=rep password='rep secret' sslmode=disable"
    r = requests.put(url, json={"connstr": right, "slot_name": "scram_slot"}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["connstr"].endswith("password=********")
    before = Lsn.parse(primary.psql("SELECT pg_current_wal_insert_lsn()"))
    primary.psql("CREATE TABLE after_scram AS SELECT generate_series(1, 1000) AS x")
    wait_flushed(timeline, before)
    # The stored settings keep the password away from other users.
    settings = pageserver.timeline_dir(timeline.tenant_id, timeline.timeline_id) / "wal_receiver.json"
    assert settings.stat().st_mode & 0o077 == 0


def test_any_lsn_after_the_snapshot_comes_back_as_a_cluster(pg: PgEnv, pageserver: Pageserver, timeline: TimelineHandle):
    """Restores at 20 LSNs taken while pgbench wrote with 4 clients (the last one at the very
    end of the WAL received), each from the snapshot plus the WAL streamed since: PostgreSQL
    replays to the LSN and promotes, and has exactly what the primary had there."""
    primary = primary_with_snapshot(pg, timeline)
    r = requests.put(f"{timeline.url}/wal_receiver", json={"connstr": connstr(primary)}, timeout=60)
    assert r.status_code == 200, r.text
    # The figures and the LSN with no pgbench transaction in between: the locks wait for those
    # in progress (each updates pgbench_accounts first) and keep new ones out until all three
    # are read.
    figures = (
        "BEGIN; LOCK pgbench_accounts, pgbench_history IN SHARE MODE;"
        " SELECT (SELECT count(*) FROM pgbench_history), (SELECT sum(abalance) FROM pgbench_accounts), pg_current_wal_insert_lsn();"
        " COMMIT"
    )
    bench = primary.pgbench_background("-c", "4", "-j", "2", "-T", "15")
    points = []
    try:
        while len(points) < 20 and bench.poll() is None:
            count, total, lsn = primary.psql(figures).split("|")
            points.append((int(count), int(total), Lsn.parse(lsn)))
            threading.Event().wait(0.5)  # spread over the run
    finally:
        bench.wait(timeout=120)
    assert len(points) >= 15, len(points)
    assert len({p[0] for p in points}) == len(points), "every point saw new commits"
    count, total, lsn = primary.psql(figures).split("|")
    points.append((int(count), int(total), Lsn.parse(lsn)))
    wait_flushed(timeline, points[-1][2])
    snapshot = Lsn.parse(timeline.info()["last_record_lsn"])
    for i, (count, total, lsn) in enumerate(points):
        assert lsn > snapshot
        restored, at = pg.restore(timeline.url, f"restored{i}", lsn)
        assert at == snapshot
        start_promoted(restored)
        got = restored.psql("SELECT (SELECT count(*) FROM pgbench_history), (SELECT sum(abalance) FROM pgbench_accounts)")
        assert got == f"{count}|{total}", (i, lsn, got)
        if i % 5 == 0:
            # Promoted to a timeline of its own: it takes writes.
            restored.psql("CREATE TABLE after_restore AS SELECT 1 AS x")
        restored.stop("immediate")
    # Beyond the WAL received: refused, saying where the WAL ends.
    r = requests.get(f"{timeline.url}/basebackup", params={"lsn": "F/0"}, timeout=60)
    assert r.status_code == 404 and "WAL ends at" in r.text, r.text


def test_a_timeline_with_nothing_takes_a_base_backup_over_the_connection(pg: PgEnv, pageserver: Pageserver, timeline: TimelineHandle):
    """`PUT wal_receiver` on an empty timeline: the pageserver takes the base backup itself
    (BASE_BACKUP over the same replication connection, into the import) and streams on from
    it; the cluster comes back at any LSN after it. A primary with a tablespace of its own is
    refused, and nothing of it is imported."""
    primary = pg.new_cluster("primary").start("listen_addresses=127.0.0.1")
    primary.pgbench("-i", "-s", "1", "-q")
    r = requests.put(f"{timeline.url}/wal_receiver", json={"connstr": connstr(primary)}, timeout=300)
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "streaming"
    snapshot = Lsn.parse(timeline.info()["last_record_lsn"])
    assert snapshot > Lsn(0)
    primary.pgbench("-c", "2", "-t", "50")
    count, total, lsn = primary.psql(
        "SELECT (SELECT count(*) FROM pgbench_history), (SELECT sum(abalance) FROM pgbench_accounts), pg_current_wal_insert_lsn()"
    ).split("|")
    wait_flushed(timeline, Lsn.parse(lsn))
    restored, at = pg.restore(timeline.url, "restored", Lsn.parse(lsn))
    assert at == snapshot
    start_promoted(restored)
    got = restored.psql("SELECT (SELECT count(*) FROM pgbench_history), (SELECT sum(abalance) FROM pgbench_accounts)")
    assert got == f"{count}|{total}"
    restored.stop("immediate")

    other = pg.new_cluster("with_tablespace").start("listen_addresses=127.0.0.1")
    location = make_owned_dir(pg.base / "tablespace")
    other.psql(f"CREATE TABLESPACE elsewhere LOCATION '{location}'")
    empty = TimelineHandle.create(pageserver)
    r = requests.put(f"{empty.url}/wal_receiver", json={"connstr": connstr(other)}, timeout=300)
    assert r.status_code == 409 and "tablespace" in r.text, r.text
    assert receiver(empty).status_code == 404
    assert empty.info()["last_record_lsn"] == "0/0", empty.info()
