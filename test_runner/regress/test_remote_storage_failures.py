"""Remote storage that fails, against a real S3 API server (moto) on 127.0.0.1: a store that
stalls mid-download fails the reads waiting for it within the deadline; a store that is down
makes ingest answer 503 with Retry-After once the upload queue is full, and ingest resumes when
it is back; a server refuses to start, quickly and saying why, without credentials (and never
asks the instance metadata service unless told to), with a bucket that does not exist, with
credentials the store refuses or that lack the permission, and with a store it cannot reach.
No test sends a packet anywhere but 127.0.0.1: the metadata service is a listener of the
test's own."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Iterator

import pytest

from fixtures.ingest import Workload, encode_batch, key
from fixtures.plugin import PageserverFactory
from fixtures.ports import PortDistributor
from fixtures.remote_storage import LockedMoto, MetadataService, MotoServer, RemoteStore, TcpProxy
from fixtures.timeline import TimelineHandle
from fixtures.utils import Lsn, wait_until

KEYS = [key(i) for i in range(48)]
ON_REQUEST = {"compaction_threshold": 0, "compaction_target_size": "64KiB"}
# Short deadlines, so that a test sees them pass: connecting, one request, an operation or a part
# with its retries.
DEADLINES = {
    "remote_storage_connect_timeout": "1s",
    "remote_storage_request_timeout": "2s",
    "remote_storage_operation_timeout": "4s",
}
OPERATION_TIMEOUT = 4.0
# What an answer may take beyond its deadline on a busy machine.
SLACK = 4.0


@pytest.fixture
def s3(moto_server: MotoServer) -> RemoteStore:
    return RemoteStore("s3", moto=moto_server)


@pytest.fixture
def proxy(moto_server: MotoServer) -> Iterator[TcpProxy]:
    proxy = TcpProxy(moto_server.port)
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.fixture
def locked_moto(port_distributor: PortDistributor) -> Iterator[LockedMoto]:
    server = LockedMoto(port_distributor.get_port())
    try:
        yield server
    finally:
        server.stop()


def wait_uploaded(store: RemoteStore, timeline: TimelineHandle, timeout: float = 60.0) -> Lsn:
    def uploaded() -> Lsn:
        info = timeline.info()
        assert info["remote_consistent_lsn"] == info["disk_consistent_lsn"], info
        store.check_consistent(timeline.tenant_id, timeline.timeline_id)
        return Lsn.parse(info["remote_consistent_lsn"])

    return wait_until(uploaded, timeout=timeout, interval=0.05, what="uploads settled")


def timed(f: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    started = time.monotonic()
    result = f(*args, **kwargs)
    return result, time.monotonic() - started


def test_readers_of_a_stalled_download_get_an_error_within_the_deadline(
    pageserver_factory: PageserverFactory, s3: RemoteStore, proxy: TcpProxy
):
    ps = pageserver_factory.create({**ON_REQUEST, **DEADLINES, "max_local_layer_bytes": "64KiB"}, remote=s3)
    ps.config.update(s3.settings(endpoint=proxy.endpoint))
    ps.start()
    ps.allowed_errors += [r"remote operation failed", r"layer file .* is not on the local disk", r"downloading"]
    timeline = TimelineHandle.create(ps)
    work = Workload(31, KEYS)
    for i in range(6):
        for _ in range(3):
            timeline.ingest(work.batch(max_records=12))
        timeline.checkpoint()
        if i == 3:
            ps.http.compact(timeline.tenant_id, timeline.timeline_id, force_images=True)
    wait_uploaded(s3, timeline)

    def layers() -> dict[str, bool]:
        return {layer["file_name"]: layer["resident"] for layer in ps.http.layers(timeline.tenant_id, timeline.timeline_id) if layer["file_name"]}

    def evicted() -> set[str]:
        gone = {name for name, resident in layers().items() if not resident}
        assert gone, "nothing evicted yet"
        return gone

    path = f"/v1/tenant/{timeline.tenant_id}/timeline/{timeline.timeline_id}/page"
    slow = ps.http_client(timeout=120.0)

    def read(k: bytes) -> Any:
        return slow.request("GET", path, params={"key": k.hex(), "lsn": "latest"})

    # A key whose read downloads a layer, and that layer, while the store answers.
    def key_needing_a_download() -> tuple[bytes, set[str]] | None:
        wait_until(evicted, timeout=60, what="an eviction")
        ps.http.page_cache_drop()
        for k in timeline.model.keys():
            before = evicted()
            r = read(k)
            assert r.status_code in (200, 404), r.text
            if "downloads=0" not in r.headers["X-Read-Cost"]:
                now = layers()
                downloaded = {name for name in before if now.get(name)}
                # The 64 KiB disk budget may have evicted what the read downloaded before the
                # listing saw it resident: then look again, from a fresh eviction.
                return (k, downloaded) if downloaded else None
        raise AssertionError("no read needed an evicted layer")

    k, downloaded = wait_until(key_needing_a_download, timeout=120, what="a read that downloads an evicted layer")
    # The disk budget evicts what it downloaded again.
    wait_until(lambda: downloaded <= evicted(), timeout=60, what="the layers evicted again")
    ps.http.page_cache_drop()

    # The store stops answering: requests stay open, and no byte moves. Three readers of the
    # key wait on one download of the layer: each has its error within the deadline.
    proxy.stall()
    answers: list[tuple[Any, float]] = []

    def reader() -> None:
        answers.append(timed(read, k))

    readers = [threading.Thread(target=reader) for _ in range(3)]
    for t in readers:
        t.start()
    for t in readers:
        t.join(timeout=120)
    assert len(answers) == 3, answers
    for r, took in answers:
        assert took < OPERATION_TIMEOUT + SLACK, f"a read took {took:.1f}s"
        assert r.status_code == 503, r.text
        assert r.headers.get("Retry-After") == "1", r.headers
        msg = r.json()["msg"]
        assert "downloading it from remote storage failed" in msg and "deadline" in msg, msg

    # The store answers again: the read downloads the layer, and every page is as written.
    proxy.resume()
    wait_until(lambda: read(k).status_code == 200, timeout=60, what="the read after the stall")
    timeline.verify()


def test_ingest_with_the_store_down_answers_503_then_resumes(pageserver_factory: PageserverFactory, s3: RemoteStore, proxy: TcpProxy):
    settings = {
        **ON_REQUEST,
        **DEADLINES,
        "checkpoint_distance": "32KiB",
        "max_frozen_layers": 1,
        "upload_queue_max_bytes": 1,
        "upload_queue_wait_timeout": "2s",
    }
    ps = pageserver_factory.create(settings, remote=s3)
    ps.config.update(s3.settings(endpoint=proxy.endpoint))
    ps.start()
    ps.allowed_errors += [
        r"remote operation failed",
        r"remote upload queue step failed",
        r"flush waits for the upload queue",
        r"upload queue had no room",
        r"flush for ingest backpressure failed",
        r"background flush failed",
    ]
    timeline = TimelineHandle.create(ps)
    work = Workload(32, KEYS)
    timeline.ingest(work.batch(max_records=12))
    timeline.checkpoint()
    before = wait_uploaded(s3, timeline)

    proxy.down()
    client = ps.http_client(timeout=120.0)
    refused = None
    slowest = 0.0
    for _ in range(60):
        batch = work.batch(max_records=20)
        r, took = timed(
            client.request,
            "POST",
            f"/v1/tenant/{timeline.tenant_id}/timeline/{timeline.timeline_id}/ingest",
            data=encode_batch(batch),
            headers={"Content-Type": "application/octet-stream"},
        )
        slowest = max(slowest, took)
        if r.status_code == 503:
            refused = (batch, r)
            break
        assert r.status_code == 200, r.text
        timeline.model.apply(batch)
    assert refused is not None, "ingest never refused a batch with the store down"
    batch, r = refused
    # Each answer came within the bounded waits (a batch's own, and a flush it triggered).
    assert slowest < 2 * 2.0 + SLACK, f"an ingest request took {slowest:.1f}s"
    assert r.headers.get("Retry-After") == "1", r.headers
    msg = r.json()["msg"]
    assert "upload_queue_max_bytes" in msg and "try again later" in msg, msg
    # Nothing acknowledged is lost, and nothing of the refused batch was stored.
    assert timeline.lsns()[0] == Lsn(timeline.model.last_lsn)
    timeline.verify()
    assert Lsn.parse(timeline.info()["remote_consistent_lsn"]) == before

    # The store is back: the queue drains, the refused batch goes through, and ingest goes on.
    proxy.resume()

    def accepted() -> bool:
        r = client.request(
            "POST",
            f"/v1/tenant/{timeline.tenant_id}/timeline/{timeline.timeline_id}/ingest",
            data=encode_batch(batch),
            headers={"Content-Type": "application/octet-stream"},
        )
        assert r.status_code in (200, 503), r.text
        return r.status_code == 200

    wait_until(accepted, timeout=60, interval=0.5, what="the refused batch accepted")
    timeline.model.apply(batch)
    for _ in range(3):
        timeline.ingest(work.batch(max_records=12))
    timeline.checkpoint()
    assert wait_uploaded(s3, timeline) == Lsn(timeline.model.last_lsn)
    timeline.verify()
    ps.restart()
    timeline.verify()


def refused_start(ps: Any, timeout: float = 30.0) -> tuple[str, float]:
    """Starts `ps`, which must refuse to start: returns its log and how long it took."""
    (code, log), took = timed(ps.run_to_exit, timeout=timeout)
    assert code != 0, log
    ps.allowed_errors.append(r"pageserver: error")
    return log, took


def test_without_credentials_the_server_refuses_to_start_and_never_asks_instance_metadata(pageserver_factory: PageserverFactory, s3: RemoteStore):
    metadata = MetadataService()
    try:
        ps = pageserver_factory.create(DEADLINES, remote=s3)
        ps.env = metadata.env()
        log, took = refused_start(ps)
        assert took < 10, f"took {took:.1f}s to refuse"
        assert "no S3 credentials" in log and "AWS_ACCESS_KEY_ID" in log and "use_instance_metadata" in log, log
        assert metadata.requests == [], metadata.requests
    finally:
        metadata.close()


def test_instance_metadata_is_asked_only_when_the_settings_say_so(pageserver_factory: PageserverFactory, s3: RemoteStore):
    metadata = MetadataService(serve=True)
    try:
        ps = pageserver_factory.create(DEADLINES, remote=s3)
        ps.config.update(s3.settings(use_instance_metadata=True))
        ps.env = metadata.env()
        ps.start()
        assert ("PUT", "/latest/api/token") in metadata.requests, metadata.requests
        line = ps.log_contains("layers are uploaded to")
        assert line is not None and f"at {s3.moto.endpoint} (region us-east-1, credentials from the EC2 instance metadata service at {metadata.endpoint}" in line, line
        timeline = TimelineHandle.create(ps)
        timeline.ingest(Workload(33, KEYS).batch(max_records=12))
        timeline.checkpoint()
        wait_uploaded(s3, timeline)
    finally:
        metadata.close()


def test_startup_names_a_missing_bucket_and_an_unreachable_store(pageserver_factory: PageserverFactory, moto_server: MotoServer):
    missing = RemoteStore("s3", moto=moto_server)
    missing.bucket = "no-such-bucket"
    ps = pageserver_factory.create(DEADLINES, remote=missing)
    log, took = refused_start(ps)
    assert took < 10, f"took {took:.1f}s to refuse"
    assert "the bucket does not exist" in log and "S3 bucket no-such-bucket" in log and "NoSuchBucket" in log, log

    # A port nothing listens on.
    spare = socket.create_server(("127.0.0.1", 0))
    port = spare.getsockname()[1]
    spare.close()
    gone = pageserver_factory.create(DEADLINES, remote=RemoteStore("s3", moto=moto_server), name="gone")
    gone.config.update(RemoteStore("s3", moto=moto_server).settings(endpoint=f"http://127.0.0.1:{port}"))
    log, took = refused_start(gone)
    assert took < 10, f"took {took:.1f}s to refuse"
    assert f"http://127.0.0.1:{port}" in log and "reachable" in log, log


def test_startup_names_refused_credentials_and_missing_permissions(pageserver_factory: PageserverFactory, locked_moto: LockedMoto):
    # A key the store does not know.
    ps = pageserver_factory.create({**DEADLINES, **locked_moto.settings()})
    ps.env = {"AWS_ACCESS_KEY_ID": "AKIANOTAKEY", "AWS_SECRET_ACCESS_KEY": "wrong"}
    log, took = refused_start(ps)
    assert took < 10, f"took {took:.1f}s to refuse"
    assert "does not accept the credentials" in log and "InvalidAccessKeyId" in log, log

    # A valid key allowed nothing.
    ps = pageserver_factory.create({**DEADLINES, **locked_moto.settings()}, name="nobody")
    ps.env = {"AWS_ACCESS_KEY_ID": locked_moto.key_id, "AWS_SECRET_ACCESS_KEY": locked_moto.secret}
    log, took = refused_start(ps)
    assert took < 10, f"took {took:.1f}s to refuse"
    assert "access denied" in log and "AccessDenied" in log, log


def test_aws_region_and_endpoint_come_from_the_environment(pageserver_factory: PageserverFactory, s3: RemoteStore):
    # No endpoint or region in the settings: AWS_ENDPOINT_URL (plain http) and AWS_REGION.
    ps = pageserver_factory.create(DEADLINES, remote=s3)
    ps.config["remote_storage"].fields = {"bucket": s3.bucket, "prefix": s3.prefix}
    ps.env.update({"AWS_ENDPOINT_URL": s3.moto.endpoint, "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "eu-west-1"})
    ps.start()
    line = ps.log_contains("layers are uploaded to")
    assert line is not None and f'S3 bucket {s3.bucket} prefix "ps" at {s3.moto.endpoint} (region us-east-1' in line, line
    timeline = TimelineHandle.create(ps)
    timeline.ingest(Workload(34, KEYS).batch(max_records=12))
    timeline.checkpoint()
    wait_uploaded(s3, timeline)
