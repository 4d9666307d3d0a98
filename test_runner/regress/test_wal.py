"""The WAL decoder against PostgreSQL's own reader: the WAL of a real PostgreSQL 15 under pgbench,
read by `pagectl wal` (the page server's decoder) and by `pg_waldump`, record for record: the
same records at the same LSNs, each naming the same record before it, of the same lengths with
and without full-page images, with the same transaction ids and commit times."""

from __future__ import annotations

import os
import re
import subprocess
from datetime import datetime, timezone

from fixtures.binary import PageserverBinary
from fixtures.postgres import PgEnv
from fixtures.utils import Lsn

OURS = re.compile(r"rmgr=(\S+) len=(\d+)/(\d+) tx=(\d+) lsn=(\S+) prev=(\S+) info=\S+ blocks=\d+(?: (commit|abort) at=(-?\d+))?$")
THEIRS = re.compile(r"rmgr: (\S+)\s+len \(rec/tot\):\s+(\d+)/\s*(\d+), tx:\s+(\d+), lsn: (\S+), prev (\S+), desc: (.*)$")
COMMIT_TIME = re.compile(r"^(COMMIT|ABORT) (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?) ([A-Za-z]+)")


def waldump_micros(text: str, zone: str) -> int:
    """A `pg_waldump` timestamp (in the server's time zone, UTC here) as Unix microseconds."""
    assert zone == "UTC", zone
    fmt = "%Y-%m-%d %H:%M:%S.%f" if "." in text else "%Y-%m-%d %H:%M:%S"
    when = datetime.strptime(text, fmt).replace(tzinfo=timezone.utc)
    return int(when.timestamp()) * 1_000_000 + when.microsecond


def test_the_decoder_reads_pgbench_wal_as_pg_waldump_does(pg: PgEnv, pageserver_binary: PageserverBinary):
    cluster = pg.new_cluster("primary")
    # Keep every segment.
    cluster.start("wal_keep_size=1GB")
    cluster.pgbench("-i", "-s", "2")
    cluster.pgbench("-c", "2", "-t", "300")
    cluster.psql("BEGIN; CREATE TABLE rolled_back (x int); INSERT INTO rolled_back VALUES (1); ROLLBACK")
    end = Lsn.parse(cluster.psql("SELECT pg_current_wal_insert_lsn()"))
    cluster.psql("SELECT pg_switch_wal()")
    cluster.stop()
    wal_dir = cluster.datadir / "pg_wal"
    names = sorted(n for n in os.listdir(wal_dir) if re.fullmatch(r"[0-9A-F]{24}", n))
    assert len(names) >= 2, names

    ours_out = subprocess.run(
        [str(pageserver_binary.pagectl), "wal", *(str(wal_dir / n) for n in names)], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    # pg_waldump prints times in its own time zone.
    env = {**os.environ, "TZ": "UTC"}
    theirs_run = cluster.run("pg_waldump", "-p", str(wal_dir), names[0], names[-1], check=False, env=env)
    # pg_waldump stops with an error at the end of the WAL written, as the decoder stops.
    assert "invalid record length" in theirs_run.stderr, theirs_run.stderr

    ours = []
    for line in ours_out[:-1]:
        m = OURS.match(line)
        assert m, line
        ours.append((m[1], int(m[2]), int(m[3]), int(m[4]), Lsn.parse(m[5]), Lsn.parse(m[6]), m[7], int(m[8]) if m[8] else None))
    theirs = []
    for line in theirs_run.stdout.splitlines():
        m = THEIRS.match(line)
        assert m, line
        kind, micros = None, None
        if m[1] == "Transaction":
            t = COMMIT_TIME.match(m[7])
            if t:
                kind, micros = t[1].lower(), waldump_micros(t[2], t[3])
        theirs.append((m[1], int(m[2]), int(m[3]), int(m[4]), Lsn.parse(m[5]), Lsn.parse(m[6]), kind, micros))
    assert len(ours) == len(theirs) > 10_000, (len(ours), len(theirs))
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a == b, f"record {i}: ours {a}, pg_waldump's {b}"
    commits = [r for r in ours if r[6] == "commit"]
    aborts = [r for r in ours if r[6] == "abort"]
    assert len(commits) >= 600 and len(aborts) >= 1, (len(commits), len(aborts))
    # The decoder's end of WAL: past every record, at the switch's segment end or before.
    assert ours_out[-1].startswith("end="), ours_out[-1]
    assert ours[-1][4] >= end
