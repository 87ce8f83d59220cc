"""WebSockets this process opens: the upgrade client's connection with websockets' framing.

`connect` asks for the upgrade (`subres.engine.client`), checks the server's
`Sec-WebSocket-Accept` and subprotocol, and returns a `ClientWebSocket`:
websockets' sans-I/O protocol over the upgraded connection, driven by one
reader task that answers pings and the server's close while nobody reads.
Its surface is the part of websockets' own client the CLI uses (`recv`,
`send`, `close`, `close_code`, `close_reason`, `ConnectionClosed` at the
end), plus the `Messages` shape the tunnel carrier reads. websockets' own
client is not used because it refuses subprotocols that are not RFC 7230
tokens (`SPDY/3.1+portforward.k8s.io`) and drops the body of a refusal.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence

from websockets.exceptions import ConnectionClosed, ConnectionClosedOK
from websockets.frames import Frame, Opcode
from websockets.protocol import Protocol, Side, State

from subres.engine import client
from subres.engine.client import Peer, UpgradedStream

__all__ = ["MAX_QUEUE", "ClientWebSocket", "ConnectionClosed", "connect"]

MAX_QUEUE = 16
"""Messages received and not yet read before the connection stops reading."""


async def connect(
    peer: Peer,
    *,
    subprotocols: Sequence[str] = (),
    max_size: int,
    close_timeout: float,
    extra: Mapping[str, str] | None = None,
) -> ClientWebSocket:
    """A WebSocket to `peer`, offering `subprotocols` in order.

    Raises as `client.upgrade` does, and `ConnectionError` when the server's
    answer is not a valid WebSocket handshake (or picks no offered subprotocol).
    """
    key = client.websocket_key()
    headers = {
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": key,
        **({"Sec-WebSocket-Protocol": ", ".join(subprotocols)} if subprotocols else {}),
        **(extra or {}),
    }
    conn = await client.upgrade(peer, method="GET", headers=headers, stream=UpgradedStream)
    answer = conn.answer
    chosen = answer.get("sec-websocket-protocol")
    problem = ""
    if answer.get("sec-websocket-accept") != client.websocket_accept(key):
        problem = "the server's Sec-WebSocket-Accept is wrong"
    elif answer.get("upgrade", "").lower() != "websocket":
        problem = "the server upgraded to something else than a WebSocket"
    elif (chosen is not None or subprotocols) and chosen not in subprotocols:
        problem = f"the server chose subprotocol {chosen!r}, none of {', '.join(subprotocols)}"
    if problem:
        await conn.close()
        raise ConnectionError(problem)
    return ClientWebSocket(conn, subprotocol=chosen, max_size=max_size, close_timeout=close_timeout)


class ClientWebSocket:
    """An open WebSocket, client side, over an upgraded connection."""

    def __init__(
        self,
        conn: UpgradedStream,
        *,
        subprotocol: str | None,
        max_size: int,
        close_timeout: float,
    ) -> None:
        self.subprotocol = subprotocol
        self.headers = conn.headers
        """The server's `101` headers (lowercase names, in order)."""
        self._conn = conn
        self._ws = Protocol(Side.CLIENT, state=State.OPEN, max_size=max_size)
        self._close_timeout = close_timeout
        self._messages: deque[bytes | str] = deque()
        self._fragments: list[bytes] = []
        self._text = False
        self._changed = asyncio.Event()
        self._room = asyncio.Event()
        self._ended = False
        self._reader = asyncio.create_task(self._read_loop())

    @property
    def protocol(self) -> Protocol:
        """websockets' sans-I/O state of this connection (close frames sent and received)."""
        return self._ws

    @property
    def close_code(self) -> int | None:
        """The code of the server's close frame (1006 without one); None while open."""
        return self._ws.close_code

    @property
    def close_reason(self) -> str | None:
        """The reason of the server's close frame; None while open."""
        return self._ws.close_reason

    async def recv(self) -> bytes | str:
        """The next message; raises `ConnectionClosed` once the connection is closed."""
        while not self._messages:
            if self._ended:
                raise self._ws.close_exc
            self._changed.clear()
            await self._changed.wait()
        self._room.set()
        return self._messages.popleft()

    async def __aiter__(self) -> AsyncIterator[bytes | str]:
        """Messages until a normal close; a failed one raises."""
        with contextlib.suppress(ConnectionClosedOK):
            while True:
                yield await self.recv()

    async def send(self, message: bytes | str) -> None:
        """Send one message; raises `ConnectionClosed` once the connection is closing."""
        if self._ws.state is not State.OPEN:
            await self._wait_ended()
            raise self._ws.close_exc
        if isinstance(message, str):
            self._ws.send_text(message.encode())
        else:
            self._ws.send_binary(message)
        await self._flush()

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Send a close frame, wait (`close_timeout`) for the server to end the connection."""
        if self._ws.state is State.OPEN:
            self._ws.send_close(code, reason)
            with contextlib.suppress(OSError, RuntimeError):
                await self._flush()
        await self._wait_ended()

    # The tunnel carrier's `Messages`.

    async def next_binary(self) -> bytes | None:
        """The next message if it is binary; None at the end or for any other message."""
        try:
            message = await self.recv()
        except ConnectionClosed:
            return None
        return message if isinstance(message, bytes) else None

    async def send_binary(self, data: bytes) -> None:
        """Send one binary message."""
        await self.send(data)

    async def close_normally(self) -> None:
        """Close with 1000."""
        await self.close()

    # The reader.

    async def _wait_ended(self) -> None:
        try:
            async with asyncio.timeout(self._close_timeout):
                await asyncio.shield(self._reader)
        except TimeoutError:
            self._reader.cancel()
            await asyncio.wait([self._reader])

    async def _read_loop(self) -> None:
        try:
            while self._ws.state is not State.CLOSED:
                while len(self._messages) >= MAX_QUEUE:
                    self._room.clear()
                    await self._room.wait()
                chunk = await self._conn.read()
                if chunk:
                    self._ws.receive_data(chunk)
                else:
                    self._ws.receive_eof()
                for event in self._ws.events_received():
                    if isinstance(event, Frame):
                        self._received(event)
                await self._flush()
        except (OSError, RuntimeError):
            pass  # the connection failed: the end is abnormal (1006)
        finally:
            self._ws.receive_eof()
            self._ended = True
            self._changed.set()
            await self._conn.close()

    def _received(self, frame: Frame) -> None:
        if frame.opcode not in (Opcode.TEXT, Opcode.BINARY, Opcode.CONT):
            return  # pings are answered and closes handled by the protocol
        if frame.opcode is not Opcode.CONT:
            self._text = frame.opcode is Opcode.TEXT
            self._fragments = []
        self._fragments.append(bytes(frame.data))
        if not frame.fin:
            return
        data = b"".join(self._fragments)
        self._fragments = []
        self._messages.append(data.decode(errors="replace") if self._text else data)
        self._changed.set()

    async def _flush(self) -> None:
        # Everything queued goes in one write, in order: pongs and the close
        # answer from the reader, messages from senders.
        writes = self._ws.data_to_send()
        if data := b"".join(writes):
            await self._conn.write(data)
        if writes and not writes[-1]:
            await self._conn.write_eof()
