"""What a real cluster changes on this machine, captured before and undone after.

A kubelet, containerd and kube-proxy change the host they run on: sysctls
(the kubelet sets ``vm.overcommit_memory``, ``kernel.panic`` and
``kernel.panic_on_oops``), netfilter rules and tables, links, network
namespaces, mounts, cgroups and files in well-known directories (CNI's result
cache, ``/var/log/containers``, containerd's shim sockets, hostPath volumes).
``capture()`` records all of those; ``undo(before)`` reverts every
difference it finds (sysctls written back, what is new deleted, deepest
first); ``differences(before, after)`` names what is still different, which
must be nothing once a cluster is torn down.

The record is JSON, so a cluster can save it at bring-up and a later run can
undo what a killed run left behind (``tests.cluster.cleanup``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = [
    "SYSCTLS",
    "WATCHED_PATHS",
    "HostState",
    "capture",
    "cgroup_mounts",
    "differences",
    "mount_points",
    "undo",
]

SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
    "net.ipv4.ip_forward",
    "net.ipv4.conf.all.route_localnet",
    "net.ipv6.conf.all.forwarding",
    "net.bridge.bridge-nf-call-iptables",
    "net.bridge.bridge-nf-call-ip6tables",
    "net.netfilter.nf_conntrack_max",
    "net.netfilter.nf_conntrack_tcp_timeout_established",
    "net.netfilter.nf_conntrack_tcp_timeout_close_wait",
)
"""Host sysctls a kubelet, kube-proxy or the tests may write (the host's network namespace)."""

WATCHED_PATHS = (
    "/var/lib/cni",
    "/etc/cni",
    "/opt/cni",
    "/var/log/containers",
    "/var/log/pods",
    "/run/containerd",
    "/var/lib/containerd",
    "/run/netns",
    "/var/lib/kubelet",
    "/etc/kubernetes",
    "/run/xtables.lock",
    "/run/subres",
)
"""Places the node programs write to whatever their configuration says (CNI's result
cache, the kubelet's container log links, containerd's shim sockets, the agent's hostPath)."""


@dataclass(frozen=True)
class HostState:
    """One look at everything a cluster may change (JSON-serialisable)."""

    sysctls: dict[str, str] = field(default_factory=dict)
    netfilter: dict[str, list[str]] = field(default_factory=dict)
    """``iptables-save``-style lines per tool (nft backends and legacy), counters left out."""
    nft_tables: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    netns: list[str] = field(default_factory=list)
    mounts: list[str] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)
    """Directories under `cgroup_base` in every cgroup hierarchy."""
    files: dict[str, list[str]] = field(default_factory=dict)
    """Per watched path: every path under it (itself first) that exists."""
    cgroup_base: str = "/"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> HostState:
        return cls(**json.loads(text))


def capture(*, cgroup_base: str = "/") -> HostState:
    """Everything `undo` can revert, as it is now."""
    return HostState(
        sysctls={name: value for name in SYSCTLS if (value := _sysctl(name)) is not None},
        netfilter={tool: _netfilter(tool) for tool in _NETFILTER_TOOLS if shutil.which(tool)},
        nft_tables=_lines(["nft", "list", "tables"]) if shutil.which("nft") else [],
        links=sorted(p.name for p in Path("/sys/class/net").iterdir()),
        netns=sorted(p.name for p in _listdir(Path("/run/netns"))),
        mounts=mount_points(),
        cgroups=_cgroups(cgroup_base),
        files={path: _tree(Path(path)) for path in WATCHED_PATHS},
        cgroup_base=cgroup_base,
    )


def differences(before: HostState, after: HostState) -> list[str]:
    """What `after` has that `before` did not, or lacks, in words; empty when equal.

    Of mounts, links, network namespaces and cgroups only the new ones count.
    """
    found = [
        f"sysctl {k}: {before.sysctls.get(k)} -> {after.sysctls.get(k)}"
        for k in sorted({*before.sysctls, *after.sysctls})
        if before.sysctls.get(k) != after.sysctls.get(k)
    ]
    for tool in sorted({*before.netfilter, *after.netfilter}):
        found += _set_changes(tool, before.netfilter.get(tool, []), after.netfilter.get(tool, []))
    found += _set_changes("nft_tables", before.nft_tables, after.nft_tables)
    # Mounts, links and namespaces of other programs come and go while a cluster runs
    # (another test run's, on a shared machine); only new ones can be the cluster's.
    for name in ("links", "netns", "mounts", "cgroups"):
        found += [
            c
            for c in _set_changes(name, getattr(before, name), getattr(after, name))
            if c.startswith(f"{name}: + ")
        ]
    for path in sorted({*before.files, *after.files}):
        found += _set_changes(path, before.files.get(path, []), after.files.get(path, []))
    return found


def undo(before: HostState) -> list[str]:
    """Revert whatever differs from `before`; what could not be undone, in words."""
    problems: list[str] = []
    now = capture(cgroup_base=before.cgroup_base)
    for mount in sorted(set(now.mounts) - set(before.mounts), key=len, reverse=True):
        problems += _try(["umount", mount], ["umount", "-l", mount])
    for name in sorted(set(now.netns) - set(before.netns)):
        problems += _try(["ip", "netns", "delete", name])
    for link in sorted(set(now.links) - set(before.links)):
        if Path("/sys/class/net", link).exists():  # a veth's peer goes with it
            problems += _try(["ip", "link", "delete", link])
    # iptables' rules and chains first: an nftables table it made goes with them below.
    for tool, lines in now.netfilter.items():
        problems += _undo_netfilter(tool, before.netfilter.get(tool, []), lines)
    for table in sorted(set(now.nft_tables) - set(before.nft_tables)):
        problems += _try(["nft", "delete", *table.split()])
    for directory in sorted(set(now.cgroups) - set(before.cgroups), key=len, reverse=True):
        for mount in cgroup_mounts():
            with contextlib.suppress(FileNotFoundError):
                try:
                    Path(mount, directory.lstrip("/")).rmdir()
                except OSError as exc:
                    problems.append(f"cgroup {mount}{directory}: {exc}")
    for path, entries in now.files.items():
        problems += _remove_new(entries, set(before.files.get(path, [])))
    for name, value in before.sysctls.items():
        if _sysctl(name) != value:
            _write_sysctl(name, value)
    return problems


# -- sysctls ----------------------------------------------------------------------


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys", *name.split("."))


def _sysctl(name: str) -> str | None:
    try:
        return _sysctl_path(name).read_text().strip()
    except OSError:
        return None


def _write_sysctl(name: str, value: str) -> None:
    _sysctl_path(name).write_text(value + "\n")


# -- netfilter --------------------------------------------------------------------

_NETFILTER_TOOLS = (
    "iptables-save",
    "ip6tables-save",
    "iptables-legacy-save",
    "ip6tables-legacy-save",
)


def _netfilter(tool: str) -> list[str]:
    """Tables, chains and rules as `tool` prints them, without counters or comments."""
    lines = []
    table = ""
    for line in _lines([tool]):
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith(":"):
            lines.append(f"{table} {line.split()[0]}")  # the chain, without policy counters
        elif line.startswith("-A"):
            lines.append(f"{table} {line}")
    return sorted(lines)


def _undo_netfilter(tool: str, before: Sequence[str], now: Sequence[str]) -> list[str]:
    """Delete the rules, then the chains, that are new in `now`."""
    command = tool.removesuffix("-save")
    old = set(before)
    problems: list[str] = []
    new = [line for line in now if line not in old]
    for line in new:
        table, _, rule = line.partition(" ")
        if rule.startswith("-A "):
            problems += _try([command, "-t", table, "-D", *rule[3:].split()])
    for line in new:
        table, _, chain = line.partition(" ")
        if chain.startswith(":"):
            problems += _try([command, "-t", table, "-F", chain[1:]])
    for line in new:
        table, _, chain = line.partition(" ")
        if chain.startswith(":"):
            problems += _try([command, "-t", table, "-X", chain[1:]])
    return problems


# -- mounts, cgroups, files ---------------------------------------------------------


def mount_points() -> list[str]:
    """Every mount point of this mount namespace."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        points.append(point.encode().decode("unicode_escape"))
    return sorted(points)


def cgroup_mounts() -> list[str]:
    """Where every cgroup hierarchy (v1 and v2) is mounted."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        before, _, after = line.partition(" - ")
        if after.split()[0] in ("cgroup", "cgroup2"):
            mounts.append(before.split()[4])
    return sorted(mounts)


def _cgroups(base: str) -> list[str]:
    found = set()
    for mount in cgroup_mounts():
        root = Path(mount, base.lstrip("/"))
        for directory, subdirs, _ in os.walk(root):
            for sub in subdirs:
                found.add("/" + str(Path(directory, sub).relative_to(mount)))
    return sorted(found)


def _tree(root: Path) -> list[str]:
    if not root.exists() and not root.is_symlink():
        return []
    found = [str(root)]
    if root.is_dir() and not root.is_symlink():
        for directory, subdirs, files in os.walk(root):
            found += [str(Path(directory, name)) for name in [*subdirs, *files]]
    return sorted(found)


def _remove_new(entries: Iterable[str], old: set[str]) -> list[str]:
    problems = []
    for entry in sorted(set(entries) - old, key=len, reverse=True):
        path = Path(entry)
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        except OSError as exc:
            problems.append(f"{entry}: {exc}")
    return problems


def _listdir(path: Path) -> list[Path]:
    try:
        return list(path.iterdir())
    except OSError:
        return []


# -- running commands ----------------------------------------------------------------


def _lines(args: Sequence[str]) -> list[str]:
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    return [line for line in proc.stdout.splitlines() if line and not line.startswith("#")]


def _try(*attempts: Sequence[str]) -> list[str]:
    """Run each command until one succeeds; the last failure, if all failed."""
    error = ""
    for args in attempts:
        proc = subprocess.run(args, capture_output=True, text=True, check=False)
        if proc.returncode == 0:
            return []
        error = f"{' '.join(args)}: {proc.stderr.strip()}"
    return [error]


def _set_changes(what: str, before: Iterable[str], after: Iterable[str]) -> list[str]:
    old, new = set(before), set(after)
    return [f"{what}: + {item}" for item in sorted(new - old)] + [
        f"{what}: - {item}" for item in sorted(old - new)
    ]
