"""``quarry ingest`` as a job a scheduler runs: streaming, progress, a report, exit codes, signals.

The source is read as a stream (:class:`indexing.sources.Source`) and written batch by batch
(:meth:`quarry.service.Quarry.upsert_stream`): memory holds one batch, not the corpus.

Progress goes to stderr: a rich bar with rate and ETA on a terminal, one timestamped plain line
per batch otherwise (never wrapped). With ``--json`` stdout carries one JSON object per line:
``{"event": "progress", ...}`` after each batch and a final ``{"event": "report", ...}`` (or
``{"event": "error", ...}``).

Exit codes (:data:`EXIT_CODES`): 0 done; 2 bad input (or any other non-retryable error); 3 a
dependency is unavailable (store or embedding server down: retry later); 4 partial: files were
skipped (``QUARRY_INGEST__ON_ERROR=skip``), the rest is written; 130 interrupted.

SIGINT or SIGTERM finishes the batch in flight, then stops and reports the documents kept; a
second signal abandons that batch (it is rolled back: each batch is atomic).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from indexing.sources import Source
from quarry.errors import QuarryError

EXIT_OK, EXIT_BAD_INPUT, EXIT_UNAVAILABLE, EXIT_PARTIAL, EXIT_INTERRUPTED = 0, 2, 3, 4, 130

REPORT_FIELDS: dict[str, tuple[type, ...]] = {
    "status": (str,),  # ok | partial | interrupted | failed
    "exit_code": (int,),
    "job": (str, type(None)),  # the server's job id (None: a local run)
    "engine": (str,),  # local | ray | server
    "dry_run": (bool,),
    "total": (int,),  # files of a folder (documents of a JSONL file or BEIR corpus) in the source
    "read": (int,),  # documents read
    "skipped": (int,),  # files that could not be parsed or decoded
    "errors": (list,),  # [{"path", "reason"}] of those
    "not_read": (list,),  # [path] of files of formats Quarry does not read
    "empty": (list,),  # [path] of files without text
    "kept": (int,),  # documents written or found unchanged
    "added": (int,),
    "updated": (int,),
    "unchanged": (int,),
    "written": (int,),  # added + updated
    "embedded": (int,),  # texts sent to the model
    "chunks_written": (int,),
    "truncated": (int,),  # chunks cut at the model's max sequence length
    "pruned": (int,),  # documents deleted by --prune (their ids: the plain output, or a --dry-run's would_prune)
    "abandoned_batch": (bool,),
    "signals": (list,),  # SIGINT/SIGTERM seen
    "error": (str, type(None)),  # why a server job failed
    "elapsed_s": (float,),
}
"""The ``--json`` report of ``quarry ingest``: the same fields, of the same types, for a local run, a
run through a server (``--server``) and the job it submits (a dry run adds ``would_*``)."""


def report_of(**values: Any) -> dict[str, Any]:
    """The report with :data:`REPORT_FIELDS`, in that order; a field not given gets its type's empty value.

    Raises:
        TypeError: A field that is not in :data:`REPORT_FIELDS`, or of another type.
    """
    unknown = set(values) - set(REPORT_FIELDS)
    if unknown:
        raise TypeError(f"not report fields: {sorted(unknown)}")
    out: dict[str, Any] = {}
    for key, types in REPORT_FIELDS.items():
        value = values.get(key, None if type(None) in types else types[0]())
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise TypeError(f"report field {key}: {type(value).__name__}, expected {types}")
        out[key] = value
    return out
EXIT_CODES = (
    "Exit codes: 0 done (files of formats not read are named in the report); 2 bad input (a malformed "
    "line, a file that cannot be parsed under QUARRY_INGEST__ON_ERROR=fail, a bad option) or another "
    "error that a retry will not fix; 3 a dependency is unavailable (vector store or embedding server "
    "down): retry later; 4 partial run: files that cannot be parsed or decoded were skipped "
    "(QUARRY_INGEST__ON_ERROR=skip, the default) and the rest is written; 130 interrupted (SIGINT or "
    "SIGTERM): the batch in flight was finished (a second signal abandons it) and the report says how "
    "many documents were kept."
)


@dataclass
class Options:
    """What ``quarry ingest`` was asked (see its ``--help``)."""

    as_json: bool = False
    prune: bool = False
    dry_run: bool = False
    on_error: str = "skip"
    engine: str = "local"  # or "ray": indexing.ray_engine
    address: str | None = None  # the Ray cluster (None: RAY_ADDRESS, else a local Ray)
    workers: int | None = None  # most embedding actors on Ray (None: as the cluster allows)
    gpus_per_worker: float = 0.0  # GPUs each Ray embedding actor reserves


@dataclass
class _Stop:
    """Signals seen during the run: the first stops after the batch, the second abandons it."""

    signals: list[str] = field(default_factory=list)

    def __call__(self) -> bool:
        return bool(self.signals)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class _Rate(ProgressColumn):
    """Documents per second over the bar's recent window."""

    def render(self, task: Task) -> Text:
        return Text("" if task.speed is None else f"{task.speed:,.0f} docs/s")


class Run:
    """One ``quarry ingest`` run: the source, the service, the output, the exit code."""

    def __init__(self, quarry: Any, name: str, source: Source, options: Options, out: Console, err: Console) -> None:
        """Bind the parts; nothing is read or written until :meth:`execute`."""
        self.quarry, self.name, self.source, self.options = quarry, name, source, options
        self.out, self.err = out, err
        self.stop = _Stop()
        self.seen: set[str] = set()
        self.started = time.monotonic()
        self.done = 0
        self.kept = 0  # documents of the batches written (or found unchanged) so far
        self._writing = False  # a second signal abandons a batch only while batches are written
        self.report: Any = None  # the pipeline's IngestReport once the run has written

    # --- output -------------------------------------------------------------------------
    def emit(self, event: str, **fields: Any) -> None:
        """One JSON line on stdout (``--json`` only)."""
        if self.options.as_json:
            emit_json(self.out, self.name, event, **fields)

    def note(self, text: str) -> None:
        """A plain line on stderr, never wrapped."""
        self.err.print(text, soft_wrap=True, highlight=False, markup=False)

    def _rate_eta(self) -> tuple[float, float | None]:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = self.done / elapsed
        left = max(self.source.total - self.done, 0)
        return rate, (left / rate if rate > 0 else None)

    def _advance(self, n: int) -> None:
        self.kept += n
        src = self.source.report  # files (documents of a JSONL source) done, skipped ones included
        self.done = max(self.done + n, src.read + len(src.errors) + len(src.empty))
        rate, eta = self._rate_eta()
        fields = {"done": self.done, "total": self.source.total, "rate_docs_s": round(rate, 1)}
        self.emit("progress", **fields, eta_s=None if eta is None else round(eta, 1))

    @contextmanager
    def _progress(self) -> Iterator[Callable[[int], None]]:
        if self.err.is_terminal and not self.options.as_json:
            columns = (
                TextColumn(f"[bold]ingest {escape(self.name)}"), BarColumn(), MofNCompleteColumn(), _Rate(),
                TextColumn("ETA"), TimeRemainingColumn(), TimeElapsedColumn(),
            )
            with Progress(*columns, console=self.err, transient=False) as bar:
                task = bar.add_task("documents", total=self.source.total)

                def advance(n: int) -> None:
                    self._advance(n)
                    bar.update(task, completed=self.done)

                yield advance
            return

        def log_line(n: int) -> None:
            self._advance(n)
            rate, eta = self._rate_eta()
            eta_text = "?" if eta is None else f"{eta:.0f}s"
            self.note(
                f"{_now()} ingest {self.name}: {self.done}/{self.source.total} documents, "
                f"{rate:,.1f} docs/s, ETA {eta_text}"
            )

        yield log_line

    # --- signals ------------------------------------------------------------------------
    @contextmanager
    def _signals(self) -> Iterator[None]:
        def handler(signum: int, _frame: FrameType | None) -> None:
            # Only a flag, a raise and a plain write here: a second signal can come while the
            # first one's handler runs, and a KeyboardInterrupt inside rich's lazy imports (its
            # console output) left a half-imported module behind (exit 1, a traceback).
            name = signal.Signals(signum).name
            self.stop.signals.append(name)
            if len(self.stop.signals) > 1 and self._writing:
                raise KeyboardInterrupt(name)  # abandons the batch in flight: it is rolled back
            line = f"{_now()} {name}: finishing the batch in flight, then stopping (again to abandon it)\n"
            with suppress(OSError):
                os.write(2, line.encode())

        def stopping(signum: int, _frame: FrameType | None) -> None:
            # Asked to stop already: the batches are committed and the process is closing its
            # stores; another signal is recorded, not a kill that would lose the report's exit code.
            self.stop.signals.append(signal.Signals(signum).name)

        previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, h in previous.items():
                signal.signal(s, stopping if self.stop.signals else h)

    # --- the run ------------------------------------------------------------------------
    def execute(self) -> int:
        """Ingest (or, with ``--dry-run``, only read), prune if asked, report; the exit code.

        Raises:
            QuarryError: Bad input or a failed dependency (the caller maps it to an exit code).
        """
        if self.options.dry_run:
            return self._dry_run()
        report, abandoned = None, False
        with self._signals():  # until the report is out: a signal after the batches only stops the prune
            try:
                self._writing = True
                with self._progress() as advance:
                    seen = self.seen if self.options.prune else None  # ids kept only to prune
                    report = self._upsert(advance, seen)
            except KeyboardInterrupt:
                abandoned = True
            finally:
                self._writing = False
            self.report = report
            interrupted = abandoned or bool(self.stop.signals)
            pruned: list[str] = []
            if self.options.prune and not interrupted:
                pruned = self._stale_ids()
                if pruned:
                    self.quarry.delete_documents(self.name, pruned)
            return self._report(report, interrupted=interrupted, abandoned=abandoned, pruned=pruned)

    def _upsert(self, advance: Callable[[int], None], seen: set[str] | None) -> Any:
        if self.options.engine != "ray":
            return self.quarry.upsert_stream(self.name, self.source, advance, stop=self.stop, seen=seen)
        from indexing.ray_engine import ray_session, upsert_with_ray

        with ray_session(self.options.address):
            return upsert_with_ray(
                self.quarry, self.name, self.source, advance, stop=self.stop, seen=seen,
                workers=self.options.workers, gpus_per_worker=self.options.gpus_per_worker,
            )

    def _stale_ids(self) -> list[str]:
        """Stored documents not in the source (a file that failed to parse keeps its document)."""
        kept = set(self.seen)
        if self.source.format == "folder":
            kept.update(Path(p).relative_to(self.source.path).as_posix() for p, _ in self.source.report.errors)
        return [d for d in self.quarry.docstore.document_ids(self.name) if d not in kept]

    def _dry_run(self) -> int:
        """Read the source, compare with the collection's hashes; nothing is written."""
        from itertools import islice

        from indexing.document_plan import document_hash

        exists = self.name in self.quarry.docstore.list_collections()
        cfg = self.quarry.get_collection(self.name) if exists else None
        counts = {"added": 0, "updated": 0, "unchanged": 0}
        docs = iter(self.source)
        with self._progress() as advance:
            while batch := list(islice(docs, 512)):
                self.seen.update(d.id for d in batch)
                stored = self.quarry.docstore.document_hashes(self.name, [d.id for d in batch]) if cfg else {}
                for d in batch:
                    state = stored.get(d.id)
                    if state is None or cfg is None:
                        counts["added"] += 1
                    else:
                        counts["unchanged" if state == document_hash(d, cfg) else "updated"] += 1
                advance(len(batch))
        stale = self._stale_ids() if cfg is not None and self.options.prune else []
        return self._report(None, interrupted=False, abandoned=False, pruned=stale, would=counts)

    def _report(
        self, report: Any, *, interrupted: bool, abandoned: bool, pruned: list[str], would: dict[str, int] | None = None
    ) -> int:
        src = self.source.report
        code = EXIT_INTERRUPTED if interrupted else EXIT_PARTIAL if src.errors else EXIT_OK
        kept = report.documents if report is not None else self.kept  # abandoned: the batches before it
        added, updated = getattr(report, "added", 0), getattr(report, "updated", 0)
        body: dict[str, Any] = report_of(
            status={EXIT_OK: "ok", EXIT_PARTIAL: "partial", EXIT_INTERRUPTED: "interrupted"}[code],
            exit_code=code, engine=self.options.engine, dry_run=self.options.dry_run, total=self.source.total,
            read=src.read, skipped=len(src.errors), errors=[{"path": p, "reason": r} for p, r in src.errors],
            not_read=list(src.not_read), empty=list(src.empty), kept=kept, added=added, updated=updated,
            unchanged=getattr(report, "unchanged", 0), written=added + updated, embedded=getattr(report, "embedded", 0),
            chunks_written=getattr(report, "chunks_written", 0), truncated=getattr(report, "truncated", 0),
            pruned=0 if would is not None else len(pruned), abandoned_batch=abandoned, signals=list(self.stop.signals),
            elapsed_s=round(time.monotonic() - self.started, 3),
        )
        if would is not None:
            body |= {f"would_{k}": v for k, v in would.items()} | {"would_prune": pruned}
        self.emit("report", **body)
        if not self.options.as_json:
            self._say(body, report, pruned)
        return code

    def _say(self, body: dict[str, Any], report: Any, pruned: list[str]) -> None:
        for error in body["errors"]:
            self.note(f"skipped {error['path']}: {error['reason']}")
        if body["not_read"]:
            self.note(f"not read ({len(body['not_read'])} files of other formats): {', '.join(body['not_read'])}")
        if body["empty"]:
            self.note(f"empty ({len(body['empty'])} files without text): {', '.join(body['empty'])}")
        if self.options.dry_run:
            self.out.print(
                f"dry run {self.name}: {body['read']} documents read; would add {body['would_added']}, update "
                f"{body['would_updated']}, leave {body['would_unchanged']} unchanged; "
                f"{len(body['errors'])} files skipped" + (
                    f"; --prune would delete {len(body['would_prune'])}: {', '.join(body['would_prune'])}"
                    if self.options.prune else ""
                ),
                soft_wrap=True, highlight=False, markup=False,
            )
            return
        if body["status"] == "interrupted":
            self.note(
                f"interrupted ({', '.join(body['signals']) or 'signal'}): kept {body['kept']} documents"
                + ("; the batch in flight was abandoned" if body["abandoned_batch"] else "")
            )
        if pruned:
            self.note(f"pruned {len(pruned)} documents not in the source: {', '.join(pruned)}")
        if report is None:
            return
        counts = self.quarry.describe(self.name)
        self.out.print(
            f"[green]ingested[/] {escape(self.name)}: {report.added} added, {report.updated} updated, "
            f"{report.unchanged} unchanged; {report.embedded} chunks embedded "
            f"({report.truncated} truncated) in {report.elapsed_s:.1f}s; {len(body['errors'])} files skipped; "
            f"collection has {counts['documents']} documents, {counts['chunks']} chunks"
        )


def emit_json(out: Console, collection: str, event: str, **fields: Any) -> None:
    """One ``--json`` event line (``event``, ``time``, ``collection``, then ``fields``) on ``out``, flushed."""
    line = json.dumps({"event": event, "time": _now(), "collection": collection, **fields}, ensure_ascii=False)
    out.file.write(line + "\n")
    out.file.flush()


def exit_code_of(exc: QuarryError) -> int:
    """2 for bad input and errors a retry will not fix, 3 for an unavailable dependency (retryable)."""
    return EXIT_UNAVAILABLE if exc.retryable else EXIT_BAD_INPUT


def fail_json(name: str, exc: QuarryError) -> None:
    """The ``{"event": "error", ...}`` line of a failed ``--json`` run."""
    line = {
        "event": "error", "time": _now(), "collection": name, "type": type(exc).__name__, "message": str(exc),
        "retryable": exc.retryable, "exit_code": exit_code_of(exc),
    }
    sys.stdout.write(json.dumps(line, ensure_ascii=False) + "\n")
    sys.stdout.flush()
