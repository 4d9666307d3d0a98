"""Paged scans over HTTP through a real pageserver: whole scans of a branch against the same
scans of its parent, in the same run (the parent at the branch point is the baseline).

The data is the regression test `test_branch_at_a_snapshot_diverges_from_its_parent`'s: a
pgbench cluster (scale 1) imported twice, a branch at the second snapshot, and one snapshot of
a cluster restored from the branch and changed, imported into the branch. Each round scans, in
turn, the parent at the branch point, the branch there, and the branch at its newest LSN,
1000 entries a page (the API's largest), continuing with each page's token, as that test's
`scan_all` does.

It reports, it does not pass or fail on speed: per case, the median whole-scan time of
SCAN_HTTP_ROUNDS rounds (default 5), pages/s, the ratio to the baseline, and per page the
server's part (time to the response's headers: the scan and the JSON body, written before the
headers go) and the client's (the body's transfer and JSON parsing). It writes them to
test_output/perf/scan_http_branch.json; the test fails only if the branch at its branch point
does not scan exactly as its parent there. Results are in docs/benchmarks.md. Use release
builds (the suite's debug build works too, and shows what the regression tests pay):

    cargo build --release -p pageserver --bins
    PAGESERVER_BIN=target/release/pageserver .venv/bin/pytest test_runner/performance/test_scan_http.py -m performance -s
"""

from __future__ import annotations

import json
import os
import statistics
import time

from fixtures.binary import REPO_ROOT
from fixtures.plugin import PageserverFactory
from fixtures.postgres import PgEnv
from fixtures.timeline import TimelineHandle
from fixtures.utils import Lsn

ROUNDS = int(os.environ.get("SCAN_HTTP_ROUNDS", "5"))
PAGE_LIMIT = 1000
# The server's default page cache.
SERVER_CONFIG = {"page_cache_size": "64MiB"}


def whole_scan(timeline: TimelineHandle, lsn: Lsn) -> tuple[dict[str, str], list[float], list[float]]:
    """Every key with its page (base64) as of `lsn`, and each page's server and total seconds."""
    pages: dict[str, str] = {}
    server: list[float] = []
    total: list[float] = []
    token = None
    while True:
        start = time.perf_counter()
        r = timeline.http.scan_keys_response(
            timeline.tenant_id, timeline.timeline_id, bytes(18), b"\xff" * 18, lsn, limit=PAGE_LIMIT, page_token=token
        )
        page = r.json()
        total.append(time.perf_counter() - start)
        server.append(r.elapsed.total_seconds())
        pages.update((e["key"], e["page"]) for e in page["entries"])
        token = page["next_page_token"]
        if token is None:
            return pages, server, total


def test_scan_of_a_branch_against_its_parent(pg: PgEnv, pageserver_factory: PageserverFactory):
    ps = pageserver_factory.start(SERVER_CONFIG)
    parent = TimelineHandle.create(ps)
    cluster = pg.new_cluster("source").start()
    cluster.pgbench("-i", "-s", "1", "-q")
    cluster.stop()
    pg.import_process(parent.url, cluster.tar_process())
    cluster.start()
    cluster.pgbench("-t", "200", "-n")
    cluster.stop()
    second = Lsn.parse(pg.import_process(parent.url, cluster.tar_process())["lsn"])
    branch = parent.branch(second)
    work, _ = pg.restore(branch.url, "work", second)
    work.start()
    work.psql("CREATE TABLE branch_only AS SELECT g AS id FROM generate_series(1, 500) g")
    work.pgbench("-t", "100", "-n")
    work.stop()
    latest = Lsn.parse(pg.import_process(branch.url, work.tar_process())["lsn"])

    cases = {
        "parent@second": (parent, second),
        "branch@second": (branch, second),
        "branch@latest": (branch, latest),
    }
    whole: dict[str, list[float]] = {name: [] for name in cases}
    server: dict[str, list[float]] = {name: [] for name in cases}
    client: dict[str, list[float]] = {name: [] for name in cases}
    keys: dict[str, int] = {}
    pages: dict[str, int] = {}
    for i in range(ROUNDS):
        # Interleaved, so that whatever else the machine does weighs on every case alike.
        seen = {}
        for name, (timeline, lsn) in cases.items():
            entries, server_s, total_s = whole_scan(timeline, lsn)
            seen[name] = entries
            keys[name], pages[name] = len(entries), len(total_s)
            whole[name].append(sum(total_s))
            server[name].extend(server_s)
            client[name].extend(t - s for t, s in zip(total_s, server_s))
        if i == 0:
            assert seen["branch@second"] == seen["parent@second"], "the branch at its branch point scans as its parent"
            assert len(seen["branch@latest"]) > len(seen["parent@second"]) > 1000

    baseline = statistics.median(whole["parent@second"])
    summary = {
        "rounds": ROUNDS,
        "page_limit": PAGE_LIMIT,
        "cases": {
            name: {
                "keys": keys[name],
                "pages": pages[name],
                "scan_ms": round(statistics.median(whole[name]) * 1e3, 1),
                "pages_per_sec": round(pages[name] / statistics.median(whole[name]), 2),
                "vs_parent": round(statistics.median(whole[name]) / baseline, 3),
                "server_ms_per_page": round(statistics.median(server[name]) * 1e3, 1),
                "client_ms_per_page": round(statistics.median(client[name]) * 1e3, 1),
            }
            for name in cases
        },
    }
    perf_dir = REPO_ROOT / "test_output" / "perf"
    perf_dir.mkdir(parents=True, exist_ok=True)
    (perf_dir / "scan_http_branch.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"\nscan_http_branch: {json.dumps(summary)}")
