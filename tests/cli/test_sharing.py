"""`subres console --observe`, `subres sessions`, `subres recordings` and `subres replay`.

The real CLI runs as a process against a standalone server in this test's
event loop (so every wait on it is asynchronous and bounded).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import CLI_TIMEOUT, cli, cli_env, run_cli_async
from tests.consoles import Console, stdout_until
from tests.support import Backend, Standalone, machine, start_standalone, wait_for

V5 = "v5.channel.k8s.io"


@pytest.fixture
def received() -> Console:
    return Console()


@pytest.fixture
async def subres(tmp_path: Path, received: Console) -> AsyncIterator[Standalone]:
    console = await Backend(handler=received.handle).start_tcp()
    vm1 = machine("vm1", console=console.url, annotations={"subres.dev/record-console": "true"})
    recordings = {"recordings": {"directory": str(tmp_path / "recordings")}}
    async with start_standalone(tmp_path, vm1, config={"consoles": recordings}) as s:
        yield s
    await console.stop()


async def run(
    subres: Standalone, *args: str, stdin: bytes = b"", home: Path
) -> tuple[int, bytes, bytes]:
    done = await run_cli_async(["--kubeconfig", subres.kubeconfig(), *args], home=home, stdin=stdin)
    return done.returncode, done.stdout, done.stderr


async def test_observe_prints_what_the_writer_types_and_sends_nothing(
    subres: Standalone, received: Console, tmp_path: Path
) -> None:
    proc = await asyncio.create_subprocess_exec(
        *cli("--kubeconfig", subres.kubeconfig(), "console", "--observe", "vm1"),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=cli_env(tmp_path),
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"typed by the observer\n")
    await proc.stdin.drain()
    sessions = subres.server.state.sessions
    await wait_for(lambda: len(sessions.live) == 1)
    async with subres.websocket(subres.url("vm1"), V5) as alice:
        await alice.send(b"\x00hello from alice\n")
        await stdout_until(alice, b"alice\n")
        # The writer ends its input; the console ends; the observer is told and exits 0.
        await alice.send(b"\xff\x00")
        async with asyncio.timeout(CLI_TIMEOUT):
            out, err = await proc.communicate()
    assert proc.returncode == 0, err
    assert b"hello from alice\n" in out
    assert bytes(received.received) == b"hello from alice\n"


async def test_sessions_prints_who_holds_the_console(subres: Standalone, tmp_path: Path) -> None:
    async with (
        subres.websocket(subres.url("vm1"), V5) as alice,
        subres.websocket(subres.url("vm1", "console-observe"), V5, user="bob") as bob,
    ):
        await alice.recv()
        await bob.recv()
        code, out, err = await run(subres, "sessions", "vm1", home=tmp_path)
        assert code == 0, err
        header, *rows = out.decode().splitlines()
        assert header.split()[:6] == ["NAME", "MACHINE", "SUBRESOURCE", "MODE", "USER", "CLIENT"]
        assert sorted(row.split()[3:5] for row in rows) == [
            ["observer", "bob"],
            ["writer", "alice"],
        ]
        code, out, err = await run(subres, "sessions", "-o", "json", home=tmp_path)
        listing: dict[str, Any] = json.loads(out)
        assert code == 0 and listing["kind"] == "SessionList" and len(listing["items"]) == 2
        code, out, err = await run(subres, "sessions", "-A", home=tmp_path)
        assert code == 0 and out.decode().split()[0] == "NAMESPACE"
    await wait_for(lambda: not subres.server.state.sessions.live)
    code, out, err = await run(subres, "sessions", home=tmp_path)
    assert (code, out) == (0, b"")
    assert b"No sessions found in namespace 'default'." in err


async def test_a_recording_is_listed_saved_and_replayed(subres: Standalone, tmp_path: Path) -> None:
    async with subres.websocket(subres.url("vm1"), V5) as alice:
        await alice.send(b"\x00echo in the recording\r\n")
        await stdout_until(alice, b"recording\r\n")
    await wait_for(lambda: not subres.server.state.sessions.live)
    await subres.server.state.recordings.stop()
    code, out, err = await run(subres, "recordings", "vm1", home=tmp_path)
    assert code == 0, err
    header, row = out.decode().splitlines()
    assert header.split() == ["NAME", "SIZE", "STARTED", "TITLE"]
    name = row.split()[0]
    saved = tmp_path / "saved.cast"
    code, _, err = await run(subres, "recordings", "vm1", name, "--file", str(saved), home=tmp_path)
    assert code == 0, err
    code, out, err = await run(subres, "replay", str(saved), "--speed", "1000", home=tmp_path)
    assert code == 0, err
    assert out == b"echo in the recording\r\n"  # what was seen; each client's banner is its own
    assert b"[alice (writer) attached]" in err


async def test_a_missing_recording_is_a_not_found_and_no_file(
    subres: Standalone, tmp_path: Path
) -> None:
    target = tmp_path / "missing.cast"
    code, _, err = await run(
        subres, "recordings", "vm1", "20240101T000000Z-00000000.cast", "--file", str(target),
        home=tmp_path,
    )  # fmt: skip
    assert code == 1
    assert err.decode().startswith("Error from server (NotFound): recording")
    assert not target.exists()


async def test_replay_refuses_what_is_not_a_recording(subres: Standalone, tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.cast"
    bogus.write_text("hello\n")
    code, _, err = await run(subres, "replay", str(bogus), home=tmp_path)
    assert code == 1
    assert b"is not a recording subres can play: line 1: not JSON" in err
