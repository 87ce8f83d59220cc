"""A second `subres demo` leaves the first alone; the demo is quiet unless asked not to be."""

from __future__ import annotations

import hashlib
import socket
import ssl
import subprocess
import urllib.request
from pathlib import Path

from tests.cli.conftest import CLI_TIMEOUT, Demo, cli, cli_env, run_cli, running_demo


def _fingerprint(state: Path) -> dict[str, tuple[int, ...] | str]:
    """What a second demo must not change: file contents and times, socket identities."""
    seen: dict[str, tuple[int, ...] | str] = {}
    for path in sorted(state.rglob("*")):
        if path.name == "server.log":
            continue
        st = path.lstat()
        seen[str(path)] = (st.st_ino, st.st_mtime_ns, st.st_size)
        if path.is_file():
            seen[f"{path} sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    return seen


def test_a_second_demo_refuses_before_touching_anything(workdir: Path) -> None:
    with running_demo() as first:
        before = _fingerprint(first.state_dir)
        second = subprocess.run(
            cli("demo", "--state-dir", first.state_dir, "--port", "0"),
            capture_output=True,
            env=cli_env(workdir),
            timeout=CLI_TIMEOUT,
            check=False,
        )
        assert second.returncode == 1
        assert second.stdout == b""
        lines = second.stderr.decode().splitlines()
        assert lines[0].startswith(f"subres demo: a demo is already running in {first.state_dir}")
        assert first.url in lines[0]
        assert lines[1] == f"  subres --kubeconfig {first.kubeconfig} console demo"
        assert _fingerprint(first.state_dir) == before
        # And the first demo still serves its console.
        done = run_cli(
            ["--kubeconfig", first.kubeconfig, "console", "demo"],
            home=workdir,
            stdin=b"echo still-$((1+1))\nexit\n",
        )
        assert done.returncode == 0, done.stderr
        assert b"still-2" in done.stdout


def test_a_busy_port_is_refused_before_writing_a_state(workdir: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = subprocess.run(
            cli("demo", "--state-dir", workdir / "state", "--port", str(port)),
            capture_output=True,
            env=cli_env(workdir),
            timeout=CLI_TIMEOUT,
            check=False,
        )
    assert done.returncode == 1
    assert done.stderr.decode().startswith(f"subres demo: port {port} on 127.0.0.1 is in use")
    assert not (workdir / "state" / "machines.yaml").exists()


def _load_the_page(demo: Demo) -> None:
    context = ssl.create_default_context(cafile=str(demo.state_dir / "certs" / "ca.crt"))
    for path in ("/ui/", "/ui/app.js", "/ui/style.css", "/readyz"):
        with urllib.request.urlopen(demo.url + path, context=context, timeout=CLI_TIMEOUT) as r:
            assert r.status == 200


def _log(demo: Demo) -> str:
    return (demo.state_dir / "server.log").read_text()


def _console_session(demo: Demo, home: Path) -> None:
    """One console session: the demo's SSH library logs some twenty INFO lines for it."""
    done = run_cli(["--kubeconfig", demo.kubeconfig, "console", "demo"], home=home, stdin=b"exit\n")
    assert done.returncode == 0, done.stderr
    assert b"can't access tty" not in done.stdout  # the shell has its controlling terminal


def _others_info(log: str) -> list[str]:
    """Lines below WARNING from loggers that are not subres's."""
    return [
        line
        for line in log.splitlines()
        if " INFO " in line and " subres." not in line and " aiohttp.access:" not in line
    ]


def test_quiet_by_default_and_access_log_on_request(workdir: Path) -> None:
    with running_demo() as quiet:
        _load_the_page(quiet)
        _console_session(quiet, workdir)
        log = _log(quiet)
    assert "GET /ui" not in log
    assert "serving on https://127.0.0.1:" in log
    assert _others_info(log) == []
    with running_demo("--access-log") as chatty:
        _load_the_page(chatty)
        log = _log(chatty)
    # Logged when answered: the requests after it were answered later, so it is written.
    assert "GET /ui/app.js" in log


def test_other_libraries_speak_up_with_v(workdir: Path) -> None:
    with running_demo(before=["-v"]) as chatty:
        _console_session(chatty, workdir)
        log = _log(chatty)
    assert any(" INFO asyncssh:" in line for line in _others_info(log)), log
