"""Open a :class:`~stores.base.VectorStore` from a URL; the scheme picks the backend.

==========================  ==========================================================
URL                         backend
==========================  ==========================================================
``milvus:///path/x.db``     Milvus Lite, embedded (``stores.milvus``)
``milvus://host:19530``     Milvus server (``stores.milvus``)
``qdrant:///path/dir``      Qdrant's engine in process via qdrant-edge (``stores.qdrant``)
``qdrant://host:6333``      Qdrant server via qdrant-client (``stores.qdrant``)
``qdrant+local:///path``    qdrant-client local mode (brute force emulation, for checks)
``postgresql://...``        PostgreSQL + pgvector (``stores.pgvector``)
==========================  ==========================================================
"""

from __future__ import annotations

from urllib.parse import urlsplit

from quarry.errors import ConfigError, missing_extra
from stores.base import VectorStore
from stores.routing import FilterRouter

SCHEMES = ("milvus", "qdrant", "qdrant+local", "postgresql", "postgres")


def open_store(url: str, router: FilterRouter | None = None) -> VectorStore:
    """Open the store a URL names.

    Args:
        url: See the module table.
        router: Routes filtered searches by the rows they match (:mod:`stores.routing`);
            ``None``: a router with the default limit and TTL.

    Returns:
        A connected store.

    Raises:
        ConfigError: Unknown scheme (the message lists the supported ones) or a missing extra.
        StoreUnavailable: The engine cannot be reached.
    """
    scheme = urlsplit(url).scheme.lower()
    if scheme == "milvus":
        from stores.milvus import MilvusStore

        return MilvusStore.from_url(url, router)
    if scheme in ("qdrant", "qdrant+local"):
        from stores.qdrant import open_qdrant

        return open_qdrant(url, router)
    if scheme in ("postgresql", "postgres"):
        try:
            from stores.pgvector import PgVectorStore
        except ImportError as exc:  # psycopg, psycopg_pool or pgvector (stores.pgvector_sql imports psycopg first)
            raise missing_extra(exc.name or "psycopg", "pgvector") from exc

        return PgVectorStore.from_url(url, router)
    raise ConfigError(
        f"unsupported store URL scheme {scheme!r} in {url!r}; supported: {', '.join(SCHEMES)}"
    )
