"""An aggregated API server that runs on this machine: its grants and its availability.

Owns the RBAC an aggregated server needs to delegate authentication and
authorization, and waiting for an APIService to become Available; and says
how its Service reaches a local process (``subresserver.py`` deploys subres
that way: an ExternalName Service for 127.0.0.1).

How kube-apiserver reaches a local server without a cluster network: with
``--enable-aggregator-routing=false`` the aggregator resolves an APIService's
Service with ``ResolveCluster`` (k8s.io/apiserver ``pkg/util/proxy``), which
turns an ``ExternalName`` Service into ``https://<externalName>:<APIService
port>`` without looking at Endpoints, and the availability controller
(kube-aggregator ``controllers/status/remote``) checks ports and endpoints only
for ``ClusterIP`` Services before probing ``/apis/<group>/<version>`` itself.
So an externalName of ``127.0.0.1`` (a valid DNS-1123 subdomain, dialled as
an address with no DNS lookup; ``localhost`` would also try ``::1``) reaches a
server on this machine. The TLS ServerName stays ``<service>.<namespace>.svc``,
so the serving certificate must name it and the caBundle must sign it. The
other route, ``--enable-aggregator-routing=true``, resolves through
EndpointSlices only, refuses ExternalName Services, and EndpointSlice
validation rejects loopback addresses: it would need a network namespace.
"""

from __future__ import annotations

from typing import Any

from tests.e2e.controlplane import ControlPlane, poll

__all__ = [
    "apiservice_condition",
    "grant_delegated_auth",
    "wait_apiservice_available",
]


async def grant_delegated_auth(
    plane: ControlPlane, *, namespace: str, service_account: str
) -> None:
    """Give a ServiceAccount what an aggregated server needs to delegate authn/authz.

    A RoleBinding to ``extension-apiserver-authentication-reader`` in
    kube-system (to read the front-proxy and client CA ConfigMap) and a
    ClusterRoleBinding to ``system:auth-delegator`` (TokenReview and
    SubjectAccessReview). Both roles are bootstrapped by kube-apiserver.
    """
    subject = [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}]
    binding = f"{namespace}:{service_account}"
    await plane.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": f"{binding}:auth-reader", "namespace": "kube-system"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "extension-apiserver-authentication-reader",
            },
            "subjects": subject,
        }
    )
    await plane.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{binding}:auth-delegator"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:auth-delegator",
            },
            "subjects": subject,
        }
    )


async def apiservice_condition(plane: ControlPlane, name: str) -> dict[str, Any] | None:
    """The APIService's ``Available`` condition, if it has one yet."""
    apiservice = await plane.api("GET", f"/apis/apiregistration.k8s.io/v1/apiservices/{name}")
    for condition in apiservice.get("status", {}).get("conditions", []):
        if condition.get("type") == "Available":
            return dict(condition)
    return None


async def wait_apiservice_available(
    plane: ControlPlane, name: str, *, timeout_s: float = 30.0
) -> None:
    """Poll until the APIService is ``Available=True``; raise with its last condition."""
    last: dict[str, Any] | None = None

    async def available() -> bool:
        nonlocal last
        last = await apiservice_condition(plane, name)
        return last is not None and last.get("status") == "True"

    if not await poll(available, timeout_s=timeout_s):
        raise plane.failure(f"APIService {name} not Available within {timeout_s:.0f}s: {last}")
