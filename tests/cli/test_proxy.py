"""The kubeconfig's `proxy-url`: every client connection goes through an HTTP CONNECT proxy.

The proxy is written here: it accepts `CONNECT 127.0.0.1:PORT`, records the
target, answers 200 and relays bytes both ways. A verb that bypassed it would
still work, so each test checks what the proxy saw.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from subres.cli import kubeconfig
from subres.cli.kubeconfig import KubeconfigError
from tests.cli.conftest import Demo, run_cli_async
from tests.cli.portforward_support import listening, round_trip, spawn, stop
from tests.server.portforward_support import port_of
from tests.support import Backend, Standalone

HEAD_LIMIT = 16 * 1024
RELAY_SIZE = 65536


class ConnectProxy:
    """An HTTP CONNECT proxy on 127.0.0.1 that only tunnels to 127.0.0.1 (over TLS with `tls`)."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.targets: list[str] = []
        self._tls = tls
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        assert self._server is not None
        scheme = "https" if self._tls else "http"
        return f"{scheme}://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def start(self) -> ConnectProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self._tls)
        return self

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._tunnel(reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:
            pass  # only stop() cancels; asyncio would log a cancelled handler as an error
        finally:
            writer.close()
            self._tasks.discard(task)

    async def _tunnel(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        method, target, _ = head.split(b"\r\n", 1)[0].decode().split(" ", 2)
        host, _, port = target.rpartition(":")
        if method != "CONNECT" or host != "127.0.0.1":
            writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            return
        self.targets.append(target)
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        try:
            await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))
        finally:
            up_writer.close()


async def _copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await src.read(RELAY_SIZE):
            dst.write(data)
            await dst.drain()
        if dst.can_write_eof():
            dst.write_eof()


@pytest.fixture
async def proxy() -> AsyncIterator[ConnectProxy]:
    running = await ConnectProxy().start()
    yield running
    await running.stop()


def _through(original: Path, proxy_url: str, directory: Path) -> Path:
    """A copy of `original` whose cluster has `proxy-url`."""
    doc = yaml.safe_load(original.read_text())
    doc["clusters"][0]["cluster"]["proxy-url"] = proxy_url
    path = directory / "proxied-kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


def _server_port(demo: Demo) -> str:
    return f"127.0.0.1:{demo.url.rsplit(':', 1)[1]}"


async def _run(args: list[str | Path], home: Path, stdin: bytes = b"") -> tuple[bytes, bytes]:
    """The CLI run to its end without blocking the loop the proxy serves on; it must succeed."""
    done = await run_cli_async(args, home=home, stdin=stdin)
    assert done.returncode == 0, done.stderr
    return done.stdout, done.stderr


async def test_console_and_screenshot_go_through_the_proxy(
    demo: Demo, workdir: Path, proxy: ConnectProxy
) -> None:
    config = _through(demo.kubeconfig, proxy.url, workdir)
    out, _ = await _run(
        ["--kubeconfig", config, "console", "demo"], workdir, b"echo px-$((9*9))\nexit\n"
    )
    assert b"px-81" in out
    png = workdir / "shot.png"
    await _run(["--kubeconfig", config, "screenshot", "demo", "-o", png], workdir)
    assert png.read_bytes().startswith(b"\x89PNG")
    assert proxy.targets == [_server_port(demo)] * 2


@pytest.mark.parametrize("transport", ["websocket", "spdy", "tunnel"])
@pytest.mark.parametrize("scheme", ["http", "https"])
async def test_every_transport_goes_through_the_proxy(
    subres: Standalone, backends: tuple[Backend, Backend], transport: str, scheme: str
) -> None:
    tls = None
    if scheme == "https":
        # An https proxy is trusted as the cluster is (client-go's rule): the server's own
        # certificate, which names 127.0.0.1, will do.
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        certs = subres.dir / "certs"
        tls.load_cert_chain(certs / "apiserver.crt", certs / "apiserver.key")
    proxy = await ConnectProxy(tls).start()
    echo, _ = backends
    config = _through(subres.kubeconfig(), proxy.url, subres.dir)
    proc = await spawn(
        subres, "vm1", f"0:{port_of(echo.url)}", "--kubeconfig", str(config),
        "--transport", transport,
    )  # fmt: skip
    try:
        (local,) = await listening(proc, 1)
        assert await round_trip(local, b"proxied") == b"proxied"
    finally:
        await stop(proc)
        await proxy.stop()
    assert proxy.targets and set(proxy.targets) == {f"127.0.0.1:{subres.server.port}"}


def test_socks_proxies_are_refused_clearly(workdir: Path, demo: Demo) -> None:
    config = _through(demo.kubeconfig, "socks5://127.0.0.1:1080", workdir)
    with pytest.raises(KubeconfigError, match="supports http and https proxies"):
        kubeconfig.load(kubeconfig=str(config))
