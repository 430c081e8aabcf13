"""FastAPI application: the app around one service, its lifespan, middleware and routers (:mod:`quarry.api.routes`).

Endpoints that call the model or the store directly are plain ``def`` functions, so FastAPI runs
them in its thread pool and they never block the event loop; the single
:class:`~quarry.service.Quarry` (one store handle, one model) is shared safely by those threads.
Search (without rerank) and the probes are ``async``: they await futures of the model's, the
store's or the probe's threads and hold no worker thread.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI
from fastapi.concurrency import run_in_threadpool
from fastapi_offline import FastAPIOffline

from quarry import heap, metrics, tracing
from quarry.api import access, edge, errors, security
from quarry.api.access import Access
from quarry.api.browser import BrowserGuard
from quarry.api.guard import RequestGuard
from quarry.api.observe import ObserveMiddleware
from quarry.api.probe import StoreProbe
from quarry.api.routes import ROUTERS
from quarry.api.routes.rollout import RouteKey
from quarry.errors import EmbeddingUnavailable
from quarry.ingest_jobs import IngestJobs
from quarry.scheduler import ReindexScheduler
from quarry.service import Quarry

log = logging.getLogger(__name__)


def _start_scheduler(service: Quarry) -> ReindexScheduler | None:
    """Start the reindex scheduler when a schedule or a trigger is set (``QUARRY_REINDEX__*``)."""
    if not service.settings.reindex.scheduled or service.scheduler is not None:
        return None
    scheduler = service.scheduler = ReindexScheduler(service)
    scheduler.start()
    return scheduler


def create_app(quarry: Quarry | Callable[[], Quarry]) -> FastAPI:
    """Build the app around a :class:`Quarry` (or a factory called at startup).

    Args:
        quarry: The service, or a zero-argument factory (the CLI passes one so that models load
            in the server process, after the port is bound).
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service = quarry if isinstance(quarry, Quarry) else await run_in_threadpool(quarry)
        app.state.quarry = service
        metrics.set_slas(service.settings.metrics)
        traced = tracing.configure(service.settings.tracing)
        app.state.access = Access(service.docstore, service.settings.auth)
        app.state.store_probe = StoreProbe(service.store.list_collections)
        app.state.state_probe = StoreProbe(
            service.docstore.healthy, timeout_s=min(2.0, service.docstore.timeout_s), what="the state store"
        )
        try:
            await run_in_threadpool(service.warm_up)
        except EmbeddingUnavailable as exc:  # serve BM25 meanwhile; dense retries per request
            log.warning("embedding server unavailable at startup: %s", exc.message)
        # What startup loaded, and each BM25 snapshot swapped in later, stays: out of the GC's walks.
        heap.retain()
        previous_hook, service.bm25.on_swap = service.bm25.on_swap, heap.settle_soon
        scheduler = _start_scheduler(service)
        app.state.ingest_jobs = IngestJobs(service)
        await run_in_threadpool(app.state.ingest_jobs.start)  # resumes the jobs a killed server left
        app.state.ready = True
        try:
            yield
        finally:
            app.state.ready = False
            if scheduler is not None:
                scheduler.shutdown()
                service.scheduler = None
            await run_in_threadpool(app.state.ingest_jobs.close)  # after the batches in flight
            service.bm25.on_swap = previous_hook
            heap.release()
            app.state.store_probe.close()
            app.state.state_probe.close()
            if traced:
                tracing.shutdown()
            if not isinstance(quarry, Quarry):
                service.close()

    # Swagger UI and ReDoc from the assets fastapi-offline ships: /docs works offline.
    # redirect_slashes=False: a trailing slash is a 404 in the envelope, not a 307 whose Location
    # echoes the client's Host header (an open redirect through a spoofed Host).
    # Swagger's Authorize keeps the key entered there across reloads (the schemes: quarry.api.security).
    app = FastAPIOffline(
        title="Quarry", version="0.1.0", lifespan=lifespan, summary="Hybrid retrieval service", redirect_slashes=False,
        swagger_ui_parameters={"persistAuthorization": True},
    )
    app.state.ready = False
    errors.install(app)
    app.add_middleware(RequestGuard)
    app.add_middleware(BrowserGuard)
    app.add_middleware(ObserveMiddleware)
    app.add_middleware(RouteKey)  # the gray release's routing key (quarry.api.routes.rollout)
    # every route checks its path and query parameters (quarry.api.edge), then passes the access
    # layer (keys, scopes, collections, rates), before anything reads the state or a store
    first = [Depends(edge.check_params), Depends(access.authorize)]
    for router in ROUTERS:
        app.include_router(router, dependencies=first)
    security.install(app)  # the OpenAPI's securitySchemes and per-route security, from access.POLICY
    return app

