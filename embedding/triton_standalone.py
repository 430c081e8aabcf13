"""Run the stock ``tritonserver`` on ``model_repository/``, as the Triton container does.

The production layout (``docker-compose.yml``) is a stock Triton loading ``model_repository/``:
the model runs inside Triton's Python-backend stub. Here, without the container, the binary and
the stub come from the ``nvidia-pytriton`` wheel; this module lays them out in a work folder and
builds the command line, for the tests and for ``bench/embedding.py``.

This path has one hop fewer than ``quarry triton serve`` (PyTriton), whose stub forwards each
batch over ZMQ to the serving process: a no-op model answers in ~0.75 ms p50 here against
~3.1 ms behind PyTriton (1 client, gRPC, 2-core AVX2 host; ``bench/embedding.py`` measures both
with the real model).
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1] / "model_repository"


def standalone_command(
    work: Path,
    *,
    http_port: int,
    grpc_port: int,
    metrics_port: int,
    repository: Path = REPOSITORY,
    model: str = "minilm",
    config_name: str = "cpu",
    address: str = "127.0.0.1",
) -> tuple[list[str], dict[str, str]]:
    """Lay out PyTriton's ``tritonserver`` in ``work``; the command and environment to start it.

    Args:
        work: An empty folder for the binary, the Python backend and its stub (~100 MB).
        http_port: HTTP/REST (KServe v2) port.
        grpc_port: gRPC port.
        metrics_port: Prometheus metrics port.
        repository: The model repository (default ``model_repository/``).
        model: The model to load (``--model-control-mode explicit``).
        config_name: ``--model-config-name``: ``cpu`` loads ``configs/cpu.pbtxt`` (KIND_CPU,
            fp32); ``""`` the default ``config.pbtxt`` (KIND_GPU).
        address: Bind address of the three endpoints.

    Returns:
        ``(argv, env)``. The environment puts this interpreter's ``bin`` first on ``PATH`` (the
        stub runs the model with this virtual environment's packages) and its ``LIBDIR`` on
        ``LD_LIBRARY_PATH`` (the stub loads libpython). Stop the server with SIGTERM.

    Raises:
        ImportError: ``nvidia-pytriton`` is not installed.
    """
    from pytriton.utils.distribution import get_libs_path, get_root_module_path, get_stub_path

    dist = get_root_module_path() / "tritonserver"
    shutil.copytree(dist / "bin", work / "bin")
    shutil.copytree(dist / "backends", work / "backends")
    shutil.copy(get_stub_path(f"{sys.version_info[0]}.{sys.version_info[1]}"), work / "backends" / "python")
    libs = [str(get_libs_path()), sysconfig.get_config_var("LIBDIR"), os.environ.get("LD_LIBRARY_PATH", "")]
    env = {
        **os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
        "LD_LIBRARY_PATH": ":".join(p for p in libs if p),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    argv = [
        str(work / "bin" / "tritonserver"), "--model-repository", str(repository),
        "--model-control-mode", "explicit", "--load-model", model,
        "--backend-directory", str(work / "backends"),
        "--http-address", address, "--grpc-address", address, "--metrics-address", address,
        "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port),
        # shared-memory regions named after this process, so concurrent servers do not collide
        "--backend-config", f"python,shm-region-prefix-name=quarry{os.getpid()}x{grpc_port}",
    ]
    if config_name:
        argv += ["--model-config-name", config_name]
    return argv, env
