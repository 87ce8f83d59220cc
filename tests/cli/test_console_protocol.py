"""`subres console` against a small in-test WebSocket server.

The demo cannot show some things (its backend ignores resize, it never sends
a failure Status), so a `websockets` server in a thread plays the console
subresource here and records everything the real CLI sends it.
"""

from __future__ import annotations

import json
import queue
import signal
import socket
import termios
import threading
from collections.abc import Callable, Sequence
from http import HTTPStatus
from pathlib import Path
from types import TracebackType

import pexpect  # type: ignore[import-untyped]
import pytest
from websockets.datastructures import Headers
from websockets.http11 import Request, Response
from websockets.sync.server import Server, ServerConnection, serve
from websockets.typing import Subprotocol

from tests.cli.conftest import cli, cli_env, run_cli, write_kubeconfig

WAIT = 20.0
V5 = "v5.channel.k8s.io"
V4 = "v4.channel.k8s.io"
SUCCESS = b'\x03{"metadata":{},"status":"Success"}'
STDIN_CLOSED = b"\xff\x00"

DISCOVERY_PATH = "/apis/custom.example/v2"
DISCOVERY = {"kind": "APIResourceList", "resources": [{"name": "vms/console", "kind": "VM"}]}

Script = Callable[[ServerConnection, "FakeConsole"], None]


class FakeConsole:
    """A console endpoint: optional refusals first, then `script` runs each session."""

    def __init__(
        self,
        script: Script,
        *,
        subprotocols: Sequence[str] = (V5,),
        refusals: Sequence[tuple[int, str] | None] = (),
        ready: Callable[[FakeConsole], bool] = lambda fake: True,
    ) -> None:
        """`refusals` answer the first requests in turn (None lets one through); `ready`
        says what `/readyz` answers (200, or 500 as a starting kube-apiserver's)."""
        self.script = script
        self.ready = ready
        self.received: queue.Queue[bytes] = queue.Queue()
        self.requests: queue.Queue[tuple[str, Headers]] = queue.Queue()
        self._refusals = list(refusals)
        self.readyz_asked = 0
        self._server: Server = serve(
            self._handle,
            "127.0.0.1",
            0,
            subprotocols=[Subprotocol(p) for p in subprotocols],
            process_request=self._process_request,
            compression=None,
        )
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.socket.getsockname()[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeConsole:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._thread.join(WAIT)

    def next_on(self, channel: int) -> bytes:
        """The payload of the next message the client sent on `channel`."""
        while True:
            message = self.received.get(timeout=WAIT)
            if message[0] == channel:
                return message[1:]

    def all_received(self) -> list[bytes]:
        """Every message recorded so far."""
        messages = []
        while not self.received.empty():
            messages.append(self.received.get_nowait())
        return messages

    def _readyz(self, conn: ServerConnection) -> Response:
        self.readyz_asked += 1
        if self.ready(self):
            return conn.respond(HTTPStatus.OK, "ok")
        return conn.respond(HTTPStatus.INTERNAL_SERVER_ERROR, "[-]informer-sync failed")

    def _process_request(self, conn: ServerConnection, request: Request) -> Response | None:
        if request.path == "/readyz":
            return self._readyz(conn)
        if request.path.endswith(DISCOVERY_PATH):
            return conn.respond(HTTPStatus.OK, json.dumps(DISCOVERY))
        if request.path.endswith("/sessions"):
            # An interactive console reads who writes before it connects: nobody here.
            return conn.respond(HTTPStatus.OK, json.dumps({"kind": "SessionList", "items": []}))
        self.requests.put((request.path, request.headers))
        if not self._refusals:
            return None
        refusal = self._refusals.pop(0)
        if refusal is None:
            return None
        code, message = refusal
        status = {"kind": "Status", "status": "Failure", "message": message, "code": code}
        return conn.respond(HTTPStatus(code), json.dumps(status))

    def _handle(self, conn: ServerConnection) -> None:
        self.script(conn, self)


def _record(conn: ServerConnection, fake: FakeConsole, *, until: bytes | None = None) -> None:
    """Record client messages and echo stdin until the client closes or sends `until`."""
    for message in conn:
        assert isinstance(message, bytes)
        fake.received.put(message)
        if message == until or (message[:1] == b"\x00" and b"END" in message):
            return
        if message[:1] == b"\x00":
            conn.send(b"\x01" + message[1:])


def echo(conn: ServerConnection, fake: FakeConsole) -> None:
    """Echo stdin until it ends (v5 close signal or an `END` marker), then succeed."""
    conn.send(b"\x01")
    conn.send(b"\x02to-stderr\n")
    _record(conn, fake, until=STDIN_CLOSED)
    conn.send(SUCCESS)
    conn.close(1000)


def interactive(conn: ServerConnection, fake: FakeConsole) -> None:
    """Say `ready`, then record everything until the client leaves."""
    conn.send(b"\x01ready\r\n")
    _record(conn, fake)


def fail_with_status(conn: ServerConnection, fake: FakeConsole) -> None:
    """Report a failure on the error channel and wait for the client to hang up."""
    failure = {"metadata": {}, "status": "Failure", "message": "the shell crashed"}
    conn.send(b"\x03" + json.dumps(failure).encode())
    _record(conn, fake)


def close_with(code: int, reason: str) -> Script:
    """A script that closes the session at once with `code` and `reason`."""

    def script(conn: ServerConnection, fake: FakeConsole) -> None:
        conn.close(code, reason)

    return script


def in_turn(*scripts: Script) -> Script:
    """A script that plays `scripts` one per session, in order."""
    left = list(scripts)

    def script(conn: ServerConnection, fake: FakeConsole) -> None:
        left.pop(0)(conn, fake)

    return script


def spawn_console(
    workdir: Path, config: Path, *, dimensions: tuple[int, int] = (24, 80)
) -> pexpect.spawn:
    """`subres console m1` under a PTY."""
    args = cli("--kubeconfig", config, "console", "m1")
    return pexpect.spawn(
        args[0], args[1:], env=cli_env(workdir), timeout=WAIT, dimensions=dimensions
    )


@pytest.fixture
def kubeconfig(workdir: Path) -> Callable[[FakeConsole], Path]:
    def write(fake: FakeConsole) -> Path:
        return write_kubeconfig(
            workdir / "kubeconfig", server=fake.url, user={"token": "t0k3n"}, namespace="ns1"
        )

    return write


def test_interactive_session_frames_resize_stdin_and_escape(
    workdir: Path, kubeconfig: Callable[[FakeConsole], Path]
) -> None:
    with FakeConsole(interactive) as fake:
        child = spawn_console(workdir, kubeconfig(fake), dimensions=(24, 80))
        try:
            child.expect_exact(b"Connected to machine/m1. Escape with Ctrl+]")
            child.expect_exact(b"ready")
            assert json.loads(fake.next_on(4)) == {"Width": 80, "Height": 24}
            child.setwinsize(40, 132)
            assert json.loads(fake.next_on(4)) == {"Width": 132, "Height": 40}
            child.send(b"abc\x1dnot-sent")
            assert fake.next_on(0) == b"abc"
            child.expect(pexpect.EOF)
        finally:
            child.close(force=True)
        assert child.exitstatus == 0
        path, headers = fake.requests.get(timeout=WAIT)
    assert path == "/apis/subresources.subres.dev/v1alpha1/namespaces/ns1/machines/m1/console"
    assert headers["Authorization"] == "Bearer t0k3n"
    assert headers["Sec-WebSocket-Protocol"] == f"{V5}, {V4}"
    assert all(not m.startswith(b"\x00not-sent") for m in fake.all_received())


def test_an_interactive_session_reconnects_in_the_same_raw_terminal(
    workdir: Path, kubeconfig: Callable[[FakeConsole], Path]
) -> None:
    with FakeConsole(in_turn(close_with(1001, "the server is shutting down"), interactive)) as fake:
        child = spawn_console(workdir, kubeconfig(fake))
        try:
            child.expect_exact(b"Connected to machine/m1. Escape with Ctrl+]")
            # The PTY tests here share their expect-then-close shape; what they expect differs.
            # Raw mode: each line returns the carriage itself.
            child.expect_exact(
                b"machine/m1: the server is shutting down (1001); reconnecting\r\n"
                b"Reconnected to machine/m1.\r\n"
            )
            child.expect_exact(b"ready")
            child.send(b"typed\x1d")
            assert fake.next_on(0) == b"typed"
            child.expect(pexpect.EOF)
        finally:
            child.close(force=True)
    assert child.exitstatus == 0


def test_piped_stdin_is_closed_on_v5(
    workdir: Path, kubeconfig: Callable[[FakeConsole], Path]
) -> None:
    with FakeConsole(echo) as fake:
        done = run_cli(
            ["--kubeconfig", kubeconfig(fake), "console", "m1"], home=workdir, stdin=b"hello\n"
        )
        messages = fake.all_received()
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"hello\n"
    assert done.stderr == b"to-stderr\n"
    assert messages == [b"\x00hello\n", STDIN_CLOSED]


def test_piped_stdin_on_v4_waits_for_the_server(
    workdir: Path, kubeconfig: Callable[[FakeConsole], Path]
) -> None:
    with FakeConsole(echo, subprotocols=(V4,)) as fake:
        done = run_cli(
            ["--kubeconfig", kubeconfig(fake), "console", "m1"], home=workdir, stdin=b"data END"
        )
        messages = fake.all_received()
    assert done.returncode == 0, done.stderr
    assert messages == [b"\x00data END"]


@pytest.mark.parametrize(
    ("code", "reason", "flags"),
    [
        # A takeover or a backend failure is meant: never reconnected after.
        (4001, "console of ns1/m1 taken over by bob", []),
        (1011, "backend connection failed: reset", []),
        (1001, "the server is shutting down", ["--no-reconnect"]),
    ],
)
def test_abnormal_close_prints_the_reason(
    workdir: Path,
    kubeconfig: Callable[[FakeConsole], Path],
    code: int,
    reason: str,
    flags: list[str],
) -> None:
    with FakeConsole(close_with(code, reason)) as fake:
        args: list[str | Path] = ["--kubeconfig", kubeconfig(fake), "console", "m1", *flags]
        done = run_cli(args, home=workdir)
        attempts = fake.requests.qsize()
    assert done.returncode == 1
    assert done.stderr.decode() == f"error: the server closed the console ({code}): {reason}\n"
    assert attempts == 1


def drop_connection(conn: ServerConnection, fake: FakeConsole) -> None:
    """End the TCP connection without a close frame, as a crashed server would."""
    conn.socket.shutdown(socket.SHUT_RDWR)


@pytest.mark.parametrize(
    ("first", "said"),
    [
        (close_with(1001, "the server is shutting down"), "the server is shutting down (1001)"),
        (drop_connection, "lost the connection to the server"),
    ],
)
def test_reconnects_when_the_server_goes_away_or_the_connection_is_lost(
    workdir: Path, kubeconfig: Callable[[FakeConsole], Path], first: Script, said: str
) -> None:
    with FakeConsole(in_turn(first, echo)) as fake:
        done = run_cli(["--kubeconfig", kubeconfig(fake), "console", "m1"], home=workdir)
        attempts = fake.requests.qsize()
    assert done.returncode == 0, done.stderr
    # The second session's own words, and its Success, end the command.
    assert done.stderr.decode().splitlines() == [
        f"machine/m1: {said}; reconnecting",
        "Reconnected to machine/m1.",
        "to-stderr",
    ]
    assert attempts == 2


def test_a_denial_while_kube_apiserver_is_not_ready_is_waited_out(
    workdir: Path, kubeconfig: Callable[[FakeConsole], Path]
) -> None:
    # Restarted, kube-apiserver serves before its RBAC is loaded: it denies everyone, and
    # its /readyz says it is not ready. Once it is, the same user gets in.
    denied = (403, 'machines "m1" is forbidden: User "alice" cannot get machines/console')
    fake = FakeConsole(
        in_turn(drop_connection, echo),
        refusals=[None, denied, denied],
        ready=lambda fake: fake.requests.qsize() > 3,
    )
    with fake:
        done = run_cli(["--kubeconfig", kubeconfig(fake), "console", "m1"], home=workdir)
        attempts = fake.requests.qsize()
    assert done.returncode == 0, done.stderr
    assert done.stderr.decode().splitlines() == [
        "machine/m1: lost the connection to the server; reconnecting",
        f"machine/m1: {denied[1]} (kube-apiserver is not ready yet)",
        "Reconnected to machine/m1.",
        "to-stderr",
    ]
    assert attempts == 4


def test_with_a_timeout_a_first_connection_waits_out_a_kube_apiserver_not_ready(
    workdir: Path, kubeconfig: Callable[[FakeConsole], Path]
) -> None:
    fake = FakeConsole(
        echo, refusals=[(403, "not yet"), (403, "not yet")], ready=lambda f: f.requests.qsize() > 2
    )
    with fake:
        args: list[str | Path] = ["--kubeconfig", kubeconfig(fake), "console", "m1"]
        done = run_cli([*args, "--timeout", "30s"], home=workdir, stdin=b"up\n")
        attempts = fake.requests.qsize()
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"up\n"
    assert done.stderr.startswith(
        b"machine/m1: not yet (kube-apiserver is not ready yet); waiting\n"
    )
    assert attempts == 3


def test_a_denial_by_a_ready_kube_apiserver_is_believed_at_once(
    workdir: Path, kubeconfig: Callable[[FakeConsole], Path]
) -> None:
    with FakeConsole(in_turn(drop_connection, echo), refusals=[None, (403, "no")]) as fake:
        done = run_cli(["--kubeconfig", kubeconfig(fake), "console", "m1"], home=workdir)
        attempts, asked = fake.requests.qsize(), fake.readyz_asked
    assert done.returncode == 1
    assert done.stderr.decode().splitlines() == [
        "machine/m1: lost the connection to the server; reconnecting",
        "Error from server (Forbidden): no",
    ]
    assert (attempts, asked) == (2, 1)


def test_failure_status_ends_the_session(
    workdir: Path, kubeconfig: Callable[[FakeConsole], Path]
) -> None:
    with FakeConsole(fail_with_status) as fake:
        done = run_cli(["--kubeconfig", kubeconfig(fake), "console", "m1"], home=workdir)
    assert done.returncode == 1
    assert done.stderr == b"error: the shell crashed\n"


def test_retries_conflict_and_unavailable_within_the_timeout(
    workdir: Path, kubeconfig: Callable[[FakeConsole], Path]
) -> None:
    refusals = [(503, "backend unavailable"), (409, "machine is not Running")]
    with FakeConsole(echo, refusals=refusals) as fake:
        done = run_cli(
            ["--kubeconfig", kubeconfig(fake), "console", "m1", "--timeout", "30s"],
            home=workdir,
            stdin=b"up\n",
        )
        attempts = fake.requests.qsize()
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"up\n"
    assert done.stderr.startswith(b"machine/m1: backend unavailable; waiting\n")
    assert attempts == 3


@pytest.mark.parametrize(("code", "timeout"), [(503, "0"), (403, "30s"), (500, "30s"), (404, "1h")])
def test_no_retry_without_timeout_or_for_other_codes(
    workdir: Path, kubeconfig: Callable[[FakeConsole], Path], code: int, timeout: str
) -> None:
    with FakeConsole(echo, refusals=[(code, f"refused with {code}")]) as fake:
        done = run_cli(
            ["--kubeconfig", kubeconfig(fake), "console", "m1", "--timeout", timeout],
            home=workdir,
        )
        attempts = fake.requests.qsize()
    assert done.returncode == 1
    reason = {503: "ServiceUnavailable", 403: "Forbidden", 500: "InternalError", 404: "NotFound"}
    # Without --timeout, what would be worth waiting for says so.
    hint = "hint: --timeout 5m waits for it to become available\n" if code == 503 else ""
    expected = f"Error from server ({reason[code]}): refused with {code}\n{hint}"
    assert done.stderr == expected.encode()
    assert attempts == 1


def test_group_version_kind_and_server_path_prefix(workdir: Path) -> None:
    with FakeConsole(echo) as fake:
        config = write_kubeconfig(workdir / "kubeconfig", server=f"{fake.url}/prefix/")
        args: list[str | Path] = ["console", "VMs/web-1", "--kubeconfig", config]
        done = run_cli([*args, "--api-group-version", "custom.example/v2"], home=workdir)
        path, headers = fake.requests.get(timeout=WAIT)
    assert done.returncode == 0, done.stderr
    # Piped, so it asks a kept console for none of its scrollback.
    assert path == "/prefix/apis/custom.example/v2/namespaces/default/vms/web-1/console?tail=0"
    assert "Authorization" not in headers


def test_bad_duration_is_a_usage_error(workdir: Path) -> None:
    done = run_cli(["console", "m1", "--timeout", "5 minutes"], home=workdir)
    assert done.returncode == 2
    assert b"invalid duration '5 minutes'" in done.stderr


def test_unreachable_server(workdir: Path, kubeconfig: Callable[[FakeConsole], Path]) -> None:
    with FakeConsole(echo) as fake:
        config, url = kubeconfig(fake), fake.url
    done = run_cli(["--kubeconfig", config, "console", "m1"], home=workdir)
    assert done.returncode == 1
    assert (
        done.stderr
        == (
            f"error: cannot connect to {url}: connection refused; "
            "is the server running? check --kubeconfig/--context\n"
        ).encode()
    )


def test_sigterm_ends_the_session_and_restores_the_terminal(
    workdir: Path, kubeconfig: Callable[[FakeConsole], Path]
) -> None:
    with FakeConsole(interactive) as fake:
        child = spawn_console(workdir, kubeconfig(fake))
        try:
            child.expect_exact(b"ready")
            fake.next_on(4)
            # The leader side reports the follower's modes (Linux), even after the child exits.
            assert not termios.tcgetattr(child.child_fd)[3] & termios.ICANON
            child.kill(signal.SIGTERM)
            child.expect_exact(b"error: stopped by a signal")
            child.expect(pexpect.EOF)
            assert termios.tcgetattr(child.child_fd)[3] & termios.ICANON
        finally:
            child.close(force=True)
    assert child.exitstatus == 1
