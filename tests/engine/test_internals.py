"""The private internals subres relies on (`subres.engine.internals`), against the real objects.

A dependency that changes one of them fails here, loudly, instead of silently
losing a feature (batching, the shared TLS buffer) or breaking SPDY upgrades.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import ssl
import tomllib
from asyncio import sslproto
from pathlib import Path

import asyncssh
import pytest
from aiohttp.web_protocol import RequestHandler
from asyncssh.channel import SSHChannel

from subres.engine import internals
from tests.ssh_support import PASSWORD, SshServer
from tests.wsframes import unmask


@pytest.mark.parametrize("package", sorted(internals.TESTED))
def test_installed_versions_are_the_ones_checked(package: str) -> None:
    internals.check()
    internals.check_asyncssh()
    low, high = internals.TESTED[package]
    text = importlib.metadata.version(package)
    version = tuple(int(p) for p in text.split(".")[:2])
    assert low <= version < high, f"re-check subres.engine.internals for {package} {text}"


def test_pyproject_bounds_every_package_the_fence_reads() -> None:
    # The upper bound stops an untested version from being installed at all.
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    for package, (_, high) in internals.TESTED.items():
        bound = "<{}.{}".format(*high)
        assert any(d.startswith(package) and bound in d for d in project["project"]["dependencies"])


def test_a_changed_asyncssh_channel_stops_the_ssh_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    def init(self: SSHChannel[bytes], *args: object) -> None:
        self._window = 0  # type: ignore[attr-defined]

    monkeypatch.setattr(SSHChannel, "__init__", init)
    with pytest.raises(internals.InternalsChanged, match=r"SSHChannel\._send_window"):
        internals.check_asyncssh()


@pytest.mark.parametrize("window", [0, 65536])
async def test_the_send_window_is_the_one_the_server_gave(window: int) -> None:
    server = await SshServer(window=window).start()
    try:
        async with asyncssh.connect(
            "127.0.0.1",
            server.port,
            username="tester",
            password=PASSWORD,
            known_hosts=None,
            config=None,
        ) as conn:
            channel, _ = await conn.create_session(asyncssh.SSHClientSession, encoding=None)
            assert internals.send_window(channel) == window
            channel.close()
    finally:
        await server.stop()


def test_a_missing_internal_stops_the_import(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(RequestHandler, "set_parser")
    with pytest.raises(internals.InternalsChanged, match=r"RequestHandler\.set_parser"):
        internals.check()


@pytest.mark.parametrize("offset", [0, 1, 3, 17])
def test_unmask_xors_any_slice_of_a_buffer(offset: int) -> None:
    data = bytearray(os.urandom(100_000))
    mask = os.urandom(4)
    view = memoryview(data)[offset:]
    assert internals.unmask(view, mask) == unmask(bytes(view), mask)
    assert internals.unmask(view[:0], mask) == b""


def test_a_missing_unmask_stops_the_import(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(internals, "speedups", None)
    with pytest.raises(internals.InternalsChanged, match=r"speedups\.apply_mask"):
        internals.check()


async def test_tls_connections_share_one_read_buffer() -> None:
    # asyncio's own per-connection 256 KiB buffer would dominate an idle session's memory.
    internals.share_ssl_read_buffer()
    internals.share_ssl_read_buffer()
    protocols = [
        sslproto.SSLProtocol(
            asyncio.get_running_loop(),
            asyncio.Protocol(),
            ssl.create_default_context(),
            asyncio.get_running_loop().create_future(),
            server_hostname="localhost",
        )
        for _ in range(2)
    ]
    first, second = (p.get_buffer(-1) for p in protocols)
    assert first.obj is second.obj
    assert len(first) == sslproto.SSLProtocol.max_size
