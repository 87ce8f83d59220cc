"""The cluster's teardown machinery: every kind of host change it knows is seen and undone.

Makes one harmless change of each kind a cluster makes (a sysctl, a veth
pair, a network namespace, an nftables table, an iptables chain with a rule
jumping to it, a mount, a cgroup under the run's own, files in a watched
directory), checks that ``differences`` names each, that ``undo`` reverts
them all, and that the host is then as it was.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import cgroups, hoststate

SYSCTL = "kernel.keys.root_maxkeys"
"""Raised by one for the test: nothing on a test machine is near its quota of keys."""


def run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True)


@pytest.fixture
def before() -> Iterator[hoststate.HostState]:
    state = hoststate.capture(cgroup_base=cgroups.base())
    yield state
    hoststate.undo(state)  # whatever the test left, even when it failed


def test_every_change_is_named_and_undone(before: hoststate.HostState) -> None:
    value = int(before.sysctls[SYSCTL])
    Path("/proc/sys/kernel/keys/root_maxkeys").write_text(f"{value + 1}\n")
    run("ip", "link", "add", "subres-t0", "type", "veth", "peer", "name", "subres-t1")
    run("ip", "netns", "add", "subres-test")
    run("nft", "add", "table", "inet", "subres_test")
    run("iptables", "-t", "filter", "-N", "SUBRES-TEST")
    run("iptables", "-t", "filter", "-A", "INPUT", "-s", "192.0.2.123/32", "-j", "SUBRES-TEST")
    mountpoint = Path(tempfile.mkdtemp(prefix="subres-hoststate-"))
    run("mount", "-t", "tmpfs", "subres-test", str(mountpoint))
    cgroup = f"{before.cgroup_base.rstrip('/')}/subres-hoststate-test/child"
    cgroups.create(cgroup)
    watched = Path("/run/subres/hoststate-test")
    watched.mkdir(parents=True)
    (watched / "file").write_text("left by a node")

    changed = hoststate.differences(before, hoststate.capture(cgroup_base=before.cgroup_base))
    text = "\n".join(changed)
    for expected in (
        f"sysctl {SYSCTL}: {value} -> {value + 1}",
        "links: + subres-t0",
        "netns: + subres-test",
        "nft_tables: + table inet subres_test",
        "iptables-save: + filter :SUBRES-TEST",
        f"mounts: + {mountpoint}",
        f"cgroups: + {cgroup}",
        f"/run/subres: + {watched / 'file'}",
    ):
        assert expected in text, text

    assert hoststate.undo(before) == []
    assert hoststate.differences(before, hoststate.capture(cgroup_base=before.cgroup_base)) == []
    mountpoint.rmdir()
