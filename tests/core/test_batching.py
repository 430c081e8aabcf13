from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from embedding.batching import BatchingEmbedder
from embedding.sentence_transformers import SentenceTransformerEmbedder


def test_concurrent_calls_share_batches_and_get_their_own_rows(minilm: SentenceTransformerEmbedder) -> None:
    batcher = BatchingEmbedder(minilm, max_batch=16)
    texts = [f"query number {i} about protein folding" for i in range(40)]
    direct = minilm.embed(texts).vectors
    with ThreadPoolExecutor(max_workers=12) as pool:
        results = list(pool.map(lambda t: batcher.embed_queries([t]), texts))
    got = np.vstack([r.vectors for r in results])
    assert got.shape == (40, minilm.dim)
    np.testing.assert_allclose(got, direct, atol=1e-5)
    multi = batcher.embed_queries(texts[:3])
    np.testing.assert_allclose(multi.vectors, direct[:3], atol=1e-5)
    assert batcher.embed_queries([]).vectors.shape == (0, minilm.dim)


def test_errors_reach_the_caller(minilm: SentenceTransformerEmbedder) -> None:
    batcher = BatchingEmbedder(minilm)
    try:
        batcher.embed_queries([None])  # type: ignore[list-item]
    except Exception as exc:  # noqa: BLE001
        assert "embedding model failed" in str(exc)
    else:
        raise AssertionError("expected an error")
    assert batcher.embed_queries(["still works"]).vectors.shape == (1, minilm.dim)


def test_submit_returns_at_once_and_its_future_gives_the_rows(minilm: SentenceTransformerEmbedder) -> None:
    batcher = BatchingEmbedder(minilm)
    texts = ["vitamin D and bone density", "malaria vaccine trial"]
    futures = [batcher.submit([t]) for t in texts]  # both queued before either is awaited
    got = np.vstack([f.result(timeout=30).vectors for f in futures])
    np.testing.assert_allclose(got, minilm.embed(texts).vectors, atol=1e-5)
    failed = batcher.submit([None])  # type: ignore[list-item]
    assert "embedding model failed" in str(failed.exception(timeout=30))


def test_torch_on_cpu_runs_one_call_per_core_and_rows_stay_right(minilm: SentenceTransformerEmbedder) -> None:
    batcher = BatchingEmbedder(minilm, max_batch=4)
    batcher.warm_up()
    assert batcher.workers == minilm.parallel_calls >= 1
    texts = [f"claim {i}: statins reduce {'cardiovascular ' * (i % 5)}risk" for i in range(30)]
    direct = minilm.embed(texts).vectors
    with ThreadPoolExecutor(max_workers=10) as pool:
        got = np.vstack([r.vectors for r in pool.map(lambda t: batcher.embed_queries([t]), texts)])
    np.testing.assert_allclose(got, direct, atol=1e-5)
    assert BatchingEmbedder(minilm, workers=3).workers == 3
    with pytest.raises(ValueError, match="workers"):
        BatchingEmbedder(minilm, workers=0)
