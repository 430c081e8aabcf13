"""open_reranker: none when no model is configured, else a CrossEncoderReranker not yet loaded."""

from __future__ import annotations

from pathlib import Path

from quarry.settings import RerankSettings
from rerank.base import Reranker
from rerank.cross_encoder import CrossEncoderReranker
from rerank.factory import open_reranker


def test_no_model_means_no_reranker() -> None:
    assert open_reranker(RerankSettings()) is None
    assert open_reranker(RerankSettings(model="  ")) is None


def test_a_model_path_opens_a_cross_encoder(tiny_model_dir: Path) -> None:
    settings = RerankSettings(model=str(tiny_model_dir), batch_size=8, device="cpu")
    reranker = open_reranker(settings)
    assert isinstance(reranker, CrossEncoderReranker)
    assert isinstance(reranker, Reranker)
    assert (reranker.model_id, reranker.batch_size, reranker.device) == (
        str(tiny_model_dir),
        8,
        "cpu",
    )
    assert not reranker.loaded
    reranker.warm_up()
    assert reranker.score("q", ["a", "b"]).shape == (2,)
