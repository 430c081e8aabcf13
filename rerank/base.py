"""The ``Reranker`` seam: score (query, passage) pairs with a cross-encoder."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt


@runtime_checkable
class Reranker(Protocol):
    """Contract of a reranking backend.

    Attributes:
        model_id: Name or path of the cross-encoder.
        device: ``"cuda"`` or ``"cpu"``, where inference runs.
    """

    model_id: str
    device: str

    def warm_up(self) -> None:
        """Load weights; idempotent."""
        ...

    def score(self, query: str, passages: Sequence[str]) -> npt.NDArray[np.float32]:
        """Relevance scores of ``passages`` for ``query``.

        Args:
            query: The query text.
            passages: ``n`` passages.

        Returns:
            ``(n,) float32`` scores, higher is more relevant (raw logits; comparable within a call).

        Raises:
            RerankError: The model failed.
        """
        ...
