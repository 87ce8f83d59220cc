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


class Clock:
    """Nanoseconds that move only when the test says."""

    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now


def test_each_line_is_marked_with_when_its_first_byte_arrived() -> None:
    clock = Clock()
    kept = Scrollback(1024, clock=clock)
    kept.append(b"boot: 1\r\nboot")
    clock.now = 2_000
    kept.append(b": 2\r\n")  # continues a line: no new mark
    clock.now = 3_000
    kept.append(b"login: ")
    excerpt = kept.excerpt()
    assert excerpt is not None
    assert excerpt.data == b"boot: 1\r\nboot: 2\r\nlogin: "
    assert [excerpt.time_at(i) for i in (0, 9, 18)] == [1_000, 1_000, 3_000]


def test_previous_is_the_connection_before_the_last_redial() -> None:
    kept = Scrollback(1024, clock=Clock())
    assert kept.excerpt(previous=True) is None
    kept.connected()
    kept.append(b"first boot\r\nlogin: ")
    kept.connected()
    kept.append(b"second boot\r\n")
    previous, current = kept.excerpt(previous=True), kept.excerpt()
    assert previous is not None and current is not None
    assert (previous.data, current.data) == (b"first boot\r\nlogin: ", b"second boot\r\n")
    # Attaching still replays both: the scrollback is the console's, not one connection's.
    assert kept.tail() == b"first boot\r\nlogin: second boot\r\n"


def test_an_overwritten_connection_starts_at_its_first_whole_line() -> None:
    kept = Scrollback(16, clock=Clock())
    kept.connected()
    kept.append(b"old line\nnewer line\nx")
    excerpt = kept.excerpt()
    assert excerpt is not None and excerpt.data == b"newer line\nx"
    kept.connected()
    kept.append(b"0123456789abcdef")
    previous = kept.excerpt(previous=True)
    assert previous is not None and previous.data == b""


@given(st.lists(st.binary(max_size=40), max_size=200), st.integers(min_value=1, max_value=256))
def test_marks_stay_bounded_and_ordered(chunks: list[bytes], limit: int) -> None:
    clock = Clock()
    kept = Scrollback(limit, clock=clock)
    for chunk in chunks:
        clock.now += 1
        kept.append(chunk)
        excerpt = kept.excerpt()
        assert excerpt is not None
        assert len(excerpt.offsets) <= max(1, limit // 64)
        assert list(excerpt.offsets) == sorted(excerpt.offsets)
        assert list(excerpt.times) == sorted(excerpt.times)
        assert kept.tail().endswith(excerpt.data)


def test_output_that_fills_an_empty_ring_exactly_is_all_kept() -> None:
    kept = Scrollback(6)
    kept.append(b"ready\n")
    assert kept.tail() == b"ready\n"
    kept.append(b"x")
    assert kept.tail() == b"x"  # "eady\nx": the partial first line is left out
