"""Prometheus metrics of the API (a registry per app, served at /metrics) and the ASGI
middleware that counts and times HTTP requests by route template."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class ApiMetrics:
    """Every metric the API exports."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.http_requests = Counter(
            "kassay_http_requests_total", "HTTP requests", ["method", "route", "status"], registry=r
        )
        self.http_latency = Histogram(
            "kassay_http_request_seconds",
            "HTTP request latency",
            ["method", "route"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
            registry=r,
        )
        self.jobs_submitted = Counter("kassay_jobs_submitted_total", "jobs accepted", registry=r)
        self.jobs_refused = Counter(
            "kassay_jobs_refused_total", "job submissions refused", ["reason"], registry=r
        )
        self.case_results = Counter(
            "kassay_case_results_total", "case results stored", ["status"], registry=r
        )
        self.groups_dispatched = Counter(
            "kassay_groups_dispatched_total", "input groups sent to workers", registry=r
        )
        self.groups_requeued = Counter(
            "kassay_groups_requeued_total", "input groups requeued after a lost worker", registry=r
        )
        self.workers_up = Gauge("kassay_workers_up", "workers answering Describe", registry=r)
        self.queue_depth = Gauge(
            "kassay_queue_groups", "input groups waiting for a worker", registry=r
        )


class MetricsMiddleware:
    """Counts requests and observes latency, labelled by the matched route's template."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = [500]

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route: Any = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            method = scope.get("method", "")
            self.metrics.http_requests.labels(method, path, str(status[0])).inc()
            self.metrics.http_latency.labels(method, path).observe(time.perf_counter() - start)
