"""Shared fixtures: the event loop, the Go peers built from the module proxy, a TCP echo backend;
and which tests belong to the whole suite only (the `full` mark), not to the quick tier."""

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path

import pytest

from subres.serving import loops
from tests.gotools import helm_bin, kubectl_bin, kubepeer_bin, virtctl_bin
from tests.support import Backend

__all__ = [
    "backend",
    "helm_bin",
    "kubectl_bin",
    "kubepeer_bin",
    "pytest_asyncio_loop_factories",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "virtctl_bin",
]


@pytest.fixture
async def backend() -> AsyncIterator[Backend]:
    """A TCP echo server on 127.0.0.1 that counts its connections."""
    b = await Backend().start_tcp()
    yield b
    await b.stop()


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """The loop every test runs on: `$SUBRES_LOOP` (uvloop or asyncio), else the product's default.

    Servers the tests start as processes read the same variable.
    """
    name = os.environ.get(loops.ENV) or loops.DEFAULT
    return {name: loops.factory(name) or asyncio.new_event_loop}


FULL_DIRS = frozenset({"cluster", "e2e", "browser", "examples", "bench"})
"""Directories of the whole suite only: a control plane, Chromium, QEMU, root, benchmarks."""
FULL_FIXTURES = frozenset(
    {
        "helm_bin",
        "kubectl_bin",
        "kubepeer_bin",
        "virtctl_bin",
        "peer_binary",
        "sshd",
        "browser_ready",
        "sim",
    }
)
"""Fixtures that build a Go peer or start a program only scripts/test installs (Chromium,
OpenIPMI's ipmi_sim)."""
FULL_FILES = frozenset(
    {
        "test_gotools.py",
        "test_packaging.py",
        "test_replay_video.py",
        "test_sockets.py",
        "test_recording_failclosed.py",
        "test_ssh_backend.py",
        "test_ipmi_backend.py",
        "test_metal3_profile.py",
    }
)
"""Go builds, wheels built in fresh virtualenvs, ffmpeg, ipmi_sim, OpenSSH's sshd (its logins
need root);
and root: a listener run as another user (`setpriv`), a full disk (a tmpfs mounted for the
test)."""
TESTS = Path(__file__).parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "full: needs what only ./scripts/test provides (Go peers, root, system programs, "
        "the cluster); scripts/test-quick runs the rest",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the whole suite's tests `full`, by where they live and what they use."""
    for item in items:
        where = item.path.relative_to(TESTS).parts
        fixtures = set(getattr(item, "fixturenames", ()))
        if where[0] in FULL_DIRS or where[-1] in FULL_FILES or fixtures & FULL_FIXTURES:
            item.add_marker(pytest.mark.full)
