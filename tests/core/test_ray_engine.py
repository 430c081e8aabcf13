"""``quarry ingest --engine ray``: the local pipeline's chunks and vectors, and a re-run embeds nothing.

One local Ray (2 CPUs) per module. The subset is SciFact's first :data:`SUBSET` documents (the
whole corpus takes minutes per run on 2 cores: ``QUARRY_TEST_RAY_DOCS=5183`` runs it whole);
the Ray workers open the real torch MiniLM.
"""

from __future__ import annotations

import io
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from indexing.sources import Source
from quarry.errors import ConfigError
from quarry.ingest_run import Options, Run
from quarry.service import Quarry
from quarry.settings import Settings
from tests.core.conftest import CountingEmbedder
from tests.embedding_cache import CachedEmbedder

ray = pytest.importorskip("ray", reason="the ray extra: pip install 'quarry[ray]'")

SUBSET = int(os.environ.get("QUARRY_TEST_RAY_DOCS", "50"))


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _beir_subset(shared_data: Path, folder: Path) -> Path:
    folder.mkdir()
    with (shared_data / "scifact" / "corpus.jsonl").open() as src:
        lines = [next(src) for _ in range(SUBSET)]
    (folder / "corpus.jsonl").write_text("".join(lines))
    return folder


def _ingest(quarry: Quarry, corpus: Path, engine: str) -> dict[str, object]:
    out = io.StringIO()
    options = Options(as_json=True, engine=engine, workers=1)
    code = Run(quarry, "scifact", Source(corpus), options, Console(file=out), Console(file=io.StringIO())).execute()
    report: dict[str, object] = json.loads(out.getvalue().splitlines()[-1])
    assert code == 0, report
    return report


def _state(quarry: Quarry) -> tuple[dict[str, list[str]], dict[str, np.ndarray]]:
    ids = quarry.docstore.document_ids("scifact")
    chunks = quarry.docstore.chunk_ids_of("scifact", ids)
    flat = [c for cs in chunks.values() for c in cs]
    physical = quarry.live_version("scifact").physical_name
    return {d: sorted(cs) for d, cs in chunks.items()}, {r.id: r.vector for r in quarry.store.get(physical, flat)}


def test_ray_engine_gives_the_local_pipelines_chunks_and_vectors_and_a_rerun_embeds_nothing(
    tmp_path: Path, shared_data: Path, minilm_vectors: CachedEmbedder, local_ray: None
) -> None:
    corpus = _beir_subset(shared_data, tmp_path / "scifact")
    local_model, driver_model = CountingEmbedder(minilm_vectors), CountingEmbedder(minilm_vectors)
    # the memo holds torch's vectors: the Ray workers open the same model by URL (the default is ONNX int8)
    torch = {"url": "torch://all-MiniLM-L6-v2"}
    local = Quarry(Settings(data_dir=tmp_path / "local", embedding=torch), embedder=local_model)
    on_ray = Quarry(Settings(data_dir=tmp_path / "ray", embedding=torch), embedder=driver_model)
    try:
        for quarry in (local, on_ray):
            quarry.create_collection("scifact")
        local_report = _ingest(local, corpus, "local")
        ray_report = _ingest(on_ray, corpus, "ray")
        assert ray_report["engine"] == "ray"
        assert driver_model.calls == 0  # every chunk was embedded by the Ray workers
        assert ray_report["embedded"] == local_report["embedded"] == local_model.texts > SUBSET
        assert ray_report["added"] == SUBSET and ray_report["chunks_written"] == local_report["chunks_written"]

        local_chunks, local_vectors = _state(local)
        ray_chunks, ray_vectors = _state(on_ray)
        assert ray_chunks == local_chunks and len(local_chunks) == SUBSET
        assert on_ray.docstore.counts("scifact") == local.docstore.counts("scifact")
        assert set(ray_vectors) == set(local_vectors) and len(local_vectors) == local_report["chunks_written"]
        worst = max(float(np.abs(ray_vectors[c] - local_vectors[c]).max()) for c in local_vectors)
        assert worst <= 1e-5, worst
        seq = on_ray.docstore.collection_state("scifact")

        again = _ingest(on_ray, corpus, "ray")
        assert again["unchanged"] == SUBSET and again["embedded"] == 0 and again["chunks_written"] == 0
        assert driver_model.calls == 0
        assert on_ray.docstore.collection_state("scifact") == seq  # nothing written: the change log did not move
        assert _state(on_ray)[0] == local_chunks
    finally:
        local.close()
        on_ray.close()


def test_without_the_extra_the_error_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "indexing.ray_engine", raising=False)
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'quarry\[ray\]'"):
        import indexing.ray_engine  # noqa: F401
