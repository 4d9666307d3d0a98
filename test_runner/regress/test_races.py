"""Creations and deletions of tenants and timelines racing each other over HTTP. Whichever
wins, the loser gets a clear 404 or 409, never a 5xx, no error message shows a path of the
server's file system, and what the server reports afterwards is what is on disk (also after a
restart)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Callable, Optional

import pytest
import requests

from fixtures.http import PageserverHttpClient
from fixtures.ingest import Image, key, page_of
from fixtures.pageserver import Pageserver
from fixtures.timeline import TimelineHandle
from fixtures.utils import wait_until

# Each test races for at most this many rounds, and stops early after this many seconds.
ROUNDS = 80
DEADLINE = 20.0


class Outcomes:
    """Every answer the racing clients got: statuses counted, bad ones kept whole."""

    def __init__(self, ps: Pageserver):
        self.ps = ps
        self.statuses: Counter[tuple[str, int]] = Counter()
        self.bad: list[str] = []
        self.lock = threading.Lock()
        # The work directory as the server was told it, and as the file system names it.
        self.paths = {str(ps.workdir), str(ps.workdir.resolve())}

    def record(self, what: str, r: requests.Response) -> int:
        with self.lock:
            self.statuses[(what, r.status_code)] += 1
            if r.status_code >= 500:
                self.bad.append(f"{what}: {r.status_code} {r.text}")
            if any(p in r.text for p in self.paths):
                self.bad.append(f"{what}: a server path in {r.status_code} {r.text}")
        return r.status_code

    def check(self, allowed: dict[str, set[int]]) -> None:
        print("answers:", dict(self.statuses))
        assert not self.bad, "\n".join(self.bad[:20])
        for (what, status), _ in self.statuses.items():
            assert status in allowed[what], (what, status, dict(self.statuses))


def race(*actions: Callable[[], None]) -> None:
    """Runs the actions at the same moment, each in its own thread; fails on the first
    exception one of them raised."""
    barrier = threading.Barrier(len(actions))
    errors: list[BaseException] = []

    def run(action: Callable[[], None]) -> None:
        try:
            barrier.wait(timeout=10)
            action()
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(a,), daemon=True) for a in actions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "a racing request hangs"
    if errors:
        raise errors[0]


def rounds() -> range:
    return range(ROUNDS)


def leftovers(ps: Pageserver) -> list[str]:
    return [str(p.relative_to(ps.workdir)) for p in ps.leftovers()]


def test_timeline_creation_races_tenant_deletion(pageserver: Pageserver):
    """Timelines created while their tenant is deleted: each creation either lands before the
    deletion (201, and the deletion takes the timeline with it) or is refused with 404."""
    ps = pageserver
    out = Outcomes(ps)
    clients = [ps.http_client() for _ in range(3)]
    deadline = time.monotonic() + DEADLINE
    for _ in rounds():
        if time.monotonic() > deadline:
            break
        tenant = ps.http.tenant_create()["id"]

        def create(client: PageserverHttpClient = clients[0]) -> None:
            for _ in range(4):
                if out.record("create", client.request("POST", f"/v1/tenant/{tenant}/timeline", json={})) == 404:
                    return

        def delete() -> None:
            out.record("delete", clients[2].request("DELETE", f"/v1/tenant/{tenant}"))

        race(create, lambda: create(clients[1]), delete)
        assert ps.http.request("GET", f"/v1/tenant/{tenant}").status_code == 404
        assert not ps.tenant_dir(tenant).exists(), f"tenant {tenant} was deleted but its directory is back"
    out.check({"create": {201, 404}, "delete": {200}})
    assert out.statuses[("create", 404)] > 0, dict(out.statuses)
    assert leftovers(ps) == []
    ps.restart()
    assert ps.http.tenant_list() == []


def test_timeline_creation_races_its_deletion(pageserver: Pageserver):
    """The same timeline id created and deleted at once, over and over: every answer is 200,
    201, 404 or 409, and the server's list matches the directories."""
    ps = pageserver
    out = Outcomes(ps)
    tenant = ps.http.tenant_create()["id"]
    timeline = "fedcba9876543210fedcba9876543210"
    path = f"/v1/tenant/{tenant}/timeline"
    clients = [ps.http_client() for _ in range(3)]
    deadline = time.monotonic() + DEADLINE
    for _ in rounds():
        if time.monotonic() > deadline:
            break
        race(
            lambda: out.record("create", clients[0].request("POST", path, json={"new_timeline_id": timeline})),
            lambda: out.record("delete", clients[1].request("DELETE", f"{path}/{timeline}")),
            lambda: out.record("create", clients[2].request("POST", path, json={"new_timeline_id": timeline})),
        )
        listed = [t["timeline_id"] for t in ps.http.timeline_list(tenant)]
        on_disk = sorted(p.name for p in (ps.tenant_dir(tenant) / "timelines").iterdir() if not p.name.startswith("."))
        assert [n for n in on_disk if "___" not in n] == listed, (on_disk, listed)
    out.check({"create": {201, 409}, "delete": {200, 404}})
    assert leftovers(ps) == []


def test_tenant_creation_races_its_deletion(pageserver: Pageserver):
    """The same tenant id created and deleted at once, and a timeline of it deleted too."""
    ps = pageserver
    out = Outcomes(ps)
    tenant = "0123456789abcdef0123456789abcdef"
    clients = [ps.http_client() for _ in range(4)]
    deadline = time.monotonic() + DEADLINE
    for _ in rounds():
        if time.monotonic() > deadline:
            break
        timeline: Optional[str] = None
        if ps.http.request("GET", f"/v1/tenant/{tenant}").status_code == 200:
            timeline = ps.http.timeline_create(tenant)["timeline_id"]
        race(
            lambda: out.record("create", clients[0].request("POST", "/v1/tenant", json={"new_tenant_id": tenant})),
            lambda: out.record("delete", clients[1].request("DELETE", f"/v1/tenant/{tenant}")),
            lambda: out.record("create", clients[2].request("POST", "/v1/tenant", json={"new_tenant_id": tenant})),
            lambda: timeline and out.record("delete_timeline", clients[3].request("DELETE", f"/v1/tenant/{tenant}/timeline/{timeline}")),
        )
        exists = ps.http.request("GET", f"/v1/tenant/{tenant}").status_code == 200
        assert exists == ps.tenant_dir(tenant).exists(), f"tenant listed: {exists}, directory: {not exists}"
    out.check({"create": {201, 409}, "delete": {200, 404}, "delete_timeline": {200, 404}})
    assert leftovers(ps) == []


@pytest.mark.needs_testing
def test_tenant_deletion_waits_for_a_timeline_deletion_waiting_for_a_flush(pageserver: Pageserver):
    """A timeline's deletion waits for its flush in progress; a deletion of its tenant that
    comes meanwhile must wait for that flush too, rather than remove the directory the flush
    is writing into (which failed the flush with a 500 naming a server path)."""
    ps = pageserver
    out = Outcomes(ps)
    tl = TimelineHandle.create(ps)
    tl.ingest([Image(key(1), 0x10, page_of(1))])
    tl_path = f"/v1/tenant/{tl.tenant_id}/timeline/{tl.timeline_id}"
    threads: list[threading.Thread] = []

    def start(what: str, method: str, path: str) -> None:
        client = ps.http_client()
        t = threading.Thread(target=lambda: out.record(what, client.request(method, path)), daemon=True)
        t.start()
        threads.append(t)

    ps.http.configure_failpoints(("layer-before-rename", "pause"))
    try:
        start("checkpoint", "PUT", f"{tl_path}/checkpoint")
        tl_dir = ps.timeline_dir(tl.tenant_id, tl.timeline_id)
        wait_until(lambda: any(p.name.endswith(".___temp") for p in tl_dir.iterdir()), what="flush in progress")
        start("delete_timeline", "DELETE", tl_path)
        wait_until(lambda: ps.http.request("GET", tl_path).status_code == 404, what="timeline out of the map")
        start("delete_tenant", "DELETE", f"/v1/tenant/{tl.tenant_id}")
        wait_until(lambda: ps.http.request("GET", f"/v1/tenant/{tl.tenant_id}").status_code == 404, what="tenant out of the map")
        # Both deletions wait for the paused flush: the directories are still there.
        assert tl_dir.is_dir()
    finally:
        ps.http.configure_failpoints(("layer-before-rename", "off"))
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "a request hangs"
    out.check({"checkpoint": {200, 503}, "delete_timeline": {200}, "delete_tenant": {200}})
    assert not ps.tenant_dir(tl.tenant_id).exists()
    assert leftovers(ps) == []
