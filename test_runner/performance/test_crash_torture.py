"""Crash torture: `kill -9` at random moments while the server ingests, flushes, compacts, makes
image layers, collects garbage, uploads to remote storage and evicts and downloads layers; a
restart and a check against the reference model after every kill.

Each round starts a writer that ingests batches without pause, starts one operation (a flush, a
compaction, a forced image pass, a GC, or none, leaving the background loops and the uploads to
run on their own), and kills the server after a random delay drawn from 0 to 1.5 times how long
that operation took the last time it ran to the end, so most kills land inside it. After each
restart:

- the server reports `last_record_lsn == disk_consistent_lsn`, and that LSN is at or above the
  highest `disk_consistent_lsn` it ever reported: nothing durable was lost;
- every key reads as the model says at every version's LSN (and just before and after it) up to
  there, which opens every layer a read needs: no layer is unreadable;
- no temporary or ephemeral file the kill left survives startup (told apart by inode from the
  ones the restarted server's background work makes at once);
- the store's newest index, read while the server is down, lists only objects the store holds
  (of the sizes and checksums it says) and covers the highest `remote_consistent_lsn` ever
  reported, and after the restart `remote_consistent_lsn` is at or above it;
- the batch the kill cut off is wholly durable or wholly lost; the rest is sent again.

Everything is logged to test_output/perf/crash_torture.json: kills per operation, how many
landed while the operation was still running, and the restarts' times.

Settings (environment): TORTURE_KILLS (default 40; the recorded run in docs/benchmarks.md used
500), TORTURE_SEED (default 1), TORTURE_REMOTE (`local`, the default, or `s3` for moto).

    PAGESERVER_BIN=target/release/pageserver TORTURE_KILLS=500 \\
        .venv/bin/pytest test_runner/performance/test_crash_torture.py -m performance -s
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import pytest
import requests

from fixtures.binary import REPO_ROOT
from fixtures.http import PageserverApiError
from fixtures.ingest import Record, Workload, key
from fixtures.pageserver import Pageserver
from fixtures.plugin import PageserverFactory
from fixtures.remote_storage import RemoteStore
from fixtures.timeline import TimelineHandle
from fixtures.utils import Lsn

KILLS = int(os.environ.get("TORTURE_KILLS", "40"))
SEED = int(os.environ.get("TORTURE_SEED", "1"))
REMOTE = os.environ.get("TORTURE_REMOTE", "local")
KEYS = [key(i) for i in range(24)]
# Everything small and frequent, so that every background task has work in every round: a
# flush every 32 KiB or 200 ms, compaction at 2 L0 layers, images once 2 runs of L1s stack, GC
# keeping 4 KiB of LSN history, uploads after every flush, and a local layer budget so small
# that layers are evicted and downloaded again on demand.
CONFIG = {
    "checkpoint_distance": "32KiB",
    "checkpoint_timeout": "200ms",
    "compaction_target_size": "64KiB",
    "compaction_threshold": 2,
    "image_creation_threshold": 2,
    "gc_horizon": 4096,
    "max_local_layer_bytes": "512KiB",
}
CONNECTION_LOST = (requests.exceptions.ConnectionError, requests.exceptions.ChunkedEncodingError)
# Seconds the first kill of an operation waits at most, before its duration is known.
FIRST_DELAY = 0.05
# The round without an operation of its own: the writer, the flushes it causes, and the
# background compaction, image, GC, upload and eviction work they cause.
BACKGROUND = "ingest and background work"


def inode(path: Path) -> Optional[int]:
    try:
        return path.stat().st_ino
    except FileNotFoundError:
        return None


class Writer(threading.Thread):
    """Ingests batches until stopped or until the server dies under it; then `cut_off` holds
    the batch whose answer the kill swallowed, if any."""

    def __init__(self, timeline: TimelineHandle, work: Workload):
        super().__init__(daemon=True)
        self.timeline = timeline
        self.work = work
        self.http = timeline.ps.http_client()
        self.stop = threading.Event()
        self.cut_off: list[list[Record]] = []
        self.batches = 0
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                batch = self.work.batch(max_records=8)
                try:
                    self.timeline.ingest(batch, http=self.http)
                except CONNECTION_LOST:
                    self.cut_off = [batch]
                    return
                self.batches += 1
        except BaseException as e:  # noqa: BLE001 - re-raised by the test
            self.error = e
        finally:
            self.http.close()


class Operation(threading.Thread):
    """One HTTP operation; `done` is set when its answer came back, `died` when the kill
    came first."""

    def __init__(self, call: Callable[[], object]):
        super().__init__(daemon=True)
        self.call = call
        self.done = threading.Event()
        self.died = False
        self.error: Optional[BaseException] = None
        self.seconds = 0.0

    def run(self) -> None:
        start = time.monotonic()
        try:
            self.call()
            self.seconds = time.monotonic() - start
            self.done.set()
        except CONNECTION_LOST:
            self.died = True
        except PageserverApiError as e:
            # A request that reached a server being killed may be answered 503 (shutting down).
            if e.status_code != 503:
                self.error = e
            self.died = True
        except BaseException as e:  # noqa: BLE001 - re-raised by the test
            self.error = e


def operations(ps: Pageserver, timeline: TimelineHandle) -> dict[str, Callable[[], object]]:
    t, tl = timeline.tenant_id, timeline.timeline_id

    def client() -> object:
        return ps.http_client(timeout=60)

    return {
        BACKGROUND: lambda: None,
        "flush": lambda: client().checkpoint(t, tl),
        "compaction": lambda: client().compact(t, tl),
        "image creation": lambda: client().compact(t, tl, force_images=True),
        "gc": lambda: client().gc(t, tl),
    }


@pytest.mark.timeout(60 + 15 * KILLS)
def test_crash_torture(pageserver_factory: PageserverFactory, test_output_dir: Path, request: pytest.FixtureRequest):
    if REMOTE == "s3":
        store = RemoteStore("s3", moto=request.getfixturevalue("moto_server"))
    else:
        store = RemoteStore("local", root=test_output_dir / "remote_storage")
    ps = pageserver_factory.start(CONFIG, remote=store)
    timeline = TimelineHandle.create(ps)
    rng = random.Random(SEED)
    work = Workload(SEED, KEYS)
    ops = operations(ps, timeline)
    # How long each operation last took when it ran to the end.
    took: dict[str, float] = {}
    stats = {name: {"kills": 0, "while_running": 0} for name in ops}
    remote_reported = Lsn(0)
    restarts: list[float] = []
    # Kills that came while flushed layers were still on their way to the store.
    uploads_pending = 0
    # Temporary and ephemeral files the kills left, all removed by the restarts.
    leftovers_removed = 0
    started = time.monotonic()

    for kill_no in range(KILLS):
        name = rng.choice(list(ops))
        writer = Writer(timeline, work)
        writer.start()
        # Some history first, so that the operation has something to do.
        history = rng.randint(1, 6)
        while writer.batches < history and writer.is_alive():
            time.sleep(0.001)
        op = Operation(ops[name])
        op.start()
        if name == BACKGROUND:
            # No operation of its own: a moment within a flush period or two.
            delay = rng.uniform(0, 0.4)
        else:
            delay = rng.uniform(0, 1.5 * took.get(name, FIRST_DELAY))
        killed_at = time.monotonic() + delay
        while time.monotonic() < killed_at and (name == BACKGROUND or not op.done.is_set()):
            time.sleep(0.0005)
        if not op.done.is_set():
            stats[name]["while_running"] += 1
        try:
            info = timeline.info()
            remote_reported = max(remote_reported, Lsn.parse(info["remote_consistent_lsn"]))
            if info["remote_consistent_lsn"] != info["disk_consistent_lsn"]:
                uploads_pending += 1
        except (*CONNECTION_LOST, PageserverApiError):
            pass
        ps.kill()
        stats[name]["kills"] += 1
        writer.join(timeout=30)
        op.join(timeout=30)
        for thread in (writer, op):
            if thread.error is not None:
                raise thread.error
        if op.done.is_set() and op.seconds:
            took[name] = op.seconds
        # While nothing runs, the store is as the crash left it: its newest index must list
        # only objects it holds, and cover everything reported uploaded.
        index = store.check_consistent(timeline.tenant_id, timeline.timeline_id)
        assert Lsn.parse(index["disk_consistent_lsn"]) >= remote_reported, f"kill {kill_no} ({name}): {index}"

        # The crash's temporary and ephemeral files, by inode: startup must remove every one.
        # (The restarted server's own background work makes new ones at once, some under the
        # same names, such as a download of the same layer.)
        crashed = {p.stat().st_ino: p for p in ps.leftovers()}
        begin = time.monotonic()
        ps.start()
        restarts.append(time.monotonic() - begin)
        survivors = [p for p in ps.leftovers() if crashed.get(inode(p)) == p]
        assert not survivors, f"kill {kill_no} ({name}): left behind after startup: {survivors}"
        leftovers_removed += len(crashed)
        timeline.recover(in_flight=writer.cut_off)
        info = timeline.info()
        remote_now = Lsn.parse(info["remote_consistent_lsn"])
        assert remote_now >= remote_reported, f"kill {kill_no} ({name}): remote_consistent_lsn went back from {remote_reported} to {remote_now}"

    # At the end: everything the model holds, read at every version.
    reads = timeline.verify(samples_per_key=10_000)
    summary = {
        "kills": KILLS,
        "seed": SEED,
        "remote": REMOTE,
        "per_operation": stats,
        "kills_while_running": sum(s["while_running"] for s in stats.values()),
        "kills_with_uploads_pending": uploads_pending,
        "crash_leftovers_removed_at_startup": leftovers_removed,
        "operation_seconds_last": took,
        "restart_seconds": {
            "median": sorted(restarts)[len(restarts) // 2],
            "max": max(restarts),
        },
        "reads_checked_at_the_end": reads,
        "records_in_model": sum(len(b) for b in timeline.model.batches),
        "disk_consistent_lsn": str(timeline.lsns()[1]),
        "remote_consistent_lsn": str(Lsn.parse(timeline.info()["remote_consistent_lsn"])),
        "layers": timeline.info()["layers"],
        "wall_seconds": round(time.monotonic() - started, 1),
    }
    perf_dir = REPO_ROOT / "test_output" / "perf"
    perf_dir.mkdir(parents=True, exist_ok=True)
    (perf_dir / "crash_torture.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"\ncrash_torture: {json.dumps(summary)}")
