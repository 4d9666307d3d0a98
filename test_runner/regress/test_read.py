"""GetPage@LSN: the query string, the redo rules, and random histories of images and deltas
read back at many LSNs (before the first version, at each, between them) against the
reference model, while the versions move from the open layer to frozen and delta layers."""

from __future__ import annotations

from http.client import HTTPConnection

import pytest

from fixtures.http import PageserverApiError, api_error
from fixtures.ingest import PAGE_SIZE, Image, Workload, delta, key, page_of
from fixtures.plugin import PageserverFactory
from fixtures.timeline import TimelineHandle
from fixtures.utils import Lsn


def page_url(timeline: TimelineHandle) -> str:
    return f"/v1/tenant/{timeline.tenant_id}/timeline/{timeline.timeline_id}/page"


@pytest.mark.parametrize(
    "query,contains",
    [
        ("", "missing query parameter `key`"),
        ("lsn=latest", "missing query parameter `key`"),
        (f"key={key(1).hex()}", "missing query parameter `lsn`"),
        (f"key={key(1).hex()[:-2]}&lsn=latest", "36 hex characters"),
        (f"key={key(1).hex()}00&lsn=latest", "36 hex characters"),
        (f"key={key(1).hex()[:-1]}g&lsn=latest", "not a hex digit"),
        ("key=&lsn=latest", "query parameter key"),
        (f"key={key(1).hex()}&lsn=", "query parameter lsn"),
        (f"key={key(1).hex()}&lsn=1/", "query parameter lsn"),
        (f"key={key(1).hex()}&lsn=/1", "query parameter lsn"),
        (f"key={key(1).hex()}&lsn=x/1", "query parameter lsn"),
        (f"key={key(1).hex()}&lsn=1/2/3", "query parameter lsn"),
        (f"key={key(1).hex()}&lsn=1/100000000", "query parameter lsn"),
        (f"key={key(1).hex()}&lsn=%2B5", "query parameter lsn"),
        (f"key={key(1).hex()}&lsn=-1", "query parameter lsn"),
        (f"key={key(1).hex()}&lsn=18446744073709551616", "query parameter lsn"),
        (f"key={key(1).hex()}&lsn=LATEST", "query parameter lsn"),
        (f"key={key(1).hex()}&lsn=latest&extra=1", "unknown query parameter `extra`"),
        # A repeated parameter is refused, not decided by its last value.
        (f"key={key(1).hex()}&lsn=latest&lsn=0/10", "query parameter `lsn` is given more than once"),
        (f"key={key(2).hex()}&key={key(1).hex()}&lsn=latest", "query parameter `key` is given more than once"),
        (f"key={key(1).hex()}&lsn=latest&key", "query parameter `key` is given more than once"),
        (f"key={key(1).hex()}&lsn=%FF", "query parameter lsn"),
    ],
    ids=[
        "nothing", "no_key", "no_lsn", "key_short", "key_long", "key_not_hex", "key_empty",
        "lsn_empty", "lsn_no_low", "lsn_no_high", "lsn_not_hex", "lsn_two_slashes",
        "lsn_half_too_wide", "lsn_plus", "lsn_negative", "lsn_decimal_too_large", "lsn_upper_latest",
        "unknown_parameter", "lsn_twice", "key_twice", "key_twice_empty", "not_utf8",
    ],
)
def test_page_query_errors(timeline: TimelineHandle, query: str, contains: str):
    timeline.ingest([Image(key(1), 0x10, page_of(1))])
    r = timeline.http.request("GET", page_url(timeline) + "?" + query)
    assert r.status_code == 400, r.text
    assert contains in api_error(r).msg


def test_page_query_forms(timeline: TimelineHandle):
    timeline.ingest([Image(key(1), 0x10, page_of(1))])
    timeline.ingest([Image(key(1), 0x1_0000_0000, page_of(2))])
    http = timeline.http
    url = page_url(timeline)
    cases = {
        # hex X/X, decimal, upper- and lower-case hex, an escaped slash, key in upper case
        f"key={key(1).hex()}&lsn=0/10": page_of(1),
        f"key={key(1).hex()}&lsn=16": page_of(1),
        f"key={key(1).hex()}&lsn=0%2F10": page_of(1),
        f"key={key(1).hex()}&lsn=0%2f1f": page_of(1),
        f"key={key(1).hex().upper()}&lsn=0/ff": page_of(1),
        f"lsn=1/0&key={key(1).hex()}": page_of(2),
        f"key={key(1).hex()}&lsn=4294967296": page_of(2),
        f"key={key(1).hex()}&lsn=latest": page_of(2),
    }
    for query, want in cases.items():
        r = http.request("GET", f"{url}?{query}")
        assert r.status_code == 200, (query, r.text)
        assert r.headers["content-type"] == "application/octet-stream"
        assert r.content == want, query
    # Any character may be percent-encoded, not only the slash. (Sent with http.client:
    # requests would decode the escapes of letters and digits before sending.)
    encoded_key = "".join(f"%{ord(c):02X}" for c in key(1).hex())
    for query, want in {
        f"key={encoded_key}&lsn=0%2F%31%30": page_of(1),
        f"%6Bey={key(1).hex()}&lsn=lat%65st": page_of(2),
    }.items():
        conn = HTTPConnection("127.0.0.1", timeline.ps.port, timeout=30)
        try:
            conn.request("GET", f"{url}?{query}")
            r = conn.getresponse()
            assert (r.status, r.read()) == (200, want), query
        finally:
            conn.close()
    r = http.get_page_response(timeline.tenant_id, timeline.timeline_id, key(1), "latest")
    assert r.headers["x-lsn"] == "1/0"
    r = http.get_page_response(timeline.tenant_id, timeline.timeline_id, key(1), 0x20)
    assert r.headers["x-lsn"] == "0/20"


def test_missing_page_is_404(timeline: TimelineHandle):
    timeline.ingest([Image(key(1), 0x10, page_of(1))])
    r = timeline.http.request("GET", page_url(timeline), params={"key": key(2).hex(), "lsn": "latest"})
    assert r.status_code == 404
    assert key(2).hex() in api_error(r).msg
    r = timeline.http.request("GET", page_url(timeline), params={"key": key(1).hex(), "lsn": "0/F"})
    assert r.status_code == 404
    assert "0/F" in api_error(r).msg


def test_redo_rules(timeline: TimelineHandle):
    """Each rule of page redo, with its expected bytes spelled out rather than computed."""
    k_img, k_init, k_orphan, k_short, k_overlap, k_reset = (key(i) for i in range(6))
    img = page_of(7)
    timeline.ingest(
        [
            Image(k_img, 0x10, img),
            delta(k_init, 0x10, (4, b"abcd"), will_init=True),
            delta(k_orphan, 0x10, (0, b"lonely")),
            Image(k_short, 0x10, b"short"),
            Image(k_overlap, 0x10, bytes(16)),
            delta(k_reset, 0x10, (0, b"old"), will_init=True),
        ]
    )
    timeline.ingest(
        [
            delta(k_img, 0x20, (0, b"XY"), (8190, b"ZZ")),
            delta(k_init, 0x20, (0, b"0123")),
            delta(k_orphan, 0x20, (2, b"still alone")),
            delta(k_short, 0x20, (10, b"tail")),
            delta(k_overlap, 0x20, (0, b"aaaaaa"), (2, b"BB"), (1, b"")),
            Image(k_reset, 0x20, b"new image"),
        ]
    )
    timeline.ingest([delta(k_short, 0x30, (2, b"")), delta(k_reset, 0x30, (0, b"N"))])

    def expect(k: bytes, lsn: int, want):
        got = timeline.get(k, lsn)
        assert got == want, f"key {k.hex()} at {Lsn(lsn)}: {got!r:.80} != {want!r:.80}"
        assert timeline.model.get(k, lsn) == want, "the model disagrees with the spelled-out bytes"

    # An image base, then a delta patching both ends of it.
    expect(k_img, 0x1F, img)
    expect(k_img, 0x20, b"XY" + img[2:8190] + b"ZZ")
    # A will_init delta starts from an 8192-byte zero page.
    expect(k_init, 0x10, bytes(4) + b"abcd" + bytes(PAGE_SIZE - 8))
    expect(k_init, 0x20, b"0123abcd" + bytes(PAGE_SIZE - 8))
    # Plain deltas with nothing under them: the page does not exist.
    expect(k_orphan, 0x10, None)
    expect(k_orphan, 0x30, None)
    # A page shorter than 8192 bytes grows with zeros to where a patch ends, never shrinks,
    # and an empty patch inside the page changes nothing.
    expect(k_short, 0x10, b"short")
    expect(k_short, 0x20, b"short" + bytes(5) + b"tail")
    expect(k_short, 0x30, b"short" + bytes(5) + b"tail")
    # Patches of one delta apply in order: later ones win where they overlap.
    expect(k_overlap, 0x20, b"aaBBaa" + bytes(10))
    # An image replaces everything before it.
    expect(k_reset, 0x10, b"old" + bytes(PAGE_SIZE - 3))
    expect(k_reset, 0x20, b"new image")
    expect(k_reset, 0x30, b"New image")
    # The same answers from a delta layer file, and again from a cold cache.
    timeline.checkpoint()
    timeline.verify()
    timeline.http.page_cache_drop()
    timeline.verify()


def test_empty_image_and_delta_without_patches(timeline: TimelineHandle):
    timeline.ingest([Image(key(1), 0x10, b""), delta(key(2), 0x10, will_init=True)])
    timeline.ingest([delta(key(1), 0x11), delta(key(2), 0x11)])
    assert timeline.get(key(1), 0x11) == b""
    assert timeline.get(key(2), 0x11) == bytes(PAGE_SIZE)
    timeline.checkpoint()
    timeline.verify()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_history_against_model(pageserver_factory: PageserverFactory, seed: int):
    """Seeded random batches of images and deltas over a dozen keys. Small layers make the
    versions of one key spread over the open layer, frozen layers and several delta layer files;
    a checkpoint now and then adds more layer boundaries. Every read agrees with the model."""
    ps = pageserver_factory.start({"checkpoint_distance": "96KiB", "page_cache_size": "1MiB"})
    timeline = TimelineHandle.create(ps)
    work = Workload(seed, [key(i) for i in range(12)])
    for i in range(60):
        timeline.ingest(work.batch())
        if i % 25 == 24:
            timeline.checkpoint()
    layers = ps.http.layers(timeline.tenant_id, timeline.timeline_id)
    assert sum(1 for layer in layers if layer["kind"] == "delta") >= 2, layers
    assert timeline.verify(seed=seed) > 200
    # Again with the materialized pages gone, and once everything is in layer files.
    ps.http.page_cache_drop()
    timeline.verify(seed=seed + 100)
    timeline.checkpoint()
    timeline.verify(seed=seed + 200)


def test_largest_key_is_reserved_and_smallest_works(pageserver_factory: PageserverFactory):
    """Key ffff...ff is the exclusive end of every layer's key range, so it cannot hold a
    version: a batch naming it is refused whole. Key 0000...00 is an ordinary key, through a
    flush and a restart."""
    ps = pageserver_factory.start()
    timeline = TimelineHandle.create(ps)
    top, bottom = b"\xff" * 18, b"\x00" * 18
    with pytest.raises(PageserverApiError) as e:
        timeline.ingest([Image(bottom, 0x10, page_of(2)), Image(top, 0x10, page_of(1))])
    assert e.value.status_code == 400
    assert "record 1 of the batch: key " + top.hex() + " is reserved" in e.value.msg
    assert timeline.lsns() == (0, 0), "nothing of a refused batch is applied"
    timeline.ingest([Image(bottom, 0x10, page_of(2))])
    timeline.ingest([delta(bottom, 0x20, (0, b"bottom"))])
    timeline.verify()
    timeline.checkpoint()
    timeline.verify()
    ps.restart()
    timeline.verify()


def test_recreated_timeline_never_serves_old_pages(pageserver_factory: PageserverFactory):
    """Pages reconstructed from several versions are memorized in the page cache. A timeline
    deleted and created again under the same ids, with different versions at the same LSNs,
    must never be answered from what the old one memorized."""
    ps = pageserver_factory.start()
    first = TimelineHandle.create(ps)
    for generation in range(3):
        if generation:
            ps.http.timeline_delete(first.tenant_id, first.timeline_id)
            if generation == 2:
                ps.http.tenant_delete(first.tenant_id)
                ps.http.tenant_create(first.tenant_id)
            ps.http.timeline_create(first.tenant_id, first.timeline_id)
        timeline = TimelineHandle(ps, first.tenant_id, first.timeline_id)
        timeline.ingest([Image(key(1), 0x10, page_of(100 + generation))])
        for n in range(4):
            timeline.ingest([delta(key(1), 0x20 + n, (n * 10, bytes([generation + 1]) * 5))])
        if generation == 1:
            timeline.checkpoint()
        # Read twice: the second read may come from the memorized page.
        for _ in range(2):
            timeline.verify()
    stats = ps.http.page_cache()
    assert stats["materialized_pages"]["inserts"] > 0, stats


def read_cost(r) -> dict[str, int]:
    """The X-Read-Cost header as a dict."""
    return {name: int(value) for name, value in (pair.split("=") for pair in r.headers["x-read-cost"].split())}


def test_read_cost_header(timeline: TimelineHandle):
    """X-Read-Cost says what a read cost: cold after the page cache is dropped, then fully hot
    (no file reads), and the totals in /metrics add up."""
    http = timeline.ps.http
    timeline.ingest([Image(key(1), 0x10, page_of(1))])
    timeline.checkpoint()
    http.page_cache_drop()
    cold = read_cost(http.get_page_response(timeline.tenant_id, timeline.timeline_id, key(1), 0x10))
    # One delta layer: its index is one leaf (read once, then hit again to find where the value
    # ends); the 8 KiB image with its length header and checksum spans two value blocks, read
    # with one call.
    assert cold == {"layers": 1, "idx_hit": 1, "idx_miss": 1, "val_hit": 0, "val_miss": 2, "ios": 2, "bytes": 3 * PAGE_SIZE, "waits": 0, "downloads": 0}
    hot = read_cost(http.get_page_response(timeline.tenant_id, timeline.timeline_id, key(1), 0x10))
    # Hot: the value's length header is in a cached block, so the index is asked only once.
    assert hot == {"layers": 1, "idx_hit": 1, "idx_miss": 0, "val_hit": 2, "val_miss": 0, "ios": 0, "bytes": 0, "waits": 0, "downloads": 0}
    # A key the layer does not hold: the index answers, no value block is touched.
    assert http.get_page_or_none(timeline.tenant_id, timeline.timeline_id, key(2), 0x10) is None
    text = http.request("GET", "/metrics").text
    assert "pageserver_getpage_ios_total 2" in text
    assert 'pageserver_getpage_blocks_total{kind="value",result="miss"} 2' in text


def test_read_costs_after_a_drop_match_a_fresh_server(timeline: TimelineHandle):
    """The I/O each read does, from X-Read-Cost: a read after `page_cache/drop` costs what it
    costs on a freshly started server; with the index cached a cold value is one read of just
    its blocks; a hot read does no I/O; a key the layer lacks touches no value block."""
    ps = timeline.ps
    # Even keys only, so odd keys inside the layer's key range are absent from it.
    timeline.ingest([Image(key(k), 0x10, page_of(k)) for k in range(0, 16, 2)])
    timeline.checkpoint()
    ps.restart()
    http = ps.http

    def cost_of(k: int) -> dict[str, int]:
        r = http.request("GET", page_url(timeline), params={"key": key(k).hex(), "lsn": "0/10"})
        assert r.status_code in (200, 404), r.text
        return read_cost(r)

    fresh = cost_of(4)
    # Nothing cached: the index leaf (asked again, from the cache, for where the value ends) and
    # the value's two blocks, read with one call.
    assert fresh == {"layers": 1, "idx_hit": 1, "idx_miss": 1, "val_hit": 0, "val_miss": 2, "ios": 2, "bytes": 3 * PAGE_SIZE, "waits": 0, "downloads": 0}
    hot = cost_of(4)
    assert (hot["ios"], hot["idx_miss"], hot["val_miss"]) == (0, 0, 0)
    absent = cost_of(5)
    assert absent == {"layers": 1, "idx_hit": 1, "idx_miss": 0, "val_hit": 0, "val_miss": 0, "ios": 0, "bytes": 0, "waits": 0, "downloads": 0}

    dropped = http.page_cache_drop()
    assert dropped["index_pages"] == 1 and dropped["file_pages"] == 2, dropped
    assert cost_of(4) == fresh

    # Key 4's read cached the index; key 12's value shares no block with key 4's: exactly one
    # I/O, 16 KiB, for the two blocks its 8 KiB image with header and checksum spans.
    index_hot = cost_of(12)
    assert index_hot == {"layers": 1, "idx_hit": 2, "idx_miss": 0, "val_hit": 0, "val_miss": 2, "ios": 1, "bytes": 2 * PAGE_SIZE, "waits": 0, "downloads": 0}
    assert http.page_cache()["miss_waits"] == 0


@pytest.mark.parametrize("versions", [None, 0])
def test_materialized_versions_per_key_setting(pageserver_factory: PageserverFactory, versions):
    """A page rebuilt from an image and a delta is kept in the page cache as a base for later
    reads, unless `materialized_versions_per_key = 0` turns that off."""
    ps = pageserver_factory.start({"materialized_versions_per_key": versions})
    timeline = TimelineHandle.create(ps)
    timeline.ingest([Image(key(1), 0x10, page_of(1))])
    timeline.ingest([delta(key(1), 0x20, (0, b"hi"))])
    for _ in range(2):
        timeline.check_read(key(1), 0x20)
    materialized = ps.http.page_cache()["materialized_pages"]
    if versions == 0:
        assert materialized["inserts"] == 0 and materialized["accesses"] == 0, materialized
    else:
        assert materialized["inserts"] >= 1 and materialized["hits"] >= 1, materialized
