"""`subres vnc` and `subres screenshot` end to end against a running `subres demo`."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

from PIL import Image

from tests.cli.conftest import (
    CLI_TIMEOUT,
    Demo,
    cli,
    cli_env,
    read_until,
    run_cli,
    running,
    stop,
)

WIDTH, HEIGHT = 640, 400
TITLE_PIXEL = (40 + 16 + 8, 60 + 8)
"""Inside the top bar of the S in the white block-letter title (16 pixels a dot)."""


def check_demo_picture(image: Image.Image) -> None:
    rgb = image.convert("RGB")
    assert rgb.size == (WIDTH, HEIGHT)
    assert rgb.getpixel(TITLE_PIXEL) == (255, 255, 255)
    assert rgb.getpixel((0, 0)) == (0, 0, 255)  # the gradient's top left corner


def test_screenshot_to_a_file(demo: Demo, workdir: Path) -> None:
    out = workdir / "demo.png"
    done = run_cli(["--kubeconfig", demo.kubeconfig, "screenshot", "demo", "-o", out], home=workdir)
    assert done.returncode == 0, done.stderr
    image = Image.open(out)
    assert image.format == "PNG"
    check_demo_picture(image)


def test_screenshot_to_stdout(demo: Demo, workdir: Path) -> None:
    done = run_cli(
        ["screenshot", "machine/demo", "-o", "-", "--kubeconfig", demo.kubeconfig], home=workdir
    )
    assert done.returncode == 0, done.stderr
    check_demo_picture(Image.open(io.BytesIO(done.stdout)))


def test_screenshot_of_a_stopped_machine_says_why(demo: Demo, workdir: Path) -> None:
    done = run_cli(
        ["--kubeconfig", demo.kubeconfig, "screenshot", "stopped", "-o", workdir / "x.png"],
        home=workdir,
    )
    assert done.returncode == 1
    assert b'is not Running: .status.phase is "Stopped"' in done.stderr
    assert not (workdir / "x.png").exists()


def test_vncdotool_captures_the_display_through_proxy_only(demo: Demo, workdir: Path) -> None:
    proc = subprocess.Popen(
        cli("--kubeconfig", demo.kubeconfig, "vnc", "demo", "--proxy-only"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli_env(workdir),
    )
    try:
        line = read_until(proc, rb"\{.*\}\n", timeout=CLI_TIMEOUT).group(0)
        port = json.loads(line)["port"]
        out = workdir / "capture.png"
        vncdo = "from vncdotool.command import vncdo; vncdo()"
        done = subprocess.run(
            [sys.executable, "-c", vncdo, "-s", f"127.0.0.1::{port}", "capture", str(out)],
            capture_output=True,
            timeout=CLI_TIMEOUT,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        check_demo_picture(Image.open(out))
    finally:
        stop(proc)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        proc.stderr.close()


def test_vnc_starts_the_viewer_it_is_given(demo: Demo, workdir: Path) -> None:
    viewer = workdir / "viewer.py"
    viewer.write_text(
        textwrap.dedent(
            """
            import socket, sys
            with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30) as s:
                open(sys.argv[3], "wb").write(s.recv(12))
            """
        )
    )
    seen = workdir / "seen"
    template = f"{sys.executable} {viewer} {{address}} {{port}} {seen}"
    done = run_cli(
        ["--kubeconfig", demo.kubeconfig, "vnc", "demo", "--viewer", template], home=workdir
    )
    assert done.returncode == 0, done.stderr
    assert seen.read_bytes() == b"RFB 003.008\n"


def test_vnc_refusals_end_at_once(demo: Demo, workdir: Path) -> None:
    done = run_cli(
        ["--kubeconfig", demo.kubeconfig, "vnc", "stopped", "--proxy-only"], home=workdir
    )
    assert done.returncode == 1
    assert b'is not Running: .status.phase is "Stopped"' in done.stderr
    assert done.stdout == b""
    done = run_cli(
        ["--kubeconfig", demo.kubeconfig, "vnc", "demo", "--viewer", "echo no-port"], home=workdir
    )
    assert (done.returncode, b"--viewer needs {port}" in done.stderr) == (1, True)


def test_vnc_dials_per_viewer_and_says_why_a_display_ended(demo: Demo, workdir: Path) -> None:
    """A viewer never gets a connection someone took over before it came, and a viewer that
    is taken over is told so on the terminal, where a VNC viewer says only "disconnected"."""
    argv = cli("--kubeconfig", demo.kubeconfig, "vnc", "demo", "--proxy-only")
    env = cli_env(workdir)
    with running(argv, env=env) as first, running(argv, env=env) as second:
        ports = [
            int(json.loads(read_until(p, rb"\{.*\}\n", timeout=CLI_TIMEOUT).group(0))["port"])
            for p in (first, second)
        ]
        # After the first relay started, a viewer of the second takes the display...
        with socket.create_connection(("127.0.0.1", ports[1]), timeout=CLI_TIMEOUT) as other:
            assert other.recv(12) == b"RFB 003.008\n"
            # ...and a viewer of the first still gets a live session: past the version, the
            # server's security types arrive.
            with socket.create_connection(("127.0.0.1", ports[0]), timeout=CLI_TIMEOUT) as mine:
                assert mine.recv(12) == b"RFB 003.008\n"
                mine.sendall(b"RFB 003.008\n")
                count = mine.recv(1)
                assert count and count[0] >= 1
                said = read_until(
                    second, rb"the display session ended: ([^\n]*)\n", timeout=CLI_TIMEOUT,
                    stream="stderr",
                )  # fmt: skip
                assert b"taken over by demo (4001)" in said.group(1)
