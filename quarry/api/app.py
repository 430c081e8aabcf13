"""FastAPI application: collections, documents, search, health and metrics.

Endpoints that call the model or the store directly are plain ``def`` functions, so FastAPI runs
them in its thread pool and they never block the event loop; the single
:class:`~quarry.service.Quarry` (one store handle, one model) is shared safely by those threads.
Search (without rerank) and the probes are ``async``: they await futures of the model's, the
store's or the probe's threads and hold no worker thread.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Depends, FastAPI, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi_offline import FastAPIOffline
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError

from indexing.collections import CollectionConfig, check_name_length
from indexing.docstore import DEFAULT_TENANT, off_loop
from indexing.sources import SourceDocument, parse_document
from quarry import errors as e
from quarry import heap, metrics, tracing
from quarry.api import access, answer, edge, errors, rollout, security
from quarry.api.access import Access
from quarry.api.browser import BrowserGuard
from quarry.api.errors import error_responses
from quarry.api.guard import RequestGuard
from quarry.api.models import (
    CollectionOut,
    CollectionsOut,
    CreateCollection,
    DeleteDocuments,
    DocumentOut,
    DocumentsOut,
    DroppedOut,
    HealthOut,
    IngestJobIn,
    IngestOut,
    JobOut,
    JobsOut,
    ReadyOut,
    RecallOut,
    ReindexIn,
    RollbackOut,
    SearchIn,
    SearchOut,
    UpsertDocuments,
)
from quarry.api.observe import ObserveMiddleware
from quarry.api.probe import StoreProbe, degradations, dependencies
from quarry.errors import EmbeddingUnavailable, InvalidDocument
from quarry.ingest_jobs import IngestJobs, job_or_404, progress_of
from quarry.ingest_upload import is_upload_type, new_job_id, spool, upload_options
from quarry.scheduler import ReindexScheduler
from quarry.service import Quarry
from retrieval.rerank_options import rerank_options
from retrieval.search import RerankOptions

log = logging.getLogger(__name__)


async def get_quarry(request: Request) -> Quarry:
    """FastAPI dependency: the shared service as the key's tenant sees it.

    On the event loop from the state's caches; in a thread when it must read (``off_loop``).

    Raises:
        InvalidRequest: The ``{name}`` is longer than any collection's (before any store is asked).
    """
    check_name_length(request.path_params.get("name", ""))
    return await off_loop(access.service, request)


Service = Annotated[Quarry, Depends(get_quarry)]
router = APIRouter()


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
    # every route checks its path and query parameters (quarry.api.edge), then passes the access
    # layer (keys, scopes, collections, rates), before anything reads the state or a store
    first = [Depends(edge.check_params), Depends(access.authorize)]
    app.include_router(router, dependencies=first)
    app.include_router(answer.router, dependencies=first)
    rollout.install(app, first)  # the gray release's routes and its routing key (quarry.api.rollout)
    security.install(app)  # the OpenAPI's securitySchemes and per-route security, from access.POLICY
    return app


# The errors each kind of route can raise, documented through quarry.api.errors.STATUS.
_STORE = (e.StoreUnavailable, e.StoreError)
_NAMED = (e.InvalidRequest, e.CollectionNotFound, *_STORE)
_WRITE = (*_NAMED, e.InvalidDocument, e.ModelMismatch, e.DimensionMismatch, e.EmbeddingUnavailable, e.EmbeddingError)


@router.get("/healthz", tags=["ops"], response_model=HealthOut)
async def healthz() -> dict[str, str]:
    """Liveness: the process answers, however busy its searches and writes are."""
    # Served on the event loop: no worker thread needed, so busy or stuck threads cannot make a
    # live server look dead.
    return {"status": "ok"}


@router.get(
    "/readyz", tags=["ops"], response_model=ReadyOut, response_model_exclude_none=True,
    responses={
        503: {
            "model": ReadyOut,
            "description": "Starting, the state store or the vector store failed (not an outage of the latter), "
            "or a collection cannot serve.",
        }
    },
)
async def readyz(request: Request, response: Response) -> dict[str, Any]:
    """Readiness for search, and each dependency's state in ``dependencies``.

    Not ready (503): starting; the state store (where every search reads its chunk texts) does
    not answer within 2 s or its deadline (``state store unavailable``, with the reason); the
    vector store failed with another error than an outage (``store error``); a collection whose
    BM25 index can be neither loaded nor rebuilt (``collection error``).

    Ready but ``degraded`` (200), with what is skipped in ``degraded``: the vector store cannot
    be reached (hybrid search answers from BM25 and says so; every replica shares the store, so
    taking them all out of rotation would turn degraded answers into none), the query model is
    being skipped after an outage, or the LLM does not answer (``/answer`` and chat completions
    then return the retrieved sources without generated text). While searches skip the vector
    store it is not asked again here; otherwise each check waits at most 2 s (the LLM's 1 s).
    """
    if not request.app.state.ready:
        response.status_code = 503
        return {"status": "starting"}
    service: Quarry = request.app.state.quarry
    deps = await dependencies(request.app.state, service)
    if service.bm25.failures:
        response.status_code = 503
        return {"status": "collection error", "collections": dict(service.bm25.failures), "dependencies": deps}
    state = deps["state_store"]
    if state["status"] != "ok":
        response.status_code = 503
        return {"status": "state store unavailable", "message": state.get("message"), "dependencies": deps}
    store = deps["vector_store"]
    if store["status"] == "error":
        response.status_code = 503
        return {"status": "store error", "message": store.get("message"), "dependencies": deps}
    ready: dict[str, Any] = {"status": "ready", "embedding_model": service.embedder.model_id, "dependencies": deps}
    degraded = degradations(deps)
    if degraded:
        ready["status"], ready["degraded"] = "degraded", degraded
    return ready


@router.get("/metrics", tags=["ops"], include_in_schema=False)
def prometheus(request: Request) -> Response:
    """Prometheus metrics (:mod:`quarry.metrics`: requests, query stages, degradations, queue depths).

    A key with the ``metrics`` or ``admin`` scope once keys exist (:data:`~quarry.api.access.POLICY`);
    a key of the operator's tenant (``default``) reads every series, another tenant's key its
    own tenant's and those of no tenant (:class:`~quarry.metrics.TenantView`).
    """
    tenant = access.tenant_of(request)
    view = metrics.TenantView(tenant) if tenant != DEFAULT_TENANT else None
    return Response(generate_latest() if view is None else generate_latest(view), media_type=CONTENT_TYPE_LATEST)


@router.get(
    "/v1/collections", tags=["collections"], response_model=CollectionsOut,
)
def list_collections(request: Request, q: Service) -> dict[str, Any]:
    """All collections with their configuration (those the API key may use)."""
    return {"collections": [c.to_json() for c in q.list_collections() if access.allowed(request, c.name)]}


@router.post(
    "/v1/collections", status_code=201, tags=["collections"], response_model=CollectionConfig,
    responses=error_responses(
        e.InvalidRequest, e.CollectionExists, e.Conflict, e.Forbidden, e.UnsupportedIndex, e.IndexBuildFailed, *_STORE,
        e.EmbeddingUnavailable, e.EmbeddingError, body=True,
    ),
)
def create_collection(body: CreateCollection, request: Request, q: Service) -> dict[str, Any]:
    """Create a collection (409 if the name is taken)."""
    access.check_collection(request, body.name)
    cfg = q.create_collection(
        body.name, language=body.language, chunk_size=body.chunk_size, chunk_overlap=body.chunk_overlap,
        fusion=body.fusion, shared=body.tenancy == "shared",
    )
    access.audit(request, "collection.create", body.name, tenancy=body.tenancy)
    return cfg.to_json()


@router.get(
    "/v1/collections/{name}", tags=["collections"], response_model=CollectionOut,
    responses=error_responses(e.InvalidRequest, e.CollectionNotFound, *_STORE),  # 400: RequestGuard's path check
)
def describe_collection(name: str, q: Service) -> dict[str, Any]:
    """Configuration, metadata schema, index and counts of a collection."""
    return q.describe(name)


@router.get(
    "/v1/collections/{name}/recall", tags=["collections"], response_model=RecallOut,
    responses=error_responses(e.InvalidRequest, e.CollectionNotFound),  # 400: RequestGuard's path check
)
def collection_recall(name: str, q: Service) -> dict[str, Any]:
    """Recall@k of the collection's sampled searches against exact search, per filter selectivity.

    A share of live dense and hybrid searches (``QUARRY_MONITOR__SAMPLE_RATE``, default 1 %) is
    re-run exactly in the background; these are the figures of the last ``window_s`` seconds, and
    whether the reindex trigger (recall below the floor for a sustained window) fires.
    """
    return q.recall(name)


@router.delete(
    "/v1/collections/{name}", tags=["collections"], response_model=DroppedOut,
    responses=error_responses(e.InvalidRequest, e.CollectionNotFound, *_STORE),  # 400: RequestGuard's path check
)
def drop_collection(name: str, request: Request, q: Service) -> dict[str, str]:
    """Drop a collection with all its data."""
    q.drop_collection(name)
    access.audit(request, "collection.drop", name)
    return {"deleted": name}


@router.post(
    "/v1/collections/{name}/reindex", status_code=202, tags=["collections"], response_model=JobOut,
    responses=error_responses(e.InvalidRequest, e.CollectionNotFound, e.ReindexRunning, *_STORE, body=True),
)
def reindex_collection(name: str, q: Service, body: ReindexIn | None = None) -> dict[str, Any]:
    """Start building the collection's next version (202 with the job; follow it at ``/v1/jobs/{id}``)."""
    body = body or ReindexIn()
    return _job(q.start_reindex(name, model=body.model, index=body.index, chunk_size=body.chunk_size,
                                chunk_overlap=body.chunk_overlap))


@router.post(
    "/v1/collections/{name}/rollback", tags=["collections"], response_model=RollbackOut,
    responses=error_responses(e.InvalidRequest, e.CollectionNotFound, e.Conflict, e.ReindexRunning, *_STORE),
)
def rollback_collection(name: str, q: Service) -> dict[str, int]:
    """Swap back to the version served before the last reindex (404 when none is kept)."""
    report = q.rollback(name)
    return {"version": report.version, "previous": report.previous}


JobState = Literal["queued", "running", "cancelling", "done", "partial", "failed", "cancelled"]


@router.get(
    "/v1/jobs", tags=["collections"], response_model=JobsOut,
    responses=error_responses(e.InvalidRequest, *_STORE),
)
def list_jobs(  # noqa: PLR0913 - the filters
    request: Request, q: Service, collection: str | None = None, state: JobState | None = None,
    kind: Literal["ingest", "reindex"] | None = None, limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    """The jobs of the key's tenant, newest first, optionally of one collection, state or kind.

    Only the jobs the key may read are listed: ingest jobs for ``write`` or ``admin``, reindex
    jobs for ``admin``, and only of the collections the key may use.
    """
    if collection is not None:
        check_name_length(collection)
    found = q.docstore.list_jobs(collection=collection, state=state, limit=limit if kind is None else 1000)
    jobs = [j for j in found if (kind is None or j.kind == kind) and access.may_see_job(request, j.kind, j.collection)]
    return {"jobs": [_job(j) for j in jobs[:limit]]}


@router.get(
    "/v1/jobs/{job_id}", tags=["collections"], response_model=JobOut,
    responses=error_responses(e.InvalidRequest, e.NotFound, *_STORE),
)
def get_job(job_id: str, request: Request, q: Service) -> dict[str, Any]:
    """A job's state, progress counters and error (an ingest job's rate, ETA and files skipped too).

    A reindex job needs an ``admin`` key, an ingest job ``write`` (or ``admin``); a job of
    another tenant, or of a collection the key may not use, is 404.
    """
    job = job_or_404(q, job_id, access.collections_of(request))
    access.check_job(request, job.kind)
    return _job(job)


@router.post(
    "/v1/collections/{name}/jobs", status_code=202, tags=["documents"], response_model=JobOut,
    responses=error_responses(
        e.InvalidRequest, e.Forbidden, e.CollectionNotFound, e.Conflict, e.PayloadTooLarge, *_STORE, body=True
    ),
    openapi_extra={"requestBody": {"required": True, "content": {
        "application/json": {"schema": IngestJobIn.model_json_schema()},
        "application/x-ndjson": {"schema": {"type": "string", "format": "binary", "description": (
            "The documents, one JSON object per line as in a .jsonl file; options as query parameters "
            "on_error=skip|fail and prune=true|false.")}},
    }}},
)
async def submit_ingest_job(name: str, request: Request, q: Service) -> dict[str, Any]:
    """Ingest a source in the background (202 with the job; follow it at ``/v1/jobs/{id}``).

    The source is either a path on the server's disk (a JSON body ``{"path": ...}``), under one
    of its ``QUARRY_INGEST__ROOTS`` (403 otherwise, and when none is set), or the body itself:
    NDJSON documents sent with ``Content-Type: application/x-ndjson`` (or ``application/jsonl``),
    spooled to the server's disk as they stream in, up to ``QUARRY_INGEST__MAX_UPLOAD_BYTES``
    (413 past it), with ``on_error`` and ``prune`` as query parameters. The job writes batch by
    batch and records a checkpoint after each; a server killed mid-job resumes it from there when
    it (or a replica) finds its lease lapsed. One unfinished ingest job per collection (409).
    """
    jobs: IngestJobs = request.app.state.ingest_jobs
    if is_upload_type(request.headers.get("content-type")):
        on_error, prune = upload_options(request.query_params)
        await run_in_threadpool(jobs.admit, q, name)  # refused before a byte is spooled
        job_id = new_job_id()
        part, size = await spool(request, jobs.spool_dir, job_id, q.settings.ingest.max_upload_bytes)
        job = await run_in_threadpool(
            partial(jobs.submit_upload, q, name, job_id, part, size, on_error=on_error, prune=prune)
        )
        await run_in_threadpool(access.audit, request, "ingest.submit", name, job=job.id, upload_bytes=size)
    else:
        body = _ingest_job_body(await request.body(), request.headers.get("content-type"))
        job = await run_in_threadpool(
            partial(jobs.submit, q, name, body.path, on_error=body.on_error, prune=body.prune)
        )
        await run_in_threadpool(access.audit, request, "ingest.submit", name, job=job.id, path=job.params["path"])
    return _job(await run_in_threadpool(q.get_job, job.id))


def _ingest_job_body(raw: bytes, content_type: str | None) -> IngestJobIn:
    """The JSON body of a path job, validated as FastAPI validates a declared body.

    Raises:
        RequestValidationError: Not the schema, or not JSON (422, in the error envelope).
    """
    if not errors.is_json(content_type or ""):  # as FastAPI: such a body is not read as JSON (curl -d: a form)
        raise RequestValidationError([{"type": "dict_type", "loc": ("body",), "msg": "not JSON", "input": None}])
    try:
        return IngestJobIn.model_validate_json(raw or b"null")
    except ValidationError as exc:
        found = [{**err, "loc": ("body", *err.get("loc", ()))} for err in exc.errors()]
        raise RequestValidationError(found, body=raw.decode("utf-8", "replace")) from exc


@router.delete(
    "/v1/jobs/{job_id}", status_code=202, tags=["documents"], response_model=JobOut,
    responses=error_responses(e.InvalidRequest, e.NotFound, e.Conflict, *_STORE),
)
def cancel_job(job_id: str, request: Request, q: Service) -> dict[str, Any]:
    """Cancel an ingest job: it stops after its batch in flight (``cancelling``, then ``cancelled``).

    What it wrote stays written. A finished job, or a reindex job, is 409.
    """
    job = job_or_404(q, job_id, access.collections_of(request))
    access.check_job(request, job.kind)
    jobs: IngestJobs = request.app.state.ingest_jobs
    return _job(jobs.cancel(q, job.id))


def _job(job: Any) -> dict[str, Any]:
    out = {k: getattr(job, k) for k in JobOut.model_fields if hasattr(job, k)}
    return out | progress_of(job)


@router.post(
    "/v1/collections/{name}/documents", tags=["documents"], response_model=IngestOut,
    responses=error_responses(*_WRITE, e.IndexBuildFailed, body=True),
)
def upsert_documents(name: str, body: UpsertDocuments, q: Service) -> IngestOut:
    """Insert or replace a batch of documents, atomically (nothing is written on error)."""
    return IngestOut(**_report(q.upsert(name, _documents(body), atomic=True)))


@router.post(
    "/v1/collections/{name}/documents/delete", tags=["documents"], response_model=IngestOut,
    responses=error_responses(*_NAMED, body=True),
)
def delete_documents(name: str, body: DeleteDocuments, q: Service) -> IngestOut:
    """Delete documents (all their chunks, in both channels) by id, or those whose metadata matches ``filters``.

    The documents leave search at once. A 503 from the vector store after that leaves their
    vectors' deletes pending: the next write to the collection retries them, and a retried
    delete reports ``deleted: 0``.
    """
    # The docstore commits first (BM25, and dense hits are read back through the docstore), then
    # the vector store is asked; the pending deletes are recorded in that commit.
    if body.ids is None:
        return IngestOut(**_report(q.delete_where(name, body.filters or {})))
    return IngestOut(**_report(q.delete_documents(name, body.ids)))


@router.get(
    "/v1/collections/{name}/documents", tags=["documents"], response_model=DocumentsOut,
    responses=error_responses(*_NAMED),
)
def list_documents(
    name: str, q: Service, cursor: str | None = None, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> DocumentsOut:
    """List a collection's documents in id order, ``limit`` at a time (keyset paging by ``cursor``)."""
    docs, next_cursor = q.list_documents(name, cursor=cursor, limit=limit)
    return DocumentsOut.model_validate({"documents": docs, "next_cursor": next_cursor})


@router.get(
    "/v1/collections/{name}/documents/{document_id:whole}", tags=["documents"], response_model=DocumentOut,
    responses=error_responses(*_NAMED, e.NotFound),
)
def get_document(name: str, document_id: str, q: Service) -> DocumentOut:
    """A stored document by id: its text (its chunks' texts joined), metadata and chunks."""
    return DocumentOut.model_validate(q.get_document(name, document_id))


@router.delete(
    "/v1/collections/{name}/documents/{document_id:whole}", tags=["documents"], response_model=IngestOut,
    responses=error_responses(*_NAMED),
)
def delete_document(name: str, document_id: str, q: Service) -> IngestOut:
    """Delete one document by id."""
    return IngestOut(**_report(q.delete_documents(name, [document_id])))


@router.post(
    "/v1/collections/{name}/search", tags=["search"], response_model=SearchOut,
    responses=error_responses(
        e.InvalidQuery, e.InvalidFilter, e.InvalidRequest, e.CollectionNotFound, e.ModelMismatch,
        e.DimensionMismatch, *_STORE, e.EmbeddingUnavailable, e.EmbeddingError, e.RerankError, body=True,
    ),
)
async def search(name: str, body: SearchIn, request: Request, q: Service) -> Response:
    """Hybrid (BM25 + dense, fused by rrf or weighted), BM25-only or dense-only search with filters and paging.

    Hybrid search answers from BM25 alone when the dense channel cannot (the store or the model
    is down, the collection's vectors come from another model) and says why in ``degraded``;
    dense-only search answers those with the error instead.

    \f
    The body is :class:`SearchOut`, serialised by orjson straight from the result's dataclasses
    (the hot path: no second validation pass over hits the service built itself). The query runs
    on the event loop and awaits the model and the store; a rerank (a cross-encoder, CPU-bound)
    runs in a worker thread. (FastAPI shows the text above the form feed as the description.)
    """  # noqa: D301 - the form feed is FastAPI's cut
    started = time.perf_counter()
    rerank = _rerank_options(q, body)
    shed = access.shed(request)
    if shed is not None:  # saturated: BM25 alone where it is cheaper than what was asked, else the 503
        if body.mode == "dense" or (body.mode == "bm25" and rerank is None):
            raise await shed.refused()  # nothing cheaper than a dense-only or a plain BM25 search
        result = await q.search_async(
            name, body.query, top_k=body.top_k, mode="bm25", filters=body.filters, offset=body.offset,
            group=body.group_by_document, min_score=body.min_score,
        )
        result.mode = body.mode  # a hybrid search by BM25 alone, or a BM25 search without its rerank
        result.degraded.append(f"shed: the server is saturated and answers {shed.priority}-priority keys by BM25 alone")
        metrics.DEGRADED.labels("shed").inc()
        result.reranked, result.rerank_reason = (None, None) if rerank is None else (False, "shed")
    elif rerank is None:
        result = await q.search_async(
            name, body.query, top_k=body.top_k, mode=body.mode, filters=body.filters,
            offset=body.offset, group=body.group_by_document, fusion=body.fusion, min_score=body.min_score,
        )
    else:
        result = await run_in_threadpool(
            partial(
                q.search, name, body.query, top_k=body.top_k, mode=body.mode, filters=body.filters,
                offset=body.offset, group=body.group_by_document, rerank=rerank,
                dense_timeout_s=q.settings.search.dense_timeout_s, fusion=body.fusion, min_score=body.min_score,
            )
        )
    out = {
        "hits": result.hits, "total": result.total, "mode": result.mode, "offset": body.offset,
        "top_k": body.top_k, "degraded": result.degraded, "reranked": result.reranked,
        "rerank_reason": result.rerank_reason, "took_ms": (time.perf_counter() - started) * 1000,
        "timings_ms": result.timings_ms,
    }
    return Response(orjson.dumps(out, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json")


def _documents(body: UpsertDocuments) -> list[SourceDocument]:
    docs, seen = [], set()
    for i, doc in enumerate(body.documents):
        try:
            parsed = parse_document(doc.model_dump())
        except InvalidDocument as exc:
            raise InvalidDocument(f"documents[{i}]: {exc.message}") from exc
        if parsed.id in seen:
            raise InvalidDocument(f"documents[{i}]: duplicate document id {parsed.id!r} in this batch")
        seen.add(parsed.id)
        docs.append(parsed)
    return docs


def _report(report: Any) -> dict[str, Any]:
    out = dataclasses.asdict(report)
    out.pop("extra", None)
    return out


def _rerank_options(service: Quarry, body: SearchIn) -> RerankOptions | None:
    loaded = service.reranker.model_id if service.reranker is not None else None
    return rerank_options(service.settings.rerank, loaded, body.rerank)
