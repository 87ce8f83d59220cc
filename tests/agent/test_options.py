"""Flags of `subres agent`, and the replica's agent flags: what each mode accepts."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from subres.agent import run
from subres.agent.options import AgentOptions
from subres.backends import endpoint
from subres.main import parser
from subres.server.options import Options


def serve_problems(*args: str) -> list[str]:
    return Options.from_args(parser().parse_args(["serve", *args])).validate()


def agent_problems(*args: str) -> list[str]:
    base = ["agent", "--tls-cert-file=a", "--tls-private-key-file=b", "--client-ca-file=c"]
    return AgentOptions.from_args(parser().parse_args([*base, *args])).validate()


def test_standalone_replicas_name_their_agents(tmp_path: Path) -> None:
    standalone = f"--standalone={tmp_path / 'm.yaml'}"
    assert serve_problems(standalone, "--agent=node-a=https://10.0.0.1:8444") == []
    options = Options.from_args(
        parser().parse_args(["serve", standalone, "--agent", "node-a=https://h:1"])
    )
    assert options.agents == (("node-a", "https://h:1"),)
    assert options.agent_server_name == "subres-agent.subres-system.svc"
    [bad] = serve_problems(standalone, "--agent=node-a=http://10.0.0.1:8444")
    assert "is not https://HOST:PORT" in bad
    # In a cluster, agents come from their pods, never from a list.
    [listed] = serve_problems("--agent=node-a=https://10.0.0.1:8444")
    assert "found by pod" in listed
    [partial] = serve_problems(standalone, "--agent-ca-file=ca.crt")
    assert "go together" in partial


def test_an_agent_needs_a_node_and_something_it_may_dial() -> None:
    assert agent_problems("--node-name=n", "--socket-dir=/run/vms") == []
    problems = agent_problems()
    assert any("--node-name is required" in p for p in problems)
    assert any("could dial nothing" in p for p in problems)
    assert agent_problems("--node-name=n", "--socket-dir=relative") == [
        "--socket-dir relative must be an absolute directory below /"
    ]
    [cidr] = agent_problems("--node-name=n", "--allow-tcp=10.0.0.0/33")
    assert cidr.startswith("--allow-tcp 10.0.0.0/33")


def test_an_agents_allow_tcp_lifts_only_the_denies_it_names() -> None:
    def may_dial(allow: str, address: str) -> bool:
        options = AgentOptions.from_args(
            parser().parse_args(
                ["agent", "--tls-cert-file=a", "--tls-private-key-file=b", "--client-ca-file=c",
                 "--node-name=n", f"--allow-tcp={allow}"]
            )
        )  # fmt: skip
        return endpoint.allowed(ipaddress.ip_address(address), run.policy(options))

    # The node's own loopback, when the operator names it.
    assert may_dial("127.0.0.0/8", "127.0.0.1")
    assert may_dial("127.0.0.0/8", "::ffff:127.0.0.1")
    # Everything, still never the metadata service or link-local, in any spelling.
    assert may_dial("0.0.0.0/0", "10.1.2.3")
    assert not may_dial("0.0.0.0/0", "169.254.169.254")
    assert not may_dial("::/0", "::ffff:169.254.169.254")
    assert not may_dial("0.0.0.0/0", "127.0.0.1")


def test_each_socket_directory_names_the_owner_of_its_sockets(tmp_path: Path) -> None:
    base = ["agent", "--tls-cert-file=a", "--tls-private-key-file=b", "--client-ca-file=c"]
    args = [*base, "--node-name=n", f"--socket-dir={tmp_path}=107:108", "--socket-dir=/run/x"]
    options = AgentOptions.from_args(parser().parse_args(args))
    assert options.socket_dirs == (tmp_path, Path("/run/x"))
    assert options.socket_owners == {tmp_path: (107, 108)}
    assert options.validate() == []
    # Unnamed, the owner is the directory's own.
    plain = AgentOptions.from_args(parser().parse_args([*base, f"--socket-dir={tmp_path}"]))
    [directory] = run.socket_dirs(plain)
    assert (directory.uid, directory.gid) == (tmp_path.stat().st_uid, None)
    for owner in ("x", "107:", "-1", "1" * 4400):
        [problem] = agent_problems("--node-name=n", f"--socket-dir=/run/vms={owner}")
        assert problem == "--socket-dir /run/vms: the owner must be UID[:GID]", owner


def test_the_agent_takes_the_servers_connection_flags() -> None:
    base = ["agent", "--tls-cert-file=a", "--tls-private-key-file=b", "--client-ca-file=c"]
    args = [*base, "--tls-handshake-timeout=2s", "--idle-timeout=1m", "--request-header-timeout=5"]
    options = AgentOptions.from_args(
        parser().parse_args([*args, "--max-unauthenticated-connections=7"])
    )
    limits = options.connections
    assert (limits.tls_handshake_timeout, limits.request_header_timeout) == (2.0, 5.0)
    assert (limits.idle_timeout, limits.max_unauthenticated) == (60.0, 7)
    assert agent_problems("--node-name=n", "--socket-dir=/run/vms", "--idle-timeout=0") == [
        "--idle-timeout must be positive"
    ]
    for endless in ("inf", "nan", "1e999"):
        with pytest.raises(SystemExit):
            parser().parse_args([*base, f"--idle-timeout={endless}"])
