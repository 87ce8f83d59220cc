"""`subres serve` flags for drain and session Leases: parsed as durations, checked together."""

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
    assert (parsed.lease_duration, parsed.lease_renew_interval) == (30.0, 10.0)
    assert parsed.lease_namespace == parsed.replica_name == ""
    assert parsed.validate() == []


def test_durations_read_as_kube_spells_them() -> None:
    parsed = options(
        "--shutdown-delay=1m30s", "--shutdown-grace=500ms", "--lease-duration=1m",
        "--lease-renew-interval=20s",
    )  # fmt: skip
    assert (parsed.shutdown_delay, parsed.shutdown_grace) == (90.0, 0.5)
    assert (parsed.lease_duration, parsed.lease_renew_interval) == (60.0, 20.0)
    assert parsed.validate() == []


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--shutdown-delay=-1"], "--shutdown-delay must not be negative"),
        (["--lease-duration=1.5s"], "--lease-duration must be a whole number of seconds"),
        (["--lease-duration=0s"], "--lease-duration must be a whole number of seconds"),
        (["--lease-renew-interval=30s"], "--lease-renew-interval must be above 0 and below"),
        (["--lease-renew-interval=0"], "--lease-renew-interval must be above 0 and below"),
    ],
)
def test_bad_values_are_named(argv: list[str], problem: str) -> None:
    problems = options(*argv).validate()
    assert any(p.startswith(problem) for p in problems), problems
