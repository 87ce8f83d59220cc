"""Fixtures of the server tests: backends the port-forward and shared-console tests dial."""

from collections.abc import AsyncIterator

import pytest

from tests.consoles import Console
from tests.server.portforward_support import sha_on_eof
from tests.support import Backend

__all__ = ["console", "echo", "serial", "summer"]


@pytest.fixture
async def echo() -> AsyncIterator[Backend]:
    """A TCP echo server."""
    b = await Backend().start_tcp()
    yield b
    await b.stop()


@pytest.fixture
async def summer() -> AsyncIterator[Backend]:
    """A TCP server that answers the SHA-256 of everything it got, after the client's EOF."""
    b = await Backend(handler=sha_on_eof).start_tcp()
    yield b
    await b.stop()


@pytest.fixture
def console() -> Console:
    """What the `serial` console received, and a way to make it print."""
    return Console()


@pytest.fixture
async def serial(console: Console) -> AsyncIterator[Backend]:
    """A TCP console that echoes and keeps what it received (`console`)."""
    b = await Backend(handler=console.handle).start_tcp()
    yield b
    await b.stop()
