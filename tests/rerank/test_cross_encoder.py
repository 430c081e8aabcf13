"""CrossEncoderReranker on a tiny BERT cross-encoder built locally, over SciFact passages."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from quarry.errors import ConfigError, RerankError
from rerank.base import Reranker
from rerank.cross_encoder import CrossEncoderReranker
from rerank.tiny import build_tiny_cross_encoder
from tests.rerank.conftest import Pairs


def test_implements_the_reranker_protocol(reranker: CrossEncoderReranker) -> None:
    assert isinstance(reranker, Reranker)
    assert reranker.device == "cpu"
    assert reranker.dtype == "float32"
    assert reranker.loaded


def test_scores_are_one_float32_per_passage(reranker: CrossEncoderReranker, scifact_pairs: Pairs) -> None:
    scores = reranker.score(scifact_pairs.query, scifact_pairs.passages)
    assert scores.shape == (50,)
    assert scores.dtype == np.float32
    assert np.isfinite(scores).all()
    # Raw logits, not sigmoid probabilities: the tiny model spreads them over a few units.
    assert scores.std() > 0.1
    assert (scores < 0).any() or (scores > 1).any()


def test_no_passages_give_an_empty_result(reranker: CrossEncoderReranker) -> None:
    scores = reranker.score("query", [])
    assert scores.shape == (0,)
    assert scores.dtype == np.float32


def test_scores_do_not_depend_on_the_batch_size(tiny_model_dir: Path, scifact_pairs: Pairs) -> None:
    one = CrossEncoderReranker(str(tiny_model_dir), device="cpu", batch_size=1)
    many = CrossEncoderReranker(str(tiny_model_dir), device="cpu", batch_size=32)
    one.warm_up()
    many.warm_up()
    a = one.score(scifact_pairs.query, scifact_pairs.passages)
    b = many.score(scifact_pairs.query, scifact_pairs.passages)
    # fp32 kernels sum in a different order for a (1, L) batch than for a padded (32, L_max)
    # one; measured on SciFact: at most 5.3e-6 of the largest |score| (2.5e-5 on logits of ~5).
    # A batching bug (padding attended, pairs shuffled) moves scores by 1e-1 or more.
    scale = max(1.0, float(np.abs(b).max()))
    np.testing.assert_allclose(a, b, rtol=0, atol=2e-5 * scale)


def test_scores_are_deterministic(
    reranker: CrossEncoderReranker,
    tiny_model_dir: Path,
    scifact_pairs: Pairs,
    tmp_path: Path,
) -> None:
    first = reranker.score(scifact_pairs.query, scifact_pairs.passages)
    again = reranker.score(scifact_pairs.query, scifact_pairs.passages)
    np.testing.assert_array_equal(first, again)
    # The same seed builds the same weights, so a rebuilt model scores identically.
    rebuilt = CrossEncoderReranker(str(build_tiny_cross_encoder(tmp_path / "m", seed=0)))
    rebuilt.warm_up()
    np.testing.assert_allclose(rebuilt.score(scifact_pairs.query, scifact_pairs.passages), first, rtol=0, atol=1e-6)


def test_concurrent_callers_get_the_sequential_scores(reranker: CrossEncoderReranker, scifact_pairs: Pairs) -> None:
    queries = [scifact_pairs.query, "cancer", "vitamin D deficiency", "protein folding"]
    expected = [reranker.score(q, scifact_pairs.passages[:16]) for q in queries]
    with ThreadPoolExecutor(max_workers=4) as pool:
        got = list(pool.map(lambda q: reranker.score(q, scifact_pairs.passages[:16]), queries * 3))
    for i, scores in enumerate(got):
        np.testing.assert_allclose(scores, expected[i % 4], rtol=0, atol=1e-5)


def _filling(reranker: CrossEncoderReranker, limit: int) -> str:
    """A passage that fills the pair ("query", passage) to exactly ``limit`` tokens."""
    encoder = reranker._encoder
    assert encoder is not None
    tokenizer = encoder.tokenizer
    assert tokenizer.tokenize("query word other") == ["query", "word", "other"]  # one token a word
    passage = "word " * (limit - 4)  # [CLS] query [SEP] passage [SEP]
    assert len(tokenizer("query", passage)["input_ids"]) == limit
    return passage


def test_long_passages_are_truncated_to_the_model_max_length(reranker: CrossEncoderReranker) -> None:
    limit = 512  # the tiny model's max_position_embeddings, as for ms-marco-MiniLM-L-6-v2
    fits = _filling(reranker, limit)
    beyond = fits + "other " * 5000  # 5,000 tokens past the limit
    scores = reranker.score("query", [beyond, fits, fits[: -len("word ")], "other " * 508])
    assert np.isfinite(scores).all()
    # what lies past the limit is cut off: the long passage scores as its truncated prefix ...
    np.testing.assert_allclose(scores[0], scores[1], rtol=0, atol=1e-5)
    # ... while every token inside the limit counts
    assert abs(scores[1] - scores[2]) > 1e-4 and abs(scores[1] - scores[3]) > 1e-4, scores


def test_max_length_truncates_each_pair_there(tiny_model_dir: Path, reranker: CrossEncoderReranker) -> None:
    short = CrossEncoderReranker(str(tiny_model_dir), device="cpu", max_length=64)
    short.warm_up()
    fits = _filling(short, 64)
    beyond = fits + "other " * 100
    scores = short.score("query", [beyond, fits])
    np.testing.assert_allclose(scores[0], scores[1], rtol=0, atol=1e-5)
    full = reranker.score("query", [beyond, fits])  # the model's own 512 sees the tail
    assert abs(full[0] - full[1]) > 1e-4, full


def test_warm_up_is_idempotent(tiny_model_dir: Path) -> None:
    model = CrossEncoderReranker(str(tiny_model_dir), device="cpu")
    assert not model.loaded
    model.warm_up()
    encoder = model._encoder
    model.warm_up()
    assert model._encoder is encoder


def test_scoring_before_warm_up_loads_the_model(reranker: CrossEncoderReranker, tiny_model_dir: Path) -> None:
    model = CrossEncoderReranker(str(tiny_model_dir), device="cpu")
    scores = model.score("query", ["passage", "another passage"])
    assert model.loaded
    np.testing.assert_allclose(scores, reranker.score("query", ["passage", "another passage"]))


def test_scoring_without_a_model_is_a_typed_error(tmp_path: Path) -> None:
    model = CrossEncoderReranker(str(tmp_path / "missing"), device="cpu")
    with pytest.raises(ConfigError, match="QUARRY_RERANK__MODEL"):
        model.score("query", ["passage"])


def test_missing_model_folder_says_what_to_do(tmp_path: Path) -> None:
    model = CrossEncoderReranker(str(tmp_path / "no-such-model"), device="cpu")
    with pytest.raises(ConfigError) as info:
        model.warm_up()
    message = str(info.value)
    assert "does not exist" in message
    assert "cross-encoder/ms-marco-MiniLM-L-6-v2" in message
    assert "QUARRY_RERANK__MODEL=/path" in message


def test_hub_name_offline_says_what_to_do() -> None:
    # tests/conftest.py sets HF_HUB_OFFLINE=1: a hub name not in the local cache cannot load.
    model = CrossEncoderReranker("cross-encoder/ms-marco-MiniLM-L-6-v2", device="cpu")
    with pytest.raises(ConfigError) as info:
        model.warm_up()
    message = str(info.value)
    assert "Hugging Face Hub" in message
    assert "QUARRY_RERANK__MODEL=/path" in message


def test_folder_without_a_model_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("not a model")
    with pytest.raises(ConfigError, match="no config.json"):
        CrossEncoderReranker(str(tmp_path), device="cpu").warm_up()


def test_a_sentence_embedding_model_is_not_a_reranker() -> None:
    """A bi-encoder folder loads into CrossEncoder with a random scoring head (scores change
    with every load); it is refused by its architecture."""
    from embedding.sentence_transformers import resolve_model_path

    bi_encoder = str(resolve_model_path("all-MiniLM-L6-v2"))
    with pytest.raises(RerankError, match="is a BertModel, not a cross-encoder") as info:
        CrossEncoderReranker(bi_encoder, device="cpu").warm_up()
    assert "QUARRY_EMBEDDING__URL" in info.value.message


def test_folder_with_broken_weights_is_a_rerank_error(tiny_model_dir: Path, tmp_path: Path) -> None:
    broken = Path(shutil.copytree(tiny_model_dir, tmp_path / "broken"))
    (broken / "model.safetensors").write_bytes(b"\0" * 64)
    with pytest.raises(RerankError, match="does not load as a cross-encoder"):
        CrossEncoderReranker(str(broken), device="cpu").warm_up()


def test_a_url_is_not_a_model(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="URL"):
        CrossEncoderReranker("triton+grpc://localhost:8001/reranker").warm_up()


def test_batch_size_must_be_positive(tiny_model_dir: Path) -> None:
    with pytest.raises(ConfigError, match="batch_size"):
        CrossEncoderReranker(str(tiny_model_dir), batch_size=0)


def test_auto_device_follows_the_hardware(tiny_model_dir: Path) -> None:
    model = CrossEncoderReranker(str(tiny_model_dir), device="auto")
    if torch.cuda.is_available():
        assert (model.device, model.dtype) == ("cuda", "float16")
    else:
        assert (model.device, model.dtype) == ("cpu", "float32")
        with pytest.raises(ConfigError, match="no CUDA device"):
            CrossEncoderReranker(str(tiny_model_dir), device="cuda")


@pytest.mark.gpu
def test_cuda_fp16_matches_cpu_fp32(reranker: CrossEncoderReranker, tiny_model_dir: Path, scifact_pairs: Pairs) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch (runs on the GPU machine)")
    gpu = CrossEncoderReranker(str(tiny_model_dir), device="cuda")
    gpu.warm_up()
    assert gpu._encoder is not None
    assert next(gpu._encoder.parameters()).dtype == torch.float16
    cpu_scores = reranker.score(scifact_pairs.query, scifact_pairs.passages)
    gpu_scores = gpu.score(scifact_pairs.query, scifact_pairs.passages)
    assert gpu_scores.dtype == np.float32
    np.testing.assert_allclose(gpu_scores, cpu_scores, rtol=0.02, atol=0.05)
    # fp16 may swap near-ties, never the ranking as a whole.
    rank_cpu = np.argsort(np.argsort(-cpu_scores))
    rank_gpu = np.argsort(np.argsort(-gpu_scores))
    assert np.corrcoef(rank_cpu, rank_gpu)[0, 1] > 0.99
