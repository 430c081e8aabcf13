"""Job routes: list a tenant's jobs, read one, submit an ingestion job (path or NDJSON upload), cancel."""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from indexing.collections import check_name_length
from indexing.docstore import DEFAULT_TENANT, Job
from quarry import errors as e
from quarry.api import access, errors
from quarry.api.deps import STORE_ERRORS, Service
from quarry.api.errors import error_responses
from quarry.api.models import IngestJobIn, JobOut, JobsOut
from quarry.ingest_jobs import IngestJobs, job_or_404
from quarry.ingest_progress import progress_of
from quarry.ingest_upload import is_upload_type, new_job_id, spool, upload_options
from quarry.service import Quarry

router = APIRouter()


JobState = Literal["queued", "running", "cancelling", "done", "partial", "failed", "cancelled"]


@router.get(
    "/v1/jobs", tags=["collections"], response_model=JobsOut,
    responses=error_responses(e.InvalidRequest, *STORE_ERRORS),
)
def list_jobs(  # noqa: PLR0913 - the filters
    request: Request, q: Service, collection: str | None = None, state: JobState | None = None,
    kind: Literal["ingest", "reindex"] | None = None, limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    """The jobs of the key's tenant, newest first, optionally of one collection, state or kind.

    Only the jobs the key may read are listed: ingest jobs for ``write`` or ``admin``, reindex
    jobs for ``admin``, and only of the collections the key may use. A tenant's jobs of shared
    collections (recorded with the shared collections, the tenant in ``params.tenant``) are
    listed with its own; the operator's tenant (``default``) sees every shared collection's job,
    as ``GET /v1/jobs/{id}`` does.
    """
    if collection is not None:
        check_name_length(collection)
    return {"jobs": [job_out(j) for j in tenant_jobs(request, q, collection, state, kind, limit)]}


def tenant_jobs(  # noqa: PLR0913 - the filters
    request: Request, q: Quarry, collection: str | None, state: str | None, kind: str | None, limit: int,
) -> list[Job]:
    """The caller's jobs, its shared collections' ones included, newest first, at most ``limit``."""
    home = q.home()
    wide = limit if kind is None else 1000
    found = home.docstore.list_jobs(collection=collection, state=state, limit=wide)
    tenant = home.tenant_id
    shared = [j for j in home.shared_view().docstore.list_jobs(collection=collection, state=state, limit=1000)
              if tenant == DEFAULT_TENANT or j.params.get("tenant") == tenant]
    merged = sorted({j.id: j for j in found + shared}.values(), key=lambda j: (-j.created_at, j.id))
    return [j for j in merged if (kind is None or j.kind == kind)
            and access.may_see_job(request, j.kind, j.collection)][:limit]


@router.get(
    "/v1/jobs/{job_id}", tags=["collections"], response_model=JobOut,
    responses=error_responses(e.InvalidRequest, e.NotFound, *STORE_ERRORS),
)
def get_job(job_id: str, request: Request, q: Service) -> dict[str, Any]:
    """A job's state, progress counters and error (an ingest job's rate, ETA and files skipped too).

    A reindex job needs an ``admin`` key, an ingest job ``write`` (or ``admin``); a job of
    another tenant, or of a collection the key may not use, is 404.
    """
    job = job_or_404(q, job_id, access.collections_of(request))
    access.check_job(request, job.kind)
    return job_out(job)


@router.post(
    "/v1/collections/{name}/jobs", status_code=202, tags=["documents"], response_model=JobOut,
    responses=error_responses(
        e.InvalidRequest, e.Forbidden, e.CollectionNotFound, e.Conflict, e.PayloadTooLarge, *STORE_ERRORS, body=True
    ),
    openapi_extra={"requestBody": {"required": True, "content": {
        "application/json": {"schema": IngestJobIn.model_json_schema()},
        "application/x-ndjson": {"schema": {"type": "string", "format": "binary", "description": (
            "The documents, one JSON object per line as in a .jsonl file; options as query parameters "
            "on_error=skip|fail and prune=true|false.")}},
    }}},
)
async def submit_ingest_job(name: str, request: Request, q: Service) -> dict[str, Any]:
    """Ingest a source in the background (202 with the job; follow it at ``/v1/jobs/{id}``).

    The source is either a path on the server's disk (a JSON body ``{"path": ...}``), under one
    of its ``QUARRY_INGEST__ROOTS`` (403 otherwise, and when none is set), or the body itself:
    NDJSON documents sent with ``Content-Type: application/x-ndjson`` (or ``application/jsonl``),
    spooled to the server's disk as they stream in, up to ``QUARRY_INGEST__MAX_UPLOAD_BYTES``
    (413 past it), with ``on_error`` and ``prune`` as query parameters. The job writes batch by
    batch and records a checkpoint after each; a server killed mid-job resumes it from there when
    it (or a replica) finds its lease lapsed. One unfinished ingest job per collection (409).
    """
    jobs: IngestJobs = request.app.state.ingest_jobs
    if is_upload_type(request.headers.get("content-type")):
        on_error, prune = upload_options(request.query_params)
        await run_in_threadpool(jobs.admit, q, name)  # refused before a byte is spooled
        job_id = new_job_id()
        part, size = await spool(request, jobs.spool_dir, job_id, q.settings.ingest.max_upload_bytes)
        job = await run_in_threadpool(
            partial(jobs.submit_upload, q, name, job_id, part, size, on_error=on_error, prune=prune)
        )
        await run_in_threadpool(access.audit, request, "ingest.submit", name, job=job.id, upload_bytes=size)
    else:
        body = _ingest_job_body(await request.body(), request.headers.get("content-type"))
        job = await run_in_threadpool(
            partial(jobs.submit, q, name, body.path, on_error=body.on_error, prune=body.prune)
        )
        await run_in_threadpool(access.audit, request, "ingest.submit", name, job=job.id, path=job.params["path"])
    return job_out(await run_in_threadpool(q.get_job, job.id))


def _ingest_job_body(raw: bytes, content_type: str | None) -> IngestJobIn:
    """The JSON body of a path job, validated as FastAPI validates a declared body.

    Raises:
        RequestValidationError: Not the schema, or not JSON (422, in the error envelope).
    """
    if not errors.is_json(content_type or ""):  # as FastAPI: such a body is not read as JSON (curl -d: a form)
        raise RequestValidationError([{"type": "dict_type", "loc": ("body",), "msg": "not JSON", "input": None}])
    try:
        return IngestJobIn.model_validate_json(raw or b"null")
    except ValidationError as exc:
        found = [{**err, "loc": ("body", *err.get("loc", ()))} for err in exc.errors()]
        raise RequestValidationError(found, body=raw.decode("utf-8", "replace")) from exc


@router.delete(
    "/v1/jobs/{job_id}", status_code=202, tags=["documents"], response_model=JobOut,
    responses=error_responses(e.InvalidRequest, e.NotFound, e.Conflict, *STORE_ERRORS),
)
def cancel_job(job_id: str, request: Request, q: Service) -> dict[str, Any]:
    """Cancel an ingest job: ``cancelling``, then ``cancelled`` at its next embedding sub-batch.

    The batch in flight is dropped whole (nothing of it is written); the batches written before
    stay. A finished job, or a reindex job, is 409.
    """
    job = job_or_404(q, job_id, access.collections_of(request))
    access.check_job(request, job.kind)
    jobs: IngestJobs = request.app.state.ingest_jobs
    return job_out(jobs.cancel(q, job.id))


def job_out(job: Any) -> dict[str, Any]:
    """A job record as the API shows it: :class:`JobOut`'s fields and the progress counters."""
    out = {k: getattr(job, k) for k in JobOut.model_fields if hasattr(job, k)}
    return out | progress_of(job)
