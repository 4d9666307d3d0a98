"""Paged key-range scans (GET .../keys): pages against the reference model at several LSNs, the
token rules, the cursor cache's counters (hits, misses after an eviction, drops after a layer
change), the query's refusals, and the X-Read-Cost of a resumed page against a re-seeked one."""

from __future__ import annotations

import base64
from typing import Optional

import pytest

from fixtures.http import PageserverApiError, api_error
from fixtures.ingest import Image, Workload, delta, key, page_of, rel_key
from fixtures.metrics import Metrics
from fixtures.pageserver import Pageserver
from fixtures.plugin import NO_BACKGROUND_COMPACTION, PageserverFactory
from fixtures.timeline import TimelineHandle
from fixtures.utils import Lsn, wait_until

MIN_KEY = bytes(18)
MAX_KEY = b"\xff" * 18
# Every block of the test relation's main fork (key(n) is block n of it).
REL_START = key(0)
REL_END = rel_key(forknum=1)

Entry = tuple[bytes, bytes]


def keys_url(timeline: TimelineHandle) -> str:
    return f"/v1/tenant/{timeline.tenant_id}/timeline/{timeline.timeline_id}/keys"


def entries_of(page: dict) -> list[Entry]:
    """A page's entries as (key, page bytes), checking their form on the way."""
    out = []
    for e in page["entries"]:
        assert set(e) == {"key", "page"}, e
        assert len(e["key"]) == 36 and e["key"] == e["key"].lower(), e["key"]
        out.append((bytes.fromhex(e["key"]), base64.b64decode(e["page"], validate=True)))
    return out


def expected(timeline: TimelineHandle, start: bytes, end: bytes, lsn: int) -> list[Entry]:
    """The model's answer: every key in [start, end) with a page as of `lsn`, in key order."""
    out = []
    for k in timeline.model.keys():
        if start <= k < end:
            page = timeline.model.get(k, lsn)
            if page is not None:
                out.append((k, page))
    return out


def scan(
    timeline: TimelineHandle,
    start: bytes,
    end: bytes,
    lsn: int | str,
    limit: Optional[int] = None,
    between=None,
) -> tuple[list[Entry], int]:
    """Pages through a scan, checking every page's shape; calls `between(page_number)` before
    each page after the first. Returns the entries and the number of pages."""
    http = timeline.http
    token = None
    entries: list[Entry] = []
    pages = 0
    while True:
        if pages and between is not None:
            between(pages)
        page = http.scan_keys(timeline.tenant_id, timeline.timeline_id, start, end, lsn, limit=limit, page_token=token)
        assert set(page) == {"entries", "next_page_token"}, page.keys()
        got = entries_of(page)
        pages += 1
        assert len(got) <= (limit or 100)
        for k, _ in got:
            assert start <= k < end, f"key {k.hex()} outside [{start.hex()}, {end.hex()})"
        entries.extend(got)
        token = page["next_page_token"]
        if token is None:
            break
        assert isinstance(token, str) and token, page
        assert len(got) == (limit or 100), "only the last page is short"
    keys = [k for k, _ in entries]
    assert keys == sorted(set(keys)), "keys in order, each once"
    return entries, pages


def cursor_metrics(ps: Pageserver) -> dict[str, float]:
    m = Metrics(ps.http.metrics_text())
    out = {
        name: m.value(f"pageserver_scan_cursor_cache_{name}_total")
        for name in ("lookups", "hits", "misses", "drops", "inserts")
    }
    for reason in ("expired", "size"):
        out[reason] = m.value("pageserver_scan_cursor_cache_evictions_total", reason=reason)
    out["cursors"] = m.value("pageserver_scan_cursor_cache_cursors")
    return out


def moved(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in before if k != "cursors"}


def read_cost(r) -> dict[str, int]:
    return {name: int(value) for name, value in (pair.split("=") for pair in r.headers["x-read-cost"].split())}


def spread_over_layers(timeline: TimelineHandle, keys: list[bytes], seed: int = 1, batches: int = 40) -> None:
    """Seeded random versions of `keys`, with checkpoints now and then: versions in delta layers,
    and (with a small checkpoint_distance) frozen and open layers."""
    work = Workload(seed, keys)
    for i in range(batches):
        timeline.ingest(work.batch())
        if i % 15 == 14:
            timeline.checkpoint()


@pytest.mark.parametrize("seed", [1, 2])
def test_paged_scans_match_the_model(pageserver_factory: PageserverFactory, seed: int):
    """Random versions over two relations, in delta layers and in memory. Scans of the whole key
    space, of one relation and of part of it, paged with small and large limits, at LSNs before
    anything, before some keys' first version, in between and at the end, give exactly the
    model's keys and pages."""
    ps = pageserver_factory.start({"checkpoint_distance": "96KiB", "page_cache_size": "1MiB"})
    timeline = TimelineHandle.create(ps)
    keys = [key(i) for i in range(16)] + [rel_key(relnode=16385, blknum=i) for i in range(6)]
    spread_over_layers(timeline, keys, seed)
    layers = ps.http.layers(timeline.tenant_id, timeline.timeline_id)
    assert sum(1 for layer in layers if layer["kind"] == "delta") >= 2, layers

    all_lsns = timeline.model.all_lsns()
    first_versions = sorted(timeline.model.lsns(k)[0] for k in timeline.model.keys())
    lsns = [
        all_lsns[0] - 1,
        # Some keys have versions here, others only later.
        first_versions[len(first_versions) // 2],
        all_lsns[len(all_lsns) * 3 // 4] + 1,
        timeline.model.last_lsn,
    ]
    missing_somewhere = [k for k in timeline.model.keys() if timeline.model.lsns(k)[0] > lsns[1]]
    assert missing_somewhere, "the second LSN lies before some keys' first version"
    ranges = [(MIN_KEY, MAX_KEY), (REL_START, REL_END), (key(3), key(11))]
    for lsn in lsns:
        for start, end in ranges:
            want = expected(timeline, start, end, lsn)
            for limit in (1, 3, 7, None):
                got, pages = scan(timeline, start, end, lsn, limit)
                assert [k.hex() for k, _ in got] == [k.hex() for k, _ in want], (Lsn(lsn), start.hex(), limit)
                assert got == want
                # Every page but the last is full; the last may be empty when the keys left
                # after a full page have versions but no page (no base) at the LSN.
                full_pages = -(-len(want) // (limit or 100))
                assert pages in (max(1, full_pages), full_pages + 1), (len(want), limit, pages)
    # A scan entry is exactly what a point read returns.
    lsn = lsns[2]
    for k, page in scan(timeline, MIN_KEY, MAX_KEY, lsn, 5)[0]:
        assert timeline.get(k, lsn) == page


def test_empty_ranges_and_lsns(timeline: TimelineHandle):
    timeline.ingest([Image(key(1), 0x10, page_of(1))])
    http = timeline.http
    for start, end, lsn in [(key(1), key(1), 0x10), (key(2), MAX_KEY, 0x10), (MIN_KEY, key(1), 0x10), (MIN_KEY, MAX_KEY, 0xF), (MIN_KEY, MAX_KEY, 0)]:
        page = http.scan_keys(timeline.tenant_id, timeline.timeline_id, start, end, lsn)
        assert page == {"entries": [], "next_page_token": None}, (start.hex(), end.hex(), lsn)
    # A key whose versions hold no base has no page: left out, as a point read says 404.
    timeline.ingest([delta(key(2), 0x20, (0, b"orphan")), delta(key(3), 0x20, (0, b"based"), will_init=True)])
    got, _ = scan(timeline, MIN_KEY, MAX_KEY, 0x20, 1)
    assert [k for k, _ in got] == [key(1), key(3)]
    assert got == expected(timeline, MIN_KEY, MAX_KEY, 0x20)


def test_a_scan_of_p_pages_has_p_minus_one_hits(pageserver: Pageserver):
    timeline = TimelineHandle.create(pageserver)
    timeline.ingest([Image(key(i), 0x10, page_of(i, 100)) for i in range(30)])
    timeline.checkpoint()
    timeline.ingest([Image(key(i), 0x20, page_of(100 + i, 100)) for i in range(0, 30, 4)])
    before = cursor_metrics(pageserver)
    got, pages = scan(timeline, MIN_KEY, MAX_KEY, 0x20, 4)
    assert got == expected(timeline, MIN_KEY, MAX_KEY, 0x20)
    assert pages == 8
    after = cursor_metrics(pageserver)
    assert moved(before, after) == {"lookups": 7, "hits": 7, "misses": 0, "drops": 0, "inserts": 7, "expired": 0, "size": 0}
    assert after["cursors"] == 0, "the last page keeps no cursor"


@pytest.mark.parametrize(
    "setting,reason",
    [({"scan_cursor_idle_timeout": "200ms"}, "expired"), ({"scan_cursor_cache_size": 1}, "size")],
    ids=["expired", "size"],
)
def test_a_token_works_after_its_cursor_is_evicted(pageserver_factory: PageserverFactory, setting: dict, reason: str):
    """A cursor evicted for idling too long, or for not fitting the cache, leaves its token
    working: the next page re-seeks from the token's last key, with the same answer."""
    ps = pageserver_factory.start({"checkpoint_distance": "64KiB", **setting})
    timeline = TimelineHandle.create(ps)
    spread_over_layers(timeline, [key(i) for i in range(20)])
    lsn = timeline.model.last_lsn
    want = expected(timeline, MIN_KEY, MAX_KEY, lsn)

    def evicted(_page: int) -> None:
        # The cursor the last page kept is gone before the next page asks for it.
        wait_until(lambda: cursor_metrics(ps)["cursors"] == 0 and cursor_metrics(ps)[reason] >= evicted.count + 1, what=f"a cursor evicted ({reason})")
        evicted.count += 1

    evicted.count = cursor_metrics(ps)[reason]
    before = cursor_metrics(ps)
    got, pages = scan(timeline, MIN_KEY, MAX_KEY, lsn, 3, between=evicted)
    assert got == want
    assert pages > 2
    change = moved(before, cursor_metrics(ps))
    assert (change["lookups"], change["hits"], change["misses"]) == (pages - 1, 0, pages - 1)
    assert change[reason] == pages - 1


def test_layer_changes_and_ingest_between_pages(pageserver: Pageserver):
    """A checkpoint between pages changes the layers under a kept cursor: it is dropped and the
    page re-seeks. Ingest between pages adds versions above the scan's LSN: nothing changes."""
    timeline = TimelineHandle.create(pageserver)
    timeline.ingest([Image(key(i), 0x10, page_of(i, 200)) for i in range(0, 40, 2)])
    timeline.checkpoint()
    timeline.ingest([Image(key(i), 0x20, page_of(100 + i, 200)) for i in range(1, 40, 2)])
    lsn = 0x20
    want = expected(timeline, MIN_KEY, MAX_KEY, lsn)
    next_lsn = [0x30]

    def between(page: int) -> None:
        if page == 2:
            timeline.checkpoint()
        # New keys, and new versions of keys already returned and still to come.
        timeline.ingest([Image(key(i), next_lsn[0], page_of(1000 + page)) for i in (page, 20 + page, 100 + page)])
        next_lsn[0] += 0x10
        if page == 4:
            timeline.checkpoint()

    before = cursor_metrics(pageserver)
    got, pages = scan(timeline, MIN_KEY, MAX_KEY, lsn, 5, between=between)
    assert got == want
    assert pages == 8
    change = moved(before, cursor_metrics(pageserver))
    # Every page found its cursor. Pages 3 and 5 found the layers changed under it by a
    # checkpoint, page 6 by the new open layer the ingest before it started.
    assert (change["hits"], change["misses"], change["drops"]) == (pages - 1, 0, 3), change
    # The same scan at the new last LSN sees the new versions.
    assert scan(timeline, MIN_KEY, MAX_KEY, timeline.model.last_lsn, 7)[0] == expected(timeline, MIN_KEY, MAX_KEY, timeline.model.last_lsn)


def test_invalid_tokens_are_refused(pageserver: Pageserver):
    timeline = TimelineHandle.create(pageserver)
    sibling = TimelineHandle(pageserver, timeline.tenant_id, pageserver.http.timeline_create(timeline.tenant_id)["timeline_id"])
    for tl in (timeline, sibling):
        tl.ingest([Image(key(i), 0x10, page_of(i, 64)) for i in range(10)])
        tl.ingest([Image(key(i), 0x20, page_of(50 + i, 64)) for i in range(10)])
    http = pageserver.http
    token = http.scan_keys(timeline.tenant_id, timeline.timeline_id, REL_START, REL_END, 0x20, limit=3)["next_page_token"]
    assert len(token) == 119

    def refused(tl: TimelineHandle, page_token: str, lsn=0x20, start=REL_START, end=REL_END) -> str:
        r = http.request(
            "GET",
            keys_url(tl),
            params={"start": start.hex(), "end": end.hex(), "lsn": str(Lsn(lsn)) if isinstance(lsn, int) else lsn, "page_token": page_token},
        )
        assert r.status_code == 400, r.text
        return api_error(r).msg

    mangled = token[:60] + ("B" if token[60] != "B" else "C") + token[61:]
    assert "checksum" in refused(timeline, mangled)
    assert "is 3 characters long" in refused(timeline, "xyz")
    assert "is 118 characters long" in refused(timeline, token[:-1])
    assert "not URL-safe base64" in refused(timeline, "." * 119)
    assert "version 0" in refused(timeline, "A" * 119)
    assert f"issued for timeline {timeline.timeline_id}, not {sibling.timeline_id}" in refused(sibling, token)
    assert "issued for a scan at LSN 0/20, not 0/10" in refused(timeline, token, lsn=0x10)
    assert "issued for a scan ending at key" in refused(timeline, token, end=MAX_KEY)
    assert "which is below start" in refused(timeline, token, start=key(9))
    # A token from another tenant: refused by what it says, before the timeline is looked up.
    other = TimelineHandle.create(pageserver)
    assert "issued for tenant" in refused(other, token)

    # The genuine token still works, and again: it always continues after its last key.
    for _ in range(2):
        page = http.scan_keys(timeline.tenant_id, timeline.timeline_id, REL_START, REL_END, 0x20, limit=3, page_token=token)
        assert [k for k, _ in entries_of(page)] == [key(3), key(4), key(5)]
    # `latest` with a token means the token's LSN, even after more ingest.
    timeline.ingest([Image(key(4), 0x30, page_of(99, 64))])
    page = http.scan_keys(timeline.tenant_id, timeline.timeline_id, REL_START, REL_END, "latest", limit=3, page_token=token)
    assert entries_of(page) == expected(timeline, key(3), REL_END, 0x20)[:3]


@pytest.mark.parametrize(
    "query,contains",
    [
        ("", "missing query parameter `start`"),
        (f"start={key(1).hex()}&lsn=latest", "missing query parameter `end`"),
        (f"start={key(1).hex()}&end={key(2).hex()}", "missing query parameter `lsn`"),
        (f"start={key(1).hex()[:-2]}&end={key(2).hex()}&lsn=latest", "query parameter start"),
        (f"start={key(1).hex()}&end={key(2).hex()}zz&lsn=latest", "query parameter end"),
        (f"start={key(1).hex()}&end={key(2).hex()}&lsn=x/1", "query parameter lsn"),
        (f"start={key(2).hex()}&end={key(1).hex()}&lsn=latest", "is above end"),
        (f"start={key(1).hex()}&end={key(2).hex()}&lsn=latest&limit=0", "limit: `0` is not a number from 1 to 1000"),
        (f"start={key(1).hex()}&end={key(2).hex()}&lsn=latest&limit=1001", "from 1 to 1000"),
        (f"start={key(1).hex()}&end={key(2).hex()}&lsn=latest&limit=-1", "from 1 to 1000"),
        (f"start={key(1).hex()}&end={key(2).hex()}&lsn=latest&limit=ten", "from 1 to 1000"),
        (f"start={key(1).hex()}&end={key(2).hex()}&lsn=latest&limit=", "from 1 to 1000"),
        (f"start={key(1).hex()}&end={key(2).hex()}&lsn=latest&page_token=", "page_token is 0 characters long"),
        (f"start={key(1).hex()}&end={key(2).hex()}&lsn=latest&key=1", "unknown query parameter `key`"),
        (f"start={key(1).hex()}&end={key(2).hex()}&lsn=latest&limit=1&limit=2", "query parameter `limit` is given more than once"),
    ],
    ids=[
        "nothing", "no_end", "no_lsn", "start_short", "end_long", "lsn_bad", "start_above_end",
        "limit_zero", "limit_too_big", "limit_negative", "limit_word", "limit_empty", "token_empty",
        "unknown_parameter", "limit_twice",
    ],
)
def test_scan_query_errors(timeline: TimelineHandle, query: str, contains: str):
    timeline.ingest([Image(key(1), 0x10, page_of(1))])
    r = timeline.http.request("GET", keys_url(timeline) + "?" + query)
    assert r.status_code == 400, r.text
    assert contains in api_error(r).msg


def test_unknown_tenant_or_timeline_is_404(timeline: TimelineHandle):
    http = timeline.http
    ghost = "0" * 32
    for tenant, tl in [(ghost, timeline.timeline_id), (timeline.tenant_id, ghost)]:
        with pytest.raises(PageserverApiError) as e:
            http.scan_keys(tenant, tl, MIN_KEY, MAX_KEY, "latest")
        assert e.value.status_code == 404
    r = http.request("GET", f"/v1/tenant/xyz/timeline/{timeline.timeline_id}/keys", params={"start": MIN_KEY.hex(), "end": MAX_KEY.hex(), "lsn": "latest"})
    assert r.status_code == 400 and "invalid tenant id" in api_error(r).msg


def test_an_lsn_not_yet_ingested_waits_then_fails(pageserver_factory: PageserverFactory):
    """As GET .../page: a scan beyond last_record_lsn waits for it, up to wait_lsn_timeout."""
    ps = pageserver_factory.start({"wait_lsn_timeout": "300ms"})
    timeline = TimelineHandle.create(ps)
    timeline.ingest([Image(key(1), 0x10, page_of(1))])
    with pytest.raises(PageserverApiError) as e:
        ps.http.scan_keys(timeline.tenant_id, timeline.timeline_id, MIN_KEY, MAX_KEY, 0x11)
    assert e.value.status_code == 503
    assert "timed out" in e.value.msg and "0/11" in e.value.msg
    r = ps.http.scan_keys_response(timeline.tenant_id, timeline.timeline_id, MIN_KEY, MAX_KEY, "latest")
    assert r.headers["x-lsn"] == "0/10"
    assert [k for k, _ in entries_of(r.json())] == [key(1)]


def test_read_cost_of_a_resumed_page_and_a_reseeked_one(pageserver_factory: PageserverFactory):
    """X-Read-Cost is on every page. With everything cached, the page a kept cursor resumes
    reads fewer index blocks than the same page re-seeked from the token (its cursor taken by
    the first use), and both give the same entries. (No background compaction: it would change
    the layer set between the pages, and every cursor would re-seek.)"""
    pageserver = pageserver_factory.start(NO_BACKGROUND_COMPACTION)
    timeline = TimelineHandle.create(pageserver)
    for layer in range(4):
        timeline.ingest([Image(key(i), 0x10 + layer, page_of(i, 200)) for i in range(layer, 400, 4)])
        timeline.checkpoint()
    http = pageserver.http
    # Warm every block the scan reads.
    scan(timeline, MIN_KEY, MAX_KEY, "latest", 50)
    first = http.scan_keys(timeline.tenant_id, timeline.timeline_id, MIN_KEY, MAX_KEY, "latest", limit=50)
    token = first["next_page_token"]
    resumed = http.scan_keys_response(timeline.tenant_id, timeline.timeline_id, MIN_KEY, MAX_KEY, "latest", limit=50, page_token=token)
    reseeked = http.scan_keys_response(timeline.tenant_id, timeline.timeline_id, MIN_KEY, MAX_KEY, "latest", limit=50, page_token=token)
    assert resumed.json()["entries"] == reseeked.json()["entries"]
    assert entries_of(resumed.json()) == expected(timeline, key(50), MAX_KEY, 0x13)[:50]
    cost_resumed, cost_reseeked = read_cost(resumed), read_cost(reseeked)
    assert set(cost_resumed) == {"layers", "idx_hit", "idx_miss", "val_hit", "val_miss", "ios", "bytes", "waits", "downloads"}
    assert cost_resumed["ios"] == cost_reseeked["ios"] == 0
    assert cost_reseeked["idx_hit"] > cost_resumed["idx_hit"], (cost_resumed, cost_reseeked)
    assert cost_reseeked["val_hit"] == cost_resumed["val_hit"]
