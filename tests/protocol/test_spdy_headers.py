"""SPDY/3 header blocks: layout, the per-direction zlib streams and their limits."""

from __future__ import annotations

import struct
import tracemalloc
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from subres.protocol.spdy.dictionary import SPDY3_DICTIONARY
from subres.protocol.spdy.errors import HeaderBlockError, ProtocolError
from subres.protocol.spdy.headers import (
    HeaderDecoder,
    HeaderEncoder,
    Headers,
    normalize_headers,
    pack_block,
    unpack_block,
)

NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-:._", min_size=1, max_size=24)
VALUES = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\0"), max_size=40
)


@st.composite
def header_lists(draw: st.DrawFn) -> Headers:
    grouped = draw(st.dictionaries(NAMES, st.lists(VALUES, min_size=1, max_size=3), max_size=8))
    return tuple((name, value) for name, values in grouped.items() for value in values)


class Peer:
    """A peer's zlib streams built directly on zlib, not on our classes."""

    def __init__(self) -> None:
        self.deflate = zlib.compressobj(9, zlib.DEFLATED, 15, 9, zdict=SPDY3_DICTIONARY)
        self.inflate = zlib.decompressobj(zdict=SPDY3_DICTIONARY)

    def compress(self, block: bytes) -> bytes:
        return self.deflate.compress(block) + self.deflate.flush(zlib.Z_SYNC_FLUSH)


def block(*pairs: tuple[bytes, bytes], count: int | None = None) -> bytes:
    out = struct.pack(">I", len(pairs) if count is None else count)
    for name, value in pairs:
        out += struct.pack(">I", len(name)) + name + struct.pack(">I", len(value)) + value
    return out


def decoder(max_block_size: int = 1 << 16, max_count: int = 100) -> HeaderDecoder:
    return HeaderDecoder(max_block_size=max_block_size, max_count=max_count)


@given(st.lists(header_lists(), min_size=1, max_size=30))
def test_many_blocks_round_trip_over_one_stream(blocks: list[Headers]) -> None:
    encoder, dec = HeaderEncoder(), decoder()
    for headers in blocks:
        assert dec.decode(encoder.encode(headers)) == headers


@given(st.lists(header_lists(), min_size=1, max_size=10))
def test_encoder_output_reads_with_plain_zlib(blocks: list[Headers]) -> None:
    encoder, peer = HeaderEncoder(), Peer()
    for headers in blocks:
        assert peer.inflate.decompress(encoder.encode(headers)) == pack_block(headers)


@given(st.lists(header_lists(), min_size=1, max_size=10))
def test_decoder_reads_plain_zlib_output(blocks: list[Headers]) -> None:
    dec, peer = decoder(), Peer()
    for headers in blocks:
        assert dec.decode(peer.compress(pack_block(headers))) == headers


def test_mapping_and_pairs_are_accepted() -> None:
    assert normalize_headers({"a": "1", "b": "2"}) == (("a", "1"), ("b", "2"))
    assert normalize_headers([("a", "1"), ("a", "2")]) == (("a", "1"), ("a", "2"))


@pytest.mark.parametrize(
    "headers",
    [
        [("", "x")],
        [("Host", "x")],
        [("a\0b", "x")],
        [("a", "x\0y")],
        [("a", "1"), ("b", "2"), ("a", "3")],
    ],
)
def test_encoder_refuses_what_the_wire_cannot_carry(headers: list[tuple[str, str]]) -> None:
    encoder = HeaderEncoder()
    with pytest.raises(ValueError):
        encoder.encode(headers)
    # the refused block never reached the zlib stream: the next one still decodes
    assert decoder().decode(encoder.encode({"a": "b"})) == (("a", "b"),)


def test_non_utf8_bytes_survive() -> None:
    headers = unpack_block(block((b"x", b"\xff\xfe")), max_count=10)
    assert pack_block(headers) == block((b"x", b"\xff\xfe"))


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "truncated"),
        (b"\0\0\0", "truncated"),
        (block(count=2), "truncated"),
        (block((b"a", b"1"))[:-1], "past the block"),
        (block((b"a", b"1")) + b"\0", "after the last"),
        (struct.pack(">II", 1, 0xFFFFFFFF) + b"abc", "past the block"),
        (block((b"Host", b"x")), "lowercase"),
        (block((b"", b"x")), "empty"),
        (block((b"a", b"1"), (b"a", b"2")), "duplicate"),
        (block(*[(b"h%d" % i, b"") for i in range(101)]), "more than the limit"),
        (block(count=0xFFFFFFFF), "more than the limit"),
    ],
)
def test_malformed_blocks_cost_only_their_stream(raw: bytes, message: str) -> None:
    peer, dec = Peer(), decoder()
    with pytest.raises(HeaderBlockError, match=message):
        dec.decode(peer.compress(raw))
    assert dec.decode(peer.compress(block((b"ok", b"1")))) == (("ok", "1"),)


def test_zlib_bomb_raises_without_growing_memory() -> None:
    bomb = Peer().compress(block((b"a", b"a" * (64 << 20))))
    assert len(bomb) < 128 * 1024
    dec = decoder(max_block_size=64 * 1024)
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError, match="over 65536 bytes"):
            dec.decode(bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_block_exactly_at_the_limit_is_accepted() -> None:
    raw = block((b"a", b"b" * 100))
    assert decoder(max_block_size=len(raw)).decode(Peer().compress(raw)) == (("a", "b" * 100),)
    with pytest.raises(ProtocolError):
        decoder(max_block_size=len(raw) - 1).decode(Peer().compress(raw))


@pytest.mark.parametrize(
    "compressed",
    [
        b"not zlib at all",
        zlib.compress(block((b"a", b"b"))),  # no dictionary: wrong FDICT id
    ],
)
def test_undecompressable_block_ends_the_session(compressed: bytes) -> None:
    with pytest.raises(ProtocolError):
        decoder().decode(compressed)


def test_peer_that_finishes_its_zlib_stream_ends_the_session() -> None:
    deflate = zlib.compressobj(9, zlib.DEFLATED, 15, 9, zdict=SPDY3_DICTIONARY)
    finished = deflate.compress(block((b"a", b"b"))) + deflate.flush(zlib.Z_FINISH)
    with pytest.raises(ProtocolError, match="ended"):
        decoder().decode(finished)
