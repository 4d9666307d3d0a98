"""Background snapshots: at the end of the first record at or past `snapshot_wal_distance` of
WAL from the newest snapshot, wherever it falls (docs/pitr.md), a stock PostgreSQL replays the
newest snapshot to there and the directory it shuts down with becomes a snapshot there.
Restores after it start right at it, pages at its LSN answer exactly, and a `kill -9` of the
pageserver at any step leaves nothing half-imported; the next attempt makes the snapshot."""

from __future__ import annotations

import os
import random
import re
import shutil
import struct
import time

import pytest
import requests

from fixtures.pageserver import Pageserver
from fixtures.plugin import PageserverFactory
from fixtures.postgres import PgCluster, PgEnv, make_owned_dir
from fixtures.timeline import TimelineHandle
from fixtures.utils import Lsn, wait_until
from fixtures.wal_stream import connstr, receiver, start_promoted_quietly, wait_flushed, wait_ingested

DISTANCE = 1 << 20


def snapshot_settings(pg: PgEnv) -> dict:
    """The server settings that let it run PostgreSQL: its programs, the user it runs as when
    we are root, and a replay directory that user can reach."""
    settings: dict = {"pg_bin_dir": str(pg.bin_dir), "snapshot_replay_dir": str(pg.base / "snapshot_replay")}
    if os.geteuid() == 0:
        settings["pg_user"] = "postgres"
    return settings


def start_streaming(pg: PgEnv, timeline: TimelineHandle, ingest_pages: bool = True, distance: int = DISTANCE, *settings: str) -> PgCluster:
    """A primary with pgbench's tables, imported by pg_basebackup, streaming with background
    snapshots every `distance` bytes."""
    primary = pg.new_cluster("primary").start("listen_addresses=127.0.0.1", *settings)
    primary.pgbench("-i", "-s", "1", "-q")
    pg.import_process(timeline.url, primary.basebackup_process())
    body = {"connstr": connstr(primary), "ingest_pages": ingest_pages, "snapshot_wal_distance": distance}
    r = requests.put(f"{timeline.url}/wal_receiver", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["snapshot_wal_distance"] == distance
    return primary


def fill(primary: PgCluster, rows: int = 20_000) -> None:
    """WAL that touches no page of pgbench's: a new table of `rows` rows (20 000 are about 3 MiB,
    more than DISTANCE)."""
    primary.psql(f"CREATE TABLE filler_{time.monotonic_ns()} AS SELECT g, repeat('x', 100) AS pad FROM generate_series(1, {rows}) g")


def write_then_more(primary: PgCluster, transactions: int) -> Lsn:
    """pgbench writes, then more WAL than DISTANCE, so that a snapshot comes past the writes;
    where they end."""
    primary.pgbench("-c", "2", "-t", str(transactions), "-n")
    end = Lsn.parse(primary.psql("SELECT pg_current_wal_insert_lsn()"))
    fill(primary)
    return end


def next_record(end: Lsn) -> Lsn:
    """Where the record after one ending at `end` starts (16 MiB segments)."""
    at = (int(end) + 7) // 8 * 8
    if at % 8192 == 0:
        at += 40 if at % (16 << 20) == 0 else 24
    return Lsn(at)


def snapshots_made(ps: Pageserver) -> list[Lsn]:
    """The LSNs of the background snapshots the server's log says it made."""
    return [Lsn.parse(lsn) for lsn in re.findall(r"background snapshot made .* lsn=(\S+)", ps.log_text())]


def imported_line(ps: Pageserver, lsn: Lsn) -> dict[str, str]:
    """The fields of the log line of the snapshot imported at `lsn`."""
    for line in reversed(ps.log_text().splitlines()):
        if "background snapshot imported" in line and f" lsn={lsn} " in line:
            return dict(re.findall(r"(\w+)=(\S+)", line))
    raise AssertionError(f"no snapshot imported at {lsn}")


def wait_snapshot_past(timeline: TimelineHandle, lsn: Lsn, timeout: float = 180) -> Lsn:
    def made() -> Lsn:
        state = receiver(timeline).json()
        made = state["snapshot_lsn"] is not None and Lsn.parse(state["snapshot_lsn"]) > lsn
        assert made, f"last error: {state['snapshot_error']}; page ingest: {state['pages_error']} at {state['pages_lsn']}"
        assert not state["snapshot_running"], state
        return Lsn.parse(state["snapshot_lsn"])

    return wait_until(made, timeout=timeout, interval=0.1, what=f"a background snapshot past {lsn}")


def kept_idle(replay_dir) -> bool:
    """The replay's directory is gone, or kept as the last snapshot left it: a cluster shut
    down, without recovery's files or WAL segments."""
    if not replay_dir.exists():
        return True
    left = [name for name in ["postmaster.pid", "recovery.signal", "standby.signal"] if (replay_dir / name).exists()]
    segments = [p.name for p in (replay_dir / "pg_wal").iterdir() if len(p.name) == 24]
    assert (replay_dir / "global" / "pg_control").exists(), sorted(os.listdir(replay_dir))
    assert not left and not segments, (left, segments)
    return True


def snapshot_below(timeline: TimelineHandle, lsn: Lsn) -> tuple[Lsn, str]:
    """The LSN and kind of the snapshot a basebackup at `lsn` starts from."""
    r = requests.get(f"{timeline.url}/basebackup", params={"lsn": str(lsn)}, timeout=120)
    assert r.status_code == 200, r.text
    return Lsn.parse(r.headers["x-snapshot-lsn"]), r.headers["x-snapshot-kind"]


def rel_key(db: int, rel: int, block: int) -> str:
    return struct.pack(">BIIIBI", 0, 1663, db, rel, 0, block).hex()


def page_statuses(primary: PgCluster, timeline: TimelineHandle, table: str, lsn: Lsn) -> dict[int, int]:
    """The HTTP status of a read of each block of `table` at `lsn`."""
    db = int(primary.psql("SELECT oid FROM pg_database WHERE datname = current_database()"))
    rel = int(primary.psql(f"SELECT pg_relation_filenode('{table}')"))
    blocks = int(primary.psql(f"SELECT pg_relation_size('{table}') / 8192"))
    return {
        b: requests.get(f"{timeline.url}/page", params={"key": rel_key(db, rel, b), "lsn": str(lsn)}, timeout=60).status_code
        for b in range(blocks)
    }


@pytest.mark.timeout(600)
def test_a_background_snapshot_is_where_restores_start_and_pages_answer(pg: PgEnv, pageserver_factory: PageserverFactory):
    """Writes, then more WAL than the distance: a snapshot is made at the end of the first record
    at or past it, in the middle of the primary's work, no checkpoint of its near. Pages that
    needed redo just below it answer exactly at it; a restore at it starts right there (its
    archive has a checkpoint record put just before the record after it: nothing is replayed),
    one past it replays from there. The next snapshot replays on in the directory this one
    kept, which goes with its timeline."""
    distance = 16 << 20
    ps = pageserver_factory.start(snapshot_settings(pg))
    timeline = TimelineHandle.create(ps)
    primary = start_streaming(pg, timeline, True, distance)
    first, kind = snapshot_below(timeline, Lsn.parse(timeline.info()["last_record_lsn"]))
    assert kind == "backup"
    primary.pgbench("-c", "2", "-t", "300", "-n")
    # The last change of pgbench_branches' one page: a WAL record to redo, no image.
    before_update = Lsn.parse(primary.psql("SELECT pg_current_wal_insert_lsn()"))
    primary.psql("UPDATE pgbench_branches SET bbalance = bbalance")
    end = Lsn.parse(primary.psql("SELECT pg_current_wal_insert_lsn()"))
    total = primary.psql("SELECT sum(abalance) FROM pgbench_accounts")
    fill(primary, 150_000)  # more WAL than the distance, which touches no page of pgbench's
    wait_snapshot_past(timeline, end)
    # The first snapshot past the writes.
    made = min(lsn for lsn in snapshots_made(ps) if lsn > end)
    at, kind = snapshot_below(timeline, made)
    assert (at, kind) == (made, "stopped")
    # The one before it is below the update (16 MiB apart, none in its few hundred bytes).
    assert first <= snapshot_below(timeline, Lsn(int(made) - 1))[0] < before_update
    state = receiver(timeline).json()
    assert state["snapshot_error"] is None, state
    assert int(imported_line(ps, made)["blocks_changed"]) > 0

    # Pages: below the snapshot, some need redo (422); at it, every one is an image.
    wait_ingested(timeline, made)
    below = page_statuses(primary, timeline, "pgbench_branches", Lsn(int(made) - 1))
    assert 422 in below.values(), below
    at_snapshot = page_statuses(primary, timeline, "pgbench_accounts", made)
    assert set(at_snapshot.values()) == {200}, at_snapshot
    for table in ["pgbench_branches", "pgbench_tellers", "pgbench_history"]:
        assert set(page_statuses(primary, timeline, table, made).values()) <= {200}, table

    # The counters there are not known exactly (followed from a backup's), so replay=none,
    # which would start a cluster on them alone, is refused.
    r = requests.get(f"{timeline.url}/basebackup", params={"lsn": str(made), "replay": "none"}, timeout=60)
    assert r.status_code == 422 and "not known exactly" in r.text, r.text
    # A restore at the snapshot starts at the checkpoint put before the record after it.
    restored, snapshot = pg.restore(timeline.url, "at_snapshot", made)
    assert snapshot == made
    wal_from = Lsn.parse(imported_line(ps, made)["wal_from"])
    control = (restored.datadir / "global" / "pg_control").read_bytes()
    checkpoint, redo = struct.unpack_from("<QQ", control, 32)
    assert (Lsn(checkpoint), Lsn(redo)) == (wal_from, wal_from) and wal_from < made, (checkpoint, redo, wal_from, made)
    start_promoted_quietly(restored)
    assert "redo is not required" in restored.log.read_text()
    assert restored.psql("SELECT sum(abalance) FROM pgbench_accounts") == total
    assert restored.psql(BALANCED) == "t"
    restored.stop()
    # One past it replays from it, through the record after it (which names the checkpoint
    # put before it as the record before, in the archive).
    primary.psql("CREATE TABLE after_snapshot AS SELECT 2 AS two")
    past_end = Lsn.parse(primary.psql("SELECT pg_current_wal_flush_lsn()"))
    wait_flushed(timeline, past_end)
    wait_ingested(timeline, past_end)
    past, snapshot = pg.restore(timeline.url, "past_snapshot", past_end)
    assert made <= snapshot < past_end
    start_promoted_quietly(past)
    assert f"redo starts at {next_record(snapshot)}" in past.log.read_text()
    assert past.psql("SELECT sum(abalance) FROM pgbench_accounts") == total
    assert past.psql("SELECT two FROM after_snapshot") == "2"

    metrics = ps.http.metrics_text()
    assert 'pageserver_background_snapshots_total{result="made"}' in metrics
    assert imported_line(ps, snapshots_made(ps)[0])["kept"] == "false", "the first one unpacks the backup's snapshot"
    replay_dir = pg.base / "snapshot_replay"
    newest = wait_until(lambda: not receiver(timeline).json()["snapshot_running"] and kept_idle(replay_dir) and snapshots_made(ps)[-1], timeout=120, what="the snapshots done, their directory kept")

    # The next one goes on from this one in the directory it kept: it unpacks only the WAL and
    # pg_control, reads only what of the relation files the replay wrote, and restores whole
    # (page ingest went on after it: ingested past it above).
    primary.pgbench("-c", "2", "-t", "200", "-n")
    total = primary.psql("SELECT sum(abalance) FROM pgbench_accounts")
    written = Lsn.parse(primary.psql("SELECT pg_current_wal_insert_lsn()"))
    fill(primary, 150_000)
    second = wait_snapshot_past(timeline, written)
    line = imported_line(ps, second)
    assert line["kept"] == "true" and Lsn.parse(line["from"]) >= newest, line
    assert int(line["blocks_changed"]) > 0, line
    # The catalogs' files, which the replay did not write, were not read; of pgbench's, only
    # the blocks the WAL names (and those past where they ended).
    assert 0 < int(line["relation_files_unread"]) < int(line["relation_files"]), line
    assert int(line["relation_files_partly_read"]) > 0 and int(line["blocks_read_of_those"]) > 0, line
    assert snapshot_below(timeline, second) == (second, "stopped")
    again, snapshot = pg.restore(timeline.url, "at_second", second)
    assert snapshot == second
    start_promoted_quietly(again)
    assert again.psql(BALANCED) == "t"
    assert again.psql("SELECT sum(abalance) FROM pgbench_accounts") == total
    again.stop()

    # The timeline goes: so does the copy of its cluster.
    ps.http.timeline_delete(timeline.tenant_id, timeline.timeline_id)
    wait_until(lambda: not replay_dir.exists(), timeout=60, what="the kept directory removed with its timeline")


@pytest.mark.needs_testing
@pytest.mark.timeout(600)
@pytest.mark.parametrize("step", ["background-snapshot-before-replay", "background-snapshot-before-import"])
def test_kill_during_a_background_snapshot(pg: PgEnv, pageserver_factory: PageserverFactory, step: str):
    """The pageserver is killed with `kill -9` while a snapshot waits at `step`: after the
    restart the timeline has no snapshot past the first, nothing of the attempt is stored, and the
    receiver's next attempt makes the snapshot."""
    ps = pageserver_factory.start(snapshot_settings(pg))
    timeline = TimelineHandle.create(ps)
    ps.http.configure_failpoints((step, "pause"))
    primary = start_streaming(pg, timeline, ingest_pages=False)
    first, _ = snapshot_below(timeline, Lsn.parse(timeline.info()["last_record_lsn"]))
    end = write_then_more(primary, 200)
    replay_dir = pg.base / "snapshot_replay"
    # The failpoint comes after the directory is made (and, before the import, replayed).
    def at_step() -> bool:
        if not (receiver(timeline).json()["snapshot_running"] and (replay_dir / "global").exists()):
            return False
        # Replayed and finished: recovery's files gone (the archive's standby.signal, then the
        # replay's recovery.signal).
        signals = [replay_dir / "recovery.signal", replay_dir / "standby.signal"]
        return step == "background-snapshot-before-replay" or not any(s.exists() for s in signals)

    wait_until(at_step, timeout=120, what=f"a snapshot at {step}")
    before = timeline.info()["last_record_lsn"]
    ps.kill()
    ps.start()
    # Nothing of the attempt: the timeline is where it was, its newest snapshot the first.
    assert timeline.info()["last_record_lsn"] == before
    assert snapshot_below(timeline, Lsn.parse(before)) == (first, "backup")
    made = wait_snapshot_past(timeline, end)
    assert snapshot_below(timeline, made) == (made, "stopped")
    wait_until(lambda: not receiver(timeline).json()["snapshot_running"] and kept_idle(replay_dir), timeout=120, what="the snapshots done, their directory idle")
    restored, snapshot = pg.restore(timeline.url, "restored", made)
    assert snapshot == made
    start_promoted_quietly(restored)
    assert restored.psql("SELECT count(*) FROM pgbench_history") == primary.psql("SELECT count(*) FROM pgbench_history")


def test_snapshots_say_why_they_cannot_run(pg: PgEnv, pageserver_factory: PageserverFactory):
    """Programs that are not there: the receiver streams on, and its state says why no
    snapshot is made."""
    settings = snapshot_settings(pg)
    settings["pg_bin_dir"] = str(pg.base / "no-such-dir")
    ps = pageserver_factory.start(settings)
    ps.allowed_errors.append("background snapshot: pg_bin_dir ")
    timeline = TimelineHandle.create(ps)
    primary = start_streaming(pg, timeline, ingest_pages=False)
    primary.pgbench("-c", "2", "-t", "200", "-n")
    end = Lsn.parse(primary.psql("SELECT pg_current_wal_flush_lsn()"))
    wait_flushed(timeline, end)
    state = wait_until(lambda: (s := receiver(timeline).json())["snapshot_error"] and s, timeout=60, what="the error")
    assert "no postgres program there" in state["snapshot_error"], state
    assert state["state"] == "streaming"
    # Tried again, and said once while the reason stays the same.
    wait_until(lambda: re.search(r'pageserver_background_snapshots_total\{result="error"\} ([2-9]|\d\d)', ps.http.metrics_text()), timeout=60, what="a second attempt")
    assert ps.log_text().count("background snapshot: pg_bin_dir ") == 1


@pytest.mark.timeout(600)
def test_a_primary_that_shuts_down_does_not_hold_page_ingest(pg: PgEnv, pageserver_factory: PageserverFactory):
    """The primary writes more than the distance, then shuts down cleanly: nothing comes after
    its shutdown checkpoint. The snapshots due are made all the same (a snapshot needs no record
    after its own: the replay stops at one put there), and page ingest gets to the end."""
    ps = pageserver_factory.start(snapshot_settings(pg))
    ps.allowed_errors.append("WAL receiver: ")
    timeline = TimelineHandle.create(ps)
    primary = start_streaming(pg, timeline)
    first, _ = snapshot_below(timeline, Lsn.parse(timeline.info()["last_record_lsn"]))
    write_then_more(primary, 200)
    primary.stop()
    end = Lsn.parse(receiver(timeline).json()["flushed_lsn"])
    wait_until(lambda: Lsn.parse(receiver(timeline).json()["pages_lsn"] or "0/0") >= end, timeout=120, what="page ingest to the shutdown checkpoint's end")
    made = wait_snapshot_past(timeline, first)
    assert first < made <= end
    assert snapshot_below(timeline, made) == (made, "stopped")


def replay_postmaster(replay_dir) -> int | None:
    """The pid of the postgres whose data directory is `replay_dir`, if one runs."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if args and args[0].endswith(b"postgres") and str(replay_dir).encode() in args:
            return int(entry)
    return None


@pytest.mark.timeout(600)
def test_the_replaying_postgresql_killed(pg: PgEnv, pageserver_factory: PageserverFactory):
    """The PostgreSQL that replays a snapshot is killed with `kill -9` mid-replay: the attempt
    fails saying so, nothing is imported, and the next attempt makes the snapshot."""
    ps = pageserver_factory.start(snapshot_settings(pg))
    ps.allowed_errors.append("background snapshot: the replay to ")
    timeline = TimelineHandle.create(ps)
    primary = start_streaming(pg, timeline, ingest_pages=False)
    first, _ = snapshot_below(timeline, Lsn.parse(timeline.info()["last_record_lsn"]))
    end = write_then_more(primary, 300)
    replay_dir = pg.base / "snapshot_replay"
    pid = wait_until(lambda: replay_postmaster(replay_dir), timeout=120, interval=0.01, what="the replay running")
    os.kill(pid, 9)
    state = wait_until(lambda: (s := receiver(timeline).json())["snapshot_error"] and s, timeout=60, what="the failed attempt")
    assert "the replay to" in state["snapshot_error"], state
    assert snapshot_below(timeline, Lsn.parse(timeline.info()["last_record_lsn"])) == (first, "backup")
    made = wait_snapshot_past(timeline, end)
    assert snapshot_below(timeline, made) == (made, "stopped")
    assert receiver(timeline).json()["snapshot_error"] is None
    restored, snapshot = pg.restore(timeline.url, "restored", made)
    assert snapshot == made
    start_promoted_quietly(restored)
    assert restored.psql("SELECT count(*) FROM pgbench_history") == primary.psql("SELECT count(*) FROM pgbench_history")


def newest_snapshot(timeline: TimelineHandle) -> Lsn:
    """The newest snapshot at or below the timeline's last record."""
    return snapshot_below(timeline, Lsn.parse(timeline.info()["last_record_lsn"]))[0]


def wait_newer_snapshot(timeline: TimelineHandle, than: Lsn) -> Lsn:
    def newer() -> Lsn:
        newest = newest_snapshot(timeline)
        assert newest > than
        return newest

    return wait_until(newer, timeout=240, interval=0.5, what=f"a snapshot past {than}")


BALANCED = """SELECT (SELECT sum(abalance) FROM pgbench_accounts) = (SELECT coalesce(sum(delta), 0) FROM pgbench_history)
    AND (SELECT sum(tbalance) FROM pgbench_tellers) = (SELECT coalesce(sum(delta), 0) FROM pgbench_history)
    AND (SELECT sum(bbalance) FROM pgbench_branches) = (SELECT coalesce(sum(delta), 0) FROM pgbench_history)"""


@pytest.mark.timeout(900)
def test_background_snapshots_killed_at_random_points(pg: PgEnv, pageserver_factory: PageserverFactory):
    """Round after round, a snapshot is made while pgbench writes, and at a random moment of it
    (unpack, replay, import, commit: a delay drawn up to 1.2 times what one took with nothing
    killed) the pageserver or the replaying PostgreSQL gets `kill -9`. Each time a snapshot past
    the last one comes all the same; every one restores to a cluster whose pgbench balances add
    up (a half-imported snapshot mixes pages of two points); at the end every page of
    `pgbench_accounts` is exact at the newest, the replay's directory is idle, and a restore at
    the last LSN has the primary's rows. PAGESERVER_TEST_SNAPSHOT_KILLS rounds (default 4),
    PAGESERVER_TEST_SEED (default 1)."""
    rounds = int(os.environ.get("PAGESERVER_TEST_SNAPSHOT_KILLS", "4"))
    seed = int(os.environ.get("PAGESERVER_TEST_SEED", "1"))
    rng = random.Random(seed)
    ps = pageserver_factory.start(snapshot_settings(pg))
    ps.allowed_errors += ["background snapshot: ", "WAL receiver: "]
    timeline = TimelineHandle.create(ps)
    primary = start_streaming(pg, timeline)
    replay_dir = pg.base / "snapshot_replay"
    primary.psql("CREATE TABLE after_checkpoint (n int)")

    def write_then_due() -> None:
        primary.pgbench("-c", "2", "-t", "300", "-n")
        primary.psql("CHECKPOINT")
        primary.psql("INSERT INTO after_checkpoint VALUES (1)")

    def running_or_made(than: Lsn) -> bool:
        state = receiver(timeline).json()
        return state["snapshot_running"] or (state["snapshot_lsn"] is not None and Lsn.parse(state["snapshot_lsn"]) > than)

    def replay_or_over(replay_dir) -> int | None:
        """The replaying postmaster's pid; -1 when the snapshot is over; None meanwhile."""
        pid = replay_postmaster(replay_dir)
        if pid is not None:
            return pid
        return None if receiver(timeline).json()["snapshot_running"] else -1

    # One with nothing killed: how long a snapshot takes here (its log line says).
    newest = newest_snapshot(timeline)
    write_then_due()
    newest = wait_newer_snapshot(timeline, newest)
    took = float(re.findall(r"background snapshot made.* seconds=([\d.]+)", ps.log_text())[-1])

    kills = []
    for n in range(rounds):
        write_then_due()
        wait_until(lambda: running_or_made(newest), timeout=120, interval=0.01, what="a snapshot running")
        victim = rng.choice(["pageserver", "postgres"])
        # The kill's moment, drawn at random (the sleeps are not waits for anything): anywhere
        # in the snapshot for the pageserver; in the replay for PostgreSQL, if one runs.
        if victim == "postgres":
            pid = wait_until(lambda: replay_or_over(replay_dir), timeout=120, interval=0.005, what="the replay or the snapshot's end")
            time.sleep(rng.uniform(0, 0.15))
            try:
                os.kill(pid, 9) if pid > 0 else None
            except ProcessLookupError:
                pid = -1
            if pid < 0:
                victim = "pageserver"  # the replay was over: the pageserver, later than drawn
        else:
            time.sleep(rng.uniform(0, took * 1.2))
        if victim == "pageserver":
            ps.kill()
            ps.start()
        kills.append(victim)
        # Whether the attempt got through before the kill or not, a snapshot past the last one
        # comes, and it restores whole.
        newest = wait_newer_snapshot(timeline, newest)
        restored, snapshot = pg.restore(timeline.url, f"round{n}", newest)
        assert snapshot == newest
        start_promoted_quietly(restored)
        assert restored.psql(BALANCED) == "t", f"seed {seed}, round {n}, kills {kills}"
        restored.stop("immediate")

    wait_until(lambda: not receiver(timeline).json()["snapshot_running"] and kept_idle(replay_dir), timeout=240, interval=0.1, what="no snapshot running, its directory idle")
    newest = newest_snapshot(timeline)
    wait_ingested(timeline, newest)
    statuses = page_statuses(primary, timeline, "pgbench_accounts", newest)
    # Every block there is an image; those the table grew by after it are not there yet.
    missing = sorted(b for b, status in statuses.items() if status == 404)
    assert missing == list(range(len(statuses) - len(missing), len(statuses))), f"seed {seed}, kills {kills}: {statuses}"
    assert set(statuses.values()) <= {200, 404} and len(missing) < len(statuses), f"seed {seed}, kills {kills}: {statuses}"
    end = Lsn.parse(primary.psql("SELECT pg_current_wal_flush_lsn()"))
    wait_flushed(timeline, end)
    last, _ = pg.restore(timeline.url, "last", end)
    start_promoted_quietly(last)
    assert last.psql("SELECT count(*) FROM pgbench_history") == primary.psql("SELECT count(*) FROM pgbench_history")
    assert last.psql(BALANCED) == "t"


@pytest.mark.timeout(600)
def test_a_primary_configured_from_outside_its_data_directory(pg: PgEnv, pageserver_factory: PageserverFactory):
    """Debian's layout: the primary's postgresql.conf, pg_hba.conf and pg_ident.conf are in a
    directory of their own, so its pg_basebackup (the first snapshot) has none of them; and its
    ALTER SYSTEM asks for more shared memory than this host has. The replay runs on files of its
    own and 128 MB: the snapshot is made, and a restore from it, given the primary's files,
    has the primary's rows."""
    ps = pageserver_factory.start(snapshot_settings(pg))
    timeline = TimelineHandle.create(ps)
    primary = pg.new_cluster("primary")
    etc = make_owned_dir(pg.base / "etc")
    for name in ["postgresql.conf", "pg_hba.conf", "pg_ident.conf"]:
        shutil.move(primary.datadir / name, etc / name)
    outside = [f"config_file={etc / 'postgresql.conf'}", f"hba_file={etc / 'pg_hba.conf'}", f"ident_file={etc / 'pg_ident.conf'}"]
    primary.start("listen_addresses=127.0.0.1", *outside)
    primary.pgbench("-i", "-s", "1", "-q")
    primary.psql("ALTER SYSTEM SET shared_buffers = '1TB'")  # for its next start, which never comes
    pg.import_process(timeline.url, primary.basebackup_process())
    first = newest_snapshot(timeline)
    body = {"connstr": connstr(primary), "snapshot_wal_distance": DISTANCE}
    r = requests.put(f"{timeline.url}/wal_receiver", json=body, timeout=60)
    assert r.status_code == 200, r.text
    end = write_then_more(primary, 300)
    made = wait_snapshot_past(timeline, end)
    assert snapshot_below(timeline, made) == (made, "stopped")
    assert receiver(timeline).json()["snapshot_error"] is None

    restored, snapshot = pg.restore(timeline.url, "restored", made)
    assert snapshot == made
    assert not (restored.datadir / "postgresql.conf").exists()
    restored.start(*outside, "shared_buffers=128MB", "autovacuum=off")
    wait_until(lambda: restored.psql("SELECT pg_is_in_recovery()") == "f", timeout=60, what="promotion")
    assert restored.psql("SELECT count(*) FROM pgbench_history") == primary.psql("SELECT count(*) FROM pgbench_history")


@pytest.mark.timeout(600)
def test_a_snapshot_keeps_prepared_transactions_and_commit_timestamps(pg: PgEnv, pageserver_factory: PageserverFactory):
    """Transactions prepared before a snapshot, one before the writes and one after, still
    prepared at it, in a cluster that tracks commit timestamps: a restore at the snapshot
    (which replays nothing: the replay's restartpoint at the snapshot wrote their state out)
    has them prepared, their rows there once committed; commit timestamps of the newest
    transactions read back; transaction ids go on past those the WAL below it used. A restore
    past it replays from it with the same."""
    ps = pageserver_factory.start(snapshot_settings(pg))
    timeline = TimelineHandle.create(ps)
    settings = ("max_prepared_transactions=30", "track_commit_timestamp=on")
    primary = start_streaming(pg, timeline, False, DISTANCE, *settings)
    first = newest_snapshot(timeline)
    primary.psql("CREATE TABLE prepared_rows (n int)")
    primary.psql("BEGIN; INSERT INTO prepared_rows VALUES (0); PREPARE TRANSACTION 'p0'")
    primary.pgbench("-c", "2", "-t", "300", "-n")
    primary.psql("BEGIN; INSERT INTO prepared_rows VALUES (1); PREPARE TRANSACTION 'p1'")
    primary.psql("BEGIN; INSERT INTO prepared_rows VALUES (2); PREPARE TRANSACTION 'p2'")
    primary.psql("COMMIT PREPARED 'p2'")
    end = Lsn.parse(primary.psql("SELECT pg_current_wal_insert_lsn()"))
    fill(primary)
    made = wait_snapshot_past(timeline, end)
    assert first < made

    def check(cluster: PgCluster) -> None:
        with (cluster.datadir / "postgresql.conf").open("a") as conf:
            conf.write("max_prepared_transactions = 30\ntrack_commit_timestamp = on\n")
        start_promoted_quietly(cluster)
        assert cluster.psql(BALANCED) == "t"
        assert cluster.psql("SELECT string_agg(gid, ',' ORDER BY gid) FROM pg_prepared_xacts") == "p0,p1"
        newest = cluster.psql("SELECT max(xmin::text::bigint) FROM pgbench_history")
        assert cluster.psql(f"SELECT pg_xact_commit_timestamp('{newest}'::xid) IS NOT NULL") == "t"
        assert int(cluster.psql("SELECT txid_current()")) > int(newest)
        for gid in ["p0", "p1"]:
            cluster.psql(f"COMMIT PREPARED '{gid}'")
        assert cluster.psql("SELECT string_agg(n::text, ',' ORDER BY n) FROM prepared_rows") == "0,1,2"

    restored, snapshot = pg.restore(timeline.url, "at_snapshot", made)
    assert snapshot == made
    check(restored)
    assert "redo is not required" in restored.log.read_text()
    restored.stop("immediate")

    primary.psql("CREATE TABLE after_run AS SELECT 1 AS one")
    past_end = Lsn.parse(primary.psql("SELECT pg_current_wal_flush_lsn()"))
    wait_flushed(timeline, past_end)
    past, snapshot = pg.restore(timeline.url, "past_snapshot", past_end)
    assert made <= snapshot < past_end
    check(past)
    assert past.psql("SELECT count(*) FROM after_run") == "1"
