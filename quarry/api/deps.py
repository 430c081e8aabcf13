"""What every route module shares: the service dependency and the error sets routes document."""

from __future__ import annotations

from typing import Annotated

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
