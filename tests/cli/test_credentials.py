"""Exec plugin credentials kept fresh: when they expire, and when the server refuses them.

Unit tests drive `Credentials` with a fake clock and a counting plugin; the
end-to-end tests rotate the server's tokens under a running `subres
port-forward` whose exec plugin hands out the current one, and count on
every later connection still getting through.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from subres.cli import execplugin
from subres.cli.credentials import Credentials
from subres.cli.execplugin import Credential
from tests.cli.portforward_support import listening, round_trip, spawn, stop
from tests.server.portforward_support import port_of
from tests.support import Backend, Standalone


class Plugin:
    """A plugin stand-in: hands out `token-N`, expiring `ttl` seconds after each run."""

    def __init__(self, clock: Callable[[], float], *, ttl: float | None, rotate: bool = True):
        self.runs = 0
        self._clock = clock
        self._ttl = ttl
        self._rotate = rotate

    def __call__(self) -> Credential:
        self.runs += 1
        expires = None if self._ttl is None else self._clock() + self._ttl
        token = f"token-{self.runs if self._rotate else 1}"
        return Credential(token=token, expires=expires)


class Clock:
    """Time that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _credentials(plugin: Plugin, clock: Clock) -> Credentials:
    first = plugin()
    return Credentials(
        {"Authorization": f"Bearer {first.token}"}, plugin=plugin, current=first, clock=clock
    )


async def test_expired_credentials_are_fetched_again_and_only_then() -> None:
    clock = Clock()
    plugin = Plugin(clock, ttl=60)
    creds = _credentials(plugin, clock)
    assert await creds.fresh() == {"Authorization": "Bearer token-1"}
    clock.now += 59
    assert await creds.fresh() == {"Authorization": "Bearer token-1"}
    clock.now += 1
    # Many dials at the moment of expiry: one run of the plugin.
    got = await asyncio.gather(*(creds.fresh() for _ in range(5)))
    assert got == [{"Authorization": "Bearer token-2"}] * 5
    assert plugin.runs == 2


async def test_without_an_expiry_only_a_401_fetches_again() -> None:
    clock = Clock()
    plugin = Plugin(clock, ttl=None)
    creds = _credentials(plugin, clock)
    clock.now += 10**9
    assert await creds.fresh() == {"Authorization": "Bearer token-1"}
    assert await creds.rejected({"Authorization": "Bearer token-1"}) is True
    assert await creds.fresh() == {"Authorization": "Bearer token-2"}
    # A 401 to headers already replaced: retry with the new ones, no new run.
    assert await creds.rejected({"Authorization": "Bearer token-1"}) is True
    assert plugin.runs == 2


async def test_a_plugin_that_hands_out_the_same_token_is_not_retried() -> None:
    clock = Clock()
    plugin = Plugin(clock, ttl=None, rotate=False)
    creds = _credentials(plugin, clock)
    assert await creds.rejected({"Authorization": "Bearer token-1"}) is False


async def test_fixed_credentials_never_change() -> None:
    creds = Credentials({"Authorization": "Bearer fixed"})
    assert not creds.expired()
    assert await creds.fresh() == {"Authorization": "Bearer fixed"}
    assert await creds.rejected({"Authorization": "Bearer fixed"}) is False


async def test_a_new_client_certificate_is_loaded() -> None:
    loaded: list[tuple[bytes, bytes]] = []
    clock = Clock()

    def plugin() -> Credential:
        return Credential(client_certificate=b"C2", client_key=b"K2", expires=clock() + 5)

    creds = Credentials(
        {},
        plugin=plugin,
        current=Credential(client_certificate=b"C1", client_key=b"K1", expires=clock() + 5),
        reload_certificate=lambda cert, key: loaded.append((cert, key)),
        clock=clock,
    )
    clock.now += 5
    assert await creds.fresh() == {}
    assert loaded == [(b"C2", b"K2")]


@pytest.mark.parametrize(
    ("stamp", "expected"),
    [("2030-01-02T03:04:05Z", 1893553445.0), ("2030-01-02T04:04:05+01:00", 1893553445.0)],
)
def test_expiration_timestamps(stamp: str, expected: float) -> None:
    answer = {"apiVersion": "v", "kind": "ExecCredential", "status": {"token": "t"}}
    answer["status"] = {"token": "t", "expirationTimestamp": stamp}
    assert execplugin._credential(json.dumps(answer).encode(), "v", "p").expires == expected


@pytest.mark.parametrize("stamp", ["tomorrow", "2030-01-02T03:04:05"])
def test_bad_expiration_timestamps(stamp: str) -> None:
    answer = {"apiVersion": "v", "kind": "ExecCredential"}
    answer["status"] = {"token": "t", "expirationTimestamp": stamp}  # type: ignore[assignment]
    with pytest.raises(execplugin.ExecPluginError, match="expirationTimestamp"):
        execplugin._credential(json.dumps(answer).encode(), "v", "p")


# --- a running port-forward while the server's tokens rotate ---------------------------------

PLUGIN = """\
#!{python}
import json, pathlib
here = pathlib.Path(__file__).parent
runs = here / "runs"
runs.write_text(runs.read_text() + "x" if runs.exists() else "x")
status = {{"token": (here / "token").read_text().strip()}}
if (here / "expiry").exists():
    status["expirationTimestamp"] = (here / "expiry").read_text().strip()
print(json.dumps({{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                  "status": status}}))
"""


def _exec_kubeconfig(subres: Standalone, *, expiry: str | None) -> Path:
    """The server's kubeconfig with its token replaced by an exec plugin in `dir/plugin`."""
    plugin_dir = subres.dir / "plugin"
    plugin_dir.mkdir()
    script = plugin_dir / "get-token"
    script.write_text(PLUGIN.format(python=sys.executable))
    script.chmod(0o755)
    (plugin_dir / "token").write_text(subres.token)
    if expiry is not None:
        (plugin_dir / "expiry").write_text(expiry)
    doc = yaml.safe_load(subres.kubeconfig().read_text())
    doc["users"][0]["user"] = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": str(script),
            "interactiveMode": "Never",
        }
    }
    path = subres.dir / "exec-kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


def _rotate(subres: Standalone, token: str) -> None:
    """The server accepts only `token` from now on; the plugin hands it out."""
    tokens = subres.dir / "tokens.csv"
    scratch = tokens.with_suffix(".new")
    scratch.write_text(f'{token},alice,alice-uid,"devs,ops"\n')
    scratch.replace(tokens)
    subres.server.state.authenticator.reload_if_changed()  # type: ignore[attr-defined]
    (subres.dir / "plugin" / "token").write_text(token)


@pytest.mark.parametrize(
    "expiry",
    [
        # Always expired: every dial runs the plugin first.
        "2000-01-01T00:00:00Z",
        # Never expires: the server's 401 makes the CLI run it again and retry.
        None,
    ],
)
async def test_port_forward_keeps_working_across_token_rotation(
    subres: Standalone, backends: tuple[Backend, Backend], expiry: str | None
) -> None:
    echo, _ = backends
    kubeconfig = _exec_kubeconfig(subres, expiry=expiry)
    # The verb's --kubeconfig wins over the one spawn() puts before it.
    proc = await spawn(subres, "vm1", f"0:{port_of(echo.url)}", "--kubeconfig", str(kubeconfig))
    try:
        (local,) = await listening(proc, 1)
        assert await round_trip(local, b"first") == b"first"
        _rotate(subres, "rotated-token-1")
        assert await round_trip(local, b"second") == b"second"
        _rotate(subres, "rotated-token-2")
        assert await round_trip(local, b"third") == b"third"
    finally:
        await stop(proc)
    assert proc.returncode == 0
    runs = len((subres.dir / "plugin" / "runs").read_text())
    assert runs >= 3
