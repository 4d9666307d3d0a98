"""The gRPC conventions beside the page service (docs/grpc-api.md#health-and-reflection), over the
real protocol with the standard clients: the health service as grpc_health_probe and Kubernetes
probes ask it, and server reflection as grpcurl uses it, with auth on (neither needs a token)."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from google.protobuf import descriptor_pool, message_factory
from google.protobuf.descriptor_pb2 import FileDescriptorProto
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from fixtures.auth import AuthKeys, start_with_auth
from fixtures.ingest import Image, key, page_of
from fixtures.page_service import pb, pb_grpc
from fixtures.plugin import PageserverFactory

PAGE_SERVICE = "pageserver.page.v1.PageService"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
def auth_server(pageserver_factory: PageserverFactory):
    """A server with auth on and a timeline holding one page."""
    keys = AuthKeys()
    ps = start_with_auth(pageserver_factory, keys)
    tenant = ps.http.tenant_create()["id"]
    timeline = ps.http.timeline_create(tenant)["timeline_id"]
    ps.http.ingest(tenant, timeline, [Image(key(1), 0x10, page_of(1))])
    return ps, keys, tenant, timeline


def plain_channel(addr: str) -> grpc.Channel:
    """A channel that sends no token, as a probe does."""
    return grpc.insecure_channel(addr, options=[("grpc.use_local_subchannel_pool", 1)])


def test_health_answers_probes_without_a_token(auth_server):
    ps, _, _, _ = auth_server
    with plain_channel(ps.grpc_addr) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", PAGE_SERVICE):
            answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert answer.status == SERVING, service
        with pytest.raises(grpc.RpcError) as e:
            health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        # The page service itself still checks its calls on the same connection.
        with pytest.raises(grpc.RpcError) as e:
            pb_grpc.PageServiceStub(channel).GetPage(pb.GetPageRequest(key=key(1)), timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # no tenant-id: checked first


def test_health_watch_sees_not_serving_at_shutdown_and_ends(pageserver_factory: PageserverFactory):
    """A watcher sees SERVING, then NOT_SERVING once a graceful stop begins, and its stream
    ends: it does not hold the shutdown up until the grace period cuts it off."""
    ps = pageserver_factory.start()
    with plain_channel(ps.grpc_addr) as channel:
        watches = {service: health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=service), timeout=60) for service in ("", PAGE_SERVICE)}
        for watch in watches.values():
            assert next(watch).status == SERVING
        started = time.monotonic()
        stopping = threading.Thread(target=lambda: ps.stop(timeout=60))
        stopping.start()
        for service, watch in watches.items():
            assert [answer.status for answer in watch] == [NOT_SERVING], service
        stopping.join()
        assert time.monotonic() - started < 20, "the stop waited for the watchers"
    assert "were cut off" not in ps.log_since_start()


def test_reflection_describes_the_page_service_well_enough_to_call_it(auth_server):
    """What grpcurl does: list the services, fetch the page service's schema by reflection (no
    token), build its messages from that schema alone, and make a real call with them."""
    ps, keys, tenant, timeline = auth_server
    with plain_channel(ps.grpc_addr) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = set(database.get_services())
        assert {PAGE_SERVICE, "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"} <= services, services
        pool = descriptor_pool.DescriptorPool(database)
        service = pool.FindServiceByName(PAGE_SERVICE)
        get_pages = service.methods_by_name["GetPages"]
        assert get_pages.client_streaming and get_pages.server_streaming
        assert get_pages.input_type.full_name == "pageserver.page.v1.GetPagesRequest"
        assert pool.FindServiceByName("grpc.health.v1.Health").methods_by_name["Watch"].server_streaming

        get_page = service.methods_by_name["GetPage"]
        request_class = message_factory.GetMessageClass(get_page.input_type)
        response_class = message_factory.GetMessageClass(get_page.output_type)
        call = channel.unary_unary(f"/{PAGE_SERVICE}/GetPage", request_serializer=request_class.SerializeToString, response_deserializer=response_class.FromString)
        metadata = [("tenant-id", tenant), ("timeline-id", timeline), ("authorization", f"Bearer {keys.tenant_token(tenant)}")]
        answer = call(request_class(key=key(1), lsn=0), metadata=metadata, timeout=10)
        assert answer.page == page_of(1) and answer.lsn == 0x10


def test_reflection_v1_answers_as_v1alpha_does(auth_server):
    """grpcurl asks `grpc.reflection.v1` first: the same messages under the newer name."""
    ps, _, _, _ = auth_server
    with plain_channel(ps.grpc_addr) as channel:
        for version in ("v1", "v1alpha"):
            info = channel.stream_stream(
                f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
                request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
                response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
            )
            requests = [
                reflection_pb2.ServerReflectionRequest(list_services=""),
                reflection_pb2.ServerReflectionRequest(file_containing_symbol=PAGE_SERVICE),
            ]
            listed, described = list(info(iter(requests), timeout=10))
            names = {s.name for s in listed.list_services_response.service}
            assert {PAGE_SERVICE, "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"} <= names, version
            files = [FileDescriptorProto.FromString(b) for b in described.file_descriptor_response.file_descriptor_proto]
            assert [f.name for f in files] == ["page_service.proto"], version
            assert [s.name for s in files[0].service] == ["PageService"]
            # An unknown symbol ends the call NOT_FOUND (tonic-reflection's way of saying it).
            with pytest.raises(grpc.RpcError) as e:
                list(info(iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol="no.such.Symbol")]), timeout=10))
            assert e.value.code() == grpc.StatusCode.NOT_FOUND, version
