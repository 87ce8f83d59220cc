"""Session fixtures of the end-to-end suite: one real control plane for all its tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e import controlplane


@pytest.fixture(scope="session")
def control_plane_binaries() -> controlplane.Binaries:
    """etcd, kube-apiserver and kubectl, built once per machine (fails with go's output)."""
    return controlplane.build_binaries()


@pytest.fixture(scope="session")
def control_plane(
    control_plane_binaries: controlplane.Binaries,
) -> Iterator[controlplane.ControlPlane]:
    """A running etcd + kube-apiserver shared by the session's tests.

    Synchronous on purpose: started and stopped on a loop of its own, it can be
    used from tests on any event loop (nothing in it is tied to one). Tests
    that change it (restarts, cluster-wide objects) must leave it working.
    """
    plane = controlplane.run_sync(controlplane.launch(control_plane_binaries))
    try:
        yield plane
    finally:
        controlplane.run_sync(plane.stop())
