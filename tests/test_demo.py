"""`subres demo` as a newcomer runs it: a real process, real kubectl, a real shell."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from websockets.asyncio.client import connect

GV = "/apis/subresources.subres.dev/v1alpha1"


@dataclass
class Demo:
    proc: asyncio.subprocess.Process
    dir: Path
    port: int
    banner: str

    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"


@pytest.fixture
async def demo(tmp_path: Path) -> AsyncIterator[Demo]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "subres",
        "demo",
        "--state-dir",
        str(tmp_path),
        "--port",
        "0",
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "SHELL": "/bin/sh"},
    )
    assert proc.stdout is not None
    banner = ""
    try:
        async with asyncio.timeout(30):
            while "Try:" not in banner:
                line = await proc.stdout.readline()
                assert line, f"demo exited early: {banner}"
                banner += line.decode()
            while "meant to fail" not in banner:
                banner += (await proc.stdout.readline()).decode()
        match = re.search(r"https://127\.0\.0\.1:(\d+)", banner)
        assert match, banner
        yield Demo(proc, tmp_path, int(match.group(1)), banner)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(15):
                await proc.wait()


async def kubectl(kubectl_bin: Path, demo: Demo, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        str(kubectl_bin),
        "--kubeconfig",
        str(demo.kubeconfig()),
        *args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_demo_writes_what_it_promises(demo: Demo) -> None:
    config = yaml.safe_load(demo.kubeconfig().read_text())
    assert config["clusters"][0]["cluster"]["server"] == f"https://127.0.0.1:{demo.port}"
    assert f"  export KUBECONFIG={demo.kubeconfig()}\n" in demo.banner
    assert "\n  subres console demo " in demo.banner
    docs = list(yaml.safe_load_all((demo.dir / "machines.yaml").open()))
    assert [m["metadata"]["name"] for m in docs if m["kind"] == "Machine"] == ["demo", "stopped"]
    # The console is an SSH server on loopback; its key is in a Secret only the user may read.
    [login] = [d for d in docs if d["kind"] == "Secret"]
    assert set(login["stringData"]) == {"ssh-privatekey", "known_hosts"}
    assert docs[0]["status"]["console"]["endpoint"].startswith("ssh://demo@127.0.0.1:")
    assert ((demo.dir / "machines.yaml").stat().st_mode & 0o077) == 0
    assert (demo.kubeconfig().stat().st_mode & 0o077) == 0


async def test_real_kubectl_get_raw(kubectl_bin: Path, demo: Demo) -> None:
    code, out, err = await kubectl(kubectl_bin, demo, "get", "--raw", GV)
    assert code == 0, err
    assert '"machines/console"' in out
    code, out, err = await kubectl(
        kubectl_bin, demo, "get", "--raw", f"{GV}/namespaces/default/machines/stopped/console"
    )
    assert code == 1
    assert "Error from server (Conflict)" in err and '"Stopped"' in err


async def test_console_reaches_the_demo_shell(demo: Demo) -> None:
    config = yaml.safe_load(demo.kubeconfig().read_text())
    token = config["users"][0]["user"]["token"]
    ctx = ssl.create_default_context(cafile=str(demo.dir / "certs" / "ca.crt"))
    url = f"wss://127.0.0.1:{demo.port}{GV}/namespaces/default/machines/demo/console"
    async with connect(url, ssl=ctx, additional_headers={"Authorization": f"Bearer {token}"}) as ws:
        await ws.send(b"echo sum=$((40+2))\n")
        seen = b""
        async with asyncio.timeout(10):
            while b"sum=42" not in seen:
                message = await ws.recv()
                assert isinstance(message, bytes)
                seen += message


async def test_demo_stops_cleanly_on_sigterm_and_takes_its_keys_away(demo: Demo) -> None:
    """No key, token or kubeconfig outlives the demo; what the user made stays."""
    config = yaml.safe_load(demo.kubeconfig().read_text())
    token = config["users"][0]["user"]["token"]
    ctx = ssl.create_default_context(cafile=str(demo.dir / "certs" / "ca.crt"))
    url = f"wss://127.0.0.1:{demo.port}{GV}/namespaces/default/machines/demo/console"
    async with connect(url, ssl=ctx, additional_headers={"Authorization": f"Bearer {token}"}):
        pass  # a session, so that there is an audit log and a recording to keep
    demo.proc.send_signal(signal.SIGTERM)
    assert demo.proc.stdout is not None
    async with asyncio.timeout(15):
        said = (await demo.proc.stdout.read()).decode()
        assert await demo.proc.wait() == 0
    assert sorted(p.name for p in demo.dir.iterdir()) == [
        "machines.yaml",
        "recordings",
        "sessions.jsonl",
    ]
    assert "PRIVATE KEY" not in (demo.dir / "machines.yaml").read_text()
    assert f"stopped: removed the keys, token and kubeconfig from {demo.dir}" in said
    assert "kept recordings/ and sessions.jsonl" in said
