"""Kubeconfig loading: file selection and merging, contexts, credentials, TLS, exec plugins.

TLS settings are checked by a real handshake with a local TLS server that
asks for a client certificate and reports whom it saw.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from subres.cli import kubeconfig
from subres.cli.kubeconfig import ClientConfig, KubeconfigError
from subres.main import parser
from subres.serving import certs

HANDSHAKE_TIMEOUT = 10.0
V1 = "client.authentication.k8s.io/v1"
V1BETA1 = "client.authentication.k8s.io/v1beta1"


@dataclass(frozen=True)
class Pki:
    """A CA, a serving pair for 127.0.0.1 and `subres.test`, and a client pair for `alice`."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


@pytest.fixture
def pki(workdir: Path) -> Pki:
    ca = certs.generate_ca("test CA")
    serving = certs.issue_serving(
        ca, common_name="subres.test", dns_names=["subres.test"], ip_addresses=["127.0.0.1"]
    )
    client = certs.issue_client(ca, user="alice", groups=["devs"])
    files = Pki(*(workdir / n for n in ("ca.crt", "tls.crt", "tls.key", "alice.crt", "alice.key")))
    ca.write(files.ca, workdir / "ca.key")
    serving.write(files.server_cert, files.server_key)
    client.write(files.client_cert, files.client_key)
    return files


@pytest.fixture
async def tls_server(pki: Pki) -> AsyncIterator[str]:
    """`https://127.0.0.1:PORT` of a TLS server that takes a client certificate if offered."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    context.load_verify_locations(pki.ca)
    context.verify_mode = ssl.CERT_OPTIONAL

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peercert") or {}
        names = [
            value for rdn in peer.get("subject", ()) for key, value in rdn if key == "commonName"
        ]
        writer.write((names[0] if names else "anonymous").encode())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"https://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


async def whoami(config: ClientConfig) -> str:
    """Handshake with the TLS server as `config` says; the client name the server saw."""
    host, port = config.server.removeprefix("https://").split(":")
    async with asyncio.timeout(HANDSHAKE_TIMEOUT):
        reader, writer = await asyncio.open_connection(
            host, int(port), ssl=config.ssl, server_hostname=config.server_hostname or host
        )
        try:
            return (await reader.read()).decode()
        finally:
            writer.close()


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path


def config_doc(
    *,
    server: str = "https://127.0.0.1:6443",
    cluster: dict[str, Any] | None = None,
    user: dict[str, Any] | None = None,
    namespace: str | None = None,
    name: str = "test",
    current: str | None = "test",
) -> dict[str, Any]:
    """A kubeconfig with one context `name` over cluster and user of the same name."""
    context: dict[str, Any] = {"cluster": name, "user": name}
    if namespace:
        context["namespace"] = namespace
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, **(cluster or {})}}],
        "users": [{"name": name, "user": user or {}}],
        "contexts": [{"name": name, "context": context}],
    }
    if current:
        doc["current-context"] = current
    return doc


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def load(path: Path, **overrides: Any) -> ClientConfig:
    return kubeconfig.load(kubeconfig=str(path), environ={}, **overrides)


def test_token_namespace_and_context(workdir: Path) -> None:
    path = write(workdir / "config", config_doc(user={"token": "abc"}, namespace="team"))
    config = load(path)
    assert config.headers == {"Authorization": "Bearer abc"}
    assert (config.namespace, config.context) == ("team", "test")
    assert (config.server, config.server_hostname) == ("https://127.0.0.1:6443", None)
    assert config.ssl is not None and config.ssl.verify_mode == ssl.CERT_REQUIRED


def test_namespace_flag_wins_and_default_is_default(workdir: Path) -> None:
    assert load(write(workdir / "a", config_doc(namespace="team")), namespace="x").namespace == "x"
    assert load(write(workdir / "b", config_doc())).namespace == "default"


def test_token_file_relative_to_the_kubeconfig(workdir: Path) -> None:
    (workdir / "conf").mkdir()
    (workdir / "conf" / "token").write_text("from-file\n")
    path = write(workdir / "conf" / "config", config_doc(user={"tokenFile": "token"}))
    assert load(path).headers == {"Authorization": "Bearer from-file"}


def test_token_takes_precedence_over_token_file(workdir: Path) -> None:
    user = {"token": "inline", "tokenFile": "absent"}
    assert load(write(workdir / "config", config_doc(user=user))).headers == {
        "Authorization": "Bearer inline"
    }


def test_basic_auth(workdir: Path) -> None:
    user = {"username": "bob", "password": "pw"}
    config = load(write(workdir / "config", config_doc(user=user)))
    assert config.headers == {"Authorization": "Basic " + base64.b64encode(b"bob:pw").decode()}


def test_plain_http_server_has_no_tls(workdir: Path) -> None:
    config = load(write(workdir / "config", config_doc(server="http://127.0.0.1:8080/")))
    assert (config.server, config.ssl) == ("http://127.0.0.1:8080", None)


async def test_ca_file_relative_to_the_kubeconfig(workdir: Path, pki: Pki, tls_server: str) -> None:
    cluster = {"certificate-authority": pki.ca.name}
    config = load(write(workdir / "config", config_doc(server=tls_server, cluster=cluster)))
    assert await whoami(config) == "anonymous"


async def test_ca_data_and_client_certificate_data(pki: Pki, tls_server: str) -> None:
    cluster = {"certificate-authority-data": b64(pki.ca)}
    user = {"client-certificate-data": b64(pki.client_cert), "client-key-data": b64(pki.client_key)}
    path = write(
        pki.ca.parent / "config", config_doc(server=tls_server, cluster=cluster, user=user)
    )
    assert await whoami(load(path)) == "alice"


async def test_client_certificate_files(workdir: Path, pki: Pki, tls_server: str) -> None:
    cluster = {"certificate-authority": str(pki.ca)}
    user = {"client-certificate": pki.client_cert.name, "client-key": pki.client_key.name}
    path = write(workdir / "config", config_doc(server=tls_server, cluster=cluster, user=user))
    assert await whoami(load(path)) == "alice"


async def test_without_the_ca_the_server_is_not_trusted(workdir: Path, tls_server: str) -> None:
    config = load(write(workdir / "config", config_doc(server=tls_server)))
    with pytest.raises(ssl.SSLCertVerificationError):
        await whoami(config)


async def test_insecure_skip_tls_verify(workdir: Path, tls_server: str) -> None:
    cluster = {"insecure-skip-tls-verify": True}
    config = load(write(workdir / "config", config_doc(server=tls_server, cluster=cluster)))
    assert await whoami(config) == "anonymous"


def test_insecure_with_a_ca_is_refused(workdir: Path, pki: Pki) -> None:
    cluster = {"insecure-skip-tls-verify": True, "certificate-authority": str(pki.ca)}
    with pytest.raises(KubeconfigError, match="insecure-skip-tls-verify"):
        load(write(workdir / "config", config_doc(cluster=cluster)))


async def test_tls_server_name(workdir: Path, pki: Pki, tls_server: str) -> None:
    def config(name: str) -> ClientConfig:
        cluster = {"certificate-authority": str(pki.ca), "tls-server-name": name}
        return load(write(workdir / name, config_doc(server=tls_server, cluster=cluster)))

    right = config("subres.test")
    assert right.server_hostname == "subres.test"
    assert await whoami(right) == "anonymous"
    with pytest.raises(ssl.SSLCertVerificationError):
        await whoami(config("wrong.test"))


def test_kubeconfig_list_merges_first_file_wins(workdir: Path) -> None:
    first = config_doc(server="https://first:6443", user={"token": "one"}, current="test")
    second = config_doc(server="https://second:6443", user={"token": "two"}, current="other")
    second["contexts"].append({"name": "other", "context": {"cluster": "test", "namespace": "o"}})
    a, b = write(workdir / "a", first), write(workdir / "b", second)
    env = {"KUBECONFIG": f"{workdir / 'missing'}:{a}:{b}"}
    merged = kubeconfig.load(environ=env)
    assert (merged.context, merged.server, merged.headers["Authorization"]) == (
        "test",
        "https://first:6443",
        "Bearer one",
    )
    other = kubeconfig.load(environ=env, context="other")
    assert (other.server, other.namespace, other.headers) == ("https://first:6443", "o", {})
    swapped = kubeconfig.load(environ={"KUBECONFIG": f"{b}:{a}"})
    assert (swapped.context, swapped.server) == ("other", "https://second:6443")


def test_current_context_from_a_later_file_when_the_first_has_none(workdir: Path) -> None:
    a = write(workdir / "a", config_doc(current=None, user={"token": "a"}))
    b = write(workdir / "b", {"current-context": "test"})
    assert kubeconfig.load(environ={"KUBECONFIG": f"{a}:{b}"}).headers["Authorization"] == (
        "Bearer a"
    )


def test_default_path_under_home(workdir: Path) -> None:
    write(workdir / ".kube" / "config", config_doc(user={"token": "home"}))
    config = kubeconfig.load(environ={"HOME": str(workdir)})
    assert config.headers == {"Authorization": "Bearer home"}


def test_explicit_file_beats_the_environment(workdir: Path) -> None:
    explicit = write(workdir / "explicit", config_doc(user={"token": "explicit"}))
    env = {"KUBECONFIG": str(write(workdir / "env", config_doc(user={"token": "env"})))}
    config = kubeconfig.load(kubeconfig=str(explicit), environ=env)
    assert config.headers == {"Authorization": "Bearer explicit"}


@pytest.mark.parametrize(
    ("doc", "overrides", "message"),
    [
        (config_doc(), {"context": "nope"}, 'context "nope" not found'),
        (config_doc(current=None), {}, "no context chosen"),
        (
            {**config_doc(), "clusters": []},
            {},
            'cluster "test" of context "test" not found',
        ),
        ({**config_doc(), "users": []}, {}, 'user "test" of context "test" not found'),
        (config_doc(server="ftp://x"), {}, "is not an http(s) URL"),
        (config_doc(user={"tokenFile": "absent"}), {}, "cannot read"),
        (config_doc(user={"client-certificate-data": "AAAA"}), {}, "needs its key"),
        (config_doc(user={"client-key-data": "%%%"}), {}, "not valid base64"),
    ],
)
def test_unusable_configurations(
    workdir: Path, doc: dict[str, Any], overrides: dict[str, str], message: str
) -> None:
    with pytest.raises(KubeconfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load(write(workdir / "config", doc), **overrides)


def test_missing_files(workdir: Path) -> None:
    with pytest.raises(KubeconfigError, match="does not exist"):
        kubeconfig.load(kubeconfig=str(workdir / "absent"), environ={})
    with pytest.raises(KubeconfigError, match="none of the files in KUBECONFIG"):
        kubeconfig.load(environ={"KUBECONFIG": f"{workdir / 'a'}:{workdir / 'b'}"})
    with pytest.raises(KubeconfigError, match=r"\.kube/config does not exist"):
        kubeconfig.load(environ={"HOME": str(workdir)})
    (workdir / "bad").write_text("clusters: [unclosed")
    with pytest.raises(KubeconfigError, match="cannot read kubeconfig"):
        kubeconfig.load(kubeconfig=str(workdir / "bad"), environ={})


PLUGIN = """\
#!{python}
import json, os, pathlib, sys
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
seen = {{"info": info, "args": sys.argv[1:], "var": os.environ.get("PLUGIN_VAR")}}
pathlib.Path(__file__).with_name("seen.json").write_text(json.dumps(seen))
answer = {{"apiVersion": os.environ.get("PLUGIN_ANSWER_VERSION", info["apiVersion"]),
          "kind": "ExecCredential", "status": json.loads(os.environ["PLUGIN_STATUS"])}}
print(json.dumps(answer))
sys.exit(int(os.environ.get("PLUGIN_EXIT", "0")))
"""


@pytest.fixture
def plugin(workdir: Path) -> Callable[..., dict[str, Any]]:
    """An exec section running a script in `workdir/bin`, called by a relative path."""
    script = workdir / "bin" / "plugin"
    script.parent.mkdir()
    script.write_text(PLUGIN.format(python=sys.executable))
    script.chmod(0o755)

    def section(status: dict[str, Any], *, api_version: str = V1, **env: str) -> dict[str, Any]:
        variables = {"PLUGIN_STATUS": json.dumps(status), **env}
        return {
            "apiVersion": api_version,
            "command": "./bin/plugin",
            "args": ["get-token", "--cluster", "c1"],
            "env": [{"name": k, "value": v} for k, v in variables.items()],
            "interactiveMode": "Never",
            "installHint": "install the plugin from example.test",
        }

    return section


@pytest.mark.parametrize("api_version", [V1, V1BETA1])
def test_exec_plugin_token(
    workdir: Path, plugin: Callable[..., dict[str, Any]], api_version: str
) -> None:
    exec_ = plugin({"token": "from-plugin"}, api_version=api_version, PLUGIN_VAR="set")
    exec_["provideClusterInfo"] = True
    path = write(workdir / "config", config_doc(user={"exec": exec_}))
    assert load(path).headers == {"Authorization": "Bearer from-plugin"}
    seen = json.loads((workdir / "bin" / "seen.json").read_text())
    assert seen["args"] == ["get-token", "--cluster", "c1"]
    assert seen["var"] == "set"
    assert seen["info"] == {
        "apiVersion": api_version,
        "kind": "ExecCredential",
        "spec": {"interactive": False, "cluster": {"server": "https://127.0.0.1:6443"}},
    }


async def test_exec_plugin_client_certificate(
    workdir: Path, pki: Pki, tls_server: str, plugin: Callable[..., dict[str, Any]]
) -> None:
    status = {
        "clientCertificateData": pki.client_cert.read_text(),
        "clientKeyData": pki.client_key.read_text(),
    }
    cluster = {"certificate-authority": str(pki.ca)}
    doc = config_doc(server=tls_server, cluster=cluster, user={"exec": plugin(status)})
    config = load(write(workdir / "config", doc))
    assert config.headers == {}
    assert await whoami(config) == "alice"


@pytest.mark.parametrize(
    ("status", "env", "message"),
    [
        ({"token": "t"}, {"PLUGIN_EXIT": "3"}, "failed with exit code 3"),
        ({}, {}, "neither a token nor a certificate"),
        ({"clientCertificateData": "x"}, {}, "together"),
        ({"token": "t"}, {"PLUGIN_ANSWER_VERSION": V1BETA1}, "expected"),
    ],
)
def test_exec_plugin_failures(
    workdir: Path,
    plugin: Callable[..., dict[str, Any]],
    status: dict[str, Any],
    env: dict[str, str],
    message: str,
) -> None:
    path = write(workdir / "config", config_doc(user={"exec": plugin(status, **env)}))
    with pytest.raises(KubeconfigError, match=message):
        load(path)


def test_exec_plugin_missing_or_unsupported(
    workdir: Path, plugin: Callable[..., dict[str, Any]]
) -> None:
    missing = {**plugin({"token": "t"}), "command": "subres-no-such-plugin"}
    with pytest.raises(KubeconfigError, match=r"(?s)cannot run.*install the plugin"):
        load(write(workdir / "a", config_doc(user={"exec": missing})))
    old = plugin({"token": "t"}, api_version="client.authentication.k8s.io/v1alpha1")
    with pytest.raises(KubeconfigError, match="not supported"):
        load(write(workdir / "b", config_doc(user={"exec": old})))


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--kubeconfig", "k", "-n", "a", "console", "m"], ("k", None, "a")),
        (["console", "m", "--kubeconfig", "k", "--context", "c"], ("k", "c", None)),
        (["-n", "a", "--context", "c", "console", "m", "--namespace", "b"], (None, "c", "b")),
    ],
)
def test_client_flags_before_and_after_the_verb(
    argv: list[str], expected: tuple[str | None, ...]
) -> None:
    ns = parser().parse_args(argv)
    assert (ns.kubeconfig, ns.context, ns.namespace) == expected


def test_exec_plugin_that_needs_a_terminal_without_one(
    workdir: Path, plugin: Callable[..., dict[str, Any]]
) -> None:
    always = {**plugin({"token": "t"}), "interactiveMode": "Always"}
    with pytest.raises(KubeconfigError, match="needs an interactive terminal"):
        load(write(workdir / "config", config_doc(user={"exec": always})))
