"""A display recording of the real QEMU VM (examples/qemu-vm) played and seeked in Chromium.

The VM boots; a viewer opens its display, which subres records; the serial
shell writes numbered lines to the VGA console (tty1) while it is watched.
The recording is replayed twice: by `protocol.displayrec` here, and by the
page in Chromium. After a seek to a moment in the middle, and then to the
end, the page's canvas must hold exactly the picture the Python replay
gives for that moment.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import AsyncIterator
from pathlib import Path

from subres.protocol import displayrec
from tests.browser import cdp
from tests.examples.test_qemu_vm import (
    console,
    example_machine,
    example_policy,
    free_port,
    read_until,
    run_script,
    shell_computes,
)
from tests.server.test_vnc_shared import Viewer
from tests.support import start_standalone, wait_for

CANVAS_DIGEST = """(async () => {
  const canvas = document.querySelector('#player canvas');
  const rgba = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
  const rgb = new Uint8Array(canvas.width * canvas.height * 3);
  for (let i = 0, j = 0; i < rgba.length; i += 4, j += 3) rgb.set(rgba.subarray(i, i + 3), j);
  const digest = new Uint8Array(await crypto.subtle.digest('SHA-256', rgb));
  return Array.from(digest, (b) => b.toString(16).padStart(2, '0')).join('');
})()"""


@contextlib.asynccontextmanager
async def running_vm(state: Path, port: int) -> AsyncIterator[None]:
    """The example's VM, started and stopped by its script."""
    output = await run_script("start", str(state), str(port))
    assert (state / "qemu.pid").exists(), output
    try:
        yield
    finally:
        await run_script("stop", str(state))


def pictures(data: bytes) -> dict[int, str]:
    """The recorded picture's SHA-256 after each moment it changed (ms), as the Python
    replay draws it."""
    _, offset = displayrec.read_header(data)
    screen, seen = displayrec.Screen(), {}
    for ref in displayrec.blocks(data, offset):
        for record in displayrec.records(data[ref.offset : ref.offset + ref.length]):
            screen.apply(record)
            if isinstance(record, displayrec.Rect | displayrec.Frame):
                seen[record.time] = hashlib.sha256(screen.rgb).hexdigest()
    return seen


async def test_the_qemu_vms_recorded_display_seeks_in_chromium(
    browser: cdp.Browser, tmp_path: Path
) -> None:
    state, port = tmp_path / "vm", free_port()
    vm1 = example_machine(state, port)
    vm1["metadata"].setdefault("annotations", {})["subres.dev/record-display"] = "true"
    recordings = {"recordings": {"directory": str(tmp_path / "recordings")}}
    page_paths = {"authorization_always_allow_paths": ("/readyz", "/ui", "/ui/*")}
    async with (
        running_vm(state, port),
        start_standalone(
            tmp_path,
            vm1,
            policy=example_policy(state),
            config={"consoles": recordings},
            options=page_paths,
        ) as subres,
        console(subres) as shell,
    ):
        await shell_computes(shell)
        async with subres.websocket(subres.url("vm1", "vnc"), "binary") as ws:
            await Viewer(ws).hello(shared=True)
            await shell.send(
                b"for i in 1 2 3 4 5 6 7 8; do echo subres frame $i >/dev/tty1; sleep 0.4; done;"
                b" echo drawn-$((1+1))\r"
            )
            await read_until(shell, re.compile(rb"\r\ndrawn-2\r\n"))
        await wait_for(lambda: len(subres.server.state.sessions.live) == 1)  # the shell's
        await subres.server.state.recordings.stop()
        (path,) = (tmp_path / "recordings" / "default" / "machines" / "vm1").rglob("*.display")
        data = path.read_bytes()
        seen = pictures(data)
        moments, last = sorted(seen), seen[max(seen)]
        # A moment in the middle whose picture is neither the first nor the last.
        between = [m for m in moments if seen[m] not in (seen[moments[0]], last)]
        assert between, "the lines written while it was watched changed the picture"
        middle = between[len(between) // 2]
        expected = {middle: seen[middle], moments[-1]: last}

        page = await browser.new_page(width=1200, height=1000)
        token = subres.auth["Authorization"].removeprefix("Bearer ")
        await page.goto(f"{subres.base}/ui/?machine=default/vm1#token={token}")
        await page.wait_for("sessionStorage.getItem('subres.token')")  # kept for the next page
        await page.goto(f"{subres.base}/ui/replay.html?machine=default/vm1&recording={path.name}")
        await page.wait_for("window.player && window.player.duration > 0", within=30)
        for moment, digest in expected.items():
            await page.evaluate(f"window.player.seek({moment})")
            assert await page.evaluate(CANVAS_DIGEST) == digest, f"the picture at {moment} ms"
        marks = await page.evaluate(
            "Array.from(document.querySelectorAll('#player .marks a'), (a) => a.textContent)"
        )
        assert [mark.split(" ", 1)[1] for mark in marks] == [
            "alice (viewer) attached",
            "alice (viewer) left",
        ]
        await page.screenshot(tmp_path / "display-replay.png")
        assert not [line for line in page.log if line.startswith("exception")]
