"""KubeVirt-shaped test fixtures: the shipped profile, VMI and VM objects, their backends.

Shared by the profile's server tests, the virtctl tests (standalone) and the
end-to-end tests through kube-apiserver. Backends keep virt-launcher's socket
layout: `{sockets}/{vmi uid}/virt-serial0` (a shell in a PTY), `…/virt-vnc`
(the demo display) and `…/virt-usbredir-0` to `-3` (stand-ins for QEMU's
usb-redir device, one per slot); a VMI's address is 127.0.0.1, where a TCP
echo server and a UDP echo server listen.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from subres.config import USB_SLOTS
from subres.demo.shell import ShellServer
from subres.demo.vnc import Display, VncServer
from tests.server.portforward_support import UdpEcho
from tests.support import Backend
from tests.usbredir import FakeSlot

__all__ = [
    "EXAMPLE",
    "SOCKETS",
    "Backends",
    "backends",
    "profile",
    "short_dir",
    "vm",
    "vmi",
]

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "kubevirt"
SOCKETS = "/var/run/kubevirt-private"
"""Where the shipped profile looks for a VMI's sockets."""


def profile(sockets: Path) -> dict[str, Any]:
    """The shipped profile with its socket directory moved to `sockets`, without its policy."""
    text = (EXAMPLE / "config.yaml").read_text()
    assert text.count(f"unix://{SOCKETS}/") == 4  # console, vnc, screenshot, usbredir
    doc: dict[str, Any] = yaml.safe_load(text.replace(SOCKETS, str(sockets)))
    del doc["endpointPolicy"]  # the test's own: loopback and the socket directory
    return doc


def vmi(
    name: str,
    uid: str = "",
    *,
    phase: str = "Running",
    interfaces: list[dict[str, str]] | None = None,
    conditions: list[dict[str, str]] | None = None,
    devices: dict[str, Any] | None = None,
    owner: str | None = None,
    namespace: str = "default",
) -> dict[str, Any]:
    """A VirtualMachineInstance as KubeVirt writes one (the fields the profile reads)."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if uid:
        meta["uid"] = uid
    if owner is not None:
        meta["ownerReferences"] = [
            {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": name, "uid": owner}
        ]
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": meta,
        "spec": {"domain": {"devices": devices or {}}},
        "status": {
            "phase": phase,
            "interfaces": [{"ipAddress": "127.0.0.1", "name": "default"}]
            if interfaces is None
            else interfaces,
            "conditions": conditions or [{"type": "Ready", "status": "True"}],
        },
    }


def vm(
    name: str, uid: str = "", *, created: bool = True, namespace: str = "default"
) -> dict[str, Any]:
    """A VirtualMachine whose VMI is `created` (or not yet)."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if uid:
        meta["uid"] = uid
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": meta,
        "spec": {"runStrategy": "Always"},
        "status": {"created": created, "ready": created},
    }


@contextmanager
def short_dir() -> Iterator[Path]:
    """A directory with a short path: `{uid}/virt-serial0` under pytest's tmp_path would
    pass the 108 bytes a unix socket path may have."""
    path = Path(tempfile.mkdtemp(prefix="kv-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@dataclass
class Backends:
    """What one VMI's profile endpoints reach."""

    shell: ShellServer
    """The serial console: a shell in a PTY."""
    display: Display
    """The picture the VNC server shows (a fixed clock: it never changes)."""
    vnc: VncServer
    echo: Backend
    """TCP echo on 127.0.0.1."""
    udp: UdpEcho
    """UDP echo on 127.0.0.1."""
    usb: list[Backend]
    """The VMI's four USB slots (`FakeSlot`s), as virt-launcher makes them."""


@asynccontextmanager
async def backends(sockets: Path, uid: str) -> AsyncIterator[Backends]:
    """A VMI's console and display under `sockets/uid`, and echo servers on 127.0.0.1."""
    (sockets / uid).mkdir(exist_ok=True)
    shell = ShellServer(sockets / uid / "virt-serial0")
    display = Display(clock=lambda: "12:00:00")
    vnc = VncServer(sockets / uid / "virt-vnc", display=display)
    echo = Backend()
    udp = UdpEcho()
    usb = [
        await Backend(handler=FakeSlot(i).handle).start_unix(sockets / uid / f"virt-usbredir-{i}")
        for i in range(USB_SLOTS)
    ]
    await shell.start()
    await vnc.start()
    await echo.start_tcp()
    await udp.start()
    try:
        yield Backends(shell, display, vnc, echo, udp, usb)
    finally:
        await asyncio.gather(*(slot.stop() for slot in usb))
        udp.stop()
        await echo.stop()
        await vnc.stop()
        await shell.stop()
