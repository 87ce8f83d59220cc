"""client-go exec credential plugins, as kubeconfig `users[].user.exec` names them.

Owns running the plugin (command, args, env, `KUBERNETES_EXEC_INFO`) and
reading the `ExecCredential` it prints: a bearer token or a client
certificate and key, and when it expires (`subres.cli.credentials` runs the
plugin again then). Real clusters (EKS, GKE, AKS, OIDC logins) hand out
credentials this way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = ["API_VERSIONS", "Credential", "ExecPluginError", "run"]

API_VERSIONS = (
    "client.authentication.k8s.io/v1",
    "client.authentication.k8s.io/v1beta1",
)


class ExecPluginError(Exception):
    """The plugin is misconfigured, missing, failed, or printed no usable credential."""


@dataclass(frozen=True)
class Credential:
    """What a plugin printed: a token, or a PEM client certificate and key."""

    token: str | None = None
    client_certificate: bytes | None = None
    client_key: bytes | None = None
    expires: float | None = None
    """`expirationTimestamp` as a Unix time; None when the credential names none."""


def run(
    spec: Mapping[str, Any],
    *,
    base: Path,
    cluster: Mapping[str, Any] | None,
    environ: Mapping[str, str],
) -> Credential:
    """Run the plugin `spec` describes and read its credential.

    `base` is the directory of the kubeconfig that defined it (a command with
    a slash in it is relative to that); `cluster` is passed to the plugin when
    it asks for cluster info.
    """
    api_version = str(spec.get("apiVersion", ""))
    if api_version not in API_VERSIONS:
        raise ExecPluginError(
            f"exec plugin apiVersion {api_version!r} is not supported; use one of "
            + ", ".join(API_VERSIONS)
        )
    command = _command(spec, base)
    interactive = _interactive(spec)
    env = _environment(spec, environ)
    env["KUBERNETES_EXEC_INFO"] = json.dumps(
        _exec_info(api_version, interactive, cluster if spec.get("provideClusterInfo") else None)
    )
    output = _execute(spec, [command, *map(str, spec.get("args") or [])], env, interactive)
    return _credential(output, api_version, command)


def _command(spec: Mapping[str, Any], base: Path) -> str:
    command = str(spec.get("command") or "")
    if not command:
        raise ExecPluginError("exec plugin has no command")
    # As kubectl does: a bare name is looked up in PATH, a path is relative to the kubeconfig.
    if os.sep in command and not os.path.isabs(command):
        return str(base / command)
    return command


def _interactive(spec: Mapping[str, Any]) -> bool:
    mode = spec.get("interactiveMode") or "IfAvailable"
    has_terminal = sys.stdin.isatty()
    if mode == "Never":
        return False
    if mode == "IfAvailable":
        return has_terminal
    if mode == "Always":
        if not has_terminal:
            raise ExecPluginError(
                "exec plugin needs an interactive terminal (interactiveMode Always)"
            )
        return True
    raise ExecPluginError(f"exec plugin has an unknown interactiveMode {mode!r}")


def _environment(spec: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, str]:
    env = dict(environ)
    for item in spec.get("env") or []:
        if not isinstance(item, Mapping) or not item.get("name"):
            raise ExecPluginError("exec plugin env entries need a name and a value")
        env[str(item["name"])] = str(item.get("value", ""))
    return env


def _exec_info(
    api_version: str, interactive: bool, cluster: Mapping[str, Any] | None
) -> dict[str, Any]:
    spec: dict[str, Any] = {"interactive": interactive}
    if cluster is not None:
        spec["cluster"] = dict(cluster)
    return {"apiVersion": api_version, "kind": "ExecCredential", "spec": spec}


def _execute(
    spec: Mapping[str, Any], argv: list[str], env: dict[str, str], interactive: bool
) -> bytes:
    # The plugin's stderr is the user's: logins print prompts and links there.
    try:
        done = subprocess.run(
            argv,
            stdin=None if interactive else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            env=env,
            check=False,
        )
    except OSError as exc:
        hint = spec.get("installHint")
        raise ExecPluginError(
            f"cannot run exec plugin {argv[0]}: {exc.strerror or exc}"
            + (f"\n{hint}" if hint else "")
        ) from None
    if done.returncode != 0:
        raise ExecPluginError(f"exec plugin {argv[0]} failed with exit code {done.returncode}")
    return done.stdout


def _credential(output: bytes, api_version: str, command: str) -> Credential:
    try:
        obj = json.loads(output)
    except ValueError:
        raise ExecPluginError(f"exec plugin {command} did not print JSON") from None
    if not isinstance(obj, dict) or obj.get("kind") != "ExecCredential":
        raise ExecPluginError(f"exec plugin {command} did not print an ExecCredential")
    if obj.get("apiVersion") != api_version:
        raise ExecPluginError(
            f"exec plugin {command} answered {obj.get('apiVersion')!r}, expected {api_version!r}"
        )
    status = obj.get("status") or {}
    token = status.get("token")
    cert = status.get("clientCertificateData")
    key = status.get("clientKeyData")
    if bool(cert) != bool(key):
        raise ExecPluginError(
            f"exec plugin {command} must print clientCertificateData and clientKeyData together"
        )
    if not token and not cert:
        raise ExecPluginError(f"exec plugin {command} printed neither a token nor a certificate")
    return Credential(
        token=str(token) if token else None,
        client_certificate=str(cert).encode() if cert else None,
        client_key=str(key).encode() if key else None,
        expires=_expiry(status.get("expirationTimestamp"), command),
    )


def _expiry(value: object, command: str) -> float | None:
    """An RFC 3339 time (`2024-05-01T10:00:00Z`) as a Unix time."""
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(str(value))
    except ValueError:
        raise ExecPluginError(
            f"exec plugin {command} printed an expirationTimestamp that is not RFC 3339: {value!r}"
        ) from None
    if moment.tzinfo is None:
        raise ExecPluginError(f"exec plugin {command}'s expirationTimestamp has no time zone")
    return moment.timestamp()
