"""examples/qemu-vm: a real Linux VM under QEMU, served by a standalone subres.

Boots the example's VM once for the module with its own script (Debian's
kernel, a busybox initramfs, TCG unless KVM works here), serves the example's
Machine with its endpoints moved to the test's directory, then goes through
subres: types on the serial console and reads the kernel's shell's answer,
takes a screenshot of the VGA display, fetches the guest's web page over
port-forward, and plugs into QEMU's usb-redir device: a usbredir hello
through subres (and through the real virtctl with the KubeVirt profile) gets
QEMU's own hello back, and a second client takes the slot over. The script
installs QEMU and fetches the kernel when they are missing (as root); when it
cannot, these tests fail: they never skip.
"""

from __future__ import annotations

import asyncio
import io
import re
import socket
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from PIL import Image
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

from subres.protocol import asciicast
from tests import usbredir
from tests.kubevirt import profile, short_dir, vmi
from tests.support import Standalone, start_standalone
from tests.virtctl import Virtctl

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "qemu-vm"
SCRIPT = EXAMPLE / "run-vm.sh"
# Where machine.yaml's endpoints point, and its forwarded port.
EXAMPLE_DIR = "/run/subres/sockets/vm1"
EXAMPLE_PORT = 8080
PROMPT = b"vm1# "
KUBEVIRT = "plain.kubevirt.io"
# The kernel's frame buffer console on QEMU's std VGA (video= on its command line).
DISPLAY_SIZE = (1024, 768)
# A cold start installs packages and fetches the kernel (scripts/test does it first).
START_TIMEOUT = 300
# TCG boots to the shell in about 10 s on 2 cores; leave room for a busy machine.
BOOT_TIMEOUT = 90
QEMU_HELLO = "qemu usb-redir guest "
"""How QEMU's usb-redir device's version string starts (then QEMU's own version)."""


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


def example_parents() -> dict[str, Any]:
    """examples/qemu-vm/config.yaml's parent kinds: Machines with two consoles."""
    config: dict[str, Any] = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    return {"parents": config["parents"]}


@dataclass(frozen=True)
class Vm:
    """The example's VM, running: where its sockets are, its forwarded port, its PID."""

    state: Path
    port: int
    pid: int


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


@pytest.fixture(scope="module")
def vm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vm]:
    """The VM, started with the example's script for every test here, and stopped by it."""
    state, port = tmp_path_factory.mktemp("qemu") / "vm", free_port()
    output = asyncio.run(run_script("start", str(state), str(port)))
    assert (state / "qemu.pid").exists(), output
    try:
        yield Vm(state, port, int((state / "qemu.pid").read_text()))
    finally:
        asyncio.run(run_script("stop", str(state)))


async def read_until(ws: ClientConnection, pattern: re.Pattern[bytes]) -> bytes:
    """The console's output up to and including the first match of `pattern`."""
    seen = b""
    while not pattern.search(seen):
        message = await ws.recv()
        assert isinstance(message, bytes)
        seen += message
    return seen


def console(subres: Standalone, query: str = "", *, sub: str = "console") -> connect:
    return connect(
        subres.url("vm1", sub) + query,
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


async def test_real_vm_console_screenshot_and_port_forward(vm: Vm, tmp_path: Path) -> None:
    state, port = vm.state, vm.port
    async with (
        start_standalone(
            tmp_path,
            example_machine(state, port),
            policy=example_policy(state),
            config=example_parents(),
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


async def usb_hello(ws: ClientConnection) -> str:
    """Send a usbredir client's hello; the version of the hello that comes back."""
    await ws.send(usbredir.hello("subres test client"))
    data = b""
    async with asyncio.timeout(30):
        while (version := usbredir.parse_hello(data)) is None:
            message = await ws.recv()
            assert isinstance(message, bytes)
            data += message
    return version


async def test_a_usbredir_hello_through_subres_gets_qemus_own_and_a_second_takes_over(
    vm: Vm, tmp_path: Path
) -> None:
    machine = example_machine(vm.state, vm.port)
    async with start_standalone(tmp_path, machine, policy=example_policy(vm.state)) as subres:
        url = subres.url("vm1", "usbredir")
        async with subres.websocket(url, KUBEVIRT) as first:
            assert (await usb_hello(first)).startswith(QEMU_HELLO)
            async with subres.websocket(url, KUBEVIRT, user="bob") as second:
                async with asyncio.timeout(30):
                    with pytest.raises(ConnectionClosed):
                        while True:
                            await first.recv()
                reason = "usbredir slot 0 of default/vm1 taken over by bob"
                assert (first.close_code, first.close_reason) == (4001, reason)
                # QEMU takes the next connection once the first is gone, and greets it anew.
                assert (await usb_hello(second)).startswith(QEMU_HELLO)


async def test_virtctl_usbredir_reaches_qemus_device_through_the_kubevirt_profile(
    vm: Vm, tmp_path: Path, virtctl_bin: Path
) -> None:
    uid = "1b6e2c4a-8d3f-4e5a-9c7b-0f1e2d3c4b5a"
    with short_dir() as sockets:
        (sockets / uid).mkdir()
        (sockets / uid / "virt-usbredir-0").symlink_to(vm.state / "usbredir0.sock")
        config = profile(sockets)
        # The example VM has one usb-redir device, KubeVirt's VMIs four.
        config["parents"][0]["subresources"]["usbredir"]["slots"] = 1
        policy = {"socketDirs": [str(sockets), str(vm.state)]}
        async with start_standalone(
            sockets,
            vmi("vm1", uid, devices={"clientPassthrough": {}}),
            config=config,
            policy=policy,
        ) as subres:
            virtctl = Virtctl(virtctl_bin, subres.kubeconfig(), tmp_path)
            await virtctl.usbredir_takeover("vm1", device=QEMU_HELLO, slots=1)


async def typed(ws: ClientConnection, command: bytes, answer: bytes) -> bytes:
    """Type `command` (then Enter) and read up to the line `answer`."""
    await ws.send(command + b"\r")
    async with asyncio.timeout(30):
        return await read_until(ws, re.compile(rb"\r\n" + re.escape(answer) + rb"\r\n"))


async def test_two_serial_ports_each_with_its_own_writer_observer_recording_and_log(
    vm: Vm, tmp_path: Path
) -> None:
    machine = example_machine(vm.state, vm.port)
    machine["metadata"]["annotations"] = {
        "subres.dev/keep-console": "true",
        "subres.dev/record-console": "true",
    }
    recordings = tmp_path / "recordings"
    async with start_standalone(
        tmp_path,
        machine,
        policy=example_policy(vm.state),
        config={**example_parents(), "consoles": {"recordings": {"directory": str(recordings)}}},
    ) as subres:
        async with (
            console(subres) as serial0,
            console(subres, "?console=serial1") as serial1,
            console(subres, sub="console-observe") as watching0,
            console(subres, "?console=serial1", sub="console-observe") as watching1,
        ):
            await shell_computes(serial0)  # the kernel's console, with a shell on it
            await serial1.send(b"\r")
            async with asyncio.timeout(BOOT_TIMEOUT):
                await read_until(serial1, re.compile(re.escape(PROMPT)))  # the getty's shell
            await typed(serial1, b"tty", b"/dev/ttyS1")
            await typed(serial0, b"tty", b"/dev/ttyS0")
            # The kernel writes its messages to serial0 only (console=ttyS0).
            await serial1.send(b'echo "<3>subres: $((6*7)) from the kernel" >/dev/kmsg\r')
            async with asyncio.timeout(30):
                seen0 = await read_until(watching0, re.compile(rb"subres: 42 from the kernel"))
            await serial1.send(b"echo done-$((1+1))\r")
            async with asyncio.timeout(30):
                seen1 = await read_until(watching1, re.compile(rb"\r\ndone-2\r\n"))
        assert b"/dev/ttyS0" in seen0 and b"/dev/ttyS1" not in seen0
        assert b"/dev/ttyS1" in seen1 and b"/dev/ttyS0" not in seen1
        assert b"42 from the kernel" not in seen1
        logs = [await https_get(subres, f"log{query}") for query in ("", "?console=serial1")]
        assert [status for status, _ in logs] == [200, 200]
        assert b"subres: 42 from the kernel" in logs[0][1] and b"/dev/ttyS1" in logs[1][1]
        assert b"subres: 42 from the kernel" not in logs[1][1]
        await subres.server.state.recordings.stop()
    casts = {
        p.name.split("-")[1]: output(p)
        for p in (recordings / "default/machines/vm1").rglob("*.cast")
    }
    assert set(casts) == {"serial1", *casts} and len(casts) == 2, casts
    assert "/dev/ttyS1" in casts["serial1"] and "/dev/ttyS0" not in casts["serial1"]
    [default] = (text for name, text in casts.items() if name != "serial1")
    assert "/dev/ttyS0" in default and "/dev/ttyS1" not in default


def output(cast: Path) -> str:
    """What a recording shows: its output events joined (a slow console sends a byte each)."""
    _, events = asciicast.read(cast.read_bytes().splitlines())
    return "".join(event.data for event in events if event.code == "o")
