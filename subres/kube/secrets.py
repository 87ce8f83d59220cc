"""Secrets a parent names (SSH credentials): through the apiserver, or from the standalone file.

Cluster mode reads one Secret with a GET when a session needs it (subres
needs only `get` on `secrets`, in the namespaces whose parents use SSH; it
never lists or watches them, so it holds no copy of Secrets it does not use).
Standalone mode keeps the `Secret` documents of the objects file. Either way
the caller gets the decoded `data` (with `stringData` on top, as the
apiserver applies it), or None when there is no such Secret.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any, Protocol

from subres.kube.cache import ParentCache
from subres.kube.client import Api, ApiError

__all__ = ["ApiSecrets", "CachedSecrets", "NoSecrets", "SecretError", "Secrets", "decode"]

SecretData = dict[str, bytes]


class SecretError(Exception):
    """A Secret could not be read (not a missing one: that is None)."""


class Secrets(Protocol):
    """Where Secrets come from."""

    async def get(self, namespace: str, name: str) -> SecretData | None:
        """The Secret's decoded data, or None when it does not exist."""
        ...


class ApiSecrets:
    """Secrets read through the main apiserver, one GET each time."""

    def __init__(self, api: Api) -> None:
        self._api = api

    async def get(self, namespace: str, name: str) -> SecretData | None:
        try:
            return decode(await self._api.read_secret(namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise SecretError(f"cannot read Secret {namespace}/{name}: {exc}") from None


class CachedSecrets:
    """Secrets kept in a cache (standalone mode: the objects file's Secret documents)."""

    def __init__(self, cache: ParentCache) -> None:
        self._cache = cache

    async def get(self, namespace: str, name: str) -> SecretData | None:
        obj = self._cache.get(namespace, name)
        return None if obj is None else decode(obj)


class NoSecrets:
    """No Secret source: every Secret is missing."""

    async def get(self, namespace: str, name: str) -> SecretData | None:
        return None


def decode(secret: Mapping[str, Any]) -> SecretData:
    """`data` base64-decoded, then `stringData` as UTF-8; `SecretError` on bad values."""
    out: SecretData = {}
    data = secret.get("data") or {}
    strings = secret.get("stringData") or {}
    if not isinstance(data, Mapping) or not isinstance(strings, Mapping):
        raise SecretError("Secret data must be a mapping")
    for key, value in data.items():
        try:
            out[str(key)] = base64.b64decode(str(value), validate=True)
        except (binascii.Error, ValueError):
            raise SecretError(f"Secret data {key!r} is not base64") from None
    for key, value in strings.items():
        out[str(key)] = str(value).encode()
    return out
