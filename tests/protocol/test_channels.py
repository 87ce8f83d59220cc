"""Kubernetes channel framing and subprotocol negotiation, from fixed bytes and round trips."""

from __future__ import annotations

import base64
import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from subres.protocol import channels
from subres.protocol.channels import (
    DIALECTS,
    NO_SUBPROTOCOL,
    ChannelClosed,
    ChannelData,
    ChannelError,
    TerminalSize,
)

CONSOLE = ("", "plain.kubevirt.io", *DIALECTS)
V5 = DIALECTS["v5.channel.k8s.io"]
V4 = DIALECTS["v4.channel.k8s.io"]
V1 = DIALECTS["channel.k8s.io"]
B64 = DIALECTS["v4.base64.channel.k8s.io"]
RAW = DIALECTS["plain.kubevirt.io"]


def test_fixed_bytes() -> None:
    assert channels.encode(V4, 1, b"hi") == b"\x01hi"
    assert channels.encode(B64, 1, b"hi") == "1aGk="
    assert channels.encode(RAW, 1, b"hi") == b"hi"
    assert channels.decode(V4, b"\x00ls\n") == ChannelData(0, b"ls\n")
    assert channels.decode(B64, "0bHMK") == ChannelData(0, b"ls\n")
    assert channels.decode(V5, b"\xff\x00") == ChannelClosed(0)
    assert channels.decode(RAW, b"\xff\x00") == ChannelData(0, b"\xff\x00")


def test_close_signal_is_v5_only() -> None:
    assert channels.decode(V4, b"\xff\x00") == ChannelData(0xFF, b"\x00")


@pytest.mark.parametrize(
    ("dialect", "message"),
    [
        (V4, b""),
        (V5, b"\xff"),
        (V5, b"\xff\x00\x00"),
        (B64, ""),
        (B64, "x" + base64.b64encode(b"a").decode()),
        (B64, "0***"),
    ],
)
def test_hostile_messages_raise_channel_error(
    dialect: channels.Dialect, message: bytes | str
) -> None:
    with pytest.raises(ChannelError):
        channels.decode(dialect, message)


@given(st.sampled_from(sorted(DIALECTS)), st.integers(0, 9), st.binary(max_size=4096))
def test_round_trip(name: str, channel: int, data: bytes) -> None:
    dialect = DIALECTS[name]
    event = channels.decode(dialect, channels.encode(dialect, channel, data))
    expected = 0 if dialect.framing is channels.Framing.RAW else channel
    assert event == ChannelData(expected, data)


@given(st.binary(max_size=64) | st.text(max_size=64))
def test_arbitrary_input_never_raises_anything_else(message: bytes | str) -> None:
    for dialect in DIALECTS.values():
        with contextlib.suppress(ChannelError):
            channels.decode(dialect, message)


def test_negotiation_follows_client_order() -> None:
    offered = ["v4.channel.k8s.io", "v5.channel.k8s.io"]
    assert channels.negotiate(offered, CONSOLE) == V4
    assert channels.negotiate(["nope", "channel.k8s.io"], CONSOLE) == V1
    assert channels.negotiate([], CONSOLE) == NO_SUBPROTOCOL
    assert channels.negotiate(["nope"], CONSOLE) is None
    assert channels.negotiate([], ("v4.channel.k8s.io",)) is None


def test_bearer_subprotocol() -> None:
    token = "abc.def-ghi"
    encoded = base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")
    offered = [f"{channels.BEARER_PREFIX}{encoded}", "v4.channel.k8s.io"]
    assert channels.bearer_token(offered) == token
    assert channels.without_bearer(offered) == ["v4.channel.k8s.io"]
    assert channels.negotiate(offered, CONSOLE) == V4
    assert channels.negotiate(offered[:1], CONSOLE) == NO_SUBPROTOCOL
    assert channels.bearer_token([f"{channels.BEARER_PREFIX}!!!"]) is None


def test_resize_messages() -> None:
    data = b'{"Width":80,"Height":24}\n{"Width":120,"Height":40}'
    assert channels.parse_resize(data) == [TerminalSize(80, 24), TerminalSize(120, 40)]
    for bad in (b"{", b"[]", b'{"Width":-1,"Height":2}', b'{"Width":true,"Height":2}'):
        with pytest.raises(ChannelError):
            channels.parse_resize(bad)
