"""Evaluation report routes: the run folders under ``QUARRY_EVAL__REPORTS_DIR``, listed and read (read-only).

``quarry eval --out DIR`` writes a run folder (``docs/evaluation-reports.md``). The server serves
the run folders that are *direct* sub-folders of ``QUARRY_EVAL__REPORTS_DIR`` and, of each, only
the files of :data:`FILES`; nothing else on its disk:

* a report id is a folder's name (:data:`REPORT_ID`: a letter or digit, then letters, digits,
  ``.``, ``_``, ``-``; no ``/``, no ``..``), and the resolved folder (links followed) must be a
  direct child of the resolved reports folder, so neither a name nor a link leads out of it;
* a file is named from :data:`FILES` (a fixed map, not a path), and resolved the same way;
* each answer is read whole: ``summary.json`` and ``report.md`` up to :data:`MAX_TEXT_BYTES`,
  a file up to :data:`MAX_FILE_BYTES` (a larger one is a 413, never streamed from a growing file).

``report.html`` is served with a Content-Security-Policy that runs no script and loads nothing
(``sandbox``; its CSS and plots are inline) and as an attachment, so a browser never renders it
as a page of this origin. Scope: ``admin`` (the reports are the operator's, of every tenant).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field

from quarry import errors as e
from quarry.api.errors import error_responses
from quarry.errors import InvalidRequest, NotFound, PayloadTooLarge, clip

router = APIRouter()


class ReportOut(BaseModel):
    """A run folder as ``GET /v1/reports`` lists it."""

    id: str = Field(description="The run folder's name under QUARRY_EVAL__REPORTS_DIR.")
    modified: float = Field(description="summary.json's modification time (Unix seconds).")
    dataset: str | None = None
    collection: str | None = None
    started_at: str | None = None
    ndcg_at_10: dict[str, float | None] = Field(alias="ndcg@10", description="nDCG@10 per mode.")
    files: list[str] = Field(description="The files of FILES present in the folder.")


class ReportsOut(BaseModel):
    """``GET /v1/reports``: newest first; ``configured: false`` when no reports folder is set."""

    configured: bool
    reports: list[ReportOut]


class ReportDetailOut(ReportOut):
    """``GET /v1/reports/{report_id}``: the listing's entry, ``summary.json`` and ``report.md``."""

    summary: dict[str, Any]
    report_md: str | None

REPORT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# file name -> media type (the only files served)
FILES: dict[str, str] = {
    "summary.json": "application/json",
    "report.md": "text/markdown; charset=utf-8",
    "report.html": "text/html; charset=utf-8",
    "quality.png": "image/png",
    "latency.png": "image/png",
    "compare.json": "application/json",
    "compare.html": "text/html; charset=utf-8",
}
MAX_TEXT_BYTES = 4 * 1024 * 1024
MAX_FILE_BYTES = 32 * 1024 * 1024
MAX_LISTED = 500
_HTML_CSP = "sandbox; default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def _root(request: Request) -> Path | None:
    """The resolved reports folder, or ``None`` when none is configured (or it is not a folder)."""
    configured: Path | None = request.app.state.quarry.settings.eval.reports_dir
    if configured is None:
        return None
    root = configured.expanduser().resolve()
    return root if root.is_dir() else None


def _run_dir(root: Path | None, report_id: str) -> Path:
    """The run folder of ``report_id``, inside ``root``.

    Raises:
        InvalidRequest: Not a report id.
        NotFound: No such run folder (or none configured, or it leads out of the reports folder).
    """
    if not REPORT_ID.fullmatch(report_id) or report_id.strip(".") != report_id:
        raise InvalidRequest(f"report id {clip(report_id)}: a folder name of letters, digits, '.', '_', '-'")
    if root is None:
        raise NotFound("no evaluation reports are served: set QUARRY_EVAL__REPORTS_DIR")
    found = (root / report_id).resolve()
    if found.parent != root or not (found / "summary.json").is_file():
        raise NotFound(f"no evaluation report {clip(report_id)}")
    return found


def _read(path: Path, limit: int) -> bytes:
    """A file's bytes, at most ``limit``.

    Raises:
        PayloadTooLarge: The file is larger.
    """
    with path.open("rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise PayloadTooLarge(f"{path.name} is larger than {limit} bytes")
    return data


def _summary(run: Path) -> dict[str, Any]:
    """``summary.json`` of a run folder, parsed (``{}`` when it is not a JSON object)."""
    try:
        found = json.loads(_read(run / "summary.json", MAX_TEXT_BYTES))
    except (ValueError, OSError):
        return {}
    return found if isinstance(found, dict) else {}


def _object(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object, else ``{}``."""
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str | None:
    """A summary's text field as a string (``None`` when absent)."""
    return None if value is None else str(value)


def _number(value: Any) -> float | None:
    """A summary's figure (``None`` when it is not a number)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _entry(run: Path) -> dict[str, Any]:
    """A run folder as the listing shows it: id, dataset, modes with nDCG@10, the files present."""
    summary = _summary(run)
    config, modes = _object(summary.get("config")), _object(summary.get("modes"))
    return {
        "id": run.name,
        "modified": (run / "summary.json").stat().st_mtime,
        "dataset": _text(config.get("dataset")),
        "collection": _text(config.get("collection")),
        "started_at": _text(config.get("started_at")),
        "ndcg@10": {str(m): _number(v.get("ndcg@10")) for m, v in modes.items() if isinstance(v, dict)},
        "files": [name for name in FILES if (run / name).is_file()],
    }


@router.get(
    "/v1/reports", tags=["evaluation"], response_model=ReportsOut, response_model_by_alias=True,
    responses=error_responses(e.InvalidRequest),
)
def list_reports(request: Request) -> dict[str, Any]:
    """The evaluation runs under ``QUARRY_EVAL__REPORTS_DIR``, newest first (``configured: false`` without it)."""
    root = _root(request)
    if root is None:
        return {"configured": False, "reports": []}
    runs = [
        child.resolve() for child in root.iterdir()
        if REPORT_ID.fullmatch(child.name) and child.name.strip(".") == child.name
    ]
    runs = [run for run in runs if run.parent == root and (run / "summary.json").is_file()]
    entries = sorted((_entry(run) for run in runs), key=lambda r: r["modified"], reverse=True)
    return {"configured": True, "reports": entries[:MAX_LISTED]}


@router.get(
    "/v1/reports/{report_id}", tags=["evaluation"], response_model=ReportDetailOut, response_model_by_alias=True,
    responses=error_responses(e.InvalidRequest, e.NotFound),
)
def get_report(report_id: str, request: Request) -> dict[str, Any]:
    """One run: its listing entry, its ``summary.json`` and its ``report.md`` (``null`` when absent)."""
    run = _run_dir(_root(request), report_id)
    markdown = run / "report.md"
    text = _read(markdown, MAX_TEXT_BYTES).decode("utf-8", "replace") if markdown.is_file() else None
    return {**_entry(run), "summary": _summary(run), "report_md": text}


@router.get(
    "/v1/reports/{report_id}/{file}", tags=["evaluation"],
    responses=error_responses(e.InvalidRequest, e.NotFound, e.PayloadTooLarge),
)
def get_report_file(report_id: str, file: str, request: Request) -> Response:
    """One file of a run (:data:`FILES`); the HTML reports as attachments under a sandboxing CSP."""
    run = _run_dir(_root(request), report_id)
    media = FILES.get(file)
    if media is None:
        raise NotFound(f"no report file {clip(file)}; files: {', '.join(FILES)}")
    path = (run / file).resolve()
    if path.parent != run or not path.is_file():
        raise NotFound(f"report {clip(report_id)} has no {file}")
    headers = {"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}
    if media.startswith("text/html"):
        headers |= {"Content-Security-Policy": _HTML_CSP, "Content-Disposition": f'attachment; filename="{file}"'}
    return Response(_read(path, MAX_FILE_BYTES), media_type=media, headers=headers)
