"""A stand-in cluster on 127.0.0.1 that records what `subres web` sends it.

Serves one machine's console over `v5.channel.k8s.io`: stdin is echoed back
on stdout, resize messages and the request's credentials are recorded, so a
test can see what the browser's page caused at the far end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import WSMsgType, web

__all__ = ["TOKEN", "FakeCluster", "fake_cluster"]

TOKEN = "web-test-token"
CONSOLE = "/apis/subresources.subres.dev/v1alpha1/namespaces/{ns}/machines/{name}/console"


@dataclass
class FakeCluster:
    """What the console endpoint saw."""

    url: str = ""
    resizes: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)
    authorizations: list[str] = field(default_factory=list)
    offered: list[str] = field(default_factory=list)
    stdin: bytearray = field(default_factory=bytearray)

    def kubeconfig(self, directory: Path) -> Path:
        """A kubeconfig for this cluster with the test token, namespace `lab`."""
        path = directory / "fake-kubeconfig"
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "u", "user": {"token": TOKEN}}],
            "contexts": [
                {"name": "fake", "context": {"cluster": "fake", "user": "u", "namespace": "lab"}}
            ],
            "current-context": "fake",
        }
        path.write_text(yaml.safe_dump(doc))
        return path

    async def console(self, request: web.Request) -> web.StreamResponse:
        """The machine's console: echo stdin, record resizes."""
        self.authorizations.append(request.headers.get("Authorization", ""))
        self.offered.append(request.headers.get("Sec-WebSocket-Protocol", ""))
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            raise web.HTTPUnauthorized()
        ws = web.WebSocketResponse(protocols=("v5.channel.k8s.io",))
        await ws.prepare(request)
        async for message in ws:
            if message.type != WSMsgType.BINARY or not message.data:
                continue
            channel, data = message.data[0], message.data[1:]
            if channel == 0:
                self.stdin += data
                await ws.send_bytes(b"\x01" + data.replace(b"\r", b"\r\n"))
            elif channel == 4:
                self.resizes.put_nowait(json.loads(data))
        return ws


@contextlib.asynccontextmanager
async def fake_cluster() -> AsyncIterator[FakeCluster]:
    """Serve the fake cluster on a loopback port."""
    cluster = FakeCluster()
    app = web.Application()
    app.router.add_get(CONSOLE, cluster.console)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    cluster.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield cluster
    finally:
        await runner.cleanup()
