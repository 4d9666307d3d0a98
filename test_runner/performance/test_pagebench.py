"""pagebench scenarios against a real pageserver: hot GetPage at 1 and 4 clients and HTTP
ingest, each with the `/v1/status` baseline pagebench measures in the same run.

They report, they do not pass or fail on speed: each prints pagebench's JSON summary and writes
it to test_output/perf/<test>.json; a test fails only if a request failed or a page was wrong.
Results and goals are in docs/benchmarks.md. Use release builds:

    cargo build --release -p pageserver -p pagebench --bins
    PAGESERVER_BIN=target/release/pageserver .venv/bin/pytest test_runner/performance -m performance -s
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from fixtures.binary import REPO_ROOT, pagebench_binary
from fixtures.plugin import PageserverFactory

KEYS = 4096  # 32 MiB of pages: all fit in the 64 MiB page cache, so GetPage is hot
DURATION = os.environ.get("PAGEBENCH_DURATION", "10s")
SERVER_CONFIG = {"page_cache_size": "64MiB", "checkpoint_distance": "64MiB"}


def pagebench(endpoint: str, *args: str) -> dict:
    """Runs one pagebench command with --json and returns its summary; a failed request or a
    wrong page fails the test."""
    cmd = [str(pagebench_binary()), "--endpoint", endpoint, "--threads", "1", *args, "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"{' '.join(cmd)} exited {out.returncode}:\n{out.stderr}"
    return json.loads(out.stdout)


def record(name: str, summary: dict) -> None:
    perf_dir = REPO_ROOT / "test_output" / "perf"
    perf_dir.mkdir(parents=True, exist_ok=True)
    (perf_dir / f"{name}.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"\n{name}: {json.dumps(summary)}")


@pytest.mark.parametrize("clients", [1, 4])
def test_getpage_hot(pageserver_factory: PageserverFactory, clients: int):
    ps = pageserver_factory.start(SERVER_CONFIG)
    prepared = pagebench(ps.base_url, "prepare", "--keys", str(KEYS))
    summary = pagebench(
        ps.base_url,
        "getpage",
        "--tenant", prepared["tenant_id"],
        "--timeline", prepared["timeline_id"],
        "--keys", str(KEYS),
        "--clients", str(clients),
        "--duration", DURATION,
    )
    record(f"getpage_hot_{clients}_clients", summary)
    assert summary["errors"] == 0
    assert summary["requests"] > 0 and summary["baseline"]["requests_per_sec"] > 0


def test_ingest_http(pageserver_factory: PageserverFactory):
    ps = pageserver_factory.start(SERVER_CONFIG)
    summary = pagebench(
        ps.base_url,
        "ingest",
        "--clients", "1",
        "--batch-size", "256",
        "--value-size", "8192",
        "--duration", DURATION,
    )
    record("ingest_http_1_client", summary)
    assert summary["errors"] == 0
    # Whatever it ingested reads back after a restart: the run was real work, not a rehearsal.
    ps.restart()
    assert ps.http.tenant_list(), "the ingest tenant survives a restart"
