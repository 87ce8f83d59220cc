"""What a session is to its unit: its mode, one of a closed set.

The mode says what a session may do (type, watch, moderate, forward) and
which RBAC subresource it needs; it names the session in audit lines,
Events, the sessions list and the peer request (`Subres-Mode`), where its
value is the wire's and the records'.
"""

from __future__ import annotations

import enum

__all__ = ["DEFAULT_MODES", "Mode"]


class Mode(enum.StrEnum):
    """A session's mode; its value is how every record and the peer request spell it."""

    WRITER = "writer"
    """A console's one writer: types, and takes over from the previous one."""
    OBSERVER = "observer"
    """A console's read-only observer, or a display's view-only viewer."""
    VIEWER = "viewer"
    """A display's one interactive viewer."""
    MODERATOR = "moderator"
    """An observer whom a moderated writer or viewer waits for."""
    FORWARDER = "forwarder"
    """A port-forward connection."""
    REDIRECTOR = "redirector"
    """A USB redirection holding one of the machine's slots."""


DEFAULT_MODES = {
    "console": Mode.WRITER,
    "vnc": Mode.VIEWER,
    "portforward": Mode.FORWARDER,
    "usbredir": Mode.REDIRECTOR,
}
"""Each subresource's interactive mode: what a session of it is unless said otherwise."""
