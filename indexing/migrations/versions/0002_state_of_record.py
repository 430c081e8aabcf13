"""Step 2: the state of record of docs/design-state.md. Times are Unix seconds.

Child tables are keyed by the collection's surrogate id; rows of a collection that no longer
exists (a write that committed after a drop) have no collection to belong to and are not kept.
PostgreSQL orders chunks by an identity column ``ord``; SQLite by its ``rowid``.
"""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa
from alembic import context, op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TEXT: Any = sa.Text()
INT: Any = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
REAL: Any = sa.Double().with_variant(sa.REAL(), "sqlite")


def _col(name: str, kind: Any, *args: Any, **kw: Any) -> sa.Column[Any]:
    return sa.Column(name, kind, *args, nullable=kw.pop("nullable", False), **kw)


def upgrade() -> None:
    """Move step 1's rows into the keyed tables and create the others."""
    now = float(context.config.attributes.get("now", time.time()))
    postgres = op.get_context().dialect.name == "postgresql"
    order = "{}.collection" if postgres else "{}.rowid"  # step 1's insertion order, as each kept it
    op.create_table("tenants", _col("id", TEXT, primary_key=True), _col("name", TEXT), _col("created_at", REAL))
    op.execute(sa.text("INSERT INTO tenants (id, name, created_at) VALUES ('default', 'default', :now)")
               .bindparams(now=now))
    op.create_table(
        "collections_v2",
        _col("id", INT, sa.Identity(always=False), primary_key=True),
        _col("tenant_id", TEXT, server_default="default"),
        _col("name", TEXT),
        _col("config", TEXT),
        _col("live_version", INT, server_default="0"),
        _col("seq", INT, server_default="0"),
        _col("shared", INT, server_default="0"),
        _col("created_at", REAL),
        sa.UniqueConstraint("tenant_id", "name"),
        sqlite_autoincrement=True,
    )
    op.execute(sa.text(
        "INSERT INTO collections_v2 (tenant_id, name, config, seq, created_at) "
        "SELECT 'default', name, config, version, :now FROM collections ORDER BY name"
    ).bindparams(now=now))
    op.create_table(
        "documents_v2",
        _col("collection_id", INT, primary_key=True),
        _col("document_id", TEXT, primary_key=True),
        _col("tenant_id", TEXT, server_default="default"),
        _col("content_hash", TEXT),
        _col("title", TEXT, nullable=True),
        _col("text", TEXT, nullable=True),
        _col("metadata", TEXT, nullable=True),
        _col("updated_seq", INT, server_default="0"),
    )
    op.execute(
        "INSERT INTO documents_v2 (collection_id, document_id, tenant_id, content_hash, updated_seq) "
        "SELECT c.id, d.document_id, c.tenant_id, d.content_hash, c.seq "
        f"FROM documents AS d JOIN collections_v2 AS c ON c.name = d.collection ORDER BY {order.format('d')}"
    )
    ordinal = [_col("ord", sa.BigInteger(), sa.Identity(always=True))] if postgres else []
    op.create_table(
        "chunks_v2",
        *ordinal,
        _col("collection_id", INT, primary_key=True),
        _col("chunking_id", TEXT, primary_key=True, server_default=""),
        _col("chunk_id", TEXT, primary_key=True),
        _col("document_id", TEXT),
        _col("position", INT),
        _col("text", TEXT),
        _col("tokens", TEXT),
        _col("payload", TEXT),
    )
    op.execute(
        "INSERT INTO chunks_v2 (collection_id, chunking_id, chunk_id, document_id, position, text, tokens, payload) "
        "SELECT c.id, '', k.chunk_id, k.document_id, k.position, k.text, k.tokens, k.payload "
        f"FROM chunks AS k JOIN collections_v2 AS c ON c.name = k.collection ORDER BY {order.format('k')}"
    )
    op.create_table(
        "pending_deletes_v2",
        _col("collection_id", INT, primary_key=True),
        _col("version", INT, primary_key=True, server_default="0"),
        _col("chunk_id", TEXT, primary_key=True),
    )
    op.execute(
        "INSERT INTO pending_deletes_v2 (collection_id, version, chunk_id) SELECT c.id, 0, p.chunk_id "
        f"FROM pending_deletes AS p JOIN collections_v2 AS c ON c.name = p.collection ORDER BY {order.format('p')}"
    )
    for table in ("pending_deletes", "chunks", "documents", "collections"):
        op.drop_table(table)
    for table in ("collections", "documents", "chunks", "pending_deletes"):
        op.rename_table(f"{table}_v2", table)
    op.create_index("chunks_by_document", "chunks", ["collection_id", "chunking_id", "document_id"])
    if postgres:
        op.create_index("chunks_in_order", "chunks", ["collection_id", "chunking_id", "ord"])
    _admin_tables()


def _admin_tables() -> None:
    op.create_table(
        "collection_versions",
        _col("collection_id", INT, primary_key=True),
        _col("version", INT, primary_key=True),
        _col("physical_name", TEXT),
        _col("model_fingerprint", TEXT, nullable=True),
        _col("model_name", TEXT, nullable=True),
        _col("dim", INT, nullable=True),
        _col("chunking", TEXT, server_default="{}"),
        _col("analyzer", TEXT, nullable=True),
        _col("index_plan", TEXT, server_default="{}"),
        _col("state", TEXT),
        _col("built_from_seq", INT, nullable=True),
        _col("created_at", REAL),
        _col("swapped_at", REAL, nullable=True),
        _col("retire_after", REAL, nullable=True),
    )
    op.create_table(
        "change_log",
        _col("collection_id", INT, primary_key=True),
        _col("seq", INT, primary_key=True),
        _col("document_id", TEXT, primary_key=True),
        _col("op", TEXT),
        _col("content_hash", TEXT, nullable=True),
        _col("at", REAL),
    )
    op.create_table(
        "jobs",
        _col("id", TEXT, primary_key=True),
        _col("kind", TEXT),
        _col("collection_id", INT, nullable=True),
        _col("tenant_id", TEXT, server_default="default"),
        _col("state", TEXT),
        _col("params", TEXT, server_default="{}"),
        _col("cursor", TEXT, nullable=True),
        _col("counters", TEXT, server_default="{}"),
        _col("error", TEXT, nullable=True),
        _col("lease_owner", TEXT, nullable=True),
        _col("lease_expires_at", REAL, nullable=True),
        _col("created_at", REAL),
        _col("updated_at", REAL),
    )
    op.create_index("jobs_by_collection", "jobs", ["collection_id", "created_at"])
    op.create_table("leases", _col("name", TEXT, primary_key=True), _col("owner", TEXT), _col("expires_at", REAL))
    op.create_table(
        "api_keys",
        _col("id", TEXT, primary_key=True),
        _col("tenant_id", TEXT),
        _col("prefix", TEXT),
        _col("hash", TEXT),
        _col("name", TEXT, server_default=""),
        _col("scopes", TEXT, server_default="[]"),
        _col("collections", TEXT, nullable=True),
        _col("rate", REAL, nullable=True),
        _col("priority", INT, server_default="0"),
        _col("created_at", REAL),
        _col("expires_at", REAL, nullable=True),
        _col("revoked_at", REAL, nullable=True),
    )
    op.create_index("api_keys_by_prefix", "api_keys", ["prefix"])
    op.create_table(
        "audit_log",
        _col("id", INT, sa.Identity(always=False), primary_key=True),
        _col("at", REAL),
        _col("key_id", TEXT, nullable=True),
        _col("tenant_id", TEXT, nullable=True),
        _col("action", TEXT),
        _col("target", TEXT, nullable=True),
        _col("detail", TEXT, server_default="{}"),
        sqlite_autoincrement=True,
    )
    op.create_index("audit_log_by_at", "audit_log", ["at", "id"])


def downgrade() -> None:
    """No way back: a downgrade would drop every document."""
    raise NotImplementedError("the state of record is never downgraded; restore a backup instead")
