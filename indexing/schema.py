"""The state of record's schema: its tables for queries, and one Alembic migration history.

``indexing/migrations/versions/NNNN_<what>.py`` is revision ``NNNN`` (step ``NNNN``), written
once for both dialects (SQLAlchemy types; a branch where they differ). :func:`upgrade` applies
the missing ones when a backend opens, in the opener's transaction and under its lock
(PostgreSQL: an advisory lock; SQLite: its write lock), so processes that start together
migrate once. Alembic keeps its head in ``alembic_version``; every step applied is also recorded
in ``schema_migrations(version, applied_at)``, the ledger that releases before Alembic kept. A
database of such a release (a ledger, no ``alembic_version``) is stamped at its last step first;
step 1 is the schema written before any ledger (``CREATE ... IF NOT EXISTS``), so a database of
that release upgrades like any other.

The tables below describe the schema at the head revision for building queries
(SQLAlchemy Core); they never create anything (the migrations do).
"""

from __future__ import annotations

import io
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError

from quarry.errors import StoreError

_FOLDER = Path(__file__).parent / "migrations"
DIALECTS = {"sqlite": "sqlite", "postgres": "postgresql"}  # steps()' names -> SQLAlchemy's

metadata = sa.MetaData()
_T, _I, _F = sa.Text, sa.BigInteger, sa.Float


def _c(name: str, kind: Any = _T, **kw: Any) -> sa.Column[Any]:
    return sa.Column(name, kind(), **kw)


tenants = sa.Table("tenants", metadata, _c("id", primary_key=True), _c("name"), _c("created_at", _F))
collections = sa.Table(
    "collections", metadata, _c("id", _I, primary_key=True), _c("tenant_id"), _c("name"), _c("config"),
    _c("live_version", _I), _c("seq", _I), _c("shared", _I), _c("created_at", _F),
)
documents = sa.Table(
    "documents", metadata, _c("collection_id", _I, primary_key=True), _c("document_id", primary_key=True),
    _c("tenant_id"), _c("content_hash"), _c("title"), _c("text"), _c("metadata"), _c("updated_seq", _I),
)
chunks = sa.Table(
    "chunks", metadata, _c("ord", _I), _c("collection_id", _I, primary_key=True),
    _c("chunking_id", primary_key=True), _c("chunk_id", primary_key=True), _c("document_id"),
    _c("position", _I), _c("text"), _c("tokens"), _c("payload"),
)  # ``ord``: PostgreSQL only (SQLite orders by rowid)
pending_deletes = sa.Table(
    "pending_deletes", metadata, _c("collection_id", _I, primary_key=True), _c("version", _I, primary_key=True),
    _c("chunk_id", primary_key=True),
)
collection_versions = sa.Table(
    "collection_versions", metadata, _c("collection_id", _I, primary_key=True), _c("version", _I, primary_key=True),
    _c("physical_name"), _c("state"), _c("model_fingerprint"), _c("model_name"), _c("dim", _I), _c("chunking"),
    _c("analyzer"), _c("index_plan"), _c("built_from_seq", _I), _c("created_at", _F), _c("swapped_at", _F),
    _c("retire_after", _F),
)
change_log = sa.Table(
    "change_log", metadata, _c("collection_id", _I, primary_key=True), _c("seq", _I, primary_key=True),
    _c("document_id", primary_key=True), _c("op"), _c("content_hash"), _c("at", _F),
)
jobs = sa.Table(
    "jobs", metadata, _c("id", primary_key=True), _c("kind"), _c("collection_id", _I), _c("tenant_id"), _c("state"),
    _c("params"), _c("cursor"), _c("counters"), _c("error"), _c("lease_owner"), _c("lease_expires_at", _F),
    _c("created_at", _F), _c("updated_at", _F),
)
leases = sa.Table("leases", metadata, _c("name", primary_key=True), _c("owner"), _c("expires_at", _F))
api_keys = sa.Table(
    "api_keys", metadata, _c("id", primary_key=True), _c("tenant_id"), _c("prefix"), _c("hash"), _c("name"),
    _c("scopes"), _c("collections"), _c("rate", _F), _c("priority", _I), _c("created_at", _F),
    _c("expires_at", _F), _c("revoked_at", _F), _c("token_rate", _F),
)
audit_log = sa.Table(
    "audit_log", metadata, _c("id", _I, primary_key=True), _c("at", _F), _c("key_id"), _c("tenant_id"),
    _c("action"), _c("target"), _c("detail"),
)
rollouts = sa.Table(
    "rollouts", metadata, _c("collection_id", _I, primary_key=True), _c("candidate", _I), _c("state"), _c("body"),
    _c("updated_at", _F),
)
query_references = sa.Table(
    "query_references", metadata, _c("collection_id", _I, primary_key=True), _c("physical", primary_key=True),
    _c("signal", primary_key=True), _c("body"), _c("updated_at", _F),
)


@dataclass(frozen=True)
class Step:
    """One migration step: its number, revision file and statements (as :func:`steps` renders them)."""

    version: int
    name: str
    statements: list[str]


def _config(**attributes: Any) -> Config:
    cfg = Config(output_buffer=attributes.pop("output_buffer", None))
    cfg.set_main_option("script_location", str(_FOLDER))
    cfg.set_main_option("path_separator", "os")
    cfg.attributes.update(attributes)
    return cfg


def _script() -> ScriptDirectory:
    return ScriptDirectory.from_config(_config())


def known() -> int:
    """The last step this Quarry knows (the head revision's number)."""
    head = _script().get_current_head()
    assert head is not None  # noqa: S101 - the package ships its revisions
    return int(head)


_LINE_COMMENT = re.compile(r"^--[^\n]*", re.MULTILINE)


def steps(dialect: str, now: float) -> list[Step]:
    """Each revision's SQL for ``dialect`` (``sqlite`` or ``postgres``), times bound to ``now``.

    Alembic's offline mode renders them (without its own ``alembic_version`` bookkeeping): what
    a database of that step held, for tests that build one by hand.
    """
    out = []
    previous = None
    for script in reversed(list(_script().walk_revisions())):
        buffer = io.StringIO()
        cfg = _config(output_buffer=buffer, dialect=DIALECTS[dialect], now=now)
        span = script.revision if previous is None else f"{previous}:{script.revision}"
        command.upgrade(cfg, span, sql=True)
        text = _LINE_COMMENT.sub("", buffer.getvalue())
        statements = [s.strip() for s in text.split(";\n") if s.strip() and "alembic_version" not in s]
        out.append(Step(int(script.revision), Path(script.path).name, statements))
        previous = script.revision
    return out


def check_known(applied: set[int], location: str) -> None:
    """Refuse a database that holds steps this Quarry does not know (written by a newer one).

    Raises:
        StoreError: ``applied`` holds a step past the last one known.
    """
    last = known()
    newer = sorted(v for v in applied if v > last)
    if newer:
        raise StoreError(
            f"the docstore {location} has schema steps {newer} that this Quarry does not know (it knows up to "
            f"{last}): it was written by a newer release; run that release, or restore a backup"
        )


def upgrade(conn: sa.Connection, location: str) -> None:
    """Bring the schema to the head revision, in ``conn``'s open transaction (the caller holds the lock).

    Raises:
        StoreError: The database holds steps or a revision this Quarry does not know.
    """
    real = "DOUBLE PRECISION" if conn.dialect.name == "postgresql" else "REAL"
    conn.exec_driver_sql(
        f"CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at {real} NOT NULL)"
    )
    applied = {int(r[0]) for r in conn.exec_driver_sql("SELECT version FROM schema_migrations")}
    check_known(applied, location)
    cfg = _config(connection=conn, now=time.time())
    try:
        if applied and MigrationContext.configure(conn).get_current_revision() is None:
            MigrationContext.configure(conn).stamp(ScriptDirectory.from_config(cfg), f"{max(applied):04d}")
        command.upgrade(cfg, "head")
    except CommandError as exc:  # e.g. alembic_version names a revision of a newer release
        raise StoreError(
            f"the docstore {location} cannot be migrated: {exc}; it was written by a newer release, or restore "
            "a backup"
        ) from exc
