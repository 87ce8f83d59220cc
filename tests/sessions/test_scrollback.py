"""The kept console's scrollback: bounded, replayed from a line boundary, `tail` in lines."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from subres.sessions.scrollback import Scrollback


@given(st.lists(st.binary(max_size=300), max_size=60), st.integers(min_value=1, max_value=512))
def test_never_holds_more_than_its_limit_and_keeps_the_newest_bytes(
    chunks: list[bytes], limit: int
) -> None:
    kept = Scrollback(limit)
    for chunk in chunks:
        kept.append(chunk)
        assert len(kept) <= limit
    everything = b"".join(chunks)
    assert everything.endswith(kept.tail())
    if len(everything) <= limit:
        assert kept.tail() == everything


def test_replay_starts_after_the_first_newline_once_bytes_were_dropped() -> None:
    kept = Scrollback(16)
    kept.append(b"first line\nsecond line\nthird\n")
    # "line\nthird\n" is what fits; the partial line before the newline is left out.
    assert kept.tail() == b"third\n"


def test_nothing_dropped_replays_everything() -> None:
    kept = Scrollback(1024)
    kept.append(b"login: ")
    assert kept.tail() == b"login: "


def test_tail_counts_lines_from_the_end_and_an_unfinished_line_counts() -> None:
    kept = Scrollback(1024)
    kept.append(b"a\r\nb\r\nc\r\nprompt$ ")
    assert kept.tail(1) == b"prompt$ "
    assert kept.tail(2) == b"c\r\nprompt$ "
    assert kept.tail(0) == b""
    assert kept.tail(100) == b"a\r\nb\r\nc\r\nprompt$ "
    kept.append(b"ls\r\n")
    assert kept.tail(1) == b"prompt$ ls\r\n"


@given(st.lists(st.binary(max_size=40), max_size=80), st.integers(min_value=1, max_value=64))
def test_the_ring_keeps_exactly_the_newest_bytes(chunks: list[bytes], limit: int) -> None:
    kept = Scrollback(limit)
    for chunk in chunks:
        kept.append(chunk)
    everything = b"".join(chunks)
    newest = everything[-limit:] if everything else b""
    assert len(kept) == len(newest)
    if b"\n" not in newest:
        assert kept.tail() == newest


def test_an_idle_scrollback_holds_no_ring_yet() -> None:
    assert Scrollback(1 << 16).tail() == b""


def test_one_huge_chunk_keeps_its_end() -> None:
    kept = Scrollback(8)
    kept.append(b"0123456789abcdef")
    assert len(kept) == 8
    assert kept.tail() == b"89abcdef"
