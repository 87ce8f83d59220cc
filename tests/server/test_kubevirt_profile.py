"""examples/kubevirt/config.yaml served standalone: virt-api's paths, documents and codes.

The profile is loaded as shipped; only its socket directory is moved into the
test's own (the sockets keep KubeVirt's layout, `{uid}/virt-serial0` and
`{uid}/virt-vnc`) and the endpoint policy allows loopback. virtctl itself is
driven against the same setup in tests/cli/test_virtctl.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from PIL import Image
from websockets.asyncio.client import ClientConnection

from subres.demo.vnc import VncServer
from tests.kubevirt import profile, short_dir, vm, vmi
from tests.support import Backend, Standalone, start_standalone
from tests.usbredir import FakeSlot, parse_hello

PLAIN = "plain.kubevirt.io"


@pytest.fixture
def sockets() -> Iterator[Path]:
    with short_dir() as path:
        yield path


@dataclass
class Cluster:
    subres: Standalone
    console: Backend
    echo: Backend
    display: VncServer


UID = "5f0c2b8e-1f4e-4c59-9d1a-6b7f3c2a9e01"
USB: dict[str, object] = {"clientPassthrough": {}}
"""What turns a VMI's USB redirection on (KubeVirt's spec.domain.devices)."""


@pytest.fixture
async def kubevirt(sockets: Path) -> AsyncIterator[Cluster]:
    (sockets / UID).mkdir()
    console = await Backend().start_unix(sockets / UID / "virt-serial0")
    echo = await Backend().start_tcp()
    display = VncServer(sockets / UID / "virt-vnc")
    await display.start()
    objects = [
        vmi("vm1", UID, owner="vm-uid-1"),
        vm("vm1", "vm-uid-1"),
        vmi("pending", "uid-pending", phase="Scheduling"),
        vmi("failed", "uid-failed", phase="Failed"),
        vmi("noserial", "uid-noserial", devices={"autoattachSerialConsole": False}),
        vmi("nodisplay", "uid-nodisplay", devices={"autoattachGraphicsDevice": False}),
        vmi(
            "paused",
            "uid-paused",
            conditions=[{"type": "Paused", "status": "True", "reason": "PausedByUser"}],
        ),
        vmi("nonet", "uid-nonet", interfaces=[]),
        vmi("traversal", "../../../etc/x"),
        vm("stopped", "vm-uid-stopped", created=False),
        vm("orphan", "vm-uid-orphan"),
        vmi("orphan", "uid-orphan", owner="someone-else"),
        vm("novmi", "vm-uid-novmi"),
        vmi("usb", UID, devices=USB),
        vmi("usbpending", "uid-usbpending", phase="Scheduling", devices=USB),
    ]
    try:
        async with start_standalone(sockets, *objects, config=profile(sockets)) as subres:
            yield Cluster(subres, console, echo, display)
    finally:
        for backend in (console, echo):
            await backend.stop()
        await display.stop()


async def http_get(subres: Standalone, path: str) -> tuple[int, str, bytes]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            subres.api_url(path, scheme="https"),
            ssl=subres.client_ssl,
            headers=subres.auth,
            timeout=aiohttp.ClientTimeout(total=30),
        ) as response,
    ):
        return response.status, response.content_type, await response.read()


async def refused(subres: Standalone, path: str) -> tuple[int, str]:
    """A WebSocket upgrade that must be refused: its code and Status message."""
    code, status = await subres.refused(subres.api_url(path), PLAIN)
    return code, str(status["message"])


async def echoes(subres: Standalone, path: str, payload: bytes) -> bytes:
    return await subres.echoed(subres.api_url(path), payload, PLAIN)


async def test_the_version_document_is_virt_apis_shape_with_the_configured_release(
    kubevirt: Cluster,
) -> None:
    status, kind, body = await http_get(
        kubevirt.subres, "/apis/subresources.kubevirt.io/v1/version"
    )
    info = json.loads(body)
    assert (status, kind) == (200, "application/json")
    assert set(info) == {
        "gitVersion", "gitCommit", "gitTreeState", "buildDate", "goVersion", "compiler", "platform",
    }  # fmt: skip
    assert info["gitVersion"] == "v1.7.0" and info["platform"].startswith("linux/")
    status, _, body = await http_get(kubevirt.subres, "/apis/subresources.kubevirt.io")
    group = json.loads(body)
    assert group["preferredVersion"]["groupVersion"] == "subresources.kubevirt.io/v1"


async def test_console_of_a_running_vmi_reaches_its_serial_socket(kubevirt: Cluster) -> None:
    payload = os.urandom(256 << 10)
    got = await echoes(kubevirt.subres, "virtualmachineinstances/vm1/console", payload)
    assert hashlib.sha256(got).digest() == hashlib.sha256(payload).digest()
    assert kubevirt.console.accepted == 1


VMIS = "virtualmachineinstances"
VMS = "virtualmachines"


@pytest.mark.parametrize(
    ("path", "code", "message"),
    [
        # virtctl console --timeout retries on exactly this 400.
        (f"{VMIS}/pending/console", 400, "VMI is not running"),
        (f"{VMIS}/failed/console", 409, "VMI is in failed status"),
        (f"{VMIS}/noserial/console", 400, "No serial consoles are present."),
        (f"{VMIS}/pending/vnc", 400, "VMI is not running"),
        (f"{VMIS}/nodisplay/vnc", 400, "No graphics devices are present."),
        (f"{VMIS}/nodisplay/vnc/screenshot", 400, "No graphics devices are present."),
        (f"{VMIS}/paused/portforward/22", 409, "VMI is paused"),
        (f"{VMIS}/nonet/portforward/22", 400, "has no port-forward address"),
        (f"{VMIS}/nosuch/console", 404, 'virtualmachineinstances.kubevirt.io "nosuch" not found'),
        # A VM forwards only to the running VMI it owns.
        (f"{VMS}/stopped/portforward/22", 409, "VMI is not started"),
        (f"{VMS}/orphan/portforward/22", 409, "is not owned by VirtualMachine default/orphan"),
        (
            f"{VMS}/novmi/portforward/22",
            404,
            'virtualmachineinstances.kubevirt.io "novmi" not found',
        ),
        (f"{VMS}/nosuch/portforward/22", 404, 'virtualmachines.kubevirt.io "nosuch" not found'),
        (f"{VMIS}/vm1/usbredir", 409, "Not configured with USB Redirection"),
        (f"{VMIS}/usbpending/usbredir", 400, "VMI is not running"),
    ],
)
async def test_refusals_carry_virt_apis_codes(
    kubevirt: Cluster, path: str, code: int, message: str
) -> None:
    got = await refused(kubevirt.subres, path)
    assert got[0] == code and message in got[1]
    assert kubevirt.console.accepted == 0 and kubevirt.echo.accepted == 0


async def test_usbredir_greets_from_the_first_free_slot_of_virt_launchers(
    kubevirt: Cluster, sockets: Path
) -> None:
    slots = [
        await Backend(handler=FakeSlot(i).handle).start_unix(sockets / UID / f"virt-usbredir-{i}")
        for i in (0, 1)
    ]
    url = kubevirt.subres.api_url(f"{VMIS}/usb/usbredir")
    try:
        async with kubevirt.subres.websocket(url, PLAIN) as first:
            assert await _hello(first) == f"{FakeSlot.VERSION} slot 0"
            async with kubevirt.subres.websocket(url, PLAIN) as second:
                assert await _hello(second) == f"{FakeSlot.VERSION} slot 1"
                # The profile has four slots (KubeVirt's); the third has no socket here.
                code, message = await refused(kubevirt.subres, f"{VMIS}/usb/usbredir")
                assert code == 503 and "virt-usbredir-2" in message
    finally:
        await asyncio.gather(*(slot.stop() for slot in slots))


async def _hello(ws: ClientConnection) -> str:
    data = b""
    async with asyncio.timeout(10):
        while (version := parse_hello(data)) is None:
            message = await ws.recv()
            assert isinstance(message, bytes)
            data += message
    return version


async def test_a_uid_that_would_leave_the_socket_directory_is_refused(kubevirt: Cluster) -> None:
    code, message = await refused(kubevirt.subres, "virtualmachineinstances/traversal/console")
    assert code == 400 and "may not go into an endpoint" in message


async def test_screenshot_at_virt_apis_path_with_move_cursor(kubevirt: Cluster) -> None:
    for query in ("?moveCursor=false", "?moveCursor=true", ""):
        status, kind, body = await http_get(
            kubevirt.subres, f"virtualmachineinstances/vm1/vnc/screenshot{query}"
        )
        assert (status, kind) == (200, "image/png"), body[:200]
        image = Image.open(io.BytesIO(body))
        assert image.size == (kubevirt.display.display.width, kubevirt.display.display.height)


@pytest.mark.parametrize("kind", ["virtualmachineinstances", "virtualmachines"])
async def test_portforward_to_any_port_of_a_vmi_and_of_its_vm(kubevirt: Cluster, kind: str) -> None:
    port = int(kubevirt.echo.url.rsplit(":", 1)[1])
    payload = os.urandom(64 << 10)
    assert await echoes(kubevirt.subres, f"{kind}/vm1/portforward/{port}/tcp", payload) == payload
    assert kubevirt.echo.accepted == 1
