"""Prometheus metrics of one server instance (a registry per application).

Besides subres's own counters, the registry holds the process collector
(`process_resident_memory_bytes`, `process_open_fds`, CPU seconds, …) and
reads the hit and miss counts of the TokenReview and SubjectAccessReview
caches when scraped. docs/operating.md's metrics table lists every series.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol

from aiohttp import web
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from subres.engine.pump import Traffic

__all__ = ["SUBRESOURCES", "CacheStats", "Metrics", "request_kind"]

SUBRESOURCES = frozenset({"console", "vnc", "screenshot", "portforward", "usbredir", "log"})


class CacheStats(Protocol):
    """What a cache counts (`subres.auth.ttlcache.TTLCache`)."""

    hits: int
    misses: int


def request_kind(path: str) -> str:
    """The `kind` label of a request: its subresource, else what part of the API it asked for.

    A fixed set of values, whatever the path: labels must not grow with the
    paths clients make up.
    """
    parts = path.strip("/").split("/")
    if parts[0] == "apis":
        # /apis/{group}/{version}/namespaces/{ns}/{resource}/{name}/{subresource}/...
        if len(parts) >= 8 and parts[3] == "namespaces":
            return parts[7] if parts[7] in SUBRESOURCES else "other"
        return "discovery"
    return {
        "openapi": "openapi",
        "healthz": "health",
        "livez": "health",
        "readyz": "health",
        "metrics": "metrics",
        "ui": "ui",
    }.get(parts[0], "other")


class _AuthCaches(Collector):
    """`subres_auth_cache_requests_total`, read from the caches at each scrape."""

    def __init__(self, caches: Mapping[str, CacheStats]) -> None:
        self._caches = caches

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "subres_auth_cache_requests",
            "Lookups in the TokenReview and SubjectAccessReview caches, by cache and result.",
            labels=["cache", "result"],
        )
        for name, cache in self._caches.items():
            family.add_metric([name, "hit"], cache.hits)
            family.add_metric([name, "miss"], cache.misses)
        yield family


class Metrics:
    """The counters subres keeps, and the `/metrics` handler."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.requests = Counter(
            "subres_requests",
            "HTTP requests answered, by subresource (or path kind) and code "
            "(101 when a session starts).",
            ["kind", "code"],
            registry=self.registry,
        )
        self.sessions_active = Gauge(
            "subres_sessions_active",
            "Streaming sessions open now.",
            ["subresource"],
            registry=self.registry,
        )
        self.sessions = Counter(
            "subres_sessions",
            "Streaming sessions ended, by subresource and which side ended them.",
            ["subresource", "ending"],
            registry=self.registry,
        )
        self.dial_seconds = Histogram(
            "subres_backend_dial_seconds",
            "Time to connect to a backend.",
            ["subresource"],
            registry=self.registry,
        )
        self.bytes_relayed = Counter(
            "subres_bytes_relayed",
            "Bytes relayed by ended sessions, by subresource, dialect and direction "
            "(up: client to backend).",
            ["subresource", "dialect", "direction"],
            registry=self.registry,
        )
        self.session_seconds = Histogram(
            "subres_session_duration_seconds",
            "How long streaming sessions lived.",
            ["subresource"],
            buckets=(1, 10, 60, 300, 900, 3600, 4 * 3600, 24 * 3600),
            registry=self.registry,
        )

        self.replica_members = Gauge(
            "subres_replica_members",
            "Replicas this one counts as members (itself included): who owns consoles.",
            registry=self.registry,
        )
        self.consoles_kept = Gauge(
            "subres_consoles_kept",
            "Kept consoles whose backend connection is open now.",
            registry=self.registry,
        )
        self.events_dropped = Counter(
            "subres_events_dropped",
            "Kubernetes Events about sessions not sent, by why (rate: the object's limit; "
            "queue: too many waiting).",
            ["reason"],
            registry=self.registry,
        )
        self.peer_answers_failed = Counter(
            "subres_peer_answers_failed",
            "Answers of other replicas to a fan-out (sessions list, recordings) left out, by "
            "why (unreachable; cut: shorter than announced or past the bound; unparsable).",
            ["reason"],
            registry=self.registry,
        )
        self.events_failed = Counter(
            "subres_events_failed",
            "Kubernetes Events about sessions the apiserver refused or did not answer.",
            registry=self.registry,
        )

        self.audit_sent = Counter(
            "subres_audit_events_sent",
            "Session audit events the audit sink acknowledged.",
            registry=self.registry,
        )
        self.audit_buffered = Gauge(
            "subres_audit_events_buffered",
            "Session audit events spooled on disk and not yet taken by the audit sink.",
            registry=self.registry,
        )
        self.audit_dropped = Counter(
            "subres_audit_events_dropped",
            "Session audit events never sent, by why (spool: it was full; refused: the sink "
            "answered 4xx).",
            ["reason"],
            registry=self.registry,
        )
        self.audit_failures = Counter(
            "subres_audit_send_failures",
            "Requests to the audit sink that failed or were answered with an error.",
            registry=self.registry,
        )

    def watch_caches(self, caches: Mapping[str, CacheStats]) -> None:
        """Report the hits and misses of `caches` (by name) at every scrape."""
        self.registry.register(_AuthCaches(caches))

    async def answered(self, request: web.Request, response: web.StreamResponse) -> None:
        """Count a response as its headers go out (`on_response_prepare`)."""
        self.requests.labels(request_kind(request.path), str(response.status)).inc()

    def session_started(self, subresource: str) -> None:
        """A session of `subresource` is live."""
        self.sessions_active.labels(subresource).inc()

    def session_ended(
        self, *, subresource: str, dialect: str, ending: str, seconds: float, traffic: Traffic
    ) -> None:
        """A session ended: count it, its duration and its bytes."""
        self.sessions_active.labels(subresource).dec()
        self.sessions.labels(subresource, ending).inc()
        self.session_seconds.labels(subresource).observe(seconds)
        self.bytes_relayed.labels(subresource, dialect, "up").inc(traffic.up)
        self.bytes_relayed.labels(subresource, dialect, "down").inc(traffic.down)

    async def handle(self, request: web.Request) -> web.Response:
        """`GET /metrics` in the Prometheus text format."""
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
