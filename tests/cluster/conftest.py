"""Session fixtures of the real-cluster suite: one cluster, brought up once and reused.

``cluster`` is the running two-node cluster (torn down at the end of the
session, failing the run if the host is not as it was); ``built_images`` two
builds of the subres image, ``subres_images`` the same imported on every
node; ``installed`` subres installed by the block of docs/operating.md and rolled out;
``running_vm`` the QEMU example's VM in a pod on node-a with its Machine.
Later suites (the upgrade, the drills) take these fixtures and get the same
cluster.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.browser.conftest import browser, browser_ready
from tests.cluster import cluster as clusters
from tests.cluster import images, install, vm
from tests.e2e.controlplane import run_sync

__all__ = [
    "SubresImages",
    "browser",
    "browser_ready",
    "built_images",
    "cluster",
    "installed",
    "running_vm",
    "subres_images",
]


@dataclass(frozen=True)
class SubresImages:
    """The image the README installs, and the one an upgrade rolls to."""

    installed: images.BuiltImage
    next: images.BuiltImage


@pytest.fixture(scope="session")
def cluster() -> Iterator[clusters.Cluster]:
    running = run_sync(clusters.launch())
    try:
        yield running
    finally:
        run_sync(running.stop())


@pytest.fixture(scope="session")
def built_images() -> SubresImages:
    """Two builds of this checkout (from the cache when nothing changed)."""
    return SubresImages(
        installed=images.subres(install.IMAGE.rsplit(":", 1)[1], "a"),
        next=images.subres(install.NEXT_TAG, "b"),
    )


@pytest.fixture(scope="session")
def subres_images(cluster: clusters.Cluster, built_images: SubresImages) -> SubresImages:
    for image in (built_images.installed, built_images.next):
        run_sync(cluster.import_image(image.path))
    return built_images


@pytest.fixture(scope="session")
def installed(
    cluster: clusters.Cluster, subres_images: SubresImages
) -> Iterator[install.Installed]:
    done = run_sync(install.install(cluster))
    try:
        run_sync(install.rollout(cluster, "deployment", "subres", install.NAMESPACE))
        run_sync(install.rollout(cluster, "daemonset", "subres-agent", install.AGENT_NAMESPACE))
        yield done
    finally:
        shutil.rmtree(done.workdir)  # the install's copy of deploy/, its kubectl and caches


@pytest.fixture(scope="session")
def running_vm(cluster: clusters.Cluster, installed: install.Installed) -> vm.Vm:
    return run_sync(vm.start_vm(cluster))
