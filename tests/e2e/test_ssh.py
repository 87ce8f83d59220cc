"""An SSH console through a real kube-apiserver, its credentials read from a real Secret.

subres runs in cluster mode with a configuration whose Machine consoles may
be `ssh://` endpoints, the Secret named by an annotation. Its ServiceAccount
holds only what deploy/ grants: `subres:ssh-credentials-reader` (get on
secrets) is bound in one namespace, so subres reads the Secret there and
cannot read one anywhere else. alice reaches the console through
kube-apiserver; the SSH server is OpenSSH sshd on loopback, started for each
test with the same keys and port.
"""

from __future__ import annotations

import asyncio
import base64
import getpass
import json
import re
import ssl
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus
from websockets.typing import Subprotocol

from tests.e2e import subresserver
from tests.e2e.controlplane import ControlPlane, poll, run_sync
from tests.e2e.subresserver import GROUP, NAMESPACE, SERVICE_ACCOUNT, VERSION, Subres
from tests.ssh_support import Keys, OpenSsh, keys, known_hosts_line, openssh
from tests.support import free_port

BOUND = "e2e-ssh"
"""subres may read Secrets here."""
UNBOUND = "e2e-ssh-unbound"
"""...and not here."""
ANNOTATION = "subres.dev/ssh-credentials"
STEP = 20.0


@dataclass
class Cluster:
    plane: ControlPlane
    subres: Subres
    keys: Keys
    port: int


@pytest.fixture(scope="module")
def cluster(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    config = tmp_path_factory.mktemp("e2e-ssh") / "config.yaml"
    console = {
        "endpoint": ".spec.console.endpoint",
        "require": {".status.phase": ["Running"]},
        "ssh": {"credentials": f'.metadata.annotations["{ANNOTATION}"]'},
    }
    config.write_text(
        yaml.safe_dump(
            {
                "endpointPolicy": {"schemes": ["tcp", "ssh"], "allowCIDRs": ["127.0.0.0/8"]},
                "parents": [
                    {
                        "resource": "machines",
                        "kind": "Machine",
                        "source": {"group": "subres.dev", "version": "v1alpha1"},
                        "subresources": {"console": console},
                    }
                ],
            }
        )
    )
    server = run_sync(subresserver.launch(control_plane, subresserver.Profile(config=config)))
    try:
        cluster = Cluster(control_plane, server, keys(), free_port())
        run_sync(_prepare(cluster))
        yield cluster
    finally:
        run_sync(subresserver.shutdown(server))


@pytest.fixture
async def sshd(cluster: Cluster, tmp_path: Path) -> AsyncIterator[OpenSsh]:
    async with openssh(tmp_path / "sshd", with_keys=cluster.keys, port=cluster.port) as server:
        yield server


async def _prepare(cluster: Cluster) -> None:
    """A Secret and a Machine in both namespaces; the reader role bound in one; alice bound."""
    plane = cluster.plane
    login = bytes(cluster.keys.user.export_private_key("openssh"))
    data = {
        "username": getpass.getuser().encode(),  # the endpoint names no user
        "ssh-privatekey": login,
        "known_hosts": known_hosts_line(cluster.keys.host, cluster.port),
    }
    for namespace in (BOUND, UNBOUND):
        await plane.ensure_namespace(namespace)
        await plane.api(
            "POST",
            f"/api/v1/namespaces/{namespace}/secrets",
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "sshd-login"},
                "type": "kubernetes.io/ssh-auth",
                "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
            },
        )
        machine = {
            "apiVersion": "subres.dev/v1alpha1",
            "kind": "Machine",
            "metadata": {"name": "bmc", "namespace": namespace,
                         "annotations": {ANNOTATION: "sshd-login"}},
            "spec": {"console": {"endpoint": f"ssh://127.0.0.1:{cluster.port}"}},
        }  # fmt: skip
        await _kubectl(plane, "apply", "-f", "-", stdin=json.dumps(machine))
        await _kubectl(
            plane, "patch", "machine", "bmc", "-n", namespace, "--subresource=status",
            "--type=merge", "-p", '{"status":{"phase":"Running"}}',
        )  # fmt: skip
        await _kubectl(
            plane, "create", "rolebinding", "alice-machines", "-n", namespace,
            "--clusterrole=subres-machine-user", "--user=alice",
        )  # fmt: skip
    await _kubectl(
        plane, "create", "rolebinding", "subres-ssh-credentials", "-n", BOUND,
        "--clusterrole=subres:ssh-credentials-reader",
        f"--serviceaccount={NAMESPACE}:{SERVICE_ACCOUNT}",
    )  # fmt: skip


async def _kubectl(plane: ControlPlane, *args: str, stdin: str | None = None) -> None:
    (await plane.kubectl(*args, stdin=stdin)).check()


def alice(plane: ControlPlane, namespace: str) -> connect:
    """alice's raw console WebSocket to `namespace/bmc`, through kube-apiserver."""
    base = plane.url.replace("https://", "wss://")
    return connect(
        f"{base}/apis/{GROUP}/{VERSION}/namespaces/{namespace}/machines/bmc/console",
        ssl=ssl.create_default_context(cafile=str(plane.server_ca)),
        additional_headers={"Authorization": f"Bearer {plane.users['alice'].token}"},
        subprotocols=[Subprotocol("plain.kubevirt.io")],
        proxy=None,
        compression=None,
        open_timeout=15,
    )


async def test_console_on_sshd_with_the_secret_read_through_the_apiserver(
    cluster: Cluster, sshd: OpenSsh
) -> None:
    async def typed() -> bool:
        try:
            async with alice(cluster.plane, BOUND) as conn:
                await conn.send(b"echo sub$((40+2))res\r")
                seen = b""
                async with asyncio.timeout(STEP):
                    while b"sub42res" not in seen:
                        message = await conn.recv()
                        assert isinstance(message, bytes)
                        seen += message
        except InvalidStatus as exc:
            assert exc.response.status_code in (404, 409), exc  # not in the watch cache yet
            return False
        return True

    assert await poll(typed, timeout_s=STEP), cluster.subres.logs()
    assert sshd.logs().count("Accepted publickey") == 1


async def test_without_the_role_in_its_namespace_subres_cannot_read_the_secret(
    cluster: Cluster, sshd: OpenSsh
) -> None:
    seen: list[tuple[int, str]] = []

    async def says_forbidden() -> bool:
        with pytest.raises(InvalidStatus) as info:
            async with alice(cluster.plane, UNBOUND):
                pass
        body = json.loads(info.value.response.body or b"{}")
        seen.append((info.value.response.status_code, str(body.get("message"))))
        code, message = seen[-1]
        return (
            code == 503 and re.search(r"cannot read Secret \S*sshd-login: 403", message) is not None
        )

    assert await poll(says_forbidden, timeout_s=STEP), seen
    assert "Connection from" not in sshd.logs()
