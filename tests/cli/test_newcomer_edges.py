"""The edges a new user met following the README, each checked as they would meet it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from subres import main
from tests.cli.conftest import (
    CLI_TIMEOUT,
    DEAD_PORT,
    START_TIMEOUT,
    Demo,
    cli,
    cli_env,
    read_until,
    run_cli,
    run_cli_async,
    running_demo,
    stop,
)
from tests.consoles import Console
from tests.support import Backend, machine, start_standalone

BARE_PATH = "/usr/bin:/bin"
"""A PATH without this install: its virtualenv was never activated."""


def test_the_banner_commands_run_as_printed_without_the_venv_on_path(workdir: Path) -> None:
    with running_demo(path=BARE_PATH) as demo:
        export = re.search(r"^  (export KUBECONFIG=.+)$", demo.banner, re.MULTILINE)
        piped = re.search(r"^  (echo 'uname -a' \| .+ console demo)$", demo.banner, re.MULTILINE)
        assert export and piped, demo.banner
        done = subprocess.run(
            ["sh", "-c", f"{export[1]}\n{piped[1]}"],
            capture_output=True,
            env={**cli_env(workdir), "PATH": BARE_PATH},
            timeout=CLI_TIMEOUT,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    assert os.uname().sysname.encode() in done.stdout


MINE = {
    "apiVersion": "subres.dev/v1alpha1",
    "kind": "Machine",
    "metadata": {"name": "mine", "namespace": "default"},
    "status": {"phase": "Running", "console": {"endpoint": "tcp://127.0.0.1:1"}},
}


@contextlib.contextmanager
def demo_in(state: Path, log: Path) -> Iterator[Path]:
    """`subres demo` on `state`, its stderr in `log`; its kubeconfig. Stopped afterwards."""
    with log.open("wb") as err:
        proc = subprocess.Popen(
            cli("demo", "--state-dir", state, "--port", "0"),
            stdout=subprocess.PIPE,
            stderr=err,
            env=cli_env(state.parent),
        )
    try:
        read_until(proc, rb"(?s)Try:\n.*meant to fail[^\n]*\n", timeout=START_TIMEOUT)
        yield state / "kubeconfig"
    finally:
        stop(proc)
        assert proc.stdout is not None
        proc.stdout.close()
    assert proc.returncode == 0, log.read_text()


def test_the_machines_file_the_banner_says_to_edit_outlives_the_demo(workdir: Path) -> None:
    state, log = workdir / "state", workdir / "demo.log"
    machines = state / "machines.yaml"
    with demo_in(state, log):
        edited = machines.read_text().replace("Stopped", "Running") + "---\n" + yaml.safe_dump(MINE)
        machines.write_text(edited)
    assert "; kept machines.yaml (your machines, without the console's key)" in log.read_text()
    kept = list(yaml.safe_load_all(machines.read_text()))
    assert [(d["kind"], d["metadata"]["name"]) for d in kept] == [
        ("Machine", "demo"),
        ("Machine", "stopped"),
        ("Machine", "mine"),
    ]
    assert "PRIVATE KEY" not in machines.read_text()
    assert (machines.stat().st_mode & 0o077) == 0
    with demo_in(state, log) as kubeconfig:
        # The user's machine and change are served; the demo's own console has this run's key.
        docs = {d["metadata"]["name"]: d for d in yaml.safe_load_all(machines.read_text())}
        assert docs["stopped"]["status"]["phase"] == "Running"
        listed = run_cli(["--kubeconfig", kubeconfig, "sessions", "mine"], home=workdir)
        assert listed.returncode == 0, listed.stderr
        piped = run_cli(
            ["--kubeconfig", kubeconfig, "console", "demo"],
            home=workdir,
            stdin=b"echo again-$((40+2))\n",
        )
        assert piped.returncode == 0, piped.stderr
        assert b"again-42" in piped.stdout


def test_logs_of_a_console_not_kept_gives_advice_that_works_on_the_demo(workdir: Path) -> None:
    with running_demo() as demo:
        args: list[str | Path] = ["--kubeconfig", demo.kubeconfig, "logs", "demo"]
        refused = run_cli(args, home=workdir)
        machines = demo.state_dir / "machines.yaml"
        assert refused.returncode == 1
        assert refused.stderr.decode() == (
            "Error from server (BadRequest): Machine default/demo: the console is not kept, "
            'so it has no log; keep it with the annotation subres.dev/keep-console="true" '
            f"(in {machines}, under its metadata.annotations; subres re-reads the file)\n"
        )
        # As advised: the annotation, in that file.
        docs = list(yaml.safe_load_all(machines.read_text()))
        docs[0]["metadata"]["annotations"]["subres.dev/keep-console"] = "true"
        machines.write_text(yaml.safe_dump_all(docs))
        deadline = time.monotonic() + CLI_TIMEOUT
        # The server re-reads the file on its own clock; nothing tells this process.
        while (done := run_cli(args, home=workdir)).returncode != 0:
            assert time.monotonic() < deadline, done.stderr
        assert done.stderr == b""


async def test_vnc_says_the_machine_is_missing_before_looking_for_a_viewer(
    tmp_path: Path,
) -> None:
    async with start_standalone(tmp_path, machine("vm1")) as subres:
        done = await run_cli_async(
            ["--kubeconfig", subres.kubeconfig(), "vnc", "nosuch"], home=tmp_path, path="/nowhere"
        )
    assert done.returncode == 1
    assert done.stderr.decode() == (
        'Error from server (NotFound): machines.subres.dev "nosuch" not found '
        'in namespace "default"\n'
    )


async def test_vnc_to_a_display_that_refuses_is_an_error_and_no_viewer(tmp_path: Path) -> None:
    dead = {"vnc": {"endpoint": f"tcp://127.0.0.1:{DEAD_PORT}"}}
    started = tmp_path / "viewer-started"
    viewer = f"sh -c 'touch {started}' {{address}} {{port}}"
    async with start_standalone(tmp_path, machine("vm1", status=dead)) as subres:
        args: list[str | Path] = ["--kubeconfig", subres.kubeconfig(), "vnc", "vm1"]
        args += ["--viewer", viewer]
        done = await run_cli_async(args, home=tmp_path)
    assert done.returncode == 1
    assert done.stderr.decode().startswith("Error from server (ServiceUnavailable): "), done.stderr
    assert b"connection refused" in done.stderr.lower()
    assert not started.exists()


async def test_a_piped_script_through_a_kept_console_reads_no_earlier_scrollback(
    tmp_path: Path,
) -> None:
    console = Console()
    serial = await Backend(handler=console.handle).start_tcp()
    kept = machine("vm1", console=serial.url, annotations={"subres.dev/keep-console": "true"})
    try:
        async with start_standalone(tmp_path, kept) as subres:
            await serial.wait_open(1)
            await console.say(b"an earlier session's output\r\n")
            logs: list[str | Path] = ["--kubeconfig", subres.kubeconfig(), "logs", "vm1"]
            async with asyncio.timeout(CLI_TIMEOUT):
                # Nothing signals the keeper's delivery to another process.
                while b"earlier" not in (await run_cli_async(logs, home=tmp_path)).stdout:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            args: list[str | Path] = ["--kubeconfig", subres.kubeconfig(), "console", "vm1"]
            done = await run_cli_async(args, home=tmp_path, stdin=b"echo now\n")
    finally:
        await serial.stop()
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == (b"echo now\n", b"")


UNKNOWN_FORMAT = (
    'error: unable to match a printer suitable for the output format "table", '
    "allowed formats are: json,name,wide,yaml\n"
)
GROUP = "subresources.subres.dev"


def subres_in(cwd: Path, demo: Demo, *args: str) -> subprocess.CompletedProcess[bytes]:
    """The CLI against `demo`, run in `cwd` (where a file it writes would land)."""
    return subprocess.run(
        cli("--kubeconfig", demo.kubeconfig, *args),
        cwd=cwd,
        capture_output=True,
        env=cli_env(cwd),
        timeout=CLI_TIMEOUT,
        check=False,
    )


def test_recordings_take_kubectls_output_formats(demo: Demo, workdir: Path) -> None:
    recorded = subres_in(workdir, demo, "console", "demo")  # stdin empty: a short session
    assert recorded.returncode == 0, recorded.stderr
    as_yaml = subres_in(workdir, demo, "recordings", "demo", "-o", "yaml")
    assert as_yaml.returncode == 0, as_yaml.stderr
    listed = yaml.safe_load(as_yaml.stdout)
    assert listed["kind"] == "RecordingList" and listed["items"], listed
    newest = listed["items"][0]["name"]
    as_json = subres_in(workdir, demo, "recordings", "demo", "-o", "json")
    assert json.loads(as_json.stdout) == listed
    names = subres_in(workdir, demo, "recordings", "demo", "-o", "name")
    assert names.stdout.decode().splitlines()[0] == f"recording.{GROUP}/{newest}"
    wide = subres_in(workdir, demo, "recordings", "demo", "-o", "wide")
    assert wide.stdout.split(b"\n", 1)[0].split() == [
        b"NAME", b"SIZE", b"STARTED", b"TITLE", b"SUBRESOURCE", b"MODIFIED"
    ]  # fmt: skip
    # A name as -o name prints it saves that recording.
    saved = subres_in(
        workdir, demo, "recordings", "demo", f"recording.{GROUP}/{newest}", "--file", "-"
    )
    assert saved.returncode == 0, saved.stderr
    assert saved.stdout.startswith(b'{"version": 2'), saved.stdout[:80]
    # With a recording's name, -o is no file name.
    refused = subres_in(workdir, demo, "recordings", "demo", newest, "-o", "yaml")
    assert (refused.returncode, refused.stdout) == (1, b"")
    assert refused.stderr.decode() == (
        "error: -o is how the list of recordings is printed; to save a recording elsewhere "
        "than in a file of its own name, pass --file FILE (- for stdout)\n"
    )
    assert list(workdir.iterdir()) == []
    unknown = subres_in(workdir, demo, "recordings", "demo", "-o", "table")
    assert (unknown.returncode, unknown.stdout, unknown.stderr.decode()) == (1, b"", UNKNOWN_FORMAT)


def test_sessions_take_kubectls_output_formats(demo: Demo, workdir: Path) -> None:
    argv = cli("--kubeconfig", demo.kubeconfig, "console", "demo")
    with subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=cli_env(workdir)
    ) as holder:
        assert holder.stdin is not None
        try:
            deadline = time.monotonic() + CLI_TIMEOUT
            # Until the console is held: nothing signals it to this process.
            while not (names := subres_in(workdir, demo, "sessions", "-o", "name")).stdout:
                assert time.monotonic() < deadline, names.stderr
            assert re.fullmatch(
                rf"session\.{GROUP}/demo-console-[0-9a-f]{{8}}\n", names.stdout.decode()
            )
            wide = subres_in(workdir, demo, "sessions", "-o", "wide")
            assert wide.returncode == 0, wide.stderr
            header, row = wide.stdout.decode().splitlines()
            assert header.split()[-3:] == ["DIALECT", "RECORDED", "REPLICA"]
            assert row.split()[-3:-1] == ["v5.channel.k8s.io", "true"], row
        finally:
            holder.stdin.close()
            holder.wait(CLI_TIMEOUT)
    unknown = subres_in(workdir, demo, "sessions", "-o", "table")
    assert (unknown.returncode, unknown.stdout, unknown.stderr.decode()) == (1, b"", UNKNOWN_FORMAT)


def completed(shell: str, script: str, line: str) -> list[str]:
    """What `shell`, having loaded `script`, offers for `line` (the cursor at its end)."""
    if shell == "bash":
        words = shlex.split(line) + ([""] if line.endswith(" ") else [])
        program = (
            f"{script}\nCOMP_WORDS=({' '.join(map(shlex.quote, words))})\n"
            f"COMP_CWORD={len(words) - 1}\n_subres\nprintf '%s\\n' \"${{COMPREPLY[@]}}\""
        )
        argv = ["bash", "-c", program]
    else:  # fish answers for a command line itself
        argv = ["fish", "--no-config", "-c", f"{script}\ncomplete -C {shlex.quote(line)}"]
    done = subprocess.run(argv, capture_output=True, timeout=CLI_TIMEOUT, check=True)
    return sorted(line.split("\t")[0] for line in done.stdout.decode().splitlines() if line)


@pytest.mark.full  # zsh and fish: Debian packages scripts/test installs
def test_completion_scripts_complete_what_the_parser_parses(workdir: Path) -> None:
    scripts = {}
    for shell in ("bash", "zsh", "fish"):
        done = run_cli(["completion", shell], home=workdir)
        assert (done.returncode, done.stderr) == (0, b""), done.stderr
        scripts[shell] = done.stdout.decode()
    for shell in ("bash", "fish"):
        script = scripts[shell]
        assert completed(shell, script, "subres rec") == ["recordings"]
        assert completed(shell, script, "subres --kubeconfig k recordings demo -o ") == [
            "json", "name", "wide", "yaml"
        ]  # fmt: skip
        assert completed(shell, script, "subres port-forward vm1 --transport ") == [
            "spdy", "tunnel", "websocket"
        ]  # fmt: skip
    # Every verb's every flag, as the parser has them: the script cannot drift from it.
    top = main.parser()
    [verbs] = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    assert completed("bash", scripts["bash"], "subres ") == sorted(
        [*verbs.choices, *(n for a in top._actions for n in a.option_strings)]
    )
    for name, verb in verbs.choices.items():
        flags = [
            n
            for a in verb._actions
            if a.help != argparse.SUPPRESS
            for n in a.option_strings
            if n.startswith("--")
        ]
        assert completed("bash", scripts["bash"], f"subres {name} --") == sorted(flags), name
    # zsh: the script loads as a completion function and is bound to the command.
    zsh = subprocess.run(
        ["zsh", "-f", "-c", "autoload -U compinit; compinit -u -D; source /dev/stdin; "
         "print -r -- $_comps[subres] $_comps[kubectl-subres]"],
        input=scripts["zsh"].encode(), capture_output=True, timeout=CLI_TIMEOUT, check=False,
    )  # fmt: skip
    assert (zsh.returncode, zsh.stdout, zsh.stderr) == (0, b"_subres _subres\n", b"")
