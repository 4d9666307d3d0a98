"""A stock PostgreSQL's WAL becomes the timeline's page versions (`ingest_pages`): full-page
images are pages at their record's end LSN with `pd_lsn` set, equal to the primary's own pages;
a page whose newest version is a WAL record answers 422 naming the nearest LSN that answers;
relation sizes follow the WAL; page ingest resumes after a `kill -9` and ends where the WAL
does."""

from __future__ import annotations

import random
import re
import struct
import threading
from pathlib import Path

import requests

from fixtures.pageserver import Pageserver
from fixtures.plugin import PageserverFactory
from fixtures.postgres import PgCluster, PgEnv
from fixtures.timeline import TimelineHandle
from fixtures.utils import Lsn, wait_until
from fixtures.wal_stream import UPLOAD_BACKPRESSURE, connstr, receiver, start_promoted_quietly, wait_ingested

BLCKSZ = 8192
HEAP_TABLES = ["pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history", "grown"]


def rel_key(spc: int, db: int, rel: int, fork: int = 0, block: int = 0, kind: int = 0) -> str:
    return struct.pack(">BIIIBI", kind, spc, db, rel, fork, block).hex()


def start_ingesting(pg: PgEnv, timeline: TimelineHandle, *settings: str) -> PgCluster:
    """A primary with pgbench's tables, imported by pg_basebackup, streaming into `timeline`
    with page ingest on."""
    primary = pg.new_cluster("primary").start("listen_addresses=127.0.0.1", *settings)
    primary.pgbench("-i", "-s", "1", "-q")
    pg.import_process(timeline.url, primary.basebackup_process())
    # Pages from the WAL alone: no background snapshots, though the WAL passes their distance.
    r = requests.put(f"{timeline.url}/wal_receiver", json={"connstr": connstr(primary), "ingest_pages": True, "snapshot_wal_distance": 0}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["ingest_pages"] is True
    return primary


def page_at(timeline: TimelineHandle, key: str, lsn: Lsn) -> requests.Response:
    return requests.get(f"{timeline.url}/page", params={"key": key, "lsn": str(lsn)}, timeout=60)


def file_entries(timeline: TimelineHandle, lsn: Lsn) -> dict[str, tuple[int, int]]:
    """The file directory (key kind 4) at `lsn`: each path's size and file id."""
    r = page_at(timeline, struct.pack(">BIIIBI", 4, 0, 0, 0, 0, 0).hex(), lsn)
    assert r.status_code == 200, r.text
    d = r.content
    _version, _next_id, count = struct.unpack_from(">BII", d, 0)
    at, entries = 9, {}
    for _ in range(count):
        (length,) = struct.unpack_from(">H", d, at)
        name = d[at + 2 : at + 2 + length].decode()
        _kind, _mode, _mtime, size, file_id = struct.unpack_from(">BIQQI", d, at + 2 + length)
        at += 2 + length + 25
        entries[name] = (size, file_id)
    return entries


def file_bytes(timeline: TimelineHandle, path: str, lsn: Lsn) -> bytes:
    """A non-relation file of the data directory as the timeline holds it at `lsn`: its entry
    in the file directory, then its chunks (key kind 3)."""
    size, file_id = file_entries(timeline, lsn)[path]
    chunks = []
    for chunk in range((size + BLCKSZ - 1) // BLCKSZ):
        r = page_at(timeline, struct.pack(">BIIIBI", 3, file_id, 0, 0, 0, chunk).hex(), lsn)
        assert r.status_code == 200, r.text
        chunks.append(r.content)
    return b"".join(chunks)[:size]


def primary_next_multi(primary: PgCluster) -> str:
    """The next multixact id of a stopped primary, from pg_controldata."""
    out = primary.run("pg_controldata", "-D", str(primary.datadir)).stdout
    return re.search(r"Latest checkpoint's NextMultiXactId:\s+(\d+)", out).group(1)


def page_lsn(page: bytes) -> Lsn:
    high, low = struct.unpack_from("<II", page, 0)
    return Lsn((high << 32) | low)


def masked_heap_page(page: bytes) -> bytes:
    """A heap page without what PostgreSQL changes without WAL, as its `heap_mask` ignores
    it: the checksum, the hint flags and `pd_prune_xid`, the unused space, tuples' hint bits and
    command ids."""
    p = bytearray(page)
    p[8:10] = b"\0\0"
    p[10] &= ~0x07  # PD_HAS_FREE_LINES, PD_PAGE_FULL, PD_ALL_VISIBLE
    p[11] = 0
    lower, upper = struct.unpack_from("<HH", p, 12)
    p[20:24] = b"\0\0\0\0"
    if 24 <= lower <= upper <= BLCKSZ:
        p[lower:upper] = bytes(upper - lower)
        for i in range((lower - 24) // 4):
            (lp,) = struct.unpack_from("<I", p, 24 + 4 * i)
            off, flags = lp & 0x7FFF, (lp >> 15) & 3
            if flags == 1 and off + 22 <= BLCKSZ:
                (infomask,) = struct.unpack_from("<H", p, off + 20)
                struct.pack_into("<H", p, off + 20, infomask & ~0x0F00)
                p[off + 8 : off + 12] = b"\0\0\0\0"  # t_cid: redo sets FirstCommandId
    return bytes(p)


def test_full_page_images_become_the_primarys_pages(pg: PgEnv, pageserver: Pageserver, timeline: TimelineHandle):
    """With `wal_consistency_checking = 'all'` every change carries the page's image: after a
    workload, every block of every heap table equals the primary's own file at the end of its
    WAL (masked as PostgreSQL masks it), with the same `pd_lsn`; and every size is the file's."""
    pageserver.allowed_errors.append(UPLOAD_BACKPRESSURE)
    primary = start_ingesting(pg, timeline, "wal_consistency_checking=all", "wal_compression=lz4")
    primary.pgbench("-c", "2", "-t", "300")
    primary.psql("CREATE TABLE grown AS SELECT g AS id, repeat('x', 200) AS pad FROM generate_series(1, 20000) g")
    primary.psql("DELETE FROM grown WHERE id > 15000")
    primary.psql("VACUUM grown")
    primary.pgbench("-c", "2", "-t", "100")
    primary.psql("CREATE DATABASE second")
    primary.psql("CREATE DATABASE dropped")
    dropped = int(primary.psql("SELECT oid FROM pg_database WHERE datname = 'dropped'"))
    primary.psql("DROP DATABASE dropped")
    primary.psql("CREATE TABLE in_second AS SELECT 1 AS x", db="second")
    # Multixacts: a row share-locked, then updated in a subtransaction, by each of 20 sessions.
    for i in range(1, 21):
        primary.psql(
            f"BEGIN; SELECT * FROM pgbench_branches WHERE bid = 1 FOR SHARE; SAVEPOINT s;"
            f" UPDATE pgbench_branches SET filler = 'm{i}' WHERE bid = 1; COMMIT"
        )
    second = int(primary.psql("SELECT oid FROM pg_database WHERE datname = 'second'"))
    db = int(primary.psql("SELECT oid FROM pg_database WHERE datname = 'postgres'"))
    rels = {t: int(primary.psql(f"SELECT pg_relation_filenode('{t}')")) for t in HEAP_TABLES}
    end = Lsn.parse(primary.psql("SELECT pg_current_wal_flush_lsn()"))
    pageserver.allowed_errors.append("WAL receiver: cannot reach the primary")
    primary.stop()  # every page written, at the end of the WAL streamed
    at = wait_ingested(timeline, end)

    compared = 0
    for table, rel in rels.items():
        file = Path(primary.datadir) / "base" / str(db) / str(rel)
        data = file.read_bytes()
        r = page_at(timeline, rel_key(1663, db, rel, kind=1), at)
        assert r.status_code == 200, r.text
        assert struct.unpack(">I", r.content)[0] == len(data) // BLCKSZ, table
        for block in range(len(data) // BLCKSZ):
            ours = page_at(timeline, rel_key(1663, db, rel, block=block), at)
            assert ours.status_code == 200, (table, block, ours.text)
            theirs = data[block * BLCKSZ : (block + 1) * BLCKSZ]
            assert page_lsn(ours.content) == page_lsn(theirs), (table, block)
            assert masked_heap_page(ours.content) == masked_heap_page(theirs), (table, block)
            compared += 1
    assert compared > 1500, compared

    # pg_xact as the WAL's commits and aborts set it: the primary's own file, byte for byte.
    xact = file_bytes(timeline, "pg_xact/0000", at)
    theirs = (Path(primary.datadir) / "pg_xact" / "0000").read_bytes()
    assert xact == theirs[: len(xact)] and len(xact) >= BLCKSZ, (len(xact), len(theirs))
    # pg_multixact as the WAL's multixact records make it: the primary's own files.
    assert int(primary_next_multi(primary)) > 1
    for name in ["offsets/0000", "members/0000"]:
        ours = file_bytes(timeline, f"pg_multixact/{name}", at)
        theirs = (Path(primary.datadir) / "pg_multixact" / name).read_bytes()
        assert ours == theirs[: len(ours)] and len(ours) >= BLCKSZ, (name, len(ours), len(theirs))
    # A database created (its files as the primary has them) and one dropped (gone).
    for name in ["pg_filenode.map", "PG_VERSION"]:
        ours = file_bytes(timeline, f"base/{second}/{name}", at)
        assert ours == (Path(primary.datadir) / "base" / str(second) / name).read_bytes(), name
    assert file_bytes(timeline, "global/pg_filenode.map", at) == (Path(primary.datadir) / "global" / "pg_filenode.map").read_bytes()
    listed = file_entries(timeline, at)
    assert not [p for p in listed if p.startswith(f"base/{dropped}")], "the dropped database's files"
    assert f"base/{second}" in listed

    metrics = requests.get(f"{pageserver.base_url}/metrics", timeout=30).text
    images = re.search(r"^pageserver_wal_ingest_images_total (\d+)", metrics, re.M)
    assert images and int(images.group(1)) >= 1000, images


def test_pages_at_lsns_between_snapshots_equal_a_cluster_recovered_there(
    pg: PgEnv, pageserver: Pageserver, timeline: TimelineHandle
):
    """At 5 LSNs taken while pgbench writes (full-image mode), 40 random blocks of pgbench's
    tables each: the page the timeline answers equals the block of a cluster that stock
    PostgreSQL recovered to that LSN (a basebackup there, replayed and promoted), masked as
    PostgreSQL masks heap pages, with the same `pd_lsn`; and every fork size is the file's."""
    pageserver.allowed_errors.append(UPLOAD_BACKPRESSURE)
    primary = start_ingesting(pg, timeline, "wal_consistency_checking=all", "wal_compression=lz4")
    db = int(primary.psql("SELECT oid FROM pg_database WHERE datname = 'postgres'"))
    tables = HEAP_TABLES[:4]
    bench = primary.pgbench_background("-c", "2", "-T", "8")
    points: list[Lsn] = []
    try:
        while len(points) < 5 and bench.poll() is None:
            threading.Event().wait(1.2)  # spread over the run
            points.append(Lsn.parse(primary.psql("SELECT pg_current_wal_insert_lsn()")))
    finally:
        bench.wait(timeout=120)
    assert len(points) >= 4, points
    wait_ingested(timeline, points[-1])
    # Pages a backup copied while they changed are repaired only by the WAL before the
    # backup's end: no restore without replay above a backup snapshot.
    r = requests.get(f"{timeline.url}/basebackup", params={"lsn": str(points[0]), "replay": "none"}, timeout=60)
    assert r.status_code == 422 and "backup of a running cluster" in r.text, r.text

    rng = random.Random(0)
    compared = 0
    for i, lsn in enumerate(points):
        restored, _ = pg.restore(timeline.url, f"at{i}", lsn)
        start_promoted_quietly(restored)
        # pgbench's start truncates pgbench_history: its file as of `lsn`.
        rels = {t: int(restored.psql(f"SELECT pg_relation_filenode('{t}')")) for t in tables}
        restored.stop()  # every page written, as recovery left it at `lsn`
        files = {t: (Path(restored.datadir) / "base" / str(db) / str(rel)).read_bytes() for t, rel in rels.items()}
        for table, rel in rels.items():
            r = page_at(timeline, rel_key(1663, db, rel, kind=1), lsn)
            assert r.status_code == 200, r.text
            assert struct.unpack(">I", r.content)[0] == len(files[table]) // BLCKSZ, (table, lsn)
        for _ in range(40):
            table = rng.choice(tables)
            block = rng.randrange(len(files[table]) // BLCKSZ)
            ours = page_at(timeline, rel_key(1663, db, rels[table], block=block), lsn)
            assert ours.status_code == 200, (table, block, lsn, ours.text)
            theirs = files[table][block * BLCKSZ : (block + 1) * BLCKSZ]
            assert page_lsn(ours.content) == page_lsn(theirs), (table, block, lsn)
            a, b = masked_heap_page(ours.content), masked_heap_page(theirs)
            assert a == b, (table, block, lsn, [i for i in range(BLCKSZ) if a[i] != b[i]][:20])
            compared += 1
    assert compared >= 160, compared
    assert requests.delete(f"{timeline.url}/wal_receiver", timeout=60).status_code == 200
    primary.stop()


def test_a_page_that_needs_redo_names_the_nearest_lsn_that_answers(
    pg: PgEnv, pageserver_factory: PageserverFactory
):
    """Without full-page images, a change after a checkpoint's first one is a WAL record: the
    read there answers 422, naming the LSN below it where the page is materialized, which
    answers with the page PostgreSQL held then. Page ingest resumes after a `kill -9`."""
    ps = pageserver_factory.start()
    timeline = TimelineHandle.create(ps)
    primary = start_ingesting(pg, timeline)
    primary.psql("CREATE EXTENSION pageinspect")
    primary.psql("CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t SELECT g, 0 FROM generate_series(1, 50) g")
    primary.psql("CHECKPOINT")
    primary.psql("UPDATE t SET v = 1 WHERE id = 1")  # the first change since: a full-page image
    first = bytes.fromhex(primary.psql("SELECT encode(get_raw_page('t', 0), 'hex')"))
    primary.psql("UPDATE t SET v = 2 WHERE id = 2")  # a WAL record only
    db = int(primary.psql("SELECT oid FROM pg_database WHERE datname = 'postgres'"))
    rel = int(primary.psql("SELECT pg_relation_filenode('t')"))
    end = Lsn.parse(primary.psql("SELECT pg_current_wal_flush_lsn()"))

    # Killed while it ingests, or after: it resumes from the layers on disk.
    ps.kill()
    ps.start()
    at = wait_ingested(timeline, end)

    key = rel_key(1663, db, rel)
    r = page_at(timeline, key, at)
    assert r.status_code == 422, r.text
    assert "layers=" in r.headers["x-read-cost"], r.headers
    msg = r.json()["msg"]
    assert "needs PostgreSQL's redo of 1 WAL record(s)" in msg, msg
    nearest = Lsn.parse(re.search(r"materialized is (\S+) \(its version of (\S+)\)", msg).group(1))
    version = Lsn.parse(re.search(r"its version of (\S+)\)", msg).group(1))
    assert version == page_lsn(first) and nearest > version, msg
    ok = page_at(timeline, key, nearest)
    assert ok.status_code == 200, (msg, ok.text)
    assert page_lsn(ok.content) == page_lsn(first)
    assert masked_heap_page(ok.content) == masked_heap_page(first)
    # Below the image: the table was created after the snapshot, by records only (the first
    # insert builds its page), so no LSN there has the page materialized.
    older = page_at(timeline, key, Lsn(int(version) - 1))
    assert older.status_code == 422, older.text
    assert "it is not materialized at any LSN below that" in older.json()["msg"], older.text
    # A table of the snapshot: its pages there are images.
    accounts = int(primary.psql("SELECT pg_relation_filenode('pgbench_accounts')"))
    assert page_at(timeline, rel_key(1663, db, accounts, block=3), at).status_code == 200
    assert requests.delete(f"{timeline.url}/wal_receiver", timeout=60).status_code == 200
    primary.stop()
