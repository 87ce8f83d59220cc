"""The edges a new user met following the README, each checked as they would meet it."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.cli.conftest import CLI_TIMEOUT, cli_env, running_demo

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
