"""``POST /v1/collections/{name}/feedback``: a thumbs up or down, or clicks on hits, of a served request.

The request is named by its ``X-Request-ID`` (the client's own, or the one the server echoed in
the search's or answer's reply); only the key that asked may rate it. See
:mod:`quarry.services.feedback` (what is kept, for how long) and the feedback gates of a gray
release (:func:`indexing.rollout.evaluate`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from quarry import errors as e
from quarry.api.deps import NAMED_ERRORS, Service
from quarry.api.edge import Checked
from quarry.api.errors import error_responses
from quarry.services import feedback

router = APIRouter()

DocumentId = Annotated[str, Field(min_length=1, max_length=256)]


class FeedbackIn(Checked):
    """A client's feedback on one served request: a rating, clicked hits, or both."""

    request_id: str = Field(
        min_length=1, max_length=128, pattern=r"^[A-Za-z0-9\-_.:@=+/]{1,128}$",
        description="The request's X-Request-ID (as the search's or answer's reply echoed it).",
    )
    rating: Literal["up", "down"] | None = Field(
        None, description="Thumbs up or down (a later rating of the same request replaces it).")
    clicked: list[DocumentId] = Field(
        default_factory=list, max_length=feedback.MAX_CLICKS,
        description="Document ids of the request's hits the user clicked (each counted once).")


class FeedbackOut(BaseModel):
    """The request's feedback as now recorded, and the collection version that served it."""

    request_id: str
    collection: str
    version: int = Field(description="The collection version that served the request.")
    rollout: Literal["candidate", "live"] | None = Field(
        description="Its role in a gray release when one routed the request, else null.")
    rating: Literal["up", "down"] | None
    clicks: int = Field(description="Distinct hits of the request clicked so far.")


@router.post(
    "/v1/collections/{name}/feedback", tags=["search"], response_model=FeedbackOut,
    responses=error_responses(*NAMED_ERRORS, e.NotFound, body=True),
)
def give_feedback(name: str, body: FeedbackIn, q: Service) -> dict[str, Any]:
    """Rate a search or answer this key was served (thumbs up/down), or say which of its hits were clicked.

    Ties the feedback to the collection version that served the request: while a gray release
    routes the collection, the thumbs-down share and click-through rate of each version are gates
    of the ramp. Idempotent: sending the same feedback again changes nothing. 404 when the request
    id is unknown here, expired (``QUARRY_MONITOR__FEEDBACK_TTL_S``), or another key's.
    """
    return feedback.give(q.view, name, body.request_id, rating=body.rating, clicked=body.clicked)
