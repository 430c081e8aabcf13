"""The query encoder in a child process: same vectors, batching, failures typed, nothing left running."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import CancelledError, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from embedding.base import QueryEncoder
from embedding.onnx import OnnxEmbedder
from embedding.process import ProcessEmbedder
from indexing.document_rules import SourceDocument
from quarry.errors import ConfigError, EmbeddingError, EmbeddingUnavailable
from quarry.service import Quarry
from quarry.settings import Settings

URL = "onnx://all-MiniLM-L6-v2?quantize=none&threads=1"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _settings(tmp_path: Path, onnx_cache: Path, url: str = URL, **embedding: object) -> Settings:
    return Settings(data_dir=tmp_path, embedding={"url": url, "cache_dir": onnx_cache, **embedding})


@pytest.fixture()
def encoder(tmp_path: Path, onnx_cache: Path) -> Iterator[ProcessEmbedder]:
    process = ProcessEmbedder(URL, _settings(tmp_path, onnx_cache))
    yield process
    process.close()


def test_vectors_equal_the_in_process_model_under_concurrent_queries(
    encoder: ProcessEmbedder, onnx_cache: Path, scifact_subset: list[str]
) -> None:
    assert isinstance(encoder, QueryEncoder)
    encoder.warm_up()
    assert encoder.dim == 384 and encoder.model_id == "all-MiniLM-L6-v2" and encoder.pid is not None
    texts = [t[:300] for t in scifact_subset[:64]]
    with ThreadPoolExecutor(8) as pool:  # many small requests: the child batches what queued
        futures = list(pool.map(lambda t: encoder.submit([t]), texts))
    got = np.vstack([f.result().vectors for f in futures])
    local = OnnxEmbedder.from_url(URL, onnx_cache)
    want = local.embed(texts).vectors
    assert got.shape == (64, 384) and got.dtype == np.float32
    assert float((got * want).sum(axis=1).min()) > 0.99999
    long = encoder.embed_queries(["word " * 400, "short"])
    assert long.truncated.tolist() == [True, False]
    assert encoder.embed_queries([]).vectors.shape == (0, 384)


def test_the_child_embeds_queries_with_the_models_query_prefix(tmp_path: Path, onnx_cache: Path) -> None:
    process = ProcessEmbedder(f"{URL}&query_prefix=query%3A%20", _settings(tmp_path, onnx_cache))
    try:
        got = process.submit(["vitamin D"]).result().vectors
        assert process.card.query_prefix == "query: " and process.card.languages == {"en"}
        assert process.fingerprint.startswith("prompted:")
    finally:
        process.close()
    want = OnnxEmbedder.from_url(URL, onnx_cache).embed(["query: vitamin D"]).vectors
    assert float(got[0] @ want[0]) > 0.99999


def test_a_batch_the_model_rejects_fails_typed_and_the_child_serves_on(encoder: ProcessEmbedder) -> None:
    pid = encoder.embed_queries(["fine"]) and encoder.pid
    with pytest.raises(EmbeddingError, match="failed on a batch"):
        encoder.embed_queries([None])  # type: ignore[list-item]  # the tokenizer raises TypeError in the child
    assert encoder.embed_queries(["still fine"]).vectors.shape == (1, 384) and encoder.pid == pid


def test_a_killed_child_fails_its_requests_typed_and_the_next_query_restarts_it(encoder: ProcessEmbedder) -> None:
    encoder.warm_up()
    first = encoder.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while encoder.pid == first and time.monotonic() < deadline:  # the receiver sees the socket close
        time.sleep(0.05)
    assert encoder.pid is None
    assert encoder.embed_queries(["after the crash"]).vectors.shape == (1, 384)  # a new child
    assert encoder.pid not in (None, first)


def test_close_leaves_no_child_and_fails_nothing_silently(encoder: ProcessEmbedder) -> None:
    encoder.warm_up()
    child = encoder.pid
    assert child is not None and _alive(child)
    encoder.close()
    assert encoder.pid is None and not _alive(child)  # exited and reaped
    with pytest.raises(EmbeddingUnavailable, match="closed"):
        encoder.submit(["after close"]).result(timeout=60)  # closed for good: no new child
    assert encoder.pid is None
    encoder.close()  # twice is harmless


def test_close_during_a_cold_start_leaves_no_child(encoder: ProcessEmbedder) -> None:
    futures = [encoder.submit([f"query {i}"]) for i in range(3)]  # the start runs on a helper thread
    encoder.close()
    for future in futures:
        try:
            future.result(timeout=60)
        except Exception as exc:  # noqa: BLE001 - closed before or after its answer: both are fine
            assert isinstance(exc, (EmbeddingUnavailable, CancelledError))
    time.sleep(0.5)
    assert encoder.pid is None


def test_a_caller_that_gives_up_does_not_stop_the_answers(encoder: ProcessEmbedder) -> None:
    encoder.warm_up()

    async def give_up() -> None:  # what a cancelled request awaiting its vector does
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.wrap_future(encoder.submit(["word " * 200] * 32)), 0.001)

    asyncio.run(give_up())
    assert encoder.embed_queries(["next"]).vectors.shape == (1, 384)


def test_texts_that_cannot_be_sent_fail_typed(encoder: ProcessEmbedder) -> None:
    encoder.warm_up()
    with pytest.raises(EmbeddingError, match="cannot send"):
        encoder.submit([threading.Lock()]).result(timeout=10)  # type: ignore[list-item]
    assert encoder.embed_queries(["fine"]).vectors.shape == (1, 384)


def test_a_module_named_like_ours_in_the_working_directory_does_not_shadow_the_child(
    encoder: ProcessEmbedder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "embedding.py").write_text("raise SystemExit('shadowed')\n")
    monkeypatch.chdir(tmp_path)
    assert encoder.embed_queries(["from elsewhere"]).vectors.shape == (1, 384)


def test_a_model_that_cannot_load_is_a_typed_unavailable_error(tmp_path: Path, onnx_cache: Path) -> None:
    missing = f"onnx://{tmp_path / 'no-such-model'}"
    encoder = ProcessEmbedder(missing, _settings(tmp_path, onnx_cache, missing))
    with pytest.raises(EmbeddingUnavailable, match="could not load") as info:
        encoder.warm_up()
    assert "no-such-model" in str(info.value.message)
    with pytest.raises(EmbeddingUnavailable):
        encoder.submit(["q"]).result(timeout=60)
    assert encoder.pid is None


def test_only_in_process_model_urls_run_in_a_child(tmp_path: Path, onnx_cache: Path) -> None:
    url = "triton+grpc://localhost:8001/minilm"
    with pytest.raises(ConfigError, match="onnx or torch"):
        ProcessEmbedder(url, _settings(tmp_path, onnx_cache, url))


def test_the_service_searches_through_the_child_and_stops_it(
    tmp_path: Path, onnx_cache: Path, scifact_subset: list[str]
) -> None:
    quarry = Quarry(_settings(tmp_path, onnx_cache, query_process=True))
    try:
        assert isinstance(quarry.query_embedder, ProcessEmbedder)
        quarry.create_collection("docs")
        quarry.upsert("docs", [SourceDocument(f"d{i}", t) for i, t in enumerate(scifact_subset[:20])])
        quarry.warm_up()
        result = quarry.search("docs", scifact_subset[3][:200], mode="dense", top_k=3)
        assert result.hits[0].document_id == "d3" and not result.degraded
        child = quarry.query_embedder.pid
        assert child is not None and _alive(child)
    finally:
        quarry.close()
    assert not _alive(child)
