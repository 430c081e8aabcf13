"""Logging of the server: each line carries its request's id; text or JSON lines.

The request id is the client's ``X-Request-ID`` when it is a safe token (1-128 characters of
letters, digits and ``-_.:@=+/``), else one made here (32 hex digits); the response echoes it
(:class:`~quarry.api.observe.ObserveMiddleware`). It lives in a context variable, so the lines
a request logs from the event loop or from a worker thread (FastAPI copies the context into
its thread pool) all carry it; a line logged outside any request carries ``-``.

What is logged: routes, statuses, collection names, counts, timings, error messages (which
clip client values). Never a query, a document's text or a key: no log call of Quarry formats
them (``tests/core/test_observability.py`` greps the captured logs of a search and an answer).
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from contextvars import ContextVar
from typing import Any

import orjson

REQUEST_ID: ContextVar[str] = ContextVar("quarry_request_id", default="-")
# Set while the outer middleware sends a load-shedding 503 (:mod:`quarry.api.observe`): uvicorn's
# access line for it is dropped by :class:`ShedAccessFilter`.
SHED_REPLY: ContextVar[bool] = ContextVar("quarry_shed_reply", default=False)
_SAFE_ID = re.compile(r"[A-Za-z0-9\-_.:@=+/]{1,128}")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"


def request_id(offered: str | None) -> str:
    """The client's id when it is a safe token, else a new random one (32 hex digits)."""
    if offered is not None and _SAFE_ID.fullmatch(offered):
        return offered
    return secrets.token_hex(16)


class RequestIdFilter(logging.Filter):
    """Adds ``request_id`` (the current request's, or ``-``) to every record a handler emits."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Tag ``record``; never drops one."""
        record.request_id = REQUEST_ID.get()
        return True


class ShedAccessFilter(logging.Filter):
    """Drops uvicorn's access line of a request shed with a 503 before routing.

    A saturated server refuses low-priority requests by the thousand per second (32 clients
    that ignore ``Retry-After`` sent ~1,000/s in ``bench/access.py``); one access line each cost
    ~80 µs of the event loop's time (formatting and a write to stderr), ~17 % of the server's
    CPU per request there, while high-priority requests waited on the same loop. They are
    counted by ``quarry_shed_total{priority}`` instead, and the middleware logs one WARNING line
    with their count at most every :data:`quarry.api.observe.SHED_LOG_EVERY_S` seconds.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """``False`` for the access line of a shed request; ``True`` for every other."""
        return not SHED_REPLY.get()


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (UTC), ``level``, ``logger``, ``request_id``, ``message`` (+ ``exc``)."""

    converter = staticmethod(time.gmtime)

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        out: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "request_id": getattr(record, "request_id", REQUEST_ID.get()),
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out).decode()


def formatter(kind: str) -> logging.Formatter:
    """The formatter of ``QUARRY_LOG__FORMAT`` (``text`` or ``json``)."""
    return JsonFormatter() if kind == "json" else logging.Formatter(TEXT_FORMAT)


def uvicorn_log_config(kind: str, level: str) -> dict[str, Any]:
    """``uvicorn.run(log_config=...)``: Quarry's, uvicorn's and the access log's lines, one format.

    Args:
        kind: ``text`` or ``json`` (``QUARRY_LOG__FORMAT``).
        level: The root level (``QUARRY_LOG__LEVEL``).
    """
    fmt: dict[str, Any] = {"()": f"{__name__}.JsonFormatter"} if kind == "json" else {"format": TEXT_FORMAT}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {
            "request_id": {"()": f"{__name__}.RequestIdFilter"},
            "shed_access": {"()": f"{__name__}.ShedAccessFilter"},
        },
        "formatters": {"quarry": fmt},
        "handlers": {
            "default": {
                "class": "logging.StreamHandler", "formatter": "quarry", "filters": ["request_id"],
                "stream": "ext://sys.stderr",
            },
        },
        "root": {"handlers": ["default"], "level": level},
        "loggers": {
            "uvicorn": {"handlers": [], "level": level, "propagate": True},
            "uvicorn.error": {"handlers": [], "level": level, "propagate": True},
            "uvicorn.access": {"handlers": [], "level": level, "propagate": True, "filters": ["shed_access"]},
        },
    }
