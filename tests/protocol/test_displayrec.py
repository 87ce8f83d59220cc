"""Display recordings and the RFB watching client: fixed bytes, round trips, hostile input."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from subres.protocol import displayrec, rfb
from subres.protocol.displayrec import DisplayRecordingError, End, Frame, Mark, Rect, Screen
from subres.protocol.rfbwatch import Changed, FrameReady, WatchClient
from tests.protocol.test_rfb import HANDSHAKE_38, pixels, rect, rgb, server_init, update

END_RECORD = b"\x04\x00\x00\x00\x07"


def test_a_block_is_its_head_then_its_compressed_records() -> None:
    block = displayrec.seal(False, 7, END_RECORD)
    payload = zlib.compress(END_RECORD, 1)
    assert block == (
        b"SD\x00\x00" + struct.pack(">III", 7, len(payload), zlib.crc32(payload)) + payload
    )
    assert list(displayrec.records(payload)) == [End(7)]


def test_a_frames_rows_are_stored_xored_with_the_row_above() -> None:
    rows = [b"\x10\x20\x30\x40\x50\x60", b"\x11\x20\x30\x40\x50\x61"]
    frame = struct.pack(">BIHH", 1, 0, 2, 2) + b"".join(rows)
    block = displayrec.seal(True, 0, frame)
    assert block[2] == 1, "a key block"
    stored = zlib.decompress(block[16:])
    assert stored == frame[:9] + rows[0] + b"\x01\x00\x00\x00\x00\x01"
    assert list(displayrec.records(block[16:])) == [Frame(0, 2, 2, b"".join(rows))]


def test_the_header_is_a_signature_line_and_a_json_line() -> None:
    data = displayrec.Header(1714557723, "Machine default/vm1 vnc").encode()
    assert data == (
        b'SUBRES-DISPLAY/1\n{"timestamp": 1714557723, "title": "Machine default/vm1 vnc"}\n'
    )
    assert displayrec.read_header(data) == (
        displayrec.Header(1714557723, "Machine default/vm1 vnc"),
        len(data),
    )


@st.composite
def recordings(draw: st.DrawFn) -> list[displayrec.Record]:
    width = draw(st.integers(1, 6))
    height = draw(st.integers(1, 6))
    out: list[displayrec.Record] = [
        Frame(
            0,
            width,
            height,
            draw(st.binary(min_size=width * height * 3, max_size=width * height * 3)),
        )
    ]
    for time in range(1, draw(st.integers(0, 8)) + 1):
        if draw(st.booleans()):
            x, y = draw(st.integers(0, width - 1)), draw(st.integers(0, height - 1))
            w, h = draw(st.integers(1, width - x)), draw(st.integers(1, height - y))
            out.append(
                Rect(time, x, y, w, h, draw(st.binary(min_size=w * h * 3, max_size=w * h * 3)))
            )
        else:
            out.append(Mark(time, draw(st.text(max_size=20))))
    return [*out, End(99)]


def write(records: list[displayrec.Record], *, split: int) -> bytes:
    """A file of `records`, a block every `split` records after the key frame's."""
    writer = displayrec.Writer()
    data = bytearray(displayrec.Header(1, "t").encode())
    for number, record in enumerate(records):
        if isinstance(record, Frame):
            writer.frame(record.time, record.width, record.height, record.rgb)
        elif isinstance(record, Rect):
            writer.rect(record.time, (record.x, record.y, record.width, record.height), record.rgb)
        elif isinstance(record, Mark):
            writer.mark(record.time, record.text)
        else:
            writer.end(record.time)
        if number % split == 0 and (taken := writer.take()) is not None:
            data += displayrec.seal(*taken)
    if (taken := writer.take()) is not None:
        data += displayrec.seal(*taken)
    return bytes(data)


def read(data: bytes) -> list[displayrec.Record]:
    _, offset = displayrec.read_header(data)
    return [
        record
        for ref in displayrec.blocks(data, offset)
        for record in displayrec.records(data[ref.offset : ref.offset + ref.length])
    ]


@given(recordings(), st.integers(1, 4))
def test_records_come_back_as_written_however_they_are_split(
    records: list[displayrec.Record], split: int
) -> None:
    data = write(records, split=split)
    assert read(data) == records
    assert displayrec.complete_size(data) == len(data)
    _, offset = displayrec.read_header(data)
    refs = list(displayrec.blocks(data, offset))
    assert refs[0].key and not any(ref.key for ref in refs[1:])


@given(recordings(), st.data())
def test_a_file_cut_anywhere_plays_up_to_its_last_whole_block(
    records: list[displayrec.Record], data: st.DataObject
) -> None:
    whole = write(records, split=1)
    cut = data.draw(st.integers(0, len(whole)))
    size = displayrec.complete_size(whole[:cut])
    assert size <= cut
    if size:
        assert read(whole[:size]) == records[: len(read(whole[:size]))]


def test_a_screen_draws_frames_and_rects_and_refuses_rects_outside() -> None:
    screen = Screen()
    screen.apply(Frame(0, 2, 2, bytes(12)))
    screen.apply(Rect(1, 1, 1, 1, 1, b"\xff\x00\x80"))
    assert screen.rgb == bytes(9) + b"\xff\x00\x80"
    with pytest.raises(DisplayRecordingError, match="outside the 2x2 screen"):
        screen.apply(Rect(2, 1, 1, 2, 1, bytes(6)))


def bomb(size: int) -> bytes:
    """`size` zero bytes, compressed a MiB at a time (never held whole)."""
    deflate = zlib.compressobj(9)
    chunks = [deflate.compress(bytes(1 << 20)) for _ in range(size >> 20)]
    return b"".join(chunks) + deflate.compress(bytes(size & 0xFFFFF)) + deflate.flush()


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (zlib.compress(b"\x09\x00\x00\x00\x00"), "unknown record type 9"),
        (zlib.compress(b"\x01\x00\x00\x00\x00\x10\x00\x10\x00"), "pixels run past their block"),
        (zlib.compress(struct.pack(">BIHH", 1, 0, 8192, 8192)), "over 16777216 pixels"),
        (zlib.compress(b"\x03\x00\x00\x00\x00\x00\x09ab"), "a marker runs past its block"),
        (zlib.compress(b"\x02\x00\x00"), "a record runs past its block"),
        (b"not zlib", "does not decompress"),
        (bomb(displayrec.MAX_BLOCK + 1), "holds more than"),
    ],
)
def test_hostile_blocks_are_refused_with_the_reason(payload: bytes, message: str) -> None:
    with pytest.raises(DisplayRecordingError, match=message):
        list(displayrec.records(payload))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"RFB 003.008\n", "not a display recording"),
        (displayrec.MAGIC + b"x" * 5000, "no header line"),
        (displayrec.MAGIC + b"[1]\n", "a JSON object"),
        (displayrec.MAGIC + b'{"timestamp": "1"}\n', "timestamp must be"),
    ],
)
def test_hostile_headers_are_refused(data: bytes, message: str) -> None:
    with pytest.raises(DisplayRecordingError, match=message):
        displayrec.read_header(data)


def test_a_bad_checksum_ends_the_blocks_there() -> None:
    good = displayrec.Header(1).encode() + displayrec.seal(False, 0, END_RECORD)
    bad = bytearray(good + displayrec.seal(False, 1, END_RECORD))
    bad[-1] ^= 1
    assert displayrec.complete_size(bytes(bad)) == len(good)


# --- the watching client -------------------------------------------------------------------


def watching(width: int = 4, height: int = 2) -> tuple[WatchClient, bytes]:
    """A client past ServerInit, and the whole frame it was sent."""
    client = WatchClient()
    wire = pixels(width, height)
    events = client.receive_data(HANDSHAKE_38 + server_init(width, height))
    assert [type(e).__name__ for e in events] == ["ServerInitialised"]
    events = client.receive_data(update(rect((0, 0, width, height), rfb.RAW, wire)))
    assert events == [FrameReady(width, height)]
    assert bytes(client.framebuffer) == rgb(wire)
    return client, wire


def test_the_watcher_asks_for_resizes_and_whole_frames_then_updates_at_its_pace() -> None:
    client = WatchClient()
    client.receive_data(HANDSHAKE_38 + server_init(4, 2))
    sent = client.data_to_send()
    encodings = struct.pack(">BxH3i", 2, 3, rfb.RAW, rfb.DESKTOP_SIZE, rfb.EXTENDED_DESKTOP_SIZE)
    assert encodings in sent
    assert sent.endswith(struct.pack(">BBHHHH", 3, 0, 0, 0, 4, 2))
    client, _ = watching()
    client.data_to_send()
    assert client.data_to_send() == b"", "nothing is asked until the driver asks"
    client.request()
    assert client.data_to_send() == struct.pack(">BBHHHH", 3, 1, 0, 0, 4, 2)


def test_an_incremental_update_says_what_changed_and_cut_text_is_read_past() -> None:
    client, _ = watching()
    cut = b"\x03\x00\x00\x00" + struct.pack(">I", 6) + b"secret"
    one = bytes([10, 20, 30, 0])
    events = client.receive_data(cut + update(rect((1, 1, 1, 1), rfb.RAW, one)))
    assert events == [Changed(((1, 1, 1, 1),))]
    assert client.pixels(1, 1, 1, 1) == bytes([30, 20, 10])
    assert b"secret" not in bytes(client.framebuffer)


def test_a_resize_is_answered_with_a_whole_frame_of_the_new_size() -> None:
    client, _ = watching()
    client.data_to_send()
    events = client.receive_data(update(rect((0, 0, 2, 3), rfb.DESKTOP_SIZE)))
    assert events == []
    assert client.data_to_send() == struct.pack(">BBHHHH", 3, 0, 0, 0, 2, 3)
    events = client.receive_data(update(rect((0, 0, 2, 3), rfb.RAW, pixels(2, 3, seed=5))))
    assert events == [FrameReady(2, 3)]
    assert client.size == (2, 3)


def test_a_desktop_size_of_the_same_size_is_not_a_resize() -> None:
    client, _ = watching()
    client.data_to_send()
    same = rect((0, 0, 4, 2), rfb.EXTENDED_DESKTOP_SIZE, b"\x01\x00\x00\x00" + bytes(16))
    events = client.receive_data(update(same, rect((0, 0, 1, 1), rfb.RAW, bytes(4))))
    assert events == [Changed(((0, 0, 1, 1),))]
    assert client.data_to_send() == b"", "no whole frame asked for again"
