"""The work directory and settings: a fresh directory gets pageserver.toml, mistakes in settings
stop the server with a message naming them, one directory serves one server, deletion removes
directories, log formats; and a corrupt layer file breaks only its own tenant."""

from __future__ import annotations

import json
import shutil
import tomllib

import pytest

from fixtures.http import PageserverApiError
from fixtures.ingest import Image, Workload, key, page_of
from fixtures.plugin import PageserverFactory
from fixtures.timeline import TimelineHandle

FATAL = "pageserver: error:"


def test_fresh_workdir_gets_the_first_starts_settings(pageserver_factory: PageserverFactory):
    """The first start writes pageserver.toml: every setting at its default, except those its -c
    overrides set, which the file records (so it says what the server ran with)."""
    ps = pageserver_factory.create()
    assert not ps.workdir.exists()
    ps.start()
    text = (ps.workdir / "pageserver.toml").read_text()
    config = tomllib.loads(text)
    assert config == {
        # The harness's -c overrides.
        "id": ps.server_id,
        "listen_http_addr": f"127.0.0.1:{ps.port}",
        "listen_grpc_addr": f"127.0.0.1:{ps.grpc_port}",
        "page_cache_size": "16MiB",
        # The defaults.
        "page_cache_index_percent": 25,
        "materialized_versions_per_key": 4,
        "checkpoint_distance": "256MiB",
        "checkpoint_timeout": "10m",
        "max_frozen_layers": 2,
        "compaction_target_size": "128MiB",
        "compaction_threshold": 4,
        "l0_slowdown_threshold": 8,
        "l0_stop_threshold": 12,
        "image_creation_threshold": 3,
        "image_creation_delta_percent": 100,
        "layer_compression": "zstd",
        "gc_horizon": "64MiB",
        "remote_storage_connect_timeout": "5s",
        "remote_storage_request_timeout": "30s",
        "remote_storage_operation_timeout": "1m",
        "upload_queue_max_bytes": "512MiB",
        "upload_queue_wait_timeout": "30s",
        "max_local_layer_bytes": 0,
        "test_remote_failures": 0,
        "snapshot_wal_distance": "64MiB",
        "wait_lsn_timeout": "60s",
        "max_lsn_waiters": 1024,
        "max_value_size": "1MiB",
        "max_file_descriptors": 512,
        "max_request_body_size": "64MiB",
        "http_header_read_timeout": "10s",
        "http_body_read_timeout": "30s",
        "import_body_read_timeout": "10m",
        "http_response_write_timeout": "30s",
        "grpc_handshake_timeout": "10s",
        "grpc_answer_bytes_per_stream": "16MiB",
        "grpc_answer_bytes_per_connection": "64MiB",
        "max_buffered_request_bytes": "256MiB",
        "max_concurrent_imports": 4,
        "max_concurrent_imports_per_tenant": 2,
        "max_concurrent_basebackups": 16,
        "max_concurrent_basebackups_per_tenant": 4,
        "max_concurrent_downloads": 32,
        "max_concurrent_downloads_per_tenant": 8,
        "scan_cursor_cache_size": "16MiB",
        "scan_cursor_idle_timeout": "60s",
        "log_format": "plain",
        "http_auth_type": "Trust",
    }
    assert (ps.workdir / "tenants").is_dir()
    assert int((ps.workdir / "pageserver.pid").read_text()) == ps.pid
    assert f"id = {ps.server_id} # set with -c at the first start" in text
    assert "# How many reconstructed versions of one page" in text, "the comments stay"
    assert ps.log_contains("initialized a fresh work directory .* and this start's -c overrides")
    # Later -c overrides win over the file, which is not rewritten.
    ps.restart(overrides={"max_frozen_layers": 5})
    assert (ps.workdir / "pageserver.toml").read_text() == text


def test_settings_file_is_read(pageserver_factory: PageserverFactory):
    ps = pageserver_factory.create({"id": None})
    ps.workdir.mkdir(parents=True)
    ps.server_id = 4242
    (ps.workdir / "pageserver.toml").write_text(f'id = 4242\nlisten_http_addr = "127.0.0.1:{ps.port}"\n')
    ps.config.pop("id", None)
    ps.start()
    assert ps.http.status()["id"] == 4242
    assert not ps.log_contains("initialized a fresh work directory")


@pytest.mark.parametrize(
    "override,contains",
    [
        ("no_such_setting=1", "no_such_setting"),
        ("checkpoint_distanse=1MiB", "checkpoint_distanse"),
        ("checkpoint_distance=12parsecs", "unknown size unit"),
        ("checkpoint_timeout=soon", "not a duration"),
        ("checkpoint_timeout=0s", "checkpoint_timeout"),
        ("listen_http_addr=nowhere", "invalid socket address"),
        ("max_value_size=100", "smaller than a page"),
        ("max_request_body_size=0", "max_request_body_size = 0B is out of range: it must be from 8223B to 4GiB"),
        ("max_concurrent_downloads=0", "max_concurrent_downloads = 0 is out of range: it must be from 1 to 1024"),
        ("checkpoint_distance=0", "checkpoint_distance = 0B is out of range: it must be from 8KiB to 1TiB"),
        ("max_frozen_layers=0", "max_frozen_layers = 0 is out of range: it must be from 1 to 1000"),
        ("wait_lsn_timeout=0s", "wait_lsn_timeout = 0s is out of range: it must be from 1ms to 1day"),
        ("materialized_versions_per_key=9", "it must be from 0 to 8"),
        ("log_format=xml", "log_format"),
        ("http_auth_type=Magic", "http_auth_type"),
        ("id=-1", "in `id`"),
        ("checkpoint_distance", "expected key=value"),
        ("=5", "key is empty"),
    ],
)
def test_bad_settings_refused_by_name(pageserver_factory: PageserverFactory, override: str, contains: str):
    ps = pageserver_factory.create()
    ps.allowed_errors.append(FATAL)
    args = ps.command() + ["-c", override]
    code, out = ps.run_to_exit(args=args)
    assert code == 1, out
    assert FATAL in out and contains in out, out
    assert not (ps.workdir / "tenants").exists(), "nothing starts with bad settings"


def test_unknown_key_in_settings_file(pageserver_factory: PageserverFactory):
    ps = pageserver_factory.create()
    ps.allowed_errors.append(FATAL)
    ps.workdir.mkdir(parents=True)
    (ps.workdir / "pageserver.toml").write_text('page_cache_size = "8MiB"\nchekpoint_timeout = "1s"\n')
    code, out = ps.run_to_exit()
    assert code == 1 and "chekpoint_timeout" in out, out
    (ps.workdir / "pageserver.toml").write_text("id = [\n")
    code, out = ps.run_to_exit()
    assert code == 1 and "pageserver.toml" in out, out


def test_second_server_on_same_workdir_is_refused(pageserver_factory: PageserverFactory):
    first = pageserver_factory.start()
    timeline = TimelineHandle.create(first)
    timeline.ingest([Image(key(1), 0x10, page_of(1))])
    second = pageserver_factory.create(workdir=first.workdir, name="second")
    second.allowed_errors.append(FATAL)
    code, out = second.run_to_exit()
    assert code == 1
    assert f"another pageserver (pid {first.pid}) is using work directory" in out, out
    # The first server is unaffected, and so is its lock file.
    assert int((first.workdir / "pageserver.pid").read_text()) == first.pid
    timeline.verify()
    # Once the first is gone, the directory is free again (the stale pid file does not matter).
    first.kill()
    second.start()
    assert [t["id"] for t in second.http.tenant_list()] == [timeline.tenant_id]


def test_port_in_use_is_refused(pageserver_factory: PageserverFactory):
    first = pageserver_factory.start()
    second = pageserver_factory.create({"listen_http_addr": f"127.0.0.1:{first.port}"})
    second.allowed_errors.append(FATAL)
    code, out = second.run_to_exit()
    assert code == 1 and f"127.0.0.1:{first.port}" in out, out
    assert first.http.status()["id"] == first.server_id


def test_json_log_format(pageserver_factory: PageserverFactory):
    ps = pageserver_factory.start({"log_format": "json"})
    ps.http.tenant_create()
    ps.stop()
    lines = [line for line in ps.log_text().splitlines() if not line.startswith("===")]
    records = [json.loads(line) for line in lines]
    assert all({"timestamp", "level", "fields"} <= set(r) for r in records), records[:3]
    messages = [r["fields"].get("message", "") for r in records]
    assert any("created tenant" in m for m in messages)
    assert any("shut down cleanly" in m for m in messages)


def test_deletion_removes_directories(pageserver_factory: PageserverFactory):
    ps = pageserver_factory.start()
    timeline = TimelineHandle.create(ps)
    work = Workload(2, [key(i) for i in range(4)])
    timeline.ingest(work.batch())
    timeline.checkpoint()
    timeline.ingest(work.batch())  # an open layer with its ephemeral file, too
    second = ps.http.timeline_create(timeline.tenant_id)["timeline_id"]
    tl_dir = ps.timeline_dir(timeline.tenant_id, timeline.timeline_id)
    assert (tl_dir / "metadata").exists() and ps.timeline_dir(timeline.tenant_id, second).is_dir()

    ps.http.timeline_delete(timeline.tenant_id, timeline.timeline_id)
    assert not tl_dir.exists()
    assert ps.timeline_dir(timeline.tenant_id, second).is_dir()
    with pytest.raises(PageserverApiError) as e:
        ps.http.get_page(timeline.tenant_id, timeline.timeline_id, key(0), "latest")
    assert e.value.status_code == 404 and "timeline" in e.value.msg

    ps.http.tenant_delete(timeline.tenant_id)
    assert not ps.tenant_dir(timeline.tenant_id).exists()
    assert list(ps.tenants_dir.iterdir()) == []
    ps.restart()
    assert ps.http.tenant_list() == []


def corrupt(path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


@pytest.mark.parametrize("damage", ["summary", "truncated", "metadata"])
def test_corrupt_layer_breaks_only_its_tenant(pageserver_factory: PageserverFactory, damage: str):
    ps = pageserver_factory.start()
    victim = TimelineHandle.create(ps)
    healthy = TimelineHandle.create(ps)
    for n, tl in enumerate((victim, healthy)):
        work = Workload(n, [key(i) for i in range(6)])
        for _ in range(5):
            tl.ingest(work.batch())
        tl.checkpoint()
    # A second, undamaged timeline of the victim's tenant.
    sibling = ps.http.timeline_create(victim.tenant_id)["timeline_id"]
    ps.stop()

    (layer,) = [p for p in ps.timeline_dir(victim.tenant_id, victim.timeline_id).iterdir() if p.name != "metadata"]
    if damage == "summary":
        corrupt(layer, 0, b"\xde\xad\xbe\xef")
    elif damage == "metadata":
        corrupt(layer.parent / "metadata", 0, b"\xff\xff")
    else:
        with open(layer, "r+b") as f:
            f.truncate(100)
    # No copy in remote storage to take the layer from again (with one, it is downloaded: see
    # test_attach.py).
    shutil.rmtree(ps.workdir / "remote")
    ps.allowed_errors.extend([r"ERROR .*tenant is broken", r"request failed: tenant .* is broken"])
    ps.start()

    info = ps.http.tenant_info(victim.tenant_id)
    assert info["state"] == "Broken", info
    assert victim.timeline_id in info["broken_reason"]
    # The reason names files as the tenant knows them; the log has the server's whole path.
    assert str(ps.workdir) not in info["broken_reason"], info
    assert ps.log_contains(rf"tenant is broken.*{victim.timeline_id}")
    # The broken tenant's data is refused as unavailable, not served wrong...
    for call in (
        lambda: ps.http.timeline_list(victim.tenant_id),
        lambda: ps.http.timeline_info(victim.tenant_id, victim.timeline_id),
        lambda: ps.http.timeline_info(victim.tenant_id, sibling),
        lambda: victim.get(key(0), "latest"),
        lambda: ps.http.one_shot().ingest(victim.tenant_id, victim.timeline_id, [Image(key(0), 1 << 40, page_of(0))]),
        lambda: ps.http.timeline_create(victim.tenant_id),
    ):
        with pytest.raises(PageserverApiError) as e:
            call()
        assert e.value.status_code == 503, e.value
        assert "broken" in e.value.msg
        assert str(ps.workdir) not in e.value.msg, e.value.msg
    # ... its files are kept as evidence...
    assert layer.exists()
    # ... and every other tenant works: reads, writes, checkpoints.
    healthy.verify()
    work = Workload(50, [key(i) for i in range(6)], start_lsn=healthy.model.last_lsn)
    healthy.ingest(work.batch())
    healthy.checkpoint()
    healthy.verify()
    assert ps.http.tenant_info(healthy.tenant_id)["state"] == "Active"
    assert {t["state"] for t in ps.http.tenant_list()} == {"Active", "Broken"}
    # A broken tenant can still be deleted.
    ps.http.tenant_delete(victim.tenant_id)
    assert not ps.tenant_dir(victim.tenant_id).exists()


def three_checkpoints(timeline: TimelineHandle, seed: int) -> list:
    """Three checkpoints of the same keys at the same LSNs: three layers, oldest first, named
    alike in every timeline written this way."""
    work = Workload(seed, [key(i) for i in range(6)], start_lsn=0x100)
    for _ in range(3):
        for _ in range(4):
            timeline.ingest(work.batch())
        timeline.checkpoint()
    layers = sorted(
        (p for p in timeline.ps.timeline_dir(timeline.tenant_id, timeline.timeline_id).iterdir() if p.name != "metadata"),
        key=lambda p: p.name.split("__")[1],
    )
    assert len(layers) == 3, layers
    return layers


@pytest.mark.parametrize("damage", ["middle_missing", "another_layer_swapped_in", "other_tenants_layer", "block_appended"])
def test_a_layer_set_that_disagrees_with_the_manifest_is_never_served(pageserver_factory: PageserverFactory, damage: str):
    """A layer file missing, another one's bytes under its name (even another tenant's layer of
    the same ranges), or a block appended: the timeline's tenant loads Broken with a reason that
    names the file, and answers no read, rather than serving pages from an incomplete set."""
    ps = pageserver_factory.start()
    victim = TimelineHandle.create(ps)
    other = TimelineHandle.create(ps)
    layers = three_checkpoints(victim, seed=1)
    theirs = three_checkpoints(other, seed=1)
    assert [p.name for p in layers] == [p.name for p in theirs]
    ps.stop()

    target = layers[1]
    if damage == "middle_missing":
        target.unlink()
    elif damage == "another_layer_swapped_in":
        target.write_bytes(layers[0].read_bytes())
    elif damage == "other_tenants_layer":
        target.write_bytes(theirs[1].read_bytes())
    else:
        with open(target, "ab") as f:
            f.write(b"\0" * 8192)
    # No copy in remote storage to take the layer from again (with one, it is downloaded: see
    # test_attach.py).
    shutil.rmtree(ps.workdir / "remote")
    ps.allowed_errors.extend([r"ERROR .*tenant is broken", r"request failed: tenant .* is broken"])
    ps.start()

    info = ps.http.tenant_info(victim.tenant_id)
    assert info["state"] == "Broken", info
    assert target.name in info["broken_reason"], info
    with pytest.raises(PageserverApiError) as e:
        victim.get(key(0), "latest")
    assert e.value.status_code == 503
    # The files are kept as evidence, and the other tenant serves every page right.
    assert layers[0].exists() and layers[2].exists()
    assert target.exists() == (damage != "middle_missing")
    other.verify()


def test_stray_files_in_a_timeline_directory_are_reported_and_left_alone(pageserver_factory: PageserverFactory):
    """A file that is not a layer (an operator's copy, an editor's backup) is logged by name and
    ignored; a layer-named file the manifest does not list (a flush that crashed before its
    manifest was stored) is removed; the tenant stays Active and serves every page."""
    ps = pageserver_factory.start()
    timeline = TimelineHandle.create(ps)
    layers = three_checkpoints(timeline, seed=3)
    ps.stop()
    tl_dir = layers[0].parent
    (tl_dir / "not-a-layer").write_bytes(b"\0" * 8192 * 3)
    # The same keys, at LSNs past disk_consistent_lsn: what a crashed flush leaves.
    unlisted = tl_dir / (layers[0].name[:-33] + "0000000000FFFFF0-0000000000FFFFF1")
    unlisted.write_bytes(layers[0].read_bytes())
    ps.allowed_errors.append(r"WARN .*not-a-layer")
    ps.start()

    assert ps.http.tenant_info(timeline.tenant_id)["state"] == "Active"
    assert ps.log_contains(r"WARN .*ignoring a file that is not one of the timeline's layer files.*not-a-layer")
    assert (tl_dir / "not-a-layer").exists()
    assert not unlisted.exists()
    timeline.verify()


def test_corrupt_value_is_an_error_not_a_wrong_page(pageserver_factory: PageserverFactory):
    """Damage inside a layer's values: the summary still validates, so the tenant loads; the
    damaged page's reads fail with a clear error; other pages read fine."""
    ps = pageserver_factory.start()
    timeline = TimelineHandle.create(ps)
    timeline.ingest([Image(key(1), 0x10, page_of(1)), Image(key(2), 0x10, page_of(2))])
    timeline.checkpoint()
    ps.stop()
    (layer,) = [p for p in ps.timeline_dir(timeline.tenant_id, timeline.timeline_id).iterdir() if p.name != "metadata"]
    # Values start at byte 8192 in key order: the middle of the first value is key 1's page.
    corrupt(layer, 8192 + 4000, b"\xff" * 16)
    ps.allowed_errors.append(r"request failed: .*corrupt")
    ps.start()
    with pytest.raises(PageserverApiError) as e:
        timeline.get(key(1), "latest")
    assert e.value.status_code == 500 and "corrupt" in e.value.msg and layer.name in e.value.msg
    assert timeline.get(key(2), "latest") == page_of(2)


def test_tenant_without_timelines_dir_breaks_only_itself(pageserver_factory: PageserverFactory):
    ps = pageserver_factory.start()
    healthy = TimelineHandle.create(ps)
    healthy.ingest([Image(key(1), 0x10, page_of(1))])
    damaged = ps.http.tenant_create()["id"]
    ps.stop()
    (ps.tenant_dir(damaged) / "timelines").rmdir()
    ps.allowed_errors.extend([FATAL, "tenant is broken", f"request failed: tenant {damaged} is broken"])
    ps.start()
    assert ps.http.tenant_info(damaged)["state"] == "Broken"
    healthy.verify()
