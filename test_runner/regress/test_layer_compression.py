"""Compressed layers end to end: a real cluster imported by a server with `layer_compression =
"zstd"` is stored in version 2 delta layers holding compressed values, in a fraction of the
bytes, in the local files and in the object store alike; image creation writes version 2 image
layers of compressed pages; the cluster restores the same from either; a server restarted with
compression off reads those files and writes version 1 files beside them, and the timeline still
restores and serves the same pages."""

from __future__ import annotations

import struct
import subprocess

from fixtures.plugin import PageserverFactory
from fixtures.postgres import PgEnv
from fixtures.timeline import TimelineHandle
from fixtures.utils import Lsn, wait_until

BLCKSZ = 8192


def delta_layers(timeline: TimelineHandle) -> list[dict]:
    return [
        l
        for l in timeline.http.layers(timeline.tenant_id, timeline.timeline_id)
        if l["kind"] == "delta" and l["resident"]
    ]


def format_version(path, magic: int = 0x44454C54) -> int:
    with open(path, "rb") as f:
        found, version = struct.unpack(">IH", f.read(6))
    assert found == magic, hex(found)
    return version


def verify(pagectl, path) -> dict[str, int]:
    """`pagectl layer verify` of one file: the counts of its report (`name=number` fields)."""
    out = subprocess.run([str(pagectl), "layer", "verify", str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    fields = out.stdout.split(": ok: ", 1)[1].split(" manifest:")[0]
    return {k: int(v) for k, v in (f.split("=") for f in fields.split()) if v.isdigit()}


def test_a_compressed_import_restores_and_reads_across_a_change_of_setting(
    pg: PgEnv, pageserver_factory: PageserverFactory
):
    pageserver = pageserver_factory.start(config={"layer_compression": "zstd"})
    timeline = TimelineHandle.create(pageserver)
    cluster = pg.new_cluster("original").start()
    cluster.pgbench("-i", "-s", "2", "-q")
    expected = cluster.state()
    db = int(cluster.psql("SELECT oid FROM pg_database WHERE datname = 'postgres'"))
    node = cluster.relfilenode("pgbench_accounts")
    cluster.stop()
    # Block 7 of pgbench_accounts as of the first snapshot, for a GetPage after the restart.
    key = struct.pack(">BIIIBI", 0, 1663, db, node, 0, 7)
    with open(cluster.datadir / "base" / str(db) / str(node), "rb") as f:
        f.seek(7 * BLCKSZ)
        on_disk = f.read(BLCKSZ)

    report = pg.import_process(timeline.url, cluster.tar_process())
    first = Lsn.parse(report["lsn"])
    layers = delta_layers(timeline)
    assert layers, timeline.http.layers(timeline.tenant_id, timeline.timeline_id)
    tl_dir = pageserver.timeline_dir(timeline.tenant_id, timeline.timeline_id)
    stored = 0
    compressed = 0
    for layer in layers:
        path = tl_dir / layer["file_name"]
        assert format_version(path) == 2, layer
        counts = verify(pageserver.binary.pagectl, path)
        compressed += counts["compressed"]
        stored += layer["size_bytes"]
    # pgbench_accounts' pages are rows of digits and blanks: nearly every block compresses, and
    # the import stores well under half of the blocks' bytes.
    assert compressed > report["blocks_new"] // 2, (compressed, report)
    assert stored < report["blocks_new"] * BLCKSZ // 2, (stored, report)

    # The object store holds the same (compressed) files, byte for byte.
    remote = pageserver.workdir / "remote"

    def uploaded() -> bool:
        info = timeline.info()
        return info["remote_consistent_lsn"] == info["disk_consistent_lsn"]

    wait_until(uploaded, timeout=60)
    objects = {p.name: p.stat().st_size for p in remote.rglob("*") if p.is_file()}
    for layer in layers:
        assert any(name.startswith(layer["file_name"]) and size == layer["size_bytes"] for name, size in objects.items()), layer["file_name"]

    def restores(name: str, lsn: Lsn, state: dict) -> None:
        restored, snapshot = pg.restore(timeline.url, name, lsn)
        assert snapshot == lsn
        restored.start()
        try:
            assert restored.state() == state
        finally:
            restored.stop()

    restores("at_first", first, expected)

    # A second snapshot, then image creation over both: it compresses too, and the pages come
    # back from version 2 image layers.
    cluster.start()
    cluster.pgbench("-t", "200", "-n")
    later = cluster.state()
    cluster.stop()
    second = Lsn.parse(pg.import_process(timeline.url, cluster.tar_process())["lsn"])
    imaged = timeline.http.compact(timeline.tenant_id, timeline.timeline_id, force_images=True)["image_creation"]
    assert imaged["images"] > report["blocks_new"] // 2, imaged
    images = [
        l for l in timeline.http.layers(timeline.tenant_id, timeline.timeline_id) if l["kind"] == "image"
    ]
    assert images, imaged
    image_compressed = 0
    for layer in images:
        path = tl_dir / layer["file_name"]
        assert format_version(path, magic=0x494D474C) == 2, layer
        image_compressed += verify(pageserver.binary.pagectl, path)["compressed"]
    assert image_compressed > imaged["images"] // 2, (image_compressed, imaged)
    assert imaged["bytes_written"] < imaged["images"] * BLCKSZ // 2, imaged
    timeline.http.page_cache_drop()
    restores("at_second_from_images", second, later)

    # Compression off from here: the version 2 files are still read, new ones are version 1.
    pageserver.restart(overrides={"layer_compression": "off"})
    assert timeline.http.get_page(timeline.tenant_id, timeline.timeline_id, key, str(first)) == on_disk
    # The second read is answered from the page kept after the first decompression: the layers
    # above it are asked from their indexes, and no value is read (nor decompressed) again.
    again = timeline.http.get_page_response(timeline.tenant_id, timeline.timeline_id, key, str(first))
    assert again.content == on_disk
    cost = again.headers["X-Read-Cost"]
    assert " val_hit=0 val_miss=0 " in cost, cost

    cluster.start()
    cluster.pgbench("-t", "100", "-n")
    latest = cluster.state()
    cluster.stop()
    third = Lsn.parse(pg.import_process(timeline.url, cluster.tar_process())["lsn"])
    versions = {format_version(tl_dir / l["file_name"]) for l in delta_layers(timeline)}
    assert versions == {1, 2}, versions
    for name, lsn, state in [("first", first, expected), ("second", second, later), ("third", third, latest)]:
        restores(name, lsn, state)
