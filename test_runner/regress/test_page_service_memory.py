"""What a page service client can make the server hold (docs/grpc-api.md#memory): a hostile
client on one HTTP/2 connection, speaking raw frames, that opens every stream the server allows,
asks each for batches of 1024 pages of 8 KiB and never lets an answer through: either it
advertises a 1-byte stream window and never grants more (answers wait in the server's HTTP/2
send buffers), or it opens every window wide and then reads nothing from its socket (answers
wait behind TCP). The server's resident memory, read from /proc while it happens, must grow by
at most the documented budget, and another client must still be served."""

from __future__ import annotations

import array
import fcntl
import select
import socket
import struct
import termios
import threading
import time
from typing import Optional

import grpc
import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest

from fixtures.ingest import Image, key, page_of
from fixtures.page_service import pb
from fixtures.timeline import TimelineHandle
from fixtures.utils import wait_until

# The documented bound on what one connection can make the server hold, whatever it does.
GROWTH_BUDGET = 256 << 20
PAGES = 1024
REQUESTS_PER_STREAM = 4


class OverBudget(AssertionError):
    pass


def rss(pid: int) -> int:
    """The process's resident set, in bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def grpc_message(message) -> bytes:
    body = message.SerializeToString()
    return b"\0" + struct.pack(">I", len(body)) + body


class HostileClient:
    """One HTTP/2 connection that lets no answer through. With `deaf` false, it advertises an
    initial stream window of 1 byte and never sends WINDOW_UPDATE, so the server may send one
    byte per stream; it answers the server's SETTINGS and PINGs (so keepalive does not drop
    it). With `deaf` true, it opens its windows wide and, once the server's first SETTINGS and
    window are in, reads nothing at all. Either way it respects the server's flow control when
    it sends."""

    def __init__(self, port: int, deaf: bool):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        window = (1 << 31) - 1 if deaf else 1
        self.conn.local_settings = h2.settings.Settings(client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window, h2.settings.SettingCodes.ENABLE_PUSH: 0})
        self.conn.initiate_connection()
        if deaf:
            self.conn.increment_flow_control_window(window - 65535)
        self.flush()
        self.deaf = deaf
        self.listening = True
        self.settings_received = False
        self.closed: Optional[str] = None
        self.answered_streams: set[int] = set()
        self.ended_streams: dict[int, str] = {}
        self.window_updates = 0
        self.unsent: dict[int, bytes] = {}

    def unread_bytes(self) -> int:
        """What the server sent that is waiting in this socket's receive queue."""
        count = array.array("i", [0])
        fcntl.ioctl(self.sock.fileno(), termios.FIONREAD, count)
        return count[0]

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def pump(self, wait: float) -> None:
        """Reads what the server sent within `wait` seconds and answers what needs answering
        (a deaf client that has its handshake reads nothing)."""
        if not self.listening:
            return
        readable, _, _ = select.select([self.sock], [], [], wait)
        if not readable:
            return
        data = self.sock.recv(1 << 20)
        if not data:
            self.closed = self.closed or "the server closed the connection"
            return
        for event in self.conn.receive_data(data):
            if isinstance(event, h2.events.RemoteSettingsChanged):
                self.settings_received = True
            elif isinstance(event, h2.events.WindowUpdated):
                self.window_updates += 1
            elif isinstance(event, h2.events.DataReceived):
                # Never acknowledged: the window stays shut.
                self.answered_streams.add(event.stream_id)
            elif isinstance(event, h2.events.StreamReset):
                self.ended_streams[event.stream_id] = f"reset {event.error_code!r}"
            elif isinstance(event, h2.events.TrailersReceived):
                self.ended_streams[event.stream_id] = f"trailers {event.headers}"
            elif isinstance(event, h2.events.ConnectionTerminated):
                self.closed = f"GOAWAY {event.error_code!r}"
        self.flush()

    def open_get_pages_streams(self, authority: str, metadata: list[tuple[str, str]], requests: list[bytes]) -> int:
        """Opens as many GetPages streams as the server allows, each to send `requests`."""
        wait_until(lambda: self.pump(0.1) or self.settings_received, what="the server's SETTINGS")
        if self.deaf:
            # The server's connection window comes right after its SETTINGS.
            wait_until(lambda: self.pump(0.1) or self.conn.outbound_flow_control_window > 65535, what="the server's window")
            self.listening = False
        allowed = self.conn.remote_settings.max_concurrent_streams
        assert 1 <= allowed <= 1024, allowed
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/pageserver.page.v1.PageService/GetPages"),
            (":authority", authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            *metadata,
        ]
        body = b"".join(requests)
        for _ in range(allowed):
            stream_id = self.conn.get_next_available_stream_id()
            self.conn.send_headers(stream_id, headers)
            self.unsent[stream_id] = body
        self.flush()
        return allowed

    def send_what_the_windows_allow(self) -> int:
        """Sends request bytes on every stream as far as the server's windows allow."""
        sent = 0
        for stream_id, body in self.unsent.items():
            while body:
                room = min(self.conn.local_flow_control_window(stream_id), self.conn.max_outbound_frame_size, len(body))
                if room <= 0:
                    break
                self.conn.send_data(stream_id, body[:room])
                body = body[room:]
                sent += room
            self.unsent[stream_id] = body
        self.flush()
        return sent

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize("deaf", [False, True], ids=["one-byte-window", "reads-nothing"])
def test_a_client_that_lets_no_answer_through_cannot_grow_the_server_past_its_budget(timeline: TimelineHandle, deaf: bool):
    ps = timeline.ps
    timeline.ingest([Image(key(n), 0x10, page_of(n)) for n in range(PAGES)])
    batch = [(key(n), 0) for n in range(PAGES)]
    with ps.page_service(timeline.tenant_id, timeline.timeline_id) as reader:
        # Every page read once, so that the page cache holds them before the baseline.
        assert reader.get_batch(batch) == [page_of(n) for n in range(PAGES)]
        baseline = rss(ps.pid)
        peak = 0

        def growth() -> int:
            nonlocal peak
            grown = rss(ps.pid) - baseline
            peak = max(peak, grown)
            return grown

        hostile = HostileClient(ps.grpc_port, deaf)
        try:
            request = grpc_message(pb.GetPagesRequest(id=1, pages=[pb.PageRef(key=k, lsn=lsn) for k, lsn in batch]))
            metadata = [("tenant-id", timeline.tenant_id), ("timeline-id", timeline.timeline_id)]
            streams = hostile.open_get_pages_streams(ps.grpc_addr, metadata, [request] * REQUESTS_PER_STREAM)
            assert streams == 256

            # Send until the server stops taking requests: every window it grants used up,
            # none granted for a while. Checked as it goes, so that a server without a bound
            # is caught before it takes the machine's memory.
            quiet_since = time.monotonic()

            def server_stopped_taking_requests() -> bool:
                nonlocal quiet_since
                updates = hostile.window_updates
                if hostile.send_what_the_windows_allow() > 0:
                    quiet_since = time.monotonic()
                hostile.pump(0)
                if hostile.window_updates != updates:
                    quiet_since = time.monotonic()
                if growth() > GROWTH_BUDGET:
                    raise OverBudget(f"RSS grew by {growth() >> 20} MiB")
                return hostile.closed is not None or not any(hostile.unsent.values()) or time.monotonic() - quiet_since > 3

            wait_until(server_stopped_taking_requests, timeout=120, interval=0.05, what="the server to stop taking requests", fatal=(OverBudget,))
            assert hostile.closed is None, hostile.closed
            assert not hostile.ended_streams, hostile.ended_streams
            # Answers are waiting: each stream answered got its one byte, or the socket holds
            # what the kernel let through of them (it grows no receive buffer that is not read).
            if deaf:
                assert hostile.unread_bytes() >= 32 << 10, hostile.unread_bytes()
            else:
                assert len(hostile.answered_streams) >= 2, hostile.answered_streams

            # Meanwhile, another connection is served promptly, and memory stays in bounds.
            stop = threading.Event()
            errors: list[str] = []

            def keep_pumping():
                try:
                    while not stop.wait(0.05):
                        hostile.pump(0)
                        if growth() > GROWTH_BUDGET:
                            errors.append(f"RSS grew by {growth() >> 20} MiB")
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(repr(e))

            pumping = threading.Thread(target=keep_pumping)
            pumping.start()
            try:
                for round in range(5):
                    started = time.monotonic()
                    some = [(key(n), 0) for n in range(round * 32, round * 32 + 32)]
                    assert reader.get_batch(some) == [page_of(n) for n in range(round * 32, round * 32 + 32)]
                    assert time.monotonic() - started < 5, "another connection waited"
            finally:
                stop.set()
                pumping.join()
            assert not errors, errors
            assert hostile.closed is None, hostile.closed
            final = growth()
        finally:
            hostile.close()
        print(f"RSS growth with {streams} streams ({'reads nothing' if deaf else 'one-byte window'}): peak {peak >> 20} MiB, at the end {final >> 20} MiB")
        assert peak <= GROWTH_BUDGET
        # The server is well after the hostile connection is gone.
        assert reader.get_batch(batch[:8]) == [page_of(n) for n in range(8)]


def test_a_request_message_over_64_kib_ends_its_call(timeline: TimelineHandle):
    """tonic holds a request message whole before decoding it: past 64 KiB (a batch of 1024
    pages takes under 34 KiB) the call ends OUT_OF_RANGE instead, so 256 streams of unfinished
    messages cannot hold a gigabyte. A batch of 1025 pages is still refused alone."""
    timeline.ingest([Image(key(1), 0x10, page_of(1))])
    with timeline.ps.page_service(timeline.tenant_id, timeline.timeline_id) as client:
        too_large = pb.GetPagesRequest(id=1, pages=[pb.PageRef(key=key(1), lsn=0)] * 3000)
        assert too_large.ByteSize() > 64 << 10
        with pytest.raises(grpc.RpcError) as e:
            list(client.get_pages_stream([too_large]))
        assert e.value.code() == grpc.StatusCode.OUT_OF_RANGE
        assert "decoded message length too large" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            client.stub.GetPage(pb.GetPageRequest(key=b"k" * (70 << 10)), metadata=client.metadata, timeout=10)
        assert e.value.code() == grpc.StatusCode.OUT_OF_RANGE
        answers = client.get_pages([(1, [(key(1), 0)] * 1025), (2, [(key(1), 0)] * 1024)])
        assert answers[1].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert len(answers[2].pages) == 1024
