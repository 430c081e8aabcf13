"""ONNX Runtime embedder against the torch (sentence-transformers) model on real SciFact text."""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from embedding.base import Embedder
from embedding.onnx import OnnxEmbedder, parse_onnx_url
from embedding.onnx_export import cache_folder, int8_recipe
from embedding.sentence_transformers import resolve_model_path
from eval.runner import collection_search, evaluate
from indexing.sources import read_documents
from quarry.errors import ConfigError, EmbeddingError
from quarry.service import Quarry
from quarry.settings import Settings
from tests.embedding_cache import CachedEmbedder

from .contract import EmbedderContract


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->i", a, b)


def test_satisfies_the_embedder_protocol(int8: OnnxEmbedder) -> None:
    assert isinstance(int8, Embedder)
    assert (int8.model_id, int8.dim, int8.max_seq_length) == ("all-MiniLM-L6-v2", 384, 256)


@pytest.mark.parametrize(("variant", "floor"), [("fp32", 0.9999), ("int8", 0.99)])
def test_matches_torch_on_scifact_subset(
    request: pytest.FixtureRequest,
    variant: str,
    floor: float,
    scifact_subset: list[str],
    minilm_vectors: CachedEmbedder,
) -> None:
    embedder: OnnxEmbedder = request.getfixturevalue(variant)
    got = embedder.embed(scifact_subset)
    want = minilm_vectors.embed(scifact_subset)
    assert got.vectors.shape == (len(scifact_subset), 384) and got.vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(got.vectors, axis=1), 1.0, atol=1e-5)
    cos = cosines(got.vectors, want.vectors)
    assert cos.min() >= floor, f"{variant}: min cosine {cos.min():.5f} (mean {cos.mean():.5f})"
    np.testing.assert_array_equal(got.truncated, want.truncated)


def test_truncation_flags_say_which_inputs_were_cut(int8: OnnxEmbedder, scifact_subset: list[str]) -> None:
    tokenizer = Tokenizer.from_file(str(resolve_model_path("all-MiniLM-L6-v2") / "tokenizer.json"))
    tokenizer.no_truncation()
    texts = ["a short sentence", "word " * 300, "", *scifact_subset[:20]]
    expected = [len(tokenizer.encode(t).ids) > 256 for t in texts]
    assert expected[:3] == [False, True, False] and any(expected[3:]) and not all(expected[3:])
    assert int8.embed(texts).truncated.tolist() == expected


def test_a_text_cut_at_the_limit_embeds_like_its_first_256_tokens(fp32: OnnxEmbedder) -> None:
    long = " ".join(f"token{i}" for i in range(400))
    result = fp32.embed([long, long + " and much more text after the cut"])
    assert result.truncated.tolist() == [True, True]
    assert cosines(result.vectors[:1], result.vectors[1:])[0] > 0.99999


def test_batching_and_order_do_not_change_vectors(fp32: OnnxEmbedder, scifact_subset: list[str]) -> None:
    texts = ["short", *scifact_subset[:10], "a medium length sentence about cells"]
    whole = fp32.embed(texts).vectors
    one_by_one = np.vstack([fp32.embed([t]).vectors for t in texts])
    reversed_ = fp32.embed(texts[::-1]).vectors[::-1]
    np.testing.assert_allclose(whole, one_by_one, atol=1e-5)
    np.testing.assert_allclose(whole, reversed_, atol=1e-5)


def test_empty_input(int8: OnnxEmbedder) -> None:
    result = int8.embed([])
    assert result.vectors.shape == (0, 384) and result.truncated.shape == (0,)


def test_concurrent_calls_give_the_sequential_result(int8: OnnxEmbedder, scifact_subset: list[str]) -> None:
    chunks = [scifact_subset[i : i + 4] for i in range(0, 32, 4)]
    sequential = [int8.embed(c).vectors for c in chunks]
    with ThreadPoolExecutor(8) as pool:
        concurrent = list(pool.map(lambda c: int8.embed(c).vectors, chunks))
    for a, b in zip(sequential, concurrent, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_export_is_cached_by_weight_hash(int8: OnnxEmbedder, fp32: OnnxEmbedder, onnx_cache: Path) -> None:
    assert int8.layout is not None and int8.onnx_path is not None and fp32.onnx_path is not None
    folder = cache_folder(int8.layout, onnx_cache, "all-MiniLM-L6-v2")
    assert int8.onnx_path.parent == fp32.onnx_path.parent == folder
    assert int8.onnx_path.name == f"model.int8-{int8_recipe()}.onnx"
    assert int8.layout.weights_digest()[:16] in folder.name
    stamp = int8.onnx_path.stat().st_mtime_ns
    # any spelling of the packaged model finds the same export (no second copy)
    for name in ("all-MiniLM-L6-v2", "ALL-MINILM-L6-V2", "sentence-transformers/all-MiniLM-L6-v2"):
        again = OnnxEmbedder.from_url(f"onnx://{name}?quantize=int8", onnx_cache)
        again.warm_up()
        assert again.model_id == "all-MiniLM-L6-v2"
        assert again.onnx_path == int8.onnx_path and again.onnx_path.stat().st_mtime_ns == stamp
    digest = int8.layout.weights_digest()[:16]
    assert [p for p in (onnx_cache / "onnx").iterdir() if digest in p.name] == [folder]
    assert int8.onnx_path.stat().st_size < 0.8 * fp32.onnx_path.stat().st_size


@pytest.mark.parametrize(
    ("flags", "recipe"),
    [
        ({"avx2", "avx512bw", "avx512_vnni"}, "dot"),
        ({"avx2", "avx_vnni"}, "dot"),
        ({"fp", "asimd", "asimddp"}, "dot"),
        ({"avx2", "avx512bw"}, "sat"),
        (set(), "sat"),
    ],
)
def test_int8_recipe_follows_the_cpus_int8_dot_product(flags: set[str], recipe: str) -> None:
    assert int8_recipe(frozenset(flags)) == recipe


def test_url_forms() -> None:
    assert parse_onnx_url("onnx://all-MiniLM-L6-v2") == ("all-MiniLM-L6-v2", "int8", None)
    assert parse_onnx_url("onnx://all-MiniLM-L6-v2?quantize=fp32&threads=2") == ("all-MiniLM-L6-v2", "none", 2)
    assert parse_onnx_url("onnx:///models/my-model?quantize=none") == ("/models/my-model", "none", None)
    path = resolve_model_path("all-MiniLM-L6-v2")
    local = OnnxEmbedder.from_url(f"onnx://{path}?quantize=int8", Path("unused"))
    assert local.model_id == path.name and local.quantize == "int8"


@pytest.mark.parametrize(
    "url",
    [
        "onnx://all-MiniLM-L6-v2?quantize=int4",
        "onnx://all-MiniLM-L6-v2?threads=0",
        "onnx://all-MiniLM-L6-v2?threads=%C2%B2",  # "²": str.isdigit says yes, int() says no
        "onnx://all-MiniLM-L6-v2?threads=%D9%A3",  # Arabic-Indic 3
        "onnx://all-MiniLM-L6-v2?threads=2147483648",
        "onnx://all-MiniLM-L6-v2?precision=int8",
        "onnx://",
        "torch://all-MiniLM-L6-v2",
        "onnx://no-such-model-anywhere",
    ],
)
def test_bad_urls_are_config_errors(url: str) -> None:
    with pytest.raises(ConfigError):
        OnnxEmbedder.from_url(url, Path("unused"))


def _model_copy(tmp_path: Path) -> Path:
    """The packaged model's small files copied, its weights linked: a folder to break."""
    source = resolve_model_path("all-MiniLM-L6-v2")
    target = tmp_path / "model"
    for path in source.rglob("*"):
        dest = target / path.relative_to(source)
        if path.is_dir():
            dest.mkdir(parents=True, exist_ok=True)
        elif path.suffix in (".safetensors", ".bin", ".onnx") or path.stat().st_size > 5_000_000:
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.symlink_to(path)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(path.read_bytes())
    return target


@pytest.mark.parametrize(
    ("file", "content", "says"),
    [
        ("modules.json", '["a"]', "must be a list of module objects"),
        ("1_Pooling/config.json", "[1, 2]", "must be a JSON object"),
        ("1_Pooling/config.json", '{"pooling_mode_mean_tokens": true}', "word_embedding_dimension"),
        ("sentence_bert_config.json", "{}", "max_seq_length"),
        ("sentence_bert_config.json", '{"max_seq_length": "abc"}', "not a well-formed"),
        ("tokenizer.json", '{"x": ', "cannot read the tokenizer"),
    ],
)
def test_a_malformed_model_folder_is_a_config_error(tmp_path: Path, file: str, content: str, says: str) -> None:
    model = _model_copy(tmp_path)
    (model / file).write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError, match=says):
        OnnxEmbedder(str(model), cache_dir=tmp_path / "cache").warm_up()


def test_max_seq_length_is_capped_at_the_position_table(tmp_path: Path) -> None:
    from embedding.st_layout import read_layout

    model = _model_copy(tmp_path)
    (model / "sentence_bert_config.json").write_text('{"max_seq_length": 4096}', encoding="utf-8")
    assert read_layout(model).max_seq_length == 512  # config.json max_position_embeddings


def test_an_unusable_cache_dir_is_a_typed_error(tmp_path: Path) -> None:
    not_a_folder = tmp_path / "cache"
    not_a_folder.write_text("a file")
    with pytest.raises(EmbeddingError, match="cannot use the model cache .*QUARRY_EMBEDDING__CACHE_DIR"):
        OnnxEmbedder("all-MiniLM-L6-v2", cache_dir=not_a_folder).warm_up()


@pytest.mark.slow
def test_int8_on_all_and_fp32_on_every_fifth_scifact_document_match_torch(
    scifact_chunks: list[list[str]],
    minilm_vectors: CachedEmbedder,
    int8_vectors: CachedEmbedder,
    fp32_vectors: CachedEmbedder,
) -> None:
    """SciFact documents, each as the first chunk the service embeds for it, against torch.

    A first chunk has the word-pieces of ``title + " " + text`` cut at the model's 256 tokens,
    so these are the model inputs the service embeds. int8 is checked on all 5,183 (the int8 nDCG
    test below ingests these rows); fp32, whose claim is an exact export (cosine ≥ 0.9999), on
    every fifth document (1,037 rows, truncated and whole ones both present): a cold fp32 pass
    over all of them cost a CI run ~4 minutes and checked the same graph on more of the same
    inputs. Each model's rows are its own output, computed once per machine.
    """
    texts = [chunks[0] for chunks in scifact_chunks]
    assert len(texts) == 5183
    want = minilm_vectors.embed(texts)
    every_fifth = slice(None, None, 5)
    assert want.truncated[every_fifth].any() and not want.truncated[every_fifth].all()
    for name, vectors, rows, floor in (
        ("int8", int8_vectors, slice(None), 0.99), ("fp32", fp32_vectors, every_fifth, 0.9999)
    ):
        got = vectors.embed(texts[rows])
        cos = cosines(got.vectors, want.vectors[rows])
        print(f"{name}: {len(got.vectors)} rows, cosine vs torch min {cos.min():.5f} mean {cos.mean():.5f}")
        assert cos.min() >= floor, f"{name}: min cosine {cos.min():.5f} over SciFact"
        np.testing.assert_array_equal(got.truncated, want.truncated[rows])


@pytest.mark.slow
def test_int8_keeps_scifact_hybrid_ndcg_within_001_of_torch(
    int8_vectors: CachedEmbedder, shared_data: Path, tmp_path: Path
) -> None:
    """Documents and queries both embedded by int8; the torch figure is the committed baseline's.

    The first chunks' int8 rows are those the check against torch above computed.
    """
    quarry = Quarry(Settings(data_dir=tmp_path), embedder=int8_vectors)
    try:
        quarry.create_collection("scifact", language="auto")
        quarry.upsert("scifact", read_documents(shared_data / "scifact"))
        search = collection_search(quarry, "scifact")
        scifact = shared_data / "scifact"
        summary = evaluate(search, scifact, "test", ["hybrid"], tmp_path / "out", {}, show_progress=False)
    finally:
        quarry.close()
    got = summary.to_dict()["modes"]["hybrid"]["ndcg@10"]
    baseline = Path(__file__).resolve().parents[2] / "eval" / "baselines" / "scifact-test.json"
    torch = json.loads(baseline.read_text())["modes"]["hybrid"]["ndcg@10"]
    print(f"hybrid nDCG@10: int8 {got:.4f}, torch {torch:.4f}")
    assert abs(got - torch) < 0.01, f"int8 hybrid nDCG@10 {got:.4f} vs torch {torch:.4f}"


def test_the_factory_builds_it_with_the_settings_cache(tmp_path: Path) -> None:
    from embedding.factory import open_embedder
    from quarry.settings import EmbeddingSettings, Settings

    settings = Settings(data_dir=tmp_path, embedding=EmbeddingSettings(batch_size=8))
    embedder = open_embedder("onnx://all-MiniLM-L6-v2?quantize=none", settings)
    assert isinstance(embedder, OnnxEmbedder) and embedder.quantize == "none"
    assert embedder._cache_dir == tmp_path / "models" and embedder._batch_size == 8


class TestOnnxInt8Contract(EmbedderContract):
    """The default encoder (int8: a row moves a little with its batch, min cosine 0.989 on SciFact)."""

    MIN_BATCH_COSINE = 0.98

    @pytest.fixture()
    def embedder(self, int8: OnnxEmbedder) -> OnnxEmbedder:
        return int8

    @pytest.fixture()
    def reopen(self, onnx_cache: Path) -> Callable[[], OnnxEmbedder]:
        return lambda: OnnxEmbedder.from_url("onnx://all-MiniLM-L6-v2?quantize=int8", onnx_cache, batch_size=32)
