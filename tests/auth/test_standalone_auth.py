"""Static tokens, request attributes and the standalone authorizer."""

from __future__ import annotations

from pathlib import Path

import pytest

from subres.auth import attributes, tokenfile
from subres.auth.authn import Authenticator, Credentials, Unauthenticated
from subres.auth.authz import StandaloneAuthorizer
from subres.auth.user import ANONYMOUS, AUTHENTICATED, UserInfo


def test_token_file_format() -> None:
    users = tokenfile.parse(
        '# comment\nt1,alice,uid-1,"devs,ops"\nt2,bob,uid-2\nt3,carol,uid-3,solo,extra\n'
    )
    assert users["t1"] == UserInfo("alice", "uid-1", ("devs", "ops"))
    assert users["t2"] == UserInfo("bob", "uid-2")
    assert users["t3"].groups == ("solo",)
    with pytest.raises(tokenfile.TokenFileError, match="line 1"):
        tokenfile.parse("lonely\n")


async def test_token_file_follows_changes(tmp_path: Path) -> None:
    path = tmp_path / "tokens.csv"
    path.write_text("old,alice,1\n")
    tokens = tokenfile.TokenFile(path)
    authn = Authenticator(tokens=tokens)
    assert (await authn.authenticate(Credentials(token="old"))).name == "alice"
    path.write_text("new,bob,2\n")
    tokens.reload_if_changed()
    with pytest.raises(Unauthenticated):
        await authn.authenticate(Credentials(token="old"))
    user = await authn.authenticate(Credentials(token="new"))
    assert user.name == "bob" and AUTHENTICATED in user.groups
    path.write_text("broken\n")
    assert not tokens.reload_if_changed()
    assert (await authn.authenticate(Credentials(token="new"))).name == "bob"


async def test_no_credentials_is_anonymous() -> None:
    assert await Authenticator().authenticate(Credentials()) == ANONYMOUS


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        (
            "GET",
            "/apis/g.io/v1/namespaces/ns/machines/vm1/console",
            attributes.Attributes(
                verb="get",
                path="/apis/g.io/v1/namespaces/ns/machines/vm1/console",
                resource_request=True,
                group="g.io",
                version="v1",
                namespace="ns",
                resource="machines",
                name="vm1",
                subresource="console",
            ),
        ),
        (
            "POST",
            "/apis/g.io/v1/namespaces/ns/machines/vm1/portforward/22/tcp",
            attributes.Attributes(
                verb="create",
                path="/apis/g.io/v1/namespaces/ns/machines/vm1/portforward/22/tcp",
                resource_request=True,
                group="g.io",
                version="v1",
                namespace="ns",
                resource="machines",
                name="vm1",
                subresource="portforward",
            ),
        ),
        # A GET without a name lists, as kube-apiserver's RequestInfo says (KubeVirt's
        # `version` document is read this way; its roles grant get and list). Every case
        # spells its Attributes out: a table of expectations, not repeated logic.
        (
            "GET",
            "/apis/subresources.kubevirt.io/v1/version",
            attributes.Attributes(
                verb="list",
                path="/apis/subresources.kubevirt.io/v1/version",
                resource_request=True,
                group="subresources.kubevirt.io",
                version="v1",
                resource="version",
            ),
        ),
        ("GET", "/healthz", attributes.Attributes(verb="get", path="/healthz")),
        ("GET", "/apis/g.io", attributes.Attributes(verb="get", path="/apis/g.io")),
    ],
)
def test_request_attributes(method: str, path: str, expected: attributes.Attributes) -> None:
    assert attributes.from_request(method, path) == expected


@pytest.mark.parametrize(
    ("path", "query", "verb", "namespace"),
    [
        ("/apis/g.io/v1/namespaces/ns/sessions", {}, "list", "ns"),
        ("/apis/g.io/v1/sessions", {}, "list", ""),
        ("/apis/g.io/v1/namespaces/ns/sessions", {"watch": "true"}, "watch", "ns"),
        ("/apis/g.io/v1/namespaces/ns/sessions", {"watch": "false"}, "list", "ns"),
        # As Go's ParseBool reads it, and RequestInfo: what is no boolean is a list.
        ("/apis/g.io/v1/sessions", {"watch": "T"}, "watch", ""),
        ("/apis/g.io/v1/sessions", {"watch": "yes"}, "list", ""),
        ("/apis/g.io/v1/sessions", {"watch": ""}, "list", ""),
        ("/apis/g.io/v1/sessions", {"watch": "tRuE"}, "list", ""),
    ],
)
def test_a_get_naming_no_object_is_a_list_or_a_watch(
    path: str, query: dict[str, str], verb: str, namespace: str
) -> None:
    attrs = attributes.from_request("GET", path, query)
    assert (attrs.verb, attrs.resource, attrs.namespace, attrs.name) == (
        verb,
        "sessions",
        namespace,
        "",
    )


async def test_standalone_authorizer() -> None:
    authz = StandaloneAuthorizer(("/healthz", "/debug/*"))
    console = attributes.from_request("GET", "/apis/g/v/namespaces/n/machines/m/console")
    alice = UserInfo("alice").authenticated()
    assert (await authz.authorize(alice, console)).allowed
    assert not (await authz.authorize(ANONYMOUS, console)).allowed
    for path in ("/healthz", "/debug/pprof"):
        assert (await authz.authorize(ANONYMOUS, attributes.from_request("GET", path))).allowed
    assert not (
        await authz.authorize(ANONYMOUS, attributes.from_request("GET", "/metrics"))
    ).allowed
