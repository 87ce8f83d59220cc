"""The demo's state directory: what it writes there, and what it removes when it stops.

A demo writes, in a directory only its user may enter (0700), files only its
user may read (0600): certificates and their CA key, a random token, a
kubeconfig holding that token, the machines file holding the console's SSH
key, the configuration, the shell's readline settings and the display's
socket. They are made afresh at every start and removed at stop (`remove`),
so no key or token outlives the demo. What the user made stays: the console
recordings (`recordings/`) and the audit log of their sessions
(`sessions.jsonl`), to replay and read after the demo stopped.
"""

from __future__ import annotations

import base64
import contextlib
import secrets
import shutil
from pathlib import Path

import yaml

from subres.demo.sshd import SshShellServer
from subres.serving import certs

__all__ = [
    "ADDRESS",
    "AUDIT",
    "KEPT",
    "RECORDINGS",
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
KEPT = (RECORDINGS, AUDIT)
"""What `remove` leaves: the user's recordings and the audit of their sessions."""
GENERATED = (CERTS, TOKENS, KUBECONFIG, MACHINES, CONFIG, "inputrc", "vnc.sock", "demo.lock")
"""What a demo writes and `remove` deletes (the lock last, once the rest is gone)."""
RECORD_ANNOTATION = "subres.dev/record-console"


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
    """The machines file: `demo` (running, its console recorded), `stopped`, the SSH Secret."""

    def machine(name: str, phase: str, annotations: dict[str, str]) -> dict[str, object]:
        return {
            "apiVersion": "subres.dev/v1alpha1",
            "kind": "Machine",
            "metadata": {"name": name, "namespace": "default", "annotations": annotations},
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
        "metadata": {"name": "demo-console", "namespace": "default"},
        "stringData": {"ssh-privatekey": key, "known_hosts": console.known_hosts()},
    }
    header = "# Machines the demo serves; edit me, subres re-reads this file.\n"
    documents = [
        machine("demo", "Running", {RECORD_ANNOTATION: "true"}),
        machine("stopped", "Stopped", {}),
        login,
    ]
    path = state_dir / MACHINES
    # It holds the console's SSH key.
    _private(path).write_text(header + yaml.safe_dump_all(documents, sort_keys=False))
    return path


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
    """Delete what the demo wrote (keys, token, kubeconfig, lock); keep `KEPT`."""
    for name in GENERATED:
        path = state_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def _private(path: Path) -> Path:
    """`path`, created empty and readable by its owner only, before anything is written."""
    path.touch(mode=0o600)
    path.chmod(0o600)
    return path


def _write_yaml(path: Path, data: object) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
