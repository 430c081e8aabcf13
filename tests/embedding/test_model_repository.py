"""``model_repository/``: the configs parse as Triton ModelConfig protos, and a standalone
``tritonserver`` (the binary PyTriton ships) loads the repository unchanged and serves it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from embedding.triton import TritonEmbedder
from embedding.triton_protocol import parse_spec
from embedding.triton_standalone import standalone_command
from indexing.collections import CollectionConfig, model_mismatch
from tests.embedding_cache import CachedEmbedder

from .server_process import ServerProcess, free_ports

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "model_repository" / "minilm"
GPU_CONFIG = MODEL / "config.pbtxt"
CPU_CONFIG = MODEL / "configs" / "cpu.pbtxt"


def load(path: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


@pytest.mark.parametrize(("path", "kind"), [(GPU_CONFIG, "KIND_GPU"), (CPU_CONFIG, "KIND_CPU")])
def test_config_is_a_valid_model_config_with_our_contract(path: Path, kind: str) -> None:
    config = load(path)
    assert (config.name, config.backend) == ("minilm", "python")
    [group] = config.instance_group
    assert model_config_pb2.ModelInstanceGroup.Kind.Name(group.kind) == kind and group.count == 1
    batching = config.dynamic_batching
    assert batching.max_queue_delay_microseconds == (1000 if kind == "KIND_GPU" else 0)
    assert list(batching.preferred_batch_size) and max(batching.preferred_batch_size) <= config.max_batch_size
    spec = parse_spec(json_format.MessageToDict(config, preserving_proto_field_name=True))
    assert (spec.input_name, spec.output_name, spec.truncated_name, spec.dim) == (
        "text", "embedding", "truncated", 384,
    )
    assert spec.parameters["model_id"] == "all-MiniLM-L6-v2" and spec.parameters["max_seq_length"] == "256"
    assert spec.parameters["precision"] == ("fp16" if kind == "KIND_GPU" else "fp32")


def test_model_py_defines_the_python_backend_entry_points() -> None:
    tree = ast.parse((MODEL / "1" / "model.py").read_text())
    [cls] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TritonPythonModel"]
    assert {"initialize", "execute", "finalize"} <= {f.name for f in cls.body if isinstance(f, ast.FunctionDef)}


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, int]]:
    """``tritonserver --model-repository model_repository --model-config-name cpu`` (CPU host)."""
    work = tmp_path_factory.mktemp("tritonserver")
    http, grpc, metrics = free_ports(3)
    cmd, env = standalone_command(work, http_port=http, grpc_port=grpc, metrics_port=metrics)
    process = ServerProcess(cmd, env, work / "tritonserver.log")
    try:
        process.wait_ready(f"http://127.0.0.1:{http}/v2/models/minilm/ready", timeout_s=300)
        yield process, grpc
    finally:
        process.stop()
        process.kill_all()


@pytest.mark.integration
def test_standalone_tritonserver_serves_the_repository_unchanged(
    standalone: tuple[ServerProcess, int], scifact_subset: list[str], minilm_vectors: CachedEmbedder
) -> None:
    process, grpc = standalone
    embedder = TritonEmbedder.from_url(f"triton+grpc://127.0.0.1:{grpc}/minilm", timeout_s=60, batch_size=32)
    embedder.warm_up()
    assert (embedder.model_id, embedder.dim, embedder.max_seq_length) == ("all-MiniLM-L6-v2", 384, 256)
    # the config's published fingerprint is torch://'s: a collection made in-process is served here (no 409)
    assert embedder.fingerprint == minilm_vectors.fingerprint
    torch_made = CollectionConfig(
        name="made_by_torch", embedding_model=minilm_vectors.model_id, embedding_fingerprint=minilm_vectors.fingerprint,
        dim=384, chunk_size=256, chunk_overlap=32,
    )
    assert model_mismatch(torch_made, embedder.model_id, embedder.fingerprint) is None
    texts = scifact_subset[:40]
    got, want = embedder.embed(texts), minilm_vectors.embed(texts)
    assert np.einsum("ij,ij->i", got.vectors, want.vectors).min() >= 0.999
    np.testing.assert_array_equal(got.truncated, want.truncated)
    embedder.close()
    assert process.stop() == 0, process.log_tail()
    assert process.leftovers() == [], process.log_tail()
