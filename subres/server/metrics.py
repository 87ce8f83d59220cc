"""Prometheus metrics of one server instance (a registry per application)."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from subres.streams.pump import Traffic

__all__ = ["Metrics"]


class Metrics:
    """The counters subres keeps, and the `/metrics` handler."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "subres_requests",
            "HTTP requests answered, by subresource (or path kind) and code.",
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
