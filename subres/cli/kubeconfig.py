"""Reading kubeconfig files the way kubectl does, into what a client needs.

Owns finding the files (`--kubeconfig`, else `KUBECONFIG`'s list merged with
the first file to set a name winning, else `~/.kube/config`), choosing the
context and namespace, resolving paths relative to the file that named them,
and turning the cluster and user into a server URL, an `ssl.SSLContext`, a
proxy and the user's `Credentials` (exec credential plugins run through
`subres.cli.execplugin`, again whenever `subres.cli.credentials` says so).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import functools
import os
import ssl
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from subres.cli import execplugin
from subres.cli.credentials import Credentials, headers_for

__all__ = ["ClientConfig", "KubeconfigError", "from_args", "load"]

DEFAULT_NAMESPACE = "default"


class KubeconfigError(Exception):
    """The kubeconfig is missing, unreadable, or does not describe a usable context."""


@dataclass(frozen=True)
class ClientConfig:
    """How to reach and authenticate to the API server of one context."""

    server: str
    """The cluster's base URL, e.g. `https://10.0.0.1:6443` (may carry a path prefix)."""
    ssl: ssl.SSLContext | None
    """TLS settings for an `https` server; None for plain `http`."""
    server_hostname: str | None
    """`tls-server-name`: the name to send as SNI and verify the certificate against."""
    credentials: Credentials
    """What every request carries (`Authorization`), kept fresh for exec plugins."""
    namespace: str
    """The namespace to work in: `-n`, else the context's, else `default`."""
    context: str
    """The name of the context in use."""
    proxy: str | None = None
    """`proxy-url`: the http(s) proxy every connection goes through; None: the environment's."""

    @property
    def headers(self) -> Mapping[str, str]:
        """The credentials' headers as they are now."""
        return self.credentials.headers


@dataclass
class _Named:
    """One cluster, user or context entry and the directory of the file that defined it."""

    fields: Mapping[str, Any]
    base: Path


@dataclass
class _Merged:
    """Every file's entries merged; the first file to name something wins."""

    current_context: str = ""
    clusters: dict[str, _Named] = field(default_factory=dict)
    users: dict[str, _Named] = field(default_factory=dict)
    contexts: dict[str, _Named] = field(default_factory=dict)


_SECTIONS = (("clusters", "cluster"), ("users", "user"), ("contexts", "context"))


def from_args(ns: argparse.Namespace) -> ClientConfig:
    """The configuration the `--kubeconfig`, `--context` and `-n` flags select."""
    return load(
        kubeconfig=getattr(ns, "kubeconfig", None),
        context=getattr(ns, "context", None),
        namespace=getattr(ns, "namespace", None),
    )


def load(
    *,
    kubeconfig: str | None = None,
    context: str | None = None,
    namespace: str | None = None,
    environ: Mapping[str, str] = os.environ,
) -> ClientConfig:
    """Read the kubeconfig and resolve one context into a `ClientConfig`."""
    merged = _merge(_paths(kubeconfig, environ))
    name = context or merged.current_context
    if not name:
        raise KubeconfigError("no context chosen: set current-context or pass --context")
    ctx = merged.contexts.get(name)
    if ctx is None:
        raise KubeconfigError(f'context "{name}" not found in the kubeconfig')
    cluster = _referenced(merged.clusters, ctx.fields.get("cluster"), "cluster", name)
    if cluster is None:
        raise KubeconfigError(f'context "{name}" names no cluster')
    user = _referenced(merged.users, ctx.fields.get("user"), "user", name)
    return _client_config(
        name,
        cluster=cluster,
        user=user,
        namespace=namespace or str(ctx.fields.get("namespace") or DEFAULT_NAMESPACE),
        environ=environ,
    )


def _paths(explicit: str | None, environ: Mapping[str, str]) -> list[Path]:
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise KubeconfigError(f"kubeconfig {explicit} does not exist")
        return [path]
    listed = environ.get("KUBECONFIG", "")
    if listed:
        # As client-go does: missing files in the list are skipped, duplicates read once.
        paths = list(dict.fromkeys(Path(p).expanduser() for p in listed.split(os.pathsep) if p))
        existing = [p for p in paths if p.is_file()]
        if not existing:
            raise KubeconfigError(f"none of the files in KUBECONFIG={listed} exist")
        return existing
    home = Path(environ.get("HOME") or Path.home())
    default = home / ".kube" / "config"
    if not default.is_file():
        raise KubeconfigError(f"no kubeconfig: {default} does not exist (pass --kubeconfig)")
    return [default]


def _merge(paths: list[Path]) -> _Merged:
    merged = _Merged()
    for path in paths:
        doc = _read(path)
        base = path.absolute().parent
        merged.current_context = merged.current_context or str(doc.get("current-context") or "")
        for section, key in _SECTIONS:
            target: dict[str, _Named] = getattr(merged, section)
            for item in doc.get(section) or []:
                if isinstance(item, Mapping) and item.get("name"):
                    target.setdefault(str(item["name"]), _Named(item.get(key) or {}, base))
    return merged


def _read(path: Path) -> Mapping[str, Any]:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise KubeconfigError(f"cannot read kubeconfig {path}: {exc}") from None
    if doc is None:
        return {}
    if not isinstance(doc, Mapping):
        raise KubeconfigError(f"kubeconfig {path} is not a YAML mapping")
    return doc


def _referenced(entries: dict[str, _Named], name: object, kind: str, context: str) -> _Named | None:
    if not name:
        return None
    entry = entries.get(str(name))
    if entry is None:
        raise KubeconfigError(f'{kind} "{name}" of context "{context}" not found in the kubeconfig')
    return entry


def _client_config(
    context: str,
    *,
    cluster: _Named,
    user: _Named | None,
    namespace: str,
    environ: Mapping[str, str],
) -> ClientConfig:
    server = str(cluster.fields.get("server") or "")
    scheme = urlsplit(server).scheme
    if scheme not in ("https", "http"):
        raise KubeconfigError(
            f'context "{context}": cluster server {server!r} is not an http(s) URL'
        )
    headers, cert, plugin = _user(user, cluster, environ)
    current = plugin() if plugin is not None else None
    if current is not None:
        headers = headers_for(current.token, None)
        if current.client_certificate and current.client_key:
            cert = (current.client_certificate, current.client_key)
    tls = _ssl_context(cluster, cert) if scheme == "https" else None
    reload = functools.partial(_load_client_cert, tls) if tls is not None else None
    return ClientConfig(
        server=server.rstrip("/"),
        ssl=tls,
        server_hostname=cluster.fields.get("tls-server-name") or None,
        credentials=Credentials(headers, plugin=plugin, current=current, reload_certificate=reload),
        namespace=namespace,
        context=context,
        proxy=_proxy(cluster, context),
    )


Plugin = Callable[[], execplugin.Credential]


def _user(
    user: _Named | None, cluster: _Named, environ: Mapping[str, str]
) -> tuple[dict[str, str], tuple[bytes, bytes] | None, Plugin | None]:
    """Fixed headers, a client certificate with key (PEM), and the exec plugin to run if any."""
    if user is None:
        return {}, None, None
    fields = user.fields
    cert = _pem_pair(user)
    # The kubeconfig reference: a token takes precedence over tokenFile.
    token = fields.get("token") or _file_text(user, "tokenFile")
    if not token and cert is None and fields.get("exec"):
        return {}, None, functools.partial(_exec, user, cluster, environ)
    username = fields.get("username")
    basic = (str(username), str(fields.get("password") or "")) if username else None
    return headers_for(token, basic), cert, None


def _proxy(cluster: _Named, context: str) -> str | None:
    url = cluster.fields.get("proxy-url")
    if not url:
        return None
    scheme = urlsplit(str(url)).scheme
    if scheme not in ("http", "https"):
        raise KubeconfigError(
            f'context "{context}": proxy-url {url!r}: subres supports http and https proxies '
            f"(not {scheme or 'a URL without a scheme'})"
        )
    return str(url)


def _exec(user: _Named, cluster: _Named, environ: Mapping[str, str]) -> execplugin.Credential:
    fields = cluster.fields
    info = {
        "server": fields.get("server"),
        "tls-server-name": fields.get("tls-server-name"),
        "insecure-skip-tls-verify": bool(fields.get("insecure-skip-tls-verify")),
        "certificate-authority-data": fields.get("certificate-authority-data")
        or _b64_file(cluster, "certificate-authority"),
    }
    try:
        return execplugin.run(
            user.fields["exec"],
            base=user.base,
            cluster={k: v for k, v in info.items() if v},
            environ=environ,
        )
    except execplugin.ExecPluginError as exc:
        raise KubeconfigError(str(exc)) from None


def _pem_pair(user: _Named) -> tuple[bytes, bytes] | None:
    cert = _data_or_file(user, "client-certificate")
    key = _data_or_file(user, "client-key")
    if (cert is None) != (key is None):
        raise KubeconfigError("a client certificate needs its key and the other way round")
    return (cert, key) if cert is not None and key is not None else None


def _ssl_context(cluster: _Named, cert: tuple[bytes, bytes] | None) -> ssl.SSLContext:
    ca = _data_or_file(cluster, "certificate-authority")
    insecure = bool(cluster.fields.get("insecure-skip-tls-verify"))
    if insecure and ca is not None:
        raise KubeconfigError(
            "a cluster may not set both a certificate authority and insecure-skip-tls-verify"
        )
    try:
        # With a CA given, only that CA is trusted, as in kubectl; else the system's roots.
        if ca is None:
            context = ssl.create_default_context()
        elif b"-----BEGIN" in ca:
            context = ssl.create_default_context(cadata=ca.decode("ascii", "replace"))
        else:
            context = ssl.create_default_context(cadata=ca)
        if insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if cert is not None:
            _load_client_cert(context, *cert)
    except ssl.SSLError as exc:
        raise KubeconfigError(f"bad TLS material in the kubeconfig: {exc}") from None
    return context


def _load_client_cert(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    # ssl reads certificates only from files: a private directory that lives a moment.
    with tempfile.TemporaryDirectory(prefix="subres-") as tmp:
        cert_path, key_path = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
        for path, data in ((cert_path, cert), (key_path, key)):
            path.touch(mode=0o600)
            path.write_bytes(data)
        context.load_cert_chain(cert_path, key_path)


def _data_or_file(entry: _Named, name: str) -> bytes | None:
    """`name-data` (base64, wins) or the file `name` points to."""
    data = entry.fields.get(f"{name}-data")
    if data:
        try:
            return base64.b64decode(str(data), validate=True)
        except binascii.Error:
            raise KubeconfigError(f"{name}-data is not valid base64") from None
    path = entry.fields.get(name)
    return _read_bytes(entry.base / str(path)) if path else None


def _b64_file(entry: _Named, name: str) -> str | None:
    path = entry.fields.get(name)
    return base64.b64encode(_read_bytes(entry.base / str(path))).decode() if path else None


def _file_text(entry: _Named, name: str) -> str | None:
    path = entry.fields.get(name)
    return _read_bytes(entry.base / str(path)).decode().strip() if path else None


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise KubeconfigError(f"cannot read {path}: {exc.strerror or exc}") from None
