"""Driving the real, unmodified virtctl against subres's KubeVirt profile.

The scenarios here are what a virtctl user does, each checked the way that
user would notice: typed text comes back from the shell, pictures match the
display pixel for pixel, forwarded bytes hash the same, messages say what
happened. They run against standalone subres (tests/cli/test_virtctl.py) and
through a real kube-apiserver (tests/e2e/test_kubevirt.py), whichever
`Virtctl` they are given. virtctl's console needs a terminal: it runs under
a PTY (pexpect), whose blocking calls go to a thread so the event loop, which
may be serving subres itself, keeps running.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import os
import re
import signal
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pexpect  # type: ignore[import-untyped]
from PIL import Image

from subres.demo.vnc import Display
from tests import usbredir
from tests.support import end_process, free_port

__all__ = ["TIMEOUT", "Redirection", "Virtctl"]

TIMEOUT = 30.0
"""Bound on each step of a scenario."""
ESCAPE = "\x1d"
"""Ctrl+]: virtctl's console escape."""
PROBE = b"probe"


@dataclass(frozen=True)
class Virtctl:
    """virtctl with one kubeconfig (and namespace) and a scratch HOME.

    (Shaped like tests/bench/client.Target, which says how to reach subres, not how to
    run a client program.)
    """

    binary: Path
    kubeconfig: Path
    home: Path
    namespace: str = "default"

    def argv(self, *args: str) -> list[str]:
        return [
            str(self.binary), "--kubeconfig", str(self.kubeconfig), "-n", self.namespace, *args,
        ]  # fmt: skip

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        return {**env, "HOME": str(self.home), "TERM": "xterm"}

    async def run(self, *args: str, stdin: bytes = b"") -> tuple[int, bytes, bytes]:
        """Run to the end (bounded): exit code, stdout, stderr."""
        proc = await self.start(*args, stdin=asyncio.subprocess.PIPE)
        try:
            async with asyncio.timeout(TIMEOUT):
                out, err = await proc.communicate(stdin)
        finally:
            await _end(proc)
        assert proc.returncode is not None
        return proc.returncode, out, err

    async def start(self, *args: str, stdin: int | None = None) -> asyncio.subprocess.Process:
        """Start it with stdout and stderr piped (and stdin, when asked)."""
        return await asyncio.create_subprocess_exec(
            *self.argv(*args),
            stdin=asyncio.subprocess.DEVNULL if stdin is None else stdin,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env(),
        )

    @contextlib.asynccontextmanager
    async def terminal(self, *args: str) -> AsyncIterator[pexpect.spawn]:
        """virtctl under a PTY, killed afterwards if still running."""
        child = pexpect.spawn(
            str(self.binary),
            self.argv(*args)[1:],
            env=self.env(),
            dimensions=(24, 80),
            timeout=TIMEOUT,
        )
        try:
            yield child
        finally:
            if child.isalive():
                child.kill(signal.SIGKILL)
            await asyncio.to_thread(child.close, True)

    # -- scenarios ------------------------------------------------------------

    async def version(self, *, server: str) -> None:
        """`virtctl version` prints both versions, the server's being `server`."""
        code, out, err = await self.run("version")
        assert code == 0, err
        assert b'Client Version: version.Info{GitVersion:"v1.7.0"' in out
        assert f'Server Version: version.Info{{GitVersion:"{server}"'.encode() in out, out

    async def error_without_noise(self, name: str) -> None:
        """A failing command prints its error and nothing about versions (virtctl reads the
        version document on every error, and printed its 404 before)."""
        code, _, err = await self.run("vnc", "screenshot", name, "-f", str(self.home / "x.png"))
        assert code == 1
        assert f'"{name}" not found'.encode() in err, err
        assert b"could not find the requested resource" not in err, err
        assert b"different from the KubeVirt version" not in err, err

    async def console_types(self, name: str) -> None:
        """Type a command into the VMI's shell, see its output, leave with Ctrl+]."""
        async with self.terminal("console", name) as child:
            await _expect(child, f"Successfully connected to {name} console")
            child.send("echo sub$((40+2))res\r")
            await _expect(child, "sub42res")
            child.send(ESCAPE)
            await _expect(child, pexpect.EOF)
            await asyncio.to_thread(child.wait)
            assert child.exitstatus == 0, child.before

    async def console_waits_for_running(
        self,
        name: str,
        *,
        refused: Callable[[], Awaitable[None]],
        start: Callable[[], Awaitable[None]],
    ) -> None:
        """`console --timeout 1` keeps retrying while the VMI answers 400, then connects.

        `refused` returns once the server has refused virtctl at least once; `start`
        then makes the VMI Running.
        """
        async with self.terminal("console", name, "--timeout", "1") as child:
            async with asyncio.timeout(TIMEOUT):
                await refused()
            assert child.isalive(), child.before
            await start()
            await _expect(child, f"Successfully connected to {name} console")
            child.send("echo sub$((40+2))res\r")
            await _expect(child, "sub42res")
            child.send(ESCAPE)
            await _expect(child, pexpect.EOF)

    async def vnc_proxy_only(self, name: str, display: Display) -> None:
        """`vnc --proxy-only` prints its port; vncdotool captures the display through it."""
        proc = await self.start("vnc", name, "--proxy-only")
        try:
            assert proc.stdout is not None
            async with asyncio.timeout(TIMEOUT):
                line = await proc.stdout.readline()
            port = json.loads(line)["port"]
            out = self.home / "capture.png"
            vncdo = "from vncdotool.command import vncdo; vncdo()"
            capture = await asyncio.create_subprocess_exec(
                sys.executable, "-c", vncdo, "-s", f"127.0.0.1::{port}", "capture", str(out),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            )  # fmt: skip
            try:
                async with asyncio.timeout(TIMEOUT):
                    said, _ = await capture.communicate()
            finally:
                await _end(capture)
            assert capture.returncode == 0, said
            _assert_shows(Image.open(out), display)
        finally:
            await _end(proc)

    async def screenshot(self, name: str, display: Display) -> None:
        """`vnc screenshot -f -` writes the display as PNG."""
        code, out, err = await self.run("vnc", "screenshot", name, "-f", "-")
        assert code == 0, err
        _assert_shows(Image.open(io.BytesIO(out)), display)

    async def forward_tcp(self, target: str, remote: int, *, size: int = 4 << 20) -> None:
        """`port-forward TARGET LOCAL:REMOTE`: `size` random bytes echo back intact."""
        local = free_port()
        proc = await self.start("port-forward", target, f"{local}:{remote}")
        try:
            reader, writer = await _connect(local, proc)
            payload = os.urandom(size)

            async def send() -> None:
                writer.write(payload)
                await writer.drain()

            async with asyncio.timeout(TIMEOUT):
                _, back = await asyncio.gather(send(), reader.readexactly(size))
            assert hashlib.sha256(back).digest() == hashlib.sha256(payload).digest()
            writer.close()
        finally:
            await _end(proc)

    async def forward_udp(self, target: str, remote: int) -> None:
        """`port-forward TARGET udp/LOCAL:REMOTE`: datagrams come back one for one."""
        local = free_port(socket.SOCK_DGRAM)
        proc = await self.start("port-forward", target, f"udp/{local}:{remote}")
        try:
            replies: asyncio.Queue[bytes] = asyncio.Queue()
            transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
                lambda: _Datagrams(replies), remote_addr=("127.0.0.1", local)
            )
            try:
                await _first_reply(transport, replies, proc)
                sent = [os.urandom(n) for n in (1, 512, 1400)]
                for datagram in sent:
                    transport.sendto(datagram)
                    async with asyncio.timeout(TIMEOUT):
                        while (reply := await replies.get()) == PROBE:
                            pass  # a late answer to a probe sent while virtctl was starting
                    assert reply == datagram
            finally:
                transport.close()
        finally:
            await _end(proc)

    async def forward_stdio(self, target: str, remote: int, *, size: int = 1 << 20) -> None:
        """`port-forward --stdio TARGET PORT` (ssh's ProxyCommand): stdin to the port, back."""
        proc = await self.start(
            "port-forward", "--stdio", target, str(remote), stdin=asyncio.subprocess.PIPE
        )
        try:
            assert proc.stdin is not None and proc.stdout is not None
            payload = os.urandom(size)
            proc.stdin.write(payload)
            async with asyncio.timeout(TIMEOUT):
                back = await proc.stdout.readexactly(size)
            assert hashlib.sha256(back).digest() == hashlib.sha256(payload).digest()
            proc.stdin.close()
            async with asyncio.timeout(TIMEOUT):
                assert await proc.wait() == 0
        finally:
            await _end(proc)

    @contextlib.asynccontextmanager
    async def usbredir(self, name: str) -> AsyncIterator[Redirection]:
        """`usbredir --no-launch NAME`: its local address connected, after both hellos."""
        proc = await self.start("usbredir", "--no-launch", name)
        try:
            assert proc.stdout is not None
            said, found = b"", None
            async with asyncio.timeout(TIMEOUT):
                while found is None and (line := await proc.stdout.readline()):
                    said += line
                    found = re.search(rb"usbredir client at: ([^\s]+):(\d+)", line)
            assert found is not None, said + await _rest(proc)
            reader, writer = await asyncio.open_connection(found[1].decode(), int(found[2]))
            writer.write(usbredir.hello("usbredirect (virtctl test)"))
            async with asyncio.timeout(TIMEOUT):
                version = await usbredir.read_hello(reader)
            yield Redirection(proc, reader, writer, version)
            writer.close()
        finally:
            await _end(proc)

    async def usbredir_takeover(self, name: str, *, device: str, slots: int) -> None:
        """One `usbredir` per USB slot, each greeted by a slot of its own; then one more takes
        over the slot held longest: the first ends saying so, the newcomer gets its hello."""
        async with contextlib.AsyncExitStack() as stack:
            held = [await stack.enter_async_context(self.usbredir(name)) for _ in range(slots)]
            versions = [r.version for r in held]
            assert len(set(versions)) == slots, versions
            assert all(v.startswith(device) for v in versions), versions
            newest = await stack.enter_async_context(self.usbredir(name))
            assert newest.version == held[0].version
            async with asyncio.timeout(TIMEOUT):
                assert await held[0].proc.wait() != 0
            said = await _rest(held[0].proc)
            assert b"taken over by" in said, said
            assert all(r.proc.returncode is None for r in held[1:])


@dataclass
class Redirection:
    """A running `virtctl usbredir --no-launch` and the usbredir client connected to it."""

    proc: asyncio.subprocess.Process
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    version: str
    """What the USB slot announced in its hello."""


async def _rest(proc: asyncio.subprocess.Process) -> bytes:
    """What is left of virtctl's stderr (bounded)."""
    assert proc.stderr is not None
    try:
        async with asyncio.timeout(TIMEOUT):
            return await proc.stderr.read()
    except TimeoutError:
        return b"(virtctl still running)"


def _assert_shows(image: Image.Image, display: Display) -> None:
    assert image.size == (display.width, display.height)
    assert image.convert("RGB").tobytes() == bytes(display.rgb)


async def _expect(child: pexpect.spawn, pattern: object) -> None:
    try:
        await asyncio.to_thread(child.expect, pattern, timeout=TIMEOUT)
    except (pexpect.TIMEOUT, pexpect.EOF) as exc:
        raise AssertionError(f"no {pattern!r}; virtctl said {child.before!r}") from exc


async def _end(proc: asyncio.subprocess.Process) -> None:
    """Interrupt (virtctl waits for SIGINT), then kill after a bounded wait."""
    await end_process(proc, signal.SIGINT)


async def _connect(
    port: int, proc: asyncio.subprocess.Process
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect once virtctl listens; a refused attempt never reaches virtctl or subres."""
    async with asyncio.timeout(TIMEOUT):
        while True:
            try:
                return await asyncio.open_connection("127.0.0.1", port)
            except ConnectionRefusedError:
                if proc.returncode is not None:
                    raise AssertionError(f"virtctl exited with {proc.returncode}") from None
                await asyncio.sleep(0.05)  # nothing signals a listener of another process


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, replies: asyncio.Queue[bytes]) -> None:
        self.replies = replies

    def datagram_received(self, data: bytes, addr: object) -> None:
        self.replies.put_nowait(data)


async def _first_reply(
    transport: asyncio.BaseTransport,
    replies: asyncio.Queue[bytes],
    proc: asyncio.subprocess.Process,
) -> None:
    """Send a probe until virtctl's UDP socket answers (a datagram before it binds is lost)."""
    datagrams = cast(asyncio.DatagramTransport, transport)
    async with asyncio.timeout(TIMEOUT):
        while True:
            datagrams.sendto(PROBE)
            try:
                async with asyncio.timeout(0.5):
                    assert await replies.get() == PROBE
                    return
            except TimeoutError:
                assert proc.returncode is None, f"virtctl exited with {proc.returncode}"
