"""What every route module shares: the service dependency and the error sets routes document."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import Depends, Request

from indexing.collections import check_name_length
from indexing.docstore import off_loop
from quarry import errors as e
from quarry.api import access
from quarry.service import Quarry


async def get_quarry(request: Request) -> Quarry:
    """FastAPI dependency: the shared service as the key's tenant sees it.

    On the event loop from the state's caches; in a thread when it must read (``off_loop``).

    Raises:
        InvalidRequest: The ``{name}`` is longer than any collection's (before any store is asked).
    """
    check_name_length(request.path_params.get("name", ""))
    return await off_loop(access.service, request)


Service = Annotated[Quarry, Depends(get_quarry)]

# The errors each kind of route can raise, documented through quarry.api.errors.STATUS.
STORE_ERRORS = (e.StoreUnavailable, e.StoreError)
NAMED_ERRORS = (e.InvalidRequest, e.CollectionNotFound, *STORE_ERRORS)
WRITE_ERRORS = (
    *NAMED_ERRORS, e.InvalidDocument, e.ModelMismatch, e.DimensionMismatch, e.EmbeddingUnavailable, e.EmbeddingError
)

# The collection version that served a search or an answer (a gray release routes some to a candidate).
VERSION_HEADER, ROLLOUT_HEADER = "X-Quarry-Collection-Version", "X-Quarry-Rollout"
SERVED_HEADERS: dict[str, Any] = {
    VERSION_HEADER: {
        "description": "The collection version that served the request (its number, as `describe` lists them).",
        "schema": {"type": "string", "pattern": "^[1-9][0-9]*$"},  # an integer, as a header carries it
    },
    ROLLOUT_HEADER: {
        "description": "While a gray release routes the collection: the serving version's role, `candidate` "
        "or `live` (absent otherwise).",
        "schema": {"type": "string", "enum": ["candidate", "live"]},
    },
}
"""The 200 response's headers, as the OpenAPI documents them."""


def version_headers(data: Mapping[str, Any]) -> dict[str, str]:
    """The response headers naming the collection version that served (:data:`SERVED_HEADERS`).

    ``data``: a search result's, an answer's or its ``sources`` event's fields ``version`` (an
    int, ``None``: no header) and ``rollout`` (``candidate``/``live``, ``None`` without a rollout).
    """
    out: dict[str, str] = {}
    if data.get("version") is not None:
        out[VERSION_HEADER] = str(data["version"])
    if data.get("rollout"):
        out[ROLLOUT_HEADER] = str(data["rollout"])
    return out
