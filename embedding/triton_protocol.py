"""The two wire protocols of a Triton client, behind one small interface.

``tritonclient.grpc`` and ``tritonclient.http`` differ in where timeouts go (per call vs. per
client), in the shape of ``get_model_config`` (protobuf JSON vs. REST JSON) and in the errors a
dead server raises (``InferenceServerException`` with ``StatusCode.UNAVAILABLE`` vs.
``ConnectionRefusedError`` / gevent errors). :class:`Protocol` hides that.

Neither client object is thread-safe (tritonclient documents "none of the methods are thread
safe"; the HTTP one is bound to the gevent hub of the thread that made it), so callers keep one
client per thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from quarry.errors import missing_extra

Wire = Literal["grpc", "http"]


@dataclass(frozen=True)
class ModelSpec:
    """What a client needs to know about the served model (from its config).

    Attributes:
        input_name: The ``TYPE_STRING`` input (one text per batch row).
        output_name: The ``TYPE_FP32`` output, ``(batch, dim)``.
        truncated_name: The ``TYPE_BOOL`` output, ``(batch, 1)``; ``None`` if the model has none.
        dim: Embedding dimension.
        max_batch_size: Largest batch the server accepts.
        parameters: The config's string parameters (``model_id``, ``max_seq_length``).
    """

    input_name: str
    output_name: str
    truncated_name: str | None
    dim: int
    max_batch_size: int
    parameters: dict[str, str]


class Protocol:
    """gRPC or HTTP access to one Triton server.

    Args:
        wire: ``"grpc"`` or ``"http"``.
        address: ``host:port``.
        timeout_s: Connection and per-request timeout, in seconds.

    Raises:
        ConfigError: tritonclient is not installed (``pip install 'quarry[triton]'``).
    """

    def __init__(self, wire: Wire, address: str, timeout_s: float) -> None:
        self.wire = wire
        self.address = address
        self.timeout_s = timeout_s
        try:
            if wire == "grpc":
                import tritonclient.grpc as module
            else:
                import tritonclient.http as module
        except ImportError as exc:
            raise missing_extra(exc.name or "tritonclient", "triton") from exc
        self._module: Any = module
        self.transient_errors, self.transient_statuses = _transient(wire)

    def client(self) -> Any:
        """A new client (use it from one thread only)."""
        if self.wire == "grpc":
            return self._module.InferenceServerClient(self.address)
        return self._module.InferenceServerClient(
            self.address, connection_timeout=self.timeout_s, network_timeout=self.timeout_s
        )

    def _timeout(self) -> dict[str, float]:
        return {"client_timeout": self.timeout_s} if self.wire == "grpc" else {}

    def is_live(self, client: Any) -> bool:
        """Whether the server answers ``/v2/health/live``."""
        return bool(client.is_server_live(**self._timeout()))

    def is_ready(self, client: Any, model: str, version: str) -> bool:
        """Whether the model is loaded and ready."""
        return bool(client.is_model_ready(model, version, **self._timeout()))

    def spec(self, client: Any, model: str, version: str) -> ModelSpec:
        """Read the model config and find the text input and the embedding outputs.

        Raises:
            ValueError: The model does not have a string input and a float32 output.
        """
        if self.wire == "grpc":
            config = client.get_model_config(model, version, as_json=True, **self._timeout())["config"]
        else:
            config = client.get_model_config(model, version)
        return parse_spec(config)

    def infer(
        self, client: Any, model: str, version: str, spec: ModelSpec, texts: list[str]
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_]]:
        """One inference request: ``(n, dim) float32`` vectors and ``(n,)`` truncation flags."""
        data = np.array([[t.encode("utf-8")] for t in texts], dtype=np.object_)
        request = self._module.InferInput(spec.input_name, list(data.shape), "BYTES")
        request.set_data_from_numpy(data)
        names = [spec.output_name] + ([spec.truncated_name] if spec.truncated_name else [])
        if self.wire == "grpc":
            outputs = [self._module.InferRequestedOutput(n) for n in names]
        else:
            outputs = [self._module.InferRequestedOutput(n, binary_data=True) for n in names]
        result = client.infer(model, [request], model_version=version, outputs=outputs, **self._timeout())
        vectors = np.asarray(result.as_numpy(spec.output_name), dtype=np.float32).reshape(len(texts), -1)
        if spec.truncated_name is None:
            return vectors, np.zeros(len(texts), dtype=bool)
        return vectors, np.asarray(result.as_numpy(spec.truncated_name), dtype=bool).reshape(len(texts))


def parse_spec(config: dict[str, Any]) -> ModelSpec:
    """Turn a Triton model config (REST JSON or protobuf JSON) into a :class:`ModelSpec`.

    Raises:
        ValueError: No ``TYPE_STRING`` input, no ``TYPE_FP32`` output, or batching disabled.
    """
    inputs = [i for i in config.get("input", []) if i.get("data_type") == "TYPE_STRING"]
    floats = [o for o in config.get("output", []) if o.get("data_type") == "TYPE_FP32"]
    bools = [o for o in config.get("output", []) if o.get("data_type") == "TYPE_BOOL"]
    if not inputs or not floats:
        raise ValueError("the model needs a TYPE_STRING input and a TYPE_FP32 output")
    max_batch_size = int(config.get("max_batch_size", 0))
    if max_batch_size < 1:
        raise ValueError("the model must batch (max_batch_size >= 1)")
    dims = [int(d) for d in floats[0].get("dims", [])]
    params = {k: str(v.get("string_value", "")) for k, v in (config.get("parameters") or {}).items()}
    return ModelSpec(
        input_name=inputs[0]["name"],
        output_name=floats[0]["name"],
        truncated_name=bools[0]["name"] if bools else None,
        dim=dims[-1] if dims and dims[-1] > 0 else 0,
        max_batch_size=max_batch_size,
        parameters=params,
    )


def _transient(wire: Wire) -> tuple[tuple[type[BaseException], ...], frozenset[str]]:
    """Errors and statuses worth a retry: the server is down, restarting, overloaded or slow.

    gRPC ``NOT_FOUND`` is among them: the embedder checks at start that the model is ready, so
    a model that later has "no available versions" is being unloaded, as while Triton shuts down.
    """
    if wire == "grpc":
        statuses = {"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED", "NOT_FOUND"}
        return (OSError,), frozenset(f"StatusCode.{s}" for s in statuses)
    import gevent  # type: ignore[import-untyped]
    from geventhttpclient.response import HTTPConnectionClosed

    return (OSError, gevent.Timeout, HTTPConnectionClosed), frozenset({"429", "502", "503", "504"})
