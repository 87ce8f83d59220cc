"""Shared fixtures: the Go peers built from the module proxy, and a TCP echo backend."""

from collections.abc import AsyncIterator

import pytest

from tests.gotools import kubectl_bin, kubepeer_bin, virtctl_bin
from tests.support import Backend

__all__ = ["backend", "kubectl_bin", "kubepeer_bin", "virtctl_bin"]


@pytest.fixture
async def backend() -> AsyncIterator[Backend]:
    """A TCP echo server on 127.0.0.1 that counts its connections."""
    b = await Backend().start_tcp()
    yield b
    await b.stop()
