"""`record: required`: no recording, no session, on a real filesystem that fills up or goes away.

The recordings directory is a small tmpfs this test mounts (and unmounts):
a recording that cannot start is a 503 Status before any upgrade, and one
that stops being writable ends its live sessions with close code 4003 and
the reason, seen by the client and the audit. What stays on disk is whole
asciicast lines, whatever failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from subres.protocol import asciicast
from subres.sessions.recordings import BANNER
from tests.consoles import Console, closed, stdout_until
from tests.support import Backend, Standalone, machine, start_standalone, wait_for

V5 = "v5.channel.k8s.io"
RECORDING_FAILED = 4003


def required(directory: Path) -> dict[str, Any]:
    """A configuration whose Machines' consoles are served only while recorded."""
    console = {"endpoint": ".status.console.endpoint", "record": "required"}
    machines = {
        "resource": "machines",
        "kind": "Machine",
        "source": {"group": "subres.dev", "version": "v1alpha1", "resource": "machines"},
        "subresources": {"console": console},
    }
    return {"parents": [machines], "consoles": {"recordings": {"directory": str(directory)}}}


@contextlib.contextmanager
def mounted_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` at `where`, unmounted (lazily, whatever holds it) at the end."""
    where.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "subres-test", str(where)],
        check=True,
    )
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "recordings", "256k") as where:
        yield where


@pytest.fixture
async def subres(tmp_path: Path, tmpfs: Path, serial: Backend) -> AsyncIterator[Standalone]:
    async with start_standalone(
        tmp_path, machine("vm1", console=serial.url), config=required(tmpfs)
    ) as s:
        yield s


def fill(directory: Path) -> Path:
    """Take every free byte of the filesystem; the file that holds them."""
    filler = directory / "filler"
    with filler.open("wb", buffering=0) as file, contextlib.suppress(OSError):
        while True:
            file.write(b"\0" * 4096)
    return filler


def whole_lines(directory: Path) -> list[asciicast.Event]:
    """Every recording under `directory`, parsed whole: none ends inside a line."""
    seen = []
    for path in directory.rglob("*.cast"):
        data = path.read_bytes()
        assert data.endswith(b"\n"), f"{path.name} ends inside a line"
        _, events = asciicast.read(data.splitlines())
        seen += list(events)
    return seen


def outputs(directory: Path) -> str:
    """The output the recordings under `directory` hold."""
    return "".join(e.data for e in whole_lines(directory) if e.code == "o")


async def test_a_full_disk_ends_the_session_and_refuses_the_next(
    subres: Standalone, tmpfs: Path, console: Console
) -> None:
    async with subres.websocket(subres.url("vm1"), V5) as ws:
        await stdout_until(ws, BANNER)
        await ws.send(b"\x00before\r\n")
        await stdout_until(ws, b"before\r\n")
        await wait_for(lambda: "before" in outputs(tmpfs))
        filler = fill(tmpfs)
        await console.say(b"x" * 16384 + b"\r\n")
        code, reason = await closed(ws)
    assert code == RECORDING_FAILED
    assert reason == "the recording failed (No space left on device); record: required"
    # The audit line is written by a thread of its own: it may come a moment after the end.
    await wait_for(lambda: any(line["stage"] == "end" for line in subres.audit_lines()))
    (end,) = [line for line in subres.audit_lines() if line["stage"] == "end"]
    assert (end["code"], end["reason"]) == (code, reason)
    assert "before" in outputs(tmpfs) and "x" * 16384 not in outputs(tmpfs)

    status, body = await subres.refused(subres.url("vm1"), V5)
    assert status == 503
    assert body["message"] == (
        "Machine default/vm1 console is served only while recorded (record: required), "
        "and its recording cannot start: No space left on device"
    )
    assert subres.server.state.sessions.live == set()

    filler.unlink()
    async with subres.websocket(subres.url("vm1"), V5) as ws:
        await stdout_until(ws, BANNER)


async def test_a_removed_recording_directory_ends_the_session(
    subres: Standalone, tmpfs: Path, console: Console
) -> None:
    async with subres.websocket(subres.url("vm1"), V5) as ws:
        await stdout_until(ws, BANNER)
        shutil.rmtree(tmpfs / "default" / "machines" / "vm1")
        await console.say(b"unseen\r\n")
        code, reason = await closed(ws)
    assert (code, reason) == (
        RECORDING_FAILED,
        "the recording failed (its file was removed); record: required",
    )


async def test_an_unmounted_recordings_volume_ends_the_session_and_refuses_the_next(
    subres: Standalone, tmpfs: Path, console: Console
) -> None:
    async with subres.websocket(subres.url("vm1"), V5) as ws:
        await stdout_until(ws, BANNER)
        await asyncio.to_thread(subprocess.run, ["umount", "-l", str(tmpfs)], check=True)
        await console.say(b"unseen\r\n")
        code, reason = await closed(ws)
    assert (code, reason) == (
        RECORDING_FAILED,
        "the recording failed (its file was removed); record: required",
    )
    status, body = await subres.refused(subres.url("vm1"), V5)
    assert status == 503 and body["message"].endswith(
        "its recording cannot start: the recordings directory is gone"
    )
    assert not list(await asyncio.to_thread(os.listdir, tmpfs)), "nothing written where it was"


async def test_a_console_that_is_not_required_goes_on_unrecorded(
    tmp_path: Path, tmpfs: Path, serial: Backend, console: Console
) -> None:
    settings = required(tmpfs)
    settings["parents"][0]["subresources"]["console"]["record"] = "always"
    async with (
        start_standalone(tmp_path, machine("vm1", console=serial.url), config=settings) as subres,
        subres.websocket(subres.url("vm1"), V5) as ws,
    ):
        await stdout_until(ws, BANNER)
        fill(tmpfs)
        await console.say(b"y" * 16384 + b"\r\n")
        await stdout_until(ws, b"y" * 16384 + b"\r\n")
        await ws.send(b"\x00still here\r\n")
        await stdout_until(ws, b"still here\r\n")
    # Read once the server stopped and its recorder's thread let go of the file: until
    # then a write may be half done (and is taken back when the disk refuses the rest).
    assert [e for e in whole_lines(tmpfs) if "y" * 100 in e.data] == []


def test_the_tmpfs_really_is_full(tmp_path: Path) -> None:
    """The other tests rely on `fill` taking every byte: check it does."""
    with mounted_tmpfs(tmp_path / "small", "64k") as where:
        fill(where)
        with pytest.raises(OSError) as info, (where / "more").open("wb", buffering=0) as file:
            file.write(b"\0" * 8192)
        assert info.value.errno == errno.ENOSPC
