"""Shared pieces of the port-forward tests: parents that allow ports, backends, hashed payloads."""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

__all__ = [
    "BULK_SIZE",
    "CHUNK",
    "UdpEcho",
    "chunks",
    "digest",
    "pf_machine",
    "port_of",
    "sha_on_eof",
]

BULK_SIZE = 64 << 20
"""Bytes sent each way in the bulk transfers (raise to 256 MiB for a local measurement)."""
CHUNK = 256 << 10


def pf_machine(name: str, ports: list[int], *, phase: str = "Running") -> dict[str, Any]:
    """A Machine whose port-forward goes to 127.0.0.1 and allows `ports`."""
    return {
        "apiVersion": "subres.dev/v1alpha1",
        "kind": "Machine",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {},
        "status": {"phase": phase, "portForward": {"address": "127.0.0.1", "ports": ports}},
    }


def port_of(url: str) -> int:
    """The port of a `tcp://host:port` backend URL."""
    return int(url.rsplit(":", 1)[1])


def chunks(size: int, *, seed: int = 1, chunk: int = CHUNK) -> Iterator[bytes]:
    """`size` pseudo-random bytes in chunks, the same for the same seed."""
    rng = random.Random(seed)
    sent = 0
    while sent < size:
        n = min(chunk, size - sent)
        yield rng.randbytes(n)
        sent += n


def digest(size: int, *, seed: int = 1) -> str:
    """The sha256 of `chunks(size, seed=seed)`."""
    h = hashlib.sha256()
    for part in chunks(size, seed=seed):
        h.update(part)
    return h.hexdigest()


async def sha_on_eof(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A backend that answers only after the client's EOF: the sha256 of all it got."""
    h = hashlib.sha256()
    while data := await reader.read(65536):
        h.update(data)
    writer.write(h.hexdigest().encode())
    await writer.drain()


class _EchoProtocol(asyncio.DatagramProtocol):
    def __init__(self, owner: UdpEcho) -> None:
        self.owner = owner
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Not an isinstance check: asyncio's selector transport does not subclass the ABC.
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: Any) -> None:
        assert self.transport is not None
        self.owner.received.append(data)
        for _ in range(self.owner.copies):
            self.transport.sendto(data, addr)


@dataclass
class UdpEcho:
    """A UDP server on 127.0.0.1 sending each datagram back `copies` times."""

    copies: int = 1
    received: list[bytes] = field(default_factory=list)
    port: int = 0
    _transport: asyncio.DatagramTransport | None = None

    async def start(self) -> UdpEcho:
        """Bind an ephemeral port."""
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _EchoProtocol(self), local_addr=("127.0.0.1", 0)
        )
        self._transport = transport
        self.port = transport.get_extra_info("sockname")[1]
        return self

    def stop(self) -> None:
        """Close the socket."""
        if self._transport is not None:
            self._transport.close()
