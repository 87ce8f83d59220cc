"""How a client verb reaches one object's subresource, and how it reports failure.

Owns what every verb shares: the target grammar (the same as the browser
page's box: `NAME`, `TYPE/NAME` when TYPE is a type this API serves, else
`NAMESPACE/NAME`), the URL of an object's subresource, opening a WebSocket
with the kubeconfig's credentials, and the words of a failure as kubectl
prints them: `Error from server (NotFound): …` for a refusal, a hint for an
unreachable server, never the repr of a library object.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import ssl
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote, urlsplit

from subres.cli import kubeconfig
from subres.cli.commands import DEFAULT_GROUP_VERSION
from subres.cli.kubeconfig import ClientConfig
from subres.kube.status import REASONS

if TYPE_CHECKING:
    import argparse

    from subres.engine.client import Peer
    from subres.engine.wsclient import ClientWebSocket

__all__ = [
    "DEFAULT_GROUP_VERSION",
    "DEFAULT_TYPES",
    "CommandError",
    "ServerError",
    "Target",
    "TargetText",
    "Unreachable",
    "authorized",
    "command",
    "connect",
    "describe",
    "get",
    "json_object",
    "object_url",
    "os_reason",
    "parse_target",
    "peer",
    "refusal",
    "resolve",
    "unreachable",
]

DEFAULT_TYPES = ("machines", "machine")
"""The default parent's plural and singular: types known without asking the server."""
STREAMS = frozenset({"console", "vnc", "screenshot", "portforward"})
"""The subresources whose parents the verbs open."""
T = TypeVar("T")
OPEN_TIMEOUT = 30.0
MAX_DISCOVERY = 4 << 20
MAX_DRY_RUN = 1 << 16
UNREACHABLE_HINT = "is the server running? check --kubeconfig/--context"
NO_SUCH_PATH = ("404 page not found", "the server could not find the requested resource")
"""How kube-apiserver (plain text) and Kubernetes clients word a path nobody serves."""
APISERVICE_HINT = (
    "hint: is subres installed here, its APIService Available? (kubectl get apiservices)"
)
_WARNING = re.compile(r'\d{3} \S+ "((?:[^"\\]|\\.)*)"(?: .*)?')
"""A `Warning` header value: code, agent, quoted text, an optional date."""
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
"""A namespace name (DNS-1123 label)."""


class CommandError(Exception):
    """Ends a verb: printed as `error: …`, exit code 1 (or `exit_code`)."""

    exit_code = 1

    def line(self) -> str:
        """What the user reads on stderr."""
        return f"error: {self}"


class ServerError(CommandError):
    """The server refused: its `Status`, printed as kubectl prints one."""

    def __init__(self, code: int, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or REASONS.get(code, "Unknown")
        self.hint = ""

    def line(self) -> str:
        if self.code == 401:
            text = "error: You must be logged in to the server (Unauthorized)"
        else:
            text = f"Error from server ({self.reason}): {self.message}"
        return f"{text}\n{self.hint}" if self.hint else text


class Unreachable(CommandError):
    """The server could not be reached (refused, unresolvable, silent, or TLS failed)."""


def command(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A verb's `main`: its failures printed on stderr as kubectl prints them, exit code 1."""

    def main(ns: argparse.Namespace) -> int:
        try:
            return run(ns)
        except kubeconfig.KubeconfigError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
        except CommandError as exc:
            print(exc.line(), file=sys.stderr, flush=True)
            return exc.exit_code
        return 1

    main.__doc__ = run.__doc__
    return main


@dataclass(frozen=True)
class TargetText:
    """A target as typed: `first` is a type or a namespace, decided by `resolve`."""

    text: str
    first: str | None
    name: str


@dataclass(frozen=True)
class Target:
    """The object a verb works on."""

    kind: str
    """The type as the user named it (`machine` when they named none), for messages."""
    resource: str
    """Its plural resource in the URL."""
    namespace: str
    name: str
    hint: str = ""
    """Said after a 404: how the target was read, when its first part was a namespace."""

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"


def parse_target(text: str) -> TargetText:
    """`NAME`, `TYPE/NAME` or `NAMESPACE/NAME` (which one `resolve` decides)."""
    first, slash, name = text.partition("/")
    if not slash:
        first, name = "", text
    if not name or "/" in name or (slash and not first):
        raise CommandError(f"expected NAME, TYPE/NAME or NAMESPACE/NAME, got {text!r}")
    return TargetText(text=text, first=first or None, name=name)


async def resolve(
    typed: TargetText, config: ClientConfig, *, group_version: str, namespace_flag: str | None
) -> Target:
    """The object `typed` names: its first part is a type when the API serves one by that name.

    The default types need no request; any other first part is looked up in
    the group-version's discovery document, and is a namespace if no type has it.
    """
    if typed.first is None:
        return Target(DEFAULT_TYPES[1], DEFAULT_TYPES[0], config.namespace, typed.name)
    first = typed.first.lower()
    types = dict.fromkeys(DEFAULT_TYPES, DEFAULT_TYPES[0]) if _default(group_version) else {}
    if first not in types:
        types = await _discovered_types(config, group_version)
    if first in types:
        return Target(first, types[first], config.namespace, typed.name)
    return _namespaced(typed, config, types, namespace_flag=namespace_flag)


def _default(group_version: str) -> bool:
    return group_version == DEFAULT_GROUP_VERSION


def _namespaced(
    typed: TargetText, config: ClientConfig, types: dict[str, str], *, namespace_flag: str | None
) -> Target:
    namespace = typed.first or ""
    known = ", ".join(sorted(types)) or "none"
    if not _LABEL.fullmatch(namespace):
        raise CommandError(
            f"unknown type {namespace!r} in {typed.text!r}: the types here are {known} "
            "(and it cannot be a namespace either)"
        )
    if namespace_flag and namespace_flag != namespace:
        raise CommandError(
            f"{typed.text!r} names namespace {namespace!r} but -n says {namespace_flag!r}"
        )
    plural = next(iter(types.values()), DEFAULT_TYPES[0])
    singular = next((t for t, p in types.items() if p == plural and t != plural), plural)
    hint = (
        f'hint: "{typed.text}" was read as NAMESPACE/NAME; {namespace!r} is not a type here '
        f"(the types are {known}), so for a type/name pair use one of those"
    )
    return Target(singular, plural, namespace, typed.name, hint=hint)


async def _discovered_types(config: ClientConfig, group_version: str) -> dict[str, str]:
    """Every name of every type `group_version` serves (plural, lowercased kind) → plural."""
    url = f"{config.server}/apis/{group_version}"
    try:
        body = await get(config, url, max_body=MAX_DISCOVERY)
    except ServerError as exc:
        if exc.code == 404 and _default(group_version):
            return dict.fromkeys(DEFAULT_TYPES, DEFAULT_TYPES[0])  # no discovery: the defaults
        raise
    types: dict[str, str] = {}
    for resource in json_object(body).get("resources") or []:
        if not isinstance(resource, dict):
            continue
        plural, _, sub = str(resource.get("name") or "").partition("/")
        # Types are the parents of the streams; `machines/sessions` answers a
        # SessionList and `sessions` is no parent: their kinds name no type.
        if plural and sub in STREAMS:
            types[plural] = plural
            if kind := str(resource.get("kind") or "").lower():
                types.setdefault(kind, plural)
    return types


async def get(
    config: ClientConfig,
    url: str,
    *,
    max_body: int,
    target: Target | None = None,
    request_timeout: float | None = OPEN_TIMEOUT,
    accept: str | None = None,
    sink: Callable[[bytes], Awaitable[None]] | None = None,
    method: str = "GET",
) -> bytes:
    """The body of a GET (or `method`) of `url` with the kubeconfig's credentials (and `accept`).

    `ServerError` for any answer but 200 (with `target`'s hint on a 404),
    `CommandError` for a body over `max_body` bytes, `Unreachable` as for `connect`.
    With `sink`, a 200 answer's body goes to it as it arrives, unbounded, and
    b"" is returned. `request_timeout` None: a body that may never end (a log
    followed), bounded only until the answer's headers arrive.
    """
    import aiohttp

    async def attempt(headers: Mapping[str, str]) -> bytes:
        timeout = aiohttp.ClientTimeout(total=request_timeout)
        if request_timeout is None:
            timeout = aiohttp.ClientTimeout(total=None, connect=OPEN_TIMEOUT)
        async with (
            # Without a proxy-url, the environment's (HTTPS_PROXY, NO_PROXY), as client-go.
            aiohttp.ClientSession(timeout=timeout, trust_env=config.proxy is None) as http,
            http.request(
                method,
                url,
                headers={**headers, **({"Accept": accept} if accept else {})},
                ssl=config.ssl if config.ssl is not None else True,
                server_hostname=config.server_hostname,
                proxy=config.proxy,
            ) as response,
        ):
            if response.status == 200 and sink is not None:
                async for chunk in response.content.iter_chunked(1 << 16):
                    await sink(chunk)
                return b""
            body = bytearray()
            async for chunk in response.content.iter_chunked(1 << 16):
                body += chunk
                if len(body) > max_body:
                    raise CommandError(f"the server's answer is over {max_body} bytes")
            if response.status != 200:
                raise refusal(response.status, body, target=target)
        return bytes(body)

    try:
        return await authorized(config, attempt)
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise unreachable(config, exc) from None


async def authorized(
    config: ClientConfig, attempt: Callable[[Mapping[str, str]], Awaitable[T]]
) -> T:
    """`attempt(headers)` with fresh credentials; once more after a 401, as client-go does.

    An exec plugin's credential is fetched again when it has expired and when
    the server refused it; `attempt` raises `ServerError` for a refusal.
    """
    headers = await _fresh(config)
    try:
        return await attempt(headers)
    except ServerError as exc:
        if exc.code != 401 or not await _renewed(config, headers):
            raise
    return await attempt(await _fresh(config))


async def _fresh(config: ClientConfig) -> Mapping[str, str]:
    try:
        return await config.credentials.fresh()
    except (kubeconfig.KubeconfigError, ssl.SSLError) as exc:
        raise CommandError(f"cannot renew the credentials: {exc}") from None


async def _renewed(config: ClientConfig, used: Mapping[str, str]) -> bool:
    try:
        return await config.credentials.rejected(used)
    except (kubeconfig.KubeconfigError, ssl.SSLError) as exc:
        raise CommandError(f"cannot renew the credentials: {exc}") from None


def object_url(
    config: ClientConfig, target: Target, *, group_version: str, websocket: bool = True
) -> str:
    """The URL of `target` (ws/wss, or the server's own scheme); subresources go below it."""
    parts = urlsplit(config.server)
    scheme = parts.scheme
    if websocket:
        scheme = "wss" if parts.scheme == "https" else "ws"
    path = "/".join(
        quote(s, safe="") for s in ("namespaces", target.namespace, target.resource, target.name)
    )
    return f"{scheme}://{parts.netloc}{parts.path.rstrip('/')}/apis/{group_version}/{path}"


def peer(config: ClientConfig, url: str, headers: Mapping[str, str]) -> Peer:
    """Where an upgrade to `url` goes, with `headers`, the kubeconfig's TLS and proxy.

    Without a `proxy-url`, the environment's proxy (HTTPS_PROXY, NO_PROXY), as client-go.
    """
    from subres.engine import client

    return client.Peer(
        url,
        headers,
        tls=config.ssl,
        server_hostname=config.server_hostname,
        proxy=client.proxy_for(url, config.proxy),
    )


async def connect(
    config: ClientConfig,
    url: str,
    *,
    target: Target | None = None,
    subprotocols: Sequence[str] | None,
    max_size: int,
    close_timeout: float,
    open_timeout: float = OPEN_TIMEOUT,
) -> ClientWebSocket:
    """A WebSocket to `url` with the kubeconfig's credentials and TLS settings.

    Raises `ServerError` with the server's Status when it refuses the upgrade
    (with `target`'s hint on a 404), `Unreachable` when it cannot be reached.
    """
    from subres.engine import client, wsclient

    async def attempt(headers: Mapping[str, str]) -> ClientWebSocket:
        try:
            async with asyncio.timeout(open_timeout):
                return await wsclient.connect(
                    peer(config, url, headers),
                    subprotocols=subprotocols or (),
                    max_size=max_size,
                    close_timeout=close_timeout,
                )
        except client.UpgradeRefused as exc:
            raise refusal(exc.status, exc.body, target=target) from None

    try:
        ws = await authorized(config, attempt)
    except (OSError, TimeoutError) as exc:
        raise unreachable(config, exc) from None
    say_warnings([value for name, value in ws.headers if name == "warning"])
    return ws


async def dry_run(config: ClientConfig, url: str, *, target: Target) -> None:
    """Raise what opening the stream at `url` (http or https) would run into, without it.

    A plain GET with `dryRun=All`: the server runs every check it would
    before dialing and answers the first failing one's Status, or 200 when
    all passed (servers that predate it: a 400 saying an upgrade was needed,
    which they say only once every check passed). Nothing is dialed and no
    session is taken either way.
    """
    query = "&" if "?" in url else "?"
    try:
        await get(config, f"{url}{query}dryRun=All", max_body=MAX_DRY_RUN, target=target)
    except ServerError as exc:
        if exc.code != 400 or "needs a WebSocket upgrade" not in exc.message:
            raise


def say_warnings(values: Sequence[str]) -> None:
    """Print the server's `Warning` headers as kubectl does (`Warning: text`)."""
    for value in values:
        match = _WARNING.fullmatch(value.strip())
        text = re.sub(r"\\(.)", r"\1", match.group(1)) if match else value.strip()
        print(f"Warning: {text}", file=sys.stderr, flush=True)


def refusal(
    code: int, body: bytes | bytearray | None, *, target: Target | None = None
) -> ServerError:
    """The error for an answer with status `code` and `body` (a Status, or anything else)."""
    status = json_object(body or b"")
    message = str(status.get("message") or "")
    reason = status.get("reason")
    if not message:
        text = (body or b"").decode("utf-8", "replace").strip()
        message = text[:500] if text else f"the server answered {code} and said nothing more"
    error = ServerError(code, message, reason=str(reason) if reason else None)
    if code == 404 and message.startswith(NO_SUCH_PATH):
        # A group kube-apiserver does not serve: subres is not registered (or not Available).
        error.hint = APISERVICE_HINT
    elif code == 404 and target is not None:
        error.hint = target.hint
    return error


def unreachable(config: ClientConfig, exc: BaseException) -> Unreachable:
    """The error for a server that could not be reached, with what went wrong in words."""
    what = describe(exc)
    hint = "" if _tls_problem(exc) else f"; {UNREACHABLE_HINT}"
    return Unreachable(f"cannot connect to {config.server}: {what}{hint}")


def describe(exc: BaseException) -> str:
    """`exc` in words a user can act on (no reprs of library objects)."""
    inner = _cause(exc)
    if inner is not None:
        return describe(inner)
    for kind, words in _WORDS:
        if isinstance(exc, kind):
            return words(exc)
    if isinstance(exc, OSError) and (exc.errno or exc.strerror):
        reason = os_reason(exc)
        return reason[:1].lower() + reason[1:]
    # Some libraries put object reprs in their messages; they help nobody.
    return re.sub(r"<[^<>]* object at 0x[0-9a-f]+>", "…", str(exc) or type(exc).__name__)


_WORDS: tuple[tuple[type[BaseException], Callable[[Any], str]], ...] = (
    (
        ssl.SSLCertVerificationError,
        lambda e: f"the server's certificate is not trusted: {e.verify_message or e.reason}",
    ),
    (ssl.SSLError, lambda e: f"TLS failed: {e.reason or e}"),
    (ConnectionRefusedError, lambda e: "connection refused"),
    (socket.gaierror, lambda e: f"cannot resolve the host name: {e.strerror}"),
    (TimeoutError, lambda e: "timed out"),
)
"""Failures worth their own words, most specific first."""


def os_reason(exc: OSError) -> str:
    """The system's words for `exc`'s errno (asyncio puts addresses and calls in strerror)."""
    return os.strerror(exc.errno) if exc.errno else str(exc.strerror or exc)


def _cause(exc: BaseException) -> BaseException | None:
    """The OS or TLS error a library wrapped (aiohttp's connector errors)."""
    inner = getattr(exc, "os_error", None) or getattr(exc, "certificate_error", None)
    return inner if isinstance(inner, BaseException) and inner is not exc else None


def _tls_problem(exc: BaseException) -> bool:
    return isinstance(_cause(exc) or exc, ssl.SSLError)


def json_object(data: bytes | bytearray) -> dict[str, Any]:
    """`data` as a JSON object; empty when it is not one."""
    try:
        obj = json.loads(data)
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}
