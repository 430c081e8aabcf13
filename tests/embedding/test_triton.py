"""Triton embedding end to end: a real Triton server (PyTriton) in a subprocess, real clients.

The ``triton`` fixture runs ``python -m quarry.triton_cli serve`` on free ports (the ONNX fp32
backend, exported into the session's model cache), waits for the model to be ready, and the last
test stops it with SIGTERM and checks that no tritonserver / stub process is left.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from embedding.base import Embedder
from embedding.triton import TritonEmbedder, parse_triton_url
from embedding.triton_server import OWNER_ENV, ServeConfig, check_ports_free, kill_leftovers
from indexing.document_rules import SourceDocument
from indexing.sources import iter_jsonl
from quarry.errors import ConfigError, EmbeddingUnavailable
from quarry.service import Quarry
from quarry.settings import Settings
from tests.embedding_cache import CachedEmbedder

from .contract import EmbedderContract
from .server_process import ServerProcess, environ, free_ports, tagged_pids

REPO = Path(__file__).resolve().parents[2]
MAX_BATCH = 16


@dataclass
class TritonServer:
    process: ServerProcess
    http: int
    grpc: int
    metrics: int

    def url(self, wire: str) -> str:
        return f"triton+{wire}://127.0.0.1:{self.grpc if wire == 'grpc' else self.http}/minilm"


def start_triton(workdir: Path, onnx_cache: Path, *options: str) -> TritonServer:
    """``quarry triton serve`` (ONNX fp32) on free ports with ``options``, once its model is ready."""
    http, grpc, metrics = free_ports(3)
    env = {
        **os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
        "QUARRY_DATA_DIR": str(workdir), "QUARRY_EMBEDDING__CACHE_DIR": str(onnx_cache),
    }
    cmd = [
        sys.executable, "-m", "quarry.triton_cli", "serve", "--model", "onnx-fp32", "--address", "127.0.0.1",
        "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics), *options,
    ]
    process = ServerProcess(cmd, env, workdir / "triton.log")
    try:
        process.wait_ready(f"http://127.0.0.1:{http}/v2/models/minilm/ready", timeout_s=300)
    except BaseException:
        process.stop()
        process.kill_all()
        raise
    return TritonServer(process, http, grpc, metrics)


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory, onnx_cache: Path) -> Iterator[TritonServer]:
    server = start_triton(
        tmp_path_factory.mktemp("triton"), onnx_cache,
        "--max-batch-size", str(MAX_BATCH), "--max-queue-delay-us", "2000",
    )
    try:
        yield server
    finally:
        server.process.stop()
        server.process.kill_all()


def stub_environments(server: TritonServer) -> list[dict[str, str]]:
    """Environments of the server's Python-backend stubs (the processes that talk to PyTriton)."""
    stubs = []
    for pid in tagged_pids(server.process.tag):
        try:
            is_stub = b"triton_python_backend_stub" in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if is_stub and (env := environ(pid)) is not None:
            stubs.append(env)
    return stubs


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - local test server
        return response.read().decode()


def metric(text: str, name: str) -> float:
    return sum(float(m) for m in re.findall(rf"^{name}{{[^}}]*model=\"minilm\"[^}}]*}} (\S+)$", text, re.M))


@pytest.mark.integration
def test_health_endpoints_metrics_and_batching_config(triton: TritonServer) -> None:
    base = f"http://127.0.0.1:{triton.http}"
    assert get(f"{base}/v2/health/live") == "" and get(f"{base}/v2/health/ready") == ""
    config = get(f"{base}/v2/models/minilm/config")
    assert '"max_batch_size":16' in config and '"max_queue_delay_microseconds":2000' in config
    assert '"model_id":{"string_value":"all-MiniLM-L6-v2"}' in config
    assert '"fingerprint":{"string_value":"sha256:' in config
    assert "nv_inference_request_success" in get(f"http://127.0.0.1:{triton.metrics}/metrics")


@pytest.mark.integration
@pytest.mark.parametrize("wire", ["grpc", "http"])
def test_same_vectors_as_the_in_process_model(
    triton: TritonServer, wire: str, scifact_subset: list[str], minilm_vectors: CachedEmbedder
) -> None:
    embedder = TritonEmbedder.from_url(triton.url(wire), timeout_s=30, batch_size=64)
    embedder.warm_up()
    assert isinstance(embedder, Embedder)
    assert (embedder.model_id, embedder.dim, embedder.max_seq_length) == ("all-MiniLM-L6-v2", 384, 256)
    minilm_vectors.warm_up()  # the server publishes the model folder's fingerprint: the same model as torch://
    assert embedder.fingerprint == minilm_vectors.fingerprint and embedder.fingerprint.startswith("sha256:")
    texts = [*scifact_subset, "", "a short query about cells"]
    got, want = embedder.embed(texts), minilm_vectors.embed(texts)
    assert got.vectors.shape == (len(texts), 384) and got.vectors.dtype == np.float32
    cos = np.einsum("ij,ij->i", got.vectors, want.vectors)
    assert cos.min() >= 0.999, f"min cosine {cos.min():.5f}"
    np.testing.assert_array_equal(got.truncated, want.truncated)
    assert got.truncated.any() and embedder.embed([]).vectors.shape == (0, 384)
    embedder.close()


COUNTERS = ("nv_inference_request_success", "nv_inference_count", "nv_inference_exec_count")


def settled_counts(url: str, at_least: float = 0.0, timeout_s: float = 10.0) -> tuple[float, float, float]:
    """``(requests, inferences, executions)``: Triton's ``nv_inference_request_success``,
    ``nv_inference_count`` (texts) and ``nv_inference_exec_count`` (model runs, batches) once the
    inference count is ``>= at_least`` and two reads 0.3 s apart agree: Triton records a request's
    statistics just after its response, so a read right after a call can still miss its last batch."""
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        text = get(url)
        requests, inferences, executions = (metric(text, name) for name in COUNTERS)
        now = requests, inferences, executions
        if (now == last and inferences >= at_least) or time.monotonic() > deadline:
            return now
        last = now
        time.sleep(0.3)


@pytest.mark.integration
@pytest.mark.parametrize("wire", ["grpc", "http"])
def test_many_threads_share_one_embedder_and_get_batched(
    triton: TritonServer, wire: str, scifact_subset: list[str]
) -> None:
    embedder = TritonEmbedder.from_url(triton.url(wire), timeout_s=30)
    metrics = f"http://127.0.0.1:{triton.metrics}/metrics"
    texts = [t[:200] for t in scifact_subset[:48]]
    _, start, _ = settled_counts(metrics)
    expected = embedder.embed(texts).vectors  # client-side batches of MAX_BATCH
    before = settled_counts(metrics, at_least=start + len(texts))
    with ThreadPoolExecutor(8) as pool:  # one text per request, 8 at a time: Triton batches them
        rows = list(pool.map(lambda t: embedder.embed([t]).vectors[0], texts))
    np.testing.assert_allclose(np.vstack(rows), expected, atol=1e-5)
    after = settled_counts(metrics, at_least=before[1] + len(texts))
    requests, inferences, executions = (a - b for a, b in zip(after, before, strict=True))
    assert requests == inferences == len(texts), (requests, inferences)
    assert executions < requests, (requests, executions)
    embedder.close()


@pytest.fixture(scope="module")
def shm_triton(tmp_path_factory: pytest.TempPathFactory, onnx_cache: Path) -> Iterator[TritonServer]:
    """A second server, with ``--shared-memory`` and batches of <= 8; the busy-client SIGTERM test stops it."""
    server = start_triton(tmp_path_factory.mktemp("triton-shm"), onnx_cache, "--shared-memory", "--max-batch-size", "8")
    try:
        yield server
    finally:
        server.process.stop()
        server.process.kill_all()


@pytest.mark.integration
def test_tensors_travel_inline_unless_shared_memory_is_asked_for(
    triton: TritonServer, shm_triton: TritonServer, scifact_subset: list[str], minilm_vectors: CachedEmbedder,
) -> None:
    """By default PyTriton's stubs get ``PYTRITON_NO_TENSORSTORE=1``; ``--shared-memory`` serves
    the same vectors through PyTriton's TensorStore."""
    default = stub_environments(triton)
    assert default and all(env.get("PYTRITON_NO_TENSORSTORE") == "1" for env in default), default
    stubs = stub_environments(shm_triton)
    assert stubs and not any(env.get("PYTRITON_NO_TENSORSTORE") for env in stubs)
    embedder = TritonEmbedder.from_url(shm_triton.url("grpc"), timeout_s=30)
    texts = scifact_subset[:16]
    cos = np.einsum("ij,ij->i", embedder.embed(texts).vectors, minilm_vectors.embed(texts).vectors)
    assert cos.min() >= 0.999, f"min cosine {cos.min():.5f}"
    embedder.close()


@pytest.mark.integration
def test_sigterm_while_an_http_client_is_busy_leaves_nothing_running(
    shm_triton: TritonServer, scifact_subset: list[str]
) -> None:
    """tritonserver waits out its exit timeout for connected HTTP clients, then exits without
    stopping its backend stub; the serve kills what is left and removes its /dev/shm regions
    (the TensorStore's too: this is the ``--shared-memory`` server, stopped here)."""
    server = shm_triton
    embedder = TritonEmbedder.from_url(server.url("http") + "?retries=1", timeout_s=60)
    texts = scifact_subset * 20
    with ThreadPoolExecutor(1) as pool:
        busy = pool.submit(lambda: [embedder.embed(texts) for _ in range(3)])
        time.sleep(3)
        assert list(Path("/dev/shm").glob(f"pytrtion{server.process.proc.pid}-*")), "no TensorStore regions"
        assert server.process.stop(timeout_s=90) == 0, server.process.log_tail()
        with pytest.raises(EmbeddingUnavailable):
            busy.result(timeout=120)
    embedder.close()
    assert server.process.leftovers() == [], server.process.log_tail()
    assert not list(Path("/dev/shm").glob(f"pytrtion{server.process.proc.pid}-*"))


@pytest.mark.integration
def test_tritonserver_dying_fails_the_serve(tmp_path: Path, onnx_cache: Path) -> None:
    """A supervisor restarts on a non-zero exit: tritonserver gone without a stop signal is one."""
    server = start_triton(tmp_path, onnx_cache)
    try:
        (tritonserver,) = [
            pid for pid in tagged_pids(server.process.tag)
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"/tritonserver")
        ]
        os.kill(tritonserver, signal.SIGKILL)
        assert server.process.proc.wait(timeout=90) == 2, server.process.log_tail()
        assert "tritonserver exited without a stop signal" in server.process.log_tail()
        assert server.process.leftovers() == [], server.process.log_tail()
    finally:
        server.process.stop()
        server.process.kill_all()


@pytest.mark.integration
def test_client_batches_never_exceed_the_server_max(triton: TritonServer, scifact_subset: list[str]) -> None:
    embedder = TritonEmbedder.from_url(triton.url("grpc"), timeout_s=30, batch_size=1000)
    metrics = f"http://127.0.0.1:{triton.metrics}/metrics"
    texts = [t[:100] for t in scifact_subset[: 3 * MAX_BATCH + 1]]
    before = settled_counts(metrics)
    result = embedder.embed(texts)
    after = settled_counts(metrics, at_least=before[1] + len(texts))
    assert result.vectors.shape == (3 * MAX_BATCH + 1, 384)
    requests, inferences, executions = (a - b for a, b in zip(after, before, strict=True))
    # 49 texts asked for at once leave as 4 requests of <= 16 (16, 16, 16, 1), the fewest that
    # fit; Triton runs each alone (no two of them fit in one batch of 16)
    assert (requests, inferences, executions) == (4, 3 * MAX_BATCH + 1, 4)
    embedder.close()


@pytest.mark.parametrize("wire", ["grpc", "http"])
def test_down_server_is_a_quick_typed_error(wire: str) -> None:
    (port,) = free_ports(1)
    embedder = TritonEmbedder.from_url(f"triton+{wire}://127.0.0.1:{port}/minilm?retries=3", timeout_s=2)
    start = time.monotonic()
    with pytest.raises(EmbeddingUnavailable, match=rf"triton\+{wire}://127.0.0.1:{port}/minilm") as info:
        embedder.warm_up()
    assert time.monotonic() - start < 3 and info.value.retryable
    with pytest.raises(EmbeddingUnavailable):
        embedder.embed(["hello"])


def test_url_forms() -> None:
    target = parse_triton_url("triton+grpc://triton:8001/minilm/2?model_id=all-MiniLM-L6-v2&retries=5")
    assert (target.wire, target.address, target.model, target.version) == ("grpc", "triton:8001", "minilm", "2")
    assert (target.model_id, target.attempts) == ("all-MiniLM-L6-v2", 5)
    assert parse_triton_url("triton+http://localhost:8000/m").url == "triton+http://localhost:8000/m"
    for bad in ("triton+grpc://host/minilm", "triton+grpc://host:8001/", "triton://host:8001/m",
                "triton+http://host:8000/m?retries=0", "triton+http://host:8000/m?foo=1"):
        with pytest.raises(ConfigError):
            parse_triton_url(bad)


def test_malformed_urls_are_config_errors() -> None:
    """What urlsplit raises (bad or out-of-range port, broken IPv6) or lets through (credentials,
    port 0, a version that is not a number, a superscript digit) is a ConfigError."""
    for bad, says in [
        ("triton+grpc://127.0.0.1:abc/minilm", "expected triton"), ("triton+grpc://h:99999/m", "out of range"),
        ("triton+grpc://h:-1/m", "expected triton"), ("triton+grpc://[::1/minilm", "IPv6"),
        ("triton+grpc://h:0/m", "expected triton"), ("triton+http://admin:s3cret@h:8000/m", "credentials"),
        ("triton+grpc://h:8001/m/abc", "version"), ("triton+grpc://h:8001/m/0", "version"),
        ("triton+grpc://h:8001/m?retries=%C2%B2", "retries"), ("triton+grpc://127.0.0.1:8001/", "expected triton"),
    ]:
        with pytest.raises(ConfigError, match=says) as info:
            parse_triton_url(bad)
        assert "s3cret" not in info.value.message
    assert parse_triton_url("triton+grpc://[::1]:8001/m").address == "[::1]:8001"


def test_a_model_unloaded_after_the_start_is_unavailable_not_a_failure() -> None:
    """While Triton shuts down, gRPC answers NOT_FOUND ("has no available versions"): retried,
    then EmbeddingUnavailable (503), as when the server is gone."""
    import grpc
    from tritonclient.utils import InferenceServerException

    embedder = TritonEmbedder.from_url("triton+grpc://127.0.0.1:1/minilm")
    gone = InferenceServerException("Request for unknown model: 'minilm' has no available versions",
                                    status=str(grpc.StatusCode.NOT_FOUND))
    assert embedder._transient(gone)
    assert not embedder._transient(InferenceServerException("bad input", status=str(grpc.StatusCode.INVALID_ARGUMENT)))


def test_serve_options_are_checked_before_the_model_loads() -> None:
    for options, says in [
        ({"http_port": 70000}, "http_port must be in 1-65535"), ({"grpc_port": 0}, "grpc_port"),
        ({"http_port": 9000, "metrics_port": 9000}, "must differ"), ({"address": "::1"}, "IPv6"),
        ({"model_name": "a/b"}, "model_name"), ({"model_name": ""}, "model_name"),
        ({"max_batch_size": 4, "preferred_batch_sizes": (2, 100)}, r"preferred batch sizes must be in 1-4.*\[100\]"),
        ({"max_queue_delay_us": -1}, "max_queue_delay_us"),
    ]:
        with pytest.raises(ConfigError, match=says):
            ServeConfig(**options)  # type: ignore[arg-type]
    ServeConfig(model_name="minilm-v2.1", preferred_batch_sizes=(8, 64))


def test_a_taken_port_or_an_unknown_address_fails_with_its_name() -> None:
    http, grpc, metrics = free_ports(3)
    config = ServeConfig(address="127.0.0.1", http_port=http, grpc_port=grpc, metrics_port=metrics)
    check_ports_free(config)
    with socket.create_server(("127.0.0.1", grpc)):
        with pytest.raises(ConfigError, match=f"cannot use gRPC port {grpc} on 127.0.0.1"):
            check_ports_free(config)
    with pytest.raises(ConfigError, match="does not resolve"):
        check_ports_free(ServeConfig(address="999.1.1.1", http_port=http, grpc_port=grpc, metrics_port=metrics))


def test_leftover_processes_and_shared_memory_of_a_serve_are_killed(tmp_path: Path) -> None:
    """What a forced tritonserver exit leaves (stubs, /dev/shm regions) is found by the owner tag."""
    owner = f"9{os.getpid()}"  # no live serve has this pid as its tag
    env = {**os.environ, OWNER_ENV: owner}
    left = subprocess.Popen(["sleep", "60"], env=env)
    other = subprocess.Popen(["sleep", "60"], env={**os.environ, OWNER_ENV: owner + "0"})
    region = Path(f"/dev/shm/pytrtion{owner}-0a1b2c3d")
    region.write_bytes(b"x")
    try:
        assert kill_leftovers(owner) == [left.pid]
        assert left.wait(timeout=10) == -signal.SIGKILL and not region.exists()
        assert other.poll() is None
    finally:
        for proc in (left, other):
            proc.kill()
            proc.wait()
        region.unlink(missing_ok=True)


def test_the_factory_builds_it_from_settings(tmp_path: Path) -> None:
    from embedding.factory import open_embedder
    from quarry.settings import EmbeddingSettings

    settings = Settings(data_dir=tmp_path, embedding=EmbeddingSettings(timeout_s=7, batch_size=5))
    for wire in ("grpc", "http"):
        embedder = open_embedder(f"triton+{wire}://localhost:8001/minilm", settings)
        assert isinstance(embedder, TritonEmbedder) and embedder.target.wire == wire
        assert (embedder._protocol.timeout_s, embedder._batch_size) == (7, 5)
    with pytest.raises(ValidationError, match="timeout_s"):  # gRPC fails every call past its deadline range
        EmbeddingSettings(timeout_s=float("inf"))


# --- through the ingestion pipeline and the query path --------------------------------------
QUERIES = ["0-dimensional biomaterials show inductive properties", "vitamin D deficiency and cancer risk",
           "microstructural development of white matter in newborns", "DNA methylation in tumours"]


@pytest.fixture(scope="module")
def scifact_docs(shared_data: Path) -> list[SourceDocument]:
    docs = iter_jsonl(shared_data / "scifact" / "corpus.jsonl")
    return [d for _, d in zip(range(120), docs, strict=False)]


def dense_hits(quarry: Quarry, collection: str) -> list[list[str]]:
    return [[h.document_id for h in quarry.search(collection, q, top_k=10, mode="dense").hits] for q in QUERIES]


@pytest.fixture(scope="module")
def reference_hits(
    tmp_path_factory: pytest.TempPathFactory,
    minilm_vectors: CachedEmbedder,
    scifact_docs: list[SourceDocument],
) -> list[list[str]]:
    quarry = Quarry(Settings(data_dir=tmp_path_factory.mktemp("torch-data")), embedder=minilm_vectors)
    try:
        quarry.create_collection("scifact")
        quarry.upsert("scifact", scifact_docs)
        return dense_hits(quarry, "scifact")
    finally:
        quarry.close()


@pytest.mark.integration
@pytest.mark.parametrize("wire", ["grpc", "http"])
def test_ingest_through_triton_gives_the_in_process_hits(
    triton: TritonServer,
    wire: str,
    tmp_path: Path,
    scifact_docs: list[SourceDocument],
    reference_hits: list[list[str]],
) -> None:
    embedder = TritonEmbedder.from_url(triton.url(wire), timeout_s=30)
    quarry = Quarry(Settings(data_dir=tmp_path), embedder=embedder)
    try:
        quarry.create_collection("scifact")
        report = quarry.upsert("scifact", scifact_docs)
        assert report.documents == len(scifact_docs) and report.embedded > 0
        assert dense_hits(quarry, "scifact") == reference_hits
    finally:
        quarry.close()


@pytest.mark.integration
class TestTritonContract(EmbedderContract):
    """``quarry triton serve`` (ONNX fp32) through the gRPC client: the packaged MiniLM, no prefixes."""

    MIN_BATCH_COSINE = 0.9999

    @pytest.fixture()
    def embedder(self, triton: TritonServer) -> Iterator[TritonEmbedder]:
        model = TritonEmbedder.from_url(triton.url("grpc"), timeout_s=30, batch_size=64)
        model.warm_up()
        yield model
        model.close()

    @pytest.fixture()
    def reopen(self, triton: TritonServer) -> Callable[[], TritonEmbedder]:
        return lambda: TritonEmbedder.from_url(triton.url("grpc"), timeout_s=30, batch_size=64)


@pytest.mark.integration
def test_sigterm_stops_everything_and_then_ingestion_fails_typed(
    triton: TritonServer, tmp_path: Path, scifact_docs: list[SourceDocument]
) -> None:
    """Runs last in this module: it stops the module's server."""
    embedder = TritonEmbedder.from_url(triton.url("grpc") + "?retries=2", timeout_s=5)
    quarry = Quarry(Settings(data_dir=tmp_path), embedder=embedder)
    try:
        quarry.create_collection("scifact")
        quarry.upsert("scifact", scifact_docs[:5])
        before = quarry.describe("scifact")
        assert triton.process.leftovers(grace_s=0), "the tagged server processes should be visible"

        assert triton.process.stop() == 0, triton.process.log_tail()
        assert triton.process.leftovers() == [], f"left running after SIGTERM:\n{triton.process.log_tail()}"
        assert "Triton stopped" in triton.process.log_tail()

        with pytest.raises(EmbeddingUnavailable):
            quarry.upsert("scifact", scifact_docs[5:10])
        after = quarry.describe("scifact")
        assert {k: after[k] for k in ("documents", "chunks", "vectors")} == {
            k: before[k] for k in ("documents", "chunks", "vectors")
        }
        degraded = quarry.search("scifact", QUERIES[2], top_k=3, mode="hybrid")
        assert degraded.hits and degraded.degraded
        with pytest.raises(EmbeddingUnavailable):
            quarry.search("scifact", QUERIES[2], top_k=3, mode="dense")
    finally:
        quarry.close()


