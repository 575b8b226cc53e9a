"""Prometheus metrics of the API (a registry per app, served at /metrics) and the ASGI
middleware that counts and times HTTP requests by route template.

Counters and histograms count what this replica did (sum them over replicas); the gauges read
the shared database at scrape time (jobs by state, queue depth: every replica reports the same,
so take max, not sum, over replicas)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kassay.logs import ACCESS


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
        self.workers_known = Gauge(
            "kassay_workers", "worker addresses known (listed, or found by DNS)", registry=r
        )
        self.queue_depth = Gauge(
            "kassay_queue_groups", "input groups waiting for a worker", registry=r
        )
        self.jobs_by_state = Gauge(
            "kassay_jobs", "jobs in the database by state", ["state"], registry=r
        )
        self.case_seconds = Histogram(
            "kassay_case_seconds",
            "a case's duration on its worker (inputs, reference share, runs, timing)",
            ["op"],
            buckets=CASE_BUCKETS,
            registry=r,
        )
        self.admission_seconds = Histogram(
            "kassay_admission_seconds",
            "POST /v1/jobs: parsing, validation, grid expansion and storing, by op of the job",
            ["op"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )

    def observe_admission(self, ops: tuple[str, ...], seconds: float) -> None:
        """One admitted job: its admission time under each op it asks for."""
        for op in ops:
            self.admission_seconds.labels(op).observe(seconds)

    def set_database_gauges(self, counts: Mapping[str, int], queue_depth: int) -> None:
        """Set the gauges that count what the database holds (read at scrape time): `counts`
        jobs by state, `queue_depth` pending groups."""
        from kassay.api.store import JOB_STATES

        for state in (*JOB_STATES, *counts):  # every state, 0 included, so a series never gaps
            self.jobs_by_state.labels(state).set(counts.get(state, 0))
        self.queue_depth.set(queue_depth)


#: case durations: CPU cases take milliseconds, timed GPU cases seconds, big grids minutes
CASE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)


class MetricsMiddleware:
    """Counts requests and observes latency, labelled by the matched route's template."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics, access_log: bool = False) -> None:
        self.app = app
        self.metrics = metrics
        self.access = logging.getLogger(ACCESS) if access_log else None

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
            seconds = time.perf_counter() - start
            self.metrics.http_requests.labels(method, path, str(status[0])).inc()
            self.metrics.http_latency.labels(method, path).observe(seconds)
            if self.access is not None:
                client = scope.get("client")
                self.access.info(
                    "%s %s %d %.1f ms",
                    method,
                    scope.get("path", ""),
                    status[0],
                    seconds * 1e3,
                    extra={
                        "method": method,
                        "path": scope.get("path", ""),
                        "route": path,
                        "status": status[0],
                        "ms": round(seconds * 1e3, 2),
                        "client": client[0] if client else None,
                    },
                )
