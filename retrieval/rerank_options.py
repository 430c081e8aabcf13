"""A request's rerank ask resolved against the server's reranker and its settings.

Shared by the search route and the answer service: one place decides the defaults
(``QUARRY_RERANK__TOP_N``), the clamp of the time budget (``QUARRY_RERANK__BUDGET_MS`` is also
the most a request may ask for) and the refusal of a model this server does not run.
"""

from __future__ import annotations

from typing import Protocol

from quarry.errors import InvalidRequest, clip
from quarry.settings import RerankSettings
from retrieval.results import RerankOptions


class RerankAsk(Protocol):
    """What a request asks of the reranker (every field optional: the settings fill them in)."""

    @property
    def top_n(self) -> int | None:
        """Fused candidates to rescore."""
        ...

    @property
    def budget_ms(self) -> float | None:
        """Time budget in milliseconds."""
        ...

    @property
    def model(self) -> str | None:
        """The reranker the client expects (must be the loaded one)."""
        ...


def rerank_options(settings: RerankSettings, loaded: str | None, ask: RerankAsk | None) -> RerankOptions | None:
    """The :class:`RerankOptions` of ``ask`` (``None``: no rerank asked).

    Args:
        settings: The server's rerank settings.
        loaded: The loaded reranker's model id, ``None`` without one.
        ask: The request's rerank fields.

    Raises:
        InvalidRequest: ``ask.model`` names a model this server does not run.
    """
    if ask is None:
        return None
    if ask.model and ask.model != loaded:
        serves = f"reranks with {loaded!r}" if loaded else "has no reranker (QUARRY_RERANK__MODEL)"
        raise InvalidRequest(f"rerank model {clip(ask.model)} is not loaded; this server {serves}")
    return RerankOptions(
        top_n=ask.top_n or settings.top_n,
        budget_ms=min(ask.budget_ms or settings.budget_ms, settings.budget_ms),
        batch_size=settings.batch_size,
    )
