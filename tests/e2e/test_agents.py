"""Two nodes behind a real kube-apiserver: node agents, and the QEMU VM behind node-a's.

There is no kubelet, so processes stand in for nodes: two ``subres agent``
processes, node-a on 127.0.0.2 and node-b on 127.0.0.3, each dialing only its
own socket directory, with the certificates ``subres certs`` wrote for the
install. The DaemonSet from ``deploy/`` is in the API but nothing runs it:
for each agent the test creates the Pod the DaemonSet would have made (its
template, bound to the node) and sets its status as a kubelet would
(``--subresource=status``: Ready, the pod IP). subres finds the agents by
watching those pods, as it does in a cluster.

The example VM (``examples/qemu-vm``) boots with its sockets in node-a's
directory; its Machine says ``status.nodeName: node-a``. Everything goes the
full path: a client (websockets, aiohttp, client-go's port-forwarder) →
kube-apiserver (authn, RBAC, front proxy) → subres → mTLS → node-a's agent →
the VM's unix sockets (console, vnc, screenshot) and its forwarded port.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import shutil
import struct
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from PIL import Image
from websockets.asyncio.client import ClientConnection, connect
from websockets.typing import Subprotocol

from tests.e2e import subresserver
from tests.e2e.controlplane import ControlPlane, Process, free_ports, poll, run_sync
from tests.e2e.subresserver import AGENT_NAMESPACE, Subres
from tests.e2e.test_subres import (
    NS,
    Route,
    bind_machine_users,
    console,
    machine_path,
    port_forward,
    put_machine,
    refused,
    screenshot,
    via_apiserver,
)
from tests.examples.test_qemu_vm import (
    DISPLAY_SIZE,
    free_port,
    read_until,
    run_script,
    shell_computes,
)
from tests.support import LOOPBACK_POLICY, Backend, node_local_config

NODES = {"node-a": "127.0.0.2", "node-b": "127.0.0.3"}
"""The stand-in nodes and the loopback address each one's agent listens on."""
AGENT_READY_TIMEOUT_S = 30.0
VM_NAME = "vm1"


def config(root: Path) -> dict[str, Any]:
    """subres's --config: sockets anywhere under `root` (the agents narrow it), and a
    port-forward address that is on the machine's node (QEMU forwards to its loopback)."""
    return {
        **node_local_config("portforward"),
        "endpointPolicy": {"socketDirs": [str(root)], **LOOPBACK_POLICY},
    }


@dataclass
class TwoNodes:
    """subres, the two agents and their directories."""

    subres: Subres
    root: Path
    agents: dict[str, Process]

    def dir(self, node: str) -> Path:
        return self.root / node


@pytest.fixture(scope="module")
def nodes(control_plane: ControlPlane) -> Iterator[TwoNodes]:
    root = Path(tempfile.mkdtemp(prefix="subres-e2e-nodes-"))
    (root / "config.yaml").write_text(yaml.safe_dump(config(root)))
    profile = subresserver.Profile(config=root / "config.yaml")
    server = run_sync(subresserver.launch(control_plane, profile))
    agents: dict[str, Process] = {}
    try:
        run_sync(bind_machine_users(control_plane, "agent-machine-users"))
        [port] = free_ports(1)
        for node, address in NODES.items():
            (root / node).mkdir()
            agents[node] = _agent(server, root, node, address, port)
            agents[node].start()
            run_sync(_agent_pod(control_plane, node, address, port))
        run_sync(_wait_listening(agents, port))
        yield TwoNodes(server, root, agents)
    finally:
        for process in agents.values():
            run_sync(process.stop())
        run_sync(_delete_agent_pods(control_plane))
        run_sync(subresserver.shutdown(server))
        shutil.rmtree(root, ignore_errors=True)


def _agent(server: Subres, root: Path, node: str, address: str, port: int) -> Process:
    """`subres agent` for `node` with the install's agent certificate, its own directory."""
    files = server.cert_files
    return Process(
        name=f"agent {node}",
        args=[
            sys.executable,
            "-m",
            "subres",
            "agent",
            f"--node-name={node}",
            f"--bind-address={address}",
            f"--port={port}",
            f"--tls-cert-file={files / 'agent.crt'}",
            f"--tls-private-key-file={files / 'agent.key'}",
            f"--client-ca-file={files / 'ca.crt'}",
            f"--socket-dir={root / node}",
            "--allow-tcp=127.0.0.0/8",
        ],
        log=server.workdir / f"agent-{node}.log",
    )


async def _wait_listening(agents: dict[str, Process], port: int) -> None:
    async def listening() -> bool:
        for node, process in agents.items():
            if process.exited() is not None:
                raise AssertionError(process.tail())
            try:
                _, writer = await asyncio.open_connection(NODES[node], port)
            except OSError:
                return False
            writer.close()
        return True

    assert await poll(listening, timeout_s=AGENT_READY_TIMEOUT_S), "agents did not listen"


async def _agent_pod(plane: ControlPlane, node: str, address: str, port: int) -> None:
    """The Pod the DaemonSet would run on `node`, and the status a kubelet would give it."""
    daemonset = await plane.api(
        "GET", f"/apis/apps/v1/namespaces/{AGENT_NAMESPACE}/daemonsets/subres-agent"
    )
    template = daemonset["spec"]["template"]
    spec = {**template["spec"], "nodeName": node}
    [container] = spec["containers"]
    [relay] = [p for p in container["ports"] if p["name"] == "relay"]
    relay["containerPort"] = port
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"subres-agent-{node}",
            "namespace": AGENT_NAMESPACE,
            "labels": template["metadata"]["labels"],
        },
        "spec": spec,
    }
    (await plane.kubectl("apply", "-f", "-", stdin=json.dumps(pod))).check()
    status = {
        "status": {
            "phase": "Running",
            "podIP": address,
            "podIPs": [{"ip": address}],
            "conditions": [{"type": "Ready", "status": "True"}],
        }
    }
    (
        await plane.kubectl(
            "patch", "pod", f"subres-agent-{node}", "-n", AGENT_NAMESPACE, "--subresource=status",
            "--type=merge", "-p", json.dumps(status),
        )
    ).check()  # fmt: skip


async def _delete_agent_pods(plane: ControlPlane) -> None:
    await plane.kubectl(
        "delete", "pod", "-n", AGENT_NAMESPACE, "-l", "app.kubernetes.io/name=subres-agent",
        "--grace-period=0", "--force", "--wait=false",
    )  # fmt: skip


async def wait_answer(route: Route, name: str, *, timeout_s: float = 20.0) -> None:
    """Until subres knows the Machine and its node's agent: a console that opens."""

    async def opens() -> bool:
        try:
            async with console(route, name):
                return True
        except Exception as exc:
            # 404/409: not in the cache yet; 503: the agent pod not seen yet.
            status = getattr(getattr(exc, "response", None), "status_code", None)
            assert status in (404, 409, 503), exc
            return False

    assert await poll(opens, timeout_s=timeout_s), f"{name} never served"


async def refusal(route: Route, name: str) -> tuple[int, dict[str, Any]]:
    """How a console to `name` is refused, once subres has the Machine (no more 404)."""
    seen: tuple[int, dict[str, Any]] = (0, {})

    async def known() -> bool:
        nonlocal seen
        seen = await refused(route, name)
        return seen[0] != 404

    assert await poll(known, timeout_s=20.0), f"{name} never reached subres"
    return seen


# -- the VM behind node-a's agent ------------------------------------------------------


@dataclass
class Vm:
    state: Path
    port: int


@pytest.fixture(scope="module")
def vm(nodes: TwoNodes, control_plane: ControlPlane) -> Iterator[Vm]:
    state = nodes.dir("node-a") / VM_NAME
    vm = Vm(state, free_port())
    run_sync(run_script("start", str(state), str(vm.port)))
    try:
        machine = put_machine(
            control_plane,
            VM_NAME,
            console=f"unix://{state / 'serial.sock'}",
            vnc=f"unix://{state / 'vnc.sock'}",
            forward=("127.0.0.1", [vm.port]),
            node="node-a",
        )
        run_sync(machine)
        run_sync(wait_answer(via_apiserver(control_plane, "alice"), VM_NAME))
        yield vm
    finally:
        run_sync(run_script("stop", str(state)))


async def test_vm_console_through_kube_apiserver_and_node_a_agent(
    control_plane: ControlPlane, nodes: TwoNodes, vm: Vm
) -> None:
    async with console(via_apiserver(control_plane, "alice"), VM_NAME) as ws:
        await shell_computes(ws)
    relayed = f"relaying unix://{vm.state / 'serial.sock'} for Machine {NS}/{VM_NAME}"
    assert relayed in nodes.agents["node-a"].tail(), nodes.agents["node-a"].tail()


async def test_vm_screenshot_through_node_a_agent(
    control_plane: ControlPlane, nodes: TwoNodes, vm: Vm
) -> None:
    code, content_type, body = await screenshot(control_plane, "alice", VM_NAME)
    assert (code, content_type) == (200, "image/png"), body[:300]
    image = Image.open(io.BytesIO(body))
    assert image.size == DISPLAY_SIZE
    assert image.convert("RGB").getcolors(maxcolors=1) is None, "one colour: no console on VGA"


async def rfb_read(ws: ClientConnection, buffer: bytearray, size: int) -> bytes:
    while len(buffer) < size:
        message = await ws.recv()
        assert isinstance(message, bytes)
        buffer += message
    data = bytes(buffer[:size])
    del buffer[:size]
    return data


async def test_vm_vnc_rfb_handshake_through_node_a_agent(
    control_plane: ControlPlane, nodes: TwoNodes, vm: Vm
) -> None:
    route = via_apiserver(control_plane, "alice")
    buffer = bytearray()
    async with (
        connect(
            route.base + machine_path(VM_NAME, "vnc"),
            ssl=route.context,
            additional_headers=dict(route.headers),
            subprotocols=[Subprotocol("binary")],
            compression=None,
            open_timeout=15,
        ) as ws,
        asyncio.timeout(20),
    ):
        assert await rfb_read(ws, buffer, 12) == b"RFB 003.008\n"
        await ws.send(b"RFB 003.008\n")
        [count] = await rfb_read(ws, buffer, 1)
        assert 1 in await rfb_read(ws, buffer, count), "QEMU offers security None"
        await ws.send(b"\x01")
        assert await rfb_read(ws, buffer, 4) == b"\x00\x00\x00\x00"  # SecurityResult OK
        await ws.send(b"\x01")  # ClientInit, shared
        width, height = struct.unpack(">HH", await rfb_read(ws, buffer, 4))
        await rfb_read(ws, buffer, 16)  # the pixel format
        [length] = struct.unpack(">I", await rfb_read(ws, buffer, 4))
        name = await rfb_read(ws, buffer, length)
    assert (width, height) == DISPLAY_SIZE
    assert name == f"QEMU ({VM_NAME})".encode()  # QEMU names its display after -name


async def test_vm_port_forward_with_client_go_through_node_a_agent(
    control_plane: ControlPlane, nodes: TwoNodes, vm: Vm
) -> None:
    async with console(via_apiserver(control_plane, "alice"), VM_NAME) as ws:
        # The guest's network comes up in the background; its shell says when.
        await ws.send(
            b"\runtil ip route | grep -q default; do sleep 0.2; done; echo net-$((2+3))\r"
        )
        async with asyncio.timeout(90):
            await read_until(ws, re.compile(rb"\r\nnet-5\r\n"))
    kubeconfig = control_plane.kubeconfig_for("alice")
    path = machine_path(VM_NAME, "portforward")
    async with port_forward(kubeconfig, path, vm.port, transport="spdy") as local:
        reader, writer = await asyncio.open_connection("127.0.0.1", local)
        try:
            writer.write(b"GET / HTTP/1.0\r\nHost: vm1\r\n\r\n")
            async with asyncio.timeout(30):
                page = await reader.read()
        finally:
            writer.close()
    assert page.startswith(b"HTTP/1.") and b"<h1>hello from vm1</h1>" in page, page


# -- the other node, and refusals ---------------------------------------------------------


async def test_node_b_has_its_own_agent_and_directory(
    control_plane: ControlPlane, nodes: TwoNodes
) -> None:
    backend = await Backend().start_unix(nodes.dir("node-b") / "serial.sock")
    try:
        await put_machine(control_plane, "on-node-b", console=backend.url, node="node-b")
        alice = via_apiserver(control_plane, "alice")
        await wait_answer(alice, "on-node-b")
        payload = os.urandom(256 << 10)
        async with console(alice, "on-node-b") as ws:
            await ws.send(payload)
            got = bytearray()
            async with asyncio.timeout(20):
                while len(got) < len(payload):
                    message = await ws.recv()
                    assert isinstance(message, bytes)
                    got += message
        assert bytes(got) == payload
        assert f"relaying {backend.url}" in nodes.agents["node-b"].tail()
    finally:
        await backend.stop()


async def test_a_machine_whose_node_has_no_agent_gets_503_naming_it(
    control_plane: ControlPlane, nodes: TwoNodes
) -> None:
    backend = await Backend().start_unix(nodes.root / "node-c.sock")
    try:
        await put_machine(control_plane, "on-node-c", console=backend.url, node="node-c")
        code, status = await refusal(via_apiserver(control_plane, "alice"), "on-node-c")
        assert code == 503, status
        assert status["reason"] == "ServiceUnavailable"
        assert 'no subres agent serves node "node-c"' in status["message"], status
        assert backend.accepted == 0
    finally:
        await backend.stop()


async def test_a_socket_outside_the_agents_directory_is_refused_by_the_agent(
    control_plane: ControlPlane, nodes: TwoNodes
) -> None:
    # node-b's socket, claimed by a Machine on node-a: subres's own policy allows the
    # path (anything under the test's root), node-a's agent does not.
    backend = await Backend().start_unix(nodes.dir("node-b") / "other.sock")
    try:
        await put_machine(control_plane, "wrong-dir", console=backend.url, node="node-a")
        code, status = await refusal(via_apiserver(control_plane, "alice"), "wrong-dir")
        assert code == 403, status
        assert 'agent on node "node-a"' in status["message"], status
        assert "outside the allowed directories" in status["message"], status
        assert backend.accepted == 0
        assert "refused" in nodes.agents["node-a"].tail()
    finally:
        await backend.stop()
