"""kubelet's port-forward WebSocket dialect: fixed bytes, ports parsing, round trips."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from subres.protocol import portforward_ws as wire
from subres.protocol.channels import ChannelError, Dialect, Framing
from subres.protocol.portforward_ws import DIALECTS, PortData, PortsError

BINARY = DIALECTS["v4.channel.k8s.io"]
BASE64 = DIALECTS["v4.base64.channel.k8s.io"]
NONE = DIALECTS[""]


def test_fixed_bytes_of_the_first_messages() -> None:
    # Port 8080 = 0x1F90, little-endian: 0x90 0x1F; port 22 = 0x16 0x00.
    assert wire.hello(BINARY, [8080, 22]) == [
        b"\x00\x90\x1f",
        b"\x01\x90\x1f",
        b"\x02\x16\x00",
        b"\x03\x16\x00",
    ]
    assert wire.hello(BASE64, [8080]) == ["0kB8=", "1kB8="]
    assert wire.hello(NONE, [22]) == [b"\x00\x16\x00", b"\x01\x16\x00"]


def test_fixed_bytes_of_data_and_errors() -> None:
    assert wire.data_message(BINARY, 1, b"hi") == b"\x02hi"
    assert wire.error_message(BINARY, 1, "no") == b"\x03no"
    assert wire.data_message(BASE64, 0, b"hi") == "0aGk="
    assert wire.error_message(BASE64, 2, "no") == "5bm8="
    assert wire.decode(BINARY, b"\x02hi", port_count=2) == PortData(1, b"hi")
    assert wire.decode(BASE64, "2aGk=", port_count=2) == PortData(1, b"hi")


@pytest.mark.parametrize(
    "message",
    [b"", b"\x01error channel is write-only", b"\x04beyond the ports", "", "3aGk="],
)
def test_what_kubelet_ignores(message: bytes | str) -> None:
    dialect = BINARY if isinstance(message, bytes) else BASE64
    assert wire.decode(dialect, message, port_count=2) is None


def test_bad_base64_is_an_error() -> None:
    with pytest.raises(ChannelError):
        wire.decode(BASE64, "0not base64!", port_count=1)
    with pytest.raises(ChannelError):
        wire.decode(BASE64, "0é", port_count=1)


def test_negotiation_follows_kubelet() -> None:
    assert wire.negotiate([]) is NONE
    assert NONE.framing is Framing.BINARY
    assert wire.negotiate(["v5.channel.k8s.io", "v4.channel.k8s.io"]) is BINARY
    assert wire.negotiate(["v4.base64.channel.k8s.io", "v4.channel.k8s.io"]) is BASE64
    assert wire.negotiate(["base64url.bearer.authorization.k8s.io.dG9rZW4"]) is NONE
    assert wire.negotiate(["channel.k8s.io"]) is None
    assert wire.negotiate(["SPDY/3.1+portforward.k8s.io"]) is None


@pytest.mark.parametrize(
    ("values", "ports"),
    [
        (["22"], (22,)),
        (["22,8080"], (22, 8080)),
        (["22", "8080,443"], (22, 8080, 443)),
        (["22,22"], (22, 22)),
        (["65535"], (65535,)),
    ],
)
def test_ports(values: list[str], ports: tuple[int, ...]) -> None:
    assert wire.parse_ports(values) == ports


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ([], "is required"),
        ([""], "cannot be empty"),
        (["22,"], "unable to parse"),
        (["+22"], "unable to parse"),
        ([" 22"], "unable to parse"),
        (["2_2"], "unable to parse"),
        (["٢٢"], "unable to parse"),
        (["0"], "must be > 0"),
        (["65536"], "out of range"),
        ([",".join(["1"] * (wire.MAX_PORTS + 1))], "at most"),
    ],
)
def test_bad_ports(values: list[str], words: str) -> None:
    with pytest.raises(PortsError, match=words):
        wire.parse_ports(values)


@given(
    st.sampled_from([BINARY, BASE64, NONE]),
    st.integers(1, wire.MAX_PORTS),
    st.data(),
)
def test_client_data_round_trips(d: Dialect, count: int, data: st.DataObject) -> None:
    index = data.draw(st.integers(0, count - 1))
    payload = data.draw(st.binary(min_size=1, max_size=2048))
    message = wire.data_message(d, index, payload)
    assert wire.decode(d, message, port_count=count) == PortData(index, payload)


@given(st.lists(st.integers(1, 0xFFFF), min_size=1, max_size=wire.MAX_PORTS))
def test_hello_names_every_port(ports: list[int]) -> None:
    messages = wire.hello(BINARY, ports)
    assert len(messages) == 2 * len(ports)
    for channel, message in enumerate(messages):
        assert isinstance(message, bytes) and len(message) == 3
        assert message[0] == channel
        assert message[1] + 256 * message[2] == ports[channel // 2]


@given(st.lists(st.integers(1, 0xFFFF), min_size=1, max_size=20))
def test_ports_round_trip_through_text(ports: list[int]) -> None:
    text = [
        ",".join(map(str, ports[: len(ports) // 2])),
        ",".join(map(str, ports[len(ports) // 2 :])),
    ]
    assert wire.parse_ports([t for t in text if t]) == tuple(ports)
