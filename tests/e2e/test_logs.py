"""A kept console's `log` through a real kube-apiserver: kubectl reads and follows it.

subres is deployed from ``deploy/`` as in ``test_subres`` (its own instance);
alice's group is bound to the user role, which grants `get machines/log`,
and a probe group only to the built-in `view` role, which gets it through
ClusterRole aggregation. `kubectl get --raw …/log?follow=true` is kubectl's
own streaming GET: kube-apiserver proxies the chunked answer as it comes
(`log` is one of its long-running subresources, so no request timeout cuts
it).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import pytest

from tests.consoles import Console
from tests.e2e.controlplane import ControlPlane, poll
from tests.e2e.subresserver import GROUP, Subres
from tests.e2e.test_subres import NS, bind, machine_path, put_machine, subres
from tests.support import Backend

__all__ = ["subres"]

KEEP = {"subres.dev/keep-console": "true"}
TIMEOUT_S = 30.0


@pytest.fixture
async def kept(control_plane: ControlPlane, subres: Subres) -> AsyncIterator[Console]:
    """Machine `log-1`, its console kept by subres, printing lines 1 to 25."""
    console = Console()
    serial = await Backend(handler=console.handle).start_tcp()
    try:
        await put_machine(control_plane, "log-1", console=serial.url, annotations=KEEP)
        assert await poll(lambda: _open(serial), timeout_s=TIMEOUT_S), subres.logs()
        await console.say(b"".join(b"line %d\r\n" % n for n in range(1, 26)))

        async def logged() -> bool:
            answer = await control_plane.kubectl("get", "--raw", machine_path("log-1", "log"))
            return answer.stdout.endswith("line 25\r\n")

        assert await poll(logged, timeout_s=TIMEOUT_S), subres.logs()
        yield console
    finally:
        await control_plane.kubectl("delete", "machine", "log-1", "-n", NS)
        await serial.stop()


async def _open(serial: Backend) -> bool:
    return serial.open == 1


async def test_kubectl_get_raw_follows_a_kept_console(
    control_plane: ControlPlane, kept: Console
) -> None:
    path = machine_path("log-1", "log") + "?follow=true&tailLines=20"
    env = {**os.environ, "KUBECONFIG": str(control_plane.kubeconfig_for("alice"))}
    proc = await asyncio.create_subprocess_exec(
        str(control_plane.binaries.kubectl), "get", "--raw", path,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    try:
        async with asyncio.timeout(TIMEOUT_S):
            first = [await proc.stdout.readline() for _ in range(20)]
        assert first == [b"line %d\r\n" % n for n in range(6, 26)]
        await kept.say(b"typed later\r\n")
        async with asyncio.timeout(TIMEOUT_S):
            assert await proc.stdout.readline() == b"typed later\r\n"
    finally:
        proc.kill()
        await proc.wait()


async def test_log_is_view_level_and_refused_to_others(
    control_plane: ControlPlane, kept: Console
) -> None:
    viewer = ["--as=someone", "--as-group=probe:view"]
    await bind(
        control_plane,
        "probe-view",
        subject="--group=probe:view",
        check_as=viewer,
        role="view",
        subresource="log",
    )
    try:
        path = machine_path("log-1", "log") + "?tailLines=1&timestamps=true"
        answer = (await control_plane.kubectl("get", "--raw", path, *viewer)).check()
        assert answer.stdout.endswith(" line 25\r\n") and answer.stdout.startswith("20")
        # The viewer may read the log, not type into the console.
        typing = ("auth", "can-i", "get", f"machines.{GROUP}", "--subresource=console")
        assert (await control_plane.kubectl(*typing, "-n", NS, *viewer)).stdout.strip() == "no"
    finally:
        await control_plane.kubectl("delete", "rolebinding", "probe-view", "-n", NS)
    refused = await control_plane.kubectl("get", "--raw", machine_path("log-1", "log"), user="bob")
    assert refused.returncode != 0 and "forbidden" in refused.stderr.lower(), refused
