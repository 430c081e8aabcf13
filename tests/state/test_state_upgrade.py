"""Schema steps: a docstore of the release before them upgrades, keeps its rows, and is served.

``data/docstore-v1.sqlite`` was written by that release's ``indexing/docstore.py`` (commit
bf1256e: ``DocStore.put_collection``/``write_batch``): collection ``legacy`` (3 documents, 4
chunks, ``version`` 3, one pending vector delete), collection ``empty``, and one document left
under ``dropped``, a collection that no longer exists (a write that committed after the drop).
The PostgreSQL case loads the same rows into step 1's tables, then opens the state.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from indexing import schema
from indexing.docstore import StateStore, open_docstore
from quarry.errors import StoreError
from quarry.service import Quarry
from quarry.settings import Settings

FIXTURE = Path(__file__).parent / "data" / "docstore-v1.sqlite"
TABLES = ("collections", "documents", "chunks", "pending_deletes")


def _legacy_rows() -> dict[str, list[tuple[Any, ...]]]:
    with sqlite3.connect(FIXTURE) as db:
        return {t: db.execute(f"SELECT * FROM {t} ORDER BY rowid").fetchall() for t in TABLES}  # noqa: S608


@pytest.fixture
def legacy_url(state_url: str, tmp_path: Path) -> Iterator[str]:
    """The state under test holding the legacy rows in step 1's tables (no ``schema_migrations``)."""
    if state_url.startswith("sqlite"):
        shutil.copy(FIXTURE, tmp_path / "state.sqlite")
        yield state_url
        return
    with psycopg.connect(state_url, autocommit=True) as conn:
        for statement in schema.steps("postgres", 0.0)[0].statements:
            conn.execute(statement)
        for table, rows in _legacy_rows().items():
            if rows:
                marks = ",".join(["%s"] * len(rows[0]))
                conn.cursor().executemany(f"INSERT INTO {table} VALUES ({marks})", rows)  # noqa: S608
    yield state_url


def test_a_docstore_of_the_previous_release_upgrades_and_keeps_every_row(legacy_url: str, tmp_path: Path) -> None:
    state = open_docstore(legacy_url, tmp_path)
    try:
        _check_upgraded(state)
    finally:
        state.close()
    again = open_docstore(legacy_url, tmp_path)  # a second open applies nothing
    try:
        assert again.version("legacy") == 4 and again.counts("legacy") == (2, 3)  # after the check's delete
    finally:
        again.close()


def _check_upgraded(state: StateStore) -> None:
    legacy = _legacy_rows()
    assert state.list_collections() == ["empty", "legacy"]
    for name, config, version in legacy["collections"]:
        cs = state.collection_state(name)
        assert cs is not None and (cs.seq, cs.live_version, cs.tenant_id) == (version, 0, "default")
        assert state.collection_config(name) == json.loads(config)
    docs = [r for r in legacy["documents"] if r[0] == "legacy"]
    assert state.document_hashes("legacy", [r[1] for r in docs]) == {r[1]: r[2] for r in docs}
    stored = state.get_documents("legacy", ["ants"])["ants"]
    assert (stored.text, stored.title, stored.metadata, stored.updated_seq) == (None, None, None, 3)  # only hashes then
    chunks = [r for r in legacy["chunks"] if r[0] == "legacy"]
    seq, rows = state.bm25_rows("legacy")
    assert seq == 3 and [r[0] for r in rows] == [r[1] for r in chunks]  # same rows, same order
    got = state.get_chunks("legacy", [r[1] for r in chunks], with_tokens=True)
    for _, chunk_id, document_id, position, text, tokens, payload in chunks:
        c = got[chunk_id]
        assert (c.document_id, c.position, c.text) == (document_id, position, text)
        assert c.tokens == json.loads(tokens) and c.payload == json.loads(payload)
    assert state.pending_deletes("legacy") == [r[1] for r in legacy["pending_deletes"]]
    assert state.change_log_since("legacy", 0) == []  # no history before the log existed
    assert state.list_tenants() == [("default", "default")]
    # the orphan document of collection "dropped" belongs to no collection: not carried over
    state.put_collection("dropped", {})
    assert state.counts("dropped") == (0, 0)
    # and the next write continues the seq
    assert state.write_batch("legacy", [], [], [], deleted_document_ids=["wasps"]) == 4


def test_the_service_serves_an_upgraded_data_dir(tmp_path: Path) -> None:
    shutil.copy(FIXTURE, tmp_path / "docstore.sqlite")
    quarry = Quarry(Settings(data_dir=tmp_path))
    try:
        assert [c.name for c in quarry.list_collections()] == ["empty", "legacy"]
        cfg = quarry.get_collection("legacy")
        assert (cfg.chunk_size, cfg.language, cfg.schema_) == (64, "en", {"document_id": "str", "year": "int"})
        hits = quarry.search("legacy", "honey nectar", mode="bm25").hits
        assert hits[0].document_id == "bees" and hits[0].text.startswith("Bees make honey")
        assert hits[0].metadata == {"year": 2002}
    finally:
        quarry.close()
    with sqlite3.connect(tmp_path / "docstore.sqlite") as db:
        steps = db.execute("SELECT version FROM schema_migrations ORDER BY version").fetchall()
        assert steps == [(1,), (2,), (3,), (4,), (5,)]


def _run(url: str, statements: list[str], params: tuple[Any, ...] | None = None) -> None:
    """Execute ``statements`` on the state at ``url`` directly (``params`` for the last one)."""
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite://")) as db:
            for i, statement in enumerate(statements):
                db.execute(statement, params if params and i == len(statements) - 1 else ())
        return
    with psycopg.connect(url, autocommit=True) as conn:
        for i, statement in enumerate(statements):
            last = params and i == len(statements) - 1
            conn.execute(statement.replace("?", "%s") if last else statement, params if last else None)  # type: ignore[arg-type]


def test_a_docstore_at_step_2_upgrades_and_keeps_its_keys(state_url: str, tmp_path: Path) -> None:
    """Step 3 (``api_keys.token_rate``): a key created before it still works, with no token quota."""
    created = []
    for step in schema.steps("sqlite" if state_url.startswith("sqlite") else "postgres", 1000.0)[:2]:
        created += step.statements
    created += [
        "CREATE TABLE schema_migrations (version BIGINT PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)",
        "INSERT INTO schema_migrations VALUES (1, 1000), (2, 1000)",
        "INSERT INTO api_keys (id, tenant_id, prefix, hash, name, scopes, collections, rate, priority, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    ]
    _run(state_url, created, ("0123456789ab", "default", "qk_0123456789ab", "scrypt$x", "old", '["read"]', None,
                              5.0, 1, 1000.0))
    state = open_docstore(state_url, tmp_path)
    try:
        old = state.get_api_key("0123456789ab")
        assert old is not None and (old.name, old.scopes, old.rate, old.priority) == ("old", ["read"], 5.0, 1)
        assert old.token_rate is None  # no quota: unlimited, as before
        state.insert_api_key(dataclasses.replace(old, id="ba9876543210", prefix="qk_ba9876543210", token_rate=2.5))
        assert [(k.id, k.token_rate) for k in state.list_api_keys()] == [("0123456789ab", None), ("ba9876543210", 2.5)]
    finally:
        state.close()


def test_a_docstore_of_a_newer_release_is_refused(state_url: str, tmp_path: Path) -> None:
    open_docstore(state_url, tmp_path).close()
    if state_url.startswith("sqlite"):
        with sqlite3.connect(tmp_path / "state.sqlite") as db:
            db.execute("INSERT INTO schema_migrations VALUES (99, 0)")
    else:
        with psycopg.connect(state_url, autocommit=True) as conn:
            conn.execute("INSERT INTO schema_migrations VALUES (99, 0)")
    with pytest.raises(StoreError, match=r"schema steps \[99\] that this Quarry does not know"):
        open_docstore(state_url, tmp_path)


def _open_and_close(url: str, folder: str) -> None:
    open_docstore(url, Path(folder)).close()


def test_processes_starting_together_migrate_once(state_url: str, tmp_path: Path) -> None:
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        pool.starmap(_open_and_close, [(state_url, str(tmp_path))] * 3)
    state = open_docstore(state_url, tmp_path)
    try:
        assert state.list_tenants() == [("default", "default")]  # step 2 ran once
    finally:
        state.close()
