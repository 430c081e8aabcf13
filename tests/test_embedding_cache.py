"""The test suite's embedding cache returns the model's own rows and runs each text once."""

from __future__ import annotations

import fcntl
import threading
from pathlib import Path

import numpy as np
import pytest

from embedding import sentence_transformers as st
from tests.embedding_cache import CACHE_ENV, CachedEmbedder, cache_dir, cache_file, fingerprint


def test_rows_are_the_models_own_and_each_text_runs_once(
    minilm: st.SentenceTransformerEmbedder, tmp_path: Path
) -> None:
    texts = ["vitamin D and bone density", "word " * 300, "vitamin D and bone density", ""]
    cached = CachedEmbedder(minilm, tmp_path / "rows.sqlite")
    first = cached.embed(texts)
    assert cached.model_runs == 3  # the repeated text ran once
    want = minilm.embed(texts)
    np.testing.assert_allclose(first.vectors, want.vectors, atol=2e-6)
    assert first.truncated.tolist() == want.truncated.tolist() == [False, True, False, False]
    again = cached.embed(texts[::-1])
    assert cached.model_runs == 3 and np.array_equal(again.vectors, first.vectors[::-1])
    cached.close()
    # another process (here: another instance) reads the rows from disk; the model does not run
    reopened = CachedEmbedder(minilm, tmp_path / "rows.sqlite")
    assert np.array_equal(reopened.embed(texts).vectors, first.vectors) and reopened.model_runs == 0
    assert reopened.embed([]).vectors.shape == (0, 384)
    with pytest.raises(Exception, match="embedding model failed"):
        reopened.embed([None])  # type: ignore[list-item]  # bad input still reaches the model's error
    reopened.close()



def test_a_worker_that_opened_the_file_earlier_reads_rows_another_stored_and_runs_no_model(
    minilm: st.SentenceTransformerEmbedder, tmp_path: Path
) -> None:
    # two pytest-xdist workers: both open the file, one embeds, the other then needs the same texts
    first, second = (CachedEmbedder(minilm, tmp_path / "rows.sqlite") for _ in range(2))
    first.warm_up(), second.warm_up()
    texts = [f"mitochondria and ageing, study {i}" for i in range(20)]  # more than run without the lock
    want = first.embed(texts)
    assert first.model_runs == 20
    got = second.embed([*texts, "one new text"])
    assert second.model_runs == 1  # only the text nobody stored ran
    assert np.array_equal(got.vectors[:20], want.vectors)
    assert (tmp_path / "rows.sqlite.lock").is_file()
    first.close(), second.close()

def test_the_key_is_the_files_contents_code_and_settings_not_the_folder_name(tmp_path: Path) -> None:
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "model.safetensors").write_bytes(b"weights")
    def key(folder: str, **settings: object) -> str:
        return fingerprint({"model.safetensors": tmp_path / folder / "model.safetensors"}, [st], ["numpy"], **settings)

    assert key("a") == key("b")
    (tmp_path / "b" / "model.safetensors").write_bytes(b"other weights")
    assert key("b") != key("a") and key("a", quantize="int8") != key("a")


def test_the_cache_folder_is_set_by_its_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    assert cache_dir() == tmp_path and cache_file("org/model", "ab" * 32) == tmp_path / f"org_model-{'ab' * 16}.sqlite"
    monkeypatch.setenv(CACHE_ENV, "off")
    assert cache_dir() is None and cache_file("m", "00") is None


def test_a_query_does_not_wait_for_another_process_holding_the_lock(
    minilm: st.SentenceTransformerEmbedder, tmp_path: Path
) -> None:
    """A few texts (a query) run while another process embeds a corpus slice under the lock."""
    cached = CachedEmbedder(minilm, tmp_path / "rows.sqlite")
    cached.warm_up()
    results: list[np.ndarray] = []
    with open(tmp_path / "rows.sqlite.lock", "a") as held:  # "another process" holds the lock
        fcntl.flock(held, fcntl.LOCK_EX)
        worker = threading.Thread(target=lambda: results.append(cached.embed(["a query"] * 3 + ["x"] * 13).vectors))
        worker.start()
        worker.join(timeout=120)
        finished = not worker.is_alive()
        fcntl.flock(held, fcntl.LOCK_UN)
    worker.join()
    assert finished and results[0].shape == (16, 384)
    np.testing.assert_allclose(results[0][0], minilm.embed(["a query"]).vectors[0], atol=2e-6)
    # the row in memory is the stored row, so every process uses the same vector
    other = CachedEmbedder(minilm, tmp_path / "rows.sqlite")
    assert np.array_equal(other.embed(["a query"]).vectors[0], results[0][0]) and other.model_runs == 0
    cached.close(), other.close()
