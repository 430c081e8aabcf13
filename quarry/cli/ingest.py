"""``quarry ingest``: local, on Ray, or through a running server (``--server``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from quarry.cli.root import (
    _default_name,
    _quarry,
    app,
    err,
    out,
)
from quarry.errors import ConfigError, InvalidRequest, QuarryError
from quarry.settings import get_settings


def _ingest_epilog() -> str:
    from quarry.ingest_run import EXIT_CODES

    return EXIT_CODES


@app.command(epilog=_ingest_epilog())
def ingest(
    path: Annotated[
        Path, typer.Argument(help="BEIR folder, .jsonl file, or folder of .txt/.md/.pdf/.html/.docx files.")
    ],
    collection: Annotated[str | None, typer.Option("--collection", "-c", help="Default: the path's name.")] = None,
    language: Annotated[
        str | None, typer.Option(help="BM25 analysis for a new collection: en, zh or auto (default).")
    ] = None,
    chunk_size: Annotated[int | None, typer.Option(help="Chunk cap in text tokens (new collection).")] = None,
    chunk_overlap: Annotated[int | None, typer.Option(help="Overlap in tokens (new collection).")] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object per line on stdout: progress events, then the report.")
    ] = False,
    prune: Annotated[
        bool, typer.Option("--prune", help="Delete the collection's documents that are no longer in the source.")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Read the source and say what would change (and go, with --prune).")
    ] = False,
    engine: Annotated[
        str, typer.Option(help="local, or ray: parse, chunk and embed on Ray Data (pip install 'quarry\\[ray]').")
    ] = "local",
    address: Annotated[
        str | None, typer.Option(help="Ray cluster (ray://head:10001, auto); default RAY_ADDRESS, else a local Ray.")
    ] = None,
    workers: Annotated[
        int | None, typer.Option(min=1, help="Most embedding actors on Ray (default: as many as fit).")
    ] = None,
    gpus_per_worker: Annotated[
        float, typer.Option(min=0, help="GPUs per Ray embedding actor (1: one per GPU; QUARRY_EMBEDDING__DEVICE=cuda).")
    ] = 0.0,
    server: Annotated[
        str | None,
        typer.Option(
            envvar="QUARRY_URL",
            help="Submit an ingest job to this running server (http://host:port) and follow it: PATH is read here "
            "and its documents streamed to the server (no server stop needed). Same output and exit codes; "
            "SIGINT cancels the job."
        ),
    ] = None,
    server_path: Annotated[
        bool,
        typer.Option(
            "--server-path",
            help="With --server: PATH is on the server's disk, under its QUARRY_INGEST__ROOTS (the server reads it).",
        ),
    ] = False,
    api_key: Annotated[
        str | None, typer.Option(envvar="QUARRY_API_KEY", help="With --server: the API key (write scope; admin "
                                 "for a new collection).")
    ] = None,
) -> None:
    """Ingest documents (idempotent: unchanged documents are skipped without embedding).

    The source is streamed batch by batch (memory holds one batch). A folder's files that cannot
    be parsed are skipped and named (QUARRY_INGEST__ON_ERROR=skip|fail); files of other formats
    are counted and named in the report.
    """
    from quarry.ingest_run import exit_code_of, fail_json

    name = collection or _default_name(path)
    try:
        if server is not None:
            if engine != "local":
                raise InvalidRequest("--engine runs the ingest in this process; with --server the server runs it")
            code = _ingest_remote(
                server, api_key, path, name, as_json=as_json, prune=prune, dry_run=dry_run, server_path=server_path
            )
        else:
            ray = {"engine": engine, "address": address, "workers": workers, "gpus_per_worker": gpus_per_worker}
            code = _ingest(
                path, name, language, chunk_size, chunk_overlap, as_json=as_json, prune=prune, dry_run=dry_run,
                ray=ray,
            )
    except QuarryError as exc:
        if as_json:
            fail_json(name, exc)
        err.print(f"[bold red]error[/] ({type(exc).__name__}): {escape(str(exc))}")
        raise typer.Exit(exit_code_of(exc)) from None
    if code:
        raise typer.Exit(code)


def _ingest_remote(  # noqa: PLR0913 - the command's options
    server: str, api_key: str | None, path: Path, name: str, *, as_json: bool, prune: bool, dry_run: bool,
    server_path: bool,
) -> int:
    try:
        import httpx
    except ImportError:
        raise ConfigError("quarry ingest --server needs an HTTP client: pip install 'quarry[client]'") from None

    from quarry.ingest_remote import RemoteError, RemoteIngest
    from quarry.ingest_run import Options

    if dry_run:
        raise InvalidRequest("--dry-run reads the source in this process: it does not go with --server")
    settings = get_settings().ingest
    options = Options(as_json=as_json, prune=prune, on_error=settings.on_error)
    upload = None
    if not server_path:
        from indexing.sources import Source

        if not path.exists():
            raise InvalidRequest(f"{path} does not exist here; with --server PATH is read here and uploaded "
                                 "(add --server-path for a path on the server's disk, under its QUARRY_INGEST__ROOTS)")
        upload = Source(path, on_error=settings.on_error, max_document_chars=settings.max_document_chars,
                        max_token_chars=settings.max_token_chars)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(base_url=server, headers=headers, timeout=60) as client:
        try:
            _create_remote(client, name)
            return RemoteIngest(client, name, str(path), options, out, err, upload=upload).execute()
        except RemoteError as exc:
            if as_json:
                line = {"event": "error", "collection": name, "message": str(exc), "exit_code": exc.code}
                out.file.write(json.dumps(line, ensure_ascii=False) + "\n")
            err.print(f"[bold red]error[/] (server): {escape(str(exc))}")
            return exc.code


def _create_remote(client: Any, name: str) -> None:
    """Create collection ``name`` on the server, as a local ingest does (one that exists is kept).

    Raises:
        RemoteError: The server refused (a key without ``admin`` for a new name: 403) or is unreachable.
    """
    import httpx

    from quarry.ingest_remote import RemoteError
    from quarry.ingest_run import EXIT_BAD_INPUT, EXIT_UNAVAILABLE

    try:
        if client.get(f"/v1/collections/{name}").status_code == 200:
            return
        resp = client.post("/v1/collections", json={"name": name})
    except httpx.HTTPError as exc:
        raise RemoteError(f"server {client.base_url} cannot be reached: {exc}", EXIT_UNAVAILABLE) from exc
    if resp.status_code not in (201, 409):
        error = (resp.json() if resp.content else {}).get("error", {})
        code = EXIT_UNAVAILABLE if resp.status_code >= 500 or error.get("retryable") else EXIT_BAD_INPUT
        raise RemoteError(f"{error.get('type', resp.status_code)}: {error.get('message', resp.text)}", code)


def _ingest(  # noqa: PLR0913 - the command's options
    path: Path, name: str, language: str | None, chunk_size: int | None, chunk_overlap: int | None, *,
    as_json: bool, prune: bool, dry_run: bool, ray: dict[str, Any],
) -> int:
    from indexing.sources import Source
    from quarry.ingest_run import Options, Run

    if ray["engine"] not in ("local", "ray"):
        raise InvalidRequest(f"--engine {ray['engine']!r}: local or ray")
    if ray["engine"] == "ray" and not dry_run:
        import indexing.ray_engine  # noqa: F401 - without the extra: a ConfigError naming it, before any work

    settings = get_settings()
    limits = settings.ingest
    source = Source(
        path, on_error=limits.on_error, max_document_chars=limits.max_document_chars,
        max_token_chars=limits.max_token_chars,
    )
    quarry = _quarry(settings)
    quarry.bm25.lazy = True  # this process does not search: the BM25 index is the next server's to load
    if not dry_run:
        cfg = quarry.create_collection(
            name, language=language or "auto", chunk_size=chunk_size, chunk_overlap=chunk_overlap, exist_ok=True
        )
        asked = {"language": language, "chunk_size": chunk_size, "chunk_overlap": chunk_overlap}
        ignored = {k: v for k, v in asked.items() if v is not None and getattr(cfg, k) != v}
        if ignored:
            has = ", ".join(f"{k}={getattr(cfg, k)!r}" for k in ignored)
            err.print(
                f"[yellow]note[/] collection {escape(name)} exists with {escape(has)}; "
                f"{', '.join('--' + k.replace('_', '-') for k in ignored)} "
                f"{'applies' if len(ignored) == 1 else 'apply'} to a new collection only "
                "(drop it, or ingest into another --collection)"
            )
    options = Options(as_json=as_json, prune=prune, dry_run=dry_run, on_error=limits.on_error, **ray)
    run = Run(quarry, name, source, options, out, err)
    code = run.execute()
    if not as_json and run.report is not None and run.report.truncated:
        out.print(_truncation_hint(run.report.truncated, run.report.embedded, quarry.embedder.max_seq_length))
    return code


def _truncation_hint(truncated: int, embedded: int, max_seq_length: int) -> str:
    """What truncated chunks mean for search, and the knob that avoids them."""
    return (
        f"[yellow]note[/] {truncated} of {embedded} chunks exceed the embedding model's "
        f"{max_seq_length} tokens: their dense vectors cover only their start (BM25 indexes "
        "all of them). A smaller --chunk-size (a new collection) keeps whole chunks in the dense index."
    )


def _ingest_with_progress(quarry: Any, name: str, docs: list[Any]) -> Any:
    if not err.is_terminal:  # logs (CI, files): one line per batch instead of a live bar
        done = [0]

        def log_line(n: int) -> None:
            done[0] += n
            err.print(f"ingest {name}: {done[0]}/{len(docs)} documents")

        return quarry.upsert(name, docs, progress=log_line)
    columns = (TextColumn("[bold]ingest"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=False) as bar:
        task = bar.add_task("documents", total=len(docs))
        return quarry.upsert(name, docs, progress=lambda n: bar.advance(task, n))


