"""Our SPDY codec against moby/spdystream, the Go library client-go and kubelet use.

The Go peer (tools/spdypeer) is built from the Go module proxy by
`tests.gotools` and cached by source hash. It talks to the test over a
socketpair; nothing is dialled.
"""

from __future__ import annotations

import os
import selectors
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from subres.protocol.spdy import (
    DataReceived,
    Event,
    GoAwayReceived,
    GoAwayStatus,
    PingAcknowledged,
    PingReceived,
    Role,
    RstStatus,
    SpdyConnection,
    StreamEnded,
    StreamOpened,
    StreamReplied,
    StreamReset,
)
from tests import gotools

TIMEOUT = 20.0


@pytest.fixture(scope="module")
def peer_binary() -> Path:
    # A peer that cannot be built fails the suite: it never skips silently.
    return gotools.build("spdypeer")


class GoPeer:
    """The Go program on one end of a socketpair, our connection on the other."""

    def __init__(self, binary: Path, mode: str, role: Role) -> None:
        self.sock, theirs = socket.socketpair()
        self.proc = subprocess.Popen(
            [str(binary), mode, str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        theirs.close()
        self.sock.setblocking(False)
        self.conn = SpdyConnection(role)
        self.pending = b""
        self.eof = False

    def run(
        self, until: Callable[[list[Event]], bool], react: Callable[[Event], None]
    ) -> list[Event]:
        """Move bytes both ways until `until(events)` or EOF; bounded by TIMEOUT."""
        events: list[Event] = []
        deadline = time.monotonic() + TIMEOUT
        with selectors.DefaultSelector() as selector:
            selector.register(self.sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
            while not until(events) and not self.eof:
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"timed out; events so far: {events[-5:]}"
                selector.modify(self.sock, self._interest())
                for _, mask in selector.select(remaining):
                    if mask & selectors.EVENT_WRITE:
                        self._write()
                    if mask & selectors.EVENT_READ:
                        for event in self._read():
                            events.append(event)
                            react(event)
        self._flush(deadline)
        return events

    def _interest(self) -> int:
        writable = self.pending or self.conn.bytes_to_send
        return selectors.EVENT_READ | (selectors.EVENT_WRITE if writable else 0)

    def _write(self) -> None:
        if not self.pending:
            self.pending = self.conn.data_to_send(1 << 16)
        try:
            sent = self.sock.send(self.pending)
        except BlockingIOError:
            sent = 0
        self.pending = self.pending[sent:]

    def _read(self) -> list[Event]:
        try:
            data = self.sock.recv(1 << 16)
        except BlockingIOError:
            return []
        if not data:
            self.eof = True
            return []
        return self.conn.receive_data(data)

    def _flush(self, deadline: float) -> None:
        self.sock.setblocking(True)
        self.sock.settimeout(max(deadline - time.monotonic(), 0.1))
        try:
            self.sock.sendall(self.pending + self.conn.data_to_send())
            self.pending = b""
        except OSError:
            pass  # the peer already closed its end
        self.sock.setblocking(False)

    def finish(self) -> tuple[int, str, str]:
        self.sock.close()
        out, err = self.proc.communicate(timeout=TIMEOUT)
        return self.proc.returncode, out.decode(), err.decode()


@pytest.fixture
def go_server(peer_binary: Path) -> Iterator[GoPeer]:
    peer = GoPeer(peer_binary, "server", Role.CLIENT)
    yield peer
    if peer.proc.poll() is None:
        peer.proc.kill()
    peer.finish()


def ignore(event: Event) -> None:
    pass


def test_streams_echoed_by_go_server(go_server: GoPeer) -> None:
    conn = go_server.conn
    payloads = {
        conn.open_stream({"streamtype": f"s{i}"}): os.urandom(50_000 + i) for i in range(20)
    }
    for stream_id, payload in payloads.items():
        conn.send_data(stream_id, payload, fin=True)
    ping_id = conn.ping()

    def done(events: list[Event]) -> bool:
        return sum(isinstance(e, StreamEnded) for e in events) == len(payloads)

    events = go_server.run(done, ignore)
    assert PingAcknowledged(ping_id) in events
    for index, (stream_id, payload) in enumerate(payloads.items()):
        assert StreamReplied(stream_id, (("reply-to", f"s{index}"),)) in events
        echoed = b"".join(
            e.data for e in events if isinstance(e, DataReceived) and e.stream_id == stream_id
        )
        assert echoed == payload
    assert conn.open_stream_ids == ()
    conn.goaway()
    go_server.run(lambda events: False, ignore)  # until the Go side closes
    returncode, _, stderr = go_server.finish()
    assert returncode == 0, stderr


def test_go_server_takes_a_reset(go_server: GoPeer) -> None:
    conn = go_server.conn
    first = conn.open_stream({"streamtype": "doomed"})
    go_server.run(lambda events: any(isinstance(e, StreamReplied) for e in events), ignore)
    conn.reset_stream(first, RstStatus.CANCEL)
    second = conn.open_stream({"streamtype": "after"})
    conn.send_data(second, b"still alive", fin=True)
    events = go_server.run(lambda events: StreamEnded(second) in events, ignore)
    assert DataReceived(second, b"still alive") in events
    assert not any(isinstance(e, StreamReset) for e in events)


def test_go_client_against_our_server(peer_binary: Path) -> None:
    peer = GoPeer(peer_binary, "client", Role.SERVER)
    conn = peer.conn

    def react(event: Event) -> None:
        match event:
            case StreamOpened(stream_id=stream_id):
                conn.reply(stream_id, {"accepted": "yes"})
            case DataReceived(stream_id=stream_id, data=data):
                conn.send_data(stream_id, bytes(data).upper())
            case StreamEnded(stream_id=stream_id):
                conn.end_stream(stream_id)

    try:
        events = peer.run(lambda events: any(isinstance(e, GoAwayReceived) for e in events), react)
    finally:
        returncode, stdout, stderr = peer.finish()
    assert returncode == 0, stderr
    assert stdout == "HELLO FROM GO\n"
    assert isinstance(events[0], PingReceived)
    opened = [e for e in events if isinstance(e, StreamOpened)]
    assert [(e.stream_id, sorted(e.headers)) for e in opened] == [
        (1, [("port", "80"), ("streamtype", "data")])
    ]
    # GOAWAY names the last stream the sender *accepted*; the Go client accepted none.
    assert events[-1] == GoAwayReceived(0, GoAwayStatus.OK)
