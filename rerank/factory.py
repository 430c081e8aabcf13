"""Open the configured reranker, or none.

``QUARRY_RERANK__MODEL`` empty (the default) disables reranking; otherwise it names a local
cross-encoder folder (or a hub name where the network allows), loaded by
:class:`rerank.cross_encoder.CrossEncoderReranker`.
"""

from __future__ import annotations

from quarry.settings import RerankSettings
from rerank.base import Reranker


def open_reranker(settings: RerankSettings) -> Reranker | None:
    """Build the reranker ``settings`` describe; weights load later, in ``warm_up()``.

    Args:
        settings: ``model``, ``device`` and ``batch_size`` are used here; ``top_n`` and
            ``budget_ms`` are read by the query path.

    Returns:
        A :class:`~rerank.cross_encoder.CrossEncoderReranker`, or ``None`` when ``model`` is empty.

    Raises:
        ConfigError: ``device="cuda"`` without a visible GPU.
    """
    if not settings.model.strip():
        return None
    from rerank.cross_encoder import CrossEncoderReranker

    return CrossEncoderReranker(
        settings.model.strip(), device=settings.device, batch_size=settings.batch_size
    )
