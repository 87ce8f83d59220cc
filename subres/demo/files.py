"""The demo's state directory: what it writes there, and what it removes when it stops.

A demo writes, in a directory only its user may enter (0700), files only its
user may read (0600): certificates and their CA key, a random token, a
kubeconfig holding that token, the machines file holding the console's SSH
key, the configuration, the shell's readline settings and the display's
socket. They are made afresh at every start and removed at stop (`remove`),
so no key or token outlives the demo. What the user made stays: the console
recordings (`recordings/`), the audit log of their sessions
(`sessions.jsonl`), and the machines file the banner invites them to edit,
without the console's key. The next start reads it back: the machines the
user added and what they changed stay, and only the endpoints of the demo's
own machines (`demo`, `stopped`: this run's ports) and its key are made afresh.
"""

from __future__ import annotations

import base64
import contextlib
import secrets
import shutil
from pathlib import Path
from typing import Any

import yaml

from subres.demo.sshd import SshShellServer
from subres.serving import certs

__all__ = [
    "ADDRESS",
    "AUDIT",
    "KEPT",
    "MACHINES",
    "RECORDINGS",
    "MachinesError",
    "config",
    "kubeconfig",
    "machines",
    "remove",
    "token",
    "tokens",
]

ADDRESS = "127.0.0.1"
CERTS = "certs"
TOKENS = "tokens.csv"
KUBECONFIG = "kubeconfig"
MACHINES = "machines.yaml"
CONFIG = "config.yaml"
RECORDINGS = "recordings"
AUDIT = "sessions.jsonl"
KEPT = (MACHINES, RECORDINGS, AUDIT)
"""What `remove` leaves: the user's machines (without the key), recordings and audit."""
GENERATED = (CERTS, TOKENS, KUBECONFIG, CONFIG, "inputrc", "vnc.sock", "demo.lock")
"""What a demo writes and `remove` deletes (the lock last, once the rest is gone)."""
RECORD_ANNOTATION = "subres.dev/record-console"
NAMESPACE = "default"
OWN_MACHINES = ("demo", "stopped")
LOGIN = "demo-console"
"""The Secret holding the console's SSH key: this run's, never kept."""
RUN_FIELDS = ("console", "vnc", "portForward")
"""The fields of the demo's own machines' `status` that name this run's endpoints."""
HEADER = (
    "# Machines the demo serves; edit me, subres re-reads this file.\n"
    "# Kept when the demo stops (without the console's key); the next start keeps your\n"
    "# changes and gives the demo's own machines (demo, stopped) that run's endpoints.\n"
)
PRIVATE_KEY = "PRIVATE KEY-----"
"""What a file holding a private key contains (PEM and OpenSSH armour)."""


class MachinesError(Exception):
    """The kept machines file cannot be read back; the message says which and why."""


def serving_pair(state_dir: Path) -> certs.ServingFiles:
    """A fresh CA and serving certificate for this run."""
    shutil.rmtree(state_dir / CERTS, ignore_errors=True)
    return certs.ensure_self_signed(state_dir / CERTS, service="subres", namespace="subres-system")


def tokens(state_dir: Path) -> Path:
    """A static token file with one fresh random token, for the user `demo`."""
    path = state_dir / TOKENS
    _private(path).write_text(f'{secrets.token_urlsafe(32)},demo,demo-uid,"demo-users"\n')
    return path


def token(state_dir: Path) -> str:
    """This run's token."""
    return (state_dir / TOKENS).read_text().split(",", 1)[0]


def config(state_dir: Path) -> Path:
    """The server configuration: the Machine CRD, a loopback policy, recordings on."""
    running = {".status.phase": ["Running"]}
    vnc = {"endpoint": ".status.vnc.endpoint", "require": running}
    console = {
        "endpoint": ".status.console.endpoint",
        "require": running,
        "ssh": {"credentials": ".status.console.sshSecret"},
    }
    forward = {
        "address": ".status.portForward.address",
        "ports": ".status.portForward.ports",
        "require": running,
    }
    parent = {
        "resource": "machines",
        "kind": "Machine",
        "source": {"group": "subres.dev", "version": "v1alpha1"},
        "subresources": {"console": console, "vnc": vnc, "screenshot": vnc, "portforward": forward},
    }
    doc = {
        "endpointPolicy": {
            "schemes": ["unix", "tcp", "ssh"],
            # Loopback only: the default policy denies it, the demo's machines live there.
            "allowCIDRs": ["127.0.0.0/8", "::1/128"],
            "denyCIDRs": [],
            "socketDirs": [str(state_dir)],
        },
        "parents": [parent],
        # Machines annotated to be recorded (the demo machine is) are recorded here.
        "consoles": {"recordings": {"directory": str(state_dir / RECORDINGS)}},
    }
    return _write_yaml(state_dir / CONFIG, doc)


def machines(state_dir: Path, *, web_port: int, console: SshShellServer) -> Path:
    """The machines file: `demo` (running, its console recorded), `stopped`, the SSH Secret,
    and what a kept file from an earlier run holds (`MachinesError` if it cannot be read)."""

    def machine(name: str, phase: str, annotations: dict[str, str]) -> dict[str, object]:
        return {
            "apiVersion": "subres.dev/v1alpha1",
            "kind": "Machine",
            "metadata": {"name": name, "namespace": NAMESPACE, "annotations": annotations},
            "status": {
                "phase": phase,
                "console": {
                    "endpoint": f"ssh://demo@{ADDRESS}:{console.port}",
                    "sshSecret": "demo-console",
                },
                "vnc": {"endpoint": f"unix://{state_dir / 'vnc.sock'}"},
                "portForward": {"address": ADDRESS, "ports": [web_port]},
            },
        }

    key = bytes(console.client_private.export_private_key("openssh")).decode()
    login = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": LOGIN, "namespace": NAMESPACE},
        "stringData": {"ssh-privatekey": key, "known_hosts": console.known_hosts()},
    }
    fresh = [
        machine("demo", "Running", {RECORD_ANNOTATION: "true"}),
        machine("stopped", "Stopped", {}),
    ]
    path = state_dir / MACHINES
    documents = [*_merged(_kept(path), fresh), login]
    # It holds the console's SSH key.
    _private(path).write_text(HEADER + yaml.safe_dump_all(documents, sort_keys=False))
    return path


def _kept(path: Path) -> list[dict[str, Any]]:
    """The documents of an earlier run's machines file; none when there is no such file."""
    try:
        documents = _documents(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError, yaml.YAMLError, ValueError) as exc:
        raise MachinesError(
            f"{path}, kept from an earlier run, cannot be read back ({exc}); "
            "fix it, or remove it to start with the demo's machines alone"
        ) from None
    return documents


def _documents(text: str) -> list[dict[str, Any]]:
    documents = [d for d in yaml.safe_load_all(text) if d is not None]
    if not all(isinstance(d, dict) for d in documents):
        raise ValueError("every document must be a mapping")
    return documents


def _merged(kept: list[dict[str, Any]], fresh: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`kept` with this run's endpoints in the demo's own machines; those missing, `fresh`."""
    by_name = {_own(d): d for d in fresh}
    out: list[dict[str, Any]] = []
    for document in kept:
        name = _own(document)
        if name == LOGIN:
            continue  # the key is this run's: `fresh`'s caller adds it
        if name in by_name:
            status = document.setdefault("status", {})
            if isinstance(status, dict):
                status.update({f: by_name[name]["status"][f] for f in RUN_FIELDS})
            by_name.pop(name)
        out.append(document)
    return [*by_name.values(), *out]


def _own(document: dict[str, Any]) -> str | None:
    """The name of one of the demo's own objects (its machines, its Secret); else None."""
    meta = document.get("metadata")
    if not isinstance(meta, dict) or meta.get("namespace", NAMESPACE) != NAMESPACE:
        return None
    kind, name = document.get("kind"), meta.get("name")
    if (kind == "Machine" and name in OWN_MACHINES) or (kind == "Secret" and name == LOGIN):
        return str(name)
    return None


def kubeconfig(state_dir: Path, port: int) -> Path:
    """A kubeconfig with the server's address, its CA and the demo token."""
    ca = (state_dir / CERTS / "ca.crt").read_bytes()
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "subres-demo",
                "cluster": {
                    "server": f"https://{ADDRESS}:{port}",
                    "certificate-authority-data": base64.b64encode(ca).decode(),
                },
            }
        ],
        "users": [{"name": "demo", "user": {"token": token(state_dir)}}],
        "contexts": [
            {
                "name": "subres-demo",
                "context": {"cluster": "subres-demo", "user": "demo", "namespace": "default"},
            }
        ],
        "current-context": "subres-demo",
    }
    return _write_yaml(_private(state_dir / KUBECONFIG), doc)


def remove(state_dir: Path) -> None:
    """Delete what the demo wrote (keys, token, kubeconfig, lock); keep `KEPT`, the
    machines file without the console's key."""
    _strip_key(state_dir / MACHINES)
    for name in GENERATED:
        path = state_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def _strip_key(path: Path) -> None:
    """The machines file less the Secret holding the key; removed if it cannot be read,
    as long as it may hold a key."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return
    except (OSError, UnicodeDecodeError):
        path.unlink(missing_ok=True)  # not ours to read back: it may hold the key
        return
    try:
        documents = [d for d in _documents(text) if _own(d) != LOGIN]
    except (yaml.YAMLError, ValueError):
        if PRIVATE_KEY in text:
            path.unlink(missing_ok=True)
        return
    path.write_text(HEADER + yaml.safe_dump_all(documents, sort_keys=False))


def _private(path: Path) -> Path:
    """`path`, created empty and readable by its owner only, before anything is written."""
    path.touch(mode=0o600)
    path.chmod(0o600)
    return path


def _write_yaml(path: Path, data: object) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
