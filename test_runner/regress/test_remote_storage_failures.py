"""Remote storage that fails, against a real S3 API server (moto) on 127.0.0.1: a server
refuses to start, quickly and saying why, without credentials (and never asks the instance
metadata service unless told to), with a bucket that does not exist, with credentials the
store refuses or that lack the permission, and with a store it cannot reach.
No test sends a packet anywhere but 127.0.0.1: the metadata service is a listener of the
test's own."""

from __future__ import annotations

import socket
import time
from typing import Any, Iterator

import pytest

from fixtures.ingest import Workload, key
from fixtures.plugin import PageserverFactory
from fixtures.ports import PortDistributor
from fixtures.remote_storage import LockedMoto, MetadataService, MotoServer, RemoteStore
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


@pytest.fixture
def s3(moto_server: MotoServer) -> RemoteStore:
    return RemoteStore("s3", moto=moto_server)


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
