"""`subres serve` flags: drain and membership parsed as durations and checked together;
where it listens and keeps its keys unless told."""

from __future__ import annotations

import argparse
import os
import stat
import sys
from pathlib import Path

import pytest

from subres.server.options import Options, add_arguments, default_cert_dir
from tests.cli.conftest import read_until, running


def options(*argv: str) -> Options:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return Options.from_args(parser.parse_args(list(argv)))


def test_drain_and_lease_defaults() -> None:
    parsed = options()
    assert (parsed.shutdown_delay, parsed.shutdown_grace) == (5.0, 5.0)
    assert (parsed.member_duration, parsed.member_renew, parsed.peer_port) == (6.0, 2.0, 8445)
    assert parsed.replica_name == ""
    assert parsed.validate() == []


def test_durations_read_as_kube_spells_them() -> None:
    parsed = options(
        "--shutdown-delay=1m30s", "--shutdown-grace=500ms", "--member-duration=1m",
        "--member-renew=20s",
    )  # fmt: skip
    assert (parsed.shutdown_delay, parsed.shutdown_grace) == (90.0, 0.5)
    assert (parsed.member_duration, parsed.member_renew) == (60.0, 20.0)
    assert parsed.validate() == []


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--shutdown-delay=-1"], "--shutdown-delay must not be negative"),
        (["--member-duration=1.5s"], "--member-duration must be a whole number of seconds"),
        (["--member-duration=0s"], "--member-duration must be a whole number of seconds"),
        (["--member-renew=3s"], "--member-renew must be above 0 and at most a third"),
        (["--member-renew=0"], "--member-renew must be above 0 and at most a third"),
    ],
)
def test_bad_values_are_named(argv: list[str], problem: str) -> None:
    problems = options(*argv).validate()
    assert any(p.startswith(problem) for p in problems), problems


def test_where_it_listens_and_keeps_keys_by_default(tmp_path: Path) -> None:
    standalone = options("--standalone", "machines.yaml")
    assert standalone.bind_address == "127.0.0.1"
    assert options().bind_address == "0.0.0.0"  # in a cluster kube-apiserver dials the pod
    assert options("--standalone", "m.yaml", "--bind-address", "::").bind_address == "::"
    assert default_cert_dir({"XDG_STATE_HOME": str(tmp_path)}) == tmp_path / "subres/certificates"


def test_standalone_serve_listens_on_loopback_and_keeps_keys_private(tmp_path: Path) -> None:
    """As a newcomer runs it, in a directory of their own: nothing lands in it, keys are
    private, and only this machine can connect."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (work / "machines.yaml").write_text("")
    (work / "tokens.csv").write_text('t0ken,alice,alice-uid,"devs"\n')
    env = {k: v for k, v in os.environ.items() if k != "XDG_STATE_HOME"} | {"HOME": str(home)}
    argv = [sys.executable, "-m", "subres", "serve", "--standalone", "machines.yaml"]
    argv += ["--token-auth-file", "tokens.csv", "--secure-port", "0"]
    with running(argv, cwd=work, env=env) as proc:
        serving = read_until(
            proc, rb"serving on https://([^:]+):(\d+)", timeout=30, stream="stderr"
        )
    assert serving.group(1) == b"127.0.0.1"
    assert sorted(p.name for p in work.iterdir()) == ["machines.yaml", "tokens.csv"]
    certificates = home / ".local/state/subres/certificates"
    for directory in (home / ".local", home / ".local/state", certificates.parent, certificates):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    for key in certificates.glob("*.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    assert {p.name for p in certificates.glob("*.key")} == {"ca.key", "apiserver.key"}
