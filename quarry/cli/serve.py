"""``quarry serve|reindex|rollback``: the API server and collection versions."""

from __future__ import annotations

import os
import time
from typing import Annotated

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from quarry.cli.root import (
    _quarry,
    app,
    err,
    out,
)
from quarry.settings import Settings, get_settings


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
    from quarry.scheduler import ReindexScheduler

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


