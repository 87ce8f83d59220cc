"""IPMI Serial-over-LAN benchmark: a keystroke's round trip through subres and through ipmitool.

Run from the checkout: `python -m tests.bench.bench_ipmi [--roundtrips N]`.
The BMC is OpenIPMI's ipmi_sim on 127.0.0.1 whose serial line (a TCP socket
of this process) echoes what it receives. Each round trip sends one byte and
waits for its echo: client → BMC → serial line → BMC → client. It is measured
through subres (`subres serve` as its own process, a raw WebSocket console,
cipher suite 3) and through `ipmitool -I lanplus … sol activate` (the same
suite, its stdin and stdout piped). One session at a time: SOL has one. It
prints a markdown table; it asserts nothing about timings.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import yaml

from subres.serving import certs
from tests.bench.client import RAW, Target
from tests.bench.procs import bench_header, bench_main, serve_standalone
from tests.ipmi_support import PASSWORD, STEP, USERNAME, Bmc, bmc

WARMUP = 10


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.bench_ipmi")
    parser.add_argument("--roundtrips", type=int, default=300, help="round trips per path")
    return parser.parse_args(argv)


def write_files(root: Path, sim: Bmc) -> str:
    """Certificates, token, configuration and one machine whose console is the BMC."""
    certs.ensure_self_signed(root / "certs", service="subres", namespace="subres-system")
    token = secrets.token_urlsafe(24)
    (root / "tokens.csv").write_text(f'{token},bench,bench-uid,"bench"\n')
    console = {"endpoint": ".status.console.endpoint", "ipmi": {"credentials": ".status.secret"}}
    config = {
        "endpointPolicy": {"schemes": ["ipmi"], "allowCIDRs": ["127.0.0.0/8"], "denyCIDRs": []},
        "parents": [
            {
                "resource": "machines",
                "kind": "Machine",
                "source": {"group": "subres.dev", "version": "v1alpha1"},
                "subresources": {"console": console},
            }
        ],
    }
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    machine = {
        "apiVersion": "subres.dev/v1alpha1",
        "kind": "Machine",
        "metadata": {"name": "bmc", "namespace": "default"},
        "status": {"phase": "Running", "console": {"endpoint": sim.url}, "secret": "bmc"},
    }
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "bmc", "namespace": "default"},
        "stringData": {"username": USERNAME, "password": PASSWORD},
    }
    (root / "machines.yaml").write_text(yaml.safe_dump_all([machine, secret]))
    return token


async def measure(
    count: int, send: Callable[[bytes], Awaitable[None]], echo: Callable[[], Awaitable[bytes]]
) -> list[float]:
    """`count` round trips of one byte each (after a warm-up), in milliseconds."""
    times = []
    for i in range(WARMUP + count):
        byte = bytes([ord("a") + i % 26])
        started = time.perf_counter()
        await send(byte)
        seen = b""
        async with asyncio.timeout(STEP):
            while byte not in seen:
                seen += await echo()
        if i >= WARMUP:
            times.append((time.perf_counter() - started) * 1000)
    return times


async def through_subres(root: Path, sim: Bmc, count: int) -> list[float]:
    token = write_files(root, sim)
    child, port = await serve_standalone(root, "--config", str(root / "config.yaml"))
    target = Target(port=port, ca=root / "certs" / "ca.crt", token=token)
    try:
        async with target.connect("bmc", RAW, target.ssl_context(), STEP) as conn:

            async def echo() -> bytes:
                message = await conn.recv()
                assert isinstance(message, bytes)
                return message

            return await measure(count, conn.send, echo)
    finally:
        await child.stop()


async def through_ipmitool(sim: Bmc, count: int) -> list[float]:
    process = await asyncio.create_subprocess_exec(
        "stdbuf", "-o0", "ipmitool", "-I", "lanplus", "-H", "127.0.0.1", "-p", str(sim.port),
        "-U", USERNAME, "-P", PASSWORD, "-C", "3", "sol", "activate",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    assert process.stdin is not None and process.stdout is not None
    stdin, stdout = process.stdin, process.stdout

    async def send(data: bytes) -> None:
        stdin.write(data)
        await stdin.drain()

    try:
        async with asyncio.timeout(STEP):
            seen = b""
            while b"SOL Session operational" not in seen:
                chunk = await stdout.read(4096)
                if not chunk:
                    raise RuntimeError(f"ipmitool ended before SOL was active: {seen!r}")
                seen += chunk
        return await measure(count, send, lambda: stdout.read(4096))
    finally:
        process.terminate()
        async with asyncio.timeout(STEP):
            await process.wait()


def row(name: str, times: list[float]) -> str:
    cuts = statistics.quantiles(times, n=100)
    return (
        f"| {name} | {len(times)} | {statistics.median(times):.2f} | {cuts[89]:.2f} "
        f"| {cuts[98]:.2f} | {statistics.fmean(times):.2f} |"
    )


async def run(args: argparse.Namespace, argv: Sequence[str]) -> None:
    print(bench_header("IPMI Serial-over-LAN round trip", "tests.bench.bench_ipmi", argv))
    with tempfile.TemporaryDirectory(prefix="bench-ipmi-") as tmp:
        async with bmc(Path(tmp), echo=True) as sim:
            # subres first: it deactivates SOL when it closes, a terminated ipmitool does not.
            ours = await through_subres(Path(tmp), sim, args.roundtrips)
            tool = await through_ipmitool(sim, args.roundtrips)
    print()
    print("### One keystroke's echo through the BMC (ms)")
    print()
    print("| path | round trips | p50 | p90 | p99 | mean |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    print(row("`ipmitool -I lanplus -C 3 sol activate`, piped", tool))
    print(row("subres `ipmi://` console, WebSocket+TLS raw", ours))


def main(argv: Sequence[str] | None = None) -> None:
    bench_main(run, parse, argv)


if __name__ == "__main__":
    main()
