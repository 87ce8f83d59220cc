"""The server configuration file (`--config`): what to serve and how to reach backends.

Owns the typed settings and their defaults (`model`), the YAML loader that
validates them (`loader`) and the readers of each value's shape (`shapes`).
Every layer reads the dataclasses; none parses YAML itself.
"""

from __future__ import annotations

from subres.config.loader import load, parse, slot_source
from subres.config.model import (
    ANY_PORT,
    DEFAULT_CONSOLE,
    DEFAULT_DENY_CIDRS,
    DEFAULT_SOCKET_DIR,
    MAX_CONSOLES,
    OPT_IN,
    RECORD,
    RECORDED,
    SLOT,
    SUBRESOURCES,
    TRUSTED_FIELDS,
    TRUSTED_PREFIX,
    USB_SLOTS,
    Config,
    ConsolesSpec,
    EndpointPolicySpec,
    InstanceSpec,
    IpmiSpec,
    ParentSpec,
    Requirement,
    Scalar,
    SessionSpec,
    SshSpec,
    SubresourceSpec,
    field_value,
)
from subres.config.shapes import ConfigError

__all__ = [
    "ANY_PORT",
    "DEFAULT_CONSOLE",
    "DEFAULT_DENY_CIDRS",
    "DEFAULT_SOCKET_DIR",
    "MAX_CONSOLES",
    "OPT_IN",
    "RECORD",
    "RECORDED",
    "SLOT",
    "SUBRESOURCES",
    "TRUSTED_FIELDS",
    "TRUSTED_PREFIX",
    "USB_SLOTS",
    "Config",
    "ConfigError",
    "ConsolesSpec",
    "EndpointPolicySpec",
    "InstanceSpec",
    "IpmiSpec",
    "ParentSpec",
    "Requirement",
    "Scalar",
    "SessionSpec",
    "SshSpec",
    "SubresourceSpec",
    "field_value",
    "load",
    "parse",
    "slot_source",
]
