"""The ``quarry`` command line: ingest, search, serve, eval, collections, index, config.

Every command runs through one handler (:class:`_OneErrorLine`): Quarry's errors and invalid
``QUARRY_*`` settings print one ``error (Type): message`` line and exit 2, from the ``quarry``
console script and ``python -m quarry.cli`` alike. Each run warns about ``QUARRY_*`` variables
that set nothing (a misspelling such as ``QUARRY_STORE_URL`` is otherwise ignored).
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from typer.core import TyperGroup

from quarry.config_cli import app as config_app
from quarry.errors import ConfigError, InvalidRequest, LLMNotConfigured, QuarryError
from quarry.keys_cli import audit_app, keys_app
from quarry.settings import Settings, get_settings, unknown_env
from quarry.triton_cli import app as triton_app


class _OneErrorLine(TyperGroup):
    """The one handler of every command: an error is one line on stderr and exit status 2."""

    def invoke(self, ctx: Any) -> Any:  # typer's vendored click.Context
        """Run the command; a :class:`QuarryError` or invalid settings become one ``error`` line."""
        from pydantic import ValidationError

        try:
            return super().invoke(ctx)
        except QuarryError as exc:
            _fail(exc)
        except ValidationError as exc:
            if exc.title.endswith("Settings"):
                err.print(f"[bold red]error[/] (ConfigError): {escape(settings_error(exc))}")
            else:  # stored data (a collection's config) that no longer validates: not the environment
                err.print(f"[bold red]error[/] (InternalError): {escape(stored_error(exc))}")
            raise typer.Exit(2) from None


app = typer.Typer(help="Quarry: hybrid BM25 + dense retrieval service.", no_args_is_help=True, cls=_OneErrorLine)
collections_app = typer.Typer(help="Manage collections.", no_args_is_help=True)
app.add_typer(collections_app, name="collections")
index_app = typer.Typer(help="Plan and build vector indexes by data size.", no_args_is_help=True)
app.add_typer(index_app, name="index")
app.add_typer(triton_app, name="triton")
docs_app = typer.Typer(help="List and fetch a collection's documents.", no_args_is_help=True)
app.add_typer(docs_app, name="docs")
app.add_typer(config_app, name="config")
eval_app = typer.Typer(help="Evaluate retrieval on a BEIR split (quarry eval --beir DIR); compare runs.")
app.add_typer(eval_app, name="eval")
app.add_typer(keys_app, name="keys")
app.add_typer(audit_app, name="audit")
err = Console(stderr=True, soft_wrap=True)  # an error is one line, however long
out = Console()

Language = Annotated[str, typer.Option(help="BM25 analysis for a new collection: en, zh or auto.")]
ServerUrl = Annotated[str | None, typer.Option(
    "--server", envvar="QUARRY_URL",
    help="A running server (http://host:port; or QUARRY_URL): go through its API (quarry_client), not local data.",
)]
ApiKey = Annotated[str | None, typer.Option("--api-key", envvar="QUARRY_API_KEY", help="With --server: the API key.")]


def _client(server: str, api_key: str | None) -> Any:
    """A :class:`quarry_client.Quarry` for ``--server``; its errors become the one error line (exit 2)."""
    try:
        from quarry_client import Quarry as Client
    except ImportError:
        raise ConfigError("--server needs the client: pip install 'quarry[client]'") from None
    return Client(server, api_key)


def _remote_error(exc: Exception) -> NoReturn:
    err.print(f"[bold red]error[/] ({escape(getattr(exc, 'type', type(exc).__name__))}): "
              f"{escape(getattr(exc, 'message', str(exc)))}")
    raise typer.Exit(2) from None


def _quarry(settings: Settings | None = None) -> Any:
    from quarry.service import Quarry

    return Quarry(settings or get_settings())


def _default_name(path: Path) -> str:
    stem = re.sub(r"[^A-Za-z0-9_]", "_", path.resolve().name or "default")
    return stem if stem[:1].isalpha() else f"c_{stem}"


def _fail(exc: QuarryError) -> NoReturn:
    err.print(f"[bold red]error[/] ({type(exc).__name__}): {escape(str(exc))}")
    raise typer.Exit(2) from None


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            out.print(f"quarry {version('quarry')}")
        except PackageNotFoundError:
            out.print("quarry (not installed: version unknown)")
        raise typer.Exit


@app.callback()
def _main(
    _: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Quarry: hybrid BM25 + dense retrieval service."""
    for variable, close in unknown_env():
        hint = f" (did you mean {close}?)" if close else ""
        err.print(f"[yellow]warning[/] {escape(variable)} is not a Quarry setting and is ignored{escape(hint)}")


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


@app.command()
def search(
    query: Annotated[str, typer.Argument(help="Query text.")],
    collection: Annotated[str, typer.Option("--collection", "-c")],
    mode: Annotated[str, typer.Option(help="bm25, dense or hybrid.")] = "hybrid",
    top_k: Annotated[int, typer.Option("--top-k", "-k")] = 10,
    filters: Annotated[str | None, typer.Option(help='JSON filter, e.g. \'{"year": {"$gte": 2000}}\'.')] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw result as JSON.")] = False,
    server: ServerUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Search a collection and print the hits."""
    import dataclasses

    try:
        flt = json.loads(filters) if filters else None
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"--filters is not valid JSON: {exc.msg}") from exc
    if server is not None:
        from quarry_client import QuarryError as ClientError

        with _client(server, api_key) as client:
            try:
                result: Any = client.search(collection, query, top_k=top_k, mode=mode, filters=flt)
            except ClientError as exc:
                _remote_error(exc)
        hits = [h.model_dump() for h in result.hits]
    else:
        result = _quarry().search(collection, query, top_k=top_k, mode=mode, filters=flt)
        hits = [dataclasses.asdict(h) for h in result.hits]
    if as_json:
        out.file.write(json.dumps({"hits": hits, "degraded": result.degraded}, ensure_ascii=False) + "\n")
        return
    table = Table("#", "document", "score", "bm25", "dense", "text", title=escape(f"{collection}: {query!r} ({mode})"))
    for i, hit in enumerate(hits, start=1):
        ranks = {k: str(v["rank"]) for k, v in hit["explain"].items() if isinstance(v, dict) and "rank" in v}
        table.add_row(str(i), escape(hit["document_id"]), f"{hit['score']:.4f}", ranks.get("bm25", "-"),
                      ranks.get("dense", "-"), escape(hit["text"][:80].replace("\n", " ")))
    out.print(table)
    for note in result.degraded:
        err.print(f"[yellow]degraded[/]: {escape(note)}")


@app.command()
def recall(
    name: Annotated[str, typer.Argument(help="Collection.")],
    queries: Annotated[int, typer.Option("--queries", "-n", help="Queries to measure.")] = 100,
) -> None:
    """Measure recall@k of the ANN index against exact search now (the recall monitor's check).

    Queries are the collection's recently sampled searches if any were recorded, else texts of
    its own chunks; one row per filter-selectivity bucket.
    """
    check = _quarry().check_recall(name, queries)
    title = escape(f"{name}: recall@k of {check.queries} queries from {check.source}")
    table = Table("selectivity", "queries", "mean", "p10", "min", title=title)
    for row in check.buckets:
        table.add_row(escape(row.bucket), str(row.samples), f"{row.mean_recall:.3f}", f"{row.p10_recall:.3f}",
                      f"{row.min_recall:.3f}")
    out.print(table)


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (default QUARRY_API__HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default QUARRY_API__PORT).")] = None,
    workers: Annotated[
        int,
        typer.Option(
            min=1, help="Worker processes; more than 1 needs a store server and QUARRY_DOCSTORE__URL=postgresql://..."
        ),
    ] = 1,
) -> None:
    """Start the REST API (OpenAPI at /docs).

    The store, the docstore and the models open here, before the server starts: a store that
    cannot be opened (a Milvus Lite file another process holds) or a model that cannot load is
    one error line (exit 2), not a traceback of the server's failed startup. A remote embedder
    that is down is not: the server starts and answers from BM25 meanwhile.
    """
    import uvicorn

    from quarry.api import create_app
    from quarry.api.access import check_bind
    from quarry.errors import EmbeddingUnavailable
    from quarry.logs import uvicorn_log_config

    settings = get_settings()
    if workers > 1:
        _serve_workers(settings, host, port, workers)
        return
    service = _quarry(settings)
    try:
        check_bind(host or settings.api.host, service.docstore, settings.auth)
        try:
            service.warm_up()
        except EmbeddingUnavailable as exc:
            err.print(f"[yellow]warning[/] embedding server unavailable, serving BM25 meanwhile: {escape(exc.message)}")
        application = create_app(service)
        uvicorn.run(
            application, host=host or settings.api.host, port=port or settings.api.port,
            log_config=uvicorn_log_config(settings.log.format, settings.log.level),
        )
    finally:
        service.close()


def _serve_workers(settings: Settings, host: str | None, port: int | None, workers: int) -> None:
    """``serve --workers N``: each worker opens its own service; the settings are checked first.

    Raises:
        ConfigError: The store or the docstore belongs to one process (see
            :func:`quarry.api.workers.check_shareable`).
    """
    import uvicorn

    from quarry.api.access import check_bind
    from quarry.api.workers import check_shareable, share_cores
    from quarry.logs import uvicorn_log_config

    check_shareable(settings)
    share_cores(workers, os.environ)  # each worker's torch: cores // N threads, not all of them
    service = _quarry(settings)  # fail here, as one error line, if the store or docstore cannot open
    try:
        check_bind(host or settings.api.host, service.docstore, settings.auth)
    finally:
        service.close()
    uvicorn.run(
        "quarry.api.workers:create_worker_app", factory=True, workers=workers,
        host=host or settings.api.host, port=port or settings.api.port,
        log_config=uvicorn_log_config(settings.log.format, settings.log.level),
    )


@eval_app.callback(invoke_without_command=True)
def evaluate(
    ctx: typer.Context,
    beir: Annotated[
        Path | None, typer.Option("--beir", help="BEIR folder (corpus.jsonl, queries.jsonl, qrels/); required.")
    ] = None,
    split: Annotated[str, typer.Option(help="qrels split.")] = "test",
    modes: Annotated[str, typer.Option(help="Comma-separated: bm25,dense,hybrid.")] = "bm25,dense,hybrid",
    out_dir: Annotated[Path, typer.Option("--out", help="Where report.md and summary.json go.")] = Path("eval-out"),
    collection: Annotated[str | None, typer.Option("--collection", "-c", help="Default: eval_<dataset>.")] = None,
    language: Language = "auto",
    answers: Annotated[
        bool, typer.Option("--answers", help="Also answer queries with the LLM (QUARRY_LLM__URL) and score them.")
    ] = False,
    answers_queries: Annotated[
        int, typer.Option("--answers-queries", min=1, help="Queries answered with --answers (split order).")
    ] = 20,
    baseline: Annotated[
        Path | None, typer.Option("--baseline", help="An earlier run's --out folder: compare this run with it.")
    ] = None,
    ann: Annotated[
        bool, typer.Option("--ann/--no-ann", help="Measure the index's recall against exact search (numpy scan).")
    ] = True,
    tune: Annotated[
        str | None,
        typer.Option("--tune", help="Fit the hybrid fusion on this split (train, dev; never test), write "
                     "<out>/tuned-fusion.json and compare tuned and default fusion on --split."),
    ] = None,
    fusion_file: Annotated[
        Path | None, typer.Option("--fusion", help="Hybrid fusion JSON (e.g. a tuned-fusion.json) for the run.")
    ] = None,
) -> None:
    """Ingest a BEIR corpus (idempotent), run each mode over a split, write the report (report.md, report.html)."""
    if ctx.invoked_subcommand is not None:
        return
    if beir is None:
        raise InvalidRequest("quarry eval needs --beir DIR (a BEIR folder), or a subcommand: quarry eval compare A B")
    from eval.ann import collection_ann
    from eval.runner import collection_search
    from eval.runner import evaluate as run_eval

    settings = get_settings()
    if answers and not settings.llm.url.strip():
        raise LLMNotConfigured(
            "quarry eval --answers needs an LLM: set QUARRY_LLM__URL (openai+http://host:port/v1?model=NAME)"
        )
    name = collection or f"eval_{_default_name(beir)}"
    wanted = [m.strip() for m in modes.split(",") if m.strip()]
    if tune is not None and tune in ("test", split):
        raise InvalidRequest(f"--tune {tune}: tuning on the test or the reported split is refused; use train or dev")
    docs = _check_eval_inputs(beir, split, wanted, out_dir)
    _check_baseline(baseline, beir, split)
    quarry = _quarry(settings)
    quarry.create_collection(name, language=language, exist_ok=True)
    # Refused before anything is written: documents that are not in the corpus would be retrieved
    # and scored, and ingesting first would add the corpus to a collection that is then refused.
    stored = quarry.docstore.counts(name)[0]
    foreign = stored - len(quarry.docstore.document_hashes(name, [d.id for d in docs]))
    if foreign:
        raise InvalidRequest(
            f"collection {name!r} holds {foreign} document(s) that {beir} does not have: they would be "
            f"retrieved and scored; drop it (quarry collections drop {name}) or name another with --collection"
        )
    _ingest_with_progress(quarry, name, docs)
    cfg = quarry.get_collection(name)

    fusion = _read_fusion_file(fusion_file) if fusion_file is not None else None
    if tune is not None:
        _tune(quarry, name, beir, tune, split, out_dir, settings.search.candidates)
    config = {
        "fusion": quarry.searcher.fusion(cfg, fusion).describe(),
        "collection": name, "store": settings.store_url, "embedding": settings.embedding.url,
        "embedding_model": cfg.embedding_model, "language": cfg.language, "chunk_size": cfg.chunk_size,
        "chunk_overlap": cfg.chunk_overlap, "bm25": settings.bm25.model_dump(),
        "rrf_k": settings.search.rrf_k, "rank_window_size": settings.search.candidates, "index": cfg.index,
    }
    summary = run_eval(
        collection_search(quarry, name, fusion), beir_dir=beir, split=split, modes=wanted, out_dir=out_dir,
        config=config,
        answers=_answers_section(quarry, name, answers_queries) if answers else None,
        ann=collection_ann(quarry, name) if ann else None, baseline=baseline,
    )
    table = Table("mode", "nDCG@10", "Recall@10", "Recall@100", "MRR@10", "p50 ms", "p95 ms", title=str(beir))
    for mode_name, row in summary.to_dict()["modes"].items():
        table.add_row(mode_name, *(f"{row[k]:.4f}" for k in ("ndcg@10", "recall@10", "recall@100", "mrr@10")),
                      f"{row['latency_ms']['p50']:.1f}", f"{row['latency_ms']['p95']:.1f}")
    out.print(table)
    if summary.answers is not None:
        a = summary.answers

        def pct(key: str) -> str:
            return "n/a" if a[key] is None else f"{100 * a[key]:.1f}%"

        out.print(
            f"answers: {a['queries']} queries ({a['failed']} failed), citation validity {pct('citation_validity')}, "
            f"cited relevant {pct('cited_relevant')}, no citation {pct('no_citation')}, supported "
            f"{pct('supported')}, TTFT p50 {a['ttft_ms']['p50']:.0f} ms, total p50 {a['total_ms']['p50']:.0f} ms"
        )
    if summary.ann_vs_exact is not None and "recall" in summary.ann_vs_exact:
        recall = ", ".join(f"recall@{k} {v:.4f}" for k, v in summary.ann_vs_exact["recall"].items())
        kind = (summary.ann_vs_exact["index"] or {}).get("kind", "no index")
        out.print(f"ANN vs exact ({escape(str(kind))}): {recall}")
    if baseline is not None:  # the same figures as compare.json (same data, same seed)
        from eval.compare import compare_runs, comparison_table, load_run

        out.print(comparison_table(compare_runs(load_run(baseline, str(baseline)), load_run(out_dir, "this run"))))
    out.print(f"report: {out_dir / 'report.md'}, {out_dir / 'report.html'}")


@eval_app.command("compare")
def compare(
    run_a: Annotated[Path, typer.Argument(help="The base run's --out folder (A).")],
    run_b: Annotated[Path, typer.Argument(help="The compared run's --out folder (B).")],
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Where compare.json and compare.html go (default: RUN_B).")
    ] = None,
) -> None:
    """Per mode and metric: B - A with a paired randomisation test's p-value, a bootstrap CI and W/L/T."""
    from eval.compare import compare_runs, comparison_table, load_run, write_comparison

    comparison = compare_runs(load_run(run_a, str(run_a)), load_run(run_b, str(run_b)))
    out.print(comparison_table(comparison))
    for note in comparison.notes:
        err.print(f"[yellow]note[/] {escape(note)}")
    json_path, html_path = write_comparison(comparison, out_dir or run_b)
    out.print(f"comparison: {json_path}, {html_path}")


def _check_baseline(baseline: Path | None, beir: Path, split: str) -> None:
    """A ``--baseline`` folder is readable and of the same dataset and split (before anything runs)."""
    if baseline is None:
        return
    from eval.compare import RunData, check_same_task, load_run

    here = RunData("this run", {"dataset": beir.resolve().name, "split": split}, {})
    check_same_task(load_run(baseline), here)


def _read_fusion_file(path: Path) -> Any:
    """A :class:`~indexing.collections.FusionConfig` from a JSON file (its ``fusion`` member, or the file itself)."""
    import json

    from indexing.collections import FusionConfig

    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        return FusionConfig.model_validate(raw.get("fusion", raw) if isinstance(raw, dict) else raw)
    except (OSError, ValueError) as exc:
        raise InvalidRequest(f"cannot read the fusion setting {path}: {exc}") from exc


def _tune(quarry: Any, name: str, beir: Path, tune_split: str, report_split: str, out_dir: Path, window: int) -> None:
    """``quarry eval --tune``: fit the fusion on ``tune_split``, write it, show tuned vs default on ``report_split``."""
    from eval.beir import load_split
    from eval.runner import collection_search
    from eval.tune import DEFAULT, Point, channel_runs, default_grid, score, tune, write_setting

    search = collection_search(quarry, name)
    fit = load_split(beir, tune_split)
    candidates = [c for c in (50, 100, 200, 300) if c <= window] or [window]
    out.print(f"tuning on {tune_split}: {len(fit.queries)} queries, each channel searched once, {max(candidates)} deep")
    runs = channel_runs(search, fit.queries, max(candidates))
    best, _ = tune(runs, fit.qrels, tune_split, default_grid(candidates))
    reported = load_split(beir, report_split)
    held = channel_runs(search, reported.queries, max(candidates))
    table = Table("fusion", "candidates", f"{tune_split} nDCG@10", f"{tune_split} R@100",
                  f"{report_split} nDCG@10", f"{report_split} R@100", title="tuned vs default hybrid fusion")
    rows = {}
    for label, point in (("default", Point(DEFAULT, min(window, 100))), ("tuned", best)):
        a, b = score(runs, fit.qrels, point), score(held, reported.qrels, point)
        rows[label] = {"setting": point.describe(), tune_split: a, report_split: b}
        table.add_row(f"{label}: {point.fusion.describe()}", str(point.candidates), f"{a['ndcg@10']:.4f}",
                      f"{a['recall@100']:.4f}", f"{b['ndcg@10']:.4f}", f"{b['recall@100']:.4f}")
    out.print(table)
    path = out_dir / "tuned-fusion.json"
    setting = write_setting(path, best, {"split": tune_split, "objective": "ndcg@10", "dataset": beir.name, **rows})
    out.print_json(data={k: setting[k] for k in ("fusion", "candidates")})
    out.print(f"tuned setting: {path} (quarry eval --fusion {path}; a collection's or a request's \"fusion\"; "
              f"candidates -> QUARRY_SEARCH__CANDIDATES={best.candidates})")


def _answers_section(quarry: Any, name: str, limit: int) -> Any:
    """The ``answers`` callback of :func:`eval.runner.evaluate`: answer ``limit`` queries, score them."""
    from eval.answers import answer_queries
    from eval.beir import BeirSplit

    def run(split: BeirSplit) -> dict[str, Any]:
        return answer_queries(quarry, name, split.queries, limit=limit).to_dict(split.qrels)

    return run


def _check_eval_inputs(beir: Path, split: str, modes: list[str], out_dir: Path) -> list[Any]:
    """Everything an evaluation reads or writes, checked before it ingests anything.

    Returns:
        The corpus documents.

    Raises:
        InvalidRequest: Not a BEIR folder, an unknown split or mode, an empty corpus, or an
            ``--out`` that is not a writable folder.
        InvalidDocument: A malformed corpus, queries or qrels file (file and line named).
    """
    from eval.beir import load_split
    from eval.report import ARTIFACTS, require_plots
    from indexing.sources import read_documents
    from retrieval.search import MODES

    require_plots()  # before the ingest, not after the run
    if not (beir / "corpus.jsonl").is_file():
        raise InvalidRequest(f"{beir} is not a BEIR folder (no corpus.jsonl)")
    unknown = [m for m in modes if m not in MODES]
    if not modes or unknown:
        raise InvalidRequest(f"--modes must name some of {', '.join(MODES)}; got {modes}")
    load_split(beir, split)
    docs = read_documents(beir)
    if not docs:
        raise InvalidRequest(f"{beir / 'corpus.jsonl'} holds no documents")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as exc:
        raise InvalidRequest(f"--out {out_dir} is not a writable folder: {exc.strerror or exc}") from exc
    blocked = [name for name in ARTIFACTS if (out_dir / name).exists() and not (out_dir / name).is_file()]
    if blocked:
        raise InvalidRequest(f"--out {out_dir}: {blocked} exist and are not files; the report writes them")
    return docs


@app.command()
def reindex(  # noqa: PLR0913 - the command's options
    name: Annotated[str | None, typer.Argument(help="The collection to rebuild (with --due: optional).")] = None,
    model: Annotated[
        str | None, typer.Option(help="Another embedding model's URL (re-embeds); default: the live version's.")
    ] = None,
    index: Annotated[str, typer.Option(help="auto (the planner's choice for the current size) or a kind: "
                                            "flat, hnsw, ivf_flat, ...")] = "auto",
    chunk_size: Annotated[int | None, typer.Option(
        help="Re-chunk to this cap in text tokens (a new version with its own chunks; default: the live one's).",
    )] = None,
    chunk_overlap: Annotated[int | None, typer.Option(
        help="The new overlap in tokens, below --chunk-size (default: the live version's).",
    )] = None,
    due: Annotated[bool, typer.Option(
        "--due", help="Only what is due now (QUARRY_REINDEX__* triggers and schedules), for an external cron.",
    )] = False,
) -> None:
    """Build the next version of a collection from the docstore, verify it, and swap it in."""
    if due:
        _reindex_due(name)
        return
    if name is None:
        raise typer.BadParameter("name a collection (or pass --due)", param_hint="NAME")
    quarry = _quarry()
    try:
        if not err.is_terminal:
            report = quarry.reindex(
                name, model=model, index=index, chunk_size=chunk_size, chunk_overlap=chunk_overlap,
                progress=lambda done, total: err.print(f"reindex {name}: {done}/{total} chunks"),
            )
        else:
            columns = (TextColumn("[bold]reindex"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            with Progress(*columns, console=err, transient=False) as bar:
                task = bar.add_task("chunks", total=None)
                report = quarry.reindex(
                    name, model=model, index=index, chunk_size=chunk_size, chunk_overlap=chunk_overlap,
                    progress=lambda done, total: bar.update(task, completed=done, total=total),
                )
    finally:
        quarry.close()
    recall = "n/a" if report.recall is None else f"{report.recall:.3f}"
    out.print(
        f"{name}: version {report.version} live (was {report.previous}): {report.chunks} vectors, "
        f"{report.copied} copied, {report.embedded} embedded, {report.replayed} documents replayed, "
        f"recall@10 {recall}, {report.elapsed_s:.1f} s"
    )


def _reindex_due(name: str | None) -> None:
    """``reindex --due``: start what the triggers and schedules call for, wait, print one line each.

    Raises:
        typer.Exit: Code 1 when a reindex failed.
    """
    from indexing.schedule import ReindexScheduler

    quarry = _quarry()
    failed = False
    try:
        jobs = ReindexScheduler(quarry).run_due([name] if name else None)
        for job in jobs:
            while (current := quarry.docstore.get_job(job.id)) is not None and current.state not in ("done", "failed"):
                time.sleep(0.5)
            state = current.state if current is not None else "gone"
            failed |= state != "done"
            detail = current.error if current is not None and current.error else job.params.get("reason", "")
            out.print(f"{job.collection}: {job.params.get('trigger')} reindex job {job.id} {state}: {detail}")
        if not jobs:
            out.print("nothing due")
    finally:
        quarry.close()
    if failed:
        raise typer.Exit(1)


@app.command()
def rollback(name: Annotated[str, typer.Argument(help="The collection to swap back.")]) -> None:
    """Swap a collection back to the version it served before its last reindex (while still kept)."""
    quarry = _quarry()
    try:
        report = quarry.rollback(name)
    finally:
        quarry.close()
    out.print(f"{name}: version {report.version} live again (was {report.previous})")


@collections_app.command("list")
def list_collections(server: ServerUrl = None, api_key: ApiKey = None) -> None:
    """List collections."""
    if server is not None:
        from quarry_client import QuarryError as ClientError

        with _client(server, api_key) as client:
            try:
                found: list[Any] = client.list_collections()
            except ClientError as exc:
                _remote_error(exc)
    else:
        found = _quarry().list_collections()
    for cfg in found:
        out.file.write(f"{cfg.name}\t{cfg.language}\t{cfg.embedding_model}\t{cfg.dim}\n")  # tabs kept: cut -f


@collections_app.command("describe")
def describe_collection(name: str) -> None:
    """Show a collection's configuration, index and counts."""
    out.print_json(json.dumps(_quarry().describe(name)))


@collections_app.command("drop")
def drop_collection(name: str) -> None:
    """Drop a collection and all its data."""
    _quarry().drop_collection(name)
    out.print(f"dropped {name}")


@docs_app.command("list")
def list_docs(
    collection: Annotated[str, typer.Option("--collection", "-c")],
    cursor: Annotated[str | None, typer.Option(help="The next_cursor of the previous page.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="Documents per page.")] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="Print the page as JSON.")] = False,
    server: ServerUrl = None,
    api_key: ApiKey = None,
) -> None:
    """List a collection's documents in id order (id, chunks, metadata), a page at a time."""
    if server is not None:
        from quarry_client import QuarryError as ClientError

        with _client(server, api_key) as client:
            try:
                page = client.list_documents(collection, cursor=cursor, limit=limit)
            except ClientError as exc:
                _remote_error(exc)
        docs, next_cursor = [d.model_dump() for d in page.documents], page.next_cursor
    else:
        docs, next_cursor = _quarry().list_documents(collection, cursor=cursor, limit=limit)
    if as_json:
        out.file.write(json.dumps({"documents": docs, "next_cursor": next_cursor}, ensure_ascii=False) + "\n")
        return
    for doc in docs:
        out.print(f"{doc['id']}\t{doc['chunks']} chunks\t{json.dumps(doc['metadata'], ensure_ascii=False)}",
                  soft_wrap=True, highlight=False, markup=False)
    if next_cursor is not None:
        err.print(f"more: --cursor {escape(next_cursor)}", soft_wrap=True)


@docs_app.command("get")
def get_doc(
    document_id: Annotated[str, typer.Argument(help="The document's id.")],
    collection: Annotated[str, typer.Option("--collection", "-c")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the document, its chunks included, as JSON.")] = False,
    server: ServerUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Print a document: its text (its chunks' texts joined) and metadata."""
    if server is not None:
        from quarry_client import QuarryError as ClientError

        with _client(server, api_key) as client:
            try:
                doc = client.get_document(collection, document_id).model_dump()
            except ClientError as exc:
                _remote_error(exc)
    else:
        doc = _quarry().get_document(collection, document_id)
    if as_json:
        out.file.write(json.dumps(doc, ensure_ascii=False) + "\n")
        return
    out.print(f"{doc['id']} {json.dumps(doc['metadata'], ensure_ascii=False)}", soft_wrap=True, highlight=False,
              markup=False)
    out.print(doc["text"], soft_wrap=True, highlight=False, markup=False)


@index_app.command("plan")
def index_plan(
    vectors: Annotated[int | None, typer.Option(help="Planned vector count (default: the collection's).")] = None,
    dim: Annotated[int | None, typer.Option(help="Vector dimension (default: the collection's).")] = None,
    collection: Annotated[str | None, typer.Option("--collection", "-c")] = None,
    budget_gib: Annotated[float | None, typer.Option(help="Memory budget, GiB.")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Show the index the planner picks for this store, with its reasons and memory estimate."""
    plan = _plan(vectors, dim, collection, budget_gib)[1]
    from indexing.planner import format_plan

    out.print_json(json.dumps(plan.to_dict())) if as_json else out.print(format_plan(plan))


@index_app.command("apply")
def index_apply(
    collection: Annotated[str, typer.Option("--collection", "-c")],
    vectors: Annotated[int | None, typer.Option(help="Planned size (default: current vector count).")] = None,
    budget_gib: Annotated[float | None, typer.Option()] = None,
) -> None:
    """Build the planned index on a collection (timeout and rollback: QUARRY_STORE__INDEX_BUILD_TIMEOUT_S)."""
    quarry, plan = _plan(vectors, None, collection, budget_gib)
    quarry.apply_index(collection, plan)
    out.print(f"[green]built[/] {plan.spec.kind} on {collection}: {plan.reason}")


def _plan(vectors: int | None, dim: int | None, collection: str | None, budget_gib: float | None) -> tuple[Any, Any]:
    from indexing.planner import GIB, plan_for_store
    from quarry.errors import InvalidRequest

    settings = get_settings()
    quarry = _quarry(settings)
    if collection is not None:
        cfg = quarry.get_collection(collection)
        dim = dim or cfg.dim
        vectors = quarry.store.count(collection) if vectors is None else vectors
    if vectors is None or dim is None:
        raise InvalidRequest("give --collection, or both --vectors and --dim")
    budget = int((budget_gib or settings.store.memory_budget_gib) * GIB)
    return quarry, plan_for_store(quarry.store, vectors, dim, budget, top_k=settings.search.candidates)


def main() -> None:
    """Entry point (the ``quarry`` script): errors are handled by :class:`_OneErrorLine`."""
    sys.exit(app())


def stored_error(exc: Any) -> str:
    """A pydantic error of stored data (a collection's config) as the fields to repair.

    E.g. ``stored CollectionConfig is invalid: dim: Input should be greater than 0 (got 0)``, not
    an environment variable that does not exist.
    """
    parts = []
    for e in exc.errors():
        name = ".".join(str(p) for p in e.get("loc", ())) or "value"
        got = f" (got {e['input']!r})" if isinstance(e.get("input"), str | int | float) else ""
        parts.append(f"{name}: {e.get('msg', 'invalid')}{got}")
    return f"stored {exc.title} is invalid: " + "; ".join(parts)


def settings_error(exc: Any) -> str:
    """A pydantic-settings error as the environment variables to fix.

    E.g. ``QUARRY_SEARCH__CANDIDATES: Input should be a valid integer (got 'abc')``.
    """
    parts = []
    for e in exc.errors():
        name = "QUARRY_" + "__".join(str(p).upper() for p in e.get("loc", ()))
        got = f" (got {e['input']!r})" if isinstance(e.get("input"), str | int | float) else ""
        parts.append(f"{name}: {e.get('msg', 'invalid')}{got}")
    return "invalid settings: " + "; ".join(parts)


if __name__ == "__main__":
    main()
