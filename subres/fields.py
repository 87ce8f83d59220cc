"""Reading a parent object's fields: field paths, port lists and endpoint templates.

Owns the path grammar every configured field uses (`.status.phase`,
`.metadata.annotations["subres.dev/console"]`, `.status.interfaces[0].ipAddress`,
`.status.conditions[type=Paused].status` for the first list item whose `type` is `Paused`),
the reading of a port list (a list of numbers, or a string such as `"22,8080"`),
and endpoint templates that build a URL from fields
(`unix:///run/vms/{.metadata.namespace}/{.metadata.name}/serial.sock`).

A template is where a parent object's editor gets to write into a URL that
subres dials, so a substituted value may only be a plain name (letters,
digits, `.`, `_`, `-`, not starting with `.`) or an IP address: a `/`, `@`,
`:`, `?`, `#`, `%` or `..` cannot reach the URL and change what it points at.
Pure functions; no I/O.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from subres.protocol import digits

__all__ = [
    "FieldError",
    "FieldPath",
    "Match",
    "Template",
    "path",
    "ports",
    "read",
    "substitute",
    "template",
    "value_source",
]


class FieldError(ValueError):
    """A path or template that does not parse, or a value that cannot be used."""


@dataclass(frozen=True)
class Match:
    """A list step `[key=value]`: the first item that is a map whose `key` holds `value`."""

    key: str
    value: str


Step = str | int | Match


@dataclass(frozen=True)
class FieldPath:
    """A parsed field path: map keys, list indexes and list matches, in order."""

    text: str
    steps: tuple[Step, ...]

    def get(self, obj: Any) -> Any:
        """The value at this path in `obj`, or None when any step is missing."""
        value = obj
        for step in self.steps:
            value = _step(value, step)
            if value is None:
                return None
        return value

    def __str__(self) -> str:
        return self.text


def _step(value: Any, step: Step) -> Any:
    if isinstance(step, int):
        return value[step] if isinstance(value, list) and step < len(value) else None
    if isinstance(step, Match):
        items = value if isinstance(value, list) else []
        return next(
            (i for i in items if isinstance(i, Mapping) and i.get(step.key) == step.value), None
        )
    return value.get(step) if isinstance(value, Mapping) else None


_NAME = re.compile(r"[^.\[\]\"'{}=\s]+")
_INDEX = re.compile(r"\[(\d{1,9})\]")
_QUOTED = re.compile(r"""\[(?:"([^"]*)"|'([^']*)')\]""")
_MATCH = re.compile(r"""\[([^.\[\]"'{}=\s]+)=(?:([^.\[\]"'{}=\s]+)|"([^"]*)")\]""")


@functools.lru_cache(maxsize=1024)
def path(text: str) -> FieldPath:
    """Parse `.a.b`, `.a["x.y/z"]`, `.a[0].b`, `.a[type=Ready].b`; `FieldError` saying where."""
    steps: list[Step] = []
    pos = 0
    while pos < len(text):
        if text[pos] == ".":
            name = _NAME.match(text, pos + 1)
            if name is None:
                raise FieldError(f"field path {text!r}: a name must follow '.' at {pos}")
            steps.append(name[0])
            pos = name.end()
        elif (index := _INDEX.match(text, pos)) is not None:
            steps.append(int(index[1]))
            pos = index.end()
        elif (quoted := _QUOTED.match(text, pos)) is not None:
            key = quoted[1] if quoted[1] is not None else quoted[2]
            if not key:
                raise FieldError(f"field path {text!r}: empty key at {pos}")
            steps.append(key)
            pos = quoted.end()
        elif (match := _MATCH.match(text, pos)) is not None:
            steps.append(Match(match[1], match[2] if match[2] is not None else match[3]))
            pos = match.end()
        else:
            raise FieldError(
                f'field path {text!r}: expected .name, [N], ["key"] or [key=value] at {pos}'
            )
    if not steps:
        raise FieldError(f"field path {text!r} is empty; write e.g. .status.phase")
    return FieldPath(text, tuple(steps))


def ports(value: Any) -> frozenset[int] | None:
    """The ports a field holds: a list of numbers or numeric strings, one number, or `"22,8080"`.

    None when the field is unset; `FieldError` when it holds something else.
    """
    if value is None:
        return None
    items: Sequence[Any]
    if isinstance(value, str):
        items = [part.strip() for part in value.split(",") if part.strip()]
    elif isinstance(value, list):
        items = value
    else:
        items = [value]
    return frozenset(_port(item) for item in items)


def _port(item: Any) -> int:
    if isinstance(item, str) and digits.plain(item):
        item = digits.value(item, cap=0xFFFF)
    if isinstance(item, int) and not isinstance(item, bool) and 0 < item <= 0xFFFF:
        return item
    raise FieldError(f"{item!r} is not a port number from 1 to 65535")


_SAFE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")


@dataclass(frozen=True)
class Template:
    """A string with `{field path}` placeholders, e.g. an endpoint URL."""

    text: str
    parts: tuple[str | FieldPath, ...]

    def render(self, obj: Any) -> str:
        """The text with every placeholder replaced by its field's value.

        `FieldError` when a field is unset, is not a string or number, or holds
        anything but a plain name or an IP address (IPv6 is written `[addr]`).
        """
        return "".join(
            p if isinstance(p, str) else substitute(p.text, p.get(obj)) for p in self.parts
        )

    def __str__(self) -> str:
        return self.text


def substitute(field: str, value: Any) -> str:
    """`value` as it may appear in a URL: a plain name, an IPv4 address or `[IPv6]`.

    `FieldError` naming `field` otherwise.
    """
    if value is None or value == "":
        raise FieldError(f"{field} is not set")
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise FieldError(f"{field} holds a {type(value).__name__}, not a name")
    text = str(value)
    if _SAFE.fullmatch(text):
        return text
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        address = None
    if isinstance(address, ipaddress.IPv6Address) and address.scope_id is None:
        return f"[{address}]"
    raise FieldError(
        f"{field} = {text!r} may not go into an endpoint: only letters, digits, '.', '_' "
        "and '-' (not first), or an IP address"
    )


@functools.lru_cache(maxsize=256)
def template(text: str) -> Template:
    """Parse a template; `FieldError` on a bad placeholder or a stray brace."""
    parts: list[str | FieldPath] = []
    pos = 0
    for found in _PLACEHOLDER.finditer(text):
        parts.append(_literal(text, text[pos : found.start()]))
        parts.append(path(found[1].strip()))
        pos = found.end()
    parts.append(_literal(text, text[pos:]))
    if not any(isinstance(p, FieldPath) for p in parts):
        raise FieldError(f"template {text!r} has no {{.field.path}} placeholder")
    return Template(text, tuple(p for p in parts if p != ""))


def _literal(template_text: str, literal: str) -> str:
    if "{" in literal or "}" in literal:
        raise FieldError(f"template {template_text!r} has an unbalanced brace")
    return literal


def value_source(text: str) -> FieldPath | Template:
    """A configured value: a field path when it starts with `.` or `[`, else a template."""
    return path(text) if text[:1] in (".", "[") else template(text)


def read(text: str, obj: Any) -> Any:
    """The value `text` (see `value_source`) names in `obj`: the field's, or the rendered text.

    A template raises `FieldError` when a field is unset or unsafe.
    """
    source = value_source(text)
    return source.get(obj) if isinstance(source, FieldPath) else source.render(obj)
