"""Decimal numbers from untrusted text, bounded before Python converts them.

`int()` refuses more than 4,300 digits (`sys.int_max_str_digits`) with a
`ValueError` that no caller expects, and a client's `?tail=` or port, or an
object's field, may hold any number of them. So callers check the text as
Go's `strconv.ParseUint` does (`plain`: ASCII digits only, no sign, space or
underscore) and take its value through `value`, which never converts more
digits than the largest number they accept has.
"""

from __future__ import annotations

__all__ = ["plain", "value"]


def plain(text: str) -> bool:
    """Whether `text` is one or more ASCII digits and nothing else."""
    return text.isascii() and text.isdigit()


def value(text: str, *, cap: int) -> int:
    """The number the `plain` digits of `text` spell, or `cap + 1` for any larger one."""
    significant = text.lstrip("0")
    if len(significant) > len(str(cap)):
        return cap + 1
    return min(int(significant or "0"), cap + 1)
