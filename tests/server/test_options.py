"""`subres serve` flags for drain and membership: parsed as durations, checked together."""

from __future__ import annotations

import argparse

import pytest

from subres.server.options import Options, add_arguments


def options(*argv: str) -> Options:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return Options.from_args(parser.parse_args(list(argv)))


def test_drain_and_lease_defaults() -> None:
    parsed = options()
    assert (parsed.shutdown_delay, parsed.shutdown_grace) == (0.0, 5.0)
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
