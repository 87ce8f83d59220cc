"""A user on the wire between replicas: one value that comes back whole, or a clear refusal."""

from __future__ import annotations

import base64

import pytest

from subres.auth import user
from subres.auth.user import UserInfo

ALICE = UserInfo(
    "alice",
    uid="u-1",
    groups=("contractors", "devs", "system:authenticated"),
    extra={"scopes.example.com": ("a", "b"), "empty": ()},
)


def test_a_user_comes_back_whole_from_one_header_safe_value() -> None:
    value = user.encode(ALICE)
    assert value.isascii() and "=" not in value and "\n" not in value
    assert user.decode(value) == ALICE


def test_the_encoding_is_canonical() -> None:
    shuffled = UserInfo(
        ALICE.name, ALICE.uid, ALICE.groups, dict(reversed(list(ALICE.extra.items())))
    )
    assert user.encode(shuffled) == user.encode(ALICE)


def b64(text: bytes) -> str:
    return base64.urlsafe_b64encode(text).rstrip(b"=").decode()


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("", "not base64url of JSON"),
        ("!!", "not base64url of JSON"),
        (b64(b"[]"), "exactly name, uid, groups and extra"),
        (b64(b'{"name":"a","uid":"","groups":[]}'), "exactly name, uid, groups and extra"),
        (b64(b'{"name":"","uid":"","groups":[],"extra":{}}'), "non-empty string"),
        (b64(b'{"name":"a","uid":"","groups":"g","extra":{}}'), "groups must be a list"),
        (b64(b'{"name":"a","uid":"","groups":[1],"extra":{}}'), "groups must be a list"),
        (b64(b'{"name":"a","uid":"","groups":[],"extra":{"k":"v"}}'), "extra 'k' must be"),
        ("A" * (user.MAX_ENCODED + 1), "at most"),
    ],
)
def test_anything_else_is_refused_saying_why(value: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        user.decode(value)
