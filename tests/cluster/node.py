"""One real Kubernetes node: containerd, a kubelet and kube-proxy in the node's namespace.

Owns the node's files (under its own directory: containerd's root, state,
socket and runc root, CNI configuration and IPAM data, the kubelet's root,
pod logs and configuration, kube-proxy's configuration) and its three
processes. Facts about this machine kind that the settings follow:

- runc fails ("can't get final child's PID from pipe: EOF") where it may not
  lower oom_score_adj: containerd's CRI runs with ``restrict_oom_score_adj``;
- the host has cgroup v1 only: the kubelet runs with ``failCgroupV1: false``,
  ``cgroupDriver: cgroupfs`` and a ``cgroupRoot`` of the node's own;
- there is no registry: images are imported with ``ctr``, the pod sandbox
  image is ``localhost/subres-test/pause`` and nothing is ever pulled;
- containerd keeps pod network namespaces under its state directory, so a
  crashed node leaves no mounts in ``/run/netns``.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.cluster import cgroups, network
from tests.e2e import credentials
from tests.e2e.controlplane import Process

__all__ = ["PAUSE_IMAGE", "Node", "NodeBinaries"]

PAUSE_IMAGE = "localhost/subres-test/pause:1"
CNI_BIN = "/usr/lib/cni"
"""Debian's containernetworking-plugins."""


@dataclass(frozen=True)
class NodeBinaries:
    """The node's programs: Debian's containerd and ctr, our kubelet and kube-proxy."""

    kubelet: Path
    kube_proxy: Path
    containerd: Path = Path("/usr/bin/containerd")
    ctr: Path = Path("/usr/bin/ctr")


@dataclass
class Node:
    """A node's configuration and, once started, its processes."""

    net: network.NodeNet
    dir: Path
    cgroup: str
    """The node's cgroup (the kubelet's cgroupRoot); its daemons are in ``daemons`` below."""
    binaries: NodeBinaries
    containerd: Process | None = None
    kubelet: Process | None = None
    kube_proxy: Process | None = None

    @property
    def name(self) -> str:
        return self.net.name

    @property
    def socket(self) -> Path:
        return self.dir / "containerd.sock"

    def processes(self) -> list[Process]:
        return [p for p in (self.kube_proxy, self.kubelet, self.containerd) if p is not None]

    # -- configuration ----------------------------------------------------------

    def write_config(
        self,
        *,
        server: str,
        ca: Path,
        client_ca: Path,
        kubelet: dict[str, str],
        proxy: dict[str, str],
    ) -> None:
        """Every file the node's programs read; `kubelet`/`proxy`: kubeconfig user entries."""
        for sub in ("containerd", "cni/net.d", "kubelet", "pod-logs", "kube-proxy"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        (self.dir / "containerd.toml").write_text(self._containerd_toml())
        (self.dir / "cni/net.d/10-bridge.conflist").write_text(json.dumps(self._cni()))
        (self.dir / "resolv.conf").write_text("# no cluster DNS: nothing to resolve\n")
        for name, user in (("kubelet", kubelet), ("kube-proxy", proxy)):
            credentials.write_kubeconfig(
                self.dir / name / "kubeconfig", server=server, ca=ca.read_bytes(), user=user
            )
        (self.dir / "kubelet/config.json").write_text(json.dumps(self._kubelet(client_ca)))
        (self.dir / "kube-proxy/config.json").write_text(json.dumps(self._kube_proxy()))

    def _containerd_toml(self) -> str:
        d = self.dir / "containerd"
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        runc = f"{cri}.containerd.runtimes.runc"
        return "\n".join(
            [
                "version = 2",
                f'root = "{d}/root"',
                f'state = "{d}/state"',
                # Snapshotters this host cannot have; they only add errors to the log.
                'disabled_plugins = ["io.containerd.snapshotter.v1.aufs",'
                ' "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",'
                ' "io.containerd.snapshotter.v1.devmapper"]',
                f'[grpc]\naddress = "{self.socket}"',
                f'[plugins."io.containerd.internal.v1.opt"]\npath = "{d}/opt"',
                f"[{cri}]",
                f'sandbox_image = "{PAUSE_IMAGE}"',
                "restrict_oom_score_adj = true",
                "netns_mounts_under_state_dir = true",
                "disable_apparmor = true",
                f"[{cri}.containerd]",
                'snapshotter = "overlayfs"',
                'default_runtime_name = "runc"',
                f"[{runc}]",
                'runtime_type = "io.containerd.runc.v2"',
                f"[{runc}.options]",
                f'Root = "{d}/runc"',
                "SystemdCgroup = false",
                f"[{cri}.cni]",
                f'bin_dir = "{CNI_BIN}"',
                f'conf_dir = "{self.dir}/cni/net.d"',
                "",
            ]
        )

    def _cni(self) -> dict[str, object]:
        return {
            "cniVersion": "1.0.0",
            "name": f"subres-{self.name}",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": True,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.net.pod_subnet}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.dir / "cni/ipam"),
                    },
                },
                {"type": "loopback"},
            ],
        }

    def _kubelet(self, client_ca: Path) -> dict[str, object]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "address": self.net.address,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(client_ca)},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "podLogsDir": str(self.dir / "pod-logs"),
            "volumePluginDir": str(self.dir / "kubelet/volume-plugins"),
            "resolvConf": str(self.dir / "resolv.conf"),
            "failSwapOn": False,
            # Images are imported, never pulled: none may be collected.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
            },
            "serializeImagePulls": False,
            "shutdownGracePeriod": "0s",
            "syncFrequency": "10s",
        }

    def _kube_proxy(self) -> dict[str, object]:
        return {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "nftables",
            "clientConnection": {"kubeconfig": str(self.dir / "kube-proxy/kubeconfig")},
            "hostnameOverride": self.name,
            "clusterCIDR": network.POD_CIDR,
            "healthzBindAddress": "127.0.0.1:10256",
            "metricsBindAddress": "127.0.0.1:10249",
            # Zero leaves the conntrack sysctls as they are.
            "conntrack": {"maxPerCore": 0, "min": 0},
        }

    # -- processes --------------------------------------------------------------

    def start_runtime(self) -> None:
        """containerd, in the node's namespace and cgroup (its shims follow it there)."""
        cgroups.create(f"{self.cgroup}/daemons")
        self.containerd = self._start(
            "containerd",
            [str(self.binaries.containerd), "--config", str(self.dir / "containerd.toml")],
        )

    def start_node(self) -> None:
        """The kubelet and kube-proxy, once containerd holds the pause image."""
        self.kubelet = self._start(
            "kubelet",
            [
                str(self.binaries.kubelet),
                f"--config={self.dir / 'kubelet/config.json'}",
                f"--kubeconfig={self.dir / 'kubelet/kubeconfig'}",
                f"--root-dir={self.dir / 'kubelet/root'}",
                f"--hostname-override={self.name}",
                f"--node-ip={self.net.address}",
                "--v=1",
            ],
        )
        self.kube_proxy = self._start(
            "kube-proxy",
            [
                str(self.binaries.kube_proxy),
                f"--config={self.dir / 'kube-proxy/config.json'}",
                "--v=1",
            ],
        )

    def _start(self, name: str, args: list[str]) -> Process:
        process = Process(
            name=f"{self.name} {name}",
            args=network.in_netns(self.net.netns, args),
            log=self.dir / f"{name}.log",
        )
        process.start()
        assert process.popen is not None
        # nsenter has exec'd the program by the time it forks anything of its own.
        cgroups.move(process.popen.pid, f"{self.cgroup}/daemons")
        return process

    def ctr(self, *args: str, timeout_s: float = 300.0) -> str:
        """Run ctr against this node's containerd, namespace k8s.io; its output."""
        proc = subprocess.run(
            [str(self.binaries.ctr), "--address", str(self.socket), "-n", "k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)} on {self.name}: {proc.stdout}{proc.stderr}")
        return proc.stdout

    def logs(self) -> str:
        return "\n".join(p.tail() for p in self.processes())
