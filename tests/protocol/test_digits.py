"""Decimal numbers bounded before conversion: any length, the same answer as Go's ParseUint."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from subres.protocol import digits


@pytest.mark.parametrize(
    ("text", "plain"),
    [("0", True), ("65535", True), ("", False), ("-1", False), ("+1", False), (" 1", False),
     ("1_0", False), ("\u0663", False), ("\uff11", False), ("1" * 5000, True)],
)  # fmt: skip
def test_plain_is_ascii_digits_only(text: str, plain: bool) -> None:
    assert digits.plain(text) is plain


@given(st.integers(min_value=0, max_value=10**30), st.integers(min_value=0, max_value=3))
def test_value_is_the_number_up_to_the_cap(number: int, zeros: int) -> None:
    cap = 0xFFFF
    assert digits.value("0" * zeros + str(number), cap=cap) == min(number, cap + 1)


def test_thousands_of_digits_never_reach_int() -> None:
    assert digits.value("9" * 5000, cap=(1 << 31) - 1) == 1 << 31
    assert digits.value("0" * 5000 + "7", cap=10) == 7
