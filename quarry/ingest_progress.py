"""An ingestion job's record: its resume point, its progress counters and how they are shown.

:class:`Checkpoint` is a job's ``cursor``; :class:`JobTracker` writes the counters of the batch
in flight; :func:`progress_of` derives the rate, ETA and the files skipped for the API.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from indexing.docstore import Job
from indexing.document_rules import SourceDocument
from indexing.pipeline import Abandoned
from quarry.service import Quarry

KIND = "ingest"
RESUMABLE = ("queued", "running", "cancelling")
MAX_ERRORS_KEPT = 100  # errors by path kept in a job's record (the count is exact)
COUNTERS = ("added", "updated", "unchanged", "embedded", "chunks_written", "chunks_deleted", "truncated")
IN_FLIGHT = ("batch_documents", "batch_chunks", "batch_embedded")  # the batch in flight; 0 between batches


@dataclass
class Checkpoint:
    """A job's resume point (its ``cursor``, JSON).

    Attributes:
        position: Documents of the source written (or found unchanged) by committed batches.
        errors: ``[path, reason]`` of files skipped so far (the first :data:`MAX_ERRORS_KEPT`).
        errors_total: How many files were skipped.
        run_started: Unix seconds the current run (first or resumed) started.
        run_position: ``position`` when it started (the rate is over this run's documents).
        not_read: Paths of files of formats not read (the first :data:`MAX_ERRORS_KEPT`).
        empty: Paths of files without text (the first :data:`MAX_ERRORS_KEPT`).
    """

    position: int = 0
    errors: list[list[str]] = field(default_factory=list)
    errors_total: int = 0
    not_read: list[str] = field(default_factory=list)
    empty: list[str] = field(default_factory=list)
    run_started: float = 0.0
    run_position: int = 0

    @classmethod
    def parse(cls, cursor: str | None) -> Checkpoint:
        """The checkpoint a cursor holds (a fresh one for ``None``)."""
        if not cursor:
            return cls()
        raw = json.loads(cursor)
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})

    def dump(self) -> str:
        """The cursor to store."""
        return json.dumps(self.__dict__, ensure_ascii=False)


def progress_of(job: Job) -> dict[str, Any]:
    """``rate_docs_s``, ``eta_s``, ``errors``, ``not_read`` and ``empty`` of an ingest job (empty for others).

    The rate is documents per second of the current run (since it started or resumed), the
    batch in flight counted by the share of its chunks embedded; the ETA is the documents left
    at that rate (``None`` before the first chunks are embedded, or when done).
    """
    if job.kind != KIND:
        return {"rate_docs_s": None, "eta_s": None, "errors": [], "not_read": [], "empty": []}
    cp = Checkpoint.parse(job.cursor)
    c = job.counters
    total = c.get("total", 0)
    chunks, embedded = c.get("batch_chunks", 0), c.get("batch_embedded", 0)
    in_flight = c.get("batch_documents", 0) * embedded / chunks if chunks else 0.0  # the batch's share embedded
    done = c.get("done", 0) + in_flight
    elapsed = job.updated_at - cp.run_started if cp.run_started else 0.0
    moved = cp.position + in_flight - cp.run_position
    rate = moved / elapsed if elapsed > 0 and moved > 0 else None
    eta = None if rate is None or job.state not in RESUMABLE else max(total - done, 0) / rate
    return {
        "rate_docs_s": None if rate is None else round(rate, 2),
        "eta_s": None if eta is None else round(eta, 1),
        "errors": [{"path": p, "reason": r} for p, r in cp.errors],
        "not_read": list(cp.not_read),
        "empty": list(cp.empty),
    }


class JobTracker:
    """A running job's progress inside its batch in flight, written to its record at most every ``interval_s``.

    Its :meth:`watch` (an :data:`indexing.pipeline.Watch`) raises
    :class:`~indexing.pipeline.Abandoned` between embedding sub-batches once the job is
    cancelled: asked through this process (seen at once) or on another replica (seen in the
    record that each progress write returns).
    """

    def __init__(  # noqa: PLR0913 - the job's parts
        self, cancel_asked: Callable[[str], bool], view: Quarry, job_id: str, counters: dict[str, int],
        interval_s: float,
    ) -> None:
        """Track ``counters`` (the job's, updated in place); ``cancel_asked(job_id)``: cancelled here."""
        self.cancel_asked, self.view, self.job_id, self.counters = cancel_asked, view, job_id, counters
        self.interval_s = interval_s
        self.last = time.monotonic()
        self.cancelled = False
        self.writes = 0  # progress writes made (a test's count of the cadence)

    def reading(self, docs: Iterator[SourceDocument]) -> Iterator[SourceDocument]:
        """``docs``, counting each one read (parsed) as it goes.

        Raises:
            Abandoned: The job was cancelled while its next batch is read (a folder's files parsed).
        """
        for doc in docs:
            self.counters["parsed"] = self.counters.get("parsed", 0) + 1
            self._maybe_write()
            if self.cancelled or self.cancel_asked(self.job_id):
                raise Abandoned(self.job_id)
            yield doc

    def begin(self, documents: int) -> None:
        """A batch of ``documents`` goes to the pipeline."""
        self.counters |= {"batch_documents": documents, "batch_chunks": 0, "batch_embedded": 0}

    def watch(self, stage: str, done: int, total: int) -> None:
        """The pipeline's progress inside the batch (:data:`indexing.pipeline.Watch`).

        Raises:
            Abandoned: The job was cancelled and chunks of the batch are still to embed.
        """
        if stage == "planned":
            self.counters |= {"batch_chunks": total, "batch_embedded": 0}
        elif stage == "embedding":
            self.counters["batch_embedded"] = done
        elif stage == "written":
            return  # the checkpoint that follows records it
        self._maybe_write()
        if done < total and (self.cancelled or self.cancel_asked(self.job_id)):
            raise Abandoned(self.job_id)

    def _maybe_write(self) -> None:
        now = time.monotonic()
        if now - self.last < self.interval_s:
            return
        self.last = now
        self.writes += 1
        current = self.view.docstore.update_job(self.job_id, counters=dict(self.counters))
        self.cancelled = self.cancelled or current.state == "cancelling"
