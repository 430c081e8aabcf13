"""The server's end of an upload job: an NDJSON body spooled to disk as it streams in.

``POST /v1/collections/{name}/jobs`` with ``Content-Type: application/x-ndjson`` (or
``application/jsonl``, ``application/ndjson``) carries the documents themselves, one JSON object
per line as in a ``.jsonl`` file, instead of a path on the server's disk. The body is written
chunk by chunk to ``<data_dir>/jobs/<job_id>.part`` (memory holds one chunk of the ASGI server's,
about 64 KiB), bounded by ``QUARRY_INGEST__MAX_UPLOAD_BYTES``: past it the request is a 413 and
the partial spool is removed, as it is when the client goes away mid-body. A complete spool is
renamed ``<job_id>.jsonl`` and read by the job exactly as a ``.jsonl`` source
(:class:`quarry.ingest_jobs.IngestJobs`).

The options a JSON body carries (``on_error``, ``prune``) travel as query parameters.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from pathlib import Path

import anyio
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request

from quarry.errors import InvalidRequest, PayloadTooLarge, clip

UPLOAD_TYPES = frozenset({"application/x-ndjson", "application/ndjson", "application/jsonl", "application/x-jsonl"})
JOBS_ROUTE = re.compile(r"/v1/collections/[^/]+/jobs")


def is_upload_type(content_type: str | None) -> bool:
    """Whether a ``Content-Type`` header (parameters ignored) names an NDJSON upload."""
    return (content_type or "").split(";", 1)[0].strip().lower() in UPLOAD_TYPES


def is_upload_request(method: str, path: str, content_type: str | None) -> bool:
    """Whether a request is an upload job's (its body limit is ``QUARRY_INGEST__MAX_UPLOAD_BYTES``)."""
    return method == "POST" and JOBS_ROUTE.fullmatch(path) is not None and is_upload_type(content_type)


def upload_too_large(limit: int) -> PayloadTooLarge:
    """The error of an upload over ``limit`` bytes (413)."""
    return PayloadTooLarge(
        f"uploaded source is larger than {limit:,} bytes, the server's limit (QUARRY_INGEST__MAX_UPLOAD_BYTES); "
        "split it into several jobs, or put it under the server's QUARRY_INGEST__ROOTS and submit its path"
    )


def upload_options(query: Mapping[str, str]) -> tuple[str | None, bool]:
    """``(on_error, prune)`` from an upload's query parameters.

    Raises:
        InvalidRequest: An unknown parameter, ``on_error`` other than skip/fail, or ``prune``
            other than true/false.
    """
    unknown = set(query) - {"on_error", "prune"}
    if unknown:
        raise InvalidRequest(f"unknown query parameter(s) {clip(', '.join(sorted(unknown)))}; "
                             "an upload job takes on_error (skip|fail) and prune (true|false)")
    on_error = query.get("on_error")
    if on_error not in (None, "skip", "fail"):
        raise InvalidRequest(f"on_error must be skip or fail, got {clip(on_error or '')}")
    prune = query.get("prune", "false").lower()
    if prune not in ("true", "false"):
        raise InvalidRequest(f"prune must be true or false, got {clip(prune)}")
    return on_error, prune == "true"


def new_job_id() -> str:
    """A job id chosen before the job is recorded (its spool is named after it)."""
    return secrets.token_hex(16)


async def spool(request: Request, folder: Path, job_id: str, limit: int) -> tuple[Path, int]:
    """Write the request's body to ``folder/<job_id>.part``; its path and size in bytes.

    Each chunk is written in a worker thread (the event loop never waits on the disk).

    Raises:
        PayloadTooLarge: The body passed ``limit`` bytes (the partial file is removed).
        InvalidRequest: The client went away mid-body (removed too).
    """
    await anyio.to_thread.run_sync(lambda: folder.mkdir(parents=True, exist_ok=True))
    part = folder / f"{job_id}.part"
    size = 0
    fh = await anyio.to_thread.run_sync(part.open, "wb")
    try:
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise upload_too_large(limit)
                if chunk:
                    await anyio.to_thread.run_sync(fh.write, chunk)
        except HTTPException as exc:  # the guard's count of the body's bytes (RequestBodyLimitResponder)
            if exc.status_code == 413:
                raise upload_too_large(limit) from exc
            raise
        except ClientDisconnect as exc:  # the client's own failure (its reader failed, it was stopped): no 500
            raise InvalidRequest(
                f"the upload ended after {size:,} bytes, before its body did (the client went away); nothing was kept"
            ) from exc
        await anyio.to_thread.run_sync(fh.close)
    except BaseException:
        fh.close()
        part.unlink(missing_ok=True)
        raise
    return part, size
