"""A real VM in a pod on node-a, reached through kube-apiserver with every client a user has.

The VM (examples/qemu-vm in a pod, its sockets in node-a's agent directory)
is reached as alice, through kube-apiserver, the aggregation layer, a subres
replica on either node and node-a's agent: ``subres console``, ``subres
vnc``, ``subres screenshot``, ``subres port-forward``, a raw WebSocket client
speaking ``v5.channel.k8s.io`` with a bearer token (as a ``kubectl get
--raw``-style tool does), and the browser page behind ``subres web``.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import struct
from pathlib import Path

import pytest
from PIL import Image

from tests.browser import cdp
from tests.browser.conftest import subres_web
from tests.browser.test_console import CONNECTED, buffer_has
from tests.cluster import live, users, vm
from tests.cluster.cluster import Cluster
from tests.cluster.vm import Vm
from tests.e2e.controlplane import free_ports, poll, run_sync
from tests.e2e.test_subres import console, via_apiserver
from tests.examples.test_qemu_vm import DISPLAY_SIZE

pytestmark = pytest.mark.timeout(900)

BOOT_TIMEOUT_S = 120.0
"""TCG boots to the shell in ~10 s on 2 idle cores; the cluster shares them."""


def test_the_vm_runs_in_a_pod_on_node_a_with_its_sockets_for_the_agent(
    cluster: Cluster, running_vm: Vm
) -> None:
    assert running_vm.pod["spec"]["nodeName"] == vm.NODE
    machine = run_sync(
        cluster.plane.api("GET", f"/apis/subres.dev/v1alpha1/namespaces/{vm.NS}/machines/{vm.NAME}")
    )
    assert machine["status"]["nodeName"] == vm.NODE
    assert machine["status"]["console"]["endpoint"] == f"unix://{vm.SOCKETS}/serial.sock"
    assert machine["status"]["portForward"] == {"address": running_vm.address, "ports": [vm.PORT]}
    print(f"the VM boots with {run_sync(vm.accel(cluster))}")


async def test_subres_console_types_into_the_vm(
    cluster: Cluster, running_vm: Vm, tmp_path: Path
) -> None:
    args = ["console", vm.NAME, "-n", vm.NS, "--timeout", "1m"]
    async with contextlib.AsyncExitStack() as stack:
        ready = re.compile(rb"Connected to machine/vm1")
        writer = users.ConsoleWriter(
            users.Rerun(args, live.cli_env(cluster, tmp_path), stack, ready)
        )
        async with asyncio.timeout(BOOT_TIMEOUT_S):
            while not await writer.probe():
                pass
        [term] = writer.cli.runs
        term.write(b"\x1d")  # Ctrl+] leaves
        async with asyncio.timeout(20):
            assert await term.process.wait() == 0, term.text()


async def test_a_raw_websocket_client_with_a_bearer_token(cluster: Cluster, running_vm: Vm) -> None:
    route = via_apiserver(cluster.plane, "alice")
    async with console(route, vm.NAME, subprotocols=["v5.channel.k8s.io"]) as ws:
        assert ws.subprotocol == "v5.channel.k8s.io"
        seen = b""
        async with asyncio.timeout(BOOT_TIMEOUT_S):
            while b"raw-42" not in seen:
                await ws.send(b"\x00echo raw-$((6*7))\r")
                try:
                    async with asyncio.timeout(3):
                        while b"raw-42" not in seen:
                            message = await ws.recv()
                            assert isinstance(message, bytes)
                            if message[:1] == b"\x01":
                                seen += message[1:]
                except TimeoutError:
                    continue


async def test_subres_screenshot_is_the_vms_display(
    cluster: Cluster, running_vm: Vm, tmp_path: Path
) -> None:
    out = tmp_path / "vm1.png"
    args = ["screenshot", vm.NAME, "-n", vm.NS, "-o", str(out)]
    async with users.terminal(args, env=live.cli_env(cluster, tmp_path)) as term:
        async with asyncio.timeout(60):
            assert await term.process.wait() == 0, term.text()
    image = Image.open(io.BytesIO(out.read_bytes()))
    assert (image.format, image.size) == ("PNG", DISPLAY_SIZE)
    assert image.convert("RGB").getcolors(maxcolors=1) is None, "one colour: no console on VGA"


async def test_subres_vnc_relays_the_display(
    cluster: Cluster, running_vm: Vm, tmp_path: Path
) -> None:
    args = ["vnc", vm.NAME, "-n", vm.NS, "--proxy-only"]
    async with users.terminal(args, env=live.cli_env(cluster, tmp_path)) as term:
        await term.wait_for(re.compile(rb'\{"port": \d+\}'), timeout_s=60)
        port = json.loads(re.findall(rb'\{"port": \d+\}', term.output)[0])["port"]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            async with asyncio.timeout(30):
                assert await reader.readexactly(12) == b"RFB 003.008\n"
                writer.write(b"RFB 003.008\n")
                [count] = await reader.readexactly(1)
                assert 1 in await reader.readexactly(count), "QEMU offers security None"
                writer.write(b"\x01")
                assert await reader.readexactly(4) == b"\x00\x00\x00\x00"
                writer.write(b"\x01")
                width, height = struct.unpack(">HH", await reader.readexactly(4))
                await reader.readexactly(16)
                [length] = struct.unpack(">I", await reader.readexactly(4))
                name = await reader.readexactly(length)
        finally:
            writer.close()
    assert (width, height) == DISPLAY_SIZE
    assert name == b"QEMU (vm1)"


async def test_subres_port_forward_reaches_the_guests_web_server(
    cluster: Cluster, running_vm: Vm, tmp_path: Path
) -> None:
    [local] = free_ports(1)
    args = ["port-forward", vm.NAME, "-n", vm.NS, f"{local}:{vm.PORT}"]
    async with users.terminal(args, env=live.cli_env(cluster, tmp_path)) as term:
        await term.wait_for(re.compile(rb"Forwarding from 127\.0\.0\.1"), timeout_s=60)
        prober = users.ForwardProber(local)
        # The guest brings its network up in the background after the shell.
        assert await poll(prober.fetch, timeout_s=BOOT_TIMEOUT_S), prober.failures[-3:]


async def test_the_browser_page_types_into_the_vm(
    cluster: Cluster, running_vm: Vm, browser: cdp.Browser
) -> None:
    kubeconfig = cluster.plane.kubeconfig_for("alice")
    async with subres_web(kubeconfig, f"{vm.NS}/{vm.NAME}") as url:
        page = await browser.new_page()
        await page.goto(url)
        await page.wait_for(CONNECTED, within=60)
        async with asyncio.timeout(BOOT_TIMEOUT_S):
            while True:
                await page.type("\recho page-$((6*7))\r")
                try:
                    await page.wait_for(buffer_has("page-42"), within=3)
                    break
                except cdp.CdpError:
                    continue
