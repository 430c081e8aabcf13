"""Audit route: the admin actions of the key's tenant (collection create/drop, key create/revoke, jobs), paged."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool

from quarry import errors as e
from quarry.api import access
from quarry.api.deps import STORE_ERRORS
from quarry.api.errors import error_responses
from quarry.api.models import AuditOut
from quarry.errors import InvalidRequest, clip

router = APIRouter()


@router.get(
    "/v1/audit", tags=["ops"], response_model=AuditOut,
    responses=error_responses(e.InvalidRequest, *STORE_ERRORS),
)
async def list_audit(
    request: Request,
    since: Annotated[float, Query(ge=0, description="Only entries at or after this time (Unix seconds).")] = 0.0,
    cursor: Annotated[str | None, Query(max_length=18, description="The next_cursor of the previous page.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="Entries per page.")] = 100,
) -> dict[str, Any]:
    """The audit log of the key's tenant, in the order it was written, a page at a time (``admin`` scope).

    Each entry says when (``at``, Unix seconds), which key (``key_id``; ``null``: the CLI or an
    open server), what (``action``, e.g. ``collection.create``, ``key.revoke``,
    ``ingest.submit``) and on what (``target``, ``detail``). A key sees its own tenant's entries
    only. ``next_cursor`` is set while more entries may follow (``null`` on the last page).

    Raises:
        InvalidRequest: ``cursor`` is not one this route gave (400).
    """
    after = 0
    if cursor is not None:
        if not cursor.isdigit():
            raise InvalidRequest(f"cursor {clip(cursor)} is not a next_cursor of GET /v1/audit")
        after = int(cursor)
    state = request.app.state.access.state
    rows = await run_in_threadpool(
        state.list_audit, tenant_id=access.tenant_of(request), since=since, limit=limit, after_id=after
    )
    entries = [{"id": a.id, "at": a.at, "action": a.action, "key_id": a.key_id, "tenant": a.tenant_id,
                "target": a.target, "detail": a.detail} for a in rows]
    return {"entries": entries, "next_cursor": str(rows[-1].id) if len(rows) == limit else None}
