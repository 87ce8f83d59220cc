"""subres installed on the real cluster exactly as docs/operating.md's install section says.

Its "Install in a cluster" section has one ``sh`` block that installs
subres: ``subres certs``, an overlay that names the image, ``kubectl apply
-k`` and a wait for the APIService. ``install`` runs that block, word for
word, with ``bash`` in a copy of ``deploy/`` (the generated keys never land
in the checkout), with our kubectl and this checkout's ``subres`` first on
``PATH`` and the cluster's admin kubeconfig; the image it names must already
be on every node (``Cluster.import_image``).
"""

from __future__ import annotations

import asyncio
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.cluster.cluster import Cluster, ClusterError
from tests.e2e.controlplane import output_of, poll

__all__ = [
    "AGENTS",
    "AGENT_NAMESPACE",
    "APISERVICE",
    "IMAGE",
    "NAMESPACE",
    "NEXT_TAG",
    "REPLICAS",
    "Installed",
    "docs_block",
    "docs_install_block",
    "install",
    "rollout",
    "run_block",
    "wait_gone",
    "wait_pods",
    "workspace",
]

REPO = Path(__file__).resolve().parents[2]
OPERATING = REPO / "docs" / "operating.md"
NAMESPACE = "subres-system"
AGENT_NAMESPACE = "subres-agents"
APISERVICE = "v1alpha1.subresources.subres.dev"
REPLICAS = "app.kubernetes.io/name=subres"
"""The replica pods' label selector."""
AGENTS = "app.kubernetes.io/name=subres-agent"
"""The agent pods' label selector."""
IMAGE = "localhost/subres:0.1.0"
"""The image the docs' block names (what ``deploy/image/build.py`` tags by default)."""
NEXT_TAG = "0.1.0-next"
"""The tag of the image a rolling upgrade goes to."""
INSTALL_TIMEOUT_S = 300.0
ROLLOUT_TIMEOUT_S = 240.0


@dataclass(frozen=True)
class Installed:
    """Where the install ran and what it printed."""

    workdir: Path
    output: str
    script: str


def docs_block(section: str, word: str, page: Path = OPERATING) -> str:
    """The one ``sh`` block of the page's ``## section`` that holds `word`."""
    text = page.read_text()
    found = re.search(rf"^## {re.escape(section)}\n(.*?)(?=^#{{2,3}} )", text, re.M | re.S)
    if found is None:
        raise ClusterError(f"{page} has no '## {section}' section")
    blocks = re.findall(r"^```sh\n(.*?)^```", found[1], re.M | re.S)
    matching = [b for b in blocks if word in b]
    if len(matching) != 1:
        raise ClusterError(f"'{section}' has {len(matching)} sh blocks with {word}")
    return str(matching[0])


def docs_install_block(page: Path = OPERATING) -> str:
    """The ``sh`` block of docs/operating.md's "Install in a cluster" that runs ``subres certs``."""
    return docs_block("Install in a cluster", "subres certs", page)


def workspace(cluster: Cluster, *, helm: Path | None = None) -> Path:
    """A scratch copy of ``deploy/`` (no certificates) and a ``bin`` with our kubectl
    (and `helm` as ``helm``): where a docs block runs. The caller removes it."""
    workdir = Path(tempfile.mkdtemp(prefix="subres-install-"))
    shutil.copytree(REPO / "deploy", workdir / "deploy", ignore=shutil.ignore_patterns("certs"))
    tools = workdir / "bin"
    tools.mkdir()
    (tools / "kubectl").symlink_to(cluster.plane.binaries.kubectl)
    if helm is not None:
        (tools / "helm").symlink_to(helm)
    return workdir


async def run_block(cluster: Cluster, script: str, workdir: Path) -> str:
    """Run a docs block with bash in `workdir` (made by `workspace`): its output.

    Our tools and this checkout's ``subres`` come first on ``PATH``, with the cluster's
    admin kubeconfig; a failure raises with the block and its output.
    """
    tools = workdir / "bin"
    env = {
        "PATH": f"{tools}:{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/sbin:/bin",
        "KUBECONFIG": str(cluster.plane.admin_kubeconfig),
        "KUBECACHEDIR": str(workdir / "kubecache"),
        "HOME": str(workdir),
    }
    code, output = await output_of(
        "bash", "-euo", "pipefail", "-c", script, cwd=workdir, env=env,
        timeout_s=INSTALL_TIMEOUT_S,
    )  # fmt: skip
    if code != 0:
        raise cluster.failure(f"a docs block exited {code}:\n{script}\n{output}")
    return output


async def install(cluster: Cluster) -> Installed:
    """Run the docs' install block against `cluster`; raise with its output if it fails.

    Its directory (deploy/ with the certificates' private keys) is the caller's to remove.
    """
    script = docs_install_block()
    workdir = workspace(cluster)
    try:
        output = await run_block(cluster, script, workdir)
    except BaseException:
        shutil.rmtree(workdir)
        raise
    return Installed(workdir=workdir, output=output, script=script)


async def rollout(cluster: Cluster, kind: str, name: str, namespace: str) -> None:
    """Wait until a Deployment or DaemonSet has every pod updated and Ready."""
    result = await cluster.plane.kubectl(
        "rollout", "status", f"{kind}/{name}", "-n", namespace,
        f"--timeout={ROLLOUT_TIMEOUT_S:.0f}s", timeout_s=ROLLOUT_TIMEOUT_S + 30,
    )  # fmt: skip
    if result.returncode != 0:
        raise cluster.failure(f"{kind}/{name} did not roll out:\n{result.stdout}{result.stderr}")


async def pods(cluster: Cluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    """The pods matching a label selector, as the API lists them."""
    answer = await cluster.plane.api(
        "GET", f"/api/v1/namespaces/{namespace}/pods", params={"labelSelector": selector}
    )
    return list(answer["items"])


async def wait_pods(
    cluster: Cluster, namespace: str, selector: str, *, count: int, timeout_s: float = 120.0
) -> list[dict[str, Any]]:
    """Wait until exactly `count` matching pods are Ready and none is terminating."""
    found: list[dict[str, Any]] = []

    async def ready() -> bool:
        nonlocal found
        found = await pods(cluster, namespace, selector)
        live = [p for p in found if "deletionTimestamp" not in p["metadata"]]
        return len(found) == count and all(_ready(p) for p in live) and len(live) == count

    if not await poll(ready, timeout_s=timeout_s):
        raise cluster.failure(f"{count} ready pods {selector} in {namespace}: {found}")
    return found


async def wait_gone(cluster: Cluster, address: str, port: int, *, timeout_s: float = 60.0) -> None:
    """Wait until nothing accepts connections at a pod's `address`:`port` any more."""

    async def refused() -> bool:
        try:
            async with asyncio.timeout(2):
                _, writer = await asyncio.open_connection(address, port)
        except (OSError, TimeoutError):
            return True
        writer.close()
        return False

    if not await poll(refused, timeout_s=timeout_s):
        raise cluster.failure(f"{address}:{port} still answers after {timeout_s:.0f}s")


def _ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
