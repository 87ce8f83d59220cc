"""The shapes a configuration value may take: one reader per YAML type.

Each reader returns the value as its type or raises `ConfigError` naming
`what` (where in the file it is), so the loader reads like the file's schema.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = [
    "KIND",
    "LABEL",
    "SUBDOMAIN",
    "ConfigError",
    "boolean",
    "count",
    "mapping",
    "name",
    "positive",
    "sequence",
    "text",
]


class ConfigError(ValueError):
    """The configuration file is not valid."""


def count(data: Any, what: str) -> int:
    """A positive integer."""
    if isinstance(data, bool) or not isinstance(data, int) or data <= 0:
        raise ConfigError(f"{what} must be a positive integer")
    return data


def mapping(data: Any, what: str, keys: set[str] | None) -> dict[str, Any]:
    """A mapping whose keys are among `keys` (any, when None)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{what} must be a mapping")
    unknown = set(data) - keys if keys is not None else set()
    if unknown:
        raise ConfigError(f"{what}: unknown keys {sorted(map(str, unknown))}")
    return data


def sequence(data: Any, what: str) -> list[Any]:
    """A list."""
    if not isinstance(data, list | tuple):
        raise ConfigError(f"{what} must be a list")
    return list(data)


def text(data: Any, what: str) -> str:
    """A string."""
    if not isinstance(data, str):
        raise ConfigError(f"{what} must be a string")
    return data


_DNS_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
LABEL = re.compile(_DNS_LABEL)
SUBDOMAIN = re.compile(rf"(?=.{{1,253}}$){_DNS_LABEL}(\.{_DNS_LABEL})*")
KIND = re.compile(r"[A-Z][A-Za-z0-9]{0,62}")


def name(data: Any, what: str, pattern: re.Pattern[str]) -> str:
    """A name that goes into API paths: a DNS label or subdomain, or a kind."""
    value = text(data, what)
    if not pattern.fullmatch(value):
        raise ConfigError(f"{what}: {value[:64]!r} is not a valid name here")
    return value


def boolean(data: Any, what: str) -> bool:
    """true or false."""
    if not isinstance(data, bool):
        raise ConfigError(f"{what} must be true or false")
    return data


def positive(data: Any, what: str) -> float:
    """A positive number."""
    if isinstance(data, bool) or not isinstance(data, int | float) or data <= 0:
        raise ConfigError(f"{what} must be a positive number")
    return float(data)
