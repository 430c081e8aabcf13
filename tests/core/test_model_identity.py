"""A model is what it computes: another model saved under the packaged name is refused (issue 20, 6).

The impostor is built here, at test time: the packaged all-MiniLM-L6-v2 folder (modules,
pooling, tokenizer, configs) with a one-layer BERT of the same width (384) and random weights in
place of MiniLM's, saved in a folder named ``all-MiniLM-L6-v2``. Same friendly name, same
dimension: before fingerprints, its vectors went into the packaged model's collections.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from embedding.sentence_transformers import SentenceTransformerEmbedder
from indexing.document_rules import SourceDocument
from quarry.errors import ModelMismatch
from quarry.service import Quarry
from quarry.settings import Settings
from rerank.tiny import packaged_tokenizer_dir


def build_impostor(parent: Path, *, seed: int = 0) -> Path:
    """``parent/all-MiniLM-L6-v2``: the packaged folder with a random one-layer, 384-wide BERT."""
    import torch
    from transformers import BertConfig, BertModel

    out = parent / "all-MiniLM-L6-v2"
    packaged = packaged_tokenizer_dir()
    shutil.copytree(packaged, out, ignore=shutil.ignore_patterns("model.safetensors", "pytorch_model.bin"))
    config = BertConfig.from_pretrained(str(packaged))
    config.num_hidden_layers, config.intermediate_size = 1, 256
    torch.manual_seed(seed)
    model = BertModel(config)
    model.train(False)
    model.save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def impostor(tmp_path_factory: pytest.TempPathFactory) -> SentenceTransformerEmbedder:
    folder = build_impostor(tmp_path_factory.mktemp("impostor"))
    model = SentenceTransformerEmbedder(str(folder), device="cpu", cache_dir=folder.parent / "cache")
    model.warm_up()
    return model


@pytest.fixture()
def impostor_service(service: Quarry, impostor: SentenceTransformerEmbedder) -> Iterator[Quarry]:
    """A second service on the same store and data dir whose model is the impostor."""
    other = Quarry(Settings(data_dir=service.settings.data_dir), store=service.store, embedder=impostor)
    yield other
    other.docstore.close()  # the store is the shared one: left open


def _ids(result: object) -> list[str]:
    return [h.document_id for h in result.hits]  # type: ignore[attr-defined]


def test_the_impostor_has_the_packaged_name_and_dimension_but_not_its_fingerprint(
    impostor: SentenceTransformerEmbedder, service: Quarry
) -> None:
    service.embedder.warm_up()
    assert (impostor.model_id, impostor.dim) == (service.embedder.model_id, service.embedder.dim)
    assert impostor.fingerprint.startswith("sha256:") and service.embedder.fingerprint.startswith("sha256:")
    assert impostor.fingerprint != service.embedder.fingerprint


def test_a_model_under_the_packaged_name_is_refused(service: Quarry, collection: str, impostor_service: Quarry) -> None:
    service.upsert(collection, [SourceDocument("a", "ant colonies dig tunnels")])
    assert service.get_collection(collection).embedding_fingerprint == service.embedder.fingerprint
    with pytest.raises(ModelMismatch, match="also named 'all-MiniLM-L6-v2' but computes other vectors"):
        impostor_service.upsert(collection, [SourceDocument("b", "bees make honey")])
    assert service.describe(collection)["documents"] == 1 and service.store.count(collection) == 1
    with pytest.raises(ModelMismatch):
        impostor_service.search(collection, "ant colonies", mode="dense")
    hybrid = impostor_service.search(collection, "ant colonies", mode="hybrid")
    assert _ids(hybrid) == ["a"] and "fingerprint" in hybrid.degraded[0]
    assert not service.search(collection, "ant colonies", mode="hybrid").degraded  # the packaged model still serves


def test_a_collection_made_before_fingerprints_keeps_working_and_records_one(
    service: Quarry, collection: str, impostor_service: Quarry
) -> None:
    service.upsert(collection, [SourceDocument("a", "ant colonies dig tunnels")])
    legacy = {k: v for k, v in service.get_collection(collection).to_json().items() if k != "embedding_fingerprint"}
    service.docstore.put_collection(collection, legacy)  # as a collection of an older Quarry was stored
    assert service.get_collection(collection).embedding_fingerprint is None
    dense = service.search(collection, "ant colonies", mode="dense")
    assert _ids(dense) == ["a"] and not dense.degraded
    service.upsert(collection, [SourceDocument("b", "bees make honey")])  # the first write records it
    assert service.get_collection(collection).embedding_fingerprint == service.embedder.fingerprint
    with pytest.raises(ModelMismatch, match="computes other vectors"):
        impostor_service.upsert(collection, [SourceDocument("c", "cats sleep")])
