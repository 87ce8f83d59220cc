"""Driving the client-go peer (`tools/kubepeer`) from async tests.

`forwarding` runs `kubepeer portforward` and yields its local ports once it
printed `ready`; `run_exec` runs `kubepeer exec` with bytes on stdin. Every
wait is bounded; only the processes started here are stopped, by PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support import GROUP_VERSION, Standalone, communicate

__all__ = [
    "ExecResult",
    "Forwarder",
    "forwarding",
    "machine_path",
    "pf_machine",
    "run_exec",
    "start_exec",
]

STARTUP_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0
EXEC_TIMEOUT = 60.0


def pf_machine(
    name: str, ports: list[int], *, console: str | None = None, phase: str = "Running"
) -> dict[str, Any]:
    """A Machine that forwards to 127.0.0.1 and allows `ports` (and has a console if given)."""
    status: dict[str, Any] = {
        "phase": phase,
        "portForward": {"address": "127.0.0.1", "ports": ports},
    }
    if console is not None:
        status["console"] = {"endpoint": console}
    return {
        "apiVersion": "subres.dev/v1alpha1",
        "kind": "Machine",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {},
        "status": status,
    }


def machine_path(name: str, sub: str) -> str:
    """The path of a subresource of machine `default/name`."""
    return f"/apis/{GROUP_VERSION}/namespaces/default/machines/{name}/{sub}"


@dataclass
class Forwarder:
    """A running `kubepeer portforward`."""

    proc: asyncio.subprocess.Process
    ports: dict[int, int]
    """Remote port → local port."""

    async def stderr(self) -> str:
        """Everything it wrote on stderr, once it has exited."""
        assert self.proc.stderr is not None
        async with asyncio.timeout(STOP_TIMEOUT):
            return (await self.proc.stderr.read()).decode(errors="replace")

    def kill(self) -> None:
        """SIGKILL: the client vanishes without a word."""
        self.proc.send_signal(signal.SIGKILL)


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None and proc.stdin is not None:
        proc.stdin.close()  # EOF on stdin stops the peer cleanly
    try:
        async with asyncio.timeout(STOP_TIMEOUT):
            await proc.wait()
    except TimeoutError:
        proc.kill()
        await proc.wait()


@contextlib.asynccontextmanager
async def forwarding(
    peer: Path, subres: Standalone, name: str, *remote: int, transport: str
) -> AsyncIterator[Forwarder]:
    """`kubepeer portforward` of `remote` ports of machine `name`, on free local ports."""
    proc = await asyncio.create_subprocess_exec(
        str(peer),
        "portforward",
        "--kubeconfig",
        str(subres.kubeconfig()),
        "--url",
        machine_path(name, "portforward"),
        "--transport",
        transport,
        *(f"0:{port}" for port in remote),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(STARTUP_TIMEOUT):
            first = await proc.stdout.readline()
            if first != b"ready\n":
                assert proc.stderr is not None
                problem = (await proc.stderr.read()).decode(errors="replace")
                raise AssertionError(f"kubepeer did not start: {first!r} {problem}")
            listed = json.loads(await proc.stdout.readline())
        yield Forwarder(proc, {p["remote"]: p["local"] for p in listed})
    finally:
        await _stop(proc)


@dataclass(frozen=True)
class ExecResult:
    """How a `kubepeer exec` ended."""

    code: int
    stdout: bytes
    stderr: str


async def start_exec(
    peer: Path,
    subres: Standalone,
    name: str,
    *,
    transport: str,
    sub: str = "console",
    tty: bool = False,
) -> asyncio.subprocess.Process:
    """`kubepeer exec` against `sub` of machine `name`, its stdin, stdout and stderr piped."""
    return await asyncio.create_subprocess_exec(
        str(peer),
        "exec",
        "--kubeconfig",
        str(subres.kubeconfig()),
        "--url",
        machine_path(name, sub),
        "--transport",
        transport,
        *(["--tty"] if tty else []),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def run_exec(
    peer: Path,
    subres: Standalone,
    name: str,
    stdin: bytes,
    *,
    transport: str,
    tty: bool = False,
) -> ExecResult:
    """`kubepeer exec` against the console of machine `name`, feeding it `stdin`."""
    proc = await start_exec(peer, subres, name, transport=transport, tty=tty)
    code, out, err = await communicate(proc, stdin, bound=EXEC_TIMEOUT)
    return ExecResult(code, out, err.decode(errors="replace"))
