"""The app of one ``quarry serve --workers N`` worker process (uvicorn imports it by name).

Each worker opens its own :class:`~quarry.service.Quarry` from the environment's settings at
startup. Workers share the vector store and the docstore, so both must be servers (see
:func:`check_shareable`): an embedded Milvus Lite or Qdrant edge store and a SQLite docstore
belong to one process.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from urllib.parse import urlsplit

from fastapi import FastAPI

from quarry.errors import ConfigError
from quarry.settings import Settings, get_settings


def check_shareable(settings: Settings) -> None:
    """Refuse settings whose store or docstore one process owns.

    Raises:
        ConfigError: The store is embedded (``milvus:///path``, ``qdrant:///path``,
            ``qdrant+local://``) or the docstore is not PostgreSQL; the message says what to set.
    """
    store = urlsplit(settings.store_url)
    embedded = store.scheme == "qdrant+local" or (store.scheme in ("milvus", "qdrant") and not store.netloc)
    if embedded:
        raise ConfigError(
            f"--workers > 1 needs a vector store server (QUARRY_STORE__URL=milvus://host:19530, qdrant://host:6333 "
            f"or postgresql://...), not the embedded {store.scheme}:///... one process owns"
        )
    if urlsplit(settings.docstore.url).scheme not in ("postgresql", "postgres"):
        raise ConfigError(
            "--workers > 1 needs a shared docstore: set QUARRY_DOCSTORE__URL=postgresql://user@host:5432/db "
            "(the default SQLite file serves one process)"
        )


def share_cores(workers: int, environ: MutableMapping[str, str], cores: int | None = None) -> int:
    """Give each worker's torch its share of the cores: ``OMP_NUM_THREADS`` unless already set.

    torch sizes its intra-op pool from ``OMP_NUM_THREADS`` when a worker imports it (all cores
    by default), and the sentence-transformers encoder gives a lone query that whole pool. N
    workers with all cores each put N x cores spinning OpenMP threads on the cores: on 2 cores,
    a query embedding cost 326-354 ms of CPU with 2 threads against 27-31 ms with 1 while the
    machine was busy (bench/workers.py; docs/performance.md#workers).

    Args:
        workers: Worker processes about to start (they inherit ``environ``).
        environ: The environment the workers inherit (``os.environ``).
        cores: CPUs this process may run on (default: its affinity mask).

    Returns:
        The threads per worker now in ``environ`` (an existing value is kept).
    """
    if cores is None:
        cores = len(os.sched_getaffinity(0))
    current = environ.get("OMP_NUM_THREADS", "")
    if current.isdigit() and int(current) > 0:
        return int(current)
    threads = max(1, cores // max(1, workers))
    environ["OMP_NUM_THREADS"] = str(threads)
    return threads


def create_worker_app() -> FastAPI:
    """The app of one worker: a service opened from the environment when the worker starts."""
    from quarry.api import create_app
    from quarry.service import Quarry

    return create_app(lambda: Quarry(get_settings()))
