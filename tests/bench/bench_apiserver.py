"""Throughput through the real kube-apiserver: client-go → kube-apiserver → subres → backend.

Run from the checkout: `python -m tests.bench.bench_apiserver [--mib N]`.
It starts the e2e suite's throwaway etcd and kube-apiserver, installs subres
from `deploy/` as the e2e suite does (a local process behind the real
APIService), lets alice port-forward a Machine whose ports are `loadgen`'s
sink and source, and moves `--mib` MiB each way through client-go's
port-forwarder (`kubepeer`, SPDY/3.1 and SPDY in a WebSocket) in 64 KiB
writes. It prints, per transport and direction, MB/s and the CPU seconds per
GB of subres, of kube-apiserver and of client-go on the same transfer: the
Go peer on the same path is the yardstick for subres's cost.

Every process runs on 127.0.0.1, is started and stopped by PID, and every
wait is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests import gotools
from tests.bench.procs import (
    bench_header,
    build_loadgen,
    run_loadgen,
    spawn_program,
    tree_cpu_seconds,
)
from tests.e2e import aggregation, controlplane, subresserver
from tests.e2e.controlplane import ControlPlane
from tests.e2e.test_subres import NS, bind_machine_users, put_machine

__all__ = ["main"]

MIB = 1024 * 1024
TRANSPORTS = ("spdy", "websocket")
"""kubepeer's --transport: SPDY/3.1, and SPDY tunnelled in a WebSocket."""
START_TIMEOUT = 60.0
TRANSFER_TIMEOUT = 600.0
SETTLE = 0.3
"""Seconds the relays get to finish their side of a close before their CPU is read."""


@dataclass(frozen=True)
class Sample:
    """One transfer: how long it took and what each process spent."""

    seconds: float
    subres: float
    apiserver: float
    client: float


def parse(argv: Sequence[str]) -> argparse.Namespace:
    doc = (__doc__ or "").split("\n\n")
    p = argparse.ArgumentParser(prog="python -m tests.bench.bench_apiserver", description=doc[0])
    p.add_argument("--mib", type=int, default=256, help="MiB each way per transport (256)")
    p.add_argument("--quick", action="store_true", help="16 MiB each way")
    return p.parse_args(argv)


async def run(ns: argparse.Namespace, argv: Sequence[str]) -> str:
    total = (16 if ns.quick else ns.mib) * MIB
    loadgen = await asyncio.to_thread(build_loadgen)
    peer = await asyncio.to_thread(gotools.kubepeer)
    binaries = await asyncio.to_thread(controlplane.build_binaries)
    async with (
        controlplane.start_control_plane(binaries) as plane,
        _backend(loadgen, total) as (sink, source),
    ):
        await aggregation.grant_delegated_auth(
            plane, namespace=subresserver.NAMESPACE, service_account="subres"
        )
        server = await subresserver.launch(plane)
        try:
            await bind_machine_users(plane)
            await put_machine(plane, "pf", forward=("127.0.0.1", [sink, source]))
            rows = []
            for transport in TRANSPORTS:
                async with _forwarding(plane, peer, transport, (sink, source)) as (child, ports):
                    for direction, remote in (("up", sink), ("down", source)):
                        pids = (_pid(server.process), plane.apiserver_pid, child)
                        sample = await _transfer(loadgen, pids, ports[remote], direction, total)
                        rows.append(_row(transport, direction, sample, total))
        finally:
            await subresserver.shutdown(server)
    return "\n".join([_header(argv, total), *rows])


@contextlib.asynccontextmanager
async def _backend(loadgen: Path, total: int) -> AsyncIterator[tuple[int, int]]:
    child = await spawn_program("loadgen", [str(loadgen), "backend", "-bytes", str(total)])
    try:
        async with asyncio.timeout(START_TIMEOUT):
            sink = int((await child.expect(r"^sink (\d+)")).group(1))
            source = int((await child.expect(r"^source (\d+)")).group(1))
        yield sink, source
    finally:
        await child.stop()


@contextlib.asynccontextmanager
async def _forwarding(
    plane: ControlPlane, peer: Path, transport: str, remotes: tuple[int, int]
) -> AsyncIterator[tuple[int, dict[int, int]]]:
    """kubepeer port-forwarding both ports through kube-apiserver as alice; its pid, ports."""
    path = f"/apis/{subresserver.GROUP}/{subresserver.VERSION}/namespaces/{NS}/machines/pf"
    argv = [
        str(peer), "portforward", "--kubeconfig", str(plane.kubeconfig_for("alice")),
        "--url", f"{path}/portforward", "--transport", transport,
        *(f"0:{remote}" for remote in remotes),
    ]  # fmt: skip
    child = await spawn_program("kubepeer", argv)
    try:
        assert child.proc.stdout is not None
        async with asyncio.timeout(START_TIMEOUT):
            await child.expect(r"^ready$")
            listed = json.loads(await child.proc.stdout.readline())
        yield child.pid, {p["remote"]: p["local"] for p in listed}
    finally:
        await child.stop()


async def _transfer(
    loadgen: Path, pids: tuple[int, int, int], local: int, direction: str, total: int
) -> Sample:
    """One loadgen transfer through local port `local`; CPU of subres, kube-apiserver, client."""

    def sample() -> list[float]:
        return [tree_cpu_seconds(pid) for pid in pids]

    before = sample()
    argv = [
        str(loadgen), "tcp", "-dir", direction, "-bytes", str(total),
        "-addr", f"127.0.0.1:{local}", "-timeout", f"{TRANSFER_TIMEOUT:.0f}s",
    ]  # fmt: skip
    result = await run_loadgen(argv, limit=TRANSFER_TIMEOUT + 10)
    await asyncio.sleep(SETTLE)  # another process's close: nothing signals it here
    after = sample()
    spent = [b - a for a, b in zip(before, after, strict=True)]
    return Sample(result["seconds"], spent[0], spent[1], spent[2] + result["cpu"])


def _pid(process: controlplane.Process) -> int:
    assert process.popen is not None, f"{process.name} is not running"
    return process.popen.pid


def _row(transport: str, direction: str, sample: Sample, total: int) -> str:
    gb = total / 1e9

    def per_gb(cpu: float) -> str:
        return f"{cpu / gb:.2f}"

    label = "SPDY/3.1" if transport == "spdy" else "SPDY in WebSocket"
    return (
        f"| {label} | {direction} | {total / sample.seconds / 1e6:.0f} | "
        f"{per_gb(sample.subres)} | {per_gb(sample.apiserver)} | {per_gb(sample.client)} |"
    )


def _header(argv: Sequence[str], total: int) -> str:
    facts = (
        f"{total // MIB} MiB each way per transport in 64 KiB writes (`loadgen`); "
        "client-go's port-forwarder (`kubepeer`) → kube-apiserver (TLS, the aggregator's "
        "proxy) → subres (TLS) → `loadgen`'s sink/source; MB = 10^6 bytes",
        "CPU s/GB: utime+stime from /proc of each process over the transfer",
    )
    table = (
        "| transport | direction | MB/s | subres CPU s/GB | kube-apiserver CPU s/GB "
        "| client-go CPU s/GB |\n| --- | --- | ---: | ---: | ---: | ---: |"
    )
    title = "subres through the real kube-apiserver"
    head = bench_header(title, "tests.bench.bench_apiserver", argv, *facts)
    return f"{head}\n\n{table}"


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    print(asyncio.run(run(parse(args), args)), flush=True)


if __name__ == "__main__":
    main()
