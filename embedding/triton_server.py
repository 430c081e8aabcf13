"""Host an embedding model in a real NVIDIA Triton Inference Server through PyTriton.

PyTriton (``nvidia-pytriton``) ships the ``tritonserver`` binary and its Python backend; the
model is one of Quarry's in-process embedders (ONNX int8 by default, or torch), bound as a
Triton model with dynamic batching. The Triton model contract is the same as the standalone
``model_repository/minilm`` one, so one client (:mod:`embedding.triton`) talks to both::

    input   text       TYPE_STRING [1]      one UTF-8 text per batch row
    output  embedding  TYPE_FP32   [dim]    L2-normalised
    output  truncated  TYPE_BOOL   [1]      the text was cut at max_seq_length tokens
    parameters: model_id, max_seq_length, fingerprint, languages (the model card's, comma-separated)

Endpoints (Triton's own): HTTP ``/v2/health/live``, ``/v2/health/ready``,
``/v2/models/<name>/config``, gRPC on its port, Prometheus metrics on ``/metrics``.
SIGTERM or SIGINT stops tritonserver and its Python-backend stubs, then the process exits 0.
A stub that tritonserver leaves behind (it gives up after its 10 s exit timeout while HTTP clients
stay connected) is killed. If tritonserver exits on its own, :func:`serve` raises, so that a
supervisor restarts it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import re
import signal
import socket
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import numpy.typing as npt

from embedding.base import Embedder
from quarry.errors import ConfigError, EmbeddingError
from quarry.settings import Settings

LOG = logging.getLogger(__name__)
# Set in this process's environment while serving; tritonserver and its stubs inherit it, so the
# processes a serve started can be found (and leftovers killed) after tritonserver stopped.
OWNER_ENV = "QUARRY_TRITON_SERVE_PID"
_MODEL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")

BACKENDS = {
    "onnx": "onnx://all-MiniLM-L6-v2?quantize=int8",
    "onnx-int8": "onnx://all-MiniLM-L6-v2?quantize=int8",
    "onnx-fp32": "onnx://all-MiniLM-L6-v2?quantize=none",
    "torch": "torch://all-MiniLM-L6-v2",
}


@dataclass(frozen=True)
class ServeConfig:
    """How to host the model.

    Attributes:
        model: An in-process embedder URL (``onnx://...``, ``torch://...``) or a shorthand of
            :data:`BACKENDS`. Default ``onnx-fp32``: the torch model's vectors (cosine 1.0) at
            ONNX Runtime speed. ``onnx`` (int8) is faster but its vectors differ (cosine >= 0.99,
            and slightly with batch composition, as activations are quantised per batch).
        model_name: Triton model name clients use in their URL (``triton+grpc://h:8001/<name>``).
        address: Bind address of the HTTP, gRPC and metrics endpoints.
        http_port: HTTP/REST (KServe v2) port.
        grpc_port: gRPC port.
        metrics_port: Prometheus metrics port.
        max_batch_size: Largest batch Triton's dynamic batcher forms (texts).
        max_queue_delay_us: Longest a request waits for others to batch with, in microseconds.
            Default 0: with one busy CPU instance the queue forms the batches by itself, and a
            delay only adds latency at low load (1000 us cost ~1 ms p50 at 1 client here).
        preferred_batch_sizes: Batch sizes the batcher aims for (empty: as large as possible).
        instances: Model instances (threads calling the embedder concurrently).
        shared_memory: Pass tensors between Triton's Python-backend stub and this process through
            PyTriton's shared-memory TensorStore (PyTriton's default) instead of inline in the
            ZMQ message. Default False: TensorStore allocates each block through a
            ``multiprocessing`` manager round trip, which for Quarry's small tensors (a few texts
            in, ``(n, 384)`` float32 out) costs more than copying them: inline, a no-op model's
            round trip fell ~1 ms and MiniLM's 1-client p50 1.5-2 ms on a 2-core CPU (README,
            Benchmarks), and no ``/dev/shm`` space is needed (Docker's default is 64 MB).
            Worth it for tensors of MBs.
    """

    model: str = "onnx-fp32"
    model_name: str = "minilm"
    address: str = "0.0.0.0"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    max_batch_size: int = 64
    max_queue_delay_us: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()
    instances: int = 1
    shared_memory: bool = False

    def __post_init__(self) -> None:
        """Reject what tritonserver or PyTriton would only fail on after loading the model.

        Raises:
            ConfigError: A port outside 1-65535 or used twice, an IPv6 address (PyTriton's own
                client cannot reach one), a model name that is not a folder name, a batch size,
                queue delay or instance count below its minimum, or a preferred batch size
                above ``max_batch_size``.
        """
        ports = {"http_port": self.http_port, "grpc_port": self.grpc_port, "metrics_port": self.metrics_port}
        for name, port in ports.items():
            if not 1 <= port <= 65535:
                raise ConfigError(f"{name} must be in 1-65535, got {port}")
        if len(set(ports.values())) < len(ports):
            raise ConfigError(f"the HTTP, gRPC and metrics ports must differ, got {ports}")
        if _is_ipv6(self.address):
            raise ConfigError(f"address must be IPv4 or a host name (PyTriton cannot use IPv6), got {self.address!r}")
        if not _MODEL_NAME.fullmatch(self.model_name):
            raise ConfigError(f"model_name must be letters, digits, '_', '.' or '-', got {self.model_name!r}")
        if self.max_batch_size < 1 or self.max_queue_delay_us < 0 or self.instances < 1:
            raise ConfigError("max_batch_size and instances must be >= 1 and max_queue_delay_us >= 0")
        wrong = [b for b in self.preferred_batch_sizes if not 1 <= b <= self.max_batch_size]
        if wrong:
            raise ConfigError(f"preferred batch sizes must be in 1-{self.max_batch_size} (max_batch_size), got {wrong}")


def _is_ipv6(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).version == 6
    except ValueError:  # a host name, or not an address at all (check_ports_free resolves it)
        return False


def check_ports_free(config: ServeConfig) -> None:
    """Bind each port once, so that a taken port fails now with its number, not in PyTriton later.

    Raises:
        ConfigError: The address does not resolve to an IPv4 address of this host, or a port is
            in use (by another Triton too: its gRPC port is bound with ``SO_REUSEPORT``).
    """
    try:
        host = socket.getaddrinfo(config.address, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except (OSError, UnicodeError) as exc:
        raise ConfigError(f"address {config.address!r} does not resolve to an IPv4 address: {exc}") from exc
    for name, port in (("HTTP", config.http_port), ("gRPC", config.grpc_port), ("metrics", config.metrics_port)):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is not "in use"
            try:
                probe.bind((host, port))
            except OSError as exc:
                raise ConfigError(f"cannot use {name} port {port} on {config.address}: {exc.strerror}") from exc


def backend_url(model: str) -> str:
    """Resolve a ``--model`` value to an in-process embedder URL.

    Raises:
        ConfigError: A Triton URL (a server cannot wrap a client of itself) or an unknown shorthand.
    """
    url = BACKENDS.get(model.lower(), model)
    scheme = urlsplit(url).scheme.lower()
    if scheme not in ("onnx", "torch"):
        raise ConfigError(
            f"--model must be an in-process embedder (onnx://..., torch://...) or one of "
            f"{', '.join(BACKENDS)}; got {model!r}"
        )
    return url


def make_infer(embedder: Embedder) -> Callable[..., dict[str, npt.NDArray[Any]]]:
    """The PyTriton inference callable: a batch of ``(n, 1)`` byte strings -> embeddings."""
    from pytriton.decorators import batch

    @batch  # type: ignore[untyped-decorator]
    def infer(text: npt.NDArray[np.object_]) -> dict[str, npt.NDArray[Any]]:
        texts = [row[0].decode("utf-8", errors="replace") for row in text]
        result = embedder.embed(texts)
        return {"embedding": result.vectors, "truncated": result.truncated.reshape(-1, 1)}

    return infer  # type: ignore[no-any-return]


def use_interpreter_libpython() -> None:
    """Put this interpreter's ``LIBDIR`` first on ``LD_LIBRARY_PATH`` for the backend stub.

    The Python-backend stub links ``libpython3.X.so``; the system copy of another patch release
    fails with ``_thread.RLock ... _recursion_count``. tritonserver and the stubs inherit this.
    """
    libdir = sysconfig.get_config_var("LIBDIR")
    if not libdir:
        return
    current = os.environ.get("LD_LIBRARY_PATH", "")
    if libdir not in current.split(":"):
        os.environ["LD_LIBRARY_PATH"] = f"{libdir}:{current}" if current else libdir


@dataclass
class StopRequest:
    """Whether a stop signal arrived (a tritonserver that exits without one has failed)."""

    signal_name: str | None = None


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[StopRequest]:
    """Turn the first SIGTERM (or SIGINT) into ``KeyboardInterrupt``; ignore repeats while stopping.

    PyTriton's ``serve()`` stops tritonserver (and waits for it) on ``KeyboardInterrupt``.
    Yields the :class:`StopRequest` the handler fills in.
    """
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    request = StopRequest()

    def handler(signum: int, frame: FrameType | None) -> None:
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        request.signal_name = signal.Signals(signum).name
        LOG.info("signal %s received: stopping Triton", request.signal_name)
        raise KeyboardInterrupt

    for sig in previous:
        signal.signal(sig, handler)
    try:
        yield request
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def serve(config: ServeConfig, settings: Settings) -> None:
    """Start Triton with the embedding model and block until SIGTERM/SIGINT, then stop it.

    Raises:
        ConfigError: Bad ``--model``, an address that does not resolve, or a port in use.
        EmbeddingError: The wrapped model failed to load, or tritonserver exited without a stop
            signal (its log, above, says why).
    """
    from embedding.factory import open_embedder

    url = backend_url(config.model)
    check_ports_free(config)
    embedder = open_embedder(url, settings)
    embedder.warm_up()
    use_interpreter_libpython()
    owner = str(os.getpid())
    os.environ[OWNER_ENV] = owner
    with stop_on_sigterm() as stop, contextlib.suppress(KeyboardInterrupt):
        try:
            _run(config, embedder)
        finally:
            os.environ.pop(OWNER_ENV, None)
            killed = kill_leftovers(owner)
            if killed:
                LOG.warning("killed %d process(es) tritonserver left behind: %s", len(killed), killed)
    if stop.signal_name is None:
        raise EmbeddingError("tritonserver exited without a stop signal; its log above says why")
    LOG.info("Triton stopped")


def kill_leftovers(owner: str) -> list[int]:
    """SIGKILL the processes started for the serve ``owner`` (their ``OWNER_ENV``) that still run.

    After a forced exit (exit timeout) tritonserver does not stop its Python-backend stubs, which
    would keep running, holding the model; PyTriton's ``/dev/shm/pytrtion<owner>-*`` regions are
    removed too (call this once tritonserver has stopped).

    Returns:
        The killed pids.
    """
    killed = []
    marker = f"{OWNER_ENV}={owner}".encode()
    for proc in Path("/proc").glob("[0-9]*"):
        if proc.name == str(os.getpid()):
            continue
        try:
            if marker not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, ValueError):  # gone meanwhile, or another user's process
            continue
        killed.append(int(proc.name))
    for region in Path("/dev/shm").glob(f"pytrtion{owner}-*"):
        with contextlib.suppress(OSError):
            region.unlink()
    return killed


def select_tensor_transport(shared_memory: bool) -> None:
    """Choose how PyTriton passes tensors between the backend stub and this process.

    PyTriton 0.7 reads ``PYTRITON_NO_TENSORSTORE`` (any non-empty value: tensors travel inline,
    base64 in the ZMQ message) when a model is bound, and the stubs inherit it through
    tritonserver's environment; so this runs before ``Triton()`` starts.
    """
    os.environ["PYTRITON_NO_TENSORSTORE"] = "" if shared_memory else "1"


def _run(config: ServeConfig, embedder: Embedder) -> None:
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    if embedder.card.query_prefix or embedder.card.passage_prefix:
        # the server embeds every text alike; the client would have to prefix queries and documents
        raise ConfigError(
            f"quarry triton serve serves models without query/passage prefixes; {embedder.model_id} has "
            f"{embedder.card.query_prefix!r} / {embedder.card.passage_prefix!r}"
        )

    select_tensor_transport(config.shared_memory)
    triton_config = TritonConfig(
        http_address=config.address, http_port=config.http_port,
        grpc_address=config.address, grpc_port=config.grpc_port,
        metrics_address=config.address, metrics_port=config.metrics_port,
        allow_metrics=True, allow_cpu_metrics=True, allow_gpu_metrics=False,
        strict_readiness=True, exit_timeout_secs=10,
    )
    batcher = DynamicBatcher(
        max_queue_delay_microseconds=config.max_queue_delay_us,
        preferred_batch_size=list(config.preferred_batch_sizes) or None,
    )
    triton = Triton(config=triton_config)
    try:  # not `with Triton()`: entering it loads bound models before their parameters are set
        triton.bind(
            model_name=config.model_name,
            infer_func=[make_infer(embedder) for _ in range(config.instances)],
            inputs=[Tensor(name="text", dtype=bytes, shape=(1,))],
            outputs=[
                Tensor(name="embedding", dtype=np.float32, shape=(embedder.dim,)),
                Tensor(name="truncated", dtype=np.bool_, shape=(1,)),
            ],
            config=ModelConfig(max_batch_size=config.max_batch_size, batcher=batcher),
            strict=True,
        )
        _publish_parameters(triton, {
            "model_id": embedder.model_id, "max_seq_length": str(embedder.max_seq_length),
            "fingerprint": embedder.fingerprint, "languages": ",".join(sorted(embedder.card.languages)),
        })
        LOG.info(
            "starting Triton for %s as model %r: http %s:%d, grpc %s:%d, metrics %s:%d/metrics",
            embedder.model_id, config.model_name, config.address, config.http_port,
            config.address, config.grpc_port, config.address, config.metrics_port,
        )
        triton.serve()  # returns after KeyboardInterrupt (our SIGTERM) once tritonserver stopped
    finally:
        triton.stop()


def _publish_parameters(triton: Any, parameters: dict[str, str]) -> None:
    """Add ``parameters`` to the generated ``config.pbtxt`` of the bound model.

    PyTriton 0.7 has no public field for model-config parameters; its model objects keep a
    ``TritonModelConfig`` whose ``backend_parameters`` become ``parameters`` in the config.
    Without them a client reports the Triton model name as ``model_id`` (see the log line).
    """
    try:
        for model in triton._model_manager.models:
            model._get_triton_model_config().backend_parameters.update(parameters)
    except AttributeError as exc:  # a PyTriton release that moved these internals
        LOG.warning("cannot publish %s in the model config (PyTriton internals changed: %s)", parameters, exc)
