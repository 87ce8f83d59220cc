"""examples/qemu-vm: a real Linux VM under QEMU, served by a standalone subres.

Boots the example's VM with its own script (Debian's kernel, a busybox
initramfs, TCG unless KVM works here), serves the example's Machine with its
endpoints moved to the test's directory, then goes through subres: types on
the serial console and reads the kernel's shell's answer, takes a screenshot
of the VGA display, and fetches the guest's web page over port-forward. The
script installs QEMU and fetches the kernel when they are missing (as root);
when it cannot, this test fails: it never skips.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import re
import signal
import socket
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from PIL import Image
from websockets.asyncio.client import ClientConnection, connect
from websockets.typing import Subprotocol

from tests.support import Standalone, start_standalone, wait_for

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "qemu-vm"
SCRIPT = EXAMPLE / "run-vm.sh"
# Where machine.yaml's endpoints point, and its forwarded port.
EXAMPLE_DIR = "/run/subres/sockets/vm1"
EXAMPLE_PORT = 8080
PROMPT = b"vm1# "
# The kernel's frame buffer console on QEMU's std VGA (video= on its command line).
DISPLAY_SIZE = (1024, 768)
# A cold start installs packages and fetches the kernel (scripts/test does it first).
START_TIMEOUT = 300
# TCG boots to the shell in about 10 s on 2 cores; leave room for a busy machine.
BOOT_TIMEOUT = 90


def free_port() -> int:
    """A loopback port nobody listens on now, for QEMU's host forward."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def example_machine(state: Path, port: int) -> dict[str, Any]:
    """examples/qemu-vm/machine.yaml with its sockets in `state` and its forward on `port`."""
    text = (EXAMPLE / "machine.yaml").read_text().replace(EXAMPLE_DIR, str(state))
    machine: dict[str, Any] = yaml.safe_load(text)
    assert machine["status"]["portForward"]["ports"] == [EXAMPLE_PORT]
    machine["status"]["portForward"]["ports"] = [port]
    return machine


def example_policy(state: Path) -> dict[str, Any]:
    """examples/qemu-vm/config.yaml's endpoint policy, with `state` as the socket directory."""
    config: dict[str, Any] = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    return {**config["endpointPolicy"], "socketDirs": [str(state)]}


async def run_script(*args: str) -> str:
    """Run the example's script (bounded) and return its output; fail when it fails.

    The output goes to a file, not a pipe: the daemonized QEMU may hold an
    inherited copy of a pipe (uvloop's spawn leaves one), and reading it to
    its end would wait for the VM to stop.
    """
    with tempfile.TemporaryFile() as log:
        script = await asyncio.create_subprocess_exec(
            "bash", str(SCRIPT), *args, stdout=log, stderr=asyncio.subprocess.STDOUT
        )
        try:
            async with asyncio.timeout(START_TIMEOUT):
                await script.wait()
        finally:
            if script.returncode is None:
                script.kill()
                await script.wait()
        log.seek(0)
        text = log.read().decode(errors="replace")
    sys.stdout.write(text)
    assert script.returncode == 0, text
    return text


@contextlib.asynccontextmanager
async def running_vm(state: Path, port: int) -> AsyncIterator[int]:
    """Start the VM with the example's script; its QEMU PID. Stops it by PID afterwards."""
    output = await run_script("start", str(state), str(port))
    pidfile = state / "qemu.pid"
    assert pidfile.exists(), output
    pid = int(pidfile.read_text())
    try:
        yield pid
    finally:
        os.kill(pid, signal.SIGTERM)
        await wait_for(lambda: not Path(f"/proc/{pid}").exists())


async def read_until(ws: ClientConnection, pattern: re.Pattern[bytes]) -> bytes:
    """The console's output up to and including the first match of `pattern`."""
    seen = b""
    while not pattern.search(seen):
        message = await ws.recv()
        assert isinstance(message, bytes)
        seen += message
    return seen


def console(subres: Standalone) -> connect:
    return connect(
        subres.url("vm1"),
        ssl=subres.client_ssl,
        additional_headers=subres.auth,
        subprotocols=[Subprotocol("plain.kubevirt.io")],
        compression=None,
    )


async def https_get(subres: Standalone, sub: str) -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            subres.url("vm1", sub, scheme="https"),
            ssl=subres.client_ssl,
            headers=subres.auth,
            timeout=aiohttp.ClientTimeout(total=30),
        ) as response,
    ):
        return response.status, await response.read()


async def web_page(subres: Standalone, port: int) -> bytes:
    """GET / from the guest's web server through the KubeVirt-style port-forward."""
    async with connect(
        subres.url("vm1", f"portforward/{port}/tcp"),
        ssl=subres.client_ssl,
        additional_headers=subres.auth,
        compression=None,
    ) as ws:
        await ws.send(b"GET / HTTP/1.0\r\nHost: vm1\r\n\r\n")
        return b"".join([message async for message in ws if isinstance(message, bytes)])


async def shell_computes(ws: ClientConnection) -> None:
    """Wait (booting) for the serial shell's prompt, then have it compute 6*7."""
    await ws.send(b"\r")
    async with asyncio.timeout(BOOT_TIMEOUT):
        await read_until(ws, re.compile(re.escape(PROMPT)))
    await ws.send(b"echo $((6*7))\r")
    async with asyncio.timeout(10):
        await read_until(ws, re.compile(rb"\r\n42\r\n"))


async def test_real_vm_console_screenshot_and_port_forward(tmp_path: Path) -> None:
    state, port = tmp_path / "vm", free_port()
    async with (
        running_vm(state, port),
        start_standalone(
            tmp_path, example_machine(state, port), policy=example_policy(state)
        ) as subres,
        console(subres) as ws,
    ):
        await shell_computes(ws)

        status, body = await https_get(subres, "screenshot")
        assert status == 200, body
        image = Image.open(io.BytesIO(body))
        assert (image.format, image.size) == ("PNG", DISPLAY_SIZE)
        assert image.convert("RGB").getcolors(maxcolors=1) is None, "one colour: no console on VGA"

        # The guest's network comes up in the background; its shell says when.
        await ws.send(b"until ip route | grep -q default; do sleep 0.2; done; echo net-$((2+3))\r")
        async with asyncio.timeout(60):
            await read_until(ws, re.compile(rb"\r\nnet-5\r\n"))
        async with asyncio.timeout(30):
            page = await web_page(subres, port)
        assert page.startswith(b"HTTP/1.") and b"<h1>hello from vm1</h1>" in page, page
