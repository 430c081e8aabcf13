"""Ingestion jobs over REST: run in the server process, checkpointed per batch, resumed after a crash.

``POST /v1/collections/{name}/jobs`` names a source on the server's disk (a BEIR folder, a JSONL
file or a folder of files) under one of ``QUARRY_INGEST__ROOTS``; :meth:`IngestJobs.submit`
records a job (kind ``ingest``) in the state of record's jobs table and runs it in a thread of
this process. The job's state machine::

    queued -> running -> done | partial (files skipped) | failed | cancelled
    running -> cancelling (DELETE /v1/jobs/{id}) -> cancelled (at the next embedding sub-batch)

**Progress inside a batch.** A batch of ``QUARRY_INGEST__BATCH_SIZE`` documents is read, chunked,
embedded ``QUARRY_EMBEDDING__BATCH_SIZE`` texts at a time, then written. While it runs, the job's
counters say how far it got (:class:`quarry.ingest_progress.JobTracker`): ``parsed`` (documents read from the source,
the batch in flight included), ``batch_documents``, ``batch_chunks`` (its chunks to embed) and
``batch_embedded`` (of those, embedded so far); they are written to the job's record at most
every ``QUARRY_INGEST__PROGRESS_INTERVAL_S`` (1 s). ``done``, ``embedded``, ``chunks_written``
and the rest count committed batches only.

**Cancel.** ``DELETE /v1/jobs/{id}`` marks the job ``cancelling``; the job stops at the next
embedding sub-batch of the batch in flight (asked on this server: at once; on another replica:
seen at the next progress write), drops that batch (nothing of it is written: a batch is
atomic) and ends ``cancelled``; the batches committed before stay. A batch whose texts are all
embedded is written first.

**Checkpoints.** After each committed batch (atomic in the docstore: ``Ingestor.upsert``) the
job's ``cursor`` records how many documents of the source are written (:class:`quarry.ingest_progress.Checkpoint`,
JSON) and its ``counters`` the cumulative counts (read, written, embedded...). A source is read
in a fixed order (a JSONL file's lines, a folder's sorted paths), so a resumed run skips that
many documents without sending them to the pipeline and carries on. A batch committed after the
last checkpoint (a kill between the two writes) is read again and found unchanged by its
content hash: no embedding call for what was written.

**Leases.** The thread that runs a job holds the job's lease (``claim_job``), renewed every
third of ``QUARRY_INGEST__JOB_LEASE_S``. A server killed mid-job stops renewing; the next
server (this one restarted, or a replica) finds the lease lapsed, at startup or in its periodic
scan, claims it (compare-and-set: one winner) and resumes. A server stopped cleanly finishes the
batch in flight and releases its leases, so a restart resumes at once.

**Uploads.** With ``Content-Type: application/x-ndjson`` the request's body is the source: it
is spooled to ``<data_dir>/jobs/<job_id>.jsonl`` (:mod:`quarry.ingest_upload`, bounded by
``QUARRY_INGEST__MAX_UPLOAD_BYTES``) and read as a ``.jsonl`` file, checkpoints and resume
included. The spool stays until the job ends (done, partial, failed or cancelled) and is then
removed; a server that resumes the job without seeing it (a replica with another data dir)
fails the job, saying so.

**Scope.** A job belongs to the tenant of the key that submitted it (``Quarry.get_job`` answers
404 to any other); it runs on that tenant's view of the service. A job of a shared collection
is recorded with the collection (tenant ``_shared``) and its tenant in ``params.tenant``; it
writes, and resumes, through that tenant's scope (:mod:`quarry.services.namespace`), and a
job without one is failed rather than resumed unscoped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

from indexing.docstore import DEFAULT_TENANT, Job
from indexing.document_rules import SourceDocument
from indexing.pipeline import Abandoned
from indexing.reindex_build import new_owner
from indexing.sources import Source, is_inside
from quarry.errors import Conflict, Forbidden, InvalidRequest, NotFound, QuarryError, clip
from quarry.ingest_progress import COUNTERS, IN_FLIGHT, KIND, MAX_ERRORS_KEPT, RESUMABLE, Checkpoint, JobTracker
from quarry.service import Quarry
from quarry.tenancy import SHARED

log = logging.getLogger(__name__)



def confine(path_text: str, roots: list[Path]) -> Path:
    """The source ``path_text`` names, resolved, if it lies under one of ``roots``.

    A relative path is taken relative to the first root. ``..`` segments and links are resolved
    before the check, so neither escapes a root; the check comes before any look at whether the
    path exists (no probing of the rest of the disk). A BEIR folder's ``corpus.jsonl`` (the file
    actually read) is checked the same way: a link in the folder to a file outside is refused.

    Raises:
        Forbidden: No roots are configured, or the path (or a BEIR folder's ``corpus.jsonl``)
            resolves outside all of them (403).
        InvalidRequest: The path is empty or holds a NUL byte, does not exist, or cannot be looked up
            (a name too long, a folder the server may not search: 400, never a 500).
    """
    if not roots:
        raise Forbidden(
            "this server reads no sources from its disk: set QUARRY_INGEST__ROOTS to the folders it may read",
            reason="ingest_root",
        )
    if not path_text or "\x00" in path_text:
        raise InvalidRequest("source path must be a non-empty path without NUL bytes")
    resolved_roots = [Path(r).resolve() for r in roots]
    try:
        path = Path(path_text)
        path = (path if path.is_absolute() else resolved_roots[0] / path).resolve()
        if not is_inside(path, resolved_roots):
            raise Forbidden(f"source {clip(path_text)} is outside the server's ingest roots", reason="ingest_root")
        if not path.exists():
            raise InvalidRequest(f"source {clip(path_text)} does not exist under the ingest roots")
        corpus = path / "corpus.jsonl"  # a BEIR folder is read through this file: it must not link out
        if path.is_dir() and corpus.exists() and not is_inside(corpus.resolve(), resolved_roots):
            raise Forbidden(f"source {clip(path_text)}: its corpus.jsonl links outside the server's ingest roots",
                            reason="ingest_root")
    except OSError as exc:  # a name over NAME_MAX, a folder it may not search: the client's bad path, not a 500
        raise InvalidRequest(f"source {clip(path_text)} cannot be looked up: {exc.strerror or exc}") from exc
    return path


class IngestJobs:
    """The ingestion jobs of one server process (see the module docstring).

    Args:
        quarry: The root service (jobs run on their tenant's view of it).
    """

    def __init__(self, quarry: Quarry) -> None:
        """Bind to the service; nothing runs until :meth:`start` or :meth:`submit`."""
        self.quarry = quarry
        self.lease_s = quarry.settings.ingest.job_lease_s
        self._held: dict[str, tuple[str, threading.Thread]] = {}  # job id -> (owner, worker)
        self._lost: set[str] = set()  # jobs whose lease another process took
        self._cancels: set[str] = set()  # jobs cancelled through this process: their batch in flight stops
        self._guard = threading.Lock()
        self._stopping = threading.Event()
        self._ticker: threading.Thread | None = None

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Resume the jobs whose lease lapsed now, then keep renewing leases and looking for more.

        A docstore failure here does not stop the server from starting (searches may still be
        answered): it is logged and the ticker tries again every ``lease_s / 3``.
        """
        self._sweep_parts()
        try:
            self.resume_lapsed()
        except Exception:
            log.exception("ingest jobs: looking for lapsed jobs at startup failed; trying again in %.0f s",
                          self.lease_s / 3)
        self._ticker = threading.Thread(target=self._tick, name="ingest-jobs", daemon=True)
        self._ticker.start()

    def _sweep_parts(self, age_s: float = 3600.0) -> None:
        """Remove uploads a killed server left half-spooled (``*.part`` untouched for ``age_s``)."""
        cutoff = time.time() - age_s
        for part in self.spool_dir.glob("*.part") if self.spool_dir.is_dir() else ():
            try:
                if part.stat().st_mtime < cutoff:
                    part.unlink()
            except OSError:  # another replica's sweep got there first
                continue

    def close(self, timeout_s: float = 60.0) -> None:
        """Stop after the batches in flight; their jobs stay resumable and their leases are released."""
        self._stopping.set()
        deadline = time.monotonic() + timeout_s
        with self._guard:
            workers = [w for _, w in self._held.values()]
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))
        if self._ticker is not None:
            self._ticker.join(max(0.0, deadline - time.monotonic()))

    def _tick(self) -> None:
        while not self._stopping.wait(self.lease_s / 3):
            try:
                self._renew()
                self.resume_lapsed()
            except Exception:  # the docstore may be down for a while: try again next tick
                log.exception("ingest jobs: renewing leases or looking for lapsed jobs failed")

    def _renew(self) -> None:
        with self._guard:
            held = list(self._held.items())
        for job_id, (owner, _) in held:
            if not self.quarry.docstore.claim_job(job_id, owner, self.lease_s):
                log.warning("ingest job %s: its lease was taken by another process; stopping here", job_id)
                self._lost.add(job_id)

    def resume_lapsed(self) -> list[str]:
        """Claim and start every unfinished ingest job, of any tenant, whose lease is free or lapsed."""
        started = []
        tenants = {DEFAULT_TENANT, SHARED} | {t for t, _ in self.quarry.docstore.list_tenants()}
        for tenant in sorted(tenants):
            view = self.quarry.shared_view() if tenant == SHARED else self.quarry.for_tenant(tenant)
            for state in RESUMABLE:
                for job in view.docstore.list_jobs(state=state, limit=1000):
                    if job.kind != KIND or job.id in self._held or self._stopping.is_set():
                        continue
                    owner = new_owner()
                    if view.docstore.claim_job(job.id, owner, self.lease_s):
                        try:
                            writer = self._writer(view, job)
                        except QuarryError as exc:  # fails closed: never resumed without its tenant's scope
                            view.docstore.update_job(job.id, state="failed", error=exc.message)
                            view.docstore.release_job(job.id, owner)
                            continue
                        log.info("ingest job %s of %r (tenant %s): resuming from its checkpoint", job.id,
                                 job.collection, job.params.get("tenant", tenant))
                        self._launch(writer, job, owner)
                        started.append(job.id)
        return started

    # --- the REST verbs ------------------------------------------------------------------------
    def admit(self, view: Quarry, name: str) -> Quarry:
        """Check that ``view`` may start an ingest job of its collection ``name`` now; the view that writes it.

        A shared collection's job writes through the caller's scope (its tenant is in the job's
        ``params``, so a resumed job keeps it).

        Raises:
            CollectionNotFound: No such collection (a job does not create one).
            Conflict: Another ingest job of this collection (of this tenant) is unfinished (409).
        """
        writer = view.for_collection(name)
        writer.get_collection(name)
        tenant = writer.tenant_id if writer.ns.shared else None
        for state in RESUMABLE:
            for other in writer.docstore.list_jobs(collection=name, state=state, limit=1000):
                if other.kind == KIND and other.params.get("tenant") == tenant:
                    raise Conflict(f"ingest job {other.id} of collection {clip(name)} is {state}; "
                                   "wait for it or cancel it (DELETE /v1/jobs/{id})")
        return writer

    def submit(self, view: Quarry, name: str, path_text: str, *, on_error: str | None, prune: bool) -> Job:
        """Record an ingest job of ``view``'s collection ``name`` and start it here.

        Raises:
            CollectionNotFound: No such collection (a job does not create one).
            Forbidden: The path is outside the ingest roots, or none are configured.
            InvalidRequest: The path does not exist.
            Conflict: Another ingest job of this collection is unfinished (409).
        """
        writer = self.admit(view, name)
        path = confine(path_text, view.settings.ingest.roots)
        params = {"path": str(path), "on_error": on_error or view.settings.ingest.on_error, "prune": prune,
                  **_scope(writer)}
        return self._start(writer, writer.docstore.create_job(KIND, collection=name, params=params))

    @property
    def spool_dir(self) -> Path:
        """Where upload jobs' bodies are spooled: ``<data_dir>/jobs``."""
        return Path(self.quarry.settings.data_dir) / "jobs"

    def submit_upload(  # noqa: PLR0913 - the upload's parts
        self, view: Quarry, name: str, job_id: str, part: Path, size: int, *, on_error: str | None, prune: bool,
    ) -> Job:
        """Record an upload job whose body is spooled at ``part`` (``<job_id>.part``) and start it here.

        The spool becomes ``<job_id>.jsonl`` and stays until the job ends (done, partial,
        failed, cancelled); a server that resumes the job without it fails the job.

        Raises:
            CollectionNotFound, Forbidden, Conflict: As :meth:`admit` (the spool is removed).
        """
        try:
            writer = self.admit(view, name)  # again: another job may have started while the body streamed in
        except BaseException:
            part.unlink(missing_ok=True)
            raise
        spooled = part.with_suffix(".jsonl")
        params = {"upload": str(spooled), "upload_bytes": size, "on_error": on_error or view.settings.ingest.on_error,
                  "prune": prune, **_scope(writer)}
        job = writer.docstore.create_job(KIND, collection=name, params=params, job_id=job_id)
        part.replace(spooled)
        return self._start(writer, job)

    def _start(self, view: Quarry, job: Job) -> Job:
        owner = new_owner()
        view.docstore.claim_job(job.id, owner, self.lease_s)
        self._launch(view, job, owner)
        return job

    def cancel(self, view: Quarry, job_id: str) -> Job:
        """Ask a job to stop after its batch in flight (a job nobody runs is cancelled at once).

        Raises:
            NotFound: No such job of this tenant.
            Conflict: The job is not an ingest job, or has finished.
        """
        job = view.get_job(job_id)
        if job.kind != KIND:
            raise Conflict(f"job {clip(job_id)} is a {job.kind} job; only ingest jobs can be cancelled")
        if job.state not in RESUMABLE:
            raise Conflict(f"job {clip(job_id)} has finished ({job.state})")
        if job.state == "queued" and job.id not in self._held and view.docstore.claim_job(job.id, new_owner(), 1.0):
            drop_spool(job)
            return view.docstore.update_job(job.id, state="cancelled")
        cancelling = view.docstore.update_job(job.id, state="cancelling")
        with self._guard:
            if job.id in self._held:
                self._cancels.add(job.id)
        return cancelling

    def _writer(self, view: Quarry, job: Job) -> Quarry:
        """The view a resumed job writes through: a shared collection's job, its tenant's scope (fails closed)."""
        if view.tenant_id != SHARED:
            return view
        return self.quarry.scoped(str(job.params.get("tenant", "")))  # Forbidden without one: the job fails

    # --- running -------------------------------------------------------------------------------
    def _launch(self, view: Quarry, job: Job, owner: str) -> None:
        worker = threading.Thread(target=self._work, args=(view, job, owner), name=f"ingest-{job.id[:8]}",
                                  daemon=True)
        with self._guard:
            self._held[job.id] = (owner, worker)
        worker.start()

    def _work(self, view: Quarry, job: Job, owner: str) -> None:
        try:
            self._run(view, job)
        except QuarryError as exc:
            log.warning("ingest job %s of %r failed: %s", job.id, job.collection, exc.message)
            view.docstore.update_job(job.id, state="failed", error=f"{type(exc).__name__}: {exc.message}")
        except Exception as exc:  # recorded in the job, and logged with its traceback
            log.exception("ingest job %s of %r failed", job.id, job.collection)
            view.docstore.update_job(job.id, state="failed", error=f"{type(exc).__name__}: {exc}")
        finally:
            with self._guard:
                self._held.pop(job.id, None)
                self._cancels.discard(job.id)
            lost = job.id in self._lost
            self._lost.discard(job.id)
            view.docstore.release_job(job.id, owner)
            current = None if lost else view.docstore.get_job(job.id)
            if current is not None and current.state not in RESUMABLE:  # ended: an upload's spool goes
                drop_spool(current)

    def _run(self, view: Quarry, job: Job) -> None:
        """Run (or resume) one job to its end, a cancel, a lost lease or this server's stop."""
        name = job.collection or ""
        params = job.params
        settings = view.settings.ingest
        source = self._source(view, job)
        cp = Checkpoint.parse(job.cursor)
        cp.run_started, cp.run_position = time.time(), cp.position
        counters = {**job.counters, "total": source.total, "resumed": job.counters.get("resumed", 0) + bool(job.cursor)}
        docs = iter(source)
        seen: set[str] | None = set() if params.get("prune") else None
        for doc in islice(docs, cp.position):  # written by earlier runs: skipped, never sent to the pipeline
            if seen is not None:
                seen.add(doc.id)
        counters |= {"parsed": cp.position, **dict.fromkeys(IN_FLIGHT, 0)}
        self._checkpoint(view, job.id, counters, source, cp, state="running")
        tracker = JobTracker(self.cancel_asked, view, job.id, counters, settings.progress_interval_s)
        wrote = False
        try:
            for batch in _batches(tracker.reading(docs), settings.batch_size):
                if self._should_stop(view, job.id):
                    return
                tracker.begin(len(batch))
                report = view.upsert_batch(name, batch, tracker.watch)
                counters |= dict.fromkeys(IN_FLIGHT, 0)
                wrote = wrote or report.chunks_written > 0
                for key in COUNTERS:
                    counters[key] = counters.get(key, 0) + int(getattr(report, key))
                if seen is not None:
                    seen.update(d.id for d in batch)
                cp.position += len(batch)
                self._checkpoint(view, job.id, counters, source, cp)
        except Abandoned:  # cancelled while a batch was read or embedded: nothing of that batch written
            counters |= {"parsed": cp.position, **dict.fromkeys(IN_FLIGHT, 0)}
            self._checkpoint(view, job.id, counters, source, cp, state="cancelled")
            log.info("ingest job %s of %r: cancelled inside a batch; %d documents kept", job.id, name, cp.position)
            return
        if self._should_stop(view, job.id):
            return
        self._finish(view, job, source, cp, counters, seen, wrote)

    @staticmethod
    def _source(view: Quarry, job: Job) -> Source:
        """The job's source: its path (confined to the roots again) or its upload's spool.

        Raises:
            InvalidRequest: The path left the roots or is gone; the spool is not on this
                server's disk (another replica's data dir); a malformed line (numbered).
        """
        params, settings = job.params, view.settings.ingest
        limits = {"on_error": params.get("on_error", settings.on_error),
                  "max_document_chars": settings.max_document_chars, "max_token_chars": settings.max_token_chars}
        if "upload" not in params:
            path = confine(params["path"], settings.roots)  # again: the roots may have changed since
            return Source(path, **limits, confine=[Path(r).resolve() for r in settings.roots])
        spooled = Path(params["upload"])
        if not spooled.is_file():
            raise InvalidRequest(
                f"the uploaded source of job {job.id} is not on this server's disk ({spooled} is missing): it was "
                "spooled by another server whose data dir this one does not share, or removed; upload it again"
            )
        try:
            return Source(spooled, **limits)
        except InvalidRequest as exc:  # the line number stays; the spool's path is the server's business
            raise type(exc)(exc.message.replace(str(spooled), "uploaded body")) from exc

    def _finish(  # noqa: PLR0913 - the run's state
        self, view: Quarry, job: Job, source: Source, cp: Checkpoint, counters: dict[str, int],
        seen: set[str] | None, wrote: bool,
    ) -> None:
        name = job.collection or ""
        if wrote:
            view.replan_index(name)
        if seen is not None:
            kept = seen | {Path(p).relative_to(source.path).as_posix() for p, _ in source.report.errors
                           if source.format == "folder"}
            stale = [d for d in view.document_ids(name) if d not in kept]
            if stale:
                view.delete_documents(name, stale)
            counters["pruned"] = len(stale)
        state = "partial" if source.report.errors else "done"
        self._checkpoint(view, job.id, counters, source, cp, state=state)
        log.info("ingest job %s of %r: %s (%s)", job.id, name, state, counters)

    def cancel_asked(self, job_id: str) -> bool:
        """Whether a cancel of ``job_id`` was asked through this process while it runs here."""
        return job_id in self._cancels

    def _should_stop(self, view: Quarry, job_id: str) -> bool:
        """After a batch: this server stops (the job stays resumable), a cancel, or a lost lease."""
        if self._stopping.is_set() or job_id in self._lost:
            return True
        current = view.docstore.get_job(job_id)
        if current is not None and current.state == "cancelling":
            view.docstore.update_job(job_id, state="cancelled")
            return True
        return False

    @staticmethod
    def _checkpoint(  # noqa: PLR0913 - the run's state
        view: Quarry, job_id: str, counters: dict[str, int], source: Source, cp: Checkpoint, *,
        state: str | None = None,
    ) -> None:
        """Record the resume point, the errors by path and the counters (``done`` counts skipped files too)."""
        src = source.report
        errors = [[p, r] for p, r in src.errors]
        cp.errors, cp.errors_total = errors[:MAX_ERRORS_KEPT], len(errors)
        cp.not_read, cp.empty = list(src.not_read[:MAX_ERRORS_KEPT]), list(src.empty[:MAX_ERRORS_KEPT])
        counters["read"] = cp.position
        counters["skipped"] = len(errors)
        counters["done"] = max(cp.position + len(errors) + len(src.empty), counters.get("done", 0))
        view.docstore.update_job(job_id, state=state, cursor=cp.dump(), counters=dict(counters))


def _batches(docs: Iterator[SourceDocument], size: int) -> Iterator[list[SourceDocument]]:
    while batch := list(islice(docs, size)):
        yield batch


def _scope(writer: Quarry) -> dict[str, str]:
    """What a job of ``writer``'s collection records of its scope: a shared collection's tenant."""
    return {"tenant": writer.tenant_id} if writer.ns.shared else {}


def drop_spool(job: Job) -> None:
    """Remove an upload job's spool (nothing for a path job, or a spool already gone)."""
    upload = job.params.get("upload")
    if upload:
        Path(upload).unlink(missing_ok=True)


def job_or_404(view: Quarry, job_id: str, collections: frozenset[str] | None) -> Job:
    """``view``'s job ``job_id`` if its collection is one the key may use (else 404, as another tenant's).

    Raises:
        NotFound: No such job for this key.
    """
    job = view.get_job(job_id)
    if collections is not None and job.collection is not None and job.collection not in collections:
        raise NotFound(f"job {clip(job_id)} does not exist")
    return job
