"""REST routes of a collection's gray release (:mod:`quarry.services.rollout`), and its routing key.

``POST /v1/collections/{name}/rollout`` builds a candidate version and starts a shadow or a
canary; ``.../rollout/step``, ``.../rollout/promote`` and ``.../rollout/abort`` move it;
``GET .../rollout`` reads it (the same object as ``describe``'s ``rollout``); ``GET .../rollout/report``
is its A/B report (HTML, or ``?format=json``: :mod:`quarry.services.rollout_report` with the
paired test of :mod:`eval.rollout_report`). Every route is the
operator's (``admin``; :data:`quarry.api.access.POLICY`); each action is in the audit log with the
key that asked.

:class:`RouteKey` (an ASGI middleware) sets :data:`quarry.services.rollout.ROUTE_KEY` to the id
of the API key a request presents (``qk_<id>_…``, parsed from the header the access layer verifies:
nothing is read; :func:`quarry.api.access.presented_key_id`), so a canary routes by key (and the
feedback ledger keys on it); a request without one routes by its query text.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import Field
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from indexing.collections import check_name_length
from indexing.docstore import off_loop
from indexing.rollout import DEFAULT_SCHEDULE
from quarry import errors as e
from quarry.api import access
from quarry.api.edge import Checked
from quarry.api.errors import error_responses
from quarry.service import Quarry
from quarry.services import rollout, rollout_report
from quarry.services.view import View


class RouteKey:
    """ASGI middleware: the request's API key id as the rollout's routing key (see the module doc)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:  # noqa: D102
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # the key the access layer verifies: a second header naming another key's id is not read
        token = rollout.ROUTE_KEY.set(access.presented_key_id(Headers(scope=scope)))
        try:
            await self.app(scope, receive, send)
        finally:
            rollout.ROUTE_KEY.reset(token)


async def _service(request: Request) -> Quarry:
    check_name_length(request.path_params.get("name", ""))
    return await off_loop(access.service, request)


Service = Annotated[Quarry, Depends(_service)]
router = APIRouter()


class RolloutIn(Checked):
    """``POST /v1/collections/{name}/rollout``: the candidate to build and how to release it."""

    model: str | None = Field(None, description="Another embedding model's URL (default: the live one's).")
    index: str | None = Field(None, description="auto (the planner's), or an index kind (HNSW, IVF_FLAT, ...).")
    index_params: dict[str, Any] | None = Field(
        None, description="With index: the build parameters (e.g. {\"nlist\": 64}); default the planner's.")
    search_params: dict[str, Any] | None = Field(
        None, description="With index: the query-time parameters (e.g. {\"nprobe\": 8}); default the planner's.")
    mode: Literal["shadow", "canary"] = Field("canary", description="shadow: compare only; canary: serve a share.")
    schedule: list[float] = Field(list(DEFAULT_SCHEDULE), description="The ramp in percent, ascending, ending at 100.")
    step_samples: int = Field(200, ge=1, le=10_000_000, description="Queries each step is held for before its gates.")
    shadow_rate: float = Field(0.05, ge=0, le=1, description="Share of queries also run on the other version.")
    auto: bool = Field(False, description="Advance (and promote at the end) when a step's gates pass.")
    gates: dict[str, float] | None = Field(None, description="Bounds of the gates (indexing.rollout.Gates).")


_ERRORS = (e.InvalidRequest, e.CollectionNotFound, e.NotFound, e.Conflict, e.StoreUnavailable, e.StoreError)


def _view(q: Quarry) -> View:
    return q.view


def _by(request: Request) -> str | None:
    who = getattr(request.state, "principal", None)
    return getattr(who, "key_id", None)


@router.post(
    "/v1/collections/{name}/rollout", status_code=201, tags=["rollout"],
    responses=error_responses(*_ERRORS, e.ReindexRunning, e.ReindexFailed, e.UnsupportedIndex, body=True),
)
async def start_rollout(name: str, body: RolloutIn, request: Request, q: Service) -> dict[str, Any]:
    """Build a candidate version beside the live one (as a reindex does, without the swap) and start routing.

    Answers when the candidate is built (its offline recall verified), with the rollout.
    """
    index: Any = body.index
    if body.index is not None and (body.index_params is not None or body.search_params is not None):
        from dataclasses import replace

        cfg = q.get_collection(name)
        planned = q.view.space.index_spec(body.index, 0, max(cfg.dim, 1), cfg.metric)
        if planned is None:
            raise e.InvalidRequest("index_params and search_params need an index kind, not auto")
        index = replace(planned, params={**planned.params, **(body.index_params or {})},
                        search_params={**planned.search_params, **(body.search_params or {})})
    started = await run_in_threadpool(
        lambda: rollout.start(_view(q), name, model=body.model, index=index, mode=body.mode, schedule=body.schedule,
                              step_samples=body.step_samples, shadow_rate=body.shadow_rate, auto=body.auto,
                              gates=body.gates, by=_by(request)))
    return started.to_json()


@router.get("/v1/collections/{name}/rollout", tags=["rollout"], responses=error_responses(*_ERRORS))
def get_rollout(name: str, q: Service) -> dict[str, Any]:
    """The collection's newest rollout with this process's figures of its current step (404: none)."""
    rollout.get(_view(q), name)
    found = rollout.describe(_view(q), name)
    assert found is not None  # noqa: S101 - get() raised otherwise
    return found


@router.post("/v1/collections/{name}/rollout/step", tags=["rollout"], responses=error_responses(*_ERRORS))
def step_rollout(name: str, request: Request, q: Service) -> dict[str, Any]:
    """Move the rollout to its schedule's next share (a shadow becomes a canary)."""
    return rollout.step(_view(q), name, by=_by(request)).to_json()


@router.post(
    "/v1/collections/{name}/rollout/promote", tags=["rollout"], responses=error_responses(*_ERRORS, e.ReindexRunning),
)
def promote_rollout(name: str, request: Request, q: Service) -> dict[str, Any]:
    """Make the candidate the live version (the writes since its last sync replayed first)."""
    return rollout.promote(_view(q), name, by=_by(request)).to_json()


@router.post("/v1/collections/{name}/rollout/abort", tags=["rollout"], responses=error_responses(*_ERRORS))
def abort_rollout(name: str, request: Request, q: Service) -> dict[str, Any]:
    """Roll back: the live version serves everything again; the candidate is dropped."""
    return rollout.abort(_view(q), name, by=_by(request), reason="asked").to_json()


_HTML_CSP = "sandbox; default-src 'none'; style-src 'unsafe-inline'; img-src data:"  # as the eval reports'
_REPORT_OK: dict[int | str, Any] = {
    200: {
        "description": "The A/B report: an HTML page (default), or with format=json its JSON object.",
        "content": {
            "text/html": {"schema": {"type": "string"}},
            "application/json": {"schema": {
                "type": "object",
                "required": ["collection", "rollout", "versions", "pairs", "paired", "decisions"],
                "properties": {"collection": {"type": "string"}, "rollout": {"type": "object"},
                               "versions": {"type": "object"}, "pairs": {"type": "array"},
                               "paired": {"type": "object"}, "decisions": {"type": "array"}},
            }},
        },
    },
}


@router.get(
    "/v1/collections/{name}/rollout/report", tags=["rollout"], response_class=Response,
    responses={**_REPORT_OK, **error_responses(*_ERRORS)},
)
def get_rollout_report(
    name: str, q: Service,
    fmt: Annotated[Literal["html", "json"], Query(alias="format", description="html (default) or json.")] = "html",
) -> Response:
    """The A/B report of the collection's newest rollout: live vs candidate, and a paired test of shadowed queries.

    Figures are this process's, as the gates'; 404 when the collection never had a rollout.
    """
    from eval.rollout_report import render_rollout_html, with_paired

    report = with_paired(rollout_report.report(_view(q), name))
    headers = {"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}
    if fmt == "json":
        return JSONResponse(report, headers=headers)
    return HTMLResponse(render_rollout_html(report), headers=headers | {"Content-Security-Policy": _HTML_CSP})
