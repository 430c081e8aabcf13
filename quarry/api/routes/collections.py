"""Collection routes: create, list, describe, drop, recall figures, reindex and rollback."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from indexing.collections import CollectionConfig
from quarry import errors as e
from quarry.api import access
from quarry.api.deps import STORE_ERRORS, Service
from quarry.api.errors import error_responses
from quarry.api.models import (
    CollectionOut,
    CollectionsOut,
    CreateCollection,
    DroppedOut,
    JobOut,
    RecallOut,
    ReindexIn,
    RollbackOut,
)
from quarry.api.routes.jobs import job_out

router = APIRouter()


@router.get(
    "/v1/collections", tags=["collections"], response_model=CollectionsOut,
)
def list_collections(request: Request, q: Service) -> dict[str, Any]:
    """All collections with their configuration (those the API key may use)."""
    return {"collections": [c.to_json() for c in q.list_collections() if access.allowed(request, c.name)]}


@router.post(
    "/v1/collections", status_code=201, tags=["collections"], response_model=CollectionConfig,
    responses=error_responses(
        e.InvalidRequest, e.CollectionExists, e.Conflict, e.Forbidden, e.UnsupportedIndex, e.IndexBuildFailed,
        *STORE_ERRORS, e.EmbeddingUnavailable, e.EmbeddingError, body=True,
    ),
)
def create_collection(body: CreateCollection, request: Request, q: Service) -> dict[str, Any]:
    """Create a collection (409 if the name is taken)."""
    access.check_collection(request, body.name)
    cfg = q.create_collection(
        body.name, language=body.language, chunk_size=body.chunk_size, chunk_overlap=body.chunk_overlap,
        fusion=body.fusion, shared=body.tenancy == "shared", cache_threshold=body.cache_threshold,
    )
    access.audit(request, "collection.create", body.name, tenancy=body.tenancy)
    return cfg.to_json()


@router.get(
    "/v1/collections/{name}", tags=["collections"], response_model=CollectionOut,
    responses=error_responses(e.InvalidRequest, e.CollectionNotFound, *STORE_ERRORS),  # 400: RequestGuard's path check
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
    responses=error_responses(e.InvalidRequest, e.CollectionNotFound, *STORE_ERRORS),  # 400: RequestGuard's path check
)
def drop_collection(name: str, request: Request, q: Service) -> dict[str, str]:
    """Drop a collection with all its data."""
    q.drop_collection(name)
    access.audit(request, "collection.drop", name)
    return {"deleted": name}


@router.post(
    "/v1/collections/{name}/reindex", status_code=202, tags=["collections"], response_model=JobOut,
    responses=error_responses(e.InvalidRequest, e.CollectionNotFound, e.ReindexRunning, *STORE_ERRORS, body=True),
)
def reindex_collection(name: str, q: Service, body: ReindexIn | None = None) -> dict[str, Any]:
    """Start building the collection's next version (202 with the job; follow it at ``/v1/jobs/{id}``)."""
    body = body or ReindexIn()
    return job_out(q.start_reindex(name, model=body.model, index=body.index, chunk_size=body.chunk_size,
                                chunk_overlap=body.chunk_overlap))


@router.post(
    "/v1/collections/{name}/rollback", tags=["collections"], response_model=RollbackOut,
    responses=error_responses(e.InvalidRequest, e.CollectionNotFound, e.Conflict, e.ReindexRunning, *STORE_ERRORS),
)
def rollback_collection(name: str, q: Service) -> dict[str, int]:
    """Swap back to the version served before the last reindex (404 when none is kept)."""
    report = q.rollback(name)
    return {"version": report.version, "previous": report.previous}
