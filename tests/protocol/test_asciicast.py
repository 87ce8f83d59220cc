"""asciicast v2 lines against the format's own examples, split characters and hostile files."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from subres.protocol.asciicast import Encoder, Event, Header, RecordingError, read


def test_a_header_and_events_as_asciinema_writes_them() -> None:
    header = Header(width=80, height=24, timestamp=1504467315, title="Demo", env={"TERM": "xterm"})
    assert json.loads(header.encode()) == {
        "version": 2,
        "width": 80,
        "height": 24,
        "timestamp": 1504467315,
        "title": "Demo",
        "env": {"TERM": "xterm"},
    }
    encoder = Encoder(start=100.0)
    assert encoder.output(100.248848, b"\x1b[1;31mHello \x1b[32mWorld!\x1b[0m\n") == (
        b'[0.248848, "o", "\\u001b[1;31mHello \\u001b[32mWorld!\\u001b[0m\\n"]\n'
    )
    assert encoder.resize(101.5, 120, 40) == b'[1.5, "r", "120x40"]\n'
    assert encoder.marker(102.0, "bob attached") == b'[2.0, "m", "bob attached"]\n'


def test_a_character_split_between_reads_is_written_once_whole() -> None:
    encoder = Encoder(start=0.0)
    euro = "€".encode()
    assert encoder.output(1.0, b"price: " + euro[:1]) == b'[1.0, "o", "price: "]\n'
    assert encoder.output(2.0, euro[1:2]) == b""
    assert encoder.output(3.0, euro[2:] + b"5") == '[3.0, "o", "€5"]\n'.encode()
    assert encoder.output(4.0, b"\xff") == '[4.0, "o", "\ufffd"]\n'.encode()


def test_times_never_go_back() -> None:
    encoder = Encoder(start=10.0)
    encoder.marker(12.0, "a")
    assert encoder.marker(11.0, "b") == b'[2.0, "m", "b"]\n'


@given(st.lists(st.binary(max_size=50), max_size=30))
def test_what_is_written_reads_back(chunks: list[bytes]) -> None:
    encoder = Encoder(start=0.0)
    lines = [Header(width=80, height=24, timestamp=0).encode()]
    lines += [encoder.output(float(i), chunk) for i, chunk in enumerate(chunks)]
    lines.append(encoder.finish(float(len(chunks))))
    header, events = read(line for line in lines if line)
    assert header.width == 80
    text = "".join(e.data for e in events if e.code == "o")
    assert text == b"".join(chunks).decode("utf-8", "replace")


def test_read_parses_events_and_refuses_what_is_not_a_recording() -> None:
    header, events = read([b'{"version": 2, "width": 80, "height": 24}', b"", b'[0.5, "o", "hi"]'])
    assert header.timestamp == 0 and list(events) == [Event(0.5, "o", "hi")]
    for lines, message in [
        ([b'{"version": 1, "width": 80, "height": 24}'], "not an asciicast v2 header"),
        ([b'{"version": 2, "width": 0, "height": 24}'], "positive integers"),
        ([b"not json"], "not JSON"),
        ([b""], "not JSON"),
        ([b'{"version": 2, "width": 80, "height": 24, "timestamp": "x"}'], "timestamp"),
        ([b'{"version": 2, "width": 80, "height": 24, "timestamp": 1e999}'], "timestamp"),
        ([b'{"version": 2, "width": 80, "height": 24, "timestamp": ' + b"9" * 5000 + b"}"], "JSON"),
    ]:
        with pytest.raises(RecordingError, match=message):
            read(lines)
    for line, message in [
        (b'[1, "x", "?"]', "unknown event"),
        (b'[-1, "o", "?"]', "number of seconds"),
        (b'[1, "o"]', r"\[time, code, data\]"),
        (b"[" + b" " * (5 << 20) + b"]", "longer than"),
    ]:
        _, events = read([b'{"version": 2, "width": 80, "height": 24}', line])
        with pytest.raises(RecordingError, match=message):
            list(events)
