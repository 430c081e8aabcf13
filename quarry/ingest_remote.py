"""``quarry ingest --server URL``: submit an ingest job to a running server and follow it.

By default PATH is read here, with the same :class:`~indexing.sources.Source` as a local run (a
``.jsonl`` file, a BEIR folder, a folder of files in any format read locally), and its documents
are streamed to the server as NDJSON (``POST /v1/collections/{name}/jobs``, ``Content-Type:
application/x-ndjson``; a generator, so memory holds one chunk): a nightly run needs no downtime
on the embedded default. Files skipped here are named in the report and make the run partial.
With ``--server-path`` the path is the server's (under its ``QUARRY_INGEST__ROOTS``; a relative
one is taken from its first root) and the server reads it. The job is followed by polling
``GET /v1/jobs/{id}``; output and exit codes are those of a local run
(:mod:`quarry.ingest_run`): progress lines (``--json``: progress events, then a report), 0 done,
2 bad input (the server's 4xx), 3 unavailable (server unreachable, 503, or a job failed on an
unavailable dependency), 4 partial (files skipped), 130 interrupted (SIGINT or SIGTERM cancels
the job at its next embedding sub-batch; the batches written stay).
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import httpx
from rich.console import Console

from indexing.sources import Source
from quarry.ingest_run import (
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PARTIAL,
    EXIT_UNAVAILABLE,
    Options,
    _now,
    emit_json,
    report_of,
)

RETRYABLE_TYPES = ("StoreUnavailable", "StoreTimeout", "EmbeddingUnavailable", "Overloaded", "RateLimited")
FINAL = ("done", "partial", "failed", "cancelled")
NDJSON = "application/x-ndjson"


def ndjson_body(source: Source, chunk_bytes: int = 1 << 16) -> Iterator[bytes]:
    """The source's documents as NDJSON lines, in chunks of about ``chunk_bytes`` (an upload's body).

    Each line is ``{"id", "text", "title"?, "metadata"?, "sections"?}``, as a ``.jsonl``
    source's; ``sections`` carries a PDF's pages and a DOCX's headings (their offsets and
    ``page``/``section``), so the server chunks and hashes the document as a local run does.

    Raises:
        InvalidDocument: Under ``on_error="fail"``, a file that cannot be read (the upload stops).
    """
    buf = bytearray()
    for doc in source:
        line: dict[str, Any] = {"id": doc.id, "text": doc.text}
        if doc.title:
            line["title"] = doc.title
        if doc.metadata:
            line["metadata"] = doc.metadata
        if doc.sections:
            line["sections"] = [{"start": sec.start, "metadata": sec.metadata} for sec in doc.sections]
        buf += json.dumps(line, ensure_ascii=False).encode("utf-8") + b"\n"
        if len(buf) >= chunk_bytes:
            yield bytes(buf)
            buf.clear()
    if buf:
        yield bytes(buf)


class RemoteError(Exception):
    """The server refused or could not be reached; ``code`` is the exit status."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class RemoteIngest:
    """One ``quarry ingest --server`` run."""

    def __init__(  # noqa: PLR0913 - the run's parts
        self, client: httpx.Client, name: str, path: str, options: Options, out: Console, err: Console,
        poll_s: float = 1.0, upload: Source | None = None,
    ) -> None:
        """Bind the parts; nothing is sent until :meth:`execute`.

        ``upload``: a local source whose documents are streamed to the server (``path`` is then
        only named in messages); ``None``: ``path`` is the server's.
        """
        self.client, self.name, self.path, self.options = client, name, path, options
        self.upload = upload
        self.out, self.err = out, err
        self.poll_s = poll_s
        self.signals: list[str] = []
        self.started = time.monotonic()

    def emit(self, event: str, **fields: Any) -> None:
        """One JSON line on stdout (``--json`` only)."""
        if self.options.as_json:
            emit_json(self.out, self.name, event, **fields)

    def note(self, text: str) -> None:
        """A timestamped plain line on stderr, never wrapped."""
        self.err.print(f"{_now()} {text}", soft_wrap=True, highlight=False, markup=False)

    def _call(self, method: str, url: str, **kwargs: Any) -> dict[str, Any]:
        try:
            resp = self.client.request(method, url, **kwargs)
        except httpx.HTTPError as exc:
            raise RemoteError(f"server {self.client.base_url} cannot be reached: {exc}", EXIT_UNAVAILABLE) from exc
        body: dict[str, Any] = resp.json() if resp.content else {}
        if resp.status_code >= 400:
            error = body.get("error", {}) if isinstance(body, dict) else {}
            retryable = bool(error.get("retryable")) or resp.status_code >= 500
            message = f"{error.get('type', resp.status_code)}: {error.get('message', resp.text)}"
            raise RemoteError(message, EXIT_UNAVAILABLE if retryable else EXIT_BAD_INPUT)
        return body

    @contextmanager
    def _signals(self) -> Iterator[None]:
        def handler(signum: int, _frame: FrameType | None) -> None:
            self.signals.append(signal.Signals(signum).name)

        previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, h in previous.items():
                signal.signal(s, h)

    def execute(self) -> int:
        """Submit, follow, report; the exit code.

        Raises:
            RemoteError: The submission was refused, or the server stopped answering.
        """
        url = f"/v1/collections/{self.name}/jobs"
        if self.upload is None:
            body = {"path": self.path, "on_error": self.options.on_error, "prune": self.options.prune}
            job = self._call("POST", url, json=body)
        else:
            params = {"on_error": self.options.on_error, "prune": str(self.options.prune).lower()}
            self.note(f"uploading the documents of {self.path} ({self.upload.total} {self._unit()}) "
                      f"to {self.client.base_url}")
            job = self._call("POST", url, params=params, headers={"Content-Type": NDJSON},
                             content=ndjson_body(self.upload))
            src = self.upload.report
            left = ((len(src.errors), "files skipped"), (len(src.not_read), "files not read"),
                    (len(src.empty), "empty files"))
            self.note(f"uploaded {src.read} documents" + "".join(f"; {n} {what}" for n, what in left if n))
        self.note(f"job {job['id']} submitted to {self.client.base_url}")
        last: tuple[int, ...] = ()
        cancelled = False
        with self._signals():
            while job["state"] not in FINAL:
                if self.signals and not cancelled:
                    self.note(f"{self.signals[0]}: cancelling job {job['id']} (its batch in flight is dropped)")
                    self._call("DELETE", f"/v1/jobs/{job['id']}")
                    cancelled = True
                time.sleep(self.poll_s)
                job = self._call("GET", f"/v1/jobs/{job['id']}")
                c = job["counters"]
                moved = tuple(c.get(k, 0) for k in ("done", "parsed", "batch_chunks", "batch_embedded"))
                if moved != last:  # a batch committed, or progress inside the batch in flight
                    last = moved
                    self._progress(job)
        return self._report(job)

    def _unit(self) -> str:
        return "files" if self.upload is not None and self.upload.format == "folder" else "documents"

    def _progress(self, job: dict[str, Any]) -> None:
        c = job["counters"]
        fields = {"job": job["id"], "done": c.get("done", 0), "total": c.get("total", 0),
                  "batch_chunks": c.get("batch_chunks", 0), "batch_embedded": c.get("batch_embedded", 0),
                  "rate_docs_s": job.get("rate_docs_s"), "eta_s": job.get("eta_s")}
        self.emit("progress", **fields)
        if not self.options.as_json:
            rate = job.get("rate_docs_s") or 0.0
            eta = "?" if job.get("eta_s") is None else f"{job['eta_s']:.0f}s"
            inside = (f" (batch in flight: {fields['batch_embedded']}/{fields['batch_chunks']} chunks embedded)"
                      if fields["batch_chunks"] else "")
            self.note(f"ingest {self.name} (job {job['id']}): {fields['done']}/{fields['total']} documents{inside}, "
                      f"{rate:,.1f} docs/s, ETA {eta}")

    def _report(self, job: dict[str, Any]) -> int:
        """The report (:data:`quarry.ingest_run.REPORT_FIELDS`, as a local run's) and the exit code."""
        state, c, error = job["state"], dict(job["counters"]), job.get("error") or ""
        src = self.upload.report if self.upload is not None else None
        local = [] if src is None else [{"path": p, "reason": r} for p, r in src.errors]
        errors = local + list(job.get("errors", []))
        if local:  # files skipped here, before the upload: the run is partial
            state = "partial" if state == "done" else state
        if state == "failed":
            code = EXIT_UNAVAILABLE if error.split(":", 1)[0] in RETRYABLE_TYPES else EXIT_BAD_INPUT
        else:
            code = {"done": EXIT_OK, "partial": EXIT_PARTIAL, "cancelled": EXIT_INTERRUPTED}[state]
        status = {EXIT_OK: "ok", EXIT_PARTIAL: "partial", EXIT_INTERRUPTED: "interrupted"}.get(code, "failed")
        counts = {k: int(c.get(k, 0)) for k in ("added", "updated", "unchanged", "embedded", "chunks_written",
                                               "truncated", "pruned")}
        body = report_of(
            status=status, exit_code=code, job=job["id"], engine="server", dry_run=False,
            total=self.upload.total if self.upload is not None else int(c.get("total", 0)),
            read=int(c.get("read", 0)), skipped=len(local) + int(c.get("skipped", 0)), errors=errors,
            not_read=(list(src.not_read) if src is not None else []) + list(job.get("not_read", [])),
            empty=(list(src.empty) if src is not None else []) + list(job.get("empty", [])),
            kept=int(c.get("read", 0)), written=counts["added"] + counts["updated"], **counts,
            abandoned_batch=state == "cancelled", signals=list(self.signals), error=error or None,
            elapsed_s=round(time.monotonic() - self.started, 3),
        )
        self.emit("report", **body)
        if not self.options.as_json:
            for e in errors:
                self.note(f"skipped {e['path']}: {e['reason']}")
            if body["not_read"]:
                self.note(f"not read ({len(body['not_read'])} files of other formats): {', '.join(body['not_read'])}")
            if body["empty"]:
                self.note(f"empty ({len(body['empty'])} files without text): {', '.join(body['empty'])}")
            if state == "failed":
                self.note(f"job {job['id']} failed: {error}")
            self.out.print(
                f"{state} {self.name} (job {job['id']}): {body['added']} added, {body['updated']} updated, "
                f"{body['unchanged']} unchanged; {body['embedded']} chunks embedded; "
                f"{body['skipped']} files skipped" + (f"; pruned {body['pruned']}" if body["pruned"] else ""),
                soft_wrap=True, highlight=False, markup=False,
            )
        return code
