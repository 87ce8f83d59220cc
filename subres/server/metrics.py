"""Prometheus metrics of one server instance (a registry per application)."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

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

    async def handle(self, request: web.Request) -> web.Response:
        """`GET /metrics` in the Prometheus text format."""
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
