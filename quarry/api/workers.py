"""The app of one ``quarry serve --workers N`` worker process (uvicorn imports it by name).

Each worker opens its own :class:`~quarry.service.Quarry` from the environment's settings at
startup. Workers share the vector store and the docstore, so both must be servers (see
:func:`check_shareable`): an embedded Milvus Lite or Qdrant edge store and a SQLite docstore
belong to one process.
"""

from __future__ import annotations

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


def create_worker_app() -> FastAPI:
    """The app of one worker: a service opened from the environment when the worker starts."""
    from quarry.api import create_app
    from quarry.service import Quarry

    return create_app(lambda: Quarry(get_settings()))
