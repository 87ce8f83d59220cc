"""Front-proxy verification, header parsing and the authentication ConfigMap."""

from __future__ import annotations

import json

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from subres.auth import authconfig
from subres.auth.authn import Unauthenticated
from subres.auth.requestheader import FrontProxy, RequestHeaderConfig, unescape_extra_key
from subres.serving import certs

PROXY_CA = certs.generate_ca("front-proxy-ca")
OTHER_CA = certs.generate_ca("client-ca")


def proxy(**changes: tuple[str, ...]) -> FrontProxy:
    config = RequestHeaderConfig(
        client_ca=(PROXY_CA.cert,),
        allowed_names=("front-proxy-client",),
        username_headers=("X-Remote-User",),
        uid_headers=("X-Remote-Uid",),
        group_headers=("X-Remote-Group",),
        extra_headers_prefixes=("X-Remote-Extra-",),
    )
    for key, value in changes.items():
        config = RequestHeaderConfig(**{**config.__dict__, key: value})
    return FrontProxy(config)


def headers(*pairs: tuple[str, str]) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict(pairs))


GOOD = certs.issue_client(PROXY_CA, user="front-proxy-client", groups=[]).cert


def test_trusted_proxy_names_the_user() -> None:
    user = proxy().authenticate(
        GOOD,
        headers(
            ("x-remote-user", "alice"),
            ("X-Remote-Uid", "u-1"),
            ("X-Remote-Group", "devs,ops"),
            ("X-Remote-Group", "admins"),
            ("X-Remote-Group", ""),
            ("X-Remote-Extra-Scopes", "read"),
            ("X-Remote-Extra-scopes", "write"),
            ("X-Remote-Extra-Acme.com%2Fproject", "p1"),
        ),
    )
    assert user is not None
    assert (user.name, user.uid) == ("alice", "u-1")
    assert user.groups == ("devs,ops", "admins")  # one group per header line, no splitting
    assert dict(user.extra) == {"scopes": ("read", "write"), "acme.com/project": ("p1",)}


def test_first_non_empty_user_header_wins() -> None:
    fp = proxy(username_headers=("X-Remote-User", "X-Other-User"))
    user = fp.authenticate(GOOD, headers(("X-Remote-User", ""), ("X-Other-User", "bob")))
    assert user is not None and user.name == "bob"
    assert fp.authenticate(GOOD, headers(("X-Remote-Group", "devs"))) is None


def test_wrong_ca_is_refused() -> None:
    forged = certs.issue_client(OTHER_CA, user="front-proxy-client", groups=[]).cert
    with pytest.raises(Unauthenticated, match="request-header CA"):
        proxy().authenticate(forged, headers(("X-Remote-User", "alice")))


def test_common_name_must_be_allowed_unless_list_empty() -> None:
    intruder = certs.issue_client(PROXY_CA, user="intruder", groups=[]).cert
    with pytest.raises(Unauthenticated, match="not allowed"):
        proxy().authenticate(intruder, headers(("X-Remote-User", "alice")))
    user = proxy(allowed_names=()).authenticate(intruder, headers(("X-Remote-User", "alice")))
    assert user is not None and user.name == "alice"


def test_client_auth_usage_required() -> None:
    serving = certs.issue_serving(
        PROXY_CA, common_name="front-proxy-client", dns_names=["x"], ip_addresses=[]
    ).cert
    with pytest.raises(Unauthenticated, match="client-auth"):
        proxy(allowed_names=()).authenticate(serving, headers(("X-Remote-User", "alice")))


@pytest.mark.parametrize(
    ("suffix", "key"),
    [
        ("Example.COM%2FScope", "example.com/scope"),
        ("caf%C3%A9", "café"),
        ("bad%zzescape", "bad%zzescape"),
        ("not-utf8%ff", "not-utf8%ff"),
    ],
)
def test_extra_keys_unescape(suffix: str, key: str) -> None:
    assert unescape_extra_key(suffix) == key


def test_configmap_parsing() -> None:
    data = {
        "client-ca-file": OTHER_CA.cert_pem().decode(),
        "requestheader-client-ca-file": PROXY_CA.cert_pem().decode(),
        "requestheader-allowed-names": json.dumps(["front-proxy-client"]),
        "requestheader-username-headers": json.dumps(["X-Remote-User"]),
        "requestheader-group-headers": "null",
        "requestheader-extra-headers-prefix": '["X-Remote-Extra-"]',
    }
    snapshot = authconfig.parse(data)
    assert snapshot.requestheader.client_ca == (PROXY_CA.cert,)
    assert snapshot.requestheader.allowed_names == ("front-proxy-client",)
    assert snapshot.requestheader.group_headers == ()
    assert snapshot.requestheader.uid_headers == ()
    with pytest.raises(ValueError, match="JSON array"):
        authconfig.parse({"requestheader-allowed-names": "front-proxy-client"})
