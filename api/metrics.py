"""Prometheus metrics (``GET /metrics``): request counts and latencies, uploads, and the job queue
read from the store at scrape time. Each app has its own registry."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator

from fastapi import Request, Response
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from traceguard.service.context import Context
from traceguard.service.worker import WorkerPool
from traceguard.store.jobs import counts_by_status

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _QueueCollector(Collector):
    def __init__(self, ctx: Context, pool: Callable[[], WorkerPool | None]) -> None:
        self.ctx = ctx
        self.pool = pool

    def collect(self) -> Iterator[GaugeMetricFamily]:
        jobs = GaugeMetricFamily("traceguard_jobs", "Analysis jobs in the store by status", labels=["status"])
        with self.ctx.factory() as session:
            counts = counts_by_status(session)
        for status in ("queued", "running", "succeeded", "failed"):
            jobs.add_metric([status], counts.get(status, 0))
        yield jobs
        pool = self.pool()
        busy = GaugeMetricFamily("traceguard_workers_busy", "Worker threads running an analysis now")
        busy.add_metric([], pool.busy if pool else 0)
        yield busy


class Metrics:
    def __init__(self, ctx: Context, pool: Callable[[], WorkerPool | None]) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "traceguard_http_requests", "HTTP requests", ["method", "route", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "traceguard_http_request_seconds", "HTTP request latency", ["method", "route"], registry=self.registry
        )
        self.uploads = Counter("traceguard_uploads", "Uploaded files by outcome", ["outcome"], registry=self.registry)
        self.upload_bytes = Counter("traceguard_upload_bytes", "Bytes of accepted uploads", registry=self.registry)
        self.registry.register(_QueueCollector(ctx, pool))

    def render(self) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE)


async def observe(metrics: Metrics, request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    started = time.perf_counter()
    status = 500
    try:
        response = await call_next(request)
        status = response.status_code
        return response
    finally:
        matched = request.scope.get("route")  # set by the router: the path template, not the URL
        route = getattr(matched, "path", "unmatched")
        metrics.requests.labels(request.method, route, str(status)).inc()
        metrics.latency.labels(request.method, route).observe(time.perf_counter() - started)
