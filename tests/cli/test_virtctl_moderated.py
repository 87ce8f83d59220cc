"""The real virtctl's console on a moderated VMI: it reads why it waits, then works once watched.

virtctl v1.7.0, unmodified, under a PTY, against standalone subres serving
the KubeVirt profile with a moderation policy on VirtualMachineInstances.
The moderator is mia, a member of `sre-leads` by her client certificate.
"""

from __future__ import annotations

from pathlib import Path

import websockets
from websockets.asyncio.client import connect

from tests.kubevirt import backends, profile, short_dir, vmi
from tests.support import start_standalone
from tests.virtctl import Virtctl, _expect

UID = "7d0e3f52-9c1b-4a8e-b6f4-2e5d8c1a9b30"
POLICY = {
    "name": "vmis",
    "kinds": ["VirtualMachineInstance"],
    "subresources": ["console"],
    "moderators": {"groups": ["sre-leads"]},
}


async def test_a_waiting_virtctl_console_sees_text_then_types_once_watched(
    virtctl_bin: Path, tmp_path: Path
) -> None:
    with short_dir() as sockets:
        async with backends(sockets, UID):
            config = {**profile(sockets), "moderation": [POLICY]}
            async with start_standalone(sockets, vmi("vm1", UID), config=config) as subres:
                virtctl = Virtctl(virtctl_bin, subres.kubeconfig(), tmp_path)
                moderate = subres.api_url(
                    "/apis/subresources.kubevirt.io/v1/namespaces/default/"
                    "virtualmachineinstances/vm1/console-moderate"
                )
                async with virtctl.terminal("console", "vm1") as child:
                    await _expect(child, "waiting for 1 moderator \\(a member of sre-leads\\)")
                    async with connect(
                        moderate,
                        ssl=subres.client_cert_ssl("mia", ["sre-leads"]),
                        subprotocols=[websockets.Subprotocol("v5.channel.k8s.io")],
                    ):
                        await _expect(child, "mia moderating; the session starts")
                        child.send("echo sub$((40+2))res\r")
                        await _expect(child, "sub42res")
