"""The WAL receiver under faults: the pageserver killed again and again under a synchronous
primary, the network cut or stalled, the primary restarted or killed, its slot dropped by hand.
Each time: a clear state, streaming resumes by itself, the WAL stored is the primary's byte for
byte with no gap, and nothing a client was told is committed goes missing."""

from __future__ import annotations

import random
import re
import threading

import requests

from fixtures.pageserver import Pageserver
from fixtures.plugin import PageserverFactory
from fixtures.postgres import PgCluster, PgEnv
from fixtures.remote_storage import TcpProxy
from fixtures.timeline import TimelineHandle
from fixtures.utils import Lsn, wait_until
from fixtures.wal_stream import check_wal_equal, connstr, primary_with_snapshot, receiver, start_promoted, wait_flushed

HISTORY = "SELECT count(*) FROM pgbench_history"


def make_synchronous(primary: PgCluster, name: str) -> None:
    primary.psql(f"ALTER SYSTEM SET synchronous_standby_names = '{name}'")
    primary.psql("SELECT pg_reload_conf()")


def flush_lsn(primary: PgCluster) -> Lsn:
    return Lsn.parse(primary.psql("SELECT pg_current_wal_flush_lsn()"))


def wait_state(timeline: TimelineHandle, *states: str, timeout: float = 30) -> dict:
    def in_state() -> dict:
        state = receiver(timeline).json()
        assert state["state"] in states, state
        return state

    return wait_until(in_state, timeout=timeout, interval=0.05, what=f"the receiver {'/'.join(states)}")


def test_kill_9_twenty_times_under_a_synchronous_primary_loses_no_acknowledged_commit(
    pg: PgEnv, pageserver_factory: PageserverFactory
):
    ps = pageserver_factory.start()
    timeline = TimelineHandle.create(ps)
    primary = primary_with_snapshot(pg, timeline)
    r = requests.put(f"{timeline.url}/wal_receiver", json={"connstr": connstr(primary)}, timeout=60)
    assert r.status_code == 200, r.text
    make_synchronous(primary, r.json()["application_name"])
    output: dict[str, str] = {}
    # Each commit returns to pgbench only once the pageserver has fsynced it.
    bench = threading.Thread(target=lambda: output.setdefault("out", primary.pgbench("-c", "2", "-T", "25")))
    bench.start()
    rng = random.Random(27)
    kills = 0
    while bench.is_alive() and kills < 20:
        wait_state(timeline, "streaming")
        threading.Event().wait(rng.uniform(0.05, 0.8))  # a random moment of the stream
        ps.kill()
        kills += 1
        ps.start()
    bench.join(timeout=120)
    assert not bench.is_alive(), "pgbench did not finish after the last restart"
    assert kills >= 10, f"only {kills} kills happened while pgbench ran"
    acknowledged = int(re.search(r"number of transactions actually processed: (\d+)", output["out"]).group(1))
    end = flush_lsn(primary)
    wait_flushed(timeline, end)
    assert check_wal_equal(primary, timeline, end) >= 1
    restored, _ = pg.restore(timeline.url, "after_kills", end)
    start_promoted(restored)
    # Every transaction pgbench was told committed is there, and nothing else.
    assert int(restored.psql(HISTORY)) == acknowledged == int(primary.psql(HISTORY))
    restored.stop("immediate")


def test_a_cut_or_stalled_network_and_a_restarted_or_killed_primary_resume_with_no_gap(
    pg: PgEnv, pageserver_factory: PageserverFactory
):
    ps = pageserver_factory.start({"wal_receiver_timeout": "2s"})
    # Each fault is logged as the receiver meets it.
    ps.allowed_errors.append("WAL receiver: ")
    timeline = TimelineHandle.create(ps)
    primary = primary_with_snapshot(pg, timeline)
    proxy = TcpProxy(primary.port)
    through_proxy = f"host=127.0.0.1 port={proxy.port} user=postgres sslmode=disable"
    r = requests.put(f"{timeline.url}/wal_receiver", json={"connstr": through_proxy}, timeout=60)
    assert r.status_code == 200, r.text

    # Cut: the receiver says so, retries, and goes on where it was once the network is back.
    proxy.down()
    state = wait_state(timeline, "waiting_retry", "connecting")
    primary.pgbench("-c", "2", "-t", "100")  # not synchronous: the primary goes on alone
    state = receiver(timeline).json()
    assert state["last_error"], state
    proxy.resume()
    end = flush_lsn(primary)
    wait_flushed(timeline, end)
    assert check_wal_equal(primary, timeline, end) >= 1

    # Stalled: no byte moves, the connection stays open. wal_receiver_timeout ends it.
    proxy.stall()
    primary.pgbench("-c", "2", "-t", "50")
    state = wait_state(timeline, "waiting_retry", "connecting", timeout=30)
    assert "sent nothing" in (state["last_error"] or ""), state
    proxy.resume()
    end = flush_lsn(primary)
    wait_flushed(timeline, end)
    assert check_wal_equal(primary, timeline, end) >= 1

    # The primary restarted, then killed (immediate stop: it recovers its own WAL at start).
    for mode in ("fast", "immediate"):
        primary.stop(mode)
        wait_state(timeline, "waiting_retry", "connecting")
        primary.start("listen_addresses=127.0.0.1")
        primary.pgbench("-c", "2", "-t", "50")
        end = flush_lsn(primary)
        wait_flushed(timeline, end)
        assert check_wal_equal(primary, timeline, end) >= 1
    count = primary.psql(HISTORY)
    restored, _ = pg.restore(timeline.url, "after_faults", end)
    start_promoted(restored)
    assert restored.psql(HISTORY) == count
    restored.stop("immediate")
    proxy.close()


def test_a_slot_dropped_by_hand_is_made_again_and_streaming_goes_on(pg: PgEnv, pageserver: Pageserver, timeline: TimelineHandle):
    pageserver.allowed_errors.append("WAL receiver: ")
    primary = primary_with_snapshot(pg, timeline)
    r = requests.put(f"{timeline.url}/wal_receiver", json={"connstr": connstr(primary)}, timeout=60)
    assert r.status_code == 200, r.text
    slot = r.json()["slot_name"]
    primary.pgbench("-c", "2", "-t", "50")
    wait_flushed(timeline, flush_lsn(primary))
    # An operator drops it: the walsender is ended first (an active slot cannot be dropped),
    # and the slot dropped before the receiver is back.
    def drop() -> bool:
        # The receiver may be back between the two: then the drop fails and is tried again.
        primary.psql(
            f"SELECT pg_terminate_backend(active_pid, 5000) FROM pg_replication_slots WHERE slot_name = '{slot}' AND active_pid IS NOT NULL;"
            f" SELECT pg_drop_replication_slot('{slot}')"
        )
        return True

    wait_until(drop, timeout=30, interval=0.01, what="the slot dropped by hand")
    primary.pgbench("-c", "2", "-t", "50")
    end = flush_lsn(primary)
    # The receiver makes it again (the primary still has the WAL it needs) and goes on.
    wait_flushed(timeline, end)
    assert primary.psql(f"SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}'") == "1"
    assert check_wal_equal(primary, timeline, end) >= 1
