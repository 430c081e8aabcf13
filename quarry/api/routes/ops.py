"""Operations routes: liveness, readiness with each dependency's state, Prometheus metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from indexing.docstore import DEFAULT_TENANT
from quarry import metrics
from quarry.api import access
from quarry.api.models import HealthOut, ReadyOut
from quarry.api.probe import degradations, dependencies
from quarry.service import Quarry

router = APIRouter()


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
