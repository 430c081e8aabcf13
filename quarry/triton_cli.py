"""``quarry triton serve``: host the embedding model in a real Triton server (PyTriton).

Run directly with ``python -m quarry.triton_cli serve ...``. Stop it with SIGTERM or Ctrl-C:
tritonserver and its Python-backend stubs are stopped before the command exits (status 0).
"""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from quarry.errors import QuarryError
from quarry.settings import get_settings

app = typer.Typer(help="Host Quarry's embedding model on NVIDIA Triton Inference Server (PyTriton).")


@app.callback()
def _main() -> None:
    """Triton Inference Server commands."""


@app.command()
def serve(
    model: Annotated[
        str,
        typer.Option(help="Backend to wrap: onnx-fp32 (same vectors as torch), onnx (int8), torch, or a URL."),
    ] = "onnx-fp32",
    model_name: Annotated[str, typer.Option(help="Triton model name (the last part of the client URL).")] = "minilm",
    address: Annotated[str, typer.Option(help="Bind address of all endpoints.")] = "0.0.0.0",
    http_port: Annotated[int, typer.Option(min=1, max=65535, help="HTTP/REST port (/v2/health/ready).")] = 8000,
    grpc_port: Annotated[int, typer.Option(min=1, max=65535, help="gRPC port.")] = 8001,
    metrics_port: Annotated[int, typer.Option(min=1, max=65535, help="Prometheus metrics port (/metrics).")] = 8002,
    max_batch_size: Annotated[int, typer.Option(min=1, help="Largest dynamic batch (texts).")] = 64,
    max_queue_delay_us: Annotated[
        int, typer.Option(min=0, help="Longest wait for a batch to fill, in microseconds (0: no wait).")
    ] = 0,
    preferred_batch_size: Annotated[
        list[int] | None, typer.Option(help="Preferred dynamic batch size (repeatable).")
    ] = None,
    instances: Annotated[int, typer.Option(min=1, help="Model instances (concurrent model calls).")] = 1,
    shared_memory: Annotated[
        bool,
        typer.Option("--shared-memory", help="Pass tensors to the model through PyTriton's shared-memory TensorStore "
                     "(pays off for MB-sized tensors; small ones travel faster inline)."),
    ] = False,
) -> None:
    """Serve the embedding model until SIGTERM/SIGINT."""
    from embedding.triton_server import ServeConfig
    from embedding.triton_server import serve as run_server

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = ServeConfig(
            model=model, model_name=model_name, address=address, http_port=http_port, grpc_port=grpc_port,
            metrics_port=metrics_port, max_batch_size=max_batch_size, max_queue_delay_us=max_queue_delay_us,
            preferred_batch_sizes=tuple(preferred_batch_size or ()), instances=instances,
            shared_memory=shared_memory,
        )
        run_server(config, get_settings())
    except QuarryError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(2) from exc


@app.command()
def fingerprint(
    model: Annotated[
        str, typer.Argument(help="Packaged model name or sentence-transformers folder (what model.py loads).")
    ] = "all-MiniLM-L6-v2",
) -> None:
    """Print the ``fingerprint`` line for model_repository/minilm's configs (config.pbtxt, configs/cpu.pbtxt).

    The value is the model's fingerprint as ``torch://<model>`` records it in a collection; the
    stock tritonserver's model.py refuses to load weights that do not have it.
    """
    from embedding.sentence_transformers import fingerprint_of, resolve_model_path

    try:
        value = fingerprint_of(resolve_model_path(model), None)
    except QuarryError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(config_line(value))


def config_line(fingerprint: str) -> str:
    """The config.pbtxt line that publishes ``fingerprint`` to Quarry's Triton client."""
    return f'parameters: {{ key: "fingerprint" value: {{ string_value: "{fingerprint}" }} }}'


if __name__ == "__main__":
    app()
