"""Authentication configuration behind a cluster: flags, and the cluster's ConfigMap.

kube-apiserver publishes how it proxies to aggregated servers in
`kube-system/extension-apiserver-authentication`: the client CA, the
front-proxy (request-header) CA, allowed proxy names and header names. This
module owns that configuration: it is read at start (`load`), kept current by
an informer (this object is its `Sink`), and overridden piece by piece by
flags (`--client-ca-file`, `--requestheader-client-ca-file` and friends) as
kube's delegating authentication does. The CA bundles that came from the
ConfigMap are written to files, because the TLS context trusts CAs by file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cryptography import x509

from subres.auth.cafile import CAFile
from subres.auth.requestheader import FrontProxy, RequestHeaderConfig
from subres.kube.client import Api, ApiError

__all__ = [
    "CONFIGMAP",
    "NAMESPACE",
    "AuthenticationFiles",
    "AuthenticationSource",
    "ConfigLookupError",
    "Snapshot",
    "parse",
]

log = logging.getLogger(__name__)

NAMESPACE = "kube-system"
CONFIGMAP = "extension-apiserver-authentication"
FORBIDDEN, NOT_FOUND = 403, 404


class ConfigLookupError(Exception):
    """The ConfigMap could not be read at start."""


@dataclass(frozen=True)
class Snapshot:
    """What the ConfigMap says."""

    client_ca_pem: bytes = b""
    """`client-ca-file`: CAs of client certificates (CN = user, O = groups)."""
    requestheader_ca_pem: bytes = b""
    """`requestheader-client-ca-file`: CAs of front-proxy certificates."""
    requestheader: RequestHeaderConfig = field(default_factory=RequestHeaderConfig)
    """The front-proxy settings, CAs parsed."""


@dataclass(frozen=True)
class AuthenticationFiles:
    """Where configuration comes from when flags give it, and where ConfigMap CAs go."""

    directory: Path
    """Where the ConfigMap's CA bundles are written for the TLS context."""
    client_ca_file: Path | None = None
    """`--client-ca-file`; when set, the ConfigMap's client CA is ignored."""
    requestheader_client_ca_file: Path | None = None
    """`--requestheader-client-ca-file`; when set, all request-header settings come from flags."""
    requestheader: RequestHeaderConfig = field(default_factory=RequestHeaderConfig)
    """The `--requestheader-*` names (used with `requestheader_client_ca_file`)."""
    skip_lookup: bool = False
    """`--authentication-skip-lookup`: never read the ConfigMap, whatever flags leave out."""


def parse(data: Mapping[str, Any]) -> Snapshot:
    """The ConfigMap's `data`; raises ValueError when a value is malformed."""
    rh_pem = str(data.get("requestheader-client-ca-file") or "").encode()
    return Snapshot(
        client_ca_pem=str(data.get("client-ca-file") or "").encode(),
        requestheader_ca_pem=rh_pem,
        requestheader=RequestHeaderConfig(
            client_ca=_certificates(rh_pem),
            allowed_names=_names(data, "requestheader-allowed-names"),
            username_headers=_names(data, "requestheader-username-headers"),
            uid_headers=_names(data, "requestheader-uid-headers"),
            group_headers=_names(data, "requestheader-group-headers"),
            extra_headers_prefixes=_names(data, "requestheader-extra-headers-prefix"),
        ),
    )


class AuthenticationSource:
    """The CAs and front-proxy settings in force; an informer `Sink` for the ConfigMap."""

    def __init__(self, files: AuthenticationFiles) -> None:
        """Read the flag-given CA files now (raises ValueError when one holds no CA)."""
        self.files = files
        self._client_ca = CAFile(files.client_ca_file) if files.client_ca_file else None
        rh_file = files.requestheader_client_ca_file
        self._requestheader_ca = CAFile(rh_file) if rh_file else None
        self._cluster = Snapshot()
        self._loaded = not self.needs_lookup
        self._written: dict[Path, bytes] = {}
        # The reload thread and the event loop both rebuild; one at a time.
        self._lock = threading.Lock()
        self.client_ca: tuple[x509.Certificate, ...] = ()
        """CAs whose certificates authenticate as CN/O."""
        self.front_proxy: FrontProxy | None = None
        """The front-proxy authenticator, or None when no request-header CA is known."""
        self._rebuild()

    @property
    def needs_lookup(self) -> bool:
        """Whether some configuration must come from the ConfigMap."""
        if self.files.skip_lookup:
            return False
        return self._client_ca is None or self._requestheader_ca is None

    @property
    def ca_paths(self) -> tuple[Path, Path]:
        """The client CA and request-header CA files the TLS context trusts."""
        client = self.files.client_ca_file or self.files.directory / "client-ca.crt"
        proxy = self.files.requestheader_client_ca_file
        return client, proxy or self.files.directory / "requestheader-client-ca.crt"

    @property
    def ready(self) -> bool:
        """Loaded at start (or tolerated not to be), and the CA files on disk are current."""
        return self._loaded and not self._pending()

    async def load(self, api: Api, *, tolerate: bool) -> None:
        """Read the ConfigMap once; raises `ConfigLookupError` unless `tolerate`."""
        try:
            self.upsert(await api.read_configmap(NAMESPACE, CONFIGMAP))
        except ApiError as exc:
            if exc.status != NOT_FOUND:
                problem = _lookup_problem(exc)
                if not tolerate:
                    raise ConfigLookupError(problem) from None
                log.warning("%s; continuing without it", problem)
            else:
                log.warning("%s/%s not found; front-proxy authentication off", NAMESPACE, CONFIGMAP)
        self._loaded = True

    def replace(self, objects: Iterable[Mapping[str, Any]]) -> None:
        """A listing of the ConfigMap: it or nothing."""
        found = list(objects)
        if found:
            self.upsert(found[0])
        else:
            self._apply(Snapshot())

    def upsert(self, obj: Mapping[str, Any]) -> None:
        """The ConfigMap changed; a malformed one keeps the previous configuration."""
        data = obj.get("data")
        try:
            snapshot = parse(data if isinstance(data, dict) else {})
        except ValueError as exc:
            log.error("%s/%s ignored: %s", NAMESPACE, CONFIGMAP, exc)
            return
        self._apply(snapshot)

    def delete(self, obj: Mapping[str, Any]) -> None:
        """The ConfigMap is gone: nothing from it is trusted any more."""
        self._apply(Snapshot())

    def reload_if_changed(self) -> bool:
        """Follow the flag-given CA files; write the ConfigMap's CAs where TLS reads them."""
        changed = False
        for ca_file in (self._client_ca, self._requestheader_ca):
            changed = (ca_file is not None and ca_file.reload_if_changed()) or changed
        if changed:
            self._rebuild()
        for path, pem in self._pending().items():
            _write(path, pem)
            self._written[path] = pem
            changed = True
        return changed

    def _apply(self, snapshot: Snapshot) -> None:
        self._cluster = snapshot
        self._rebuild()

    def _rebuild(self) -> None:
        with self._lock:
            cluster = self._cluster
            if self._client_ca is not None:
                self.client_ca = tuple(self._client_ca.certificates)
            else:
                self.client_ca = _certificates(cluster.client_ca_pem)
            if self._requestheader_ca is not None:
                ca = tuple(self._requestheader_ca.certificates)
                config = replace(self.files.requestheader, client_ca=ca)
            else:
                config = cluster.requestheader
            self.front_proxy = FrontProxy(config) if config.client_ca else None

    def _pending(self) -> dict[Path, bytes]:
        """ConfigMap CA bundles whose files are not yet written as they are now."""
        client, proxy = self.ca_paths
        wanted: dict[Path, bytes] = {}
        if self._client_ca is None:
            wanted[client] = self._cluster.client_ca_pem
        if self._requestheader_ca is None:
            wanted[proxy] = self._cluster.requestheader_ca_pem
        return {p: pem for p, pem in wanted.items() if self._written.get(p) != pem}


def _lookup_problem(exc: ApiError) -> str:
    where = f"configmap {NAMESPACE}/{CONFIGMAP}"
    if exc.status == FORBIDDEN:
        return (
            f"cannot read {where}: forbidden ({exc.message}). The ServiceAccount needs a "
            f"RoleBinding in {NAMESPACE} to the Role extension-apiserver-authentication-reader"
        )
    return f"cannot read {where}: {exc}"


def _names(data: Mapping[str, Any], key: str) -> tuple[str, ...]:
    raw = data.get(key)
    if raw is None or raw == "":
        return ()
    try:
        values = json.loads(str(raw))
    except ValueError:
        raise ValueError(f"{key} is not a JSON array") from None
    if values is None:
        return ()
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ValueError(f"{key} is not a JSON array of strings")
    return tuple(v for v in values if v)


def _certificates(pem: bytes) -> tuple[x509.Certificate, ...]:
    if not pem.strip():
        return ()
    return tuple(x509.load_pem_x509_certificates(pem))


def _write(path: Path, data: bytes) -> None:
    """Replace `path` by rename, so the TLS reload never reads it half-written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
