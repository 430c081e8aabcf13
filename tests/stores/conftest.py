"""Backends of the store contract suite: one table, one parametrised ``store`` fixture.

Every backend in :data:`BACKENDS` runs the whole contract (``test_contract.py``) against the real
engine. Embedded engines get a fresh temporary path; server engines are found through test-only
environment variables and must already run (``bash scripts/services.sh start``): a missing
service or backend module fails the run loudly, it never skips.

Select one backend with ``-k milvus-lite`` (ids: milvus-lite, milvus-server, qdrant-edge,
qdrant-local, pgvector).
"""

from __future__ import annotations

import importlib.util
import os
import socket
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from stores.base import VectorStore
from stores.factory import open_store

START_HINT = "start the test services with: bash scripts/services.sh start"


@dataclass(frozen=True)
class Backend:
    """One engine under test.

    Attributes:
        id: Test id (``-k`` selects it).
        module: The backend module that must import.
        url: Builds the store URL from a fresh temporary directory (ignored by servers).
        server: Whether the engine is an external service that must already run.
    """

    id: str
    module: str
    url: Callable[[Path], str]
    server: bool = False


BACKENDS = [
    Backend("milvus-lite", "stores.milvus", lambda tmp: f"milvus://{tmp}/quarry.db"),
    Backend(
        "milvus-server",
        "stores.milvus",
        lambda _: os.environ.get("QUARRY_TEST_MILVUS_URL", "milvus://127.0.0.1:19530"),
        server=True,
    ),
    Backend("qdrant-edge", "stores.qdrant", lambda tmp: f"qdrant://{tmp}/qdrant"),
    Backend("qdrant-local", "stores.qdrant", lambda tmp: f"qdrant+local://{tmp}/qdrant-local"),
    Backend(
        "pgvector",
        "stores.pgvector",
        lambda _: os.environ.get("QUARRY_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5433/quarry"),
        server=True,
    ),
]


def _params() -> list[object]:
    marks = [pytest.mark.integration]
    return [pytest.param(b, id=b.id, marks=marks if b.server else []) for b in BACKENDS]


@pytest.fixture(scope="session", params=_params())
def backend(request: pytest.FixtureRequest) -> Backend:
    """The backend under test; fails when its module is missing or its service is down."""
    b: Backend = request.param
    if importlib.util.find_spec(b.module) is None:
        pytest.fail(f"backend {b.id}: module {b.module} does not exist (yet)")
    if b.server:
        _require_service(b, b.url(Path()))
    return b


def _require_service(b: Backend, url: str) -> None:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port
    if port is None:
        port = {"milvus": 19530, "postgresql": 5432, "postgres": 5432}.get(parts.scheme, 0)
    try:
        with socket.create_connection((host, port), timeout=3):
            pass
    except OSError as exc:
        pytest.fail(f"backend {b.id}: no service at {host}:{port} ({exc}); {START_HINT}")


@pytest.fixture(scope="session")
def store_url(backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The URL of the session's store for this backend."""
    return backend.url(tmp_path_factory.mktemp(backend.id))


@pytest.fixture(scope="session")
def store(store_url: str) -> Iterator[VectorStore]:
    """One open store per backend, shared by the tests (each test uses its own collections)."""
    opened = open_store(store_url)
    yield opened
    opened.close()


@pytest.fixture()
def fresh_url(backend: Backend, tmp_path: Path) -> str:
    """A URL for a second store: a new path for embedded engines, the same server otherwise."""
    return backend.url(tmp_path)


@pytest.fixture()
def names(store: VectorStore) -> Iterator[Callable[[], str]]:
    """Make unique collection/alias names; every one made is dropped after the test."""
    made: list[str] = []

    def make() -> str:
        made.append(f"t_{uuid.uuid4().hex[:12]}")
        return made[-1]

    yield make
    for name in reversed(made):
        store.drop_alias(name)
        store.drop_collection(name)


@pytest.fixture()
def coll(names: Callable[[], str]) -> str:
    """A unique collection name (not created), dropped after the test."""
    return names()


def backend_by_id(backend_id: str) -> Backend:
    """The :data:`BACKENDS` entry with this id."""
    return next(b for b in BACKENDS if b.id == backend_id)


@pytest.fixture()
def milvus_server() -> Iterator[VectorStore]:
    """A store on the Milvus server of the contract suite (fails when it is not running)."""
    b = backend_by_id("milvus-server")
    url = b.url(Path())
    _require_service(b, url)
    opened = open_store(url)
    yield opened
    opened.close()


@pytest.fixture()
def milvus_lite(tmp_path: Path) -> Iterator[VectorStore]:
    """A fresh Milvus Lite store in a temporary directory."""
    opened = open_store(backend_by_id("milvus-lite").url(tmp_path))
    yield opened
    opened.close()
