"""A new collection's default fusion, from its language and what its embedding model declares.

Equal-weight RRF (the server's default) assumes both channels are worth listening to. A model
that does not embed the collection's language gives a near-random dense channel, and RRF lets
it halve the quality: on CMRC2018 test (Chinese) with the packaged English MiniLM, BM25 alone
reaches nDCG@10 0.9901 and RRF ``k=60`` 1:1 0.5217 (``bench/multilingual.py``,
docs/embedding.md#multilingual-models). Such a collection gets :data:`UNCOVERED_FUSION`
instead, score fusion that leans on BM25, whose setting was chosen on CMRC2018 **dev** (never
on test): ``weighted`` ``minmax`` with dense weight 0.3, the best of 0.0-1.0 by 0.1 for both
``zscore`` and ``minmax`` (dev nDCG@10 0.98203; zscore 0.2: 0.98198; BM25 alone 0.98046).
Its test figure is 0.9866 (BM25 alone 0.9901, RRF 0.5217).

The choice, in order:

1. a ``fusion`` the creator gave always wins (``request``);
2. a language the model's card does not cover (:meth:`~embedding.card.ModelCard.covers`) gets
   :data:`UNCOVERED_FUSION` (``language``): ``zh`` with MiniLM (``en``);
3. anything else keeps the server's settings (``settings``): a covered language, ``auto``
   (mixed or unknown text: the model may cover part of it), or a model that declares no
   languages (nothing is known against it).
"""

from __future__ import annotations

from embedding.card import ModelCard
from indexing.collections import FusionConfig, FusionOrigin

UNCOVERED_FUSION = FusionConfig(method="weighted", normalization="minmax", weights={"bm25": 0.7, "dense": 0.3})
"""The default fusion of a collection whose language its embedding model does not declare (tuned on CMRC2018 dev)."""


def choose_fusion(
    language: str, card: ModelCard, model_id: str, explicit: FusionConfig | None
) -> tuple[FusionConfig | None, FusionOrigin]:
    """A new collection's default fusion and why (see the module doc for the rules).

    Args:
        language: The collection's BM25 language (``en``, ``zh`` or ``auto``).
        card: Its embedding model's card (after ``warm_up``).
        model_id: The model's friendly name, for the reason.
        explicit: The creator's ``fusion`` (``None``: not given).

    Returns:
        The fusion to record in the collection (``None``: the server's settings at search time)
        and its :class:`~indexing.collections.FusionOrigin`.
    """
    if explicit is not None:
        return explicit, FusionOrigin(source="request", reason="the fusion given at creation")
    declared = ", ".join(sorted(card.languages)) or "none"
    if language != "auto" and card.languages and not card.covers(language):
        return UNCOVERED_FUSION.model_copy(deep=True), FusionOrigin(
            source="language",
            reason=(
                f"the embedding model {model_id} declares languages [{declared}], not {language!r}: its dense "
                "channel is weighted 0.3 against BM25's 0.7 (weighted minmax, tuned on CMRC2018 dev) instead of "
                "equal-weight RRF"
            ),
        )
    if language == "auto":
        why = "language auto: the text's language is not known"
    elif not card.languages:
        why = f"the embedding model {model_id} declares no languages"
    else:
        why = f"the embedding model {model_id} declares {language!r}"
    return None, FusionOrigin(source="settings", reason=f"{why}; the server's fusion settings")
