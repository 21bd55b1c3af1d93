"""The app factory: ``create_app(settings)`` opens the store (migrating it), starts the worker pool,
and mounts one router per resource. ``uvicorn api.app:create_app --factory`` serves it."""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response

from api import errors, metrics
from api.routes import jobs, meta, runs, web
from traceguard import __version__
from traceguard.service.context import Context
from traceguard.service.worker import WorkerPool
from traceguard.settings import Settings, get_settings

log = logging.getLogger("traceguard.api")


def create_app(settings: Settings | None = None, *, workers: bool = True) -> FastAPI:
    """The service. ``workers=False`` leaves analysis jobs queued (for a separate worker process
    or tests that drive jobs themselves)."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        ctx = Context.open(settings)
        secret = ctx.bootstrap()
        if secret:
            # First start on an empty store: the one time this secret is ever shown.
            print(f"traceguard: created project 'default'; admin token (shown once): {secret}", file=sys.stderr)
        pool = WorkerPool(ctx) if workers else None
        app.state.ctx = ctx
        app.state.pool = pool
        app.state.metrics = metrics.Metrics(ctx, lambda: app.state.pool)
        if pool:
            pool.start()
        try:
            yield
        finally:
            if pool:
                pool.stop()
            ctx.close()

    app = FastAPI(
        title="traceguard",
        version=__version__,
        description="Upload GPU traces of distributed PyTorch training; get the communication checklist, "
        "step breakdowns and comparisons. Every /v1 route needs `Authorization: Bearer <token>`.",
        lifespan=lifespan,
    )
    errors.install(app)
    app.state.metrics = None

    @app.middleware("http")
    async def _metrics_and_headers(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        observed = request.app.state.metrics
        if observed is None:
            response = await call_next(request)
        else:
            response = await metrics.observe(observed, request, call_next)
        # Pages show data from uploaded files: no sniffing, no framing, no referrer to elsewhere.
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("X-Frame-Options", "DENY")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        return response

    for module in (runs, jobs, meta, web):
        app.include_router(module.router)
    return app
