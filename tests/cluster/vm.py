"""A real VM as a Pod on node-a, and its Machine, as a VM controller would keep them.

The pod runs ``examples/qemu-vm/run-vm.sh run`` (the example's VM in the
foreground) from the ``qemu-vm`` test image, in a namespace of its own whose
Pod Security level admits what a VM launcher needs: the agent's socket
directory as a hostPath (the VM's serial and VNC sockets go there, where
node-a's agent serves them) and a privileged container, which sees
``/dev/kvm`` (the script boots with KVM when it works there, else TCG). The
guest's web server is forwarded on the pod's address. The Machine's
``.status`` is written through the status subresource with the pod's node,
its sockets and its address, as a controller would.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tests.cluster import images
from tests.cluster.cluster import Cluster
from tests.cluster.install import wait_pods
from tests.e2e.test_agents import wait_answer
from tests.e2e.test_subres import NS, bind_machine_users, put_machine, via_apiserver

__all__ = [
    "NAME",
    "NAMESPACE",
    "NODE",
    "NS",
    "PORT",
    "SOCKETS",
    "Vm",
    "accel",
    "pod_manifest",
    "start_vm",
]

NAME = "vm1"
NAMESPACE = "subres-vms"
NODE = "node-a"
SOCKETS = f"/run/subres/sockets/{NAME}"
"""Under the agents' socket directory (deploy/base/agent.yaml's hostPath)."""
PORT = 8080
"""The guest's :80, forwarded on the pod's address."""
BOOT_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class Vm:
    """The running VM: its pod and how it boots."""

    pod: dict[str, Any]

    @property
    def address(self) -> str:
        return str(self.pod["status"]["podIP"])


def pod_manifest(image: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": {"app": NAME}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "qemu",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "args": [SOCKETS, str(PORT)],
                    "env": [{"name": "SUBRES_VM_FORWARD_ADDRESS", "value": "0.0.0.0"}],
                    "ports": [{"name": "http", "containerPort": PORT}],
                    # Privileged containers get the node's devices: /dev/kvm among them.
                    "securityContext": {"privileged": True},
                    "readinessProbe": {
                        "exec": {"command": ["test", "-S", f"{SOCKETS}/serial.sock"]},
                        "periodSeconds": 1,
                    },
                    "volumeMounts": [{"name": "sockets", "mountPath": SOCKETS}],
                }
            ],
            "volumes": [
                {"name": "sockets", "hostPath": {"path": SOCKETS, "type": "DirectoryOrCreate"}}
            ],
        },
    }


async def start_vm(cluster: Cluster) -> Vm:
    """The VM's pod Ready on node-a, its Machine written, and subres serving its console."""
    image = images.qemu_vm()
    await cluster.import_image(image.path)
    plane = cluster.plane
    await plane.apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": NAMESPACE,
                "labels": {"pod-security.kubernetes.io/enforce": "privileged"},
            },
        }
    )
    (await plane.kubectl("apply", "-f", "-", stdin=json.dumps(pod_manifest(image.name)))).check()
    [pod] = await wait_pods(cluster, NAMESPACE, f"app={NAME}", count=1, timeout_s=BOOT_TIMEOUT_S)
    vm = Vm(pod)
    await bind_machine_users(plane, "vm-machine-users")
    await put_machine(
        plane,
        NAME,
        console=f"unix://{SOCKETS}/serial.sock",
        vnc=f"unix://{SOCKETS}/vnc.sock",
        forward=(vm.address, [PORT]),
        node=pod["spec"]["nodeName"],
    )
    await wait_answer(via_apiserver(plane, "alice"), NAME, timeout_s=60.0)
    return vm


async def accel(cluster: Cluster) -> str:
    """How the VM boots: the script's own line, "(kvm)" or "(tcg)"."""
    logs = await cluster.plane.kubectl("logs", "-n", NAMESPACE, NAME)
    return "kvm" if "(kvm)" in logs.check().stdout else "tcg"
