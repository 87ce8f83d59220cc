"""What a verb's target means, and how failures read: unit rules, then the real demo.

The grammar is the browser page's: `NAME`, `TYPE/NAME` when TYPE is a type
the API serves, else `NAMESPACE/NAME`. Failures read as kubectl's do.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import aiohttp
import pytest

from subres.cli import api
from subres.cli.api import CommandError, Target
from subres.cli.credentials import Credentials
from subres.cli.kubeconfig import ClientConfig
from tests.cli.conftest import Demo, run_cli, write_kubeconfig


def _config(namespace: str = "home") -> ClientConfig:
    # A server nobody listens on: the default types must need no request.
    return ClientConfig(
        server="https://127.0.0.1:1",
        ssl=None,
        server_hostname=None,
        credentials=Credentials({}),
        namespace=namespace,
        context="test",
    )


@pytest.mark.parametrize(
    ("text", "target"),
    [
        ("demo", Target("machine", "machines", "home", "demo")),
        ("machine/demo", Target("machine", "machines", "home", "demo")),
        ("Machines/demo", Target("machines", "machines", "home", "demo")),
    ],
)
async def test_default_types_need_no_request(text: str, target: Target) -> None:
    typed = api.parse_target(text)
    got = await api.resolve(
        typed, _config(), group_version=api.DEFAULT_GROUP_VERSION, namespace_flag=None
    )
    assert got == target


@pytest.mark.parametrize("text", ["", "/demo", "machine/", "a/b/c"])
def test_malformed_targets(text: str) -> None:
    with pytest.raises(CommandError, match="expected NAME, TYPE/NAME or NAMESPACE/NAME"):
        api.parse_target(text)


def test_a_status_reads_as_kubectl_prints_it() -> None:
    body = b'{"kind":"Status","status":"Failure","message":"m \\"x\\" is not Running",'
    body += b'"reason":"Conflict","code":409}'
    assert api.refusal(409, body).line() == 'Error from server (Conflict): m "x" is not Running'
    assert api.refusal(401, b"{}").line() == (
        "error: You must be logged in to the server (Unauthorized)"
    )
    # Not a Status (a proxy's page, an empty answer): the reason comes from the code.
    assert api.refusal(502, b"<html>bad gateway</html>").line() == (
        "Error from server (Unknown): <html>bad gateway</html>"
    )
    assert api.refusal(503, b"").line() == (
        "Error from server (ServiceUnavailable): the server answered 503 and said nothing more"
    )


def test_a_group_nobody_serves_suggests_checking_the_apiservice() -> None:
    body = b'{"kind":"Status","message":"the server could not find the requested resource",'
    body += b'"reason":"NotFound","code":404}'
    assert api.refusal(404, body).line().splitlines() == [
        "Error from server (NotFound): the server could not find the requested resource",
        "hint: is subres installed here, its APIService Available? (kubectl get apiservices)",
    ]
    # kube-apiserver itself answers such a path in plain text.
    assert "kubectl get apiservices" in api.refusal(404, b"404 page not found\n").line()


def test_a_namespace_target_adds_its_hint_to_a_404_only() -> None:
    target = Target("machine", "machines", "other", "demo", hint="hint: read as NAMESPACE/NAME")
    assert api.refusal(404, b"", target=target).line().endswith("\nhint: read as NAMESPACE/NAME")
    assert "hint" not in api.refusal(403, b"", target=target).line()


async def test_library_failures_never_show_object_reprs() -> None:
    # aiohttp's connector error names the SSLContext object in its text.
    context = ssl.create_default_context()
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.ClientConnectorError) as caught:
            await http.get("https://127.0.0.1:1/", ssl=context)
    assert "object at 0x" in str(caught.value)
    error = api.unreachable(_config(), caught.value)
    assert error.line() == (
        "error: cannot connect to https://127.0.0.1:1: connection refused; "
        "is the server running? check --kubeconfig/--context"
    )


def test_describe_words() -> None:
    assert api.describe(TimeoutError()) == "timed out"
    assert api.describe(OSError(113, "No route to host")) == "no route to host"
    assert api.describe(ValueError("<x.Y object at 0xdeadbeef> broke")) == "… broke"


def test_unknown_first_part_is_a_namespace_with_a_hint(demo: Demo, workdir: Path) -> None:
    done = run_cli(["--kubeconfig", demo.kubeconfig, "console", "other/demo"], home=workdir)
    assert done.returncode == 1
    assert done.stderr.decode().splitlines() == [
        'Error from server (NotFound): machines.subres.dev "demo" not found in namespace "other"',
        "hint: \"other/demo\" was read as NAMESPACE/NAME; 'other' is not a type here "
        "(the types are machine, machines), so for a type/name pair use one of those",
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["console", "VM/demo"], "error: unknown type 'VM' in 'VM/demo': the types here are"),
        (["-n", "a", "console", "b/demo"], "error: 'b/demo' names namespace 'b' but -n says 'a'"),
    ],
)
def test_targets_refused_before_connecting(
    demo: Demo, workdir: Path, args: list[str], message: str
) -> None:
    done = run_cli(["--kubeconfig", demo.kubeconfig, *args], home=workdir)
    assert done.returncode == 1
    assert done.stderr.decode().startswith(message), done.stderr


def test_screenshot_of_a_dead_server_has_a_hint_and_no_internals(workdir: Path) -> None:
    kubeconfig = write_kubeconfig(
        workdir / "kubeconfig",
        server="https://127.0.0.1:1",
        cluster={"insecure-skip-tls-verify": True},
    )
    done = run_cli(
        ["--kubeconfig", kubeconfig, "screenshot", "demo", "-o", workdir / "x.png"], home=workdir
    )
    assert done.returncode == 1
    assert done.stderr == (
        b"error: cannot connect to https://127.0.0.1:1: connection refused; "
        b"is the server running? check --kubeconfig/--context\n"
    )
    assert not (workdir / "x.png").exists()


def test_untrusted_server_says_so(demo: Demo, workdir: Path) -> None:
    kubeconfig = write_kubeconfig(workdir / "kubeconfig", server=demo.url)
    done = run_cli(["--kubeconfig", kubeconfig, "console", "demo"], home=workdir)
    assert done.returncode == 1
    text = done.stderr.decode()
    assert text.startswith(f"error: cannot connect to {demo.url}: the server's certificate is not")
    assert "is the server running" not in text


async def test_unreachable_hint_through_the_async_api() -> None:
    with pytest.raises(api.Unreachable, match="is the server running"):
        async with asyncio.timeout(30):
            await api.connect(
                _config(), "ws://127.0.0.1:1/x", subprotocols=None, max_size=1, close_timeout=1
            )
