"""Soak: `pagebench soak` for SOAK_DURATION (default 30m) of mixed load on a release server,
restarted gracefully every SOAK_RESTART_EVERY (default 5m): HTTP GetPage and gRPC GetPages
closed loops, paced ingest and scans, and checkpoint, compaction and GC calls (see
pagebench/src/soak.rs for the load).

It passes when no request failed; the resident memory of every server process peaks within
10 % of the others (with restarts: each process warms up again, so their peaks are what must
not climb; without, SOAK_RESTART_EVERY=0s, the intervals after warm-up must stay within 10 %);
it stays under the configured caches plus RSS_CONSTANT_MIB after warm-up; and the open file
descriptors stay within FD_SPREAD of each other.
The summary goes to test_output/perf/soak.json, the rows to soak.csv, and the plot to soak.png
(scripts/plot-soak); docs/benchmarks.md has the recorded run.

    cargo build --release -p pageserver -p pagebench --bins
    PAGESERVER_BIN=target/release/pageserver .venv/bin/pytest test_runner/performance/test_soak.py -m performance -s
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from fixtures.binary import REPO_ROOT, pagebench_binary
from fixtures.ports import PortDistributor

DURATION = os.environ.get("SOAK_DURATION", "30m")
RESTART_EVERY = os.environ.get("SOAK_RESTART_EVERY", "5m")
INTERVAL = os.environ.get("SOAK_INTERVAL", "1m")
# The caches the server is configured with: page_cache_size (64 MiB, set by pagebench soak)
# and scan_cursor_cache_size (16 MiB, the default).
CACHES_MIB = 64 + 16
# What the server holds besides its caches under this load: the runtime and its threads, the
# in-memory layer's index, connection buffers, layer indexes' metadata. Stated from the
# recorded run (docs/benchmarks.md), with room.
RSS_CONSTANT_MIB = 96
FD_SPREAD = 32
RSS_SPREAD_PCT = 10.0


def humantime_seconds(text: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600}
    return int(text[:-1]) * units[text[-1]]


@pytest.mark.timeout(humantime_seconds(DURATION) + 600)
def test_soak(port_distributor: PortDistributor, tmp_path):
    pageserver = os.environ.get("PAGESERVER_BIN", str(REPO_ROOT / "target" / "release" / "pageserver"))
    perf_dir = REPO_ROOT / "test_output" / "perf"
    perf_dir.mkdir(parents=True, exist_ok=True)
    csv_path = perf_dir / "soak.csv"
    cmd = [
        str(pagebench_binary()), "soak",
        "--pageserver", pageserver,
        "--workdir", str(tmp_path / "soak"),
        "--port", str(port_distributor.get_port()),
        "--grpc-port", str(port_distributor.get_port()),
        "--duration", DURATION,
        "--interval", INTERVAL,
        "--restart-every", RESTART_EVERY,
        "--csv", str(csv_path),
        "--json",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=humantime_seconds(DURATION) + 300)
    assert out.stdout, f"{' '.join(cmd)} exited {out.returncode} without a summary:\n{out.stderr[-4000:]}"
    summary = json.loads(out.stdout)
    (perf_dir / "soak.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"\nsoak: {json.dumps({k: v for k, v in summary.items() if k != 'rows'})}")
    plotted = subprocess.run([str(REPO_ROOT / "scripts" / "plot-soak"), str(csv_path), str(perf_dir / "soak.png")], capture_output=True, text=True)
    if plotted.returncode != 0:
        print(f"no plot: {plotted.stderr[-2000:]}")

    assert summary["errors"] == 0, f"{summary['errors']} failed requests:\n{out.stderr[-4000:]}"
    assert out.returncode == 0, out.stderr[-4000:]
    warm = summary["after_warmup"]
    if summary["restarts"] > 0:
        # Each restart starts a warm-up again: compare each server process's peak.
        assert summary["process_peaks"]["spread_pct"] <= RSS_SPREAD_PCT, summary["process_peaks"]
    else:
        assert warm["rss_max_mib"]["spread_pct"] <= RSS_SPREAD_PCT, warm
    assert warm["rss_max_mib"]["max"] <= CACHES_MIB + RSS_CONSTANT_MIB, warm
    assert warm["fds"]["max"] - warm["fds"]["min"] <= FD_SPREAD, warm
