"""The SPDY upgrade handshake, as apimachinery's httpstream.Handshake decides it."""

from __future__ import annotations

import pytest

from subres.protocol import httpstream

SUPPORTED = ("v4.channel.k8s.io", "v3.channel.k8s.io", "channel.k8s.io")


@pytest.mark.parametrize(
    "values",
    [
        ["v5.channel.k8s.io", "v4.channel.k8s.io", "channel.k8s.io"],
        ["v5.channel.k8s.io, v4.channel.k8s.io,channel.k8s.io"],
        [" v5.channel.k8s.io ,", "v4.channel.k8s.io"],
    ],
)
def test_first_offered_supported_protocol_wins(values: list[str]) -> None:
    assert httpstream.negotiate(values, SUPPORTED) == "v4.channel.k8s.io"


def test_client_order_beats_server_order() -> None:
    assert httpstream.negotiate(["channel.k8s.io, v4.channel.k8s.io"], SUPPORTED) == (
        "channel.k8s.io"
    )


@pytest.mark.parametrize("values", [None, [], [" , ,"]])
def test_nothing_offered_is_400(values: list[str] | None) -> None:
    with pytest.raises(httpstream.HandshakeRefused) as refused:
        httpstream.negotiate(values, SUPPORTED)
    assert refused.value.code == 400 and not refused.value.accepted


def test_nothing_supported_is_403_listing_each_accepted_protocol() -> None:
    with pytest.raises(httpstream.HandshakeRefused) as refused:
        httpstream.negotiate(["v9.channel.k8s.io"], SUPPORTED)
    assert refused.value.code == 403
    assert refused.value.accepted == SUPPORTED


@pytest.mark.parametrize(
    ("connection", "upgrade", "wanted"),
    [
        (["Upgrade"], ["SPDY/3.1"], True),
        (["keep-alive, upgrade"], ["spdy/3.1"], True),
        (["close"], ["SPDY/3.1"], False),
        (["Upgrade"], ["websocket"], False),
        ([], [], False),
    ],
)
def test_spdy_upgrade_detection(connection: list[str], upgrade: list[str], wanted: bool) -> None:
    assert httpstream.is_spdy_upgrade(connection, upgrade) is wanted


def test_switching_headers() -> None:
    assert httpstream.switching_headers("portforward.k8s.io") == (
        ("Connection", "Upgrade"),
        ("Upgrade", "SPDY/3.1"),
        ("X-Stream-Protocol-Version", "portforward.k8s.io"),
    )
