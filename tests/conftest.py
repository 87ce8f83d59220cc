"""Shared fixtures: the event loop, the Go peers built from the module proxy, a TCP echo backend."""

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Mapping

import pytest

from subres.serving import loops
from tests.gotools import kubectl_bin, kubepeer_bin, virtctl_bin
from tests.support import Backend

__all__ = [
    "backend",
    "kubectl_bin",
    "kubepeer_bin",
    "pytest_asyncio_loop_factories",
    "virtctl_bin",
]


@pytest.fixture
async def backend() -> AsyncIterator[Backend]:
    """A TCP echo server on 127.0.0.1 that counts its connections."""
    b = await Backend().start_tcp()
    yield b
    await b.stop()


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """The loop every test runs on: `$SUBRES_LOOP` (uvloop or asyncio), else the product's default.

    Servers the tests start as processes read the same variable.
    """
    name = os.environ.get(loops.ENV) or loops.DEFAULT
    return {name: loops.factory(name) or asyncio.new_event_loop}
