"""Step 1: the docstore's schema as Quarry wrote it before versioned migrations.

``IF NOT EXISTS`` throughout: a database of that release already has these tables and upgrades
like any other. Both dialects get SQLite's original types.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the four tables of the first release."""
    text = sa.Text()
    op.create_table(
        "collections",
        sa.Column("name", text, primary_key=True),
        sa.Column("config", text, nullable=False),
        sa.Column("version", sa.Integer(), nullable=False, server_default="0"),
        if_not_exists=True,
    )
    op.create_table(
        "documents",
        sa.Column("collection", text, primary_key=True),
        sa.Column("document_id", text, primary_key=True),
        sa.Column("content_hash", text, nullable=False),
        if_not_exists=True,
    )
    op.create_table(
        "chunks",
        sa.Column("collection", text, primary_key=True),
        sa.Column("chunk_id", text, primary_key=True),
        sa.Column("document_id", text, nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("text", text, nullable=False),
        sa.Column("tokens", text, nullable=False),
        sa.Column("payload", text, nullable=False),
        if_not_exists=True,
    )
    op.create_index("chunks_by_document", "chunks", ["collection", "document_id"], if_not_exists=True)
    op.create_table(
        "pending_deletes",
        sa.Column("collection", text, primary_key=True),
        sa.Column("chunk_id", text, primary_key=True),
        if_not_exists=True,
    )


def downgrade() -> None:
    """No way back: a downgrade would drop every document."""
    raise NotImplementedError("the state of record is never downgraded; restore a backup instead")
