"""The console log's options and text: fixed cases from pods/log's rules, and round trips."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from subres.protocol import consolelog
from subres.protocol.consolelog import Excerpt, LogOptions, OptionError, Stamper

SECOND = consolelog.NANOS
STAMPED = re.compile(rb"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z ", re.MULTILINE)


def test_options_read_as_kube_apiserver_reads_pod_log_options() -> None:
    options = consolelog.parse(
        {
            "follow": "True",
            "tailLines": "20",
            "sinceSeconds": "60",
            "limitBytes": "1024",
            "timestamps": "1",
            "previous": "f",
            "console": "serial1",
            "container": "ignored",
        },
        now_ns=100 * SECOND,
    )
    assert options == LogOptions(
        follow=True,
        tail_lines=20,
        since_ns=40 * SECOND,
        limit_bytes=1024,
        timestamps=True,
        previous=False,
        console="serial1",
    )
    assert consolelog.parse({}, now_ns=0) == LogOptions()


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("1970-01-01T00:00:01Z", SECOND),
        ("1970-01-01T00:00:01.5Z", SECOND + SECOND // 2),
        ("1970-01-01T00:00:01.000000001Z", SECOND + 1),
        ("1970-01-01T01:00:01+01:00", SECOND),
        ("2024-05-01T10:02:03.120000000Z", 1714557723 * SECOND + 120_000_000),
    ],
)
def test_since_time_is_rfc3339_to_the_nanosecond(text: str, ns: int) -> None:
    assert consolelog.parse({"sinceTime": text}, now_ns=0).since_ns == ns


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ({"tailLines": "-1"}, "tailLines must be a whole number of at least 0"),
        ({"tailLines": "٣"}, "tailLines must be a whole number"),
        ({"sinceSeconds": "0"}, "sinceSeconds must be a whole number of at least 1"),
        ({"limitBytes": "1" * 19}, "limitBytes must be a whole number"),
        ({"follow": "yes"}, "follow must be true or false"),
        ({"previous": ""}, "previous must be true or false"),
        ({"sinceTime": "2024-05-01"}, "sinceTime must be an RFC 3339 time"),
        ({"sinceTime": "2024-05-01T10:02:03"}, "sinceTime must be an RFC 3339 time"),
        ({"sinceTime": "2024-05-01 10:02:03Z"}, "sinceTime must be an RFC 3339 time"),
        ({"sinceTime": "2024-05-01T10:02:03.1234567891Z"}, "sinceTime must be an RFC 3339"),
        ({"sinceTime": "2024-05-01T10:02:03Z", "sinceSeconds": "1"}, "at most one of"),
        ({"console": "../x"}, "console must be a console's name"),
        ({"console": "a" * 64}, "console must be a console's name"),
    ],
)
def test_bad_options_name_themselves(query: dict[str, str], words: str) -> None:
    with pytest.raises(OptionError, match=re.escape(words)):
        consolelog.parse(query, now_ns=0)


LOG = Excerpt(b"a\r\nbb\r\nccc", offsets=[0, 3], times=[1 * SECOND, 2 * SECOND])


def test_lines_by_count_time_and_bytes() -> None:
    assert consolelog.render(LOG, LogOptions()) == b"a\r\nbb\r\nccc"
    assert consolelog.render(LOG, LogOptions(tail_lines=1)) == b"ccc"
    assert consolelog.render(LOG, LogOptions(tail_lines=9)) == b"a\r\nbb\r\nccc"
    assert consolelog.render(LOG, LogOptions(since_ns=2 * SECOND)) == b"bb\r\nccc"
    assert consolelog.render(LOG, LogOptions(limit_bytes=5)) == b"a\r\nbb"
    assert consolelog.render(LOG, LogOptions(timestamps=True, tail_lines=2)) == (
        b"1970-01-01T00:00:02.000000000Z bb\r\n1970-01-01T00:00:02.000000000Z ccc"
    )


def test_following_stamps_each_line_once_where_it_begins() -> None:
    stamper = Stamper(LogOptions(timestamps=True), line_start=False)
    assert stamper.feed(b"rest\nnext", 3 * SECOND) == b"rest\n1970-01-01T00:00:03.000000000Z next"
    assert stamper.feed(b" more\n", 4 * SECOND) == b" more\n"
    assert stamper.feed(b"\n", 5 * SECOND) == b"1970-01-01T00:00:05.000000000Z \n"


def test_following_stops_at_the_byte_limit_counting_what_was_sent() -> None:
    stamper = Stamper(LogOptions(limit_bytes=10), sent=6)
    assert stamper.feed(b"abcdef", 0) == b"abcd"
    assert stamper.done and stamper.feed(b"more", 0) == b""


def _unstamped(text: bytes) -> bytes:
    return STAMPED.sub(b"", text)


@given(
    st.lists(st.binary(max_size=30), max_size=20),
    st.booleans(),
    st.one_of(st.none(), st.integers(min_value=1, max_value=200)),
)
def test_following_gives_back_the_output_and_keeps_the_limit(
    chunks: list[bytes], timestamps: bool, limit: int | None
) -> None:
    stamper = Stamper(LogOptions(timestamps=timestamps, limit_bytes=limit))
    out = b"".join(stamper.feed(chunk, i * SECOND) for i, chunk in enumerate(chunks))
    everything = b"".join(chunks)
    if limit is None:
        assert _unstamped(out) == everything
    else:
        assert len(out) <= limit
        assert everything.startswith(_unstamped(out)) or timestamps


@given(
    st.binary(max_size=200),
    st.lists(st.integers(min_value=0, max_value=10**12), max_size=8),
    st.one_of(st.none(), st.integers(min_value=0, max_value=30)),
)
def test_stamps_only_lead_lines(data: bytes, times: list[int], tail: int | None) -> None:
    offsets = sorted({0, *(t % (len(data) or 1) for t in times)})
    excerpt = Excerpt(
        data, offsets, sorted(times + [0] * (len(offsets) - len(times)))[-len(offsets) :]
    )
    plain = consolelog.render(excerpt, LogOptions(tail_lines=tail))
    stamped = consolelog.render(excerpt, LogOptions(tail_lines=tail, timestamps=True))
    assert _unstamped(stamped) == plain
    assert data.endswith(plain)
