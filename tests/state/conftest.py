"""Backends of the state-of-record contract suite: SQLite (a fresh file) and PostgreSQL.

PostgreSQL is the shared test server (``QUARRY_TEST_PG_URL``, from ``scripts/services.sh env``);
each test gets a schema of its own (``search_path`` in the URL), dropped afterwards, so nobody
else's data is touched. A server that is down fails the run, it never skips.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import pytest

from indexing.docstore import StateStore, open_docstore

PG_URL = os.environ.get("QUARRY_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5433/quarry")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.integration)])
def state_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL of an empty state of record on the backend under test."""
    if request.param == "sqlite":
        yield f"sqlite://{tmp_path}/state.sqlite"
        return
    with pg_schema() as url:
        yield url


@contextmanager
def pg_schema() -> Iterator[str]:
    """The test server's URL with a fresh schema of its own on the ``search_path``; dropped after."""
    import psycopg

    name = f"quarry_state_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    try:
        sep = "&" if "?" in PG_URL else "?"
        yield f"{PG_URL}{sep}options={quote(f'-csearch_path={name}')}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {name} CASCADE")


@pytest.fixture
def opened(state_url: str, tmp_path: Path) -> Iterator[Callable[[], StateStore]]:
    """Opens the state under test (again, for a restart); everything opened is closed at the end."""
    stores: list[StateStore] = []

    def open_one() -> StateStore:
        stores.append(open_docstore(state_url, tmp_path))
        return stores[-1]

    yield open_one
    for store in stores:
        store.close()


@pytest.fixture
def state(opened: Callable[[], StateStore]) -> StateStore:
    """The state of record under test, empty."""
    return opened()
