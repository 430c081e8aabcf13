"""The packaged MiniLM on CUDA in fp16 against the CPU fp32 reference (runs where a GPU is lent)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from embedding.sentence_transformers import SentenceTransformerEmbedder
from tests.embedding.conftest import scifact_texts
from tests.embedding_cache import CachedEmbedder


@pytest.mark.gpu
def test_cuda_fp16_embeddings_match_cpu_fp32(minilm_vectors: CachedEmbedder, shared_data: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch (runs on the GPU machine)")
    texts = scifact_texts(shared_data, 512)
    gpu = SentenceTransformerEmbedder("all-MiniLM-L6-v2", batch_size=64, device="cuda")
    gpu.warm_up()
    assert next(gpu._model.parameters()).dtype == torch.float16
    cpu_out = minilm_vectors.embed(texts)
    gpu_out = gpu.embed(texts)
    assert gpu_out.vectors.dtype == np.float32
    assert gpu_out.vectors.shape == cpu_out.vectors.shape == (512, 384)
    np.testing.assert_allclose(np.linalg.norm(gpu_out.vectors, axis=1), 1.0, atol=1e-3)
    cosine = (gpu_out.vectors * cpu_out.vectors).sum(axis=1)
    assert cosine.min() >= 0.999, f"worst cosine {cosine.min():.5f}"
    np.testing.assert_array_equal(gpu_out.truncated, cpu_out.truncated)
    # Nearest neighbours among the documents agree: fp16 moves scores, not the top hit.
    queries = minilm_vectors.embed(["vitamin D and bone density", "tumour suppressor genes", "malaria vaccine"])
    gpu_queries = gpu.embed(["vitamin D and bone density", "tumour suppressor genes", "malaria vaccine"])
    top_cpu = np.argsort(-(queries.vectors @ cpu_out.vectors.T), axis=1)[:, 0]
    top_gpu = np.argsort(-(gpu_queries.vectors @ gpu_out.vectors.T), axis=1)[:, 0]
    np.testing.assert_array_equal(top_cpu, top_gpu)
