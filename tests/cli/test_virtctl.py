"""The real virtctl v1.7.0, unmodified, against standalone subres serving the KubeVirt profile.

virtctl reads the kubeconfig of the standalone server as it would a cluster's;
the VMI's console is a shell in a PTY, its display the demo picture, its
address 127.0.0.1 with TCP and UDP echo servers (tests/kubevirt.py). The same
scenarios run through a real kube-apiserver in tests/e2e/test_kubevirt.py.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from subres.config import USB_SLOTS
from tests.kubevirt import Backends, backends, profile, short_dir, vm, vmi
from tests.server.test_vnc_shared import Viewer
from tests.support import Standalone, start_standalone
from tests.usbredir import FakeSlot
from tests.virtctl import Virtctl

UID = "7d0e3f52-9c1b-4a8e-b6f4-2e5d8c1a9b30"
LATER = "3c2b1a09-8f7e-4d6c-a5b4-c3d2e1f0a9b8"


@dataclass
class Setup:
    subres: Standalone
    virtctl: Virtctl
    backends: Backends
    objects: list[dict[str, Any]]


@pytest.fixture
async def setup(virtctl_bin: Path, tmp_path: Path) -> AsyncIterator[Setup]:
    with short_dir() as sockets:
        async with backends(sockets, UID) as b:
            (sockets / LATER).mkdir()
            (sockets / LATER / "virt-serial0").symlink_to(sockets / UID / "virt-serial0")
            objects = [
                vmi("vm1", UID, owner="vm1-uid", devices={"clientPassthrough": {}}),
                vm("vm1", "vm1-uid"),
                vmi("later", LATER, phase="Scheduling"),
            ]
            async with start_standalone(sockets, *objects, config=profile(sockets)) as subres:
                virtctl = Virtctl(virtctl_bin, subres.kubeconfig(), tmp_path)
                yield Setup(subres, virtctl, b, objects)


async def test_usbredir_no_launch_reaches_the_slot_and_a_second_takes_it_over(
    setup: Setup,
) -> None:
    await setup.virtctl.usbredir_takeover("vm1", device=FakeSlot.VERSION, slots=USB_SLOTS)
    assert [slot.accepted for slot in setup.backends.usb] == [2, 1, 1, 1]


async def test_version_reads_the_profiles_document(setup: Setup) -> None:
    await setup.virtctl.version(server="v1.7.0")


async def test_an_error_is_printed_without_version_noise(setup: Setup) -> None:
    await setup.virtctl.error_without_noise("nosuch")


async def test_console_typing_reaches_the_vmis_shell(setup: Setup) -> None:
    await setup.virtctl.console_types("vm1")


async def test_console_with_timeout_waits_for_the_vmi_to_run(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = setup.subres.server.state.caches["virtualmachineinstances"]
    looked_up = asyncio.Event()
    lookup = cache.get

    def counting(namespace: str, name: str) -> Any:
        found = lookup(namespace, name)
        if name == "later" and found is not None and found["status"]["phase"] != "Running":
            looked_up.set()  # this request is answered 400: VMI is not running
        return found

    monkeypatch.setattr(cache, "get", counting)

    async def start() -> None:
        later = vmi("later", LATER)
        setup.subres.write_machines(
            *[o for o in setup.objects if o["metadata"]["uid"] != LATER], later
        )

    async def refused() -> None:
        await looked_up.wait()

    await setup.virtctl.console_waits_for_running("later", refused=refused, start=start)


async def test_vnc_proxy_only_serves_a_real_vnc_client(setup: Setup) -> None:
    await setup.virtctl.vnc_proxy_only("vm1", setup.backends.display)


async def test_vnc_screenshot(setup: Setup) -> None:
    await setup.virtctl.screenshot("vm1", setup.backends.display)


@pytest.mark.parametrize("kind", ["vmi", "vm"])
async def test_port_forward_tcp(setup: Setup, kind: str) -> None:
    port = int(setup.backends.echo.url.rsplit(":", 1)[1])
    await setup.virtctl.forward_tcp(f"{kind}/vm1", port)
    assert setup.backends.echo.accepted == 1


@pytest.mark.parametrize("kind", ["vmi", "vm"])
async def test_port_forward_udp(setup: Setup, kind: str) -> None:
    await setup.virtctl.forward_udp(f"{kind}/vm1", setup.backends.udp.port)


async def test_port_forward_stdio(setup: Setup) -> None:
    port = int(setup.backends.echo.url.rsplit(":", 1)[1])
    await setup.virtctl.forward_stdio("vmi/vm1", port)


async def test_virtctl_vnc_and_a_view_only_viewer_share_the_display(setup: Setup) -> None:
    config = setup.subres.server.state.config
    path = f"/apis/{config.group}/{config.version}/namespaces/default/virtualmachineinstances/vm1"
    observe = setup.subres.base.replace("https://", "wss://") + path + "/vnc-observe"
    async with setup.subres.websocket(observe, "binary", user="bob") as ws:
        watcher = Viewer(ws)
        await watcher.hello(shared=False)
        # virtctl's viewer is the interactive one, beside the view-only one.
        await setup.virtctl.vnc_proxy_only("vm1", setup.backends.display)
        await ws.send(b"\x03\x00" + struct.pack(">HHHH", 0, 0, 16, 16))
        assert (await watcher.read(4))[0] == 0  # still served: a FramebufferUpdate
