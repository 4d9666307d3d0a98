"""Block references and full-page images against `pg_waldump --bkp-details`: the WAL of a SQL
script that exercises heap, B-tree, hash, GIN, GiST, SP-GiST and BRIN indexes, sequences,
TRUNCATE, CREATE and DROP DATABASE, VACUUM FULL, CLUSTER and two-phase commit, with
`wal_compression` switched between pglz, lz4 and zstd and `wal_consistency_checking` on for a
stretch. `pagectl wal --blocks` (the page server's decoder) and `pg_waldump` name the same
block references for every record, with the same images, holes and compression; every image
is restored to a page whose header names its hole."""

from __future__ import annotations

import os
import re
import subprocess
from collections import Counter

from fixtures.binary import PageserverBinary
from fixtures.postgres import PgCluster, PgEnv
from fixtures.utils import Lsn

RECORD_OURS = re.compile(r"rmgr=\S+ len=\d+/\d+ tx=\d+ lsn=(\S+) ")
RECORD_THEIRS = re.compile(r"rmgr: \S+\s+len \(rec/tot\):\s+\d+/\s*\d+, tx:\s+\d+, lsn: (\S+), ")
BLOCK = re.compile(r"\s+blkref #\d+: rel \d+/\d+/\d+ fork \w+ blk \d+")

SCRIPT = """
CREATE TABLE h (id int PRIMARY KEY, v text, arr int[], pt point, r int4range);
INSERT INTO h SELECT g, md5(g::text), ARRAY[g, g + 1], point(g, g), int4range(g, g + 10)
  FROM generate_series(1, 20000) g;
CREATE INDEX h_hash ON h USING hash (v);
CREATE INDEX h_gin ON h USING gin (arr);
CREATE INDEX h_gist ON h USING gist (pt);
CREATE INDEX h_spgist ON h USING spgist (r);
CREATE INDEX h_brin ON h USING brin (id);
CREATE SEQUENCE s;
SELECT count(nextval('s')) FROM generate_series(1, 100);
CREATE TABLE t AS SELECT g FROM generate_series(1, 1000) g;
TRUNCATE t;
CREATE DATABASE db2;
DROP DATABASE db2;
"""

CHANGES = [
    "UPDATE h SET v = v || 'x', arr = arr || id, pt = point(id + 1, id) WHERE id % 7 = 0",
    "DELETE FROM h WHERE id % 11 = 0",
    "VACUUM h",
    "BEGIN; INSERT INTO t VALUES (1); PREPARE TRANSACTION 'p'",
    "COMMIT PREPARED 'p'",
]


def records(lines: list[str], record: re.Pattern) -> list[tuple[str, list[str]]]:
    """Each record's LSN with its block reference lines (white space normalized)."""
    out: list[tuple[str, list[str]]] = []
    for line in lines:
        m = record.match(line)
        if m:
            out.append((str(Lsn.parse(m[1])), []))
        elif BLOCK.match(line) and out:
            out[-1][1].append(" ".join(line.split()))
    return out


def run_sql(cluster: PgCluster, statements: list[str]) -> None:
    for statement in statements:
        cluster.psql(statement)


def test_block_references_and_images_are_pg_waldumps(pg: PgEnv, pageserver_binary: PageserverBinary):
    cluster = pg.new_cluster("primary")
    # Compression set in the configuration, not on the command line, where a reload could not
    # change it.
    cluster.start("wal_keep_size=1GB", "max_prepared_transactions=5")
    cluster.psql("ALTER SYSTEM SET wal_compression = 'pglz'")
    cluster.psql("SELECT pg_reload_conf()")
    run_sql(cluster, [st.strip() for st in SCRIPT.split(";") if st.strip()])
    for compression in ("lz4", "zstd", "off"):
        # Each change after a checkpoint writes a full-page image of the page it changes.
        cluster.psql("CHECKPOINT")
        run_sql(cluster, CHANGES)
        cluster.psql(f"ALTER SYSTEM SET wal_compression = '{compression}'")
        cluster.psql("SELECT pg_reload_conf()")
    # Images of every page a record changes, for the replay to check, not to apply.
    cluster.psql("ALTER SYSTEM SET wal_consistency_checking = 'heap,btree'")
    cluster.psql("SELECT pg_reload_conf()")
    cluster.psql("CLUSTER h USING h_pkey")
    run_sql(cluster, CHANGES)
    cluster.psql("VACUUM FULL h")
    cluster.psql("SELECT pg_switch_wal()")
    cluster.stop()

    wal_dir = cluster.datadir / "pg_wal"
    names = sorted(n for n in os.listdir(wal_dir) if re.fullmatch(r"[0-9A-F]{24}", n))
    ours_run = subprocess.run(
        [str(pageserver_binary.pagectl), "wal", "--blocks", *(str(wal_dir / n) for n in names)],
        capture_output=True,
        text=True,
    )
    assert ours_run.returncode == 0, ours_run.stderr
    theirs_run = cluster.run("pg_waldump", "--bkp-details", "-p", str(wal_dir), names[0], names[-1], check=False)
    ours = records(ours_run.stdout.splitlines(), RECORD_OURS)
    theirs = records(theirs_run.stdout.splitlines(), RECORD_THEIRS)
    assert len(ours) == len(theirs) > 10_000, (len(ours), len(theirs))
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a == b, f"record {i}: ours {a}, pg_waldump's {b}"

    blocks = [block for _, bs in ours for block in bs]
    methods = Counter(re.search(r"method: (\w+)", b)[1] for b in blocks if "method:" in b)
    assert all(methods[m] >= 10 for m in ("pglz", "lz4", "zstd")), methods
    assert sum("(FPW)" in b for b in blocks) >= 100
    assert sum("for WAL verification" in b for b in blocks) >= 10
    forks = Counter(re.search(r"fork (\w+)", b)[1] for b in blocks)
    print(f"{len(ours)} records, {len(blocks)} block references, images by method {dict(methods)}, forks {dict(forks)}")
    assert forks["main"] > 1000 and forks["vm"] >= 1 and forks["fsm"] >= 1, forks
