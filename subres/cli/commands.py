"""The client verbs' command line: every flag, its syntax and help, and where each verb runs.

Owns the client connection flags (`--kubeconfig`, `--context`, `-n`), which
work before the verb (on the top-level parser) and after it (on each verb,
where they only count when given, so neither place overrides the other),
each verb's own flags and the syntax of their values (ports, durations).
This module imports nothing heavy (no dataclasses, no logging, no ssl): a
verb's module, and with it websockets, aiohttp and ssl, is imported only when
that verb runs, so `--help` answers at once and each verb pays only for itself.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import NamedTuple

__all__ = [
    "DEFAULT_GROUP_VERSION",
    "OUTPUT_FORMATS",
    "TRANSPORTS",
    "VERBS",
    "PortSpec",
    "Suggested",
    "Verb",
    "add_client_flags",
    "parse_addresses",
    "parse_duration",
    "parse_port",
]

DEFAULT_GROUP_VERSION = "subresources.subres.dev/v1alpha1"
TARGET = "[TYPE/|NAMESPACE/]NAME"
TRANSPORTS = ("spdy", "tunnel", "websocket")
TRANSPORT_HELP = (
    "how connections reach the server. websocket (the default): one KubeVirt-style "
    "WebSocket per connection; it passes through kube-apiserver and any proxy with no "
    "multiplexing state to keep, one failing connection leaves the others alone, and "
    "it carries udp. spdy: every connection a pair of streams on one SPDY/3.1 upgrade, "
    "as kubectl < 1.31 and client-go do. tunnel: the same SPDY inside one WebSocket, as "
    "kubectl >= 1.31 does. spdy and tunnel carry tcp only"
)
WEB_PORT = 8070
LOCALHOST = ["127.0.0.1", "::1"]
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


class Verb(NamedTuple):
    """One client verb on the command line."""

    name: str
    summary: str
    """One line in `subres --help`."""
    description: str
    flags: Callable[[argparse.ArgumentParser], None]
    module: str
    """The module whose `main(ns)` runs the verb, imported only then."""
    cluster: bool = True
    """It talks to a server, so it takes the kubeconfig flags (`replay` reads a file)."""


class PortSpec(NamedTuple):
    """One forwarded port: `protocol` is tcp or udp; `local` 0 picks a free port."""

    protocol: str
    local: int
    remote: int


def add_client_flags(parser: argparse.ArgumentParser, *, on_verb: bool = False) -> None:
    """Add the kubeconfig selection flags; on a verb they default to nothing at all."""
    default = argparse.SUPPRESS if on_verb else None
    parser.add_argument(
        "--kubeconfig", metavar="FILE", default=default, help="kubeconfig file to use"
    )
    parser.add_argument(
        "--context", metavar="NAME", default=default, help="kubeconfig context to use"
    )
    parser.add_argument(
        "-n", "--namespace", metavar="NS", default=default, help="namespace of the object"
    )


def parse_duration(text: str) -> float:
    """Seconds in a Go-style duration such as `30s`, `5m`, `1h30m` or `0`."""
    if text.strip() == "0":
        return 0.0
    parts = _DURATION.findall(text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise argparse.ArgumentTypeError(f"invalid duration {text!r} (try 30s, 5m or 1h)")
    return sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)


def parse_port(text: str) -> PortSpec:
    """`[tcp|udp/]LOCAL[:REMOTE]`; REMOTE defaults to LOCAL; an empty or 0 LOCAL is any port."""
    protocol, _, ports = text.rpartition("/")
    protocol = protocol.lower() or "tcp"
    if protocol not in ("tcp", "udp"):
        raise argparse.ArgumentTypeError(f"protocol must be tcp or udp in {text!r}")
    local_text, _, remote_text = ports.partition(":")
    remote_text = remote_text or local_text
    local = _number(local_text or "0", text, low=0)
    remote = _number(remote_text, text, low=1)
    return PortSpec(protocol=protocol, local=local, remote=remote)


def parse_addresses(text: str) -> list[str]:
    """`--address` of port-forward: a comma-separated list; `localhost` is 127.0.0.1 and ::1."""
    addresses: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            raise argparse.ArgumentTypeError(f"empty address in {text!r}")
        addresses += LOCALHOST if item == "localhost" else [item]
    return list(dict.fromkeys(addresses))


def _number(value: str, text: str, *, low: int) -> int:
    if value.isascii() and value.isdigit() and low <= int(value) <= 0xFFFF:
        return int(value)
    raise argparse.ArgumentTypeError(f"invalid port in {text!r} (want [tcp|udp/]LOCAL[:REMOTE])")


def _group_version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--api-group-version", default=DEFAULT_GROUP_VERSION, help=argparse.SUPPRESS
    )


# Each verb's flags below are plain add_argument calls, one per flag: where two
# verbs' declarations look alike, only argparse's shape repeats, not a flag.


def _no_reconnect(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-reconnect",
        dest="reconnect",
        action="store_false",
        help="exit when the server goes away (close code 1001, a replica shutting down) or "
        "the connection is lost, instead of connecting again (for up to a minute)",
    )


def _listen_address(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--address", default="127.0.0.1", help="local address to listen on (default 127.0.0.1)"
    )


def _console(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar=TARGET, help="the machine to connect to")
    parser.add_argument(
        "--timeout",
        type=parse_duration,
        default=0.0,
        metavar="DURATION",
        help="keep retrying this long while the machine is not running or its console "
        "is unavailable (e.g. 30s, 5m; default 0: no retry)",
    )
    _no_reconnect(parser)
    parser.add_argument(
        "--observe",
        action="store_true",
        help="watch read-only (console-observe): see what the writer sees; typing does nothing",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="take the console over without asking when someone else writes on it",
    )
    parser.add_argument(
        "--moderate",
        action="store_true",
        help="watch as a moderator (console-moderate): a moderated writer works while you do",
    )
    parser.add_argument(
        "--end",
        action="store_true",
        help="with --moderate: end the moderated session instead of watching it",
    )
    parser.add_argument(
        "--tail",
        type=int,
        metavar="LINES",
        help="of a kept console's scrollback, replay only the last LINES lines",
    )
    _console_name(parser)
    _group_version(parser)


def _console_name(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--console",
        metavar="NAME",
        help="which of the machine's consoles (e.g. serial1; default: its default one)",
    )


def _port_forward(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar=TARGET, help="the machine to forward to")
    parser.add_argument(
        "ports",
        metavar="[tcp|udp/]LOCAL[:REMOTE]",
        nargs="+",
        type=parse_port,
        help="a local port and the machine's port (default: the same); LOCAL 0 picks one",
    )
    parser.add_argument(
        "--address",
        type=parse_addresses,
        default=parse_addresses("localhost"),
        metavar="ADDRESSES",
        help="comma-separated local addresses to listen on; localhost (the default) "
        "is 127.0.0.1 and ::1, as in kubectl",
    )
    parser.add_argument(
        "--stdio",
        action="store_true",
        help="forward stdin/stdout to the one port given (for ssh -o ProxyCommand)",
    )
    parser.add_argument("--transport", choices=TRANSPORTS, default="websocket", help=TRANSPORT_HELP)
    _no_reconnect(parser)
    _group_version(parser)


def _vnc(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar=TARGET, help="the machine to view")
    parser.add_argument(
        "--proxy-only",
        action="store_true",
        help='only listen: print {"port": N} and relay connections until interrupted',
    )
    _listen_address(parser)
    parser.add_argument(
        "--port", type=int, default=0, help="local port to listen on (default 0: any free port)"
    )
    parser.add_argument(
        "--viewer",
        metavar="CMD",
        help="viewer command, with {address} and {port} filled in "
        "(default: remote-viewer, else vncviewer)",
    )
    parser.add_argument(
        "--view-only",
        action="store_true",
        help="watch the display (vnc-observe): keys and pointer go nowhere; "
        "whoever is viewing interactively stays",
    )
    _group_version(parser)


def _screenshot(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar=TARGET, help="the machine to capture")
    parser.add_argument(
        "-o", "--output", required=True, metavar="FILE", help="PNG file to write (- for stdout)"
    )
    _group_version(parser)


def _web(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target", metavar=TARGET, nargs="?", help="the machine the page opens first"
    )
    parser.add_argument(
        "--port", type=int, default=WEB_PORT, help=f"local port (default {WEB_PORT}; 0 picks one)"
    )
    _listen_address(parser)
    _group_version(parser)


def _sessions(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target", metavar=TARGET, nargs="?", help="one machine (default: the whole namespace)"
    )
    parser.add_argument(
        "-A", "--all-namespaces", action="store_true", help="the sessions of every namespace"
    )
    _output_format(parser)
    _group_version(parser)


class Suggested(tuple[str, ...]):
    """Choices that `--help` and shell completion offer but argparse never enforces: the
    verb refuses any other value itself, in kubectl's words rather than a usage line."""

    __slots__ = ()

    def __contains__(self, value: object) -> bool:
        return True


OUTPUT_FORMATS = Suggested(("json", "name", "wide", "yaml"))
"""What the listing verbs' `-o` takes (`subres.cli.printers`); without it, a table."""


def _output_format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-o",
        "--output",
        choices=OUTPUT_FORMATS,
        metavar="FORMAT",
        help="json, yaml, name or wide, as kubectl get's -o (default: a table)",
    )


def _recordings(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar=TARGET, help="the machine whose recordings to read")
    parser.add_argument("name", nargs="?", help="the recording to save (default: list them)")
    _output_format(parser)
    parser.add_argument(
        "--file", metavar="FILE", help="where to save it (default: its name; - for stdout)"
    )
    _group_version(parser)


def _logs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar=TARGET, help="the machine whose console to read")
    parser.add_argument(
        "-f", "--follow", action="store_true", help="keep printing the console's output"
    )
    parser.add_argument(
        "--tail",
        type=int,
        default=-1,
        metavar="LINES",
        help="print only the last LINES lines (default -1: all that is kept)",
    )
    parser.add_argument(
        "--since",
        type=parse_duration,
        metavar="DURATION",
        help="only lines newer than this (e.g. 5s, 2m, 3h)",
    )
    parser.add_argument("--since-time", metavar="TIME", help="only lines since this RFC 3339 time")
    parser.add_argument(
        "--limit-bytes", type=int, metavar="BYTES", help="print at most this many bytes"
    )
    parser.add_argument(
        "--timestamps",
        action="store_true",
        help="lead each line with the time subres received it (RFC 3339)",
    )
    parser.add_argument(
        "-p",
        "--previous",
        action="store_true",
        help="the output of the console's connection before it was last dialed again",
    )
    _console_name(parser)
    _group_version(parser)


def _replay(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="a console or display recording (- for stdin)")
    parser.add_argument(
        "--video",
        metavar="OUT",
        help="export a display recording to this video file (.mp4, .webm, ...) with ffmpeg",
    )
    parser.add_argument(
        "--fps", type=float, default=4.0, help="frames a second of the video (default 4)"
    )
    parser.add_argument(
        "--speed", type=float, default=1.0, help="play this many times faster (default 1)"
    )
    parser.add_argument(
        "--idle-time-limit",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="shorten longer pauses to this (default 2)",
    )


VERBS = (
    Verb(
        "console",
        "connect to a machine's serial console (Ctrl+] leaves)",
        "Connect to the serial console of a machine. Ctrl+] leaves.",
        _console,
        "subres.cli.console",
    ),
    Verb(
        "port-forward",
        "forward local ports (or stdin/stdout) to a machine's ports",
        "Forward local ports, or stdin/stdout with --stdio, to ports of a machine.",
        _port_forward,
        "subres.cli.portforward",
    ),
    Verb(
        "vnc",
        "open a machine's display in a local VNC viewer",
        "Relay a local port to a machine's VNC display and start a viewer, "
        'or with --proxy-only print {"port": N} and relay until interrupted.',
        _vnc,
        "subres.cli.vnc",
    ),
    Verb(
        "screenshot",
        "save a machine's display as a PNG file",
        "Save the current picture of a machine's display as a PNG file.",
        _screenshot,
        "subres.cli.screenshot",
    ),
    Verb(
        "web",
        "open a machine's console and display in the browser (a page on localhost)",
        "Serve the console and VNC page on a local port; its connections use "
        "your kubeconfig's credentials, which the browser never sees.",
        _web,
        "subres.cli.web",
    ),
    Verb(
        "sessions",
        "list who holds which console and display, as kubectl get does",
        "List the live sessions of a machine, of the namespace or of every namespace: "
        "user, mode (writer, observer, viewer), client, bytes each way, age.",
        _sessions,
        "subres.cli.sessions",
    ),
    Verb(
        "recordings",
        "list a machine's recorded console sessions, or save one",
        "List the recorded console sessions of a machine, or save one to a file "
        "(play it with subres replay).",
        _recordings,
        "subres.cli.recordings",
    ),
    Verb(
        "logs",
        "print a kept console's output, as kubectl logs does",
        "Print what a kept console printed (its scrollback), or follow it with -f; "
        "the machine's console must be kept (the subres.dev/keep-console annotation).",
        _logs,
        "subres.cli.logs",
    ),
    Verb(
        "replay",
        "play a recorded console session, or export a display's to video",
        "Play a console recording (asciicast v2, from subres recordings) at its own pace, "
        "or export a display recording to a video file with --video (needs ffmpeg).",
        _replay,
        "subres.cli.replay",
        cluster=False,
    ),
)
"""The client verbs, in the order `subres --help` lists them."""
